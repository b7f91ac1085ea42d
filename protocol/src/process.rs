//! Runs: programs started in a session's sandbox, their input, output,
//! terminal and end (`process.start|wait|kill|list|stdin|resize|attach|logs`).

use crate::target::target;
use serde::{Deserialize, Serialize};

/// Which output stream a chunk belongs to.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    Stdout,
    Stderr,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct OutputChunk {
    pub run_id: String,
    pub stream: StreamKind,
    /// Bytes; base64 in JSON.
    pub data: crate::Bytes,
}

/// `process.start`: run `argv` in the session's sandbox.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProcessStart {
    pub agent_id: String,
    pub session_id: String,
    /// Program and arguments; the program is looked up in the sandbox's
    /// `PATH` unless it contains a `/`.
    pub argv: Vec<String>,
    /// Extra environment, on top of the sandbox's own.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Working directory relative to the session's `current/`.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Written to the program's standard input, which is then closed
    /// (bytes; base64 in JSON). Without it, standard input stays open for
    /// `process.stdin`.
    #[serde(default)]
    pub stdin: Option<crate::Bytes>,
    /// Kill the run (its whole process tree) after this long.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Answer when the run ends, with its status and output.
    #[serde(default)]
    pub wait: bool,
    /// Over the binary protocol: send output as `Event::Output` while the
    /// run goes on (the answer then carries no output).
    #[serde(default)]
    pub stream: bool,
    /// Run the program on a terminal of the sandbox's own instead of
    /// pipes: its output (stdout and stderr together) comes as `stdout`.
    #[serde(default)]
    pub pty: Option<PtySize>,
    /// The tool call this run serves: with `--monitor-root` the run is
    /// recorded under that span; the run sees it as `TRACEPARENT`.
    #[serde(default)]
    pub trace: Option<Box<crate::TraceContext>>,
    /// What becomes of a run started with `wait` and `stream` when its
    /// client goes away before it ends (the connection closes, or a new
    /// conversation begins on the port): `keep` it running (the default),
    /// or `kill` it, as a foreground command dies with its terminal.
    #[serde(default)]
    pub on_disconnect: OnDisconnect,
    /// Observe the run under system-effects protocol v3: after B the
    /// session's workspace is restored to a baseline and C is captured
    /// (needs `--plugin system-effects`).
    #[serde(default)]
    pub recovery: Option<Box<ProcessRecovery>>,
}

target!(ProcessStart: agent_id, session_id);

/// `process.start`'s `recovery` (the seed's request, verbatim).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ProcessRecovery {
    /// The checkpoint to restore the workspace to: a full checkpoint id of
    /// the session, complete, equal to `current/` when the run starts.
    /// Without it a baseline is made and pinned before the run is
    /// released.
    #[serde(default)]
    pub checkpoint_id: Option<String>,
    /// Also reset the session's context (its namespaces and every process
    /// living in them) to what A recorded.
    #[serde(default)]
    pub scrub_runtime: bool,
    /// Keep the session fenced when A→C is not CONSISTENT (default true).
    #[serde(default = "yes")]
    pub require_consistent: bool,
}

fn yes() -> bool {
    true
}

/// A terminal's size, and its type (`TERM`, default `xterm-256color`).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
    #[serde(default)]
    pub term: Option<String>,
}

impl PtySize {
    /// `TERM` when none is given.
    pub const DEFAULT_TERM: &'static str = "xterm-256color";
}

/// `process.resize`: a new size for a run's terminal (its foreground
/// processes get `SIGWINCH`).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProcessResize {
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
    pub rows: u16,
    pub cols: u16,
}

target!(ProcessResize: agent_id, session_id, run_id);

/// `process.attach`: follow a terminal run's output again (binary
/// protocol): first what it wrote most recently (up to
/// [`ProcessAttach::REPLAY_MAX`] bytes, unless `replay` is false), then
/// what it writes from now on, as `Event::Output`; the answer comes when
/// the run ends, as `process.wait`'s.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProcessAttach {
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
    #[serde(default)]
    pub replay: Option<bool>,
}

target!(ProcessAttach: agent_id, session_id, run_id);

impl ProcessAttach {
    /// Recent output a terminal run keeps for those who attach.
    pub const REPLAY_MAX: usize = 64 << 10;
}

/// `process.logs`: a run's output, with or without a terminal, live or
/// ended (while the supervisor keeps it): what is kept of it, then, with
/// `follow`, what it writes from now on as `Event::Output`, each byte
/// once, until it ends.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProcessLogs {
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
    #[serde(default)]
    pub follow: bool,
}

target!(ProcessLogs: agent_id, session_id, run_id);

/// What `process.logs` answers.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct RunLogs {
    pub run_id: String,
    /// The output kept that was not sent as events (empty when `follow`
    /// sent it all as events).
    pub stdout: crate::Bytes,
    pub stderr: crate::Bytes,
    /// Some output was not kept: the capture limit, the finished runs'
    /// budget, or a run streamed to a client that took it.
    pub truncated: bool,
    /// How it ended, once it has (its output is above, not here).
    pub result: Option<RunResult>,
}

/// `process.wait`: the end of a run.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProcessWait {
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

target!(ProcessWait: agent_id, session_id, run_id);

/// `process.kill`: one run's process tree, or the whole session.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProcessKill {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub run_id: Option<String>,
    /// Signal number; default SIGKILL. Every process of the run (or of
    /// the session's runs) gets it, whatever it forked; the sandboxes'
    /// own PID 1s are not signalled.
    #[serde(default)]
    pub signal: Option<i32>,
}

target!(ProcessKill: agent_id, session_id, run_id);

/// What becomes of a streamed run when its client goes away.
#[derive(
    Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum OnDisconnect {
    /// It goes on; `process.attach` or `process.wait` find it again.
    #[default]
    Keep,
    /// It is killed (its whole cgroup).
    Kill,
}

/// `process.stdin`: write to a run's standard input, or close it.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProcessStdin {
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
    /// Bytes; base64 in JSON.
    #[serde(default)]
    pub data: crate::Bytes,
    #[serde(default)]
    pub close: bool,
}

target!(ProcessStdin: agent_id, session_id, run_id);

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct RunStarted {
    pub run_id: String,
    /// PID in the supervisor's PID namespace.
    pub pid: i32,
}

/// How a run ended.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct RunResult {
    pub run_id: String,
    /// Exit code if the program exited.
    pub exit_code: Option<i32>,
    /// Signal number if it was killed.
    pub signal: Option<i32>,
    /// Output captured (empty for streamed runs), as text: bytes that are
    /// not UTF-8 are replaced by U+FFFD, and `output_lossy` says so (the
    /// exact bytes are in `process.logs`, and a streamed run's events).
    pub stdout: String,
    pub stderr: String,
    /// Whether captured output was cut at the capture limit.
    pub truncated: bool,
    /// Whether the run was killed because its timeout passed.
    pub timed_out: bool,
    /// Whether the captured output was dropped after the run ended, to keep
    /// the finished runs' output within the supervisor's budget (oldest
    /// runs first): `stdout` and `stderr` are then empty, the status stays.
    #[serde(default)]
    pub output_dropped: bool,
    /// What the run used (its cgroup's figures when it ended); `None` if
    /// they could not be read.
    #[serde(default)]
    pub usage: Option<crate::Usage>,
    /// Whether the OOM killer killed a process of the run (its cgroup's
    /// `memory.events`); `None` without the memory controller.
    #[serde(default)]
    pub oom_killed: Option<bool>,
    /// With the `system-effects` plugin: what the run changed outside its
    /// workspace, and the verdict of the evidence.
    #[serde(default)]
    pub effects: Option<Box<crate::RunEffects>>,
    /// Whether `stdout` or `stderr` held bytes that are not UTF-8, replaced
    /// by U+FFFD in this answer (binary output read through `exec` was
    /// changed without a word).
    #[serde(default)]
    pub output_lossy: bool,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct ProcessInfo {
    pub pid: i32,
    pub ppid: i32,
    pub argv: Vec<String>,
    /// The run the process belongs to (its own or an ancestor's).
    pub run_id: Option<String>,
    /// Start time, milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// Whether `argv` was cut at [`ProcessInfo::ARGV_MAX`] bytes.
    #[serde(default)]
    pub argv_truncated: bool,
}

impl ProcessInfo {
    /// Bytes of a process's command line (its arguments and their NUL
    /// terminators, as the kernel counts them) a listing carries.
    pub const ARGV_MAX: usize = 4 << 10;
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct ProcessListing {
    /// Sorted by PID; at most [`ProcessListing::MAX_ENTRIES`] and
    /// [`ProcessListing::MAX_BYTES`] (see `truncated`).
    pub processes: Vec<ProcessInfo>,
    /// Whether processes were left out (those with the highest PIDs) to
    /// keep the answer within its bounds.
    #[serde(default)]
    pub truncated: bool,
    /// What plugins say about each listed run started by this supervisor
    /// (run id → `plugin.key` → value); runs without any are left out.
    #[serde(default)]
    pub run_metadata:
        std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
}

impl ProcessListing {
    /// Processes in one answer.
    pub const MAX_ENTRIES: usize = 4096;
    /// Encoded size of the processes of one answer: well inside one frame
    /// ([`crate::MAX_FRAME`]).
    pub const MAX_BYTES: usize = 768 << 10;
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct Killed {
    /// Processes that were signalled.
    pub killed: u32,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct StdinWritten {
    pub written: u64,
    pub closed: bool,
}

/// A terminal's new size.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct Resized {
    pub run_id: String,
    pub rows: u16,
    pub cols: u16,
}
