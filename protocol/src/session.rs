//! Sessions: an agent's working trees, each a `current/` with its own
//! limits and network (`session.create`, `session.list`,
//! `session.delete`, `session.rollback`, `session.fork`, `session.pause`,
//! `session.resume`).

use crate::target::target;
use serde::{Deserialize, Serialize};

/// `session.delete`: the session, its workspace and checkpoints. Refused
/// (`conflict`, naming them) while it holds pinned checkpoints, unless
/// `force`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionDelete {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub force: bool,
}

target!(SessionDelete: agent_id, session_id);

impl SessionDelete {
    pub fn new(agent_id: impl Into<String>, session_id: impl Into<String>) -> Self {
        SessionDelete {
            agent_id: agent_id.into(),
            session_id: session_id.into(),
            force: false,
        }
    }
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionRef {
    pub agent_id: String,
    pub session_id: String,
}

target!(SessionRef: agent_id, session_id);

/// `session.create`, with optional resource limits for the session's
/// cgroup (refused with `unsupported` where the controller is missing).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionCreate {
    pub agent_id: String,
    pub session_id: String,
    /// `pids.max`: most processes at once.
    #[serde(default)]
    pub pids_max: Option<u64>,
    /// `memory.max` in bytes.
    #[serde(default)]
    pub memory_max: Option<u64>,
    /// `cpu.max` as cgroup v2 writes it: `"QUOTA PERIOD"` in µs, or
    /// `"max PERIOD"`.
    #[serde(default)]
    pub cpu_max: Option<String>,
    /// Checkpoint automatically (a baseline now, one per successful turn);
    /// `None` takes the agent's policy.
    #[serde(default)]
    pub auto_checkpoint: Option<bool>,
    /// Keep only the last N automatic turn checkpoints.
    #[serde(default)]
    pub keep_last: Option<u32>,
    /// Its network mode; `None` takes the agent's, then the daemon's.
    /// Fixed for the session's life (rollbacks keep it).
    #[serde(default)]
    pub network: Option<crate::NetworkMode>,
    /// Its own egress rules (narrowing the agent's and the daemon's).
    #[serde(default)]
    pub egress: Option<crate::Egress>,
    /// Paused (reason `idle`) after this long without a request for it
    /// and without CPU used by its processes; `None` takes the daemon's
    /// (`--idle-timeout-ms`).
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
    /// Expired this long after it is made: its processes killed, changes
    /// refused until `session.update` gives it more time (its files and
    /// checkpoints kept); `None` takes the daemon's (`--max-lifetime-ms`).
    #[serde(default)]
    pub max_lifetime_ms: Option<u64>,
}

target!(SessionCreate: agent_id, session_id);

impl SessionCreate {
    /// A session without limits of its own.
    pub fn new(agent_id: impl Into<String>, session_id: impl Into<String>) -> Self {
        SessionCreate {
            agent_id: agent_id.into(),
            session_id: session_id.into(),
            pids_max: None,
            memory_max: None,
            cpu_max: None,
            auto_checkpoint: None,
            keep_last: None,
            network: None,
            egress: None,
            idle_timeout_ms: None,
            max_lifetime_ms: None,
        }
    }
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionRollback {
    pub agent_id: String,
    pub session_id: String,
    pub checkpoint_id: String,
    /// Kill the session's processes first; `None` takes the daemon default.
    #[serde(default)]
    pub kill_processes: Option<bool>,
}

target!(SessionRollback: agent_id, session_id, checkpoint_id);

/// `session.fork`: a new session whose `current/` is a writable snapshot
/// of a checkpoint of the source session, or of its `current/` as it is at
/// that instant (`from: "current"`). The new session's history starts at a
/// baseline checkpoint (origin `fork`, named [`FORK_BASELINE`]) that
/// records where it came from; the source's network mode and egress rules,
/// checkpoint policy and limits are copied; runs are not. The source may be
/// another agent's session (`new_agent_id`): a host action only.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionFork {
    /// The source session's agent.
    pub agent_id: String,
    /// The source session.
    pub session_id: String,
    /// A checkpoint of the source session, or `current`.
    pub from: String,
    /// The new session's agent; the source's agent when left out.
    #[serde(default)]
    pub new_agent_id: Option<String>,
    pub new_session_id: String,
    /// Free text for the baseline checkpoint, at most 256 bytes.
    #[serde(default)]
    pub label: Option<String>,
}

/// The id of a forked session's first checkpoint.
pub const FORK_BASELINE: &str = "fork";

target!(SessionFork, |r| format!(
    "{}/{}/{}->{}/{}",
    r.agent_id,
    r.session_id,
    r.from,
    r.new_agent_id.as_deref().unwrap_or(&r.agent_id),
    r.new_session_id
));

/// `session.pause`: every process of the session and of its context
/// frozen (`cgroup.freeze`, waited for, bounded). A request that needs the
/// session to run (`process.*` but `list` and `logs`, `fs.*` writes,
/// `turn.*`) resumes it first, by itself, unless it was paused with
/// `hold`: then such a request is refused (`conflict`) until
/// `session.resume`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionPause {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub hold: bool,
}

target!(SessionPause: agent_id, session_id);

/// Why and since when a session is paused.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct PauseInfo {
    pub since_ms: u64,
    /// `request` (`session.pause`), `idle` (its idle timeout), or
    /// `earlier supervisor` (found frozen at start; `since_ms` 0).
    pub reason: String,
    /// Requests that need it to run are refused instead of resuming it.
    pub hold: bool,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct SessionInfo {
    pub agent_id: String,
    pub session_id: String,
    pub created_ms: u64,
    /// The checkpoint `current/` descends from, if any.
    pub head: Option<String>,
    pub checkpoints: u32,
    /// Absolute path of the session's `current/`.
    pub current: String,
    /// Set while the session is paused (`session.pause`, or idle).
    #[serde(default)]
    pub paused: Option<PauseInfo>,
    /// Its idle timeout, if it has one.
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
    /// When its lifetime ends, if it has one.
    #[serde(default)]
    pub expires_ms: Option<u64>,
    /// When it expired: its changes are refused until `session.update`
    /// gives it more time.
    #[serde(default)]
    pub expired_ms: Option<u64>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct SessionListing {
    pub agent_id: String,
    pub sessions: Vec<SessionInfo>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct RollbackDone {
    pub agent_id: String,
    pub session_id: String,
    pub checkpoint_id: String,
    /// The head before the rollback.
    pub previous_head: Option<String>,
    /// Processes killed before the rollback.
    pub killed_processes: u32,
}

/// `session.export`: the session with its whole checkpoint history (its
/// manifest and a Btrfs send stream of each checkpoint and of `current/`,
/// taken when the export begins) as an archive, streamed as
/// [`crate::Event::Archive`] events and answered with
/// [`SessionExported`]. With `since`, only the checkpoints made after that
/// one, and `current/` relative to it. No process state travels.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionExport {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub since: Option<String>,
}

target!(SessionExport: agent_id, session_id);

/// The next bytes of a `session.export`'s archive.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct ArchiveChunk {
    pub data: crate::Bytes,
}

/// The answer to `session.export`, after the last chunk.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct SessionExported {
    pub agent_id: String,
    pub session_id: String,
    /// The archive's length.
    pub bytes: u64,
    pub checkpoints: u32,
}

/// `session.import`: an archive of `session.export`, sent in pieces under
/// an `import_id` the client chooses, each at its `offset` (the bytes sent
/// so far). The piece with `commit` makes the session appear in agent
/// `agent_id` (which must exist) as `session_id` (else the archive's own)
/// in one step, or not at all; `abort` drops an import. An import idle for
/// five minutes is dropped, and nothing of it stays.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionImport {
    pub agent_id: String,
    #[serde(default)]
    pub session_id: Option<String>,
    pub import_id: String,
    #[serde(default)]
    pub offset: u64,
    #[serde(default)]
    pub data: crate::Bytes,
    #[serde(default)]
    pub commit: bool,
    #[serde(default)]
    pub abort: bool,
}

target!(SessionImport, |r| format!(
    "{}/{}",
    r.agent_id,
    r.session_id.as_deref().unwrap_or("-")
));

/// The answer to each piece of `session.import`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct SessionImported {
    pub import_id: String,
    /// Bytes received so far.
    pub received: u64,
    /// The new session, once committed.
    pub session: Option<Box<SessionInfo>>,
    /// Its checkpoints, once committed.
    pub checkpoints: u32,
    /// Once committed: how many privileges of the archive's files were
    /// dropped on the way in — setuid and setgid bits of modes, extended
    /// attributes only a privileged process sets (`security.*`, file
    /// capabilities among them, and `trusted.*`). No file of a session
    /// holds one; an agent's `chmod g+s` in its session does not keep the
    /// session from moving.
    #[serde(default)]
    pub privileges_dropped: u64,
}
