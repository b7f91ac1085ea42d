//! Plugin API v1: what a plugin declares ([`Manifest`]), what it
//! contributes to each run ([`Contribution`]), the hooks the core calls
//! ([`Plugin`]), what the core lends it ([`Core`]) and its error
//! ([`PluginError`]). docs/plugins.md walks through writing one.
//!
//! The floor plugins stand on: this module imports nothing else of the
//! supervisor, and plugins import nothing of the supervisor but it.

pub mod metrics;
pub mod state_file;

mod error;

pub use error::{alias_note, Cause, PluginError};

use allox_protocol::{
    Bytes, Egress, ErrorBody, Event, FsData, FsEntry, FsListing, FsWritten, NetworkMode, Request,
    Response,
};
use allox_sandbox::spec::Bind;
use allox_store::Store;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

/// The plugin API this supervisor implements. A plugin declaring another
/// version is refused at start, naming it and both versions.
pub const API_VERSION: u32 = 1;

/// What a plugin is, known before it is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Its name, as `--plugin NAME` enables it.
    pub name: &'static str,
    /// The plugin API it is written against ([`API_VERSION`]).
    pub api_version: u32,
    /// Plugins it cannot be loaded with (either side declaring it is
    /// enough).
    pub conflicts: &'static [&'static str],
    /// Another daemon flag that enables it too, kept for compatibility
    /// (`--process-tracker ebpf`); named in messages.
    pub alias: Option<&'static str>,
    /// What it does, in a line (`plugin.list`).
    pub summary: &'static str,
}

/// The run a hook is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunRef<'a> {
    pub agent: &'a str,
    pub session: &'a str,
    pub run: &'a str,
    /// Its session's network: its mode and the egress rules of its agent
    /// and of itself, as they were when the run started (a run adopted
    /// from an earlier supervisor is told `disabled` and no rules).
    pub network: &'a SessionNetwork,
}

/// A run that ended: what it was asked to run, for which tool call, when,
/// and its result (with what it used, if that is read).
#[derive(Debug, Clone, Copy)]
pub struct RunEnded<'a> {
    pub run: RunRef<'a>,
    pub argv: &'a [String],
    pub trace: Option<&'a allox_protocol::TraceContext>,
    pub started: std::time::SystemTime,
    pub ended: std::time::SystemTime,
    pub result: &'a allox_protocol::RunResult,
}

/// The session a hook is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionRef<'a> {
    pub agent: &'a str,
    pub session: &'a str,
    /// Its network: mode and the egress rules of its agent and its own.
    pub network: &'a SessionNetwork,
}

/// A session's network as the store has it: its mode (fixed when it was
/// made) and the egress rules of its agent and of itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionNetwork {
    pub mode: NetworkMode,
    pub agent: Option<Egress>,
    pub session: Option<Egress>,
}

/// Held for a plugin as long as a session's context lives.
pub type ContextGuard = Box<dyn Send + Sync>;

/// What a plugin adds to one run. The core merges every loaded plugin's
/// contribution (in load order) and refuses two plugins contributing the
/// same environment variable, the same mount target, or a command prefix
/// each. The keys (variables, targets, whether there is a prefix) must not
/// depend on the run: the core checks them once at start, for a run of a
/// `proxy` session (a plugin may leave some out for other runs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Contribution {
    /// Prepended to the run's argv (a wrapper program and its arguments).
    pub prefix: Vec<String>,
    /// Set in the run's environment (after the core's own, before the
    /// request's, which wins).
    pub env: Vec<(String, String)>,
    /// Host paths bound into the sandbox, after its own mounts, in order.
    pub binds: Vec<Bind>,
    /// Shown with the run (`process.list`), each key as `plugin.key`.
    pub metadata: Vec<(String, String)>,
}

/// A run to observe: its cgroup made and frozen, nothing in it yet. Its
/// first process is cloned into the frozen cgroup once
/// [`Plugin::observe_begin`] returns, so it cannot execute an instruction
/// before the observer's baseline is sealed.
#[derive(Debug, Clone, Copy)]
pub struct ObservedRun<'a> {
    pub run: RunRef<'a>,
    pub argv: &'a [String],
    /// The run's cgroup and its id (the directory's inode number).
    pub cgroup: &'a std::path::Path,
    pub cgroup_id: u64,
    /// The daemon's `--cgroup-root` (its runs' cgroups are under
    /// `ROOT/allox/AGENT/SESSION/run-RUN`).
    pub cgroup_root: &'a std::path::Path,
    /// The session's `current/` and its agent's workspace.
    pub workspace: &'a std::path::Path,
    pub agent_workspace: &'a std::path::Path,
    /// The session's context process, if it has one yet.
    pub context_pid: Option<i32>,
    /// `process.start`'s `recovery`: observe it under protocol v3.
    pub recovery: Option<&'a allox_protocol::ProcessRecovery>,
}

/// How an observed run ended: its whole tree has exited, its cgroup is
/// empty and frozen (unless `fault` says otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedEnd {
    pub status: String,
    pub survivors: Vec<allox_protocol::Survivor>,
    /// The run's sandbox init (pid as the supervisor sees it).
    pub init_pid: Option<u32>,
    /// What went wrong on the core's side of the end (a freeze or a kill
    /// that did not finish in time).
    pub fault: Option<String>,
}

/// What the core does for an observed run's session, asked by the
/// observing plugin at the run's end.
pub trait RunCore {
    /// Replaces the session's context (its namespaces and every process
    /// in its cgroup) with a new one, made as the first run's would be;
    /// the new context's pid. Blocking.
    fn renew_context(&self) -> Result<i32, String>;
}

/// The system-effects plugin's settings (`--system-effects-*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EffectsSettings {
    /// `--system-effects-scope FILE`.
    pub scope: Option<PathBuf>,
    /// `--system-effects-observer FILE`: the observer executable.
    pub observer: Option<PathBuf>,
    /// `--system-effects-observer-sha256 HEX`: its pinned hash (the one
    /// fixed at build when not given).
    pub observer_sha256: Option<String>,
    /// `--system-effects-verifier FILE`: the verifier executable.
    pub verifier: Option<PathBuf>,
    /// `--system-effects-verifier-sha256 HEX`: its pinned hash (the one
    /// fixed at build when not given).
    pub verifier_sha256: Option<String>,
    /// `--system-effects-recover FILE`: the recover tool (protocol v3).
    pub recover: Option<PathBuf>,
    /// `--system-effects-recover-sha256 HEX`: its pinned hash (the one
    /// fixed at build when not given).
    pub recover_sha256: Option<String>,
    /// `--system-effects-ring-bytes`: the history's ring buffer.
    pub ring_bytes: u32,
    /// `--system-effects-without-lsm`: the history without its BPF LSM
    /// hooks, on a kernel that refuses them (said in `effects.status` and
    /// in every run's evidence).
    pub without_lsm: bool,
}

/// What a plugin gets at start.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The store's `state/`: outside every rollback, the plugin's to keep
    /// files in (under names of its own).
    pub state_dir: PathBuf,
    /// `--process-events-max`: the process tracker's event cap.
    pub process_events_max: u64,
    /// `--monitor-root`, `--monitor-records-max`.
    pub monitor: MonitorSettings,
    /// The session network's settings (`--network-*`).
    pub network: NetworkSettings,
    /// How big a plugin's audit file grows and how fast a session's calls
    /// are recorded in it (`--audit-file-bytes`, `--audit-lines-per-s`).
    pub audit: allox_store::audit::AuditBounds,
    /// `--system-effects-*`.
    pub effects: EffectsSettings,
    /// The daemon's metrics: a plugin registers its own families here as
    /// it starts (under the `allox_` prefix).
    pub metrics: std::sync::Arc<metrics::Metrics>,
    /// The store, for a plugin that acts on it outside a request
    /// (system effects' recovery); `None` in unit tests.
    pub store: Option<std::sync::Arc<Store>>,
}

/// `--network-allow`, `--network-deny`, `--network-resolver`, and the
/// proxy's budgets (`--proxy-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkSettings {
    /// The daemon's egress layer: `None` does not narrow.
    pub allow: Option<Vec<String>>,
    pub deny: Vec<String>,
    /// The DNS server the broker asks; `None` is the system's resolver.
    pub resolver: Option<std::net::SocketAddr>,
    /// The mode of sessions whose request and agent name none
    /// (`--session-network`).
    pub default_mode: NetworkMode,
    /// `--proxy-connections-per-session`, `--proxy-connections`.
    pub connections_per_session: usize,
    pub connections: usize,
    /// `--proxy-lookups-per-session`.
    pub lookups_per_session: usize,
    /// `--secrets-key-file`: the key secrets are sealed under in the
    /// store (made on the first `secret.set` when there is none).
    pub secrets_key_file: PathBuf,
    /// `--network-ca-file`: the roots the broker verifies intercepted
    /// connections' servers against (the system's when `None`).
    pub ca_file: Option<PathBuf>,
}

/// `--secrets-key-file`'s default: outside every store.
pub const DEFAULT_SECRETS_KEY_FILE: &str = "/var/lib/allox/secrets.key";

/// `--proxy-connections-per-session`: a session's proxy connections open
/// at once (a real agent's tools open tens).
pub const DEFAULT_CONNECTIONS_PER_SESSION: u32 = 512;

/// `--proxy-connections`: every session's proxy connections together.
pub const DEFAULT_CONNECTIONS: u32 = 4096;

/// `--proxy-lookups-per-session`: a session's name lookups in flight.
pub const DEFAULT_LOOKUPS_PER_SESSION: u32 = 64;

impl Default for NetworkSettings {
    fn default() -> Self {
        NetworkSettings {
            allow: None,
            deny: Vec::new(),
            resolver: None,
            default_mode: allox_protocol::NetworkMode::default(),
            connections_per_session: DEFAULT_CONNECTIONS_PER_SESSION as usize,
            connections: DEFAULT_CONNECTIONS as usize,
            lookups_per_session: DEFAULT_LOOKUPS_PER_SESSION as usize,
            secrets_key_file: PathBuf::from(DEFAULT_SECRETS_KEY_FILE),
            ca_file: None,
        }
    }
}

/// Where the monitor keeps its records, and how many; what a session may
/// make it keep (0: no limit).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MonitorSettings {
    /// `None`: `monitor/` in the store's `state/`.
    pub root: Option<PathBuf>,
    pub records_max: u64,
    /// `--monitor-session-bytes`: bytes kept for one session.
    pub session_bytes: u64,
    /// `--monitor-bytes-per-s`: bytes a second written for one session
    /// from inside its sandbox.
    pub bytes_per_s: u64,
    /// `--monitor-span-bytes`: one span's encoded record.
    pub span_bytes: u64,
    /// `--session-quota`: caps `session_bytes`.
    pub session_quota: Option<u64>,
}

/// Where a request's stream events go (binary protocol only).
pub type EventSink = tokio::sync::mpsc::Sender<Event>;

/// The in-sandbox client every sandbox has (the in-sandbox interface's `allox`).
pub const SANDBOX_CLIENT: &str = "/run/allox/bin/allox";

/// Writes a Python entry point at `path` that runs `allox <command>
/// ARGS...` (a plugin's command inside sandboxes, as `net` or `share`).
pub fn write_shim(path: &std::path::Path, command: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let text = format!(
        "# Allox OS in-sandbox interface: runs `allox {command}` (see /run/allox/bin/allox --help).\n\
         import os\n\
         import sys\n\
         \n\
         os.execv({SANDBOX_CLIENT:?}, [\"allox\", {command:?}] + sys.argv[1:])\n"
    );
    // Already there as it should be (each start after the first): left
    // alone, so a start on a full disk writes nothing. Else written beside
    // it and renamed over it, so a failed write leaves what was there.
    if std::fs::read(path).is_ok_and(|t| t == text.as_bytes()) {
        return std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644));
    }
    let written = state_file::write(path, text.as_bytes(), 0o644)
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)));
    if let Err(e) = &written {
        // One that is there, of another build (or cut short), serves
        // until there is room: a full disk does not keep the daemon from
        // starting (its deletes free the room).
        if state_file::is_full(e) && path.exists() {
            tracing::warn!(path = %path.display(), error = %e,
                "cannot write this build's entry point: the one there is kept until there is room");
            return std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644));
        }
        // None there, and no room for one: the plugin starts without it
        // (its tools are also `allox COMMAND`), and the next start with
        // room writes it.
        if state_file::is_full(e) {
            tracing::warn!(path = %path.display(), error = %e,
                "cannot write the plugin's entry point for want of room: the plugin starts without it; `allox` serves its tools, and a start with room writes it");
            return Ok(());
        }
    }
    written
}

/// A directory of a session's own files, reached for another session (a
/// share's scope): `dir` is relative to the session's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionDir<'a> {
    pub agent: &'a str,
    pub session: &'a str,
    pub dir: &'a str,
}

/// A write into a [`SessionDir`]: whole (written beside the file and
/// renamed over it) or a chunk of an upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteWithin {
    pub path: String,
    pub data: Bytes,
    pub offset: Option<u64>,
    pub create: Option<bool>,
    pub upload: Option<String>,
    pub commit: bool,
    /// The session (`agent/session`) whose budget of uploads under way an
    /// upload begun by this write counts against: the caller's, for a
    /// write from another session (it took the target's places).
    pub charged_to: Option<String>,
}

/// What the core lends plugins beyond the store: sessions as the store
/// has them, and their files reached as the file API reaches them, each
/// operation typed. The supervisor is the one implementation; unit tests
/// fake it.
///
/// The file operations work within a [`SessionDir`]: reached without
/// following links, paths resolved beneath it, excluded from the
/// session's rollbacks and deletes (`conflict`), a write refused while
/// the session has a live run.
pub trait Core: Send + Sync {
    /// When session `a/s` was made (ms since the epoch): a session deleted
    /// and made again under its name is another session. `not_found` if
    /// there is none.
    fn session_created(&self, a: &str, s: &str) -> Result<u64, ErrorBody>;

    /// The sessions of agent `a` with their creation times (none if the
    /// agent does not exist).
    fn sessions_of(&self, a: &str) -> Vec<(String, u64)>;

    /// `path` as a relative path without `..` (`.` when empty), or why it
    /// is not one.
    fn relative_path(&self, path: &str) -> Result<String, ErrorBody>;

    /// What `path` is.
    fn stat_within(&self, dir: &SessionDir<'_>, path: &str) -> Result<FsEntry, ErrorBody>;

    /// The entries under `path`, `depth` levels down (1 when `None`).
    fn list_within(
        &self,
        dir: &SessionDir<'_>,
        path: &str,
        depth: Option<u32>,
    ) -> Result<FsListing, ErrorBody>;

    /// Bytes of the file `path`, with the id of the tree of the session's
    /// files they came from (a rollback changes it).
    fn read_within(
        &self,
        dir: &SessionDir<'_>,
        path: &str,
        offset: Option<u64>,
        length: Option<u64>,
    ) -> Result<(FsData, u64), ErrorBody>;

    /// Writes the file `write.path`.
    fn write_within(
        &self,
        dir: &SessionDir<'_>,
        write: WriteWithin,
    ) -> Result<FsWritten, ErrorBody>;
}

/// What a route's handler may use besides the request.
pub struct RouteContext<'a> {
    pub store: &'a Store,
    pub core: &'a dyn Core,
    /// Where stream events go, for a request that streams (binary
    /// protocol only).
    pub events: Option<EventSink>,
}

/// The answer of a route, later.
pub type RouteFuture<'a> = Pin<Box<dyn Future<Output = Result<Response, PluginError>> + Send + 'a>>;

/// A plugin. Every method but [`Plugin::manifest`], [`Plugin::start`] and
/// [`Plugin::stop`] has a default that contributes nothing.
///
/// Lifecycle: constructed when the daemon starts (whether enabled or not:
/// construction must do nothing), started in load order if enabled, stopped
/// in the reverse order at shutdown or when a later plugin fails to start.
/// A plugin whose `start` fails (or panics) must leave nothing behind
/// itself; it is not stopped.
pub trait Plugin: Send + Sync {
    fn manifest(&self) -> &Manifest;

    /// Acquires what the plugin needs (programs, files, threads).
    fn start(&self, settings: &Settings) -> Result<(), PluginError>;

    /// Releases everything `start` acquired. Called once, only after a
    /// successful `start`.
    fn stop(&self);

    /// This plugin's part of a run's sandbox.
    fn contribute(&self, _run: &RunRef<'_>) -> Contribution {
        Contribution::default()
    }

    /// Before the run's first process exists: its cgroup is made (its id
    /// is `cgroup_id`) but empty. An error refuses the run.
    fn before_run(&self, _run: &RunRef<'_>, _cgroup_id: u64) -> Result<(), PluginError> {
        Ok(())
    }

    /// Whether it observes runs (system effects): every run's cgroup is
    /// then frozen before its first process, [`Plugin::observe_begin`]
    /// heard, the run released, and at its end its tree frozen, listed,
    /// killed and [`Plugin::observe_end`] heard before its result is out.
    fn observes_runs(&self) -> bool {
        false
    }

    /// An observed run's cgroup is frozen and empty (blocking: returns
    /// once the baseline is sealed). An error refuses the run.
    fn observe_begin(&self, _run: &ObservedRun<'_>) -> Result<(), PluginError> {
        Ok(())
    }

    /// An observed run's tree has exited (blocking): its effects, for its
    /// result. `core` does what only the core can for that run's session.
    fn observe_end(
        &self,
        _run: &RunRef<'_>,
        _end: ObservedEnd,
        _core: &dyn RunCore,
    ) -> Option<allox_protocol::RunEffects> {
        None
    }

    /// Session `agent/session` (every session of `agent` when `None`) was
    /// deleted: a session made again under its name is another.
    fn deleted(&self, _agent: &str, _session: Option<&str>) {}

    /// Why changes to session `agent/session` are refused (a fence the
    /// plugin holds), if they are: reads and `session.delete` still work.
    fn holds(&self, _agent: &str, _session: &str) -> Option<String> {
        None
    }

    /// A run of an earlier supervisor, still going, found at start.
    fn adopt_run(&self, _run: &RunRef<'_>, _cgroup_id: u64) {}

    /// The run's sandbox is gone (reaped, its cgroup removed).
    fn after_run(&self, _run: &RunRef<'_>) {}

    /// The run ended and its result is published (called on the
    /// supervisor's I/O task: record, do not block).
    fn run_ended(&self, _run: &RunEnded<'_>) {}

    /// A session's context was made, before any run is forked from it:
    /// `context` is its process's pidfd (its namespaces are the session's;
    /// `setns` into them through it). What the plugin returns is held as
    /// long as the context lives and dropped when it ends (session
    /// deleted, context died or replaced). An error refuses the run that
    /// was making the context, and the context is ended.
    fn session_context(
        &self,
        _session: &SessionRef<'_>,
        _context: rustix::fd::BorrowedFd<'_>,
    ) -> Result<Option<ContextGuard>, PluginError> {
        Ok(None)
    }

    /// Plugins whose actions (in the request table) it answers when they
    /// are not loaded: a plugin it conflicts with and stands in for, as
    /// system-effects does for process-tree's `process.events` and
    /// `process.tree`.
    fn stands_in_for(&self) -> &'static [&'static str] {
        &[]
    }

    /// The routes it serves inside sandboxes, through the in-sandbox interface's
    /// `plugin.call` (names of its own; two plugins may not share one).
    fn sandbox_routes(&self) -> &'static [&'static str] {
        &[]
    }

    /// Answers a `plugin.call` for one of [`Plugin::sandbox_routes`] from
    /// inside a sandbox (on a blocking thread), with what the core lends
    /// ([`Core`]). `caller` is the run the
    /// call came from, as the listener that accepted it says: a plugin acts
    /// for that run's session only. `params` is JSON text; so is the
    /// answer.
    fn sandbox_call(
        &self,
        _core: &dyn Core,
        _caller: &allox_protocol::sandbox_api::SandboxCaller,
        route: &str,
        _params: &str,
    ) -> Result<String, allox_protocol::ErrorBody> {
        Err(allox_protocol::ErrorBody::new(
            allox_protocol::ErrorCode::Unsupported,
            format!(
                "plugin {} has no handler for the guest route {route}",
                self.manifest().name
            ),
        ))
    }

    /// Answers a request the protocol's request table gives this plugin
    /// (`Route::Plugin(NAME)` in `allox_protocol::Request::ROUTES`).
    fn serve<'a>(&'a self, req: &'a Request, _ctx: RouteContext<'a>) -> RouteFuture<'a> {
        let name = self.manifest().name;
        Box::pin(async move {
            Err(PluginError::NoHandler {
                plugin: name,
                action: req.action(),
            })
        })
    }
}
