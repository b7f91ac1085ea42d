//! What snapshots of a session's `current/` leave out: the partial files
//! of uploads under way (`.allox-upload-…`), which the supervisor names.
//!
//! A checkpoint, a fork or an export taken while an upload was under way
//! kept its half-made file. In a fork, or in the session after a rollback
//! once the upload's record was gone, nothing knew it any more: a hidden
//! file of tens of MiB, counted against the quota, never removed. Such a
//! snapshot is now made writable, the named files removed from it (each
//! reached below the snapshot without following a link), then made
//! read-only as asked. A snapshot with nothing to leave out is made as
//! before, in one step.

use crate::btrfs;
use crate::error::StoreError;
use crate::Store;
use std::path::Path;

/// Given a session (agent, session), the files below its `current/` that
/// its snapshots leave out, as paths relative to it.
pub type LeftOut = Box<dyn Fn(&str, &str) -> Vec<String> + Send + Sync>;

/// The names a left-out file may have (nothing else is ever removed).
pub const PARTIAL_PREFIX: &str = ".allox-upload-";

impl Store {
    /// Installs what snapshots of `current/` leave out (once; a second
    /// call is ignored).
    pub fn leave_out_of_snapshots(&self, f: LeftOut) {
        let _ = self.left_out.set(f);
    }

    /// What snapshots of `a/s`'s `current/` leave out now.
    pub(crate) fn left_out(&self, a: &str, s: &str) -> Vec<String> {
        self.left_out.get().map(|f| f(a, s)).unwrap_or_default()
    }

    /// A snapshot of `a/s`'s `current/` at `dest` (read-only if asked),
    /// without what it leaves out.
    pub(crate) fn snapshot_current(
        &self,
        a: &str,
        s: &str,
        dest: &Path,
        read_only: bool,
    ) -> Result<(), StoreError> {
        let leave = self.left_out(a, s);
        if leave.is_empty() {
            btrfs::snapshot(&self.layout.current(a, s), dest, read_only)?;
            return Ok(());
        }
        btrfs::snapshot(&self.layout.current(a, s), dest, false)?;
        remove_below(dest, &leave);
        if read_only {
            btrfs::set_read_only(dest, true)?;
        }
        Ok(())
    }
}

/// Removes each of `files` (relative paths) below `tree`, where it is a
/// left-out file's name reached without following a link; what is not
/// there is no error.
pub(crate) fn remove_below(tree: &Path, files: &[String]) -> usize {
    use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
    let Ok(root) = rustix::fs::open(
        tree,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return 0;
    };
    let mut removed = 0;
    for f in files {
        let (dir, name) = match f.rsplit_once('/') {
            Some((d, n)) => (d, n),
            None => (".", f.as_str()),
        };
        if !name.starts_with(PARTIAL_PREFIX) || name.contains('/') {
            continue;
        }
        let Ok(parent) = rustix::fs::openat2(
            &root,
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) else {
            continue;
        };
        if rustix::fs::unlinkat(&parent, name, AtFlags::empty()).is_ok() {
            removed += 1;
        }
    }
    removed
}
