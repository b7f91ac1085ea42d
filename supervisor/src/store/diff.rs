//! `checkpoint.diff`: what changed between two trees of a session.
//!
//! Both trees are walked side by side through open directory handles
//! (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`), so a symlink is compared as a
//! link and never followed out of the snapshot. A snapshot keeps inode
//! numbers and times, so a file whose inode, size, mode, mtime and ctime
//! are the same on both sides is unchanged and its contents are not read;
//! only files whose metadata differs but whose size and mode do not are
//! read, to tell a real change from a touch.

use super::{Result, Store, StoreError};
use allox_protocol::{validate_id, Change, ChangeKind, CheckpointDiff, DiffListing};
use rustix::fd::OwnedFd;
use rustix::fs::{self, AtFlags, FileType, Mode, OFlags, Stat};
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

fn names(dir: &OwnedFd, shown: &Path) -> Result<Vec<OsString>> {
    let mut d = fs::Dir::read_from(dir).map_err(|e| io("read", shown, e))?;
    let mut out = Vec::new();
    while let Some(e) = d.read() {
        let e = e.map_err(|e| io("read", shown, e))?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(OsStr::from_bytes(n).to_os_string());
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
    for n in names(dir, shown)? {
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

fn walk(a: &OwnedFd, b: &OwnedFd, path: &str, shown: &Path, acc: &mut Acc) -> Result<()> {
    let (na, nb) = (names(a, shown)?, names(b, shown)?);
    let (mut i, mut j) = (0, 0);
    while i < na.len() || j < nb.len() {
        let order = match (na.get(i), nb.get(j)) {
            (Some(x), Some(y)) => x.cmp(y),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Less => {
                let n = &na[i];
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
                let n = &nb[j];
                let st = stat_at(b, n, shown)?;
                acc.push(rel(path, n), ChangeKind::Added, None, size(&st));
                if kind_of(&st) == FileType::Directory {
                    let sub = open_dir_at(b, n, shown)?;
                    one_side(&sub, &rel(path, n), &shown.join(n), ChangeKind::Added, acc)?;
                }
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                let n = &na[i];
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
                    walk(&da, &db, &p, &sub_shown, acc)?;
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

/// Diffs two directory trees.
pub fn diff_trees(from: &Path, to: &Path) -> Result<(Vec<Change>, bool, [u64; 4])> {
    let open = |p: &Path| {
        fs::open(
            p,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io("open", p, e))
    };
    let (a, b) = (open(from)?, open(to)?);
    let mut acc = Acc::default();
    walk(&a, &b, "", Path::new(""), &mut acc)?;
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
        let (changes, truncated, c) = diff_trees(&from, &to)?;
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
