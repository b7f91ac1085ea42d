//! A session's checkpoints: `alloxctl checkpoint` (create, list, delete,
//! pin, unpin), going back to one (`rollback`), their history (`log`),
//! what changed between two (`diff`) and automatic ones (`policy`).

use super::session_ref;
use allox_protocol::{CheckpointCreate, CheckpointPin, CheckpointRef, Request, SessionRollback};
use clap::{Args, Subcommand};

#[derive(Subcommand, Debug)]
pub enum CheckpointCommand {
    /// Snapshot a session's current/.
    Create {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The checkpoint.
        checkpoint: String,
        /// Keep it from deletion until unpinned.
        #[arg(long)]
        pin: bool,
        /// Free text for people (at most 256 bytes).
        #[arg(long, value_name = "TEXT")]
        label: Option<String>,
    },
    /// Show a session's checkpoints as a tree.
    List {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
    },
    /// Delete a checkpoint that is not pinned.
    Delete {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The checkpoint.
        checkpoint: String,
    },
    /// Keep a checkpoint from deletion.
    Pin {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The checkpoint.
        checkpoint: String,
    },
    /// Allow a checkpoint to be deleted again.
    Unpin {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The checkpoint.
        checkpoint: String,
    },
}

impl CheckpointCommand {
    pub fn request(self) -> Request {
        use CheckpointCommand as C;
        let pin = |agent_id, session_id, checkpoint_id, pinned| {
            Request::CheckpointPin(CheckpointPin {
                agent_id,
                session_id,
                checkpoint_id,
                pinned,
            })
        };
        match self {
            C::Create {
                agent,
                session,
                checkpoint,
                pin,
                label,
            } => Request::CheckpointCreate(CheckpointCreate {
                agent_id: agent,
                session_id: session,
                checkpoint_id: checkpoint,
                pinned: pin,
                label,
            }),
            C::List { agent, session } => Request::CheckpointList(session_ref(agent, session)),
            C::Delete {
                agent,
                session,
                checkpoint,
            } => Request::CheckpointDelete(CheckpointRef {
                agent_id: agent,
                session_id: session,
                checkpoint_id: checkpoint,
            }),
            C::Pin {
                agent,
                session,
                checkpoint,
            } => pin(agent, session, checkpoint, true),
            C::Unpin {
                agent,
                session,
                checkpoint,
            } => pin(agent, session, checkpoint, false),
        }
    }
}

/// `alloxctl rollback`.
#[derive(Args, Debug)]
pub struct RollbackArgs {
    /// The agent.
    pub agent: String,
    /// The session.
    pub session: String,
    /// The checkpoint.
    pub checkpoint: String,
    /// Kill the session's processes first instead of failing with
    /// `conflict` while they run.
    #[arg(long)]
    pub kill_processes: bool,
}

impl RollbackArgs {
    pub fn request(self) -> Request {
        Request::SessionRollback(SessionRollback {
            agent_id: self.agent,
            session_id: self.session,
            checkpoint_id: self.checkpoint,
            // Without the flag the daemon's default applies.
            kill_processes: self.kill_processes.then_some(true),
        })
    }
}

/// `alloxctl log`.
#[derive(Args, Debug)]
pub struct LogArgs {
    /// The agent.
    pub agent: String,
    /// The session.
    pub session: String,
}

impl LogArgs {
    pub fn request(self) -> Request {
        Request::CheckpointList(session_ref(self.agent, self.session))
    }
}

/// `alloxctl diff`.
#[derive(Args, Debug)]
pub struct DiffArgs {
    /// The agent.
    pub agent: String,
    /// The session.
    pub session: String,
    /// A checkpoint, or `current`.
    pub from: String,
    /// A checkpoint, or `current`.
    pub to: String,
    /// Also show each changed file's contents, like `git diff`: unified
    /// hunks of text files and symlinks, a note for binary files (the
    /// answer holds at most 512 KiB of patches; past that they are cut
    /// and say so).
    #[arg(long, short = 'p')]
    pub patch: bool,
}

impl DiffArgs {
    pub fn request(self) -> Request {
        Request::CheckpointDiff(allox_protocol::CheckpointDiff {
            agent_id: self.agent,
            session_id: self.session,
            from: self.from,
            to: self.to,
            patch: self.patch,
        })
    }
}

/// `alloxctl policy`.
#[derive(Args, Debug)]
pub struct PolicyArgs {
    /// The agent.
    pub agent: String,
    /// The session (every session's of the agent if left out).
    pub session: Option<String>,
    /// Take a baseline at session creation and a checkpoint after
    /// every successful turn.
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    pub auto_checkpoint: Option<String>,
    /// Keep only the last N turn checkpoints.
    #[arg(long, value_name = "N")]
    pub keep_last: Option<u32>,
}

impl PolicyArgs {
    pub fn request(self) -> Request {
        Request::PolicySet(allox_protocol::PolicySet {
            agent_id: self.agent,
            session_id: self.session,
            auto_checkpoint: self.auto_checkpoint.map(|v| v == "on"),
            keep_last: self.keep_last,
        })
    }
}
