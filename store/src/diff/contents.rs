//! Whether two regular files of the same size hold the same bytes, read
//! within a budget.
//!
//! Both files are opened with [`tree::open_regular`] (never blocking,
//! never following a symlink, the open file checked against what the walk
//! saw). Holes are skipped with `SEEK_DATA` / `SEEK_HOLE`: where both files
//! have a hole nothing is read, where one has data and the other a hole the
//! data must be zeros, and only where both have data are the bytes
//! compared. A 1 TiB sparse file so costs what its data costs.

use crate::tree;
use rustix::fd::OwnedFd;
use rustix::fs::{self, Mode, OFlags, SeekFrom, Stat};
use rustix::io::Errno;
use std::ffi::OsStr;
use std::io;

const CHUNK: usize = 64 * 1024;
/// What a step over a hole or an extent costs at least, against the budget.
const STEP_COST: u64 = 4096;

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Same,
    Differ,
    /// The budget ran out before the end: not known.
    Unread,
}

/// Whether the byte at `pos` is in data or in a hole, and where that run
/// ends (at most `size`).
fn run_at(f: &OwnedFd, pos: u64, size: u64) -> io::Result<(bool, u64)> {
    match fs::seek(f, SeekFrom::Data(pos)) {
        Ok(d) if d <= pos => {
            let end = match fs::seek(f, SeekFrom::Hole(pos)) {
                Ok(h) if h > pos => h.min(size),
                Ok(_) => size,
                Err(e) => return Err(e.into()),
            };
            Ok((true, end))
        }
        Ok(d) => Ok((false, d.min(size))),
        // No data from here to the end.
        Err(Errno::NXIO) => Ok((false, size)),
        // A filesystem without the two: all data.
        Err(Errno::INVAL | Errno::OPNOTSUPP) => Ok((true, size)),
        Err(e) => Err(e.into()),
    }
}

/// Reads exactly `buf.len()` bytes at `pos`; `false` if the file ended
/// first (it shrank while being compared).
fn read_at(f: &OwnedFd, buf: &mut [u8], mut pos: u64) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match rustix::io::pread(f, &mut buf[got..], pos) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                got += n;
                pos += n as u64;
            }
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// Compares the file `name` of two directories, which the walk saw as
/// `sa` and `sb` with the same size. `budget` is what may still be read;
/// what is read is taken from it. With `xattrs`, files of the same bytes
/// are compared by their extended attributes too (capabilities, ACLs,
/// labels, the user's own): a change of them alone moves only the ctime.
pub fn compare(
    a: &OwnedFd,
    b: &OwnedFd,
    name: &OsStr,
    (sa, sb): (&Stat, &Stat),
    xattrs_too: bool,
    budget: &mut u64,
) -> io::Result<Verdict> {
    let (Some(fa), Some(fb)) = (
        tree::open_regular(a, name, sa)?,
        tree::open_regular(b, name, sb)?,
    ) else {
        // Not the file the walk saw: it changed while it was compared.
        return Ok(Verdict::Differ);
    };
    let size = sa.st_size as u64;
    let (mut ba, mut bb) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let mut pos = 0u64;
    while pos < size {
        let ((da, ea), (db, eb)) = (run_at(&fa, pos, size)?, run_at(&fb, pos, size)?);
        let end = ea.min(eb).max(pos + 1).min(size);
        *budget = budget.saturating_sub(STEP_COST);
        if da || db {
            let mut at = pos;
            while at < end {
                let n = ((end - at) as usize).min(CHUNK);
                let cost = if da && db { 2 * n as u64 } else { n as u64 };
                if *budget < cost {
                    return Ok(Verdict::Unread);
                }
                *budget -= cost;
                let same = match (da, db) {
                    (true, true) => {
                        read_at(&fa, &mut ba[..n], at)?
                            && read_at(&fb, &mut bb[..n], at)?
                            && ba[..n] == bb[..n]
                    }
                    (true, false) => read_at(&fa, &mut ba[..n], at)? && is_zero(&ba[..n]),
                    _ => read_at(&fb, &mut bb[..n], at)? && is_zero(&bb[..n]),
                };
                if !same {
                    return Ok(Verdict::Differ);
                }
                at += n as u64;
            }
        }
        pos = end;
    }
    if !xattrs_too {
        return Ok(Verdict::Same);
    }
    Ok(match (xattrs(&fa, budget)?, xattrs(&fb, budget)?) {
        (Some(x), Some(y)) if x == y => Verdict::Same,
        (Some(_), Some(_)) => Verdict::Differ,
        _ => Verdict::Unread,
    })
}

/// Whether the directories `name` in `a` and in `b` have the same
/// extended attributes (an ACL among them); reading them is taken from
/// `budget`. A directory gone or replaced meanwhile differs.
pub fn dir_xattrs(a: &OwnedFd, b: &OwnedFd, name: &OsStr, budget: &mut u64) -> io::Result<Verdict> {
    let open = |dir: &OwnedFd| -> io::Result<Option<OwnedFd>> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match fs::openat(dir, name, flags, Mode::empty()) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::LOOP | Errno::NOENT | Errno::NOTDIR) => Ok(None),
            Err(e) => Err(e.into()),
        }
    };
    let (Some(da), Some(db)) = (open(a)?, open(b)?) else {
        return Ok(Verdict::Differ);
    };
    fd_xattrs(&da, &db, budget)
}

/// Whether the open files `a` and `b` have the same extended attributes;
/// reading them is taken from `budget`.
pub fn fd_xattrs(a: &OwnedFd, b: &OwnedFd, budget: &mut u64) -> io::Result<Verdict> {
    Ok(match (xattrs(a, budget)?, xattrs(b, budget)?) {
        (Some(x), Some(y)) if x == y => Verdict::Same,
        (Some(_), Some(_)) => Verdict::Differ,
        _ => Verdict::Unread,
    })
}

/// Extended attributes: (name, value), sorted by name.
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// The extended attributes of an open file; reading them is taken from
/// `budget` (`None` when it ran out).
fn xattrs(f: &OwnedFd, budget: &mut u64) -> io::Result<Option<Xattrs>> {
    xattrs_with(
        |names| fs::flistxattr(f, names),
        |name, value| fs::fgetxattr(f, name, value),
        budget,
    )
}

/// The extended attributes of what is at `path`, not followed through a
/// symlink (a FIFO's or a device's too, which are never opened): all of
/// them, sorted by name.
pub fn path_xattrs(path: &std::path::Path) -> io::Result<Xattrs> {
    let mut unlimited = u64::MAX;
    let all = xattrs_with(
        |names| fs::llistxattr(path, names),
        |name, value| fs::lgetxattr(path, name, value),
        &mut unlimited,
    )?;
    Ok(all.unwrap_or_default())
}

/// The extended attributes `list` names and `get` reads, sorted by name;
/// reading them is taken from `budget` (`None` when it ran out). None
/// where the file system keeps none.
fn xattrs_with(
    list: impl Fn(&mut [u8]) -> rustix::io::Result<usize>,
    get: impl Fn(&std::ffi::CStr, &mut [u8]) -> rustix::io::Result<usize>,
    budget: &mut u64,
) -> io::Result<Option<Xattrs>> {
    let mut names = vec![0u8; XATTR_MAX];
    let n = match list(&mut names) {
        Ok(n) => n,
        Err(Errno::OPNOTSUPP) => return Ok(Some(Vec::new())),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for name in names[..n].split(|&c| c == 0).filter(|n| !n.is_empty()) {
        let mut value = vec![0u8; XATTR_MAX];
        let cname = std::ffi::CString::new(name).map_err(|_| Errno::INVAL)?;
        let len = match get(cname.as_c_str(), &mut value) {
            Ok(len) => len,
            // Removed since it was listed: changed while compared.
            Err(Errno::NODATA) => continue,
            Err(e) => return Err(e.into()),
        };
        let cost = (name.len() + len) as u64;
        if *budget < cost {
            return Ok(None);
        }
        *budget -= cost;
        value.truncate(len);
        out.push((name.to_vec(), value));
    }
    out.sort();
    Ok(Some(out))
}

/// Largest list of names, and largest value, of extended attributes
/// (`XATTR_LIST_MAX`, `XATTR_SIZE_MAX`).
const XATTR_MAX: usize = 64 * 1024;

fn is_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}
