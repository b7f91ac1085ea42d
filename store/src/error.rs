//! Errors of store operations, each mapped to one protocol error code.

use crate::audit::AuditError;
use crate::btrfs::BtrfsError;
use crate::index::IndexError;
use crate::session::shown_list;
use crate::tree::TreeError;
use crate::MAX_LABEL;
use allox_protocol::{ErrorBody, ErrorCode, IdError};
use std::io;
use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error(transparent)]
    InvalidId(#[from] IdError),
    /// A checkpoint's or a turn's label.
    #[error("label must be at most {} bytes without control characters", MAX_LABEL)]
    BadLabel,
    #[error("keep_last must be at least 1")]
    KeepLastZero,
    /// The restore a caller did for a rollback failed (it is undone).
    #[error("{0}")]
    Restore(String),
    /// `session.update` without a limit to change.
    #[error("session.update changes nothing: give pids_max, memory_max, cpu_max, idle_timeout_ms or max_lifetime_ms")]
    NothingToUpdate,
    #[error("cpu_max {0:?} must be \"QUOTA PERIOD\" or \"max PERIOD\" in microseconds")]
    BadCpuMax(String),
    /// A session limit no run could start under, or past what the kernel
    /// takes: why.
    #[error("{0}")]
    BadLimit(String),
    #[error("{0} does not exist")]
    NotFound(String),
    #[error("{0} already exists")]
    Exists(String),
    /// An agent's, session's or checkpoint's directory that the index does
    /// not know, where a new one would go.
    #[error(
        "{} exists on disk but not in the index; restart the supervisor to reconcile",
        .0.display()
    )]
    OnDiskNotIndexed(PathBuf),
    /// `agent.delete` without `force`, of an agent that has sessions.
    #[error(
        "agent {agent} has {} session{} ({}): deleting it would lose their workspaces and checkpoints; delete them first, or pass \"force\": true",
        .sessions.len(),
        plural(.sessions.len()),
        shown_list(.sessions)
    )]
    AgentHasSessions {
        agent: String,
        sessions: Vec<String>,
    },
    /// `session.delete` without `force`, of a session that holds pinned
    /// checkpoints.
    #[error(
        "session {agent}/{session} holds {} pinned checkpoint{} ({}): deleting it would lose them; unpin them, or pass \"force\": true",
        .pinned.len(),
        plural(.pinned.len()),
        shown_list(.pinned)
    )]
    SessionHasPinned {
        agent: String,
        session: String,
        pinned: Vec<String>,
    },
    /// `session.rollback` without `kill_processes`, of a session whose
    /// programs still run.
    #[error(
        "session {agent}/{session} has {live} live processes (and sandboxes); stop them or pass \"kill_processes\": true"
    )]
    SessionBusy {
        agent: String,
        session: String,
        live: usize,
    },
    #[error(
        "checkpoint {agent}/{session}/{checkpoint} is pinned; unpin it first (checkpoint.pin with pinned=false)"
    )]
    CheckpointPinned {
        agent: String,
        session: String,
        checkpoint: String,
    },
    /// `turn.begin` while another turn of the session is open.
    /// What an operation read was deleted while it read it (a checkpoint
    /// an export was sending): said, not an internal failure.
    #[error("{0}")]
    ChangedDuring(String),
    /// A tree a diff read was replaced (a rollback) or deleted while it
    /// was read: what was read of it cannot be answered.
    #[error("{tree} of session {agent}/{session} was replaced or deleted while the diff read it (a rollback or a delete at the same time); try again")]
    TreeReplaced {
        agent: String,
        session: String,
        tree: String,
    },
    #[error("turn {turn} of session {agent}/{session} has not ended")]
    TurnOpen {
        agent: String,
        session: String,
        turn: String,
    },
    /// `turn.end` without a turn id, in a session with no open turn.
    #[error("session {agent}/{session} has no turn that has begun and not ended")]
    NoOpenTurn { agent: String, session: String },
    #[error("turn {agent}/{session}/{turn} has already ended")]
    TurnEnded {
        agent: String,
        session: String,
        turn: String,
    },
    #[error("{}", too_many_checkpoints(agent, session, *held, *adding, *most))]
    TooManyCheckpoints {
        agent: String,
        session: String,
        held: usize,
        adding: usize,
        most: usize,
    },
    /// A tree that would become a session's (an import's `current/` or
    /// checkpoints, a checkpoint rolled back or forked to) holding more
    /// than a session may here: the session could not take even an empty
    /// file. `what` names the tree, `undone` what was not done.
    #[error(
        "{what} holds {} MiB, more than a session may hold here \
         (--session-quota {} MiB); {undone}",
        holds.div_ceil(1 << 20),
        most / (1 << 20)
    )]
    OverQuota {
        what: String,
        holds: u64,
        most: u64,
        undone: &'static str,
    },
    #[error("a failed change could not be undone; the store refuses changes until the supervisor restarts")]
    Fenced,
    #[error("only {free_mib} MiB free, at least {need_mib} MiB are kept in reserve")]
    NoSpace { free_mib: u64, need_mib: u64 },
    /// A tool (`btrfs receive`) that stopped for want of space: what it
    /// said.
    #[error("{0}")]
    OutOfSpace(String),
    #[error("the store is read-only ({0}); fix that and restart the supervisor")]
    ReadOnly(String),
    #[error("store root {path} is unusable: {why}")]
    Root { path: String, why: String },
    #[error("disk quota")]
    Quota(#[source] BtrfsError),
    #[error("subvolume operation failed")]
    Btrfs(#[from] BtrfsError),
    #[error("index")]
    Index(#[from] IndexError),
    #[error("audit log")]
    Audit(#[from] AuditError),
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// A session archive that does not read or does not check (why is
    /// its source: the chain says it once).
    #[error("the session archive is refused")]
    Archive(#[from] crate::archive::ArchiveError),
    /// A session archive whose content is refused (a bad id, a stream the
    /// receiving side cannot apply), and why.
    #[error("the session archive is refused: {0}")]
    BadArchive(String),
    /// A session archive this daemon cannot serve (its session's network
    /// needs a plugin that is off), and why.
    #[error("the session archive is refused: {0}")]
    Unserved(String),
    /// An archive made against a checkpoint this session does not have as
    /// the sender had it.
    #[error("{0}")]
    BaseMismatch(String),
    /// An export that could not be written, and why.
    #[error("the export failed: {0}")]
    Export(String),
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
}

/// The refusal of checkpoints past a session's budget: what to delete
/// for a session that holds them, what is wrong for an archive that brings
/// more than a session may hold.
fn too_many_checkpoints(a: &str, s: &str, held: usize, adding: usize, most: usize) -> String {
    let budget = format!("at most {most} (the daemon's --session-checkpoints)");
    if held == 0 {
        return format!(
            "session {a}/{s} would hold {adding} checkpoints, and a session may hold {budget}: the archive brings too many"
        );
    }
    let more = if adding == 1 {
        "1 more is".to_string()
    } else {
        format!("{adding} more are")
    };
    format!(
        "session {a}/{s} holds {held} checkpoints and may hold {budget}: {more} refused; delete some (alloxctl checkpoint delete) or keep fewer turn checkpoints (alloxctl policy --keep-last)"
    )
}

impl StoreError {
    pub fn io(op: &'static str, path: &std::path::Path, source: io::Error) -> Self {
        StoreError::Io {
            op,
            path: path.display().to_string(),
            source,
        }
    }

    /// Whether the root cause is a full disk.
    pub fn is_no_space(&self) -> bool {
        if matches!(self, StoreError::NoSpace { .. } | StoreError::OutOfSpace(_)) {
            return true;
        }
        if let StoreError::Index(ie) = self {
            if let Some(e) = ie.os_error() {
                return matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT));
            }
        }
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cur {
            if let Some(io) = e.downcast_ref::<io::Error>() {
                if io.raw_os_error() == Some(libc::ENOSPC)
                    || io.raw_os_error() == Some(libc::EDQUOT)
                {
                    return true;
                }
            }
            cur = e.source();
        }
        false
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::InvalidId(_)
            | StoreError::BadLabel
            | StoreError::KeepLastZero
            | StoreError::NothingToUpdate
            | StoreError::BadCpuMax(_)
            | StoreError::BadLimit(_)
            | StoreError::Archive(_)
            | StoreError::BadArchive(_)
            | StoreError::OverQuota { .. } => ErrorCode::InvalidRequest,
            StoreError::NotFound(_) => ErrorCode::NotFound,
            StoreError::Exists(_)
            | StoreError::OnDiskNotIndexed(_)
            | StoreError::AgentHasSessions { .. }
            | StoreError::SessionHasPinned { .. }
            | StoreError::SessionBusy { .. }
            | StoreError::CheckpointPinned { .. }
            | StoreError::TurnOpen { .. }
            | StoreError::TreeReplaced { .. }
            | StoreError::ChangedDuring(_)
            | StoreError::NoOpenTurn { .. }
            | StoreError::TurnEnded { .. }
            | StoreError::BaseMismatch(_) => ErrorCode::Conflict,
            StoreError::Tree(TreeError::Limit { .. }) | StoreError::Unserved(_) => {
                ErrorCode::Unsupported
            }
            StoreError::Tree(TreeError::Changed { .. }) => ErrorCode::Conflict,
            _ if self.is_no_space() => ErrorCode::Unavailable,
            StoreError::Fenced
            | StoreError::ReadOnly(_)
            | StoreError::TooManyCheckpoints { .. } => ErrorCode::Unavailable,
            StoreError::Index(ie) if ie.needs_reopen() || matches!(ie, IndexError::Closed) => {
                ErrorCode::Unavailable
            }
            StoreError::Root { .. } => ErrorCode::Unavailable,
            _ => ErrorCode::Internal,
        }
    }

    /// The whole error chain, once.
    pub fn chain(&self) -> String {
        allox_protocol::error_chain(self)
    }

    pub fn to_body(&self) -> ErrorBody {
        let mut msg = self.chain();
        if self.is_no_space() {
            msg = format!("the store is out of space; free space and retry ({msg})");
        }
        ErrorBody::new(self.code(), msg)
    }
}

impl From<redb::Error> for StoreError {
    fn from(e: redb::Error) -> Self {
        StoreError::Index(IndexError::Db(e))
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The `s` of a plural.
fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each refusal says what is refused, in the words clients have always
    /// been shown, under its code.
    #[test]
    fn refusals_keep_their_messages_and_codes() {
        let a = || "a".to_string();
        let s = || "s".to_string();
        let cases = [
            (
                StoreError::BadLabel,
                ErrorCode::InvalidRequest,
                "label must be at most 256 bytes without control characters".to_string(),
            ),
            (
                StoreError::KeepLastZero,
                ErrorCode::InvalidRequest,
                "keep_last must be at least 1".into(),
            ),
            (
                StoreError::NothingToUpdate,
                ErrorCode::InvalidRequest,
                "session.update changes nothing: give pids_max, memory_max, cpu_max, idle_timeout_ms or max_lifetime_ms".into(),
            ),
            (
                StoreError::BadCpuMax("1 2 3".into()),
                ErrorCode::InvalidRequest,
                r#"cpu_max "1 2 3" must be "QUOTA PERIOD" or "max PERIOD" in microseconds"#.into(),
            ),
            (
                StoreError::OnDiskNotIndexed("/r/agents/a".into()),
                ErrorCode::Conflict,
                "/r/agents/a exists on disk but not in the index; restart the supervisor to reconcile".into(),
            ),
            (
                StoreError::AgentHasSessions {
                    agent: a(),
                    sessions: vec!["s".into()],
                },
                ErrorCode::Conflict,
                r#"agent a has 1 session (s): deleting it would lose their workspaces and checkpoints; delete them first, or pass "force": true"#.into(),
            ),
            (
                StoreError::SessionHasPinned {
                    agent: a(),
                    session: s(),
                    pinned: (1..=12).map(|i| format!("c{i}")).collect(),
                },
                ErrorCode::Conflict,
                r#"session a/s holds 12 pinned checkpoints (c1, c2, c3, c4, c5, c6, c7, c8, c9, c10 and 2 more): deleting it would lose them; unpin them, or pass "force": true"#.into(),
            ),
            (
                StoreError::SessionBusy {
                    agent: a(),
                    session: s(),
                    live: 3,
                },
                ErrorCode::Conflict,
                r#"session a/s has 3 live processes (and sandboxes); stop them or pass "kill_processes": true"#.into(),
            ),
            (
                StoreError::CheckpointPinned {
                    agent: a(),
                    session: s(),
                    checkpoint: "c".into(),
                },
                ErrorCode::Conflict,
                "checkpoint a/s/c is pinned; unpin it first (checkpoint.pin with pinned=false)".into(),
            ),
            (
                StoreError::TurnOpen {
                    agent: a(),
                    session: s(),
                    turn: "t".into(),
                },
                ErrorCode::Conflict,
                "turn t of session a/s has not ended".into(),
            ),
            (
                StoreError::NoOpenTurn {
                    agent: a(),
                    session: s(),
                },
                ErrorCode::Conflict,
                "session a/s has no turn that has begun and not ended".into(),
            ),
            (
                StoreError::TurnEnded {
                    agent: a(),
                    session: s(),
                    turn: "t".into(),
                },
                ErrorCode::Conflict,
                "turn a/s/t has already ended".into(),
            ),
        ];
        for (e, code, message) in cases {
            assert_eq!(e.code(), code, "{e}");
            assert_eq!(e.to_body().message, message);
        }
    }
}
