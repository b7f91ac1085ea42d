//! Writing the archive to a file, optionally gzip-compressed, with its
//! sha256 computed on the way.
//!
//! gzip is deterministic here: flate2's pure-Rust backend (miniz_oxide, so
//! the bytes depend on the locked crate versions and not on the host's
//! zlib) at level 9, with a header that has mtime 0, no file name and OS
//! byte 255 ("unknown"). The Linux kernel unpacks it with CONFIG_RD_GZIP.
//!
//! The output is written to `<out>.partial` and renamed into place, so a
//! failed build never leaves a truncated image under the final name.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};

use crate::cpio::{self, CpioError};
use crate::tree::{Tree, TreeError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    None,
    Gzip,
}

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{}: cannot write", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Tree(#[from] TreeError),
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Lower-case hex sha256 of the file as written.
    pub sha256: String,
    /// Size of the file as written.
    pub size: u64,
    /// Size of the cpio archive before compression.
    pub cpio_size: u64,
    /// Entries, not counting the trailer.
    pub entries: u32,
}

/// Counts and hashes what passes through.
pub(crate) struct Hashing<W> {
    pub(crate) inner: W,
    hash: Sha256,
    pub(crate) len: u64,
}

impl<W: Write> Hashing<W> {
    pub(crate) fn new(inner: W) -> Self {
        Hashing {
            inner,
            hash: Sha256::new(),
            len: 0,
        }
    }

    /// `sha256:<hex>` of what has passed so far.
    pub(crate) fn digest(&self) -> String {
        let d = self.hash.clone().finalize();
        format!(
            "sha256:{}",
            d.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `tree` as an archive to any writer; returns the writer back.
pub fn write_to<W: Write>(
    tree: &Tree,
    out: W,
    compression: Compression,
    mtime: u32,
) -> Result<(W, Summary), OutputError> {
    let io_err = |source| OutputError::Io {
        path: PathBuf::from("<archive>"),
        source,
    };
    let hashing = Hashing::new(out);
    let (mut hashing, written) = match compression {
        Compression::None => tree.write_cpio(hashing, mtime)?,
        Compression::Gzip => {
            let gz = flate2::GzBuilder::new()
                .mtime(0)
                .operating_system(255)
                .write(hashing, flate2::Compression::best());
            let (gz, written): (GzEncoder<_>, _) = tree.write_cpio(gz, mtime)?;
            (gz.finish().map_err(io_err)?, written)
        }
    };
    hashing.flush().map_err(io_err)?;
    let sha256 = hashing
        .hash
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let summary = Summary {
        sha256,
        size: hashing.len,
        cpio_size: written.bytes,
        entries: written.entries,
    };
    Ok((hashing.inner, summary))
}

/// Writes `tree` to `path` (through `<path>.partial` and a rename).
pub fn write_file(
    tree: &Tree,
    path: &Path,
    compression: Compression,
    mtime: u32,
) -> Result<Summary, OutputError> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let result = (|| {
        let io_err = |source| OutputError::Io {
            path: path.into(),
            source,
        };
        let file = File::create(&partial).map_err(io_err)?;
        let (buf, summary) = write_to(tree, BufWriter::new(file), compression, mtime)
            .map_err(|e| relabel(e, path))?;
        let file = buf.into_inner().map_err(|e| io_err(e.into_error()))?;
        file.sync_all().map_err(io_err)?;
        std::fs::rename(&partial, path).map_err(io_err)?;
        Ok(summary)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

/// Reads back an archive, gzip-compressed or not.
pub fn read_archive(bytes: &[u8]) -> Result<Vec<cpio::Entry>, CpioError> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        cpio::read_all(flate2::read::GzDecoder::new(bytes))
    } else {
        cpio::read_all(bytes)
    }
}

fn relabel(e: OutputError, path: &Path) -> OutputError {
    match e {
        OutputError::Io { source, .. } => OutputError::Io {
            path: path.into(),
            source,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> Tree {
        let mut t = Tree::new();
        t.bytes("/etc/hostname", 0o644, b"allox\n".to_vec())
            .unwrap();
        t.symlink("/bin", "usr/bin").unwrap();
        t
    }

    #[test]
    fn gzip_is_deterministic_and_round_trips() {
        let (a, sa) = write_to(&tree(), Vec::new(), Compression::Gzip, 0).unwrap();
        let (b, sb) = write_to(&tree(), Vec::new(), Compression::Gzip, 0).unwrap();
        assert_eq!(a, b);
        assert_eq!(sa, sb);
        assert_eq!(sa.size as usize, a.len());
        // No mtime, no name flag, OS "unknown".
        assert_eq!(&a[..4], &[0x1f, 0x8b, 8, 0]);
        assert_eq!(&a[4..8], &[0, 0, 0, 0]);
        assert_eq!(a[9], 255);
        let plain = cpio::read_all(flate2::read::GzDecoder::new(&a[..])).unwrap();
        let (raw, s) = write_to(&tree(), Vec::new(), Compression::None, 0).unwrap();
        assert_eq!(s.cpio_size as usize, raw.len());
        assert_eq!(sa.cpio_size, s.cpio_size);
        assert_eq!(plain, cpio::read_all(&raw[..]).unwrap());
    }

    #[test]
    fn the_hash_is_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("initrd");
        let s = write_file(&tree(), &out, Compression::None, 0).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(s.size as usize, bytes.len());
        let want: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(s.sha256, want);
        assert!(!dir.path().join("initrd.partial").exists());
    }

    #[test]
    fn a_failed_build_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("initrd");
        let mut t = tree();
        let src = dir.path().join("vanishing");
        std::fs::write(&src, "x").unwrap();
        t.file("/x", &src).unwrap();
        std::fs::remove_file(&src).unwrap();
        let err = write_file(&t, &out, Compression::Gzip, 0).unwrap_err();
        assert_eq!(err.to_string(), format!("{}: cannot read", src.display()));
        assert!(!out.exists());
        assert!(!dir.path().join("initrd.partial").exists());
    }
}
