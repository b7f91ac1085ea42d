//! The hashing walk of a directory tree (the `workspace` and `shared`
//! domains' evidence): every entry below a root, keyed by its path relative
//! to the root, `/`-separated, the root itself being `.`.
//!
//! Values (the mode is the permission bits, `st_mode & 07777`, in octal):
//!
//! | entry | value |
//! |---|---|
//! | regular file | `file MODE UID:GID SIZE SHA256` (SHA-256 of the contents, hex) |
//! | directory | `dir MODE UID:GID` |
//! | symbolic link | `link -> TARGET` |
//! | character / block device | `chr MODE UID:GID MAJOR:MINOR`, `blk MODE UID:GID MAJOR:MINOR` |
//! | FIFO, socket | `fifo MODE UID:GID`, `sock MODE UID:GID` |
//! | another filesystem or subvolume | `boundary MODE UID:GID` (not entered) |
//! | a file past the bytes budget | `file MODE UID:GID SIZE -` (not read) |
//!
//! A file, a directory or a special file with extended attributes has
//! ` xattrs SHA256` after it: each `name NUL value NUL` in name order,
//! hashed — ACLs (`system.posix_acl_*`), file capabilities
//! (`security.capability`) and security labels are extended attributes
//! (` xattrs ?` where they cannot be read).
//!
//! Names and link targets are text: a backslash is written `\\`, a control
//! character or a byte that is not UTF-8 `\xNN`, so that neither a key nor
//! a value holds a tab or a newline ([`digest`] relies on it).
//!
//! Not captured, on purpose: times (a touch is not a change of contents,
//! and a read-only snapshot's times say when it was taken), inode numbers,
//! a symbolic link's owner and attributes, and hard-link identity (two
//! names of one file are two items with the same value).
//!
//! How it is walked: from a handle on the root, each directory is opened
//! again by its path relative to the root with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` and checked to be the one
//! its parent listed (same device and inode); files are opened by name in
//! their directory with `O_NOFOLLOW | O_NONBLOCK`, only when the directory
//! listing said they are regular files, and streamed through SHA-256. A
//! symbolic link is read, never followed. Directories go through a work
//! queue served by a few threads ([`TreeLimits::threads`]), each with its
//! own listing and read buffers.
//!
//! Boundaries: a directory whose device (`st_dev`) differs from the
//! root's is a mount point or, on Btrfs, a nested subvolume (each has its
//! own anonymous device); so is, on Btrfs, an empty directory with inode 2,
//! the place a nested subvolume leaves in a snapshot of its parent. The
//! walk records it as a `boundary` item and does not enter it: a session's
//! `current/` is another session's tree, walked as its own domain, and a
//! walk of a live tree must never wander into other filesystems. Inside
//! `shared/` or a workspace nothing of the store's is such a boundary, so
//! one there was made by an agent (an unprivileged user may create a Btrfs
//! subvolume) and its contents are unseen: by default that is also a gap
//! ([`TreeLimits::boundary_gap`]), so the domain cannot be `CONSISTENT`.
//!
//! The tree should be frozen (its writers stopped) or a read-only snapshot
//! when it is walked. An entry that vanishes or changes between its listing
//! and its reading is a gap, never a guess.

use super::Capture;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

/// What one walk may cost.
#[derive(Debug, Clone)]
pub struct TreeLimits {
    /// Most entries captured (the root included). Past it the walk stops,
    /// with a gap naming the limit.
    pub entries: u64,
    /// Most bytes of file contents hashed. Past it, files are listed with
    /// `-` for their hash, with a gap naming the limit.
    pub bytes: u64,
    /// Threads walking at once (at least 1).
    pub threads: usize,
    /// Whether a boundary (another filesystem or subvolume inside the tree)
    /// is also a gap.
    pub boundary_gap: bool,
}

/// Default of [`TreeLimits::entries`].
pub const DEFAULT_ENTRIES: u64 = 1_000_000;
/// Default of [`TreeLimits::bytes`]: 16 GiB.
pub const DEFAULT_BYTES: u64 = 16 << 30;

impl Default for TreeLimits {
    fn default() -> TreeLimits {
        TreeLimits {
            entries: DEFAULT_ENTRIES,
            bytes: DEFAULT_BYTES,
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .clamp(1, 4),
            boundary_gap: true,
        }
    }
}

/// `BTRFS_SUPER_MAGIC`.
const BTRFS_MAGIC: i64 = 0x9123_683e;
/// The inode of the empty directory a nested subvolume leaves in a
/// snapshot (`BTRFS_EMPTY_SUBVOL_DIR_OBJECTID`).
const BTRFS_EMPTY_SUBVOL_DIR: u64 = 2;

/// Bytes of one read of file contents.
const READ_BUF: usize = 256 << 10;
/// Bytes of one directory listing read.
const DIR_BUF: usize = 64 << 10;

/// A directory waiting to be walked.
struct Job {
    /// Its path relative to the root, raw (empty for the root).
    rel: Vec<u8>,
    /// Its key (escaped; `.` for the root).
    key: String,
    /// The inode its parent's listing gave (0 for the root).
    ino: u64,
}

struct Queue {
    jobs: Vec<Job>,
    /// Workers busy with a directory (that may add jobs).
    busy: usize,
}

struct Walk<'a> {
    root: BorrowedFd<'a>,
    root_dev: u64,
    btrfs: bool,
    limits: &'a TreeLimits,
    queue: Mutex<Queue>,
    cv: Condvar,
    entries: AtomicU64,
    bytes: AtomicU64,
    /// Set when the entries limit is passed: everyone stops.
    stop: AtomicBool,
    over_bytes: AtomicBool,
}

/// One worker's findings and buffers.
struct Worker {
    items: Vec<(String, String)>,
    gaps: Vec<String>,
    read: Vec<u8>,
    dir: Vec<u8>,
    /// Subdirectories found in the directory at hand, queued at its end.
    found: Vec<Job>,
}

/// Walks the tree at `root` (see the module's documentation).
pub fn capture(root: &Path, limits: &TreeLimits) -> Capture {
    let mut c = Capture::new();
    let fd = match fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => {
            c.gap(format!("{}: cannot open the root: {e}", root.display()));
            return c;
        }
    };
    let (st, sfs) = match (fs::fstat(&fd), fs::fstatfs(&fd)) {
        (Ok(st), Ok(sfs)) => (st, sfs),
        (Err(e), _) | (_, Err(e)) => {
            c.gap(format!("{}: cannot stat the root: {e}", root.display()));
            return c;
        }
    };
    // `f_type`'s type differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    let btrfs = sfs.f_type as i64 == BTRFS_MAGIC;
    let walk = Walk {
        root: fd.as_fd(),
        root_dev: st.st_dev,
        btrfs,
        limits,
        queue: Mutex::new(Queue {
            jobs: vec![Job {
                rel: Vec::new(),
                key: ".".into(),
                ino: 0,
            }],
            busy: 0,
        }),
        cv: Condvar::new(),
        entries: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        over_bytes: AtomicBool::new(false),
    };
    let threads = limits.threads.max(1);
    let results: Vec<Worker> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(|| walk.work())).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a walking thread panicked"))
            .collect()
    });
    for w in results {
        c.items.extend(w.items);
        c.gaps.extend(w.gaps);
    }
    if walk.stop.load(Ordering::Relaxed) {
        c.gap(format!(
            "limit: more than {} entries (the entries limit); the rest of the tree was not walked",
            limits.entries
        ));
    }
    if walk.over_bytes.load(Ordering::Relaxed) {
        c.gap(format!(
            "limit: more than {} bytes of contents (the bytes limit); files past it are listed unhashed (`-`)",
            limits.bytes
        ));
    }
    c.gaps.sort();
    c
}

/// SHA-256 (hex) over the capture's canonical form: for each item in key
/// order `item TAB key TAB value LF`, then for each gap in order `gap TAB
/// text LF`.
pub fn digest(c: &Capture) -> String {
    let mut h = Sha256::new();
    for (k, v) in &c.items {
        h.update(b"item\t");
        h.update(k.as_bytes());
        h.update(b"\t");
        h.update(v.as_bytes());
        h.update(b"\n");
    }
    for g in &c.gaps {
        h.update(b"gap\t");
        h.update(g.as_bytes());
        h.update(b"\n");
    }
    format!("{:x}", h.finalize())
}

/// Appends `bytes` as text: `\` as `\\`, control characters and bytes
/// that are not UTF-8 as `\xNN`.
pub fn escape_into(out: &mut String, bytes: &[u8]) {
    for chunk in bytes.utf8_chunks() {
        for ch in chunk.valid().chars() {
            match ch {
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 || c == '\x7f' => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
}

fn perm(st: &fs::Stat) -> u32 {
    st.st_mode & 0o7777
}

/// An entry's owner, `UID:GID`.
fn owner(st: &fs::Stat) -> String {
    format!("{}:{}", st.st_uid, st.st_gid)
}

/// Most bytes of an entry's attribute names, and of one value
/// (`XATTR_LIST_MAX`, `XATTR_SIZE_MAX`).
const XATTR_MAX: usize = 64 << 10;

/// ` xattrs SHA256` of the extended attributes `list` names and `get`
/// reads (see the module's documentation); empty when there are none.
fn xattrs(
    list: impl Fn(&mut [u8]) -> rustix::io::Result<usize>,
    get: impl Fn(&std::ffi::CStr, &mut [u8]) -> rustix::io::Result<usize>,
) -> String {
    let mut small = [0u8; 256];
    let mut big = Vec::new();
    let names: &[u8] = match list(&mut small) {
        Ok(0) | Err(Errno::NOTSUP) => return String::new(),
        Ok(n) => &small[..n],
        Err(Errno::RANGE) => {
            big.resize(XATTR_MAX, 0);
            match list(&mut big) {
                Ok(n) => &big[..n],
                Err(_) => return " xattrs ?".into(),
            }
        }
        Err(_) => return " xattrs ?".into(),
    };
    let mut names: Vec<&[u8]> = names.split(|&c| c == 0).filter(|n| !n.is_empty()).collect();
    names.sort_unstable();
    let mut h = Sha256::new();
    let mut value = vec![0u8; XATTR_MAX];
    for name in names {
        let Ok(cname) = std::ffi::CString::new(name) else {
            return " xattrs ?".into();
        };
        match get(&cname, &mut value) {
            Ok(n) => {
                h.update(name);
                h.update([0]);
                h.update(&value[..n]);
                h.update([0]);
            }
            // Removed since it was listed: changed during the walk.
            Err(_) => return " xattrs ?".into(),
        }
    }
    format!(" xattrs {:x}", h.finalize())
}

/// [`xattrs`] of the entry open as `fd` (a file or a directory).
fn fd_xattrs(fd: BorrowedFd<'_>) -> String {
    xattrs(|b| fs::flistxattr(fd, b), |n, b| fs::fgetxattr(fd, n, b))
}

/// [`xattrs`] of the entry `name` in the directory `dir`, not followed
/// (a special file, which is not opened).
fn name_xattrs(dir: BorrowedFd<'_>, name: &std::ffi::CStr) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut p = format!("/proc/self/fd/{}/", rustix::fd::AsRawFd::as_raw_fd(&dir)).into_bytes();
    p.extend_from_slice(name.to_bytes());
    let p = std::ffi::OsStr::from_bytes(&p);
    xattrs(|b| fs::llistxattr(p, b), |n, b| fs::lgetxattr(p, n, b))
}

/// The value of a non-regular, non-directory entry from its `stat`.
fn other_value(st: &fs::Stat) -> String {
    let kind = FileType::from_raw_mode(st.st_mode);
    let (m, u) = (perm(st), owner(st));
    match kind {
        FileType::CharacterDevice | FileType::BlockDevice => {
            let tag = if kind == FileType::CharacterDevice {
                "chr"
            } else {
                "blk"
            };
            format!(
                "{tag} {m:o} {u} {}:{}",
                fs::major(st.st_rdev),
                fs::minor(st.st_rdev)
            )
        }
        FileType::Fifo => format!("fifo {m:o} {u}"),
        FileType::Socket => format!("sock {m:o} {u}"),
        FileType::Directory => format!("dir {m:o} {u}"),
        FileType::Symlink => "link -> ?".into(),
        _ => format!("unknown {:o} {u}", st.st_mode),
    }
}

impl Walk<'_> {
    fn work(&self) -> Worker {
        let mut w = Worker {
            items: Vec::new(),
            gaps: Vec::new(),
            read: vec![0; READ_BUF],
            dir: Vec::with_capacity(DIR_BUF),
            found: Vec::new(),
        };
        loop {
            let job = {
                let mut q = self.queue.lock().expect("walk queue");
                loop {
                    if self.stop.load(Ordering::Relaxed) {
                        q.jobs.clear();
                    }
                    if let Some(j) = q.jobs.pop() {
                        q.busy += 1;
                        break Some(j);
                    }
                    if q.busy == 0 {
                        break None;
                    }
                    q = self.cv.wait(q).expect("walk queue");
                }
            };
            let Some(job) = job else {
                self.cv.notify_all();
                return w;
            };
            self.directory(&mut w, job);
            let mut q = self.queue.lock().expect("walk queue");
            q.busy -= 1;
            let added = !w.found.is_empty();
            q.jobs.append(&mut w.found);
            drop(q);
            if added {
                self.cv.notify_all();
            } else {
                self.cv.notify_one();
            }
        }
    }

    /// Counts one entry; false (and stops the walk) past the limit.
    fn count(&self) -> bool {
        if self.entries.fetch_add(1, Ordering::Relaxed) >= self.limits.entries {
            self.stop.store(true, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn directory(&self, w: &mut Worker, job: Job) {
        if !self.count() {
            return;
        }
        let owned;
        let fd = if job.rel.is_empty() {
            self.root
        } else {
            match fs::openat2(
                self.root,
                job.rel.as_slice(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
            ) {
                Ok(fd) => {
                    owned = fd;
                    owned.as_fd()
                }
                Err(e) => {
                    w.gaps
                        .push(changed(&job.key, "cannot open the directory", e));
                    return;
                }
            }
        };
        let st = match fs::fstat(fd) {
            Ok(st) => st,
            Err(e) => {
                w.gaps
                    .push(changed(&job.key, "cannot stat the directory", e));
                return;
            }
        };
        if job.ino != 0 && st.st_ino != job.ino && st.st_dev == self.root_dev {
            w.gaps.push(format!(
                "changed: {}: the directory was replaced during the walk",
                job.key
            ));
            return;
        }
        let boundary = !job.rel.is_empty()
            && (st.st_dev != self.root_dev || (self.btrfs && st.st_ino == BTRFS_EMPTY_SUBVOL_DIR));
        if boundary {
            w.items.push((
                job.key.clone(),
                format!("boundary {:o} {}", perm(&st), owner(&st)),
            ));
            if self.limits.boundary_gap {
                w.gaps.push(format!(
                    "boundary: {}: another filesystem or subvolume, not walked",
                    job.key
                ));
            }
            return;
        }
        w.items.push((
            job.key.clone(),
            format!("dir {:o} {}{}", perm(&st), owner(&st), fd_xattrs(fd)),
        ));
        let mut buf = std::mem::take(&mut w.dir);
        self.list(w, fd, &job, &mut buf);
        w.dir = buf;
    }

    fn list(&self, w: &mut Worker, fd: BorrowedFd<'_>, job: &Job, buf: &mut Vec<u8>) {
        let mut iter = fs::RawDir::new(fd, buf.spare_capacity_mut());
        while let Some(ent) = iter.next() {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let ent = match ent {
                Ok(e) => e,
                Err(e) => {
                    w.gaps
                        .push(changed(&job.key, "cannot list the directory", e));
                    return;
                }
            };
            let name = ent.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let mut key = if job.rel.is_empty() {
                String::with_capacity(name.len())
            } else {
                let mut k = String::with_capacity(job.key.len() + 1 + name.len());
                k.push_str(&job.key);
                k.push('/');
                k
            };
            escape_into(&mut key, name);
            let mut kind = ent.file_type();
            let mut st = None;
            if kind == FileType::Unknown {
                match fs::statat(fd, ent.file_name(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(s) => {
                        kind = FileType::from_raw_mode(s.st_mode);
                        st = Some(s);
                    }
                    Err(e) => {
                        w.gaps.push(changed(&key, "cannot stat", e));
                        continue;
                    }
                }
            }
            if kind == FileType::Directory {
                let mut rel = Vec::with_capacity(job.rel.len() + 1 + name.len());
                if !job.rel.is_empty() {
                    rel.extend_from_slice(&job.rel);
                    rel.push(b'/');
                }
                rel.extend_from_slice(name);
                w.found.push(Job {
                    rel,
                    key,
                    ino: ent.ino(),
                });
                continue;
            }
            if !self.count() {
                return;
            }
            let value = match kind {
                FileType::RegularFile => match self.file(w, fd, ent.file_name()) {
                    Ok(v) => v,
                    Err(why) => {
                        w.gaps.push(format!("{why}: {key}"));
                        continue;
                    }
                },
                FileType::Symlink => match fs::readlinkat(fd, ent.file_name(), Vec::new()) {
                    Ok(t) => {
                        let mut v = String::from("link -> ");
                        escape_into(&mut v, t.to_bytes());
                        v
                    }
                    Err(e) => {
                        w.gaps.push(changed(&key, "cannot read the link", e));
                        continue;
                    }
                },
                _ => {
                    let s = match st {
                        Some(s) => s,
                        None => match fs::statat(fd, ent.file_name(), AtFlags::SYMLINK_NOFOLLOW) {
                            Ok(s) => s,
                            Err(e) => {
                                w.gaps.push(changed(&key, "cannot stat", e));
                                continue;
                            }
                        },
                    };
                    other_value(&s) + &name_xattrs(fd, ent.file_name())
                }
            };
            w.items.push((key, value));
        }
    }

    /// The value of the regular file `name` in `dir`.
    fn file(
        &self,
        w: &mut Worker,
        dir: BorrowedFd<'_>,
        name: &std::ffi::CStr,
    ) -> Result<String, String> {
        let fd: OwnedFd = fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| why("cannot open", e))?;
        let st = fs::fstat(&fd).map_err(|e| why("cannot stat", e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err("changed: no longer a regular file".into());
        }
        let size = st.st_size as u64;
        let (m, u) = (perm(&st), owner(&st));
        let x = fd_xattrs(fd.as_fd());
        if self
            .bytes
            .fetch_add(size, Ordering::Relaxed)
            .saturating_add(size)
            > self.limits.bytes
        {
            self.over_bytes.store(true, Ordering::Relaxed);
            return Ok(format!("file {m:o} {u} {size} -{x}"));
        }
        let mut h = Sha256::new();
        let mut total = 0u64;
        loop {
            let n = match rustix::io::read(&fd, &mut w.read[..]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(why("cannot read", e)),
            };
            h.update(&w.read[..n]);
            total += n as u64;
            if total > size {
                break;
            }
        }
        if total != size {
            return Err(format!(
                "changed: read {total} bytes where the size said {size} (the file changed during the walk)"
            ));
        }
        Ok(format!("file {m:o} {u} {size} {:x}{x}", h.finalize()))
    }
}

fn why(what: &str, e: Errno) -> String {
    if e == Errno::NOENT {
        "vanished: gone before it was read".into()
    } else if e == Errno::LOOP || e == Errno::NOTDIR {
        "changed: replaced during the walk".into()
    } else {
        format!("unreadable: {what}: {e}")
    }
}

fn changed(key: &str, what: &str, e: Errno) -> String {
    format!("{}: {key}", why(what, e))
}

#[cfg(test)]
mod tests;
