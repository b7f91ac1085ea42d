//! The write-ahead journal of multi-step store changes.
//!
//! The journal is a table of the index database (redb, in `state/`), so
//! that an operation's intent, its effect on the index and the order of
//! operations share one crash-safe log:
//!
//! 1. **Begin**: the [`Op`], with everything needed to finish it, is
//!    committed durably (fsync) before the operation touches the disk.
//! 2. The disk steps run (snapshot, rename, exchange), each leaving
//!    evidence that recovery can read: a subvolume exists or not, a name
//!    was moved or not, `current/` is the old subvolume or not.
//! 3. **End**: the index changes and the journal entry's removal (or its
//!    move to [`Stage::Committed`] while a tree waits to be deleted) are
//!    committed in one transaction. This commit is not synced on its own:
//!    the next operation's durable Begin, or the shutdown sync, carries it.
//!    If it is lost, so is every later commit, and no later operation can
//!    have touched the disk, so the evidence on disk is still the
//!    operation's own.
//! 4. **Answer**: only once recovery would finish the operation, whatever
//!    is lost after it. A create, a checkpoint and a rollback are answered
//!    after their snapshot or new subvolume, whose ioctl commits the
//!    filesystem's transaction: with the durable Begin, recovery finishes
//!    them (doing a rollback's exchange again if a power cut took it). A
//!    delete writes its index change and a [`Stage::Committed`] entry in
//!    one durable commit before it touches the disk; recovery redoes a lost
//!    rename. So an answered change survives a power cut, and an unanswered
//!    one is whole or undone, at no I/O beyond the Begin's sync.
//!
//! On start-up, every entry still in the journal is resolved: a committed
//! one only has its removal finished; a begun one is finished if its disk
//! steps are complete and undone otherwise. A step that fails at run time
//! is undone at once by the same code. See `store::recovery`.

use crate::rows::{CheckpointRecord, ForkRecord, TurnRecord};
use serde::{Deserialize, Serialize};

/// One multi-step change, with what recovery needs to finish or undo it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Op {
    AgentCreate {
        agent: String,
        created_ms: u64,
    },
    AgentDelete {
        agent: String,
        /// Subvolume ID of the agent's workspace: tells the tree that was
        /// deleted from a new one of the same name.
        subvolume: u64,
    },
    SessionCreate {
        agent: String,
        session: String,
        created_ms: u64,
    },
    SessionDelete {
        agent: String,
        session: String,
        /// Subvolume ID of the session's `current/`.
        subvolume: u64,
    },
    CheckpointCreate {
        agent: String,
        session: String,
        checkpoint: String,
        record: CheckpointRecord,
    },
    CheckpointDelete {
        agent: String,
        session: String,
        checkpoint: String,
        /// Subvolume ID of the checkpoint (0 when only the index changes).
        subvolume: u64,
    },
    Rollback {
        agent: String,
        session: String,
        checkpoint: String,
        /// Subvolume ID of `current/` before the swap.
        old_subvolume: u64,
    },
    /// A new session `agent/session` made from `from`: its baseline
    /// checkpoint (`from.baseline`, with `record`) a read-only snapshot of
    /// the source, then its `current/` a writable snapshot of the baseline.
    SessionFork {
        agent: String,
        session: String,
        created_ms: u64,
        record: CheckpointRecord,
        from: ForkRecord,
    },
    /// A session received from an archive into `staging` (a directory of
    /// the agent's `sessions/` laid out as the session's, its checkpoints
    /// in `checkpoints/`) made to appear: `current/` made as a writable
    /// snapshot of the received one, then the directory renamed into
    /// place.
    SessionImport {
        agent: String,
        session: String,
        created_ms: u64,
        staging: String,
        head: Option<String>,
        checkpoints: Vec<(String, CheckpointRecord)>,
        turns: Vec<(String, TurnRecord)>,
        fork: Option<ForkRecord>,
    },
    /// What an archive made `since` a checkpoint of an existing session
    /// adds: its new checkpoints moved from `staging` into the session's
    /// `checkpoints/`, then its `current/` exchanged with a writable
    /// snapshot of the received one (`old_subvolume`: the `current/`
    /// before).
    SessionImportSince {
        agent: String,
        session: String,
        staging: String,
        head: Option<String>,
        checkpoints: Vec<(String, CheckpointRecord)>,
        turns: Vec<(String, TurnRecord)>,
        old_subvolume: u64,
    },
}

/// How far an operation got, as far as the index knows.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Begin is durable; the disk may be anywhere between before and after.
    Begun,
    /// The index changes are in; only removing a trashed tree remains.
    Committed,
    /// A step failed at run time and the operation is being undone.
    Aborting,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Entry {
    pub op: Op,
    pub stage: Stage,
}
