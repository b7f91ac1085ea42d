//! Messages: the handshake, the request envelope and every request and
//! response type.
//!
//! Variants are only ever appended: their index is their wire identity.

use crate::error::ErrorBody;
use serde::{Deserialize, Serialize};

/// First frame of a connection, both ways.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: u32,
    pub build: String,
    /// Chosen at random by the client for this conversation and echoed in
    /// the Welcome; every later frame of the conversation, both ways,
    /// carries it. A serial port outlives its hosts: a frame stamped with
    /// another conversation belongs to a host that has gone.
    pub conversation: u64,
}

impl Hello {
    /// This build's greeting for `conversation`.
    pub fn new(conversation: u64) -> Hello {
        Hello {
            version: crate::PROTOCOL_VERSION,
            build: crate::build_identity(),
            conversation,
        }
    }
}

/// Frames a client sends.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum ClientFrame {
    Hello(Hello),
    Request(RequestEnvelope),
}

/// Frames a server sends.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum ServerFrame {
    /// The handshake was accepted.
    Welcome(Hello),
    /// The handshake was refused (`version_mismatch`); the server closes.
    Refused(ErrorBody),
    /// The answer to one request.
    Response(ResponseEnvelope),
    /// A stream event belonging to a request that is still going on.
    Event(EventEnvelope),
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RequestEnvelope {
    /// The conversation of the Hello this request follows.
    pub conversation: u64,
    /// Chosen by the client, echoed in every frame about this request.
    pub request_id: u64,
    pub request: Request,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ResponseEnvelope {
    /// The conversation the request came in; 0 for a notice to whoever
    /// is there (the supervisor restarted).
    pub conversation: u64,
    /// The request this answers; 0 when the server could not read one.
    pub request_id: u64,
    pub outcome: Outcome,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Outcome {
    Ok(Response),
    Err(ErrorBody),
}

impl From<Result<Response, ErrorBody>> for Outcome {
    fn from(r: Result<Response, ErrorBody>) -> Self {
        match r {
            Ok(v) => Outcome::Ok(v),
            Err(e) => Outcome::Err(e),
        }
    }
}

impl From<Outcome> for Result<Response, ErrorBody> {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Ok(v) => Ok(v),
            Outcome::Err(e) => Err(e),
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct EventEnvelope {
    pub conversation: u64,
    pub request_id: u64,
    pub event: Event,
}

/// Stream events. Later capabilities append variants. In JSON (the
/// gateway's NDJSON streams) an event is an object with one key, the
/// variant's snake_case name: `{"output": {...}}`; postcard carries the
/// variant's index, so the names are not on the binary wire.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// Free-form progress note.
    Progress { message: String },
    /// A run started (sent before any output of a streamed run).
    Started(RunStarted),
    /// A piece of a streamed run's output, in order per stream.
    Output(OutputChunk),
    /// A process event of a `process.events` subscription (`follow`).
    Process(ProcessEvent),
    /// A connection attempt of a `network.audit` subscription (`follow`).
    Network(crate::NetworkAuditRecord),
    /// A change an `fs.watch` reports.
    Fs(crate::FsEvent),
    /// A span or run of a `monitor.records` subscription (`follow`).
    Monitor(crate::MonitorRecord),
}

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

// ---------------------------------------------------------------------------
// Request parameters
// ---------------------------------------------------------------------------

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Ping {}

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

/// `system.info`: the machine as the supervisor sees it.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct SystemInfoRequest {}

/// `plugin.list`: the plugins loaded, in load order, and the ones
/// installed (compiled in), enabled or not.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct PluginListRequest {}

/// `store.check`: compare the index with the subvolumes on disk and say
/// what the journal still holds (read-only).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct StoreCheckRequest {}

/// `system.shutdown`: stop the supervisor in order (refuse new work, kill
/// every session's processes, flush the store); as the guest's PID 1's
/// child, the VM then powers off.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Shutdown {}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentRef {
    pub agent_id: String,
}

/// `agent.delete`: the agent, its sessions, checkpoints and `shared/`.
/// Refused (`conflict`, naming what would be lost) while it has sessions,
/// unless `force`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentDelete {
    pub agent_id: String,
    #[serde(default)]
    pub force: bool,
}

impl AgentDelete {
    pub fn new(agent_id: impl Into<String>) -> Self {
        AgentDelete {
            agent_id: agent_id.into(),
            force: false,
        }
    }
}

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

impl SessionDelete {
    pub fn new(agent_id: impl Into<String>, session_id: impl Into<String>) -> Self {
        SessionDelete {
            agent_id: agent_id.into(),
            session_id: session_id.into(),
            force: false,
        }
    }
}

/// `agent.create`, with the agent's automatic-checkpoint policy (the
/// default of its sessions).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentCreate {
    pub agent_id: String,
    #[serde(default)]
    pub auto_checkpoint: Option<bool>,
    #[serde(default)]
    pub keep_last: Option<u32>,
    /// The network mode of its sessions that do not name one.
    #[serde(default)]
    pub network: Option<crate::NetworkMode>,
    /// Egress rules for every session of it.
    #[serde(default)]
    pub egress: Option<crate::Egress>,
}

impl AgentCreate {
    /// An agent without a policy of its own.
    pub fn new(agent_id: impl Into<String>) -> Self {
        AgentCreate {
            agent_id: agent_id.into(),
            auto_checkpoint: None,
            keep_last: None,
            network: None,
            egress: None,
        }
    }
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct AgentList {}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionRef {
    pub agent_id: String,
    pub session_id: String,
}

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
}

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
        }
    }
}

/// How a turn ended.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    Ok,
    Failed,
    Cancelled,
}

/// `turn.begin`: an agent framework starts a turn of a session.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TurnBegin {
    pub agent_id: String,
    pub session_id: String,
    /// Chosen by the caller, or made up (`turn-<n>`).
    #[serde(default)]
    pub turn_id: Option<String>,
}

/// `turn.end`: the turn is over.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TurnEnd {
    pub agent_id: String,
    pub session_id: String,
    /// The turn to end; empty or left out: the session's open turn.
    #[serde(default)]
    pub turn_id: String,
    pub status: TurnStatus,
    /// Label of the automatic checkpoint.
    #[serde(default)]
    pub label: Option<String>,
}

/// `checkpoint.diff`: what changed between two checkpoints of a session
/// (`current` names the session's `current/`).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointDiff {
    pub agent_id: String,
    pub session_id: String,
    pub from: String,
    pub to: String,
    /// Also answer each changed file's contents, as `git diff` shows
    /// them, in its change's `patch` (within the answer's bounds).
    #[serde(default)]
    pub patch: bool,
}

/// `policy.set`: automatic checkpoints for an agent (default of its
/// sessions) or one session.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicySet {
    pub agent_id: String,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub auto_checkpoint: Option<bool>,
    #[serde(default)]
    pub keep_last: Option<u32>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRef {
    pub agent_id: String,
    pub session_id: String,
    pub checkpoint_id: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointCreate {
    pub agent_id: String,
    pub session_id: String,
    pub checkpoint_id: String,
    /// A pinned checkpoint cannot be deleted until it is unpinned.
    #[serde(default)]
    pub pinned: bool,
    /// Free text for people, at most 256 bytes.
    #[serde(default)]
    pub label: Option<String>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointPin {
    pub agent_id: String,
    pub session_id: String,
    pub checkpoint_id: String,
    pub pinned: bool,
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

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct AuditList {
    /// The oldest records with a sequence number above this (paging
    /// forward).
    #[serde(default)]
    pub after_seq: Option<u64>,
    /// At most this many records (default 100, at most 10,000).
    #[serde(default)]
    pub limit: Option<u32>,
    /// The newest records with a sequence number below this (paging back).
    /// With neither cursor, the newest records of all.
    #[serde(default)]
    pub before_seq: Option<u64>,
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

/// How the supervisor serves an action: the column of the request table
/// ([`Request::ROUTES`]) that decides every route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// By the core, on a blocking thread: store work that may take a while
    /// (a checkpoint, a diff, a file write).
    Core,
    /// By the core, on its I/O task: runs, waits and streams, which hold
    /// no thread while they wait.
    CoreAsync,
    /// By the named plugin, when it is enabled; refused naming it when not.
    Plugin(&'static str),
}

impl Route {
    /// The plugin that serves it, if a plugin does.
    pub fn plugin(self) -> Option<&'static str> {
        match self {
            Route::Plugin(p) => Some(p),
            Route::Core | Route::CoreAsync => None,
        }
    }
}

/// One action as the API describes it.
pub struct Action {
    pub name: &'static str,
    pub mutating: bool,
    /// A `$ref` to its params' schema.
    pub params: schemars::Schema,
    /// The [`Response`] variants it answers with.
    pub answers: &'static [&'static str],
}

macro_rules! requests {
    ($( $(#[$doc:meta])* $variant:ident($ty:ty) = $name:literal, mutating = $m:literal, route = $route:ident $(($plugin:literal))?, answers = [$($answer:ident),*]; )*) => {
        /// Every request. The JSON action name is given beside each variant.
        #[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
        pub enum Request {
            $( $(#[$doc])* $variant($ty), )*
        }

        impl Request {
            /// All action names, in wire order.
            pub const ACTIONS: &'static [&'static str] = &[$($name),*];

            /// The action name (`"agent.create"`, ...).
            pub fn action(&self) -> &'static str {
                match self { $( Request::$variant(_) => $name, )* }
            }

            /// Every action and how it is served, in wire order: the one
            /// table the supervisor routes by.
            pub const ROUTES: &'static [(&'static str, Route)] = &[$(($name, Route::$route $(($plugin))?)),*];

            /// How the supervisor serves this request.
            pub fn route(&self) -> Route {
                match self { $( Request::$variant(_) => Route::$route $(($plugin))?, )* }
            }

            /// Whether the request changes state (and so is audited).
            pub fn is_mutating(&self) -> bool {
                match self { $( Request::$variant(_) => $m, )* }
            }

            /// Builds a request from its JSON form.
            pub fn from_json(action: &str, params: serde_json::Value) -> Result<Self, ErrorBody> {
                let params = if params.is_null() { serde_json::json!({}) } else { params };
                match action {
                    $( $name => serde_json::from_value::<$ty>(params)
                        .map(Request::$variant)
                        .map_err(|e| ErrorBody::invalid(format!("bad params for {}: {e}", $name))), )*
                    other => Err(ErrorBody::invalid(format!(
                        "unknown action {other:?}; known actions: {}",
                        Self::ACTIONS.join(", ")
                    ))),
                }
            }

            /// The JSON `params` object of this request.
            pub fn params_json(&self) -> serde_json::Value {
                let v = match self { $( Request::$variant(p) => serde_json::to_value(p), )* };
                v.unwrap_or(serde_json::Value::Null)
            }

            /// Every action as the API describes it: its name, whether it
            /// changes state, the schema of its params (made by `schemas`)
            /// and the [`Response`] variants it answers with (none: it
            /// only streams until its client goes).
            pub fn api(schemas: &mut schemars::SchemaGenerator) -> Vec<Action> {
                vec![$( Action {
                    name: $name,
                    mutating: $m,
                    params: schemas.subschema_for::<$ty>(),
                    answers: &[$(stringify!($answer)),*],
                }, )*]
            }
        }
    };
}

requests! {
    /// Liveness and version check; answered with `Pong`.
    Ping(Ping) = "system.ping", mutating = false, route = Core, answers = [Pong];
    AgentCreate(AgentCreate) = "agent.create", mutating = true, route = Core, answers = [Agent];
    AgentList(AgentList) = "agent.list", mutating = false, route = Core, answers = [Agents];
    AgentDelete(AgentDelete) = "agent.delete", mutating = true, route = Core, answers = [Deleted];
    SessionCreate(SessionCreate) = "session.create", mutating = true, route = Core, answers = [Session];
    SessionList(AgentRef) = "session.list", mutating = false, route = Core, answers = [Sessions];
    SessionDelete(SessionDelete) = "session.delete", mutating = true, route = Core, answers = [Deleted];
    CheckpointCreate(CheckpointCreate) = "checkpoint.create", mutating = true, route = Core, answers = [Checkpoint];
    CheckpointList(SessionRef) = "checkpoint.list", mutating = false, route = Core, answers = [Checkpoints];
    CheckpointDelete(CheckpointRef) = "checkpoint.delete", mutating = true, route = Core, answers = [Deleted];
    CheckpointPin(CheckpointPin) = "checkpoint.pin", mutating = true, route = Core, answers = [Checkpoint];
    SessionRollback(SessionRollback) = "session.rollback", mutating = true, route = Core, answers = [RolledBack];
    AuditList(AuditList) = "audit.list", mutating = false, route = Core, answers = [Audit];
    ProcessStart(ProcessStart) = "process.start", mutating = true, route = CoreAsync, answers = [Started, Exited];
    ProcessWait(ProcessWait) = "process.wait", mutating = false, route = CoreAsync, answers = [Exited];
    ProcessKill(ProcessKill) = "process.kill", mutating = true, route = CoreAsync, answers = [Killed];
    ProcessList(SessionRef) = "process.list", mutating = false, route = CoreAsync, answers = [Processes];
    ProcessStdin(ProcessStdin) = "process.stdin", mutating = false, route = CoreAsync, answers = [StdinWritten];
    TurnBegin(TurnBegin) = "turn.begin", mutating = true, route = Core, answers = [Turn];
    TurnEnd(TurnEnd) = "turn.end", mutating = true, route = Core, answers = [Turn];
    PolicySet(PolicySet) = "policy.set", mutating = true, route = Core, answers = [Policy];
    CheckpointDiff(CheckpointDiff) = "checkpoint.diff", mutating = false, route = Core, answers = [Diff];
    Shutdown(Shutdown) = "system.shutdown", mutating = true, route = Core, answers = [Stopping];
    SystemInfo(SystemInfoRequest) = "system.info", mutating = false, route = Core, answers = [System];
    ProcessEvents(ProcessEvents) = "process.events", mutating = false, route = Plugin("process-tree"), answers = [ProcessEvents];
    ProcessTree(ProcessTreeRequest) = "process.tree", mutating = false, route = Plugin("process-tree"), answers = [ProcessTree];
    StoreCheck(StoreCheckRequest) = "store.check", mutating = false, route = Core, answers = [StoreCheck];
    PluginList(PluginListRequest) = "plugin.list", mutating = false, route = Core, answers = [Plugins];
    NetworkPolicySet(crate::NetworkPolicySet) = "network.policy.set", mutating = true, route = Plugin("network"), answers = [NetworkPolicy];
    NetworkPolicyGet(crate::NetworkPolicyGet) = "network.policy.get", mutating = false, route = Plugin("network"), answers = [NetworkPolicy];
    NetworkAudit(crate::NetworkAudit) = "network.audit", mutating = false, route = Plugin("network"), answers = [NetworkAudit];
    FsStat(crate::FsStat) = "fs.stat", mutating = false, route = Core, answers = [FsEntry];
    FsList(crate::FsList) = "fs.list", mutating = false, route = Core, answers = [FsListing];
    FsRead(crate::FsRead) = "fs.read", mutating = false, route = Core, answers = [FsData];
    FsWrite(crate::FsWrite) = "fs.write", mutating = true, route = Core, answers = [FsWritten];
    FsMkdir(crate::FsMkdir) = "fs.mkdir", mutating = true, route = Core, answers = [FsEntry];
    FsRemove(crate::FsRemove) = "fs.remove", mutating = true, route = Core, answers = [Deleted];
    FsMove(crate::FsMove) = "fs.move", mutating = true, route = Core, answers = [FsEntry];
    FsWatch(crate::FsWatch) = "fs.watch", mutating = false, route = CoreAsync, answers = [];
    ProcessResize(ProcessResize) = "process.resize", mutating = false, route = CoreAsync, answers = [Resized];
    ProcessAttach(ProcessAttach) = "process.attach", mutating = false, route = CoreAsync, answers = [Exited];
    ShareList(crate::ShareList) = "share.list", mutating = false, route = Plugin("share"), answers = [Shares];
    ShareAgentSet(crate::ShareAgentSet) = "share.agent.set", mutating = true, route = Plugin("share"), answers = [ShareAgent];
    ShareSessionSet(crate::ShareSessionSet) = "share.session.set", mutating = true, route = Plugin("share"), answers = [Share];
    SessionStats(crate::SessionStatsRequest) = "session.stats", mutating = false, route = CoreAsync, answers = [SessionStats];
    SessionUpdate(crate::SessionUpdate) = "session.update", mutating = true, route = Core, answers = [SessionStats];
    MonitorIngest(crate::MonitorIngest) = "monitor.ingest", mutating = false, route = Plugin("monitor"), answers = [MonitorIngested];
    MonitorRecords(crate::MonitorRecords) = "monitor.records", mutating = false, route = Plugin("monitor"), answers = [MonitorRecords];
    MonitorSummary(crate::MonitorSummaryRequest) = "monitor.summary", mutating = false, route = Plugin("monitor"), answers = [MonitorSummary];
    MonitorTimeline(crate::MonitorTimelineRequest) = "monitor.timeline", mutating = false, route = Plugin("monitor"), answers = [MonitorTimeline];
    ProcessLogs(ProcessLogs) = "process.logs", mutating = false, route = CoreAsync, answers = [Logs];
}

impl Request {
    /// What the request acts on, as `agent[/session[/checkpoint]]`.
    pub fn target(&self) -> String {
        match self {
            Request::Ping(_)
            | Request::AgentList(_)
            | Request::AuditList(_)
            | Request::Shutdown(_)
            | Request::StoreCheck(_)
            | Request::PluginList(_)
            | Request::SystemInfo(_) => String::new(),
            Request::ProcessStart(r) => format!("{}/{}", r.agent_id, r.session_id),
            Request::ProcessWait(r) => format!("{}/{}/{}", r.agent_id, r.session_id, r.run_id),
            Request::ProcessKill(r) => match &r.run_id {
                Some(run) => format!("{}/{}/{run}", r.agent_id, r.session_id),
                None => format!("{}/{}", r.agent_id, r.session_id),
            },
            Request::ProcessList(r) => format!("{}/{}", r.agent_id, r.session_id),
            Request::ProcessStdin(r) => format!("{}/{}/{}", r.agent_id, r.session_id, r.run_id),
            Request::ProcessResize(r) => format!("{}/{}/{}", r.agent_id, r.session_id, r.run_id),
            Request::ProcessAttach(r) => format!("{}/{}/{}", r.agent_id, r.session_id, r.run_id),
            Request::ProcessLogs(r) => format!("{}/{}/{}", r.agent_id, r.session_id, r.run_id),
            Request::TurnBegin(r) => format!("{}/{}", r.agent_id, r.session_id),
            Request::TurnEnd(r) => format!("{}/{}/{}", r.agent_id, r.session_id, r.turn_id),
            Request::CheckpointDiff(r) => {
                format!("{}/{}/{}..{}", r.agent_id, r.session_id, r.from, r.to)
            }
            Request::ProcessEvents(r) => [&r.agent_id, &r.session_id, &r.run_id]
                .iter()
                .filter_map(|x| x.as_deref())
                .collect::<Vec<_>>()
                .join("/"),
            Request::ProcessTree(r) => match &r.run_id {
                Some(run) => format!("{}/{}/{run}", r.agent_id, r.session_id),
                None => format!("{}/{}", r.agent_id, r.session_id),
            },
            Request::NetworkPolicySet(crate::NetworkPolicySet {
                agent_id,
                session_id,
                ..
            })
            | Request::NetworkPolicyGet(crate::NetworkPolicyGet {
                agent_id,
                session_id,
            }) => match session_id {
                Some(s) => format!("{agent_id}/{s}"),
                None => agent_id.clone(),
            },
            Request::FsStat(r) => fs_target(&r.agent_id, &r.session_id, r.scope, &r.path),
            Request::FsList(r) => fs_target(&r.agent_id, &r.session_id, r.scope, &r.path),
            Request::FsRead(r) => fs_target(&r.agent_id, &r.session_id, r.scope, &r.path),
            Request::FsWrite(r) => fs_target(&r.agent_id, &r.session_id, r.scope, &r.path),
            Request::FsMkdir(r) => fs_target(&r.agent_id, &r.session_id, r.scope, &r.path),
            Request::FsRemove(r) => fs_target(&r.agent_id, &r.session_id, r.scope, &r.path),
            Request::FsMove(r) => fs_target(&r.agent_id, &r.session_id, r.scope, &r.path),
            Request::FsWatch(r) => fs_target(&r.agent_id, &r.session_id, r.scope, &r.path),
            Request::ShareList(r) => r.agent_id.clone().unwrap_or_default(),
            Request::SessionStats(r) => format!("{}/{}", r.agent_id, r.session_id),
            Request::SessionUpdate(r) => format!("{}/{}", r.agent_id, r.session_id),
            Request::MonitorIngest(r) => format!("{}/{}", r.agent_id, r.session_id),
            Request::MonitorTimeline(r) => format!("{}/{}", r.agent_id, r.session_id),
            Request::MonitorRecords(crate::MonitorRecords {
                agent_id,
                session_id,
                ..
            })
            | Request::MonitorSummary(crate::MonitorSummaryRequest {
                agent_id,
                session_id,
                ..
            }) => [agent_id, session_id]
                .iter()
                .filter_map(|x| x.as_deref())
                .collect::<Vec<_>>()
                .join("/"),
            Request::ShareAgentSet(r) => r.agent_id.clone(),
            Request::ShareSessionSet(r) => format!("{}/{}", r.agent_id, r.session_id),
            Request::NetworkAudit(r) => [&r.agent_id, &r.session_id]
                .iter()
                .filter_map(|x| x.as_deref())
                .collect::<Vec<_>>()
                .join("/"),
            Request::PolicySet(r) => match &r.session_id {
                Some(s) => format!("{}/{s}", r.agent_id),
                None => r.agent_id.clone(),
            },
            Request::SessionList(r) => r.agent_id.clone(),
            Request::AgentDelete(r) => r.agent_id.clone(),
            Request::AgentCreate(r) => r.agent_id.clone(),
            Request::SessionDelete(r) => format!("{}/{}", r.agent_id, r.session_id),
            Request::CheckpointList(r) => {
                format!("{}/{}", r.agent_id, r.session_id)
            }
            Request::SessionCreate(r) => format!("{}/{}", r.agent_id, r.session_id),
            Request::CheckpointCreate(r) => {
                format!("{}/{}/{}", r.agent_id, r.session_id, r.checkpoint_id)
            }
            Request::CheckpointDelete(r) => {
                format!("{}/{}/{}", r.agent_id, r.session_id, r.checkpoint_id)
            }
            Request::CheckpointPin(r) => {
                format!("{}/{}/{}", r.agent_id, r.session_id, r.checkpoint_id)
            }
            Request::SessionRollback(r) => {
                format!("{}/{}/{}", r.agent_id, r.session_id, r.checkpoint_id)
            }
        }
    }
}

/// A file request's target as the audit names it: `agent/session:path`, or
/// `agent/session:shared:path`.
fn fs_target(a: &str, s: &str, scope: crate::FsScope, path: &str) -> String {
    match scope {
        crate::FsScope::Session => format!("{a}/{s}:{path}"),
        crate::FsScope::Shared => format!("{a}/{s}:shared:{path}"),
    }
}

// ---------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct Pong {
    pub version: u32,
    pub build: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct AgentInfo {
    pub agent_id: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: u64,
    pub sessions: u32,
    /// Absolute path of the agent's level-1 workspace.
    pub workspace: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct AgentListing {
    pub agents: Vec<AgentInfo>,
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
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct SessionListing {
    pub agent_id: String,
    pub sessions: Vec<SessionInfo>,
}

/// Why a checkpoint exists.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Asked for with `checkpoint.create`.
    Manual,
    /// Taken when the session was created.
    Baseline,
    /// Taken when a turn ended.
    Turn,
    /// Found on disk without an index entry and adopted at start-up.
    Recovered,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Manual => "manual",
            Origin::Baseline => "baseline",
            Origin::Turn => "turn",
            Origin::Recovered => "recovered",
        }
    }
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct CheckpointInfo {
    pub agent_id: String,
    pub session_id: String,
    pub checkpoint_id: String,
    /// The checkpoint `current/` descended from when this one was taken.
    pub parent: Option<String>,
    pub created_ms: u64,
    pub origin: Origin,
    pub pinned: bool,
    pub label: Option<String>,
    /// The turn whose end took it (origin `turn`).
    pub turn_id: Option<String>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct CheckpointListing {
    pub agent_id: String,
    pub session_id: String,
    /// The checkpoint `current/` descends from.
    pub head: Option<String>,
    /// Oldest first.
    pub checkpoints: Vec<CheckpointInfo>,
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

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct Deleted {
    /// What was deleted, as `agent[/session[/checkpoint]]`.
    pub deleted: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct AuditRecord {
    /// Position in the audit log, from 1, without gaps.
    pub seq: u64,
    pub time_ms: u64,
    pub request_id: u64,
    /// Who asked (`uid=0 pid=42`, `startup`, ...).
    pub peer: String,
    pub action: String,
    pub target: String,
    /// `ok` or an error code.
    pub outcome: String,
    pub message: Option<String>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct AuditListing {
    /// Oldest first.
    pub records: Vec<AuditRecord>,
    /// Records whose checksum did not match and were skipped.
    pub corrupt: u64,
    /// Older records exist: ask again with `before_seq` set to this (the
    /// first listed record's sequence number).
    #[serde(default)]
    pub earlier: Option<u64>,
    /// Newer records exist: ask again with `after_seq` set to this (the
    /// last listed record's sequence number).
    #[serde(default)]
    pub later: Option<u64>,
}

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
    /// Output captured (empty for streamed runs), UTF-8 with invalid bytes
    /// replaced.
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

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct TurnInfo {
    pub agent_id: String,
    pub session_id: String,
    pub turn_id: String,
    /// 1 for a session's first turn.
    pub number: u64,
    pub began_ms: u64,
    pub ended_ms: Option<u64>,
    pub status: Option<TurnStatus>,
    /// The automatic checkpoint taken at its end, if any.
    pub checkpoint_id: Option<String>,
    /// Why the automatic checkpoint could not be taken (the turn still
    /// ended).
    pub checkpoint_error: Option<String>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct PolicyInfo {
    pub agent_id: String,
    pub session_id: Option<String>,
    /// In force for this agent or session, defaults applied.
    pub auto_checkpoint: bool,
    pub keep_last: Option<u32>,
}

/// How a path differs.
#[derive(
    Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
    /// File, directory and symlink turned into one another.
    TypeChanged,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct Change {
    /// Relative to the workspace root, `/`-separated.
    pub path: String,
    pub kind: ChangeKind,
    pub size_before: Option<u64>,
    pub size_after: Option<u64>,
    /// With `checkpoint.diff {patch: true}`, for a regular file or a
    /// symlink: the change as `git diff` shows it — a `diff --git` line,
    /// mode lines, `--- a/PATH` / `+++ b/PATH` (`/dev/null` for a side
    /// that has none) and unified hunks with 3 lines of context; a symlink
    /// as the text of its target; for a binary file (a NUL byte in its
    /// first 8 KiB, or not UTF-8) the note `Binary files a/PATH and
    /// b/PATH differ`. None for directories and special files, and when
    /// the answer had no room left (see `patch_truncated`).
    #[serde(default)]
    pub patch: Option<String>,
    /// The patch is cut short (the hunks that are there well-formed, the
    /// rest left out) or left out, to keep the answer within its bounds.
    #[serde(default)]
    pub patch_truncated: bool,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct DiffListing {
    pub from: String,
    pub to: String,
    /// Sorted by path; at most 10,000 (see `truncated`).
    pub changes: Vec<Change>,
    pub truncated: bool,
    pub added: u64,
    pub modified: u64,
    pub deleted: u64,
    pub type_changed: u64,
    /// Some listed change's patch is cut short or left out (its own
    /// `patch_truncated` says which): the patches of one answer hold at
    /// most 512 KiB, 64 KiB per file.
    #[serde(default)]
    pub patch_truncated: bool,
}

macro_rules! responses {
    ($( $variant:ident($ty:ty); )*) => {
        /// Every response. Each request has one natural response variant.
        #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
        pub enum Response {
            $( $variant($ty), )*
        }

        impl Response {
            /// The variant's name (`"Agent"`, ...), as [`Request::api`]
            /// names an action's answers.
            pub fn kind(&self) -> &'static str {
                match self { $( Response::$variant(_) => stringify!($variant), )* }
            }

            /// The JSON `result` object.
            pub fn to_json(&self) -> serde_json::Value {
                let v = match self { $( Response::$variant(v) => serde_json::to_value(v), )* };
                v.unwrap_or(serde_json::Value::Null)
            }

            /// The schema of a variant's JSON `result`, by its name.
            pub fn schema_of(
                kind: &str,
                schemas: &mut schemars::SchemaGenerator,
            ) -> Option<schemars::Schema> {
                match kind {
                    $( stringify!($variant) => Some(schemas.subschema_for::<$ty>()), )*
                    _ => None,
                }
            }

            /// Every variant's name.
            pub const KINDS: &'static [&'static str] = &[$(stringify!($variant)),*];
        }
    };
}

responses! {
    Pong(Pong);
    Agent(AgentInfo);
    Agents(AgentListing);
    Session(SessionInfo);
    Sessions(SessionListing);
    Checkpoint(CheckpointInfo);
    Checkpoints(CheckpointListing);
    RolledBack(RollbackDone);
    Deleted(Deleted);
    Audit(AuditListing);
    Started(RunStarted);
    Exited(RunResult);
    Killed(Killed);
    Processes(ProcessListing);
    StdinWritten(StdinWritten);
    Turn(TurnInfo);
    Policy(PolicyInfo);
    Diff(DiffListing);
    Stopping(Stopping);
    System(SystemInfo);
    ProcessEvents(ProcessEventListing);
    ProcessTree(ProcessTreeListing);
    StoreCheck(StoreCheckReport);
    Plugins(PluginListing);
    NetworkPolicy(crate::NetworkPolicyInfo);
    NetworkAudit(crate::NetworkAuditListing);
    FsEntry(crate::FsEntry);
    FsListing(crate::FsListing);
    FsData(crate::FsData);
    FsWritten(crate::FsWritten);
    Resized(Resized);
    Shares(crate::ShareListing);
    ShareAgent(crate::ShareAgentInfo);
    Share(crate::ShareInfo);
    SessionStats(Box<crate::SessionStats>);
    MonitorIngested(crate::MonitorIngested);
    MonitorRecords(crate::MonitorListing);
    MonitorSummary(crate::MonitorSummary);
    MonitorTimeline(Box<crate::MonitorTimeline>);
    Logs(Box<RunLogs>);
}

/// A terminal's new size.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct Resized {
    pub run_id: String,
    pub rows: u16,
    pub cols: u16,
}

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

/// The answer to `system.info`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct SystemInfo {
    /// Milliseconds since the kernel booted.
    pub uptime_ms: u64,
    /// The supervisor's process id, and whether PID 1 is its parent (the
    /// guest) or not (a daemon on a host).
    pub supervisor_pid: u32,
    pub under_init: bool,
    /// Resident memory of PID 1 and of the supervisor, in KiB.
    pub init_rss_kib: u64,
    pub supervisor_rss_kib: u64,
    /// Processes on the machine, and exited children PID 1 has not reaped.
    pub processes: u32,
    pub init_zombies: u32,
    /// The plugins loaded, in load order.
    #[serde(default)]
    pub plugins: Vec<String>,
    /// Milliseconds since the supervisor started (a host daemon's own
    /// uptime; `uptime_ms` is the machine's).
    #[serde(default)]
    pub supervisor_uptime_ms: u64,
}

/// A loaded plugin, as `plugin.list` shows it.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct PluginInfo {
    pub name: String,
    /// The plugin API version it declares.
    pub api_version: u32,
    /// The actions it serves.
    pub routes: Vec<String>,
    /// The plugins it cannot be loaded with.
    pub conflicts: Vec<String>,
}

/// A plugin compiled into the supervisor.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct InstalledPlugin {
    pub name: String,
    pub api_version: u32,
    /// Whether a daemon flag enabled it (`--plugin NAME`).
    pub enabled: bool,
    /// What it does, in a line.
    pub summary: String,
}

/// The answer to `plugin.list`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct PluginListing {
    /// Loaded plugins, in load order (they stop in the reverse order).
    pub loaded: Vec<PluginInfo>,
    /// Every plugin compiled in, by name.
    pub installed: Vec<InstalledPlugin>,
}

/// The answer to `store.check`. The store is consistent when every list is
/// empty: the journal holds no unfinished operation and every record of
/// the index has its subvolume on disk and the other way round.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
pub struct StoreCheckReport {
    /// Journal entries of operations that neither finished nor were undone.
    pub unfinished: Vec<String>,
    /// Finished operations whose old tree is still being removed.
    pub removing: u32,
    /// Index records without their subvolume (`agent[/session[/checkpoint]]`).
    pub missing_on_disk: Vec<String>,
    /// Subvolumes without an index record, and leftover in-flight names.
    pub missing_in_index: Vec<String>,
    /// Why the store refuses changes, when it does (a failed recovery or
    /// an undo that could not finish).
    pub read_only: Option<String>,
}

impl StoreCheckReport {
    /// Whether nothing is out of place.
    pub fn is_consistent(&self) -> bool {
        self.unfinished.is_empty()
            && self.missing_on_disk.is_empty()
            && self.missing_in_index.is_empty()
    }
}

/// The answer to `system.shutdown`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct Stopping {
    /// Whether the machine powers off after the supervisor stops (it runs
    /// as the child of the guest's PID 1).
    pub power_off: bool,
}
