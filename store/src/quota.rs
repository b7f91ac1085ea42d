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
    /// The most checkpoints a session may hold: a checkpoint, a turn's
    /// checkpoint or an import past it is refused, so an agent ending
    /// turns in a loop with automatic checkpoints on cannot grow its
    /// session without bound, and the session's listing is always one
    /// answer (at most [`SESSION_CHECKPOINTS`]: see there).
    pub session_checkpoints: usize,
}

/// [`StoreOptions::turns_kept`] unless the daemon is told otherwise
/// (`--turns-kept`).
pub const TURNS_KEPT: usize = 1000;

/// [`StoreOptions::session_checkpoints`] unless the daemon is told
/// otherwise (`--session-checkpoints`), and the most it may be told: a
/// checkpoint's entry in `checkpoint.list` is at most about 600 bytes
/// (five ids of 64 bytes, a label of 256), so 1,000 of them fit one
/// 1 MiB frame with room to spare (a test below encodes the worst case).
pub const SESSION_CHECKPOINTS: usize = 1000;

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            session_quota: None,
            turns_kept: TURNS_KEPT,
            session_checkpoints: SESSION_CHECKPOINTS,
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

    /// Refuses trees that would become a session's (an import's
    /// `current/` and checkpoints, a checkpoint rolled back or forked to),
    /// each named by `what`, of which one holds more than a session may
    /// (`--session-quota`): made a session, or rolled back to, it could
    /// not take even an empty file. `written`: a tree still being written
    /// (received), whose transaction is committed first so that its
    /// quota group counts it; `undone` ends the refusal.
    pub(super) fn fits_session_quota(
        &self,
        trees: Vec<(String, std::path::PathBuf)>,
        written: bool,
        undone: &'static str,
    ) -> Result<()> {
        let (true, Some(most)) = (self.quotas_on, self.opts.session_quota) else {
            return Ok(());
        };
        if written {
            btrfs::commit(self.layout.root())?;
        }
        for (what, tree) in trees {
            let id = btrfs::subvolume_id(&tree)?;
            if let Some(u) = quota::usage(self.layout.root(), id).map_err(StoreError::Quota)? {
                if u.referenced > most {
                    return Err(StoreError::OverQuota {
                        what,
                        holds: u.referenced,
                        most,
                        undone,
                    });
                }
            }
        }
        Ok(())
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

    /// Refuses `adding` more checkpoints to session `a/s` when it would
    /// then hold more than [`StoreOptions::session_checkpoints`].
    pub(super) fn room_for_checkpoints(&self, a: &str, s: &str, adding: usize) -> Result<()> {
        let most = self.opts.session_checkpoints;
        let held = self.index.checkpoints(a, s)?.len();
        if held.saturating_add(adding) > most {
            return Err(StoreError::TooManyCheckpoints {
                agent: a.into(),
                session: s.into(),
                held,
                adding,
                most,
            });
        }
        Ok(())
    }

    /// Whether the filesystem's quota groups are on.
    pub fn quotas_on(&self) -> bool {
        self.quotas_on
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_size, SESSION_CHECKPOINTS};
    use allox_protocol::{
        CheckpointInfo, CheckpointListing, ForkPoint, Origin, Outcome, Response, ResponseEnvelope,
        ServerFrame, MAX_ID_LEN,
    };

    /// The listing of a session holding as many checkpoints as it may, each
    /// with the longest ids and label there can be, is one answer.
    #[test]
    fn the_most_checkpoints_a_session_may_hold_are_listed_in_one_frame() {
        let id = |c: char| c.to_string().repeat(MAX_ID_LEN);
        let checkpoint = CheckpointInfo {
            agent_id: id('a'),
            session_id: id('s'),
            checkpoint_id: id('c'),
            parent: Some(id('p')),
            created_ms: u64::MAX,
            origin: Origin::Recovered,
            pinned: true,
            label: Some("\u{10FFFF}".repeat(crate::MAX_LABEL / 4)),
            turn_id: Some(id('t')),
            forked_from: Some(Box::new(ForkPoint {
                agent_id: id('A'),
                session_id: id('S'),
                checkpoint_id: Some(id('C')),
                forked_ms: u64::MAX,
            })),
        };
        assert_eq!(checkpoint.label.as_ref().unwrap().len(), crate::MAX_LABEL);
        let listing = |n: usize| {
            ServerFrame::Response(ResponseEnvelope {
                conversation: u64::MAX,
                request_id: u64::MAX,
                outcome: Outcome::Ok(Response::Checkpoints(CheckpointListing {
                    agent_id: id('a'),
                    session_id: id('s'),
                    head: Some(id('h')),
                    checkpoints: vec![checkpoint.clone(); n],
                })),
            })
        };
        let framed = allox_protocol::encode(&listing(SESSION_CHECKPOINTS))
            .expect("the largest listing a session can have fits one frame");
        assert!(framed.len() <= allox_protocol::MAX_FRAME);
        // Control: twice as many do not.
        assert!(allox_protocol::encode(&listing(2 * SESSION_CHECKPOINTS)).is_err());
    }

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
