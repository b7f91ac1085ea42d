//! `checkpoint.diff`: what changed between two trees of a session.
//!
//! Both trees are walked side by side through open directory handles
//! (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`), so a symlink is compared as a
//! link and never followed out of the snapshot. A snapshot keeps inode
//! numbers and times, so a file whose inode, size, mode, mtime and ctime
//! are the same on both sides is unchanged and its contents are not read;
//! only files whose metadata differs but whose size and mode do not are
//! read, to tell a real change from a touch.
//!
//! Between two subvolumes of the store the walk is pruned with what Btrfs
//! itself records ([`Hints`]): a snapshot shares every tree block with its
//! source until one side writes, and a written block carries the number of
//! the transaction that wrote it. So only items in blocks written since the
//! two trees last were one can differ; their inodes, and the directories
//! above them, are all the walk has to look at. An entry with the same
//! inode number on both sides and no such item is the same file, and is
//! passed over without a `stat`.

use super::{Result, Store, StoreError};
use crate::btrfs::{self, item, RootInfo, SearchKey, SUBVOL_ROOT_INO};
use allox_protocol::{validate_id, Change, ChangeKind, CheckpointDiff, DiffListing};
use rustix::fd::OwnedFd;
use rustix::fs::{self, AtFlags, FileType, Mode, OFlags, Stat};
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Most changes listed in one answer (the counts cover all of them).
pub const MAX_CHANGES: usize = 10_000;

#[derive(Default)]
struct Acc {
    changes: Vec<Change>,
    counts: [u64; 4],
}

impl Acc {
    fn push(&mut self, path: String, kind: ChangeKind, before: Option<u64>, after: Option<u64>) {
        self.counts[kind as usize] += 1;
        if self.changes.len() < MAX_CHANGES {
            self.changes.push(Change {
                path,
                kind,
                size_before: before,
                size_after: after,
            });
        }
    }
}

fn io(op: &'static str, p: &Path, e: rustix::io::Errno) -> StoreError {
    StoreError::io(op, p, e.into())
}

fn open_dir_at(dir: &OwnedFd, name: &OsStr, shown: &Path) -> Result<OwnedFd> {
    fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io("open", shown, e))
}

/// Where the walk must look, from the Btrfs trees of the two sides.
#[derive(Debug, Default)]
pub struct Hints {
    /// Inodes with an item in a tree block written since the trees were one.
    changed: HashSet<u64>,
    /// Directories above those inodes, on either side.
    above: HashSet<u64>,
}

impl Hints {
    /// Whether an entry with inode `ino` on both sides may differ.
    fn may_differ(&self, ino: u64) -> bool {
        self.changed.contains(&ino) || self.above.contains(&ino)
    }

    /// How many inodes the hints single out.
    pub fn changed_inodes(&self) -> usize {
        self.changed.len()
    }

    /// [`Hints::read`] from two paths.
    pub fn read_paths(from: &Path, to: &Path) -> Result<Option<Hints>> {
        Hints::read(&open_root(from)?, &open_root(to)?, from, to)
    }

    /// Reads the hints for two subvolumes of one filesystem, or `None` when
    /// their common history cannot be told (the caller then walks it all).
    pub fn read(
        from: &OwnedFd,
        to: &OwnedFd,
        from_path: &Path,
        to_path: &Path,
    ) -> Result<Option<Hints>> {
        let bt = |e: btrfs::BtrfsError| StoreError::from(e);
        for (fd, p) in [(from, from_path), (to, to_path)] {
            let st = fs::fstat(fd).map_err(|e| io("stat", p, e))?;
            if st.st_ino != SUBVOL_ROOT_INO {
                return Ok(None);
            }
        }
        let (a, b) = (
            btrfs::subvolume_id_of(from, from_path).map_err(bt)?,
            btrfs::subvolume_id_of(to, to_path).map_err(bt)?,
        );
        let roots = btrfs::subvolumes(from).map_err(bt)?;
        let Some(since) = diverged(&roots, a, b) else {
            return Ok(None);
        };
        let mut h = Hints::default();
        if a == b {
            return Ok(Some(h));
        }
        let mut search = btrfs::TreeSearch::default();
        for tree in [a, b] {
            search
                .run(from, SearchKey::all(tree, since.saturating_add(1)), |it| {
                    h.changed.insert(it.objectid);
                })
                .map_err(bt)?;
        }
        for tree in [a, b] {
            let mut todo: Vec<u64> = h.changed.iter().copied().collect();
            let mut seen: HashSet<u64> = HashSet::new();
            while let Some(ino) = todo.pop() {
                if ino == SUBVOL_ROOT_INO || !seen.insert(ino) {
                    continue;
                }
                let mut parents = Vec::new();
                let key = SearchKey::object(tree, ino, item::INODE_REF..=item::INODE_EXTREF);
                search
                    .run(from, key, |it| {
                        if it.kind == item::INODE_REF {
                            parents.push(it.offset);
                        } else if it.data.len() >= 8 {
                            parents.push(u64::from_le_bytes(it.data[..8].try_into().unwrap()));
                        }
                    })
                    .map_err(bt)?;
                for p in parents {
                    h.above.insert(p);
                    todo.push(p);
                }
            }
        }
        Ok(Some(h))
    }
}

/// The transaction after which two subvolumes can differ: both descend, by
/// snapshots, from one subvolume, and each took its copy of it in some
/// transaction. A snapshot is made while its transaction commits, so blocks
/// written in that transaction or before are shared with the source; every
/// later write to either lands in a block of a later transaction.
/// `None` when the two lines of descent do not meet in what the root tree
/// still records.
fn diverged(roots: &[RootInfo], a: u64, b: u64) -> Option<u64> {
    let by_id: HashMap<u64, &RootInfo> = roots.iter().map(|r| (r.id, r)).collect();
    let by_uuid: HashMap<[u8; 16], &RootInfo> = roots.iter().map(|r| (r.uuid, r)).collect();
    // The line of descent: (uuid, the transaction it was copied from its
    // parent at), from the subvolume up.
    let line = |id: u64| -> Option<Vec<([u8; 16], u64)>> {
        let mut out = Vec::new();
        let mut r = *by_id.get(&id)?;
        loop {
            out.push((r.uuid, r.otransid));
            if r.parent_uuid == [0; 16] || out.len() > 4096 {
                return Some(out);
            }
            match by_uuid.get(&r.parent_uuid) {
                Some(p) => r = p,
                None => {
                    // A deleted parent: known by uuid only.
                    out.push((r.parent_uuid, 0));
                    return Some(out);
                }
            }
        }
    };
    let (la, lb) = (line(a)?, line(b)?);
    for (j, (u, _)) in lb.iter().enumerate() {
        if let Some(i) = la.iter().position(|(v, _)| v == u) {
            let copy = |l: &[([u8; 16], u64)], k: usize| (k > 0).then(|| l[k - 1].1);
            return match (copy(&la, i), copy(&lb, j)) {
                (None, None) => Some(u64::MAX),
                (Some(x), None) | (None, Some(x)) => Some(x),
                (Some(x), Some(y)) => Some(x.min(y)),
            };
        }
    }
    None
}

fn names(dir: &OwnedFd, shown: &Path) -> Result<Vec<(OsString, u64)>> {
    let mut d = fs::Dir::read_from(dir).map_err(|e| io("read", shown, e))?;
    let mut out = Vec::new();
    while let Some(e) = d.read() {
        let e = e.map_err(|e| io("read", shown, e))?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push((OsStr::from_bytes(n).to_os_string(), e.ino()));
        }
    }
    out.sort();
    Ok(out)
}

fn stat_at(dir: &OwnedFd, name: &OsStr, shown: &Path) -> Result<Stat> {
    fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| io("stat", shown, e))
}

fn kind_of(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

fn rel(parent: &str, name: &OsStr) -> String {
    let n = name.to_string_lossy();
    if parent.is_empty() {
        n.into_owned()
    } else {
        format!("{parent}/{n}")
    }
}

fn size(st: &Stat) -> Option<u64> {
    (kind_of(st) != FileType::Directory).then_some(st.st_size as u64)
}

/// Same contents? Read only when metadata alone cannot tell.
fn same_contents(a: &OwnedFd, b: &OwnedFd, name: &OsStr, shown: &Path) -> Result<bool> {
    let open = |d: &OwnedFd| {
        fs::openat(
            d,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map(std::fs::File::from)
        .map_err(|e| io("open", shown, e))
    };
    let (mut fa, mut fb) = (open(a)?, open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let na = fa
            .read(&mut ba)
            .map_err(|e| StoreError::io("read", shown, e))?;
        let mut nb = 0;
        while nb < na {
            let k = fb
                .read(&mut bb[nb..na])
                .map_err(|e| StoreError::io("read", shown, e))?;
            if k == 0 {
                break;
            }
            nb += k;
        }
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }
}

fn link_target(dir: &OwnedFd, name: &OsStr, shown: &Path) -> Result<Vec<u8>> {
    fs::readlinkat(dir, name, Vec::new())
        .map(|c| c.into_bytes())
        .map_err(|e| io("readlink", shown, e))
}

/// Reports everything below a directory that exists on one side only.
fn one_side(
    dir: &OwnedFd,
    path: &str,
    shown: &Path,
    kind: ChangeKind,
    acc: &mut Acc,
) -> Result<()> {
    for (n, _) in names(dir, shown)? {
        let p = rel(path, &n);
        let st = stat_at(dir, &n, shown)?;
        let sz = size(&st);
        match kind {
            ChangeKind::Added => acc.push(p.clone(), kind, None, sz),
            _ => acc.push(p.clone(), kind, sz, None),
        }
        if kind_of(&st) == FileType::Directory {
            let sub = open_dir_at(dir, &n, shown)?;
            one_side(&sub, &p, &shown.join(&n), kind, acc)?;
        }
    }
    Ok(())
}

fn walk(
    a: &OwnedFd,
    b: &OwnedFd,
    path: &str,
    shown: &Path,
    hints: Option<&Hints>,
    acc: &mut Acc,
) -> Result<()> {
    let (na, nb) = (names(a, shown)?, names(b, shown)?);
    let (mut i, mut j) = (0, 0);
    while i < na.len() || j < nb.len() {
        let order = match (na.get(i), nb.get(j)) {
            (Some(x), Some(y)) => x.0.cmp(&y.0),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Less => {
                let n = &na[i].0;
                let st = stat_at(a, n, shown)?;
                acc.push(rel(path, n), ChangeKind::Deleted, size(&st), None);
                if kind_of(&st) == FileType::Directory {
                    let sub = open_dir_at(a, n, shown)?;
                    one_side(
                        &sub,
                        &rel(path, n),
                        &shown.join(n),
                        ChangeKind::Deleted,
                        acc,
                    )?;
                }
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                let n = &nb[j].0;
                let st = stat_at(b, n, shown)?;
                acc.push(rel(path, n), ChangeKind::Added, None, size(&st));
                if kind_of(&st) == FileType::Directory {
                    let sub = open_dir_at(b, n, shown)?;
                    one_side(&sub, &rel(path, n), &shown.join(n), ChangeKind::Added, acc)?;
                }
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                let (n, ino) = (&na[i].0, na[i].1);
                // A nested subvolume is another tree: the hints say nothing
                // of what is inside it.
                let nested = ino == SUBVOL_ROOT_INO || nb[j].1 == SUBVOL_ROOT_INO;
                if ino == nb[j].1 && !nested && hints.is_some_and(|h| !h.may_differ(ino)) {
                    i += 1;
                    j += 1;
                    continue;
                }
                let inner = if nested { None } else { hints };
                let p = rel(path, n);
                let sub_shown = shown.join(n);
                let (sa, sb) = (stat_at(a, n, shown)?, stat_at(b, n, shown)?);
                let (ka, kb) = (kind_of(&sa), kind_of(&sb));
                if ka != kb {
                    acc.push(p.clone(), ChangeKind::TypeChanged, size(&sa), size(&sb));
                    if ka == FileType::Directory {
                        let sub = open_dir_at(a, n, &sub_shown)?;
                        one_side(&sub, &p, &sub_shown, ChangeKind::Deleted, acc)?;
                    }
                    if kb == FileType::Directory {
                        let sub = open_dir_at(b, n, &sub_shown)?;
                        one_side(&sub, &p, &sub_shown, ChangeKind::Added, acc)?;
                    }
                } else if ka == FileType::Directory {
                    if sa.st_mode != sb.st_mode {
                        acc.push(p.clone(), ChangeKind::Modified, None, None);
                    }
                    let (da, db) = (
                        open_dir_at(a, n, &sub_shown)?,
                        open_dir_at(b, n, &sub_shown)?,
                    );
                    walk(&da, &db, &p, &sub_shown, inner, acc)?;
                } else {
                    let same_meta = sa.st_ino == sb.st_ino
                        && sa.st_size == sb.st_size
                        && sa.st_mode == sb.st_mode
                        && sa.st_mtime == sb.st_mtime
                        && sa.st_mtime_nsec == sb.st_mtime_nsec
                        && sa.st_ctime == sb.st_ctime
                        && sa.st_ctime_nsec == sb.st_ctime_nsec;
                    let changed = if same_meta {
                        false
                    } else if sa.st_mode != sb.st_mode || sa.st_size != sb.st_size {
                        true
                    } else if ka == FileType::Symlink {
                        link_target(a, n, &sub_shown)? != link_target(b, n, &sub_shown)?
                    } else if ka == FileType::RegularFile {
                        !same_contents(a, b, n, &sub_shown)?
                    } else {
                        // Sockets, FIFOs, devices: only metadata to compare.
                        sa.st_rdev != sb.st_rdev
                    };
                    if changed {
                        acc.push(p, ChangeKind::Modified, size(&sa), size(&sb));
                    }
                }
                i += 1;
                j += 1;
            }
        }
    }
    Ok(())
}

fn open_root(p: &Path) -> Result<OwnedFd> {
    fs::open(
        p,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io("open", p, e))
}

/// How [`diff_trees`] finds the changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiffMethod {
    /// Compare every entry of both trees.
    Walk,
    /// Between two subvolumes of one Btrfs filesystem, look only where the
    /// filesystem says something was written (falls back to the walk when
    /// it cannot tell). Needs `CAP_SYS_ADMIN`.
    Btrfs,
}

/// Diffs two directory trees.
pub fn diff_trees(
    from: &Path,
    to: &Path,
    method: DiffMethod,
) -> Result<(Vec<Change>, bool, [u64; 4])> {
    let (a, b) = (open_root(from)?, open_root(to)?);
    let hints = match method {
        DiffMethod::Walk => None,
        DiffMethod::Btrfs => Hints::read(&a, &b, from, to)?,
    };
    let mut acc = Acc::default();
    walk(&a, &b, "", Path::new(""), hints.as_ref(), &mut acc)?;
    let total: u64 = acc.counts.iter().sum();
    let truncated = total as usize > acc.changes.len();
    acc.changes.sort_by(|x, y| x.path.cmp(&y.path));
    Ok((acc.changes, truncated, acc.counts))
}

impl Store {
    fn tree_of(&self, a: &str, s: &str, name: &str) -> Result<PathBuf> {
        if name == "current" {
            return Ok(self.layout.current(a, s));
        }
        validate_id("checkpoint_id", name)?;
        self.index
            .checkpoint(a, s, name)?
            .ok_or_else(|| StoreError::NotFound(format!("checkpoint {a}/{s}/{name}")))?;
        Ok(self.layout.checkpoint(a, s, name))
    }

    pub fn checkpoint_diff(&self, p: &CheckpointDiff) -> Result<DiffListing> {
        let (a, s) = (p.agent_id.as_str(), p.session_id.as_str());
        self.need_session(a, s)?;
        let from = self.tree_of(a, s, &p.from)?;
        let to = self.tree_of(a, s, &p.to)?;
        let (changes, truncated, c) = diff_trees(&from, &to, DiffMethod::Btrfs)?;
        Ok(DiffListing {
            from: p.from.clone(),
            to: p.to.clone(),
            changes,
            truncated,
            added: c[ChangeKind::Added as usize],
            modified: c[ChangeKind::Modified as usize],
            deleted: c[ChangeKind::Deleted as usize],
            type_changed: c[ChangeKind::TypeChanged as usize],
        })
    }
}
