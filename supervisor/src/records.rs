//! Append-only record files (journal, audit): each record is
//!
//! ```text
//! u32 LE payload length ‖ u32 LE CRC-32 of payload ‖ payload (postcard)
//! ```
//!
//! A record cut short by a crash (the tail of the file) is detected by its
//! length or checksum and dropped; a record in the middle whose checksum is
//! wrong is reported as corrupt and skipped.

use std::fs::File;
use std::io::{self, Read, Write};

/// Largest record payload.
pub const MAX_RECORD: usize = 1 << 20;
const HEADER: usize = 8;

/// Encodes one record.
pub fn encode(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// What a scan of a record file found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Payloads with a good checksum, in file order.
    pub records: Vec<Vec<u8>>,
    /// Records whose checksum did not match.
    pub corrupt: u64,
    /// Bytes up to the end of the last whole record; anything after is a
    /// torn tail.
    pub valid_len: u64,
}

/// Parses a whole record file.
pub fn scan(bytes: &[u8]) -> Scan {
    let mut s = Scan::default();
    let mut at = 0usize;
    while bytes.len() - at >= HEADER {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4])) as usize;
        let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap_or([0; 4]));
        if len > MAX_RECORD || bytes.len() - at - HEADER < len {
            break;
        }
        let payload = &bytes[at + HEADER..at + HEADER + len];
        if crc32fast::hash(payload) == crc {
            s.records.push(payload.to_vec());
        } else {
            s.corrupt += 1;
        }
        at += HEADER + len;
    }
    s.valid_len = at as u64;
    s
}

/// Reads and scans a file; a missing file is empty.
pub fn scan_file(file: &mut File) -> io::Result<Scan> {
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(scan(&bytes))
}

/// Appends one record with a single write.
pub fn append(file: &mut File, payload: &[u8]) -> io::Result<()> {
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

    #[test]
    fn torn_tail_is_dropped() {
        let mut bytes = encode(b"one");
        bytes.extend(encode(b"two"));
        let whole = bytes.len() as u64;
        bytes.extend(&encode(b"three")[..6]);
        let s = scan(&bytes);
        assert_eq!(s.records, vec![b"one".to_vec(), b"two".to_vec()]);
        assert_eq!(s.valid_len, whole);
        assert_eq!(s.corrupt, 0);
    }

    #[test]
    fn flipped_bit_is_reported_and_skipped() {
        let mut bytes = encode(b"one");
        let second = bytes.len();
        bytes.extend(encode(b"two"));
        bytes.extend(encode(b"three"));
        bytes[second + HEADER] ^= 0x01;
        let s = scan(&bytes);
        assert_eq!(s.records, vec![b"one".to_vec(), b"three".to_vec()]);
        assert_eq!(s.corrupt, 1);
    }

    #[test]
    fn absurd_length_stops_the_scan() {
        let mut bytes = encode(b"one");
        bytes.extend([0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
        let s = scan(&bytes);
        assert_eq!(s.records.len(), 1);
    }
}
