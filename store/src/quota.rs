//! Per-session disk quotas: each session's `current/` is limited to
//! [`StoreOptions::session_quota`] referenced bytes with a Btrfs quota
//! group, set when the session is created, on the new tree of every
//! rollback (before it is swapped in), and on every session when the store
//! opens — so the limit is always the one the store was opened with, and a
//! store made before quotas were on gets them at its next open.
//!
//! Quota groups are turned on when the store opens with a quota; the store
//! never turns them off (a store opened without a quota on a filesystem
//! whose quotas are on clears the sessions' limits instead). See
//! `docs/store.md` for what they cost.

use super::{Result, Store, StoreError};
use crate::btrfs::{self, quota};
use crate::layout::Layout;

/// How the store is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Limit on the bytes each session's `current/` may reference (its
    /// files, and the metadata that describes them), enforced by Btrfs
    /// quota groups: a write past it fails with `EDQUOT`. `None`: no limit
    /// (and quota groups are not turned on).
    pub session_quota: Option<u64>,
    /// The most turn records a session keeps: as a turn begins past it,
    /// the oldest ended ones go (their checkpoints stay, as
    /// `keep_last` has them). A session's turns are read whole at each
    /// turn's begin and end, so an agent looping `allox turn begin/end`
    /// cannot grow the index, or slow every turn, without bound.
    pub turns_kept: usize,
}

/// [`StoreOptions::turns_kept`] unless the daemon is told otherwise
/// (`--turns-kept`).
pub const TURNS_KEPT: usize = 1000;

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            session_quota: None,
            turns_kept: TURNS_KEPT,
        }
    }
}

/// Reads a size in bytes: a number, optionally followed by `K`, `M`, `G`
/// or `T` (powers of 1024); at least 1 MiB.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("{s:?}: unknown suffix {c:?} (K, M, G or T)")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size in bytes (e.g. 2G)"))?;
    let bytes = n
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))?;
    if bytes < 1 << 20 {
        return Err(format!("{s:?} is less than 1 MiB"));
    }
    Ok(bytes)
}

/// Turns quota groups on if the store wants a quota and they are off, and
/// waits for the counting that follows (a rescan of the whole filesystem).
/// Returns whether they are on.
pub(super) fn start(layout: &Layout, opts: &StoreOptions) -> Result<bool> {
    let root = layout.root();
    let err = |e: btrfs::BtrfsError| StoreError::Quota(e);
    let mut status = quota::status(root).map_err(err)?;
    if status.is_none() && opts.session_quota.is_some() {
        tracing::warn!(
            "turning on Btrfs quota groups for the session quota; counting what the filesystem holds"
        );
        let t0 = std::time::Instant::now();
        quota::enable(root).map_err(err)?;
        quota::wait_rescan(root).map_err(err)?;
        tracing::info!(ms = t0.elapsed().as_millis() as u64, "quota groups are on");
        status = quota::status(root).map_err(err)?;
    }
    let Some(s) = status else {
        return Ok(false);
    };
    if s.rescanning {
        quota::wait_rescan(root).map_err(err)?;
    } else if s.inconsistent {
        tracing::warn!("the quota numbers are inconsistent; counting again");
        quota::rescan(root).map_err(err)?;
        quota::wait_rescan(root).map_err(err)?;
    }
    Ok(true)
}

impl Store {
    /// Sets the store's limit on the subvolume at `tree` (a session's
    /// `current/`, or the tree a rollback is about to swap in). Nothing
    /// to do while quota groups are off.
    pub(super) fn limit_session_tree(&self, tree: &std::path::Path) -> Result<()> {
        if !self.quotas_on {
            return Ok(());
        }
        let id = btrfs::subvolume_id(tree)?;
        quota::set_limit(self.layout.root(), id, self.opts.session_quota).map_err(StoreError::Quota)
    }

    /// Gives every session the store's limit (at open, after recovery).
    pub(super) fn limit_all_sessions(&self) -> Result<()> {
        if !self.quotas_on {
            return Ok(());
        }
        let mut n = 0;
        for (a, _) in self.index.agents()? {
            for (s, _) in self.index.sessions(&a)? {
                self.limit_session_tree(&self.layout.current(&a, &s))?;
                n += 1;
            }
        }
        match quota::remove_stale(self.layout.root()) {
            Ok(k) if k > 0 => {
                tracing::info!(removed = k, "removed quota groups of deleted subvolumes")
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %StoreError::Quota(e).chain(), "cannot remove stale quota groups")
            }
        }
        tracing::info!(sessions = n, limit = ?self.opts.session_quota, "session quotas set");
        Ok(())
    }

    /// What a session's `current/` holds against its quota; `None` while
    /// quota groups are off.
    pub fn session_usage(&self, a: &str, s: &str) -> Result<Option<quota::Usage>> {
        self.need_session(a, s)?;
        if !self.quotas_on {
            return Ok(None);
        }
        let id = btrfs::subvolume_id(&self.layout.current(a, s))?;
        quota::usage(self.layout.root(), id).map_err(StoreError::Quota)
    }

    /// Whether the filesystem's quota groups are on.
    pub fn quotas_on(&self) -> bool {
        self.quotas_on
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_binary_suffixes_and_at_least_a_mebibyte() {
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert!(parse_size("1K").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("3X").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
