//! Btrfs subvolume operations through the kernel's ioctls — what
//! libbtrfsutil does, without linking it (the init is static) and never by
//! spawning the `btrfs` CLI.
//!
//! This is the store's only file with `unsafe`: each ioctl gets a
//! fixed-size argument struct laid out as in `linux/btrfs.h`.
#![allow(unsafe_code)]

use crate::tree;
use rustix::fd::{AsFd, AsRawFd, OwnedFd};
use rustix::fs::{self, Mode, OFlags};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use thiserror::Error;

pub mod quota;

const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;
/// Inode number of every subvolume's root directory.
pub const SUBVOL_ROOT_INO: u64 = 256;
const BTRFS_PATH_NAME_MAX: usize = 4087;
const BTRFS_SUBVOL_NAME_MAX: usize = 4039;
const BTRFS_SUBVOL_RDONLY: u64 = 1 << 1;

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; BTRFS_PATH_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_vol_args_v2` (name variant of the last union).
#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; BTRFS_SUBVOL_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_ino_lookup_args`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

const fn iow(nr: u64, size: usize) -> u64 {
    (1 << 30) | ((size as u64) << 16) | (0x94 << 8) | nr
}
const fn ior(nr: u64, size: usize) -> u64 {
    (2 << 30) | ((size as u64) << 16) | (0x94 << 8) | nr
}
const fn iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (0x94 << 8) | nr
}
const IOC_SUBVOL_CREATE: u64 = iow(14, std::mem::size_of::<VolArgs>());
const IOC_SNAP_DESTROY: u64 = iow(15, std::mem::size_of::<VolArgs>());
const IOC_INO_LOOKUP: u64 = iowr(18, std::mem::size_of::<InoLookupArgs>());
const IOC_WAIT_SYNC: u64 = iow(22, std::mem::size_of::<u64>());
const IOC_START_SYNC: u64 = ior(24, std::mem::size_of::<u64>());
const IOC_SNAP_CREATE_V2: u64 = iow(23, std::mem::size_of::<VolArgsV2>());
const IOC_SUBVOL_GETFLAGS: u64 = ior(25, std::mem::size_of::<u64>());
const IOC_SUBVOL_SETFLAGS: u64 = iow(26, std::mem::size_of::<u64>());
/// `BTRFS_IOC_TREE_SEARCH_V2`: the size encoded is that of the header
/// (`struct btrfs_ioctl_search_args_v2` without its flexible buffer).
const IOC_TREE_SEARCH_V2: u64 = iowr(17, std::mem::size_of::<SearchKey>() + 8);

/// `struct btrfs_ioctl_search_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SearchKey {
    pub tree_id: u64,
    pub min_objectid: u64,
    pub max_objectid: u64,
    pub min_offset: u64,
    pub max_offset: u64,
    pub min_transid: u64,
    pub max_transid: u64,
    pub min_type: u32,
    pub max_type: u32,
    pub nr_items: u32,
    unused: u32,
    unused1: u64,
    unused2: u64,
    unused3: u64,
    unused4: u64,
}

impl SearchKey {
    /// Every item of `tree_id` in tree blocks written at or after
    /// `min_transid`.
    pub fn all(tree_id: u64, min_transid: u64) -> SearchKey {
        SearchKey {
            tree_id,
            max_objectid: u64::MAX,
            max_offset: u64::MAX,
            min_transid,
            max_transid: u64::MAX,
            max_type: 255,
            ..SearchKey::default()
        }
    }

    /// The items of one object with types in `types`.
    pub fn object(tree_id: u64, objectid: u64, types: std::ops::RangeInclusive<u8>) -> SearchKey {
        SearchKey {
            tree_id,
            min_objectid: objectid,
            max_objectid: objectid,
            max_offset: u64::MAX,
            max_transid: u64::MAX,
            min_type: u32::from(*types.start()),
            max_type: u32::from(*types.end()),
            ..SearchKey::default()
        }
    }
}

const SEARCH_BUF: usize = 64 * 1024;

/// `struct btrfs_ioctl_search_args_v2` with a 64 KiB buffer.
#[repr(C)]
struct SearchArgsV2 {
    key: SearchKey,
    buf_size: u64,
    buf: [u8; SEARCH_BUF],
}

/// One item found by [`TreeSearch::run`]: its key, the generation of the tree
/// block it sits in, and its bytes.
#[derive(Debug)]
pub struct Item<'a> {
    pub objectid: u64,
    pub kind: u8,
    pub offset: u64,
    pub transid: u64,
    pub data: &'a [u8],
}

/// Item types used by the diff (from `linux/btrfs_tree.h`).
pub mod item {
    pub const INODE_ITEM: u8 = 1;
    pub const INODE_REF: u8 = 12;
    pub const INODE_EXTREF: u8 = 13;
    pub const DIR_ITEM: u8 = 84;
    pub const DIR_INDEX: u8 = 96;
    pub const ROOT_ITEM: u8 = 132;
    pub const ROOT_REF: u8 = 156;
}
/// The tree of tree roots.
pub const ROOT_TREE_ID: u64 = 1;

/// Runs tree searches with one buffer (`BTRFS_IOC_TREE_SEARCH_V2`; needs
/// `CAP_SYS_ADMIN`).
pub struct TreeSearch {
    args: Box<SearchArgsV2>,
}

impl Default for TreeSearch {
    fn default() -> Self {
        TreeSearch {
            args: Box::new(SearchArgsV2 {
                key: SearchKey::default(),
                buf_size: SEARCH_BUF as u64,
                buf: [0; SEARCH_BUF],
            }),
        }
    }
}

impl TreeSearch {
    /// One search: calls `f` for each of the first `n` keys at or after the
    /// search key's lower bound, up to its upper bound, in key order, of
    /// whatever type (the kernel compares whole keys), as many as fit its
    /// buffer; answers how many there were. Fewer than `n` do not mean the
    /// tree ends: only none does.
    pub fn first(
        &mut self,
        fd: &impl AsFd,
        key: SearchKey,
        n: u32,
        mut f: impl FnMut(&Item<'_>),
    ) -> Result<u32, BtrfsError> {
        let args = &mut *self.args;
        args.key = key;
        args.key.nr_items = n;
        args.buf_size = SEARCH_BUF as u64;
        ioctl(fd, IOC_TREE_SEARCH_V2, args)
            .map_err(|e| io_err("search tree", Path::new(&format!("{}", key.tree_id)), e))?;
        let got = args.key.nr_items;
        items(&args.buf, got, |it| f(it));
        Ok(got)
    }

    /// Calls `f` for every item the search key selects, in key order. The
    /// kernel compares whole keys `(objectid, type, offset)` against the two
    /// bounds, so items of other types between them are dropped here.
    pub fn run(
        &mut self,
        fd: &impl AsFd,
        key: SearchKey,
        f: impl FnMut(&Item<'_>),
    ) -> Result<(), BtrfsError> {
        self.run_skipping(fd, key, |_| None, f)
    }

    /// [`run`](TreeSearch::run), where `skip` may say, of the last key a
    /// search returned, the key to go on from instead of the one right
    /// after it (never an earlier one): the keys between are not searched
    /// (`f` sees what one search returned, whatever `skip` says).
    pub fn run_skipping(
        &mut self,
        fd: &impl AsFd,
        key: SearchKey,
        skip: impl Fn((u64, u8, u64)) -> Option<(u64, u8, u64)>,
        mut f: impl FnMut(&Item<'_>),
    ) -> Result<(), BtrfsError> {
        let args = &mut *self.args;
        args.key = key;
        let types = key.min_type..=key.max_type;
        loop {
            args.key.nr_items = u32::MAX;
            args.buf_size = SEARCH_BUF as u64;
            ioctl(fd, IOC_TREE_SEARCH_V2, args)
                .map_err(|e| io_err("search tree", Path::new(&format!("{}", key.tree_id)), e))?;
            let n = args.key.nr_items;
            if n == 0 {
                return Ok(());
            }
            let mut last = (0u64, 0u8, 0u64);
            items(&args.buf, n, |it| {
                last = (it.objectid, it.kind, it.offset);
                if types.contains(&u32::from(it.kind)) {
                    f(it);
                }
            });
            // Continue just after the last key returned.
            let (o, t, off) = last;
            let next = if off < u64::MAX {
                Some((o, t, off + 1))
            } else if t < u8::MAX {
                Some((o, t + 1, 0))
            } else {
                o.checked_add(1).map(|o| (o, 0, 0))
            };
            let next = match (next, skip(last)) {
                (Some(n), Some(s)) => Some(n.max(s)),
                (n, _) => n,
            };
            let Some((o, t, off)) = next else {
                return Ok(());
            };
            if o > key.max_objectid {
                return Ok(());
            }
            args.key.min_objectid = o;
            args.key.min_type = u32::from(t);
            args.key.min_offset = off;
        }
    }
}

/// Calls `f` for each of the `n` items a search left in `buf`
/// (`struct btrfs_ioctl_search_header` and the item's bytes, one after the
/// other).
fn items(buf: &[u8], n: u32, mut f: impl FnMut(&Item<'_>)) {
    let mut at = 0usize;
    for _ in 0..n {
        let word = |i: usize| u64::from_ne_bytes(buf[at + i..at + i + 8].try_into().unwrap());
        let half = |i: usize| u32::from_ne_bytes(buf[at + i..at + i + 4].try_into().unwrap());
        let (transid, objectid, offset, kind) = (word(0), word(8), word(16), half(24));
        let len = half(28) as usize;
        let data = &buf[at + 32..at + 32 + len];
        at += 32 + len;
        f(&Item {
            objectid,
            kind: kind as u8,
            offset,
            transid,
            data,
        });
    }
}

#[derive(Debug, Error)]
pub enum BtrfsError {
    #[error("{path} is not on a Btrfs filesystem")]
    NotBtrfs { path: String },
    #[error("subvolume name {0:?} is not a single path component")]
    BadName(String),
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Tree(#[from] crate::tree::TreeError),
}

impl BtrfsError {
    /// The OS error number, if this failed in the kernel.
    pub fn errno(&self) -> Option<i32> {
        match self {
            BtrfsError::Io { source, .. } => source.raw_os_error(),
            BtrfsError::Tree(e) => e.errno(),
            _ => None,
        }
    }
}

fn io_err(op: &'static str, path: &Path, source: io::Error) -> BtrfsError {
    BtrfsError::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

fn open_dir(path: &Path) -> Result<OwnedFd, BtrfsError> {
    fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err("open", path, e.into()))
}

fn copy_name(dst: &mut [u8], name: &OsStr) -> Result<(), BtrfsError> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= dst.len() || b.contains(&b'/') || b.contains(&0) {
        return Err(BtrfsError::BadName(name.to_string_lossy().into_owned()));
    }
    dst[..b.len()].copy_from_slice(b);
    Ok(())
}

fn split(path: &Path) -> Result<(&Path, &OsStr), BtrfsError> {
    match (path.parent(), path.file_name()) {
        (Some(p), Some(n)) => Ok((
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            },
            n,
        )),
        _ => Err(BtrfsError::BadName(path.display().to_string())),
    }
}

fn ioctl<T>(fd: &impl AsFd, req: u64, arg: &mut T) -> io::Result<()> {
    // SAFETY: every caller passes one of the request numbers above together
    // with the argument struct the kernel expects for it (same layout and
    // size as in linux/btrfs.h, which the request number encodes; the tree
    // search's flexible buffer is as long as its `buf_size` says); the
    // struct lives for the whole call and the fd is open.
    let rc = unsafe {
        libc::ioctl(
            fd.as_fd().as_raw_fd(),
            req as libc::c_ulong,
            arg as *mut T as *mut libc::c_void,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Fails unless `path` is on Btrfs.
pub fn check_btrfs(path: &Path) -> Result<(), BtrfsError> {
    let st = fs::statfs(path).map_err(|e| io_err("statfs", path, e.into()))?;
    #[allow(clippy::unnecessary_cast)]
    if st.f_type as i64 != BTRFS_SUPER_MAGIC {
        return Err(BtrfsError::NotBtrfs {
            path: path.display().to_string(),
        });
    }
    Ok(())
}

/// Whether `path` is the root of a subvolume: `false` only when it is
/// certainly not (nothing there, or something else there); any other
/// failure to look (EIO, EACCES, ENOMEM) is an error, so that a caller
/// never mistakes a disk it cannot read for a tree that is gone.
pub fn probe_subvolume(path: &Path) -> Result<bool, BtrfsError> {
    match fs::lstat(path) {
        Ok(st) => {
            Ok(st.st_ino == SUBVOL_ROOT_INO && fs::FileType::from_raw_mode(st.st_mode).is_dir())
        }
        Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::NOTDIR) => Ok(false),
        Err(e) => Err(io_err("look at", path, e.into())),
    }
}

/// Whether `path` is the root of a subvolume (any failure to look counts
/// as no; recovery uses [`probe_subvolume`]).
pub fn is_subvolume(path: &Path) -> bool {
    match fs::lstat(path) {
        Ok(st) => st.st_ino == SUBVOL_ROOT_INO && fs::FileType::from_raw_mode(st.st_mode).is_dir(),
        Err(_) => false,
    }
}

/// Creates an empty subvolume at `path`.
pub fn create_subvolume(path: &Path) -> Result<(), BtrfsError> {
    let (parent, name) = split(path)?;
    let dir = open_dir(parent)?;
    let mut args = Box::new(VolArgs {
        fd: 0,
        name: [0; BTRFS_PATH_NAME_MAX + 1],
    });
    copy_name(&mut args.name, name)?;
    ioctl(&dir, IOC_SUBVOL_CREATE, &mut *args).map_err(|e| io_err("create subvolume", path, e))
}

/// Snapshots the subvolume `source` to `dest` (which must not exist).
pub fn snapshot(source: &Path, dest: &Path, readonly: bool) -> Result<(), BtrfsError> {
    let src = open_dir(source)?;
    let (parent, name) = split(dest)?;
    let dir = open_dir(parent)?;
    let mut args = Box::new(VolArgsV2 {
        fd: i64::from(src.as_raw_fd()),
        transid: 0,
        flags: if readonly { BTRFS_SUBVOL_RDONLY } else { 0 },
        unused: [0; 4],
        name: [0; BTRFS_SUBVOL_NAME_MAX + 1],
    });
    copy_name(&mut args.name, name)?;
    ioctl(&dir, IOC_SNAP_CREATE_V2, &mut *args).map_err(|e| io_err("snapshot to", dest, e))
}

/// Deletes the subvolume at `path` with everything in it. Fails with
/// `ENOTEMPTY` if it holds other subvolumes; see [`remove_tree`].
pub fn delete_subvolume(path: &Path) -> Result<(), BtrfsError> {
    let (parent, name) = split(path)?;
    let dir = open_dir(parent)?;
    delete_subvolume_at(&dir, name, path)
}

fn delete_subvolume_at(dir: &OwnedFd, name: &OsStr, shown: &Path) -> Result<(), BtrfsError> {
    let mut args = Box::new(VolArgs {
        fd: 0,
        name: [0; BTRFS_PATH_NAME_MAX + 1],
    });
    copy_name(&mut args.name, name)?;
    ioctl(dir, IOC_SNAP_DESTROY, &mut *args).map_err(|e| io_err("delete subvolume", shown, e))
}

/// What the root tree records of one subvolume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootInfo {
    pub id: u64,
    pub uuid: [u8; 16],
    /// The subvolume this one is a snapshot of (zero if none).
    pub parent_uuid: [u8; 16],
    /// The UUID of the subvolume this one was received from (zero if it
    /// was not received).
    pub received_uuid: [u8; 16],
    /// The transaction that created it.
    pub otransid: u64,
    /// When it was created, seconds since the epoch (0 where the item does
    /// not say).
    pub otime: u64,
}

impl RootInfo {
    /// Reads a `struct btrfs_root_item`; `None` for the legacy short form or
    /// one whose extended fields are stale.
    pub fn parse(id: u64, d: &[u8]) -> Option<RootInfo> {
        let le = |at: usize| u64::from_le_bytes(d[at..at + 8].try_into().unwrap());
        if d.len() < 311 || le(160) != le(239) {
            return None;
        }
        Some(RootInfo {
            id,
            uuid: d[247..263].try_into().unwrap(),
            parent_uuid: d[263..279].try_into().unwrap(),
            received_uuid: d[279..295].try_into().unwrap(),
            otransid: le(303),
            // `struct btrfs_timespec otime` at 339.
            otime: if d.len() >= 351 { le(339) } else { 0 },
        })
    }
}

/// The root items of the root tree from `min_objectid` on (trees above
/// the highest subvolume ID are internal ones).
fn root_items(min_objectid: u64) -> SearchKey {
    SearchKey {
        tree_id: ROOT_TREE_ID,
        min_objectid,
        max_objectid: u64::MAX - 256,
        min_type: u32::from(item::ROOT_ITEM),
        max_type: u32::from(item::ROOT_ITEM),
        max_offset: u64::MAX,
        max_transid: u64::MAX,
        ..SearchKey::default()
    }
}

/// The trees of deleted subvolumes the kernel has not finished dropping:
/// deleting a subvolume puts an orphan item keyed by its tree's ID into
/// the root tree in the deleting transaction (what `btrfs subvolume list
/// -d` reads); its root item stays, unchanged until the next commit,
/// until the cleaner has dropped the tree.
fn deleted_roots(search: &mut TreeSearch, fd: &impl AsFd) -> Result<Vec<u64>, BtrfsError> {
    /// `BTRFS_ORPHAN_OBJECTID` (-5) and `BTRFS_ORPHAN_ITEM_KEY`.
    const ORPHAN_OBJECTID: u64 = -5i64 as u64;
    const ORPHAN_ITEM: u8 = 48;
    let key = SearchKey {
        tree_id: ROOT_TREE_ID,
        min_objectid: ORPHAN_OBJECTID,
        max_objectid: ORPHAN_OBJECTID,
        min_type: u32::from(ORPHAN_ITEM),
        max_type: u32::from(ORPHAN_ITEM),
        max_offset: u64::MAX,
        max_transid: u64::MAX,
        ..SearchKey::default()
    };
    let mut out = Vec::new();
    search.run(fd, key, |it| {
        if it.objectid == ORPHAN_OBJECTID && it.kind == ORPHAN_ITEM {
            out.push(it.offset);
        }
    })?;
    Ok(out)
}

/// Every living subvolume of the filesystem `fd` is on, from the root
/// tree. A deleted one is left out from the moment it is deleted, however
/// long the kernel takes to drop it, so that what is listed does not
/// depend on how far its cleaner has come.
pub fn subvolumes(fd: &impl AsFd) -> Result<Vec<RootInfo>, BtrfsError> {
    // One search buffer (64 KiB) for both searches.
    let mut search = TreeSearch::default();
    let deleted = deleted_roots(&mut search, fd)?;
    let mut out = Vec::new();
    search.run(fd, root_items(5), |it| {
        if it.kind != item::ROOT_ITEM || deleted.contains(&it.objectid) {
            return;
        }
        if let Some(r) = RootInfo::parse(it.objectid, it.data) {
            out.push(r);
        }
    })?;
    Ok(out)
}

/// What the root tree records of the subvolume at `path`.
pub fn root_info(path: &Path) -> Result<RootInfo, BtrfsError> {
    let fd = open_dir(path)?;
    let id = subvolume_id_of(&fd, path)?;
    let key = SearchKey {
        min_objectid: id,
        max_objectid: id,
        ..root_items(id)
    };
    let mut found = None;
    TreeSearch::default().run(&fd, key, |it| {
        if it.objectid == id {
            found = found.take().or_else(|| RootInfo::parse(id, it.data));
        }
    })?;
    found.ok_or_else(|| {
        io_err(
            "read the root item of",
            path,
            io::Error::from_raw_os_error(libc::ENOENT),
        )
    })
}

/// The IDs of every tree root the root tree holds above 255: every
/// subvolume, including deleted ones the kernel has not finished dropping.
fn all_roots(fd: &impl AsFd) -> Result<Vec<u64>, BtrfsError> {
    let mut out = Vec::new();
    TreeSearch::default().run(fd, root_items(256), |it| out.push(it.objectid))?;
    out.dedup();
    Ok(out)
}

/// The ID of the subvolume that `path` belongs to.
pub fn subvolume_id(path: &Path) -> Result<u64, BtrfsError> {
    subvolume_id_of(&open_dir(path)?, path)
}

/// The ID of the subvolume an open directory belongs to (`path` names it
/// in errors).
pub fn subvolume_id_of(dir: &impl AsFd, path: &Path) -> Result<u64, BtrfsError> {
    let mut args = Box::new(InoLookupArgs {
        treeid: 0,
        objectid: SUBVOL_ROOT_INO,
        name: [0; 4080],
    });
    ioctl(dir, IOC_INO_LOOKUP, &mut *args).map_err(|e| io_err("look up subvolume of", path, e))?;
    Ok(args.treeid)
}

/// Removes `path` whatever it is: a subvolume (with any subvolumes nested
/// in it), a directory tree, or a file. A missing path is not an error.
///
/// Only the parent of `path` is reached by name; everything below it is
/// reached through open directory handles without following symlinks, so a
/// process that rewrites the tree while it is being removed cannot steer
/// the removal anywhere else. The walk is iterative, keeps a few levels
/// open ([`crate::tree`]), and reads each directory as a stream (resuming
/// at the entry it left), so neither the depth of the tree nor the size of
/// a directory costs more than a few dozen bytes per level.
pub fn remove_tree(path: &Path) -> Result<(), BtrfsError> {
    let (parent, name) = split(path)?;
    let dir = match open_dir(parent) {
        Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(()),
        other => other?,
    };
    remove_at(&dir, name, path)
}

/// How many times a directory is read again when it is still not empty
/// after a whole pass (entries added meanwhile).
const RESCANS: u32 = 3;

/// Removes `name` in `dir` as [`remove_tree`] does, `shown` naming it in
/// errors: reached only through `dir`, never by a path from the root.
pub fn remove_at(dir: &OwnedFd, name: &OsStr, shown: &Path) -> Result<(), BtrfsError> {
    let st = match fs::statat(dir, name, fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(io_err("stat", shown, e.into())),
    };
    if !fs::FileType::from_raw_mode(st.st_mode).is_dir() {
        return fs::unlinkat(dir, name, fs::AtFlags::empty())
            .map_err(|e| io_err("remove", shown, e.into()));
    }
    let shown_b = shown.as_os_str().as_bytes();
    let open = || {
        let d = tree::Dir::from_fd(open_child(dir, name, shown)?, shown_b)?;
        if d.id() != tree::Ident::of(&st) {
            return Err(tree::TreeError::changed(shown_b).into());
        }
        Ok::<_, BtrfsError>(d)
    };
    if st.st_ino == SUBVOL_ROOT_INO {
        return match delete_subvolume_at(dir, name, shown) {
            Err(e) if e.errno() == Some(libc::ENOTEMPTY) => {
                clear(open()?, Clear::Subvolumes, shown)?;
                delete_subvolume_at(dir, name, shown)
            }
            other => other,
        };
    }
    let mut scans = 0;
    loop {
        clear(open()?, Clear::All, shown)?;
        match fs::unlinkat(dir, name, fs::AtFlags::REMOVEDIR) {
            Err(rustix::io::Errno::NOTEMPTY) if scans < RESCANS => scans += 1,
            Err(rustix::io::Errno::NOENT) => return Ok(()),
            other => return other.map_err(|e| io_err("remove", shown, e.into())),
        }
    }
}

fn open_child(dir: &OwnedFd, name: &OsStr, shown: &Path) -> Result<OwnedFd, BtrfsError> {
    fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err("open", shown, e.into()))
}

/// What [`clear`] removes below a directory.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Clear {
    /// Everything.
    All,
    /// Only the subvolumes nested in it (deleting the subvolume that holds
    /// them then takes the rest without a walk). Only directories are
    /// looked at, never files.
    Subvolumes,
}

/// What is done with a level of [`clear`] once it has been read through.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Then {
    /// The root: its caller decides.
    Keep,
    /// A plain directory: `rmdir` it.
    Rmdir,
    /// A subvolume whose nested subvolumes are gone: delete it.
    Delete,
    /// A plain directory that holds subvolumes only in passing: leave it.
    Leave,
}

struct Level {
    dir: tree::Dir,
    /// Where to go on reading (the cookie after the last entry handled).
    at: i64,
    /// Length of the walk's path above this level.
    parent_len: usize,
    mode: Clear,
    then: Then,
    scans: u32,
}

/// Removes what `mode` says below the directory `root` (not `root`
/// itself), iteratively.
fn clear(root: tree::Dir, mode: Clear, shown: &Path) -> Result<(), BtrfsError> {
    let mut path: Vec<u8> = shown.as_os_str().as_bytes().to_vec();
    let mut stack = vec![Level {
        dir: root,
        at: 0,
        parent_len: path.len(),
        mode,
        then: Then::Keep,
        scans: 0,
    }];
    while let Some(top) = stack.last_mut() {
        match scan(top, &mut path)? {
            Some(child) => {
                stack.push(child);
                // The level that fell out of the window is closed; the one
                // below it reopens it as `..` on the way back.
                let n = stack.len();
                if n > tree::WINDOW + 1 {
                    stack[n - tree::WINDOW - 1].dir.close();
                }
            }
            None => {
                let done = stack.pop().expect("stack is not empty");
                let Some(up) = stack.last_mut() else {
                    break;
                };
                let name = path[done.parent_len + 1..].to_vec();
                path.truncate(done.parent_len);
                if !up.dir.is_open() {
                    up.dir.reopen_from(&done.dir, &path)?;
                }
                let name = OsStr::from_bytes(&name);
                let child_shown = || Path::new(OsStr::from_bytes(&path)).join(name);
                let parent = up.dir.fd();
                let Level {
                    dir,
                    parent_len,
                    mode,
                    then,
                    scans,
                    ..
                } = done;
                match then {
                    Then::Rmdir => match fs::unlinkat(parent, name, fs::AtFlags::REMOVEDIR) {
                        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                        Err(rustix::io::Errno::NOTEMPTY) if scans < RESCANS => {
                            // Entries came in meanwhile: read it again.
                            path.push(b'/');
                            path.extend_from_slice(name.as_bytes());
                            stack.push(Level {
                                dir,
                                at: 0,
                                parent_len,
                                mode,
                                then,
                                scans: scans + 1,
                            });
                        }
                        Err(e) => return Err(io_err("remove", &child_shown(), e.into())),
                    },
                    Then::Delete => {
                        // Nothing of the walk stays open inside it.
                        drop(dir);
                        delete_subvolume_at(parent, name, &child_shown())?
                    }
                    Then::Keep | Then::Leave => {}
                }
            }
        }
    }
    Ok(())
}

/// Reads `level` on from where it was left, removing what its mode says,
/// until the end (`None`) or a directory to go into (its level; its name
/// is pushed on `path`).
fn scan(level: &mut Level, path: &mut Vec<u8>) -> Result<Option<Level>, BtrfsError> {
    let errp = |path: &[u8], name: &[u8]| {
        let mut p = Path::new(OsStr::from_bytes(path)).to_path_buf();
        p.push(OsStr::from_bytes(name));
        p
    };
    let fd = level.dir.fd();
    let mut d = fs::Dir::read_from(fd).map_err(|e| io_err("read", &errp(path, b""), e.into()))?;
    if level.at != 0 {
        d.seek(level.at)
            .map_err(|e| io_err("read", &errp(path, b""), e.into()))?;
    }
    while let Some(e) = d.read() {
        let e = e.map_err(|e| io_err("read", &errp(path, b""), e.into()))?;
        level.at = e.offset();
        let name = OsStr::from_bytes(e.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        let ty = e.file_type();
        let maybe_dir = matches!(ty, fs::FileType::Directory | fs::FileType::Unknown);
        if !maybe_dir {
            if level.mode == Clear::Subvolumes {
                continue;
            }
            match fs::unlinkat(fd, name, fs::AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => continue,
                // A directory now: handled below.
                Err(rustix::io::Errno::ISDIR) => {}
                Err(e) => return Err(io_err("remove", &errp(path, name.as_bytes()), e.into())),
            }
        }
        let st = match fs::statat(fd, name, fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(io_err("stat", &errp(path, name.as_bytes()), e.into())),
        };
        if !fs::FileType::from_raw_mode(st.st_mode).is_dir() {
            if level.mode == Clear::All {
                match fs::unlinkat(fd, name, fs::AtFlags::empty()) {
                    Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                    Err(e) => return Err(io_err("remove", &errp(path, name.as_bytes()), e.into())),
                }
            }
            continue;
        }
        let (mode, then) = if st.st_ino == SUBVOL_ROOT_INO {
            match delete_subvolume_at(fd, name, &errp(path, name.as_bytes())) {
                Ok(()) => continue,
                Err(e) if e.errno() == Some(libc::ENOENT) => continue,
                Err(e) if e.errno() == Some(libc::ENOTEMPTY) => (Clear::Subvolumes, Then::Delete),
                Err(e) => return Err(e),
            }
        } else if level.mode == Clear::All {
            (Clear::All, Then::Rmdir)
        } else {
            (Clear::Subvolumes, Then::Leave)
        };
        let parent_len = path.len();
        path.push(b'/');
        path.extend_from_slice(name.as_bytes());
        let dir = level.dir.child(name, tree::Ident::of(&st), path)?;
        return Ok(Some(Level {
            dir,
            at: 0,
            parent_len,
            mode,
            then,
            scans: 0,
        }));
    }
    Ok(None)
}

/// `fsync` of a directory, so that its entries (renames, removals) are on
/// disk.
pub fn sync_dir(dir: &Path) -> Result<(), BtrfsError> {
    let fd = open_dir(dir)?;
    fs::fsync(&fd).map_err(|e| io_err("sync", dir, e.into()))
}

/// Commits the filesystem's running transaction and waits until it is on
/// disk (`BTRFS_IOC_START_SYNC`, then `BTRFS_IOC_WAIT_SYNC` on the
/// transaction it started): every change to the namespace made before the
/// call — a rename, an exchange, a new directory — survives a power cut
/// once it returns. Unlike `syncfs` it does not write back file data that is
/// merely dirty (an agent's gigabyte of unsynced writes costs it nothing),
/// and callers that arrive together share one commit.
pub fn commit(path: &Path) -> Result<(), BtrfsError> {
    let fd = open_dir(path)?;
    let mut transid = start_sync(&fd, path)?;
    ioctl(&fd, IOC_WAIT_SYNC, &mut transid).map_err(|e| io_err("wait for commit of", path, e))
}

/// `BTRFS_IOC_START_SYNC` on `fd`: the transaction it started.
fn start_sync(fd: &OwnedFd, path: &Path) -> Result<u64, BtrfsError> {
    let mut transid: u64 = 0;
    ioctl(fd, IOC_START_SYNC, &mut transid).map_err(|e| io_err("commit", path, e))?;
    Ok(transid)
}

/// Starts a commit of the filesystem's running transaction and returns at
/// once (`BTRFS_IOC_START_SYNC`). Btrfs drops deleted subvolumes in the
/// background only after a commit of its own transaction thread (every 30
/// seconds by default); until then each one left slows every new snapshot
/// of a tree it shared blocks with. A commit started here wakes that
/// thread, so subvolumes deleted just before are dropped soon after.
pub fn start_commit(path: &Path) -> Result<(), BtrfsError> {
    start_sync(&open_dir(path)?, path).map(drop)
}

/// Whether the subvolume whose root directory `dir` is open on is
/// read-only (`BTRFS_IOC_SUBVOL_GETFLAGS`).
pub fn is_read_only(dir: &impl AsFd, path: &Path) -> Result<bool, BtrfsError> {
    let mut flags: u64 = 0;
    ioctl(dir, IOC_SUBVOL_GETFLAGS, &mut flags)
        .map_err(|e| io_err("read the flags of", path, e))?;
    Ok(flags & BTRFS_SUBVOL_RDONLY != 0)
}

/// Makes the subvolume at `path` read-only or writable
/// (`BTRFS_IOC_SUBVOL_SETFLAGS`; a received UUID stays).
pub fn set_read_only(path: &Path, read_only: bool) -> Result<(), BtrfsError> {
    let fd = open_dir(path)?;
    let mut flags: u64 = if read_only { BTRFS_SUBVOL_RDONLY } else { 0 };
    ioctl(&fd, IOC_SUBVOL_SETFLAGS, &mut flags).map_err(|e| io_err("set the flags of", path, e))
}

/// `renameat2(a, b, RENAME_EXCHANGE)`: swaps two paths atomically.
pub fn exchange(a: &Path, b: &Path) -> Result<(), BtrfsError> {
    fs::renameat_with(fs::CWD, a, fs::CWD, b, fs::RenameFlags::EXCHANGE)
        .map_err(|e| io_err("exchange", a, e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_structs_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<VolArgs>(), 4096);
        assert_eq!(std::mem::size_of::<VolArgsV2>(), 4096);
        assert_eq!(std::mem::size_of::<InoLookupArgs>(), 4096);
        // Values from linux/btrfs.h as compiled by the C headers.
        assert_eq!(IOC_SUBVOL_CREATE, 0x5000_940E);
        assert_eq!(IOC_SNAP_DESTROY, 0x5000_940F);
        assert_eq!(IOC_INO_LOOKUP, 0xD000_9412);
        assert_eq!(IOC_SNAP_CREATE_V2, 0x5000_9417);
        assert_eq!(IOC_SUBVOL_GETFLAGS, 0x8008_9419);
        assert_eq!(std::mem::size_of::<SearchKey>(), 104);
        assert_eq!(IOC_TREE_SEARCH_V2, 0xC070_9411);
    }

    #[test]
    fn names_must_be_one_component() {
        let mut buf = [0u8; 16];
        assert!(copy_name(&mut buf, OsStr::new("a/b")).is_err());
        assert!(copy_name(&mut buf, OsStr::new("")).is_err());
        assert!(copy_name(&mut buf, OsStr::new(&"x".repeat(16))).is_err());
        assert!(copy_name(&mut buf, OsStr::new("ok")).is_ok());
    }

    #[test]
    fn non_btrfs_is_named() {
        let e = check_btrfs(Path::new("/proc")).unwrap_err().to_string();
        assert!(e.contains("/proc") && e.contains("not on a Btrfs"), "{e}");
    }
}
