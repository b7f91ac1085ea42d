//! Keeping the private /tmp: when the program exits normally, the sandbox
//! init copies the regular files of its /tmp to `current/.allox-tmp/`.
//!
//! The tree belongs to the agent, whose background processes may still be
//! changing it during the copy, so the walk trusts nothing it saw:
//!
//! - it is iterative, with an explicit stack, a depth budget and a budget of
//!   entries read; every directory is opened relative to its parent's
//!   descriptor with `O_NOFOLLOW | O_DIRECTORY` (no path is ever resolved
//!   twice, no symlink followed), and only directories on the path from the
//!   root to the one being read hold a descriptor, so at most
//!   `2 × (depth + 1)` are open at once (source and destination);
//! - a file is opened with `O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC`, and copied
//!   only if `fstat` of the opened descriptor shows the regular file that
//!   was walked (same device and inode): a file swapped for a FIFO cannot
//!   block the init, a symlink swapped in is not followed;
//! - at most the size seen during the walk is copied, and only if it fits
//!   the byte budget: a file that keeps growing, or a sparse 1 TiB file, is
//!   never read whole;
//! - FIFOs, sockets, devices and symlinks are left out.
//!
//! The copy is made in a directory of its own beside the destination
//! (`.allox-tmp.partial-XXXXXXXX`, locked while it is made) and swapped in
//! whole (`RENAME_EXCHANGE`), the earlier copy then removed: a run killed
//! during the copy leaves the earlier copy as it was (it left a mix of
//! two runs' files, one of them lost), and its half-made directory, no
//! longer locked, is removed by the next copy.

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, Stat};
use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::rc::Rc;

/// How much one sync may do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    /// Total bytes copied.
    pub bytes: u64,
    /// Files copied.
    pub files: u32,
    /// Directory entries read, over the whole walk.
    pub entries: u32,
    /// Directories below the root that are entered (the root is depth 0).
    pub depth: u32,
}

impl Budget {
    /// The defaults, with a byte cap.
    pub fn with_bytes(bytes: u64) -> Budget {
        Budget {
            bytes,
            files: 10_000,
            entries: 100_000,
            depth: 64,
        }
    }
}

/// What a sync did.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Synced {
    pub files: u32,
    pub bytes: u64,
    /// Regular files seen but not copied (too large, changed meanwhile, or
    /// the destination refused them).
    pub skipped: u32,
    /// The walk stopped early: a budget ran out.
    pub truncated: bool,
    /// Most directories open at once (each holds at most two descriptors,
    /// its own and its destination's).
    pub peak_open_dirs: u32,
}

/// How many directories are open now, and at most.
#[derive(Default)]
struct OpenDirs {
    now: std::cell::Cell<u32>,
    peak: std::cell::Cell<u32>,
}

/// One open directory, counted in [`OpenDirs`] while it lives.
struct Counted(Rc<OpenDirs>);

impl Counted {
    fn new(c: &Rc<OpenDirs>) -> Counted {
        c.now.set(c.now.get() + 1);
        c.peak.set(c.peak.get().max(c.now.get()));
        Counted(c.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.now.set(self.0.now.get() - 1);
    }
}

/// The destination side of a source directory, made on first use.
enum Dest {
    Unmade,
    Made(OwnedFd),
    Failed,
}

/// A source directory being walked (or an ancestor of one).
struct Node {
    fd: OwnedFd,
    /// Its name in the parent (for the destination's tree).
    name: CString,
    parent: Option<Rc<Node>>,
    dest: RefCell<Dest>,
    _counted: Counted,
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Copies the regular files under `src` into `dest_parent/dest_name`
/// (made when there is something to copy), within `budget`.
pub fn sync(
    src: &CStr,
    dest_parent: &CStr,
    dest_name: &CStr,
    mut budget: Budget,
) -> std::io::Result<Synced> {
    let root_fd = rustix::fs::open(src, DIR_FLAGS, Mode::empty())?;
    let dev = rustix::fs::fstat(&root_fd)?.st_dev;
    let parent_path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(dest_parent.to_bytes()));
    let dest_parent = rustix::fs::open(dest_parent, DIR_FLAGS, Mode::empty())?;
    let partial = partial_prefix(dest_name);
    sweep(&dest_parent, &parent_path, &partial);
    let mut word = [0u8; 4];
    let _ = rustix::rand::getrandom(&mut word, rustix::rand::GetRandomFlags::empty());
    let stage = CString::new(format!("{partial}{:08x}", u32::from_le_bytes(word)))
        .map_err(std::io::Error::other)?;
    let open = Rc::new(OpenDirs::default());
    let root = Rc::new(Node {
        fd: root_fd,
        name: stage.clone(),
        parent: None,
        dest: RefCell::new(Dest::Unmade),
        _counted: Counted::new(&open),
    });
    let mut out = Synced::default();
    // Subdirectories still to enter: (parent, name, depth).
    let mut stack: Vec<(Rc<Node>, CString, u32)> = Vec::new();
    let mut next = Some((root.clone(), 0u32));
    while let Some((dir, depth)) = next.take() {
        let (names, spent) = read_names(&dir.fd, &mut budget);
        for name in names {
            let Ok(st) = rustix::fs::statat(&dir.fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory if depth < budget.depth => {
                    stack.push((dir.clone(), name, depth + 1));
                }
                FileType::Directory => out.truncated = true,
                FileType::RegularFile => {
                    if budget.files == 0 {
                        out.truncated = true;
                        stack.clear();
                        break;
                    }
                    match copy_file(&dir, &name, &st, budget.bytes, &dest_parent) {
                        Some(n) => {
                            budget.files -= 1;
                            budget.bytes -= n;
                            out.files += 1;
                            out.bytes += n;
                        }
                        None => out.skipped += 1,
                    }
                }
                _ => {}
            }
        }
        if spent {
            out.truncated = true;
            break;
        }
        // The next directory that opens as what it was walked as.
        while let Some((parent, name, depth)) = stack.pop() {
            if let Some(node) = enter(parent, name, dev, &open) {
                next = Some((node, depth));
                break;
            }
        }
    }
    out.peak_open_dirs = open.peak.get();
    // Nothing copied: nothing made, the earlier copy left as it is.
    // Swapped in while the walk's root, and with it the lock, is held.
    // A copy that kept no file (none fitted: the session at its quota)
    // leaves the earlier one, and goes.
    let made = matches!(&*root.dest.borrow(), Dest::Made(_));
    if made && out.files > 0 {
        swap_in(&dest_parent, &parent_path, &stage, dest_name)?;
    } else if made {
        remove_entry(&parent_path, &stage);
    }
    drop(root);
    Ok(out)
}

/// The names of half-made copies for destination `name`.
fn partial_prefix(name: &CStr) -> String {
    format!("{}.partial-", name.to_string_lossy())
}

/// The copy made as `stage` becomes `name` in `parent`, and what was
/// `name` (a copy, or anything in the way) is removed.
fn swap_in(
    parent: &OwnedFd,
    parent_path: &std::path::Path,
    stage: &CStr,
    name: &CStr,
) -> std::io::Result<()> {
    use rustix::fs::RenameFlags;
    match rustix::fs::renameat_with(parent, stage, parent, name, RenameFlags::EXCHANGE) {
        Ok(()) => {
            // The earlier copy, under the stage's name, unlocked (its
            // lock went with the walk's descriptors): removed now, or by
            // the next copy's sweep.
            remove_entry(parent_path, stage);
            Ok(())
        }
        Err(rustix::io::Errno::NOENT) => {
            rustix::fs::renameat_with(parent, stage, parent, name, RenameFlags::NOREPLACE)?;
            Ok(())
        }
        Err(e) => {
            remove_entry(parent_path, stage);
            Err(e.into())
        }
    }
}

/// Removes `name` in `parent`, a directory with all it holds (never
/// following a link), or anything else.
fn remove_entry(parent: &std::path::Path, name: &CStr) {
    let path = parent.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
    let _ = match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
        Ok(_) => std::fs::remove_file(&path),
        Err(e) => Err(e),
    };
}

/// Removes the half-made copies in `parent` (names beginning `prefix`)
/// that no copy is making now (not locked): left by a run killed during
/// its copy.
fn sweep(parent: &OwnedFd, parent_path: &std::path::Path, prefix: &str) {
    let Ok(mut dir) = Dir::read_from(parent) else {
        return;
    };
    let mut stale = Vec::new();
    while let Some(Ok(e)) = dir.read() {
        if e.file_name().to_bytes().starts_with(prefix.as_bytes()) {
            stale.push(e.file_name().to_owned());
        }
    }
    for name in stale {
        let Ok(fd) = rustix::fs::openat(parent, name.as_c_str(), DIR_FLAGS, Mode::empty()) else {
            remove_entry(parent_path, &name);
            continue;
        };
        if rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok() {
            remove_entry(parent_path, &name);
        }
    }
}

/// The names in a directory, within the entry budget; `true` when the
/// budget ran out before the end of the directory.
fn read_names(fd: &OwnedFd, budget: &mut Budget) -> (Vec<CString>, bool) {
    let mut names = Vec::new();
    let Ok(dir) = Dir::read_from(fd) else {
        return (names, false);
    };
    for entry in dir {
        let Ok(entry) = entry else { break };
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        if budget.entries == 0 {
            return (names, true);
        }
        budget.entries -= 1;
        names.push(name.to_owned());
    }
    (names, false)
}

/// Opens a subdirectory without following links, on the same file system.
fn enter(parent: Rc<Node>, name: CString, dev: u64, open: &Rc<OpenDirs>) -> Option<Rc<Node>> {
    let fd = rustix::fs::openat(&parent.fd, name.as_c_str(), DIR_FLAGS, Mode::empty()).ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory || st.st_dev != dev {
        return None;
    }
    Some(Rc::new(Node {
        fd,
        name,
        parent: Some(parent),
        dest: RefCell::new(Dest::Unmade),
        _counted: Counted::new(open),
    }))
}

/// Copies one file walked as `walked`, if it still is that regular file and
/// its walked size fits `room`. Returns the bytes copied.
fn copy_file(
    dir: &Rc<Node>,
    name: &CStr,
    walked: &Stat,
    room: u64,
    dest_root: &OwnedFd,
) -> Option<u64> {
    let size = u64::try_from(walked.st_size).ok()?;
    if size > room {
        return None;
    }
    let flags =
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY;
    let src = rustix::fs::openat(&dir.fd, name, flags, Mode::empty()).ok()?;
    let st = rustix::fs::fstat(&src).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
        || st.st_dev != walked.st_dev
        || st.st_ino != walked.st_ino
    {
        return None;
    }
    let dest = dest_dir(dir, dest_root)?;
    let _ = rustix::fs::unlinkat(&dest, name, AtFlags::empty());
    let mode = Mode::from_raw_mode(st.st_mode & 0o777);
    let dst = rustix::fs::openat(
        &dest,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        mode,
    )
    .ok()?;
    copy_at_most(src, dst, size).ok()
}

/// Copies up to `limit` bytes (fewer if the file shrank meanwhile).
fn copy_at_most(src: OwnedFd, dst: OwnedFd, limit: u64) -> std::io::Result<u64> {
    let mut src = std::fs::File::from(src).take(limit);
    let mut dst = std::fs::File::from(dst);
    let mut buf = vec![0u8; 64 << 10];
    let mut n = 0;
    loop {
        match src.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                dst.write_all(&buf[..k])?;
                n += k as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The destination directory matching `dir`, made (with its missing
/// ancestors) on first use, never through a symlink.
fn dest_dir(dir: &Rc<Node>, dest_root: &OwnedFd) -> Option<OwnedFd> {
    // The chain of nodes whose destination is not made yet, deepest first.
    let mut chain = Vec::new();
    let mut cur = Some(dir.clone());
    while let Some(n) = cur {
        match &*n.dest.borrow() {
            Dest::Made(_) => break,
            Dest::Failed => return None,
            Dest::Unmade => {}
        }
        cur = n.parent.clone();
        chain.push(n);
    }
    // Made top-down: each one's parent is made by the time it is reached.
    for n in chain.into_iter().rev() {
        let made = {
            let parent_dest = n.parent.as_ref().map(|p| p.dest.borrow());
            match parent_dest.as_deref() {
                Some(Dest::Made(fd)) => make_dir(fd.as_fd(), &n.name, false),
                Some(_) => None,
                None => make_dir(dest_root.as_fd(), &n.name, true),
            }
        };
        let ok = made.is_some();
        *n.dest.borrow_mut() = made.map_or(Dest::Failed, Dest::Made);
        if !ok {
            return None;
        }
    }
    match &*dir.dest.borrow() {
        Dest::Made(fd) => rustix::io::fcntl_dupfd_cloexec(fd, 0).ok(),
        _ => None,
    }
}

/// `at/name` as a directory: made if missing; something else in the way is
/// replaced only at the top (`.allox-tmp` itself), as before.
fn make_dir(at: rustix::fd::BorrowedFd<'_>, name: &CStr, top: bool) -> Option<OwnedFd> {
    let _ = rustix::fs::mkdirat(at, name, Mode::from_raw_mode(0o755));
    match rustix::fs::openat(at, name, DIR_FLAGS, Mode::empty()) {
        // The copy's own directory, locked while it is made: a sweep
        // leaves it alone.
        Ok(fd) if top => {
            rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockExclusive).ok()?;
            Some(fd)
        }
        Ok(fd) => Some(fd),
        Err(_) if top => {
            rustix::fs::unlinkat(at, name, AtFlags::empty()).ok()?;
            rustix::fs::mkdirat(at, name, Mode::from_raw_mode(0o755)).ok()?;
            rustix::fs::openat(at, name, DIR_FLAGS, Mode::empty()).ok()
        }
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests;
