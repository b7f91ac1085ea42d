//! `session.rollback`: only the named session's `current/` changes.
//!
//! Writable snapshot of the checkpoint next to `current/`, then
//! `renameat2(RENAME_EXCHANGE)` swaps the two in one step, the index moves
//! the head, and the old tree is deleted in the background. With a session
//! quota, the new tree gets the session's limit before the exchange.
//!
//! The answer needs no commit of its own: once the snapshot ioctl returns
//! (it commits the filesystem's transaction) the durable Begin and the
//! whole snapshot make recovery finish the rollback, doing the exchange
//! again if a power cut took it.

use super::{After, Result, Store};
use crate::btrfs;
use crate::journal::Op;
use allox_protocol::{RollbackDone, SessionRollback};
use std::path::Path;

/// The disk steps of a rollback done by someone else (system effects'
/// pinned recover tool): given the checkpoint, the name the fresh tree
/// must take beside `current/`, and `current/`, it makes the writable
/// snapshot there and exchanges it with `current/`, nothing else.
pub type Restore<'a> = dyn FnOnce(&Path, &Path, &Path) -> std::result::Result<(), String> + 'a;

impl Store {
    pub fn rollback(&self, p: &SessionRollback) -> Result<RollbackDone> {
        self.rollback_by(p, None)
    }

    /// A rollback whose snapshot and exchange `restore` does, under the
    /// same journal as [`Store::rollback`]: a crash at any step is
    /// finished or undone by recovery exactly as a rollback's is; a
    /// `restore` that fails is undone.
    pub fn rollback_with(
        &self,
        p: &SessionRollback,
        restore: Box<Restore<'_>>,
    ) -> Result<RollbackDone> {
        self.rollback_by(p, Some(restore))
    }

    /// Refuses a rollback that cannot happen (no such session or
    /// checkpoint, a store that takes no changes) before anything is done
    /// for it: the caller kills the session's processes only after this.
    pub fn rollback_allowed(&self, p: &SessionRollback) -> Result<()> {
        self.check_fence()?;
        self.need_checkpoint(&p.agent_id, &p.session_id, &p.checkpoint_id)?;
        // A checkpoint taken under a larger quota (or none) than the
        // daemon's now would leave a session that cannot take an empty
        // file.
        self.fits_session_quota(
            vec![(
                format!("checkpoint {}", p.checkpoint_id),
                self.layout
                    .checkpoint(&p.agent_id, &p.session_id, &p.checkpoint_id),
            )],
            false,
            "nothing was changed",
        )
    }

    fn rollback_by(
        &self,
        p: &SessionRollback,
        restore: Option<Box<Restore<'_>>>,
    ) -> Result<RollbackDone> {
        let (a, s, c) = (&*p.agent_id, &*p.session_id, &*p.checkpoint_id);
        let _g = self.guard();
        self.rollback_allowed(p)?;
        let session = self.need_session(a, s)?;
        let current = self.layout.current(a, s);
        let old_subvolume = btrfs::subvolume_id(&current)?;
        // Where the tree about to be replaced descends from, kept once it
        // is (the checkpoints made from it descend from it).
        let old = btrfs::root_info(&current).ok();
        let build = |_: &mut crate::index::Writer<'_>| {
            Ok(Op::Rollback {
                agent: a.into(),
                session: s.into(),
                checkpoint: c.into(),
                old_subvolume,
            })
        };
        // No free-space check: the new tree shares every block with the
        // checkpoint, so a rollback works on a full filesystem.
        self.journaled(build, |op_id, op| {
            self.crash_point("rollback.after_journal");
            let fresh = self.layout.rollback_tmp(a, s, op_id);
            let checkpoint = self.layout.checkpoint(a, s, c);
            match restore {
                None => {
                    btrfs::snapshot(&checkpoint, &fresh, false)?;
                    // The session's quota follows it to the new tree before
                    // the tree is swapped in (a snapshot starts with the
                    // limit its checkpoint had when it was taken).
                    self.limit_session_tree(&fresh)?;
                    self.crash_point("rollback.after_snapshot");
                    btrfs::exchange(&fresh, &current)?;
                }
                Some(restore) => {
                    restore(&checkpoint, &fresh, &current).map_err(crate::StoreError::Restore)?;
                    // The quota follows the restored tree (recovery gives
                    // every session its limit at the next open, should a
                    // crash come first).
                    self.limit_session_tree(&current)?;
                }
            }
            self.crash_point("rollback.after_exchange");
            // `fresh` now names the old tree.
            let after = After::Remove(fresh);
            self.end(op_id, op, &after)?;
            self.crash_point("rollback.after_commit");
            Ok(((), after))
        })?;
        if let Some(old) = old {
            self.keep_departed(a, s, &old);
        }
        Ok(RollbackDone {
            agent_id: a.to_string(),
            session_id: s.to_string(),
            checkpoint_id: c.to_string(),
            previous_head: session.head,
            killed_processes: 0,
        })
    }
}
