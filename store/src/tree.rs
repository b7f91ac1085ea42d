//! Handles on the directories and files of a tree an agent controls, for
//! the supervisor's walkers (the diff, tree removal): whatever the agent
//! left there, a walk must not be steered out of the tree, stalled, or made
//! to hold a descriptor per level.
//!
//! - A directory is opened by name from a held parent with `O_NOFOLLOW |
//!   O_DIRECTORY`, and the `(dev, ino)` of the open descriptor must be what
//!   the walk saw for that name: a symlink or another directory swapped in
//!   meanwhile is refused, never followed.
//! - A walk keeps at most [`WINDOW`] levels open. Deeper, the descriptor of
//!   the level [`WINDOW`] above the top is closed, and that level is opened
//!   again as `..` of its child when the walk comes back up, its identity
//!   checked again ([`Dir::reopen_from`]). A 100,000-level tree so costs
//!   [`WINDOW`] descriptors and one `openat` per level on the way up.
//! - A regular file is opened for reading with `O_NONBLOCK | O_NOFOLLOW`
//!   (and `O_NOATIME` where allowed), and the open descriptor must be a
//!   regular file with the identity the walk saw ([`open_regular`]): a FIFO
//!   swapped in is never waited on, a symlink never followed.

use rustix::fd::OwnedFd;
use rustix::fs::{self, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use thiserror::Error;

/// Directory levels a walk keeps open at most (per tree it walks).
pub const WINDOW: usize = 32;

/// Longest path shown in an error; longer ones keep their two ends.
const SHOWN: usize = 512;

#[derive(Debug, Error)]
pub enum TreeError {
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path} changed while it was being read; try again")]
    Changed { path: String },
    #[error("{what} exceeds the limit of {limit} at {path}")]
    Limit {
        what: &'static str,
        limit: u64,
        path: String,
    },
}

impl TreeError {
    pub fn io(op: &'static str, path: &[u8], e: Errno) -> TreeError {
        TreeError::Io {
            op,
            path: show(path),
            source: e.into(),
        }
    }

    pub fn changed(path: &[u8]) -> TreeError {
        TreeError::Changed { path: show(path) }
    }

    /// The OS error number, if this failed in the kernel.
    pub fn errno(&self) -> Option<i32> {
        match self {
            TreeError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// A path for people: lossy UTF-8, the middle of a very long one elided.
pub fn show(path: &[u8]) -> String {
    let p = if path.is_empty() { b"." } else { path };
    if p.len() <= SHOWN {
        return String::from_utf8_lossy(p).into_owned();
    }
    let (head, tail) = (&p[..SHOWN / 2], &p[p.len() - SHOWN / 2..]);
    format!(
        "{}…({} bytes)…{}",
        String::from_utf8_lossy(head),
        p.len() - SHOWN,
        String::from_utf8_lossy(tail)
    )
}

/// What a file is, as far as a walk can tell: its device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ident {
    pub dev: u64,
    pub ino: u64,
}

impl Ident {
    pub fn of(st: &Stat) -> Ident {
        Ident {
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

/// A directory of a walk: open, or closed to stay within [`WINDOW`] and
/// known by its identity until it is opened again.
#[derive(Debug)]
pub struct Dir {
    fd: Option<OwnedFd>,
    id: Ident,
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC)
    .union(OFlags::NONBLOCK);

impl Dir {
    /// Opens the root of a walk (a path the supervisor chose, not the
    /// agent; its last component is not followed if it is a symlink).
    pub fn open_root(path: &Path) -> Result<Dir, TreeError> {
        let shown = path.as_os_str().as_encoded_bytes();
        let fd = fs::open(path, DIR_FLAGS, Mode::empty())
            .map_err(|e| TreeError::io("open", shown, e))?;
        let st = fs::fstat(&fd).map_err(|e| TreeError::io("stat", shown, e))?;
        Ok(Dir {
            fd: Some(fd),
            id: Ident::of(&st),
        })
    }

    /// Takes an open directory as the root of a walk.
    pub fn from_fd(fd: OwnedFd, shown: &[u8]) -> Result<Dir, TreeError> {
        let st = fs::fstat(&fd).map_err(|e| TreeError::io("stat", shown, e))?;
        Ok(Dir {
            fd: Some(fd),
            id: Ident::of(&st),
        })
    }

    pub fn id(&self) -> Ident {
        self.id
    }

    /// The open descriptor. Walkers only use the top of their stack, which
    /// is always open.
    pub fn fd(&self) -> &OwnedFd {
        self.fd.as_ref().expect("the top of a walk is always open")
    }

    pub fn is_open(&self) -> bool {
        self.fd.is_some()
    }

    /// Closes the descriptor; the identity stays for [`Dir::reopen_from`].
    pub fn close(&mut self) {
        self.fd = None;
    }

    /// Opens the subdirectory `name`, which the walk saw as `seen`.
    /// `Changed` if something else is there now.
    pub fn child(&self, name: &OsStr, seen: Ident, shown: &[u8]) -> Result<Dir, TreeError> {
        let fd = match fs::openat(self.fd(), name, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => {
                return Err(TreeError::changed(shown))
            }
            Err(e) => return Err(TreeError::io("open", shown, e)),
        };
        let st = fs::fstat(&fd).map_err(|e| TreeError::io("stat", shown, e))?;
        if Ident::of(&st) != seen {
            return Err(TreeError::changed(shown));
        }
        Ok(Dir {
            fd: Some(fd),
            id: seen,
        })
    }

    /// Opens this (closed) directory again as `..` of `child`, an open
    /// directory that was below it. `Changed` if `child` was moved
    /// elsewhere meanwhile.
    pub fn reopen_from(&mut self, child: &Dir, shown: &[u8]) -> Result<(), TreeError> {
        let fd = fs::openat(child.fd(), "..", DIR_FLAGS, Mode::empty())
            .map_err(|e| TreeError::io("open", shown, e))?;
        let st = fs::fstat(&fd).map_err(|e| TreeError::io("stat", shown, e))?;
        if Ident::of(&st) != self.id {
            return Err(TreeError::changed(shown));
        }
        self.fd = Some(fd);
        Ok(())
    }
}

/// Opens the directory `path` below `root` (names separated by `/`, as a
/// walk lists them; empty for `root` itself) one name at a time, each with
/// `O_NOFOLLOW | O_DIRECTORY`: a symlink anywhere on the way is refused,
/// never followed, so nothing outside the tree is reached whatever was
/// swapped in since the walk. `None` when it is not there (any more) as a
/// directory.
pub fn open_dir_below(root: &OwnedFd, path: &[u8]) -> io::Result<Option<OwnedFd>> {
    let mut dir = fs::openat(root, ".", DIR_FLAGS, Mode::empty())?;
    for name in path.split(|&c| c == b'/').filter(|n| !n.is_empty()) {
        if name == b"." || name == b".." {
            return Ok(None);
        }
        dir = match fs::openat(&dir, OsStr::from_bytes(name), DIR_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
    }
    Ok(Some(dir))
}

/// Opens the regular file `name` of `dir` for reading, never blocking and
/// never following a symlink. `None` when what is there now is not the
/// regular file the walk saw as `seen` (a FIFO, socket, device, symlink or
/// another file was swapped in): nothing is read from it.
pub fn open_regular(dir: &OwnedFd, name: &OsStr, seen: &Stat) -> io::Result<Option<OwnedFd>> {
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let flags = flags | OFlags::NOCTTY;
    let opened = match fs::openat(dir, name, flags | OFlags::NOATIME, Mode::empty()) {
        // O_NOATIME needs the file's owner or CAP_FOWNER.
        Err(Errno::PERM) => fs::openat(dir, name, flags, Mode::empty()),
        other => other,
    };
    let fd = match opened {
        Ok(fd) => fd,
        Err(Errno::LOOP | Errno::NOENT | Errno::NXIO | Errno::NODEV | Errno::NOTDIR) => {
            return Ok(None)
        }
        Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::AGAIN) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let st = fs::fstat(&fd)?;
    let regular = FileType::from_raw_mode(st.st_mode) == FileType::RegularFile;
    Ok((regular && Ident::of(&st) == Ident::of(seen)).then_some(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_paths_are_shown_by_their_ends() {
        let p = "d/".repeat(10_000);
        let s = show(p.as_bytes());
        assert!(s.len() < SHOWN + 64, "{}", s.len());
        assert!(s.contains("bytes)"));
        assert_eq!(show(b""), ".");
        assert_eq!(show(b"a/b"), "a/b");
    }

    #[test]
    fn a_fifo_is_never_waited_on() {
        let t = tempfile_dir();
        let fifo = t.join("p");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            c.as_c_str(),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        std::fs::write(t.join("f"), b"x").unwrap();
        let dir = Dir::open_root(&t).unwrap();
        let seen = fs::statat(dir.fd(), "f", fs::AtFlags::SYMLINK_NOFOLLOW).unwrap();
        // The FIFO is where the walk saw a regular file: refused at once.
        assert!(open_regular(dir.fd(), OsStr::new("p"), &seen)
            .unwrap()
            .is_none());
        assert!(open_regular(dir.fd(), OsStr::new("f"), &seen)
            .unwrap()
            .is_some());
        std::os::unix::fs::symlink("f", t.join("l")).unwrap();
        assert!(open_regular(dir.fd(), OsStr::new("l"), &seen)
            .unwrap()
            .is_none());
        std::fs::remove_dir_all(&t).unwrap();
    }

    #[test]
    fn a_closed_level_reopens_only_as_itself() {
        let t = tempfile_dir();
        std::fs::create_dir_all(t.join("a/b")).unwrap();
        std::fs::create_dir_all(t.join("x")).unwrap();
        let root = Dir::open_root(&t).unwrap();
        let st = |d: &Dir, n: &str| {
            Ident::of(&fs::statat(d.fd(), n, fs::AtFlags::SYMLINK_NOFOLLOW).unwrap())
        };
        let mut a = root.child(OsStr::new("a"), st(&root, "a"), b"a").unwrap();
        let b = a.child(OsStr::new("b"), st(&a, "b"), b"a/b").unwrap();
        a.close();
        a.reopen_from(&b, b"a").unwrap();
        assert!(a.is_open());
        // `b` moved elsewhere: its `..` is no longer `a`.
        std::fs::rename(t.join("a/b"), t.join("x/b")).unwrap();
        a.close();
        assert!(matches!(
            a.reopen_from(&b, b"a"),
            Err(TreeError::Changed { .. })
        ));
        // A name that now holds another directory is refused.
        let seen = st(&root, "x");
        assert!(matches!(
            root.child(OsStr::new("a"), seen, b"a"),
            Err(TreeError::Changed { .. })
        ));
        std::fs::remove_dir_all(&t).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("allox-tree-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}
