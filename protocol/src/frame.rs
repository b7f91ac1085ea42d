//! COBS framing with a zero delimiter, and a reader that resynchronises.

use thiserror::Error;

/// Largest frame: the COBS bytes between two zero delimiters.
pub const MAX_FRAME: usize = 1 << 20;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame longer than {MAX_FRAME} bytes; discarded up to the next delimiter")]
    Oversized,
    #[error("frame is not valid COBS")]
    BadCobs,
    #[error("message of {len} bytes does not fit in a {MAX_FRAME}-byte frame")]
    TooLarge { len: usize },
}

/// Wraps an encoded message into one frame, delimiter included.
pub fn frame(payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    if max_encoding_length(payload.len()) > MAX_FRAME {
        return Err(FrameError::TooLarge { len: payload.len() });
    }
    let mut out = Vec::with_capacity(max_encoding_length(payload.len()) + 1);
    cobs_encode(payload, &mut out);
    out.push(0);
    Ok(out)
}

/// The longest COBS encoding of `n` bytes: one code byte per 254.
fn max_encoding_length(n: usize) -> usize {
    n + n / 254 + 1
}

/// COBS, a block at a time: each run of up to 254 bytes without a zero is
/// copied whole behind its code byte (its length + 1).
fn cobs_encode(mut data: &[u8], out: &mut Vec<u8>) {
    loop {
        let limit = data.len().min(254);
        match memchr::memchr(0, &data[..limit]) {
            Some(z) => {
                out.push(z as u8 + 1);
                out.extend_from_slice(&data[..z]);
                data = &data[z + 1..];
            }
            None if limit == 254 => {
                out.push(0xFF);
                out.extend_from_slice(&data[..254]);
                data = &data[254..];
                if data.is_empty() {
                    // A full block at the very end is the end (no final
                    // empty block, as the reference encoder has it).
                    return;
                }
            }
            None => {
                out.push(limit as u8 + 1);
                out.extend_from_slice(data);
                return;
            }
        }
    }
}

/// Decodes one frame's COBS bytes (no zero among them), a block at a time.
fn cobs_decode(data: &[u8]) -> Result<Vec<u8>, FrameError> {
    if data.is_empty() {
        return Err(FrameError::BadCobs);
    }
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        let code = data[i] as usize;
        if code == 0 {
            return Err(FrameError::BadCobs);
        }
        let end = i + code;
        if end > data.len() {
            return Err(FrameError::BadCobs);
        }
        out.extend_from_slice(&data[i + 1..end]);
        i = end;
        if code < 0xFF && i < data.len() {
            out.push(0);
        }
    }
    Ok(out)
}

/// What a reader keeps of its buffer between small frames.
const KEEP: usize = 64 * 1024;

/// Splits a byte stream into decoded frame payloads.
///
/// Bytes are pushed in whatever pieces the transport gives; complete frames
/// come out of [`FrameReader::next_frame`]. The buffer never grows past
/// [`MAX_FRAME`]: a longer frame is dropped up to its delimiter and reported
/// once as [`FrameError::Oversized`]. Empty frames (two zeros in a row, as a
/// reconnecting writer may send to flush a torn frame) are skipped.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    /// Set while skipping the rest of an oversized frame.
    discarding: bool,
    /// Frames finished by the last push, in order.
    ready: std::collections::VecDeque<Result<Vec<u8>, FrameError>>,
}

impl FrameReader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes from the transport.
    pub fn push(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match memchr::memchr(0, bytes) {
                Some(end) => {
                    self.take(&bytes[..end]);
                    self.finish();
                    bytes = &bytes[end + 1..];
                }
                None => {
                    self.take(bytes);
                    bytes = &[];
                }
            }
        }
    }

    fn take(&mut self, part: &[u8]) {
        if self.discarding {
            return;
        }
        if self.buf.len() + part.len() > MAX_FRAME {
            self.buf = Vec::new();
            self.discarding = true;
            self.ready.push_back(Err(FrameError::Oversized));
            return;
        }
        self.buf.extend_from_slice(part);
    }

    fn finish(&mut self) {
        if std::mem::take(&mut self.discarding) {
            return;
        }
        if self.buf.is_empty() {
            return;
        }
        let decoded = cobs_decode(&self.buf);
        // The buffer is kept for the next frame (a file's chunks come one
        // after another), up to 64 KiB once frames are small again.
        let big = self.buf.len() > KEEP;
        self.buf.clear();
        if !big {
            self.buf.shrink_to(KEEP);
        }
        self.ready.push_back(decoded);
    }

    /// The next complete frame, if any.
    pub fn next_frame(&mut self) -> Option<Result<Vec<u8>, FrameError>> {
        self.ready.pop_front()
    }

    /// Bytes of an unfinished frame held right now (for stall detection).
    pub fn pending(&self) -> usize {
        if self.discarding {
            1
        } else {
            self.buf.len()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (no dependency for it).
    fn bytes(seed: &mut u64, n: usize, zeros: u8) -> Vec<u8> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                let b = (*seed >> 24) as u8;
                if b < zeros {
                    0
                } else {
                    b.max(1)
                }
            })
            .collect()
    }

    #[test]
    fn block_cobs_is_the_cobs_crate_s_cobs() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut sizes: Vec<usize> = (0..600).collect();
        sizes.extend([253, 254, 255, 508, 509, 762, 100_000]);
        for n in sizes {
            for zeros in [0u8, 1, 40, 255] {
                let p = bytes(&mut seed, n, zeros);
                let mut ours = Vec::new();
                cobs_encode(&p, &mut ours);
                assert_eq!(ours, cobs::encode_vec(&p), "encode of {n} bytes");
                assert_eq!(cobs_decode(&ours), Ok(p.clone()), "decode of {n} bytes");
                // Any frame's bytes (no zero among them): accepted and
                // refused alike.
                let junk: Vec<u8> = bytes(&mut seed, n % 300, 0);
                assert_eq!(
                    cobs_decode(&junk).ok(),
                    cobs::decode_vec(&junk).ok(),
                    "{junk:?}"
                );
            }
        }
    }

    fn drain(r: &mut FrameReader) -> Vec<Result<Vec<u8>, FrameError>> {
        std::iter::from_fn(|| r.next_frame()).collect()
    }

    #[test]
    fn round_trip_in_every_split() {
        let payload: Vec<u8> = (0..600u32).map(|i| (i % 7) as u8).collect();
        let f = frame(&payload).unwrap();
        assert!(!f[..f.len() - 1].contains(&0));
        for split in 0..f.len() {
            let mut r = FrameReader::new();
            r.push(&f[..split]);
            r.push(&f[split..]);
            assert_eq!(drain(&mut r), vec![Ok(payload.clone())]);
        }
    }

    #[test]
    fn resynchronises_after_garbage_and_torn_frames() {
        let good = frame(b"\x01\x00\x02").unwrap();
        let mut r = FrameReader::new();
        // A torn frame (no delimiter) followed by a reconnecting writer's flush.
        r.push(&good[..2]);
        r.push(&[0]);
        r.push(&good);
        r.push(&[0x05, 0x01, 0x00]); // code byte pointing past the end
        r.push(&good);
        let out = drain(&mut r);
        assert_eq!(out.len(), 4, "{out:?}");
        assert_eq!(out[1], Ok(vec![1, 0, 2]));
        assert_eq!(out[2], Err(FrameError::BadCobs));
        assert_eq!(out[3], Ok(vec![1, 0, 2]));
    }

    #[test]
    fn oversized_frames_are_dropped_without_growing() {
        let mut r = FrameReader::new();
        let chunk = vec![0xAAu8; 64 * 1024];
        for _ in 0..40 {
            r.push(&chunk);
            assert!(r.buf.capacity() <= MAX_FRAME + 64 * 1024);
        }
        r.push(&[0]);
        r.push(&frame(b"ok").unwrap());
        assert_eq!(
            drain(&mut r),
            vec![Err(FrameError::Oversized), Ok(b"ok".to_vec())]
        );
    }

    #[test]
    fn writer_refuses_what_the_reader_would_drop() {
        assert!(frame(&vec![1u8; MAX_FRAME]).is_err());
        assert!(frame(&vec![1u8; MAX_FRAME - 8 * 1024]).is_ok());
    }
}
