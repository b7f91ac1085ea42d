//! Paths of the file API, resolved so that nothing leaves the scope: a
//! path is relative, has no `..`, and is opened below the scope's root
//! directory handle with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`
//! — a symbolic link that leads out (absolute, or through `..`) fails in
//! the kernel, whatever a program inside swaps meanwhile. The last
//! component of a path that is changed (written, made, removed, moved) is
//! never followed: it is reached through its parent's handle.

use super::FilesError;
use rustix::fd::OwnedFd;
use rustix::fs::{Mode, OFlags, ResolveFlags};

/// Longest path accepted.
pub const MAX_PATH: usize = 4096;

/// A path checked: its components (none for the root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rel<'a> {
    pub shown: &'a str,
    pub parts: Vec<&'a str>,
}

impl<'a> Rel<'a> {
    /// `path` as the API takes it: relative, `""` or `"."` for the root.
    pub fn parse(path: &'a str) -> Result<Rel<'a>, FilesError> {
        let bad = |why: &'static str| FilesError::BadPath {
            path: path.to_string(),
            why,
        };
        if path.len() > MAX_PATH {
            return Err(bad("is longer than 4096 bytes"));
        }
        if path.contains('\0') {
            return Err(bad("contains a NUL byte"));
        }
        if path.starts_with('/') {
            return Err(bad("is absolute; paths are relative to the scope's root"));
        }
        let mut parts = Vec::new();
        for p in path.split('/') {
            match p {
                "" | "." => {}
                ".." => return Err(bad("contains `..`")),
                p => parts.push(p),
            }
        }
        Ok(Rel { shown: path, parts })
    }

    pub fn is_root(&self) -> bool {
        self.parts.is_empty()
    }

    /// The parent's path (`.` for the root's children) and the last name.
    pub fn split(&self) -> Option<(String, &'a str)> {
        let (name, parent) = self.parts.split_last()?;
        let parent = if parent.is_empty() {
            ".".to_string()
        } else {
            parent.join("/")
        };
        Some((parent, name))
    }

    pub fn joined(&self) -> String {
        if self.parts.is_empty() {
            ".".into()
        } else {
            self.parts.join("/")
        }
    }
}

/// Opens `path` below `root` (`flags` as for `openat`), never leaving it.
pub fn open_beneath<P: rustix::path::Arg>(
    root: &OwnedFd,
    path: P,
    flags: OFlags,
    shown: &str,
) -> Result<OwnedFd, FilesError> {
    let path = path
        .into_c_str()
        .map_err(|e| FilesError::from_errno("open", shown, e))?;
    loop {
        match rustix::fs::openat2(
            root,
            &*path,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        ) {
            // The kernel asks to retry when a rename raced the lookup.
            Err(rustix::io::Errno::AGAIN) => continue,
            Err(e) => return Err(FilesError::from_errno("open", shown, e)),
            Ok(fd) => return Ok(fd),
        }
    }
}

/// The directory `dir` below `root` (a share's scope), reached without
/// following any symbolic link on the way — neither the scope itself nor a
/// directory above it may be one — for resolving paths beneath it.
pub fn open_dir_plainly(root: &OwnedFd, dir: &str) -> Result<OwnedFd, FilesError> {
    let bad = |why: &'static str| FilesError::BadScope {
        scope: dir.to_string(),
        why,
    };
    let rel = Rel::parse(dir).map_err(|e| match e {
        FilesError::BadPath { why, .. } => bad(why),
        e => e,
    })?;
    loop {
        match rustix::fs::openat2(
            root,
            rel.joined(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Err(rustix::io::Errno::AGAIN) => continue,
            Err(rustix::io::Errno::LOOP) | Err(rustix::io::Errno::XDEV) => {
                return Err(bad("is, or is reached through, a symbolic link"))
            }
            Err(rustix::io::Errno::NOENT) => return Err(bad("does not exist")),
            Err(rustix::io::Errno::NOTDIR) => return Err(bad("is not a directory")),
            Err(e) => return Err(FilesError::from_errno("open", dir, e)),
            Ok(fd) => return Ok(fd),
        }
    }
}

/// The parent directory of `rel` (a handle for `*at` calls) and the last
/// name, which is not followed.
pub fn parent_of<'a>(root: &OwnedFd, rel: &Rel<'a>) -> Result<(OwnedFd, &'a str), FilesError> {
    let Some((parent, name)) = rel.split() else {
        return Err(FilesError::BadPath {
            path: rel.shown.to_string(),
            why: "is the scope's root itself",
        });
    };
    let fd = open_beneath(root, &parent, OFlags::PATH | OFlags::DIRECTORY, rel.shown)?;
    Ok((fd, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_relative_without_dot_dot() {
        assert_eq!(Rel::parse("a/./b//c").unwrap().parts, ["a", "b", "c"]);
        assert!(Rel::parse("").unwrap().is_root());
        assert!(Rel::parse(".").unwrap().is_root());
        for (p, why) in [
            ("/etc/passwd", "absolute"),
            ("a/../../x", "`..`"),
            ("..", "`..`"),
            ("a\0b", "NUL"),
        ] {
            let e = Rel::parse(p).unwrap_err().to_string();
            assert!(e.contains(why), "{p:?}: {e}");
        }
        let r = Rel::parse("d/e/f").unwrap();
        assert_eq!(r.split(), Some(("d/e".to_string(), "f")));
        assert_eq!(Rel::parse("f").unwrap().split(), Some((".".into(), "f")));
    }

    #[test]
    fn links_that_lead_out_are_refused_by_the_kernel() {
        let d = tempfile::tempdir().unwrap();
        let scope = d.path().join("scope");
        std::fs::create_dir(&scope).unwrap();
        std::fs::write(d.path().join("secret"), "outside").unwrap();
        std::fs::create_dir(scope.join("in")).unwrap();
        std::fs::write(scope.join("in/f"), "inside").unwrap();
        std::os::unix::fs::symlink("/etc", scope.join("abs")).unwrap();
        std::os::unix::fs::symlink("../secret", scope.join("up")).unwrap();
        std::os::unix::fs::symlink("in/f", scope.join("ok")).unwrap();
        let root = rustix::fs::open(
            &scope,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        for p in ["abs/passwd", "up", "abs"] {
            let e = open_beneath(&root, p, OFlags::RDONLY, p).unwrap_err();
            assert!(matches!(e, FilesError::Outside { .. }), "{p}: {e}");
        }
        // A link that stays inside is followed.
        assert!(open_beneath(&root, "ok", OFlags::RDONLY, "ok").is_ok());
        // /proc/self/root-like links are magic: refused too.
        std::os::unix::fs::symlink("/proc/self/root", scope.join("magic")).unwrap();
        assert!(open_beneath(&root, "magic/etc/passwd", OFlags::RDONLY, "m").is_err());
    }

    #[test]
    fn a_scope_is_a_directory_reached_without_links() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("out/sub")).unwrap();
        std::os::unix::fs::symlink("out", d.path().join("alias")).unwrap();
        std::os::unix::fs::symlink(".", d.path().join("here")).unwrap();
        std::os::unix::fs::symlink("/etc", d.path().join("etc")).unwrap();
        std::fs::write(d.path().join("f"), "").unwrap();
        let root = rustix::fs::open(
            d.path(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        assert!(open_dir_plainly(&root, "out/sub").is_ok());
        assert!(open_dir_plainly(&root, ".").is_ok());
        for (scope, why) in [
            ("alias", "symbolic link"),
            ("alias/sub", "symbolic link"),
            ("here", "symbolic link"),
            ("etc", "symbolic link"),
            ("..", "`..`"),
            ("/etc", "absolute"),
            ("f", "not a directory"),
            ("nope", "does not exist"),
        ] {
            let e = open_dir_plainly(&root, scope).unwrap_err().to_string();
            assert!(e.contains(why), "{scope}: {e}");
        }
    }
}
