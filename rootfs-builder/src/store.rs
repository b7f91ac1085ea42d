//! The store disk: a sparse file of zeros that QEMU attaches as a virtio
//! block device, optionally formatted as Btrfs on the host (the guest has
//! no mkfs). A formatted image is not reproducible: mkfs.btrfs picks fresh
//! UUIDs each time.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The label allox-init looks for.
pub const LABEL: &str = "allox-store";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "{size:?}: not a size (a number with an optional K, M, G or T suffix, powers of 1024)"
    )]
    BadSize { size: String },
    #[error("{}: exists and is not empty (use --force to overwrite it)", path.display())]
    Exists { path: PathBuf },
    #[error("{}: not a regular file", path.display())]
    NotFile { path: PathBuf },
    #[error("{}: cannot create", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mkfs.btrfs not found in PATH, /usr/sbin or /sbin (apt-get install btrfs-progs)")]
    NoMkfs,
    #[error("{}: cannot run", mkfs.display())]
    RunMkfs {
        mkfs: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: mkfs.btrfs failed ({status}): {stderr}", path.display())]
    Mkfs {
        path: PathBuf,
        status: std::process::ExitStatus,
        stderr: String,
    },
}

/// "1G" → 1 << 30. Suffixes K, M, G, T (optionally followed by "iB" or
/// "B"), powers of 1024; no suffix means bytes.
pub fn parse_size(s: &str) -> Result<u64, StoreError> {
    let bad = || StoreError::BadSize { size: s.into() };
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        Some('T' | 't') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    if n == 0 {
        return Err(bad());
    }
    n.checked_mul(1 << shift).ok_or_else(bad)
}

/// Creates `path` as a sparse file of `size` zero bytes. An existing empty
/// file is reused; a non-empty one is refused unless `force`.
pub fn create(path: &Path, size: u64, force: bool) -> Result<(), StoreError> {
    match std::fs::metadata(path) {
        Ok(md) if !md.is_file() => return Err(StoreError::NotFile { path: path.into() }),
        Ok(md) if md.len() > 0 && !force => return Err(StoreError::Exists { path: path.into() }),
        _ => {}
    }
    let create_err = |source| StoreError::Create {
        path: path.into(),
        source,
    };
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(create_err)?;
    f.set_len(size).map_err(create_err)?;
    f.sync_all().map_err(create_err)
}

/// mkfs.btrfs from PATH, then /usr/sbin and /sbin (often not in a
/// non-root PATH).
pub fn find_mkfs() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join("mkfs.btrfs"))
        .find(|p| p.is_file())
}

/// Formats the image with `mkfs.btrfs -q -L allox-store`.
pub fn format(path: &Path) -> Result<(), StoreError> {
    let mkfs = find_mkfs().ok_or(StoreError::NoMkfs)?;
    let out = Command::new(&mkfs)
        .args(["-q", "-L", LABEL])
        .arg(path)
        .output()
        .map_err(|source| StoreError::RunMkfs {
            mkfs: mkfs.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(StoreError::Mkfs {
            path: path.into(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert_eq!(parse_size("2T").unwrap(), 2 << 40);
        for bad in ["", "G", "0", "-1G", "1.5G", "1X", "99999999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_image_is_sparse_and_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("store.img");
        create(&img, 1 << 30, false).unwrap();
        let md = std::fs::metadata(&img).unwrap();
        assert_eq!(md.len(), 1 << 30);
        // A few blocks at most for a filesystem that stores no holes.
        assert!(
            md.blocks() * 512 < 1 << 20,
            "{} blocks allocated",
            md.blocks()
        );

        std::fs::write(&img, "data").unwrap();
        let err = create(&img, 1 << 20, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: exists and is not empty (use --force to overwrite it)",
                img.display()
            )
        );
        assert_eq!(std::fs::read(&img).unwrap(), b"data");
        create(&img, 1 << 20, true).unwrap();
        let bytes = std::fs::read(&img).unwrap();
        assert_eq!(bytes.len(), 1 << 20);
        assert!(bytes.iter().all(|&b| b == 0));

        // An empty file is fine without --force; a directory never is.
        let empty = dir.path().join("empty.img");
        std::fs::write(&empty, "").unwrap();
        create(&empty, 4096, false).unwrap();
        assert!(matches!(
            create(dir.path(), 4096, true),
            Err(StoreError::NotFile { .. })
        ));
    }

    #[test]
    fn format_makes_btrfs() {
        if find_mkfs().is_none() {
            return crate::test_support::skip(
                "format_makes_btrfs",
                "mkfs.btrfs (apt-get install btrfs-progs)",
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("store.img");
        create(&img, 256 << 20, false).unwrap();
        format(&img).unwrap();
        // The primary superblock is at 64 KiB; its magic at offset 0x40,
        // its label at 0x12b.
        use std::os::unix::fs::FileExt;
        let mut sb = vec![0u8; 0x1000];
        let f = std::fs::File::open(&img).unwrap();
        f.read_exact_at(&mut sb, 0x10000).unwrap();
        assert_eq!(&sb[0x40..0x48], b"_BHRfS_M");
        assert_eq!(&sb[0x12b..0x12b + LABEL.len() + 1], b"allox-store\0");
    }

    #[test]
    fn a_failed_format_says_why() {
        if find_mkfs().is_none() {
            return crate::test_support::skip(
                "a_failed_format_says_why",
                "mkfs.btrfs (apt-get install btrfs-progs)",
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("tiny.img");
        create(&img, 1 << 20, false).unwrap();
        let msg = format(&img).unwrap_err().to_string();
        assert!(
            msg.starts_with(&format!("{}: mkfs.btrfs failed", img.display())),
            "{msg}"
        );
    }
}
