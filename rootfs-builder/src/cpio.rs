//! The "newc" cpio format (`070701`), as the Linux initramfs unpacker reads
//! it (`Documentation/driver-api/early-userspace/buffer-format.rst`).
//!
//! Each entry is a 110-byte ASCII header, the name, then the data:
//!
//! ```text
//! offset  size  field
//!      0     6  magic "070701"
//!      6     8  ino          \
//!     14     8  mode          |
//!     22     8  uid           |
//!     30     8  gid           |
//!     38     8  nlink         |
//!     46     8  mtime         |  13 fields, each 8 upper-case hex digits,
//!     54     8  filesize      |  no prefix, zero padded
//!     62     8  devmajor      |
//!     70     8  devminor      |
//!     78     8  rdevmajor     |
//!     86     8  rdevminor     |
//!     94     8  namesize      |  name length including its NUL
//!    102     8  check        /   always 0 in newc (070702 is the crc variant)
//!    110     -  name, NUL terminated, then NULs up to a multiple of 4
//!               counted from the start of the header
//!      -     -  filesize bytes of data (a symlink's data is its target,
//!               without NUL), then NULs up to a multiple of 4
//! ```
//!
//! The archive ends with an entry named `TRAILER!!!` whose fields are all
//! zero except `nlink` = 1 and `namesize`. Names are relative (no leading
//! `/`), as the kernel's own `gen_init_cpio` writes them. Files are limited
//! to 4 GiB - 1 by the 8-digit size field.
//!
//! The writer is ours (about a hundred lines) rather than a crate: the
//! format is small and fixed, and owning it keeps every byte of the output
//! under this crate's control, which is what reproducibility needs. The
//! reader exists for tests and the `list` command.

use std::io::{self, Read, Write};

pub const MAGIC: &[u8; 6] = b"070701";
pub const HEADER_LEN: usize = 110;
pub const TRAILER: &str = "TRAILER!!!";

/// File type bits of `mode`, as in `<sys/stat.h>`.
pub const S_IFMT: u32 = 0o170000;
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;
pub const S_IFCHR: u32 = 0o020000;

#[derive(Debug, thiserror::Error)]
pub enum CpioError {
    #[error("cannot write the archive")]
    Write(#[source] io::Error),
    #[error("cannot read the archive")]
    Read(#[source] io::Error),
    #[error("{name:?}: {len} bytes is more than a newc entry can hold")]
    TooLarge { name: String, len: u64 },
    #[error("{name:?}: a name must be non-empty, relative and without NUL")]
    BadName { name: String },
    #[error("not a newc archive: bad magic at byte {offset}")]
    BadMagic { offset: u64 },
    #[error("bad header field {field} at byte {offset}")]
    BadField { field: &'static str, offset: u64 },
    #[error("the archive ends before its TRAILER!!! entry")]
    Truncated,
}

/// The header fields of one entry, except the name and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Meta {
    pub ino: u32,
    /// File type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub mtime: u32,
    pub rdev_major: u32,
    pub rdev_minor: u32,
}

/// Writes entries in the order given; the caller decides the order.
pub struct Writer<W: Write> {
    out: W,
    offset: u64,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W) -> Self {
        Writer { out, offset: 0 }
    }

    /// Bytes written so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn entry(&mut self, name: &str, meta: &Meta, data: &[u8]) -> Result<(), CpioError> {
        if name.is_empty() || name.starts_with('/') || name.contains('\0') {
            return Err(CpioError::BadName { name: name.into() });
        }
        self.raw(name, meta, data)
    }

    /// Writes the trailer and returns the inner writer (not flushed).
    pub fn finish(mut self) -> Result<W, CpioError> {
        let meta = Meta {
            nlink: 1,
            ..Meta::default()
        };
        self.raw(TRAILER, &meta, &[])?;
        Ok(self.out)
    }

    fn raw(&mut self, name: &str, m: &Meta, data: &[u8]) -> Result<(), CpioError> {
        let too_large = |len: usize| CpioError::TooLarge {
            name: name.into(),
            len: len as u64,
        };
        let filesize = u32::try_from(data.len()).map_err(|_| too_large(data.len()))?;
        let namesize = u32::try_from(name.len() + 1).map_err(|_| too_large(name.len()))?;
        let fields = [
            m.ino,
            m.mode,
            m.uid,
            m.gid,
            m.nlink,
            m.mtime,
            filesize,
            0, // devmajor
            0, // devminor
            m.rdev_major,
            m.rdev_minor,
            namesize,
            0, // check
        ];
        let mut head = Vec::with_capacity(HEADER_LEN + name.len() + 4);
        head.extend_from_slice(MAGIC);
        for f in fields {
            head.extend_from_slice(format!("{f:08X}").as_bytes());
        }
        head.extend_from_slice(name.as_bytes());
        head.push(0);
        head.resize(head.len() + pad4(head.len()), 0);
        self.put(&head)?;
        self.put(data)?;
        self.put(&[0; 3][..pad4(data.len())])
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), CpioError> {
        self.out.write_all(bytes).map_err(CpioError::Write)?;
        self.offset += bytes.len() as u64;
        Ok(())
    }
}

/// NULs needed after `len` bytes to reach a multiple of 4.
pub fn pad4(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// One entry read back from an archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub meta: Meta,
    pub data: Vec<u8>,
    /// Offset of the entry's header in the archive.
    pub offset: u64,
}

/// Reads a whole archive up to and excluding its trailer. Strict: bad
/// magic, non-hex fields, non-zero padding or a missing trailer are errors,
/// so tests can rely on it to check the writer.
pub fn read_all(mut input: impl Read) -> Result<Vec<Entry>, CpioError> {
    let mut bytes = Vec::new();
    input.read_to_end(&mut bytes).map_err(CpioError::Read)?;
    let mut pos = 0usize;
    let mut entries = Vec::new();
    loop {
        let offset = pos as u64;
        let head = bytes
            .get(pos..pos + HEADER_LEN)
            .ok_or(CpioError::Truncated)?;
        if &head[..6] != MAGIC {
            return Err(CpioError::BadMagic { offset });
        }
        const NAMES: [&str; 13] = [
            "ino",
            "mode",
            "uid",
            "gid",
            "nlink",
            "mtime",
            "filesize",
            "devmajor",
            "devminor",
            "rdevmajor",
            "rdevminor",
            "namesize",
            "check",
        ];
        let mut f = [0u32; 13];
        for (i, v) in f.iter_mut().enumerate() {
            let s = &head[6 + 8 * i..14 + 8 * i];
            let bad = CpioError::BadField {
                field: NAMES[i],
                offset,
            };
            if !s.iter().all(u8::is_ascii_hexdigit) {
                return Err(bad);
            }
            // Eight hex digits always fit a u32.
            *v = s.iter().fold(0, |acc, &c| {
                acc << 4 | (c as char).to_digit(16).unwrap_or_default()
            });
        }
        let namesize = f[11] as usize;
        let bad = |field| CpioError::BadField { field, offset };
        if namesize == 0 || f[12] != 0 {
            return Err(bad(if namesize == 0 { "namesize" } else { "check" }));
        }
        pos += HEADER_LEN;
        let name_end = pos + namesize;
        let raw = bytes.get(pos..name_end).ok_or(CpioError::Truncated)?;
        if raw[namesize - 1] != 0 {
            return Err(bad("namesize"));
        }
        let name = String::from_utf8(raw[..namesize - 1].to_vec()).map_err(|_| bad("name"))?;
        pos = name_end;
        take_padding(&bytes, &mut pos, bad("name padding"))?;
        let size = f[6] as usize;
        let data = bytes.get(pos..pos + size).ok_or(CpioError::Truncated)?;
        pos += size;
        take_padding(&bytes, &mut pos, bad("data padding"))?;
        if name == TRAILER {
            return Ok(entries);
        }
        entries.push(Entry {
            name,
            meta: Meta {
                ino: f[0],
                mode: f[1],
                uid: f[2],
                gid: f[3],
                nlink: f[4],
                mtime: f[5],
                rdev_major: f[9],
                rdev_minor: f[10],
            },
            data: data.to_vec(),
            offset,
        });
    }
}

fn take_padding(bytes: &[u8], pos: &mut usize, err: CpioError) -> Result<(), CpioError> {
    let n = pad4(*pos);
    let pad = bytes.get(*pos..*pos + n).ok_or(CpioError::Truncated)?;
    if pad.iter().any(|&b| b != 0) {
        return Err(err);
    }
    *pos += n;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: &[(&str, Meta, &[u8])]) -> Vec<u8> {
        let mut w = Writer::new(Vec::new());
        for (name, meta, data) in entries {
            w.entry(name, meta, data).unwrap();
        }
        w.finish().unwrap()
    }

    /// Golden bytes: pins the header layout, the name and data padding and
    /// the trailer.
    #[test]
    fn golden_bytes() {
        let meta = Meta {
            ino: 1,
            mode: S_IFREG | 0o644,
            nlink: 1,
            ..Meta::default()
        };
        let got = archive(&[("a", meta, b"hi")]);
        let want = concat!(
            "070701",
            "00000001",
            "000081A4",
            "00000000",
            "00000000",
            "00000001",
            "00000000",
            "00000002",
            "00000000",
            "00000000",
            "00000000",
            "00000000",
            "00000002",
            "00000000",
            "a\0",
            "hi\0\0",
            "070701",
            "00000000",
            "00000000",
            "00000000",
            "00000000",
            "00000001",
            "00000000",
            "00000000",
            "00000000",
            "00000000",
            "00000000",
            "00000000",
            "0000000B",
            "00000000",
            "TRAILER!!!\0\0\0\0",
        );
        assert_eq!(String::from_utf8(got).unwrap(), want);
    }

    #[test]
    fn every_header_and_data_starts_on_four_bytes() {
        let meta = Meta {
            mode: S_IFREG | 0o644,
            nlink: 1,
            ..Meta::default()
        };
        // Name lengths 1..=5 and data lengths 0..=5 cover every remainder.
        let names = ["a", "ab", "abc", "abcd", "abcde"];
        let datas: [&[u8]; 6] = [b"", b"1", b"12", b"123", b"1234", b"12345"];
        let mut entries = Vec::new();
        for n in names {
            for d in datas {
                entries.push((n, meta, d));
            }
        }
        let bytes = archive(&entries);
        assert_eq!(bytes.len() % 4, 0);
        let back = read_all(&bytes[..]).unwrap();
        assert_eq!(back.len(), entries.len());
        for (e, (n, m, d)) in back.iter().zip(&entries) {
            assert_eq!(e.offset % 4, 0, "{n}");
            assert_eq!(&e.name, n);
            assert_eq!(&e.meta, m);
            assert_eq!(&e.data[..], *d);
            let data_at = e.offset as usize + HEADER_LEN + n.len() + 1;
            let data_at = data_at + pad4(data_at);
            assert_eq!(&bytes[data_at..data_at + d.len()], *d);
        }
    }

    #[test]
    fn bad_names_are_refused() {
        let mut w = Writer::new(Vec::new());
        for name in ["", "/abs", "a\0b"] {
            assert!(matches!(
                w.entry(name, &Meta::default(), b""),
                Err(CpioError::BadName { .. })
            ));
        }
        assert_eq!(w.offset(), 0);
    }

    #[test]
    fn reader_refuses_damage() {
        let meta = Meta {
            mode: S_IFREG | 0o644,
            nlink: 1,
            ..Meta::default()
        };
        let good = archive(&[("name", meta, b"x")]);
        assert!(read_all(&good[..]).is_ok());
        let mut bad = good.clone();
        bad[0] = b'1';
        assert!(matches!(
            read_all(&bad[..]),
            Err(CpioError::BadMagic { .. })
        ));
        let mut bad = good.clone();
        bad[6] = b'g';
        assert!(matches!(
            read_all(&bad[..]),
            Err(CpioError::BadField { .. })
        ));
        let cut = &good[..good.len() - 20];
        assert!(matches!(read_all(cut), Err(CpioError::Truncated)));
    }
}
