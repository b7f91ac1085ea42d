//! What other users of the host cannot reach: the store's own directories
//! (those above the trees an agent writes in) are 0700 and its state files
//! 0600, made so when they are made and fixed at every start for a store
//! made before ([`keep_private`]); and a warning at start when the store
//! root itself is open to others ([`open_to_others`]).
//!
//! Nothing the sandbox's user reaches goes through these directories: a
//! sandbox's trees are bind-mounted by root before the sandbox drops its
//! privileges, and its init then sees the mount, not the path above it.
//! What is the agent's — `current/`, `shared/`, the checkpoints' trees and
//! everything in them — keeps its own modes. The entry points the plugins
//! write into `state/` for the sandboxes (`*.py`, bound read-only into
//! each one) keep theirs (0644): the sandbox's user reads them through
//! their bind.

use crate::layout::Layout;
use rustix::fd::OwnedFd;
use rustix::fs::{FileType, Mode, OFlags};
use std::path::{Path, PathBuf};

/// The store's own directories.
pub const DIR_MODE: u32 = 0o700;
/// The state files.
pub const FILE_MODE: u32 = 0o600;

/// Makes the directory `p`, 0700 whatever the umask.
pub fn mkdir(p: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(DIR_MODE).create(p)
}

/// Gives `p`, one of the store's own directories, its mode.
pub fn keep_private_dir(p: &Path) {
    fix(p, DIR_MODE, true);
}

/// Gives the store's own directories and its state files their modes:
/// `agents/`, each `agents/<a>/`, its `workspace/` and `sessions/`, each
/// session's directory and `checkpoints/`, and everything in `state/`.
/// Idempotent (a mode already right is not written again); a failure is
/// logged and the rest goes on.
pub fn keep_private(layout: &Layout) {
    let dir = |p: &Path| fix(p, DIR_MODE, true);
    dir(&layout.agents_dir());
    dir(&layout.state_dir());
    for a in names(&layout.agents_dir()) {
        dir(&layout.agent_dir(&a));
        dir(&layout.workspace(&a));
        dir(&layout.sessions_dir(&a));
        for s in names(&layout.sessions_dir(&a)) {
            dir(&layout.session_dir(&a, &s));
            dir(&layout.checkpoints_dir(&a, &s));
        }
    }
    state_files(&layout.state_dir(), 0);
}

/// `state/` and everything in it: directories 0700, files 0600 (but the
/// sandboxes' entry points). For what others made there (the plugins, at
/// their start); [`keep_private`] does it too.
pub fn keep_state_private(layout: &Layout) {
    fix(&layout.state_dir(), DIR_MODE, true);
    state_files(&layout.state_dir(), 0);
}

/// Everything below `state/`: directories 0700, files 0600 (but the
/// sandboxes' entry points and the subvolumes, agents' trees kept as
/// evidence).
fn state_files(d: &Path, depth: usize) {
    // The state directory's own tree is shallow (`monitor/`, `uploads/`).
    if depth > 4 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(d) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        match e.file_type() {
            // A subvolume here is a snapshot of an agent's tree kept as
            // evidence (`effects/…/a-workspace`, read-only): the agent's,
            // which keeps its modes, below directories already private.
            Ok(t) if t.is_dir() && crate::btrfs::is_subvolume(&p) => {}
            Ok(t) if t.is_dir() => {
                fix(&p, DIR_MODE, true);
                state_files(&p, depth + 1);
            }
            Ok(t) if t.is_file() && p.extension().is_none_or(|x| x != "py") => {
                fix(&p, FILE_MODE, false);
            }
            _ => {}
        }
    }
}

/// The names in `d` an agent or a session may have (the store's own
/// in-flight and trashed trees start with `.`).
fn names(d: &Path) -> Vec<String> {
    std::fs::read_dir(d)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.'))
        .collect()
}

/// Sets the permission bits of `p` — itself, never what a symbolic link in
/// its place names — to `mode` when they differ.
fn fix(p: &Path, mode: u32, is_dir: bool) {
    let flags = OFlags::RDONLY
        | OFlags::NOFOLLOW
        | OFlags::CLOEXEC
        | OFlags::NONBLOCK
        | if is_dir {
            OFlags::DIRECTORY
        } else {
            OFlags::empty()
        };
    let fd: OwnedFd = match rustix::fs::open(p, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return,
        Err(e) => {
            tracing::warn!(path = %p.display(), error = %e, "cannot open to check its mode");
            return;
        }
    };
    let Ok(st) = rustix::fs::fstat(&fd) else {
        return;
    };
    let kind = FileType::from_raw_mode(st.st_mode);
    if !(kind == FileType::Directory || kind == FileType::RegularFile)
        || st.st_mode & 0o7777 == mode
    {
        return;
    }
    if let Err(e) = rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)) {
        tracing::warn!(path = %p.display(), error = %e, "cannot make it private");
    }
}

/// When users other than the root directory's owner can reach into the
/// store root — it lets group or others in, and so does every directory
/// above it — its path and mode.
pub fn open_to_others(root: &Path) -> Option<(PathBuf, u32)> {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::canonicalize(root).ok()?;
    let mode = std::fs::metadata(&root).ok()?.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return None;
    }
    for above in root.ancestors().skip(1) {
        let m = std::fs::metadata(above).ok()?.mode();
        if m & 0o011 == 0 {
            return None;
        }
    }
    Some((root, mode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    fn chmod(p: &Path, m: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    #[test]
    fn the_stores_own_directories_and_state_files_are_made_private_and_the_agents_kept() {
        let t = tempfile::tempdir().unwrap();
        let l = Layout::new(t.path());
        let cur = l.current("a", "s");
        for d in [
            cur.join("src"),
            l.checkpoint("a", "s", "c1"),
            l.shared("a"),
            l.state_dir().join("monitor"),
            l.agents_dir().join(".trash-1"),
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        let files = [
            l.state_dir().join("audit.log"),
            l.state_dir().join("share.json"),
            l.state_dir().join("monitor/records.log"),
        ];
        for f in &files {
            std::fs::write(f, "x").unwrap();
            chmod(f, 0o644);
        }
        let shim = l.state_dir().join("share.py");
        std::fs::write(&shim, "x").unwrap();
        chmod(&shim, 0o644);
        let agents_file = cur.join("private.txt");
        std::fs::write(&agents_file, "x").unwrap();
        chmod(&agents_file, 0o644);
        // A link where a state file would be: the file it names is left.
        let outside = t.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        chmod(&outside, 0o644);
        std::os::unix::fs::symlink(&outside, l.state_dir().join("link.log")).unwrap();
        for d in [
            l.agents_dir(),
            l.state_dir(),
            l.agent_dir("a"),
            l.workspace("a"),
            l.sessions_dir("a"),
            l.session_dir("a", "s"),
            l.checkpoints_dir("a", "s"),
            cur.clone(),
            l.shared("a"),
        ] {
            chmod(&d, 0o755);
        }
        keep_private(&l);
        for d in [
            l.agents_dir(),
            l.state_dir(),
            l.state_dir().join("monitor"),
            l.agent_dir("a"),
            l.workspace("a"),
            l.sessions_dir("a"),
            l.session_dir("a", "s"),
            l.checkpoints_dir("a", "s"),
        ] {
            assert_eq!(mode(&d), DIR_MODE, "{}", d.display());
        }
        for f in &files {
            assert_eq!(mode(f), FILE_MODE, "{}", f.display());
        }
        // The agent's, the sandboxes' entry point, a link's target.
        assert_eq!(mode(&cur), 0o755);
        assert_eq!(mode(&l.shared("a")), 0o755);
        assert_eq!(mode(&agents_file), 0o644);
        assert_eq!(mode(&shim), 0o644);
        assert_eq!(mode(&outside), 0o644);
        assert_eq!(mode(&l.agents_dir().join(".trash-1")), 0o755);
        // Again: nothing to do.
        keep_private(&l);
        assert_eq!(mode(&l.agents_dir()), DIR_MODE);
    }

    #[test]
    fn a_root_others_can_reach_is_named() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("store");
        std::fs::create_dir(&root).unwrap();
        chmod(&root, 0o755);
        // The temp dir above is 0700: nobody else gets to the root.
        chmod(t.path(), 0o700);
        assert_eq!(open_to_others(&root), None);
        chmod(t.path(), 0o711);
        let canonical = std::fs::canonicalize(&root).unwrap();
        if canonical.ancestors().skip(1).all(|a| mode(a) & 0o011 != 0) {
            assert_eq!(open_to_others(&root), Some((canonical, 0o755)));
        }
        chmod(&root, 0o700);
        assert_eq!(open_to_others(&root), None);
    }
}
