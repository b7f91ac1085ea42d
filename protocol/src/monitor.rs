//! What runs and sessions cost, from their cgroups: CPU time, memory,
//! I/O and OOM kills (`RunResult.usage`, `session.stats`), and changing a
//! live session's limits (`session.update`). A figure whose controller the
//! kernel does not offer there is `None`, never a guess.

use serde::{Deserialize, Serialize};

/// What a cgroup (a run's, a session's) used.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time in user and kernel mode (`cpu.stat`), µs.
    pub cpu_user_us: Option<u64>,
    pub cpu_system_us: Option<u64>,
    /// The most memory it held at once (`memory.peak`), bytes.
    pub memory_peak_bytes: Option<u64>,
    /// Bytes read and written on block devices (`io.stat`).
    pub io_read_bytes: Option<u64>,
    pub io_write_bytes: Option<u64>,
    /// Processes the OOM killer killed in it (`memory.events` `oom_kill`).
    pub oom_kills: Option<u64>,
}

/// `session.stats`: what a session uses now and has used in total.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionStatsRequest {
    pub agent_id: String,
    pub session_id: String,
}

/// A session's limits as its cgroup has them (`None`: no limit, or no
/// controller).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionLimits {
    pub pids_max: Option<u64>,
    pub memory_max: Option<u64>,
    /// `"QUOTA PERIOD"` in µs.
    pub cpu_max: Option<String>,
}

/// The answer to `session.stats` and `session.update`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SessionStats {
    pub agent_id: String,
    pub session_id: String,
    /// Runs going on, and their programs (the sandboxes' PID 1s not
    /// counted).
    pub live_runs: u32,
    pub processes: u32,
    /// Memory held now (`memory.current`), bytes.
    pub memory_current_bytes: Option<u64>,
    /// What the live runs used so far.
    pub now: Usage,
    /// Each live run's part of `now`.
    pub runs: Vec<RunUsage>,
    /// What the session's cgroup used since it was made (its runs that
    /// ended included).
    pub total: Usage,
    pub limits: SessionLimits,
}

/// What one live run used so far.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct RunUsage {
    pub run_id: String,
    pub usage: Usage,
    /// Memory it holds now (`memory.current`), bytes.
    pub memory_current_bytes: Option<u64>,
}

/// `session.update`: changes a live session's limits (those given; the
/// others stay).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct SessionUpdate {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub pids_max: Option<u64>,
    #[serde(default)]
    pub memory_max: Option<u64>,
    #[serde(default)]
    pub cpu_max: Option<String>,
}
