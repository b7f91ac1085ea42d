//! Files the daemon makes in a session's tree, which a program inside can
//! watch and rename at any moment: never privileged, even for an instant.
//!
//! A new file is made without a name (`O_TMPFILE`) in its directory, given
//! to the sandbox's user and its mode — setuid, setgid and sticky bits
//! cleared — on its descriptor, and only then written and linked under a
//! name: nothing in the sandbox can reach it before it is what it will be.
//! Where the filesystem has no `O_TMPFILE`, it is made under its name with
//! mode 0600 and given away on the descriptor before any byte is written.
//! A file is never changed by name, which a program inside could have
//! swapped for another.

use super::FilesError;
use rustix::fd::{AsRawFd, OwnedFd};
use rustix::fs::{AtFlags, Gid, Mode, OFlags, Uid, CWD};
use rustix::io::Errno;

/// The bits of a mode a file the daemon makes may have: no setuid, setgid
/// or sticky bit, whatever the file it replaces had.
pub const PERMISSIONS: u32 = 0o777;

/// A file just made, open for writing.
pub struct Fresh {
    pub fd: OwnedFd,
    /// Whether it has a name in its directory yet.
    named: bool,
}

impl Fresh {
    /// A new regular file in `dir`, to be named `name` there, owned by
    /// `owner` (where the daemon may give files away) with `mode`'s
    /// permission bits, and nothing else. Without `O_TMPFILE` it has its
    /// name already.
    pub fn make(
        dir: &OwnedFd,
        name: &str,
        mode: u32,
        owner: Option<(u32, u32)>,
        shown: &str,
    ) -> Result<Fresh, FilesError> {
        let fresh = match rustix::fs::openat(
            dir,
            ".",
            OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => Fresh { fd, named: false },
            // No O_TMPFILE here (an old kernel reads it as O_DIRECTORY).
            Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => Fresh {
                fd: rustix::fs::openat(
                    dir,
                    name,
                    OFlags::RDWR
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| FilesError::from_errno("write", shown, e))?,
                named: true,
            },
            Err(e) => return Err(FilesError::from_errno("write", shown, e)),
        };
        if let Err(e) = give(&fresh.fd, mode, owner, shown) {
            if fresh.named {
                let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
            }
            return Err(e);
        }
        Ok(fresh)
    }

    /// Whether it has a name (to be removed if what follows fails).
    pub fn named(&self) -> bool {
        self.named
    }

    /// Gives it the name `name` in `dir` (where it was made under its name
    /// already, nothing); fails with `exists` if something took the name.
    pub fn link(&mut self, dir: &OwnedFd, name: &str, shown: &str) -> Result<(), FilesError> {
        if self.named {
            return Ok(());
        }
        // The descriptor itself needs CAP_DAC_READ_SEARCH (the daemon runs
        // as root); without it, the kernel says ENOENT, and /proc does it.
        let r = match rustix::fs::linkat(&self.fd, "", dir, name, AtFlags::EMPTY_PATH) {
            Err(Errno::NOENT | Errno::PERM) => rustix::fs::linkat(
                CWD,
                format!("/proc/self/fd/{}", self.fd.as_raw_fd()),
                dir,
                name,
                AtFlags::SYMLINK_FOLLOW,
            ),
            r => r,
        };
        r.map_err(|e| FilesError::from_errno("write", shown, e))?;
        self.named = true;
        Ok(())
    }
}

/// Gives the open file `fd` to `owner` (where the daemon may) and `mode`'s
/// permission bits only — the owner first, so no moment has the new owner
/// with a setuid bit.
pub fn give(
    fd: &OwnedFd,
    mode: u32,
    owner: Option<(u32, u32)>,
    shown: &str,
) -> Result<(), FilesError> {
    if let Some((uid, gid)) = owner.filter(|_| rustix::process::geteuid().is_root()) {
        rustix::fs::fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
            .map_err(|e| FilesError::from_errno("chown", shown, e))?;
    }
    rustix::fs::fchmod(fd, Mode::from_raw_mode(mode & PERMISSIONS))
        .map_err(|e| FilesError::from_errno("chmod", shown, e))
}

/// The owner the daemon's files in a session have: the sandbox's user
/// where the daemon may give files away, else the daemon's own.
pub fn expected_uid(owner: Option<(u32, u32)>) -> u32 {
    let me = rustix::process::geteuid();
    match owner {
        Some((uid, _)) if me.is_root() => uid,
        _ => me.as_raw(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn dir(p: &std::path::Path) -> OwnedFd {
        rustix::fs::open(
            p,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    #[test]
    fn a_file_has_no_name_until_linked_and_never_a_setuid_bit() {
        let d = tempfile::tempdir().unwrap();
        let fd = dir(d.path());
        let mut f = Fresh::make(&fd, "new", 0o4755, None, "new").unwrap();
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        rustix::io::write(&f.fd, b"bytes").unwrap();
        f.link(&fd, "new", "new").unwrap();
        let md = std::fs::symlink_metadata(d.path().join("new")).unwrap();
        assert_eq!(md.mode() & 0o7777, 0o755);
        assert_eq!(std::fs::read(d.path().join("new")).unwrap(), b"bytes");
        // A name taken meanwhile is not replaced.
        let mut g = Fresh::make(&fd, "new", 0o644, None, "new").unwrap();
        let e = g.link(&fd, "new", "new").unwrap_err();
        assert!(matches!(e, FilesError::Exists { .. }), "{e}");
    }
}
