//! The process tracker (the `process-tree` plugin): every fork, exec and
//! exit in a session's sandboxes, as events and as a lineage tree
//! (`process.events`, `process.tree`).

use crate::target::target;
use serde::{Deserialize, Serialize};

/// `process.events`: what the process tracker recorded, oldest first,
/// filtered by agent, session and run; `cursor` continues after the last
/// event of an earlier answer. With `follow`, matching events keep coming
/// as stream events after the answer's backlog, until the client goes.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct ProcessEvents {
    #[serde(default)]
    pub agent_id: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub run_id: Option<String>,
    /// Sequence number to continue after (exclusive).
    #[serde(default)]
    pub cursor: Option<u64>,
    /// Most events in the answer (default 1,000, at most 10,000).
    #[serde(default)]
    pub limit: Option<u32>,
    #[serde(default)]
    pub follow: bool,
}

target!(ProcessEvents: agent_id, session_id, run_id);

/// `process.tree`: the lineage of a session's (or one run's) processes,
/// live and exited, from the tracker's events.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProcessTreeRequest {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub run_id: Option<String>,
}

target!(ProcessTreeRequest: agent_id, session_id, run_id);

/// What happened to a process.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum ProcessEventKind {
    Fork,
    Exec,
    Exit,
    /// The event store reached its cap and dropped its oldest events.
    Evicted,
}

/// One event of the process tracker, attributed in the kernel to the
/// agent, session and run whose sandbox the process descends from.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct ProcessEvent {
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    pub kind: ProcessEventKind,
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
    /// The process and its parent as the sandbox sees them (its own PID
    /// namespace), and as the host kernel does.
    pub pid: u32,
    pub ppid: u32,
    pub host_pid: u32,
    pub host_ppid: u32,
    pub comm: String,
    /// `exec`: the program.
    pub filename: Option<String>,
    /// `exit`: the exit code, or the signal that ended it.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// `evicted`: how many events were dropped, oldest first.
    pub evicted: Option<u64>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct ProcessEventListing {
    pub events: Vec<ProcessEvent>,
    /// Pass as `cursor` to continue.
    pub next_cursor: u64,
    /// Events the kernel could not hand over (ring buffer full), in all.
    pub lost: u64,
    /// Events dropped from the store at its cap, in all.
    pub evicted: u64,
}

/// One process in a lineage tree.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct ProcessNode {
    pub pid: u32,
    pub host_pid: u32,
    pub run_id: String,
    pub comm: String,
    /// Programs it executed, in order.
    pub execs: Vec<String>,
    pub started_ms: u64,
    pub ended_ms: Option<u64>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub children: Vec<ProcessNode>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct ProcessTreeListing {
    pub roots: Vec<ProcessNode>,
}
