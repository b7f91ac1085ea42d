//! Btrfs quota groups: turning them on, a limit per subvolume, reading
//! what a subvolume uses, removing the groups of deleted subvolumes.
//!
//! Every subvolume has a level-0 quota group `0/<id>` once quotas are on
//! (the kernel makes one for each existing subvolume when they are turned
//! on, and one for each new subvolume or snapshot). A snapshot's group
//! starts with its source's limit. Its *referenced* bytes are everything
//! its tree points at, shared or not; a write that would take them past
//! `max_rfer` fails with `EDQUOT`, whoever makes it (root included: only
//! the filesystem-wide `quota_override` switch, which the store never sets,
//! exempts `CAP_SYS_RESOURCE`). Removing files is always allowed.
//!
//! Layouts from `linux/btrfs.h` and `linux/btrfs_tree.h`.

use super::{io_err, ioctl, open_dir, BtrfsError, SearchKey, TreeSearch};
use std::path::Path;

/// `struct btrfs_ioctl_quota_ctl_args`.
#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

/// `struct btrfs_qgroup_limit`.
#[repr(C)]
#[derive(Default)]
struct QgroupLimit {
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

/// `struct btrfs_ioctl_qgroup_limit_args`.
#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    lim: QgroupLimit,
}

/// `struct btrfs_ioctl_quota_rescan_args`.
#[repr(C)]
#[derive(Default)]
struct RescanArgs {
    flags: u64,
    progress: u64,
    reserved: [u64; 6],
}

/// `struct btrfs_ioctl_qgroup_create_args`.
#[repr(C)]
struct QgroupCreateArgs {
    create: u64,
    qgroupid: u64,
}

const IOC_QUOTA_CTL: u64 = super::iowr(40, std::mem::size_of::<QuotaCtlArgs>());
const IOC_QGROUP_CREATE: u64 = super::iow(42, std::mem::size_of::<QgroupCreateArgs>());
/// Declared `_IOR` in the kernel although it only reads its argument.
const IOC_QGROUP_LIMIT: u64 = super::ior(43, std::mem::size_of::<QgroupLimitArgs>());
const IOC_QUOTA_RESCAN: u64 = super::iow(44, std::mem::size_of::<RescanArgs>());
/// `_IO(0x94, 46)`: no argument.
const IOC_QUOTA_RESCAN_WAIT: u64 = (0x94 << 8) | 46;

const QUOTA_CTL_ENABLE: u64 = 1;
const LIMIT_MAX_RFER: u64 = 1;
/// The value that clears a limit.
const CLEAR_VALUE: u64 = u64::MAX;

const QUOTA_TREE_ID: u64 = 8;
const QGROUP_STATUS_KEY: u8 = 240;
const QGROUP_INFO_KEY: u8 = 242;
const QGROUP_LIMIT_KEY: u8 = 244;
const STATUS_FLAG_RESCAN: u64 = 1 << 1;
const STATUS_FLAG_INCONSISTENT: u64 = 1 << 2;

/// The quota state of a filesystem, from its quota tree's status item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaStatus {
    /// A rescan is running: the numbers are not complete yet.
    pub rescanning: bool,
    /// The numbers are wrong until a rescan: limits are not reliable.
    pub inconsistent: bool,
}

/// What a subvolume's quota group counts, and its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Bytes its tree points at (data and metadata), shared or not.
    pub referenced: u64,
    /// Bytes only its tree points at.
    pub exclusive: u64,
    /// The limit on `referenced`, if any.
    pub max_referenced: Option<u64>,
}

fn le(d: &[u8], at: usize) -> u64 {
    d.get(at..at + 8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .unwrap_or(0)
}

/// The quota status of the filesystem `path` is on; `None` when quotas
/// are off (no quota tree).
pub fn status(path: &Path) -> Result<Option<QuotaStatus>, BtrfsError> {
    let fd = open_dir(path)?;
    let key = SearchKey::object(QUOTA_TREE_ID, 0, QGROUP_STATUS_KEY..=QGROUP_STATUS_KEY);
    let mut flags = None;
    match TreeSearch::default().run(&fd, key, |it| flags = Some(le(it.data, 16))) {
        Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(None),
        other => other?,
    }
    Ok(flags.map(|f| QuotaStatus {
        rescanning: f & STATUS_FLAG_RESCAN != 0,
        inconsistent: f & STATUS_FLAG_INCONSISTENT != 0,
    }))
}

/// Turns quotas on for the filesystem `path` is on. The kernel makes a
/// quota group for every existing subvolume and starts a rescan to count
/// what they hold; see [`wait_rescan`]. Already on is not an error.
pub fn enable(path: &Path) -> Result<(), BtrfsError> {
    let fd = open_dir(path)?;
    let mut args = QuotaCtlArgs {
        cmd: QUOTA_CTL_ENABLE,
        status: 0,
    };
    ioctl(&fd, IOC_QUOTA_CTL, &mut args).map_err(|e| io_err("turn on quotas for", path, e))
}

/// Waits until a running rescan is finished (at once if none runs).
pub fn wait_rescan(path: &Path) -> Result<(), BtrfsError> {
    let fd = open_dir(path)?;
    let mut none = 0u64;
    ioctl(&fd, IOC_QUOTA_RESCAN_WAIT, &mut none)
        .map_err(|e| io_err("wait for the quota rescan of", path, e))
}

/// Starts counting every quota group again (when the numbers are
/// inconsistent); see [`wait_rescan`]. One already running is not an error.
pub fn rescan(path: &Path) -> Result<(), BtrfsError> {
    let fd = open_dir(path)?;
    let mut args = RescanArgs::default();
    match ioctl(&fd, IOC_QUOTA_RESCAN, &mut args) {
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(()),
        other => other.map_err(|e| io_err("start the quota rescan of", path, e)),
    }
}

/// Sets (or with `None` clears) the limit on the referenced bytes of
/// subvolume `id`. `via` is any directory on the same filesystem outside
/// that subvolume: the kernel reserves room for the limit's own item in the
/// subvolume `via` belongs to, and a subvolume already at its limit would
/// refuse that reservation.
pub fn set_limit(via: &Path, id: u64, max_referenced: Option<u64>) -> Result<(), BtrfsError> {
    let fd = open_dir(via)?;
    let mut args = QgroupLimitArgs {
        qgroupid: id,
        lim: QgroupLimit {
            flags: LIMIT_MAX_RFER,
            max_rfer: max_referenced.unwrap_or(CLEAR_VALUE),
            ..QgroupLimit::default()
        },
    };
    ioctl(&fd, IOC_QGROUP_LIMIT, &mut args).map_err(|e| {
        io_err(
            "set the quota limit of subvolume",
            Path::new(&id.to_string()),
            e,
        )
    })
}

/// What the quota group of subvolume `id` counts; `None` if it has none
/// (quotas off, or a subvolume made while they were off and not yet
/// rescanned).
pub fn usage(via: &Path, id: u64) -> Result<Option<Usage>, BtrfsError> {
    let fd = open_dir(via)?;
    let mut search = TreeSearch::default();
    let one = |kind: u8| SearchKey {
        min_offset: id,
        max_offset: id,
        ..SearchKey::object(QUOTA_TREE_ID, 0, kind..=kind)
    };
    let mut info = None;
    match search.run(&fd, one(QGROUP_INFO_KEY), |it| {
        info = Some((le(it.data, 8), le(it.data, 24)))
    }) {
        Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(None),
        other => other?,
    }
    let Some((referenced, exclusive)) = info else {
        return Ok(None);
    };
    let mut max_referenced = None;
    search.run(&fd, one(QGROUP_LIMIT_KEY), |it| {
        if le(it.data, 0) & LIMIT_MAX_RFER != 0 {
            max_referenced = Some(le(it.data, 8));
        }
    })?;
    Ok(Some(Usage {
        referenced,
        exclusive,
        max_referenced,
    }))
}

/// Removes the level-0 quota groups whose subvolume is gone and that
/// count nothing any more (Linux 6.1 keeps them after the subvolume is
/// dropped; newer kernels remove them themselves). A subvolume being
/// dropped still has its root item, and the last of its numbers go only
/// with the commit after it is gone — removing its group before then
/// would make newer kernels mark every number inconsistent — so such a
/// group is left for a later call. Returns how many were removed.
pub fn remove_stale(via: &Path) -> Result<usize, BtrfsError> {
    let fd = open_dir(via)?;
    let mut empty = Vec::new();
    let key = SearchKey::object(QUOTA_TREE_ID, 0, QGROUP_INFO_KEY..=QGROUP_INFO_KEY);
    match TreeSearch::default().run(&fd, key, |it| {
        // Level-0 groups (the level is the top 16 bits) of subvolumes
        // (IDs from 256) whose referenced and exclusive bytes are zero.
        let id = it.offset;
        if id >> 48 == 0 && id >= 256 && le(it.data, 8) == 0 && le(it.data, 24) == 0 {
            empty.push(id);
        }
    }) {
        Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(0),
        other => other?,
    }
    if empty.is_empty() {
        return Ok(0);
    }
    let live: std::collections::HashSet<u64> = super::all_roots(&fd)?.into_iter().collect();
    let mut removed = 0;
    for id in empty.into_iter().filter(|id| !live.contains(id)) {
        let mut args = QgroupCreateArgs {
            create: 0,
            qgroupid: id,
        };
        match ioctl(&fd, IOC_QGROUP_CREATE, &mut args) {
            Ok(()) => removed += 1,
            // Counting again (newer kernels), or already gone.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::ENOENT)) => {}
            Err(e) => return Err(io_err("remove quota group", Path::new(&id.to_string()), e)),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_structs_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<QgroupLimitArgs>(), 48);
        // Values from linux/btrfs.h as compiled by the C headers.
        assert_eq!(IOC_QUOTA_CTL, 0xC010_9428);
        assert_eq!(IOC_QGROUP_CREATE, 0x4010_942A);
        assert_eq!(IOC_QGROUP_LIMIT, 0x8030_942B);
        assert_eq!(IOC_QUOTA_RESCAN, 0x4040_942C);
        assert_eq!(IOC_QUOTA_RESCAN_WAIT, 0x942E);
    }
}
