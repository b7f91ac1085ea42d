//! Messages: the handshake, the envelopes and frames, and the two tables
//! of every request and response. The types of each request's params and
//! of each answer live with their noun (`agent`, `session`, `process`,
//! ...).
//!
//! Variants are only ever appended: their index is their wire identity.

use crate::error::ErrorBody;
use crate::target::Target;
use crate::{agent::*, audit::*, checkpoint::*, process::*, process_tree::*};
use crate::{session::*, system::*, turn::*};
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
    /// The next bytes of a `session.export`'s archive.
    Archive(crate::ArchiveChunk),
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

            /// What the request acts on, as the audit log names it
            /// (`agent[/session[/...]]`): its params say ([`Target`]).
            pub fn target(&self) -> String {
                match self { $( Request::$variant(p) => Target::target(p), )* }
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
    EffectsGet(crate::EffectsGet) = "effects.get", mutating = false, route = Plugin("system-effects"), answers = [Effects];
    EffectsList(crate::EffectsList) = "effects.list", mutating = false, route = Plugin("system-effects"), answers = [EffectsListing];
    EffectsHistory(crate::EffectsHistory) = "effects.history", mutating = false, route = Plugin("system-effects"), answers = [EffectsHistory];
    EffectsStatus(crate::EffectsStatusRequest) = "effects.status", mutating = false, route = Plugin("system-effects"), answers = [EffectsStatus];
    EffectsUnfence(crate::EffectsUnfence) = "effects.unfence", mutating = true, route = Plugin("system-effects"), answers = [EffectsUnfenced];
    SessionFork(crate::SessionFork) = "session.fork", mutating = true, route = Core, answers = [Session];
    SessionPause(crate::SessionPause) = "session.pause", mutating = true, route = Core, answers = [Session];
    SessionResume(SessionRef) = "session.resume", mutating = true, route = Core, answers = [Session];
    SessionInfoRequest(SessionRef) = "session.info", mutating = false, route = Core, answers = [Session];
    EffectsVerify(crate::EffectsVerify) = "effects.verify", mutating = false, route = Plugin("system-effects"), answers = [EffectsVerified];
    EffectsExport(crate::EffectsExport) = "effects.export", mutating = false, route = Plugin("system-effects"), answers = [EffectsExportChunk];
    SystemMetrics(crate::SystemMetricsRequest) = "system.metrics", mutating = false, route = Core, answers = [Metrics];
    SessionExport(crate::SessionExport) = "session.export", mutating = false, route = CoreAsync, answers = [SessionExported];
    SessionImport(crate::SessionImport) = "session.import", mutating = true, route = Core, answers = [SessionImported];
    FsUploadLocal(crate::FsUploadLocal) = "fs.upload_local", mutating = true, route = Core, answers = [FsCopied];
    FsDownloadLocal(crate::FsDownloadLocal) = "fs.download_local", mutating = false, route = Core, answers = [FsCopied];
    SecretSet(crate::SecretSet) = "secret.set", mutating = true, route = Plugin("network"), answers = [Secret];
    SecretList(crate::SecretList) = "secret.list", mutating = false, route = Plugin("network"), answers = [Secrets];
    SecretDelete(crate::SecretDelete) = "secret.delete", mutating = true, route = Plugin("network"), answers = [Deleted];
    PortExpose(crate::PortExpose) = "port.expose", mutating = true, route = Core, answers = [Port];
    PortUnexpose(crate::PortUnexpose) = "port.unexpose", mutating = true, route = Core, answers = [Deleted];
    PortList(crate::PortList) = "port.list", mutating = false, route = Core, answers = [Ports];
    PortConnect(crate::PortConnect) = "port.connect", mutating = false, route = Core, answers = [PortConnected];
    SystemResumed(crate::SystemResumed) = "system.resumed", mutating = true, route = Core, answers = [Resumed];
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
    Effects(Box<crate::RunEffects>);
    EffectsListing(crate::EffectsListing);
    EffectsHistory(crate::EffectsHistoryListing);
    EffectsStatus(crate::EffectsStatus);
    EffectsUnfenced(crate::EffectsUnfenced);
    EffectsVerified(crate::EffectsVerified);
    EffectsExportChunk(crate::EffectsExportChunk);
    Metrics(crate::MetricsText);
    SessionExported(crate::SessionExported);
    SessionImported(crate::SessionImported);
    FsCopied(crate::FsCopied);
    Secret(crate::SecretInfo);
    Secrets(crate::SecretListing);
    Port(crate::PortInfo);
    Ports(crate::PortListing);
    PortConnected(crate::PortConnected);
    Resumed(crate::Resumed);
}
