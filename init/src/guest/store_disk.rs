//! The store disk: found, told apart by its first mebibyte, formatted if it
//! is blank and the settings allow it, and mounted at [`STORE_MOUNT`].
//!
//! A device that holds anything but Btrfs is never touched.

use super::{log, STORE_MOUNT};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::mount::MountFlags;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why the store cannot be mounted; each says what to do about it.
#[derive(Debug, Error)]
pub enum StoreDiskError {
    #[error("the store device {} does not exist ({})", .0.display(), .1.missing)]
    Missing(PathBuf, &'static Hints),
    #[error("cannot open the store device {}", .dev.display())]
    Open {
        dev: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot read the store device {}", .dev.display())]
    Read {
        dev: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("the store device {} is blank; {} to format it", .0.display(), .1.format)]
    Blank(PathBuf, &'static Hints),
    #[error("the store device {} holds no Btrfs filesystem (and is not blank); refusing to touch it", .0.display())]
    Foreign(PathBuf),
    #[error("the store device {} is blank and this image has no mkfs.btrfs to format it; format it on the host (rootfs-builder store-image --format)", .0.display())]
    NoMkfs(PathBuf),
    #[error("cannot run {mkfs}")]
    RunMkfs {
        mkfs: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{mkfs} failed on {}: {stderr}", .dev.display())]
    Mkfs {
        mkfs: &'static str,
        dev: PathBuf,
        stderr: String,
    },
    #[error("cannot mount the store device {} as Btrfs (the filesystem is damaged, or the kernel lacks Btrfs; the kernel log above says more)", .dev.display())]
    Mount {
        dev: PathBuf,
        #[source]
        source: Errno,
    },
}

/// How to fix what the errors name, in the words of where the store is
/// used: the guest's kernel command line or the container's options.
#[derive(Debug)]
pub struct Hints {
    /// How to give the device.
    pub missing: &'static str,
    /// How to ask for a blank device to be formatted.
    pub format: &'static str,
}

/// The guest's: settings on the kernel command line.
pub static GUEST: Hints = Hints {
    missing: "attach the store disk, or name it with allox.store=",
    format: "boot with allox.format=1",
};

/// The container's: `allox-init container` options.
pub static CONTAINER: Hints = Hints {
    missing: "give the container the block device (podman --device, Kubernetes volumeDevices) and name it with --store",
    format: "pass --format-blank",
};

/// What the first bytes of a block device say about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskState {
    Btrfs,
    Blank,
    Other,
}

/// How many bytes of the device [`disk_state`] looks at.
pub const HEAD_BYTES: usize = 1 << 20;

/// The Btrfs primary superblock is at 64 KiB; its magic at offset 0x40.
pub fn disk_state(head: &[u8]) -> DiskState {
    const SB: usize = 0x1_0000;
    if head.len() >= SB + 0x48 && &head[SB + 0x40..SB + 0x48] == b"_BHRfS_M" {
        DiskState::Btrfs
    } else if head.iter().all(|&b| b == 0) {
        DiskState::Blank
    } else {
        DiskState::Other
    }
}

/// What to do with a device in `state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    Mount,
    FormatThenMount,
}

/// Mount a Btrfs device; format a blank one only if `format` (the
/// `allox.format=1` setting, `--format-blank`) says so; refuse anything
/// else.
pub fn plan(
    dev: &Path,
    state: DiskState,
    format: bool,
    hints: &'static Hints,
) -> Result<Plan, StoreDiskError> {
    match state {
        DiskState::Btrfs => Ok(Plan::Mount),
        DiskState::Blank if format => Ok(Plan::FormatThenMount),
        DiskState::Blank => Err(StoreDiskError::Blank(dev.to_path_buf(), hints)),
        DiskState::Other => Err(StoreDiskError::Foreign(dev.to_path_buf())),
    }
}

/// Waits up to 5 s for the store device to appear, reads its head,
/// formats it if [`plan`] says so, and mounts it at [`STORE_MOUNT`].
pub fn mount_store(dev: &Path, format: bool, hints: &'static Hints) -> Result<(), StoreDiskError> {
    prepare_store(dev, format, hints)?;
    mount_prepared(dev)
}

/// All of [`mount_store`] but the mount: waits up to 5 s for the device,
/// reads its head, refuses it or formats it as [`plan`] says.
pub fn prepare_store(
    dev: &Path,
    format: bool,
    hints: &'static Hints,
) -> Result<(), StoreDiskError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dev.exists() {
        if Instant::now() > deadline {
            return Err(StoreDiskError::Missing(dev.to_path_buf(), hints));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let head = read_head(dev)?;
    if plan(dev, disk_state(&head), format, hints)? == Plan::FormatThenMount {
        format_store(dev)?;
    }
    Ok(())
}

/// Mounts the device [`prepare_store`] found at [`STORE_MOUNT`].
pub fn mount_prepared(dev: &Path) -> Result<(), StoreDiskError> {
    let _ = std::fs::create_dir_all(STORE_MOUNT);
    rustix::mount::mount(
        dev,
        STORE_MOUNT,
        "btrfs",
        // noatime: a read in a session would otherwise write its inode,
        // which a diff of current/ then has to visit.
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOATIME,
        None,
    )
    .map_err(|source| StoreDiskError::Mount {
        dev: dev.to_path_buf(),
        source,
    })
}

/// Unmounts the store from [`STORE_MOUNT`] (after a sync), lazily if it
/// is still busy; says which on the log.
pub fn unmount_store() {
    rustix::fs::sync();
    match rustix::mount::unmount(STORE_MOUNT, rustix::mount::UnmountFlags::empty()) {
        Ok(()) => log("store unmounted"),
        Err(e) => {
            log(format_args!(
                "cannot unmount the store cleanly ({e}); detaching it"
            ));
            let _ = rustix::mount::unmount(STORE_MOUNT, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// The first [`HEAD_BYTES`] of the device (fewer if it is smaller).
fn read_head(dev: &Path) -> Result<Vec<u8>, StoreDiskError> {
    let fd = rustix::fs::open(dev, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).map_err(
        |source| StoreDiskError::Open {
            dev: dev.to_path_buf(),
            source,
        },
    )?;
    let mut head = vec![0u8; HEAD_BYTES];
    let mut got = 0;
    while got < head.len() {
        match rustix::io::pread(&fd, &mut head[got..], got as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(Errno::INTR) => continue,
            Err(source) => {
                return Err(StoreDiskError::Read {
                    dev: dev.to_path_buf(),
                    source,
                })
            }
        }
    }
    head.truncate(got);
    Ok(head)
}

fn format_store(dev: &Path) -> Result<(), StoreDiskError> {
    let mkfs = [
        "/usr/sbin/mkfs.btrfs",
        "/sbin/mkfs.btrfs",
        "/usr/bin/mkfs.btrfs",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .ok_or_else(|| StoreDiskError::NoMkfs(dev.to_path_buf()))?;
    log(format_args!(
        "formatting the blank store device {}",
        dev.display()
    ));
    let out = Command::new(mkfs)
        .args(["-q", "-L", "allox-store"])
        .arg(dev)
        .output()
        .map_err(|source| StoreDiskError::RunMkfs { mkfs, source })?;
    if !out.status.success() {
        return Err(StoreDiskError::Mkfs {
            mkfs,
            dev: dev.to_path_buf(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disks_are_told_apart_by_their_first_mebibyte() {
        let mut d = vec![0u8; HEAD_BYTES];
        assert_eq!(disk_state(&d), DiskState::Blank);
        d[0x1_0040..0x1_0048].copy_from_slice(b"_BHRfS_M");
        assert_eq!(disk_state(&d), DiskState::Btrfs);
        d[0x1_0040] = b'X';
        assert_eq!(disk_state(&d), DiskState::Other);
        assert_eq!(disk_state(&[]), DiskState::Blank);
    }

    #[test]
    fn only_a_blank_disk_is_formatted_and_only_when_asked() {
        let dev = Path::new("/dev/vda");
        assert_eq!(
            plan(dev, DiskState::Btrfs, false, &GUEST).unwrap(),
            Plan::Mount
        );
        assert_eq!(
            plan(dev, DiskState::Btrfs, true, &GUEST).unwrap(),
            Plan::Mount
        );
        assert_eq!(
            plan(dev, DiskState::Blank, true, &GUEST).unwrap(),
            Plan::FormatThenMount
        );
        let blank = plan(dev, DiskState::Blank, false, &GUEST)
            .unwrap_err()
            .to_string();
        assert!(
            blank.contains("/dev/vda is blank; boot with allox.format=1"),
            "{blank}"
        );
        let other = plan(dev, DiskState::Other, true, &GUEST)
            .unwrap_err()
            .to_string();
        assert!(other.contains("holds no Btrfs filesystem"), "{other}");
        // A container is told its own option.
        let blank = plan(
            Path::new("/dev/allox-store"),
            DiskState::Blank,
            false,
            &CONTAINER,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            blank,
            "the store device /dev/allox-store is blank; pass --format-blank to format it"
        );
    }

    #[test]
    fn a_failed_mount_names_the_device_and_the_cause() {
        let e = StoreDiskError::Mount {
            dev: PathBuf::from("/dev/vda"),
            source: Errno::INVAL,
        };
        let text = allox_protocol::error_chain(&e);
        assert!(
            text.starts_with("cannot mount the store device /dev/vda as Btrfs"),
            "{text}"
        );
        assert!(text.ends_with(&Errno::INVAL.to_string()), "{text}");
    }
}
