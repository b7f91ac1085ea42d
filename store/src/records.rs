//! Append-only record files (the audit log): each record is
//!
//! ```text
//! "AXR1" ‖ u32 LE payload length ‖ u32 LE CRC-32 of payload ‖ payload (postcard)
//! ```
//!
//! A reader goes through the file in bounded chunks. A record whose
//! checksum does not match is counted as corrupt and skipped; after a
//! damaged header the reader looks for the next magic, so one flipped bit
//! costs one record, not the rest of the file. Only bytes after the last
//! good record (a write cut short by a crash) count as a torn tail.

use std::io::{self, Read, Write};

/// Largest record payload.
pub const MAX_RECORD: usize = 1 << 20;
const MAGIC: &[u8; 4] = b"AXR1";
const HEADER: usize = 12;
const CHUNK: usize = 1 << 20;

/// Encodes one record.
pub fn encode(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// What a scan found besides the records themselves.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// Damaged records (bad checksum or header) skipped.
    pub corrupt: u64,
    /// Offset just after the last good record.
    pub valid_len: u64,
}

fn u32_at(b: &[u8], at: usize) -> usize {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x) as usize
}

/// Reads records from `r` in order, passing each good payload to `each`
/// (which returns false to stop early). Memory stays within about two
/// chunks plus one record.
pub fn scan_reader<R: Read>(mut r: R, mut each: impl FnMut(&[u8]) -> bool) -> io::Result<Scan> {
    let mut s = Scan::default();
    let mut buf: Vec<u8> = Vec::new();
    let mut base: u64 = 0; // file offset of buf[0]
    let mut at = 0usize;
    let mut eof = false;
    let mut in_garbage = false;
    loop {
        // Keep at least one header and one whole record in view.
        if !eof && buf.len() - at < HEADER + MAX_RECORD {
            buf.drain(..at);
            base += at as u64;
            at = 0;
            let old = buf.len();
            buf.resize(old + CHUNK, 0);
            let n = r.read(&mut buf[old..])?;
            buf.truncate(old + n);
            if n == 0 {
                eof = true;
            }
            continue;
        }
        if buf.len() - at < HEADER {
            break;
        }
        let len = u32_at(&buf, at + 4);
        let good_header = &buf[at..at + 4] == MAGIC && len <= MAX_RECORD;
        let complete = good_header && buf.len() - at - HEADER >= len;
        if good_header && !complete && !eof {
            continue; // read more
        }
        // A damaged header, a length running past the end, or a bad
        // checksum: look for the next record one byte further. Damage is
        // counted once a good record follows it; damage at the very end is
        // a torn tail.
        if !complete
            || crc32fast::hash(&buf[at + HEADER..at + HEADER + len]) != u32_at(&buf, at + 8) as u32
        {
            in_garbage = true;
            at += 1;
            continue;
        }
        let payload = &buf[at + HEADER..at + HEADER + len];
        if std::mem::take(&mut in_garbage) {
            s.corrupt += 1;
        }
        let keep_going = each(payload);
        at += HEADER + len;
        s.valid_len = base + at as u64;
        if !keep_going {
            break;
        }
    }
    Ok(s)
}

/// Appends one record with a single write.
pub fn append(file: &mut std::fs::File, payload: &[u8]) -> io::Result<()> {
    if payload.len() > MAX_RECORD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "record larger than 1 MiB",
        ));
    }
    file.write_all(&encode(payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(bytes: &[u8]) -> (Vec<Vec<u8>>, Scan) {
        let mut out = Vec::new();
        let s = scan_reader(bytes, |p| {
            out.push(p.to_vec());
            true
        })
        .unwrap();
        (out, s)
    }

    #[test]
    fn torn_tail_is_not_counted_as_valid() {
        let mut bytes = encode(b"one");
        bytes.extend(encode(b"two"));
        let whole = bytes.len() as u64;
        bytes.extend(&encode(b"three")[..14]);
        let (recs, s) = scan(&bytes);
        assert_eq!(recs, vec![b"one".to_vec(), b"two".to_vec()]);
        assert_eq!(s.valid_len, whole);
        assert_eq!(s.corrupt, 0);
    }

    #[test]
    fn flipped_payload_bit_costs_one_record() {
        let mut bytes = encode(b"one");
        let second = bytes.len();
        bytes.extend(encode(b"two"));
        bytes.extend(encode(b"three"));
        bytes[second + HEADER] ^= 0x01;
        let (recs, s) = scan(&bytes);
        assert_eq!(recs, vec![b"one".to_vec(), b"three".to_vec()]);
        assert_eq!(s.corrupt, 1);
        assert_eq!(s.valid_len, bytes.len() as u64);
    }

    #[test]
    fn damaged_length_does_not_lose_the_records_after_it() {
        let mut bytes = encode(b"one");
        let second = bytes.len();
        bytes.extend(encode(b"two"));
        bytes.extend(encode(b"three"));
        bytes.extend(encode(b"four"));
        bytes[second + 5] = 0xff; // length of "two" now absurd
        let (recs, s) = scan(&bytes);
        assert_eq!(
            recs,
            vec![b"one".to_vec(), b"three".to_vec(), b"four".to_vec()]
        );
        assert_eq!(s.corrupt, 1);
        assert_eq!(s.valid_len, bytes.len() as u64);
    }

    #[test]
    fn early_stop_and_large_files() {
        let mut bytes = Vec::new();
        for i in 0..5000u32 {
            bytes.extend(encode(&vec![(i % 251) as u8; 700]));
        }
        let (recs, _) = scan(&bytes);
        assert_eq!(recs.len(), 5000);
        let mut n = 0;
        scan_reader(&bytes[..], |_| {
            n += 1;
            n < 10
        })
        .unwrap();
        assert_eq!(n, 10);
    }
}
