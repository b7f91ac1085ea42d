//! Runs: processes started in a session's sandbox, their output, their end.
//!
//! Each run has its own cgroup below the session's
//! (`allox/<agent>/<session>/run-<id>`), its sandbox init's pidfd (the only
//! handle the supervisor signals through), pipes for stdin, stdout and
//! stderr, and a status pipe on which the init reports how the program
//! ended. The cgroup stays the source of truth: listing and killing read it,
//! so runs started by an earlier supervisor (re-adopted after a restart) are
//! listed and killed like the others.
//!
//! One operation per file: [`start`](Runs::start) in `start.rs`,
//! [`wait`](Runs::wait) in `wait.rs`, [`stdin`](Runs::stdin) in `stdin.rs`,
//! [`kill`](Runs::kill) in `kill.rs`, [`list`](Runs::list) in `listing.rs`;
//! a run's end (status, result, reaping) in `end.rs`, its output in
//! `output.rs`, fences in `fence.rs`. This file holds the table of runs and
//! its configuration.

mod adopted;
pub mod attach;
mod context;
mod end;
mod error;
pub mod fence;
pub mod finished;
mod kill;
pub mod listing;
mod logs;
mod output;
pub mod pause;
pub mod procfs;
mod start;
mod starting;
mod stats;
pub(crate) use stats::usage_of;
mod stdin;
mod terminal;
mod tty;
pub mod validate;
mod wait;

pub use attach::{Attachment, RunIdentity, RunServices, SessionFiles};

tokio::task_local! {
    /// The run a request started, told by the start as it says so: a
    /// request cut before its answer names it in its outcome.
    pub(crate) static STARTED: std::sync::Arc<std::sync::OnceLock<String>>;
}

/// Tells the request being answered (if any) that it started run `id`.
fn note_started(id: &str) {
    let _ = STARTED.try_with(|s| s.set(id.to_string()));
}
pub use error::{ConfigError, RunError};
pub use fence::{Fence, FenceScope, Writer};

use crate::plugin_api::{RunRef, SessionNetwork};
use crate::plugin_host::Plugins;
use allox_protocol::RunResult;
use allox_sandbox::cgroup::{Cgroups, Limits};
use allox_store::failpoint::Failpoints;
use fence::Fences;
use finished::{Evict, Finished, Retention};
use rustix::fd::OwnedFd;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Where a run's stream events go (binary protocol clients).
pub use crate::plugin_api::EventSink;

#[derive(Debug, Clone)]
pub struct RunsConfig {
    /// cgroup2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a
    /// hybrid host).
    pub cgroup_mount: PathBuf,
    /// The binary that serves as each session's context (`allox-init
    /// session-context`), of which runs' PID 1s are copies.
    pub init_exe: PathBuf,
    /// Unprivileged identity of sandboxed programs; owns session files.
    pub uid: u32,
    pub gid: u32,
    /// Empty directory where sandboxes assemble their root.
    pub stage: PathBuf,
    /// Host directories bound read-only into every sandbox.
    pub system_dirs: Vec<PathBuf>,
    /// Output kept per stream of a run that is not streamed.
    pub capture_limit: usize,
    /// Largest total copied from the private /tmp on normal exit.
    pub tmp_sync_cap: u64,
    /// Refuse sandboxed programs the calls that share a file's extents
    /// (FICLONE, FICLONERANGE, FIDEDUPERANGE, copy_file_range): set under
    /// `--session-quota`, since Btrfs does not hold a clone to the quota.
    pub no_reflinks: bool,
    /// Limits applied to every session's cgroup.
    pub limits: Limits,
    /// Limits on all sessions together (the `allox` cgroup).
    pub total: Limits,
    /// Give every session its own network namespace with only loopback,
    /// shared by its runs.
    pub isolate_network: bool,
    /// The loaded plugins: asked before each run (its cgroup exists,
    /// empty), their contributions merged into its sandbox, told when it
    /// ends. None by default.
    pub plugins: Arc<Plugins>,
    /// How many finished runs are kept for `process.wait`, how long, and
    /// how much of their output.
    pub finished: Retention,
    /// Whether a run's end reads what it used from its cgroup
    /// (`RunResult.usage`); on unless `--no-run-usage` (the benchmark's
    /// baseline).
    pub run_usage: bool,
    /// Whether each session's context keeps the next run's PID 1 made
    /// ahead (its namespaces and own mounts), so that a start only moves
    /// it into the run's cgroup and hands it the request. Off by default
    /// (measured slower on 2 vCPUs: docs/benchmarks.md); the daemon's
    /// `--prepared-runs`. Never for observed runs, whose first process is
    /// cloned into their frozen cgroup once A is sealed.
    pub prepare_runs: bool,
    /// How long an observed run's cgroup may take to freeze, at its start
    /// and at its end (`--freeze-timeout-ms`); past it, the run's start
    /// is refused or its evidence is at best INCOMPLETE.
    pub freeze_wait: std::time::Duration,
    /// The points after each step of a run's start
    /// (`allox_store::failpoint::RUN_STARTS`), armed for tests as the
    /// store's are; none by default.
    pub failpoints: Failpoints,
    /// Where runs started and ended are counted (the supervisor's).
    pub metrics: Arc<crate::plugin_api::metrics::Metrics>,
}

impl RunsConfig {
    /// Bytes of output all finished runs keep together, by default.
    pub const DEFAULT_FINISHED_OUTPUT_BUDGET: usize = 64 << 20;
    /// Finished runs kept, by default.
    pub const DEFAULT_FINISHED_RUNS_MAX: usize = 10_000;
    /// How long a freeze may take, by default.
    pub const DEFAULT_FREEZE_MS: u64 = 5_000;

    pub fn new(cgroup_mount: PathBuf, init_exe: PathBuf, stage: PathBuf) -> Self {
        RunsConfig {
            cgroup_mount,
            init_exe,
            uid: 10_000,
            gid: 10_000,
            stage,
            system_dirs: [
                "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc", "/opt",
            ]
            .iter()
            .map(PathBuf::from)
            .collect(),
            // Both streams together stay well inside one 1 MiB frame.
            capture_limit: 256 << 10,
            tmp_sync_cap: 64 << 20,
            no_reflinks: false,
            limits: Limits::default(),
            total: Limits::default(),
            isolate_network: false,
            plugins: Arc::new(Plugins::none()),
            finished: Retention::default(),
            run_usage: true,
            prepare_runs: false,
            freeze_wait: std::time::Duration::from_millis(Self::DEFAULT_FREEZE_MS),
            failpoints: Failpoints::default(),
            metrics: Arc::default(),
        }
    }
}

impl RunsConfig {
    /// Refuses identities that would leave sandboxed programs privileged:
    /// uid or gid 0 (root), and `u32::MAX`, which `setresuid`/`setresgid`
    /// read as "leave unchanged" (so the program would stay root).
    pub fn check(&self) -> Result<(), ConfigError> {
        for (flag, what, id) in [
            ("--sandbox-uid", "uid", self.uid),
            ("--sandbox-gid", "gid", self.gid),
        ] {
            if id == 0 {
                return Err(ConfigError::Root { flag, what });
            }
            if id == u32::MAX {
                return Err(ConfigError::Unchanged { flag, what });
            }
        }
        Ok(())
    }
}

struct Run {
    id: String,
    agent: String,
    session: String,
    /// Its init's pid in the supervisor's PID namespace (as `Started`
    /// tells it).
    pid: i32,
    /// Dropped once the init is reaped.
    pidfd: Mutex<Option<OwnedFd>>,
    /// Until it is closed.
    stdin: tokio::sync::Mutex<Option<Input>>,
    /// A terminal run's terminal, until the run ends.
    terminal: Mutex<Option<Arc<terminal::Terminal>>>,
    result: watch::Sender<Option<RunResult>>,
    /// Its output for `process.logs`.
    log: Arc<output::Log>,
    timed_out: AtomicBool,
    /// What the run's services made for it; dropped once the init is
    /// reaped.
    attached: Mutex<Option<Box<dyn Send + Sync>>>,
    /// What the plugins say about it (`plugin.key`, value).
    metadata: Vec<(String, String)>,
    /// Its init's pid, when the plugins observe the run.
    observed: Option<i32>,
    /// Its session's network as it was when the run started.
    network: SessionNetwork,
    /// What it was asked to run, for which tool call, and when it
    /// started: told to the plugins when it ends.
    asked: RunRequest,
}

/// What a run was asked to run, for which tool call, and when it started.
struct RunRequest {
    argv: Vec<String>,
    trace: Option<allox_protocol::TraceContext>,
    started: std::time::SystemTime,
}

/// Where `process.stdin` writes.
enum Input {
    Pipe(tokio::net::unix::pipe::Sender),
    /// The run's terminal ([`Run::terminal`]).
    Terminal,
}

impl Run {
    fn terminal(&self) -> Option<Arc<terminal::Terminal>> {
        self.terminal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// What a start needs of its session: the workspace paths, and the
/// network.
pub struct SessionPaths {
    pub current: PathBuf,
    pub shared: PathBuf,
    pub network: SessionNetwork,
}

pub struct Runs {
    cfg: RunsConfig,
    cgroups: Cgroups,
    exe: OwnedFd,
    table: Mutex<HashMap<String, Arc<Run>>>,
    /// The finished runs of `table`, oldest first, within their bounds.
    finished: Mutex<Finished>,
    /// Sessions (or whole agents) being rolled back or deleted: no new
    /// runs.
    fences: Fences,
    next: AtomicU64,
    /// When this supervisor began (ms since the Unix epoch, as run ids
    /// carry): a run whose id is older was not started by it.
    began_ms: u64,
    /// Attached to every run as it starts (the in-sandbox interface).
    services: std::sync::OnceLock<Arc<dyn RunServices>>,
    /// Each session's context, by `agent/session/`.
    contexts: context::Slots,
    /// [`Runs::session_files`], once known.
    session_files: std::sync::OnceLock<SessionFiles>,
    /// Runs an earlier supervisor left, with their cgroups, until the
    /// services are attached to them again ([`Runs::reattach`]).
    adopted: Mutex<Vec<(RunIdentity, PathBuf)>>,
    /// Paused sessions, by `agent/session/` ([`pause`]).
    paused: pause::Paused,
}

/// What a session's root holds without services.
static NO_FILES: SessionFiles = SessionFiles {
    binds: Vec::new(),
    links: Vec::new(),
};

fn key(a: &str, s: &str, r: &str) -> String {
    format!("{a}/{s}/{r}")
}

impl Runs {
    pub fn new(cfg: RunsConfig) -> Result<Runs, RunError> {
        cfg.check()?;
        let cgroups = Cgroups::open(&cfg.cgroup_mount)?;
        cgroups
            .check_limits(&cfg.limits)
            .map_err(RunError::DefaultLimits)?;
        if cfg.total != Limits::default() {
            cgroups
                .set_total_limits(&cfg.total)
                .map_err(RunError::TotalLimits)?;
        }
        std::fs::create_dir_all(&cfg.stage).map_err(|source| RunError::Io {
            op: "create",
            path: cfg.stage.clone(),
            source,
        })?;
        let exe = rustix::fs::open(
            &cfg.init_exe,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| RunError::Io {
            op: "open",
            path: cfg.init_exe.clone(),
            source: e.into(),
        })?;
        let adopted = adopt(&cgroups, &cfg.plugins);
        Ok(Runs {
            adopted: Mutex::new(adopted),
            paused: pause::Paused::default(),
            session_files: std::sync::OnceLock::new(),
            finished: Mutex::new(Finished::new(cfg.finished)),
            cfg,
            cgroups,
            exe,
            table: Mutex::new(HashMap::new()),
            fences: Fences::default(),
            next: AtomicU64::new(1),
            began_ms: allox_store::clock::now_ms(),
            services: std::sync::OnceLock::new(),
            contexts: context::Slots::default(),
        })
    }

    /// Installs the services attached to every run from now on (once;
    /// a second call is ignored and returns false).
    pub fn set_services(&self, services: Arc<dyn RunServices>) -> bool {
        self.services.set(services).is_ok()
    }

    /// What the services put in every session's root (asked of them once,
    /// after they are set: it is the same for every run).
    fn session_files(&self) -> &SessionFiles {
        match self.services.get() {
            Some(s) => self.session_files.get_or_init(|| s.session_files()),
            None => &NO_FILES,
        }
    }

    /// Within the async runtime, once the services are set: takes up the
    /// runs an earlier supervisor left ([`adopted`]: their output, terminal
    /// and end followed as this supervisor's own), and attaches the
    /// services again to each (the in-sandbox interface listens again in
    /// each one's directory). A run whose PID 1 kept nothing to take up (a
    /// build before) keeps only what was attached again, held by one thread
    /// that releases each run's as its cgroup empties.
    pub fn reattach(self: &Arc<Self>) {
        let adopted = std::mem::take(&mut *self.adopted.lock().unwrap_or_else(|e| e.into_inner()));
        if adopted.is_empty() {
            return;
        }
        let ids: Vec<RunIdentity> = adopted.iter().map(|(id, _)| id.clone()).collect();
        let mut guards: Vec<(RunIdentity, Box<dyn Send + Sync>)> = match self.services.get() {
            Some(svc) => svc.reattach(&ids),
            None => Vec::new(),
        };
        let mut held: Vec<(PathBuf, Box<dyn Send + Sync>)> = Vec::new();
        for (id, dir) in adopted {
            let guard = guards
                .iter()
                .position(|(g, _)| *g == id)
                .map(|i| guards.swap_remove(i).1);
            if let Err((why, guard)) = self.take_up(&id, &dir, guard) {
                tracing::warn!(
                    agent = id.agent,
                    session = id.session,
                    run = id.run,
                    %why,
                    "a run an earlier supervisor started cannot be followed again: its output is not read"
                );
                held.extend(guard.map(|g| (dir, g)));
            }
        }
        if held.is_empty() {
            return;
        }
        let cg = self.cgroups.clone();
        let watcher = std::thread::Builder::new()
            .name("allox-adopted".into())
            .spawn(move || {
                while !held.is_empty() {
                    // Dropping a guard releases that run's attachment.
                    held.retain(|(dir, _)| cg.populated(dir));
                    std::thread::sleep(Duration::from_millis(250));
                }
            });
        if let Err(e) = watcher {
            tracing::warn!(error = %e, "cannot watch the adopted runs: their in-sandbox interfaces are closed");
        }
    }

    pub fn config(&self) -> &RunsConfig {
        &self.cfg
    }

    pub fn cgroups(&self) -> &Cgroups {
        &self.cgroups
    }

    /// The run, while it is live or kept finished.
    fn get(&self, a: &str, s: &str, r: &str) -> Option<Arc<Run>> {
        let expired = self
            .finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .expire(Instant::now());
        self.evict(expired);
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key(a, s, r))
            .cloned()
    }

    /// Keeps a finished run for `process.wait` within the bounds of
    /// [`RunsConfig::finished`].
    fn retire(&self, run: &Run, output_bytes: usize) {
        let evicted = self
            .finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(
                key(&run.agent, &run.session, &run.id),
                output_bytes,
                Instant::now(),
            );
        self.evict(evicted);
    }

    fn evict(&self, evicted: Vec<Evict>) {
        if evicted.is_empty() {
            return;
        }
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        for e in evicted {
            match e {
                Evict::Run(k) => {
                    table.remove(&k);
                }
                Evict::Output(k) => {
                    if let Some(run) = table.get(&k) {
                        run.result.send_modify(|r| {
                            if let Some(r) = r {
                                r.stdout = String::new();
                                r.stderr = String::new();
                                r.output_dropped = true;
                            }
                        });
                    }
                }
            }
        }
    }
}

/// Runs left by an earlier supervisor stay (and the plugins hear of them:
/// the tracker follows them from now on); only empty cgroups go. Returns
/// the runs that stay, with their cgroups.
fn adopt(cgroups: &Cgroups, plugins: &Plugins) -> Vec<(RunIdentity, PathBuf)> {
    let mut live = Vec::new();
    if let Ok(agents) = std::fs::read_dir(cgroups.base()) {
        for a in agents.flatten() {
            for s in std::fs::read_dir(a.path()).into_iter().flatten().flatten() {
                // A context's cgroup: its process ended with the supervisor
                // that made it (end of its control socket).
                if s.file_name()
                    .to_string_lossy()
                    .starts_with(allox_sandbox::cgroup::CONTEXT_PREFIX)
                {
                    let _ = cgroups.kill(&s.path(), std::time::Duration::from_secs(10));
                    let _ = cgroups.remove(&s.path());
                    continue;
                }
                for r in std::fs::read_dir(s.path()).into_iter().flatten().flatten() {
                    if !r.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                        continue;
                    }
                    if !cgroups.populated(&r.path()) {
                        let _ = cgroups.remove(&r.path());
                        continue;
                    }
                    let rn = r.file_name();
                    let run = rn.to_string_lossy();
                    let id = RunIdentity {
                        agent: a.file_name().to_string_lossy().into_owned(),
                        session: s.file_name().to_string_lossy().into_owned(),
                        run: run.strip_prefix("run-").unwrap_or(&run).to_string(),
                    };
                    if !plugins.is_empty() {
                        // A run of an earlier supervisor: what its
                        // processes do from now on is attributed too.
                        if let Ok(md) = std::fs::metadata(r.path()) {
                            use std::os::unix::fs::MetadataExt;
                            // (The session's mode is the store's; a run
                            // adopted is told as `disabled`, which only the
                            // network plugin reads, and it serves sessions,
                            // not runs.)
                            let run = RunRef {
                                agent: &id.agent,
                                session: &id.session,
                                run: &id.run,
                                network: &SessionNetwork::default(),
                            };
                            // The cgroup's id is its directory's inode.
                            plugins.adopt_run(&run, md.ino());
                        }
                    }
                    live.push((id, r.path()));
                }
            }
        }
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_unchanged_ids_are_refused_naming_the_flag() {
        let base = RunsConfig::new("/nonexistent".into(), "/nonexistent".into(), "/x".into());
        assert_eq!(base.check(), Ok(()));
        for (uid, gid, flag) in [
            (0, 10_000, "--sandbox-uid 0"),
            (10_000, 0, "--sandbox-gid 0"),
            (u32::MAX, 10_000, "--sandbox-uid 4294967295"),
            (10_000, u32::MAX, "--sandbox-gid 4294967295"),
        ] {
            let cfg = RunsConfig {
                uid,
                gid,
                ..base.clone()
            };
            let e = cfg.check().unwrap_err().to_string();
            assert!(e.starts_with(flag), "{e}");
            // Runs::new refuses it before touching anything.
            let e = Runs::new(cfg).err().unwrap();
            assert!(matches!(e, RunError::Config(_)), "{e:?}");
            assert!(e.to_string().starts_with(flag), "{e}");
        }
    }
}
