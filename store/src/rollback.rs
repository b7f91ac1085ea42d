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

impl Store {
    pub fn rollback(&self, p: &SessionRollback) -> Result<RollbackDone> {
        let (a, s, c) = (&*p.agent_id, &*p.session_id, &*p.checkpoint_id);
        let _g = self.guard();
        self.need_checkpoint(a, s, c)?;
        let session = self.need_session(a, s)?;
        let current = self.layout.current(a, s);
        let old_subvolume = btrfs::subvolume_id(&current)?;
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
            btrfs::snapshot(&self.layout.checkpoint(a, s, c), &fresh, false)?;
            // The session's quota follows it to the new tree before the
            // tree is swapped in (a snapshot starts with the limit its
            // checkpoint had when it was taken).
            self.limit_session_tree(&fresh)?;
            self.crash_point("rollback.after_snapshot");
            btrfs::exchange(&fresh, &current)?;
            self.crash_point("rollback.after_exchange");
            // `fresh` now names the old tree.
            let after = After::Remove(fresh);
            self.end(op_id, op, &after)?;
            self.crash_point("rollback.after_commit");
            Ok(((), after))
        })?;
        Ok(RollbackDone {
            agent_id: a.to_string(),
            session_id: s.to_string(),
            checkpoint_id: c.to_string(),
            previous_head: session.head,
            killed_processes: 0,
        })
    }
}
