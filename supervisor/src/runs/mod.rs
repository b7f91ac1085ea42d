//! Runs: processes started in a session's sandbox, their output, their end.
//!
//! Each run has its own cgroup below the session's
//! (`allox/<agent>/<session>/run-<id>`), its sandbox init's pidfd (the only
//! handle the supervisor signals through), pipes for stdin, stdout and
//! stderr, and a status pipe on which the init reports how the program
//! ended. The cgroup stays the source of truth: listing and killing read it,
//! so runs started by an earlier supervisor (re-adopted after a restart) are
//! listed and killed like the others.

pub mod fence;
pub mod finished;
pub mod listing;
mod output;
pub mod procfs;
pub mod validate;

use allox_protocol::{
    ErrorBody, ErrorCode, Event, ProcessKill, ProcessListing, ProcessStart, RunResult, RunStarted,
    StreamKind,
};
use allox_sandbox::cgroup::{CgroupError, Cgroups, Limits};
use allox_sandbox::{InitStatus, SandboxSpec};
use fence::{Fence, Fences};
use finished::{Evict, Finished, Retention};
use output::{Capture, Readers};
use rustix::fd::OwnedFd;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

/// Where a run's stream events go (binary protocol clients).
pub type EventSink = mpsc::Sender<Event>;

#[derive(Debug, Clone)]
pub struct RunsConfig {
    /// cgroup2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a
    /// hybrid host).
    pub cgroup_mount: PathBuf,
    /// The binary that serves as the sandbox's PID 1 (`allox-init`).
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
    /// Limits applied to every session's cgroup.
    pub limits: Limits,
    /// Limits on all sessions together (the `allox` cgroup).
    pub total: Limits,
    /// Give every sandbox its own network namespace with only loopback.
    pub isolate_network: bool,
    /// The eBPF process tracker, when it is on: every run's cgroup is
    /// tagged with it before the run's first process exists.
    pub tracker: Option<Arc<crate::tracker::ProcessTracker>>,
    /// How many finished runs are kept for `process.wait`, how long, and
    /// how much of their output.
    pub finished: Retention,
}

impl RunsConfig {
    /// Bytes of output all finished runs keep together, by default.
    pub const DEFAULT_FINISHED_OUTPUT_BUDGET: usize = 64 << 20;
    /// Finished runs kept, by default.
    pub const DEFAULT_FINISHED_RUNS_MAX: usize = 10_000;

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
            limits: Limits::default(),
            total: Limits::default(),
            isolate_network: false,
            tracker: None,
            finished: Retention::default(),
        }
    }
}

impl RunsConfig {
    /// Refuses identities that would leave sandboxed programs privileged:
    /// uid or gid 0 (root), and `u32::MAX`, which `setresuid`/`setresgid`
    /// read as "leave unchanged" (so the program would stay root).
    pub fn check(&self) -> Result<(), String> {
        for (flag, what, id) in [
            ("--sandbox-uid", "uid", self.uid),
            ("--sandbox-gid", "gid", self.gid),
        ] {
            if id == 0 {
                return Err(format!(
                    "{flag} 0: sandboxed programs must not run as root; \
                     give an unprivileged {what} (the default is 10000)"
                ));
            }
            if id == u32::MAX {
                return Err(format!(
                    "{flag} {id}: the kernel reads {what} -1 as \"unchanged\", \
                     so sandboxed programs would stay root; give an unprivileged {what}"
                ));
            }
        }
        Ok(())
    }
}

struct Run {
    id: String,
    agent: String,
    session: String,
    /// Dropped once the init is reaped.
    pidfd: Mutex<Option<OwnedFd>>,
    stdin: tokio::sync::Mutex<Option<tokio::net::unix::pipe::Sender>>,
    result: watch::Sender<Option<RunResult>>,
    timed_out: AtomicBool,
}

/// Everything a session's workspace paths are, for one start.
pub struct SessionPaths {
    pub current: PathBuf,
    pub shared: PathBuf,
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
}

fn key(a: &str, s: &str, r: &str) -> String {
    format!("{a}/{s}/{r}")
}

fn invalid(m: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::InvalidRequest, m)
}

fn internal(m: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::Internal, m)
}

fn cg_err(e: CgroupError) -> ErrorBody {
    let code = match e {
        CgroupError::Unsupported { .. } => ErrorCode::Unsupported,
        _ => ErrorCode::Internal,
    };
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    ErrorBody::new(code, msg)
}

impl Runs {
    pub fn new(cfg: RunsConfig) -> Result<Runs, String> {
        cfg.check()?;
        let cgroups = Cgroups::open(&cfg.cgroup_mount).map_err(|e| cg_err(e).message)?;
        cgroups
            .check_limits(&cfg.limits)
            .map_err(|e| format!("default session limits: {}", cg_err(e).message))?;
        if cfg.total != Limits::default() {
            cgroups
                .set_total_limits(&cfg.total)
                .map_err(|e| format!("limits of all sessions together: {}", cg_err(e).message))?;
        }
        std::fs::create_dir_all(&cfg.stage)
            .map_err(|e| format!("create {}: {e}", cfg.stage.display()))?;
        let exe = rustix::fs::open(
            &cfg.init_exe,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("open {}: {e}", cfg.init_exe.display()))?;
        // Runs left by an earlier supervisor stay; only empty cgroups go.
        if let Ok(agents) = std::fs::read_dir(cgroups.base()) {
            for a in agents.flatten() {
                for s in std::fs::read_dir(a.path()).into_iter().flatten().flatten() {
                    for r in std::fs::read_dir(s.path()).into_iter().flatten().flatten() {
                        if !r.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                            continue;
                        }
                        if !cgroups.populated(&r.path()) {
                            let _ = cgroups.remove(&r.path());
                        } else if let Some(t) = &cfg.tracker {
                            // A run of an earlier supervisor: what its
                            // processes do from now on is attributed too.
                            let (an, sn) = (a.file_name(), s.file_name());
                            let rn = r.file_name();
                            let run = rn.to_string_lossy();
                            let run = run.strip_prefix("run-").unwrap_or(&run);
                            if let Ok(md) = std::fs::metadata(r.path()) {
                                use std::os::unix::fs::MetadataExt;
                                let _ = t.tag_run(
                                    &an.to_string_lossy(),
                                    &sn.to_string_lossy(),
                                    run,
                                    md.ino(),
                                );
                            }
                        }
                    }
                }
            }
        }
        Ok(Runs {
            finished: Mutex::new(Finished::new(cfg.finished)),
            cfg,
            cgroups,
            exe,
            table: Mutex::new(HashMap::new()),
            fences: Fences::default(),
            next: AtomicU64::new(1),
        })
    }

    pub fn config(&self) -> &RunsConfig {
        &self.cfg
    }

    pub fn cgroups(&self) -> &Cgroups {
        &self.cgroups
    }

    fn new_run_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:x}{:04x}", allox_store::clock::now_ms(), n & 0xffff)
    }

    /// Makes a directory the sandbox user writes in (a session's
    /// `current/`, an agent's `shared/`) belong to that user. The directory
    /// itself, never a symlink in its place.
    pub fn own(&self, dir: &Path) {
        use rustix::fs::{AtFlags, Gid, Uid};
        let st = match rustix::fs::statat(rustix::fs::CWD, dir, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() => st,
            _ => return,
        };
        // Only when needed: a chown changes the directory's ctime.
        if st.st_uid != self.cfg.uid || st.st_gid != self.cfg.gid {
            let (uid, gid) = (Uid::from_raw(self.cfg.uid), Gid::from_raw(self.cfg.gid));
            if let Err(e) = rustix::fs::chownat(
                rustix::fs::CWD,
                dir,
                Some(uid),
                Some(gid),
                AtFlags::SYMLINK_NOFOLLOW,
            ) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot hand the directory to the sandbox user");
            }
        }
    }

    /// Starts a run. With `wait`, answers when it ends.
    pub async fn start(
        self: &Arc<Self>,
        p: &ProcessStart,
        paths: SessionPaths,
        events: Option<EventSink>,
    ) -> Result<allox_protocol::Response, ErrorBody> {
        let (a, s) = (p.agent_id.as_str(), p.session_id.as_str());
        let cwd = validate::check(&p.argv, &p.env, p.cwd.as_deref()).map_err(invalid)?;
        let program = validate::resolve(&p.argv[0], &cwd, &paths.current, &self.cfg.system_dirs)
            .map_err(invalid)?;
        if let Some(dir) = p.cwd.as_deref() {
            if !paths.current.join(dir).is_dir() {
                return Err(invalid(format!(
                    "cwd {dir:?} is not a directory in the session"
                )));
            }
        }
        self.check_fence(a, s)?;
        self.cgroups
            .ensure_session(a, s, &self.cfg.limits)
            .map_err(cg_err)?;
        let id = self.new_run_id();
        let cg = self.cgroups.create_run(a, s, &id).map_err(cg_err)?;
        if let Some(t) = &self.cfg.tracker {
            // The cgroup's id is its directory's inode number.
            let tagged = rustix::fs::fstat(&cg)
                .map_err(|e| e.to_string())
                .and_then(|st| t.tag_run(a, s, &id, st.st_ino));
            if let Err(e) = tagged {
                let _ = self.cgroups.remove(&self.cgroups.run_dir(a, s, &id));
                return Err(ErrorBody::new(
                    ErrorCode::Internal,
                    format!("run not started: the process tracker cannot follow it: {e}"),
                ));
            }
        }
        let mut env = vec![
            ("PATH".to_string(), validate::PATH.to_string()),
            (
                "HOME".to_string(),
                allox_sandbox::spec::SESSION_MOUNT.to_string(),
            ),
            ("TMPDIR".to_string(), "/tmp".to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
            (
                "ALLOX_AGENT_WORKSPACE".to_string(),
                allox_sandbox::spec::WORKSPACE_MOUNT.to_string(),
            ),
            (
                "ALLOX_AGENT_SHARED".to_string(),
                allox_sandbox::spec::SHARED_MOUNT.to_string(),
            ),
            ("ALLOX_AGENT_ID".to_string(), a.to_string()),
            ("ALLOX_SESSION_ID".to_string(), s.to_string()),
            ("ALLOX_RUN_ID".to_string(), id.clone()),
        ];
        for (k, v) in &p.env {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        let spec = SandboxSpec {
            program,
            argv: p.argv.clone(),
            env,
            cwd,
            uid: self.cfg.uid,
            gid: self.cfg.gid,
            session: paths.current.clone(),
            shared: paths.shared.clone(),
            stage: self.cfg.stage.clone(),
            system_dirs: self.cfg.system_dirs.clone(),
            hostname: "allox".into(),
            isolate_network: self.cfg.isolate_network,
            tmp_sync_cap: self.cfg.tmp_sync_cap,
        };
        // Also for sessions and agents made before (or adopted by recovery).
        self.own(&paths.current);
        self.own(&paths.shared);
        // clone3 and the spec write block; keep them off the I/O workers.
        let exe = rustix::io::fcntl_dupfd_cloexec(&self.exe, 0)
            .map_err(|e| internal(format!("dup: {e}")))?;
        let spawned = tokio::task::spawn_blocking(move || allox_sandbox::spawn(&exe, &spec, &cg))
            .await
            .map_err(|e| internal(e.to_string()))?;
        let spawned = match spawned {
            Ok(sp) => sp,
            Err(e) => {
                let _ = self.cgroups.remove(&self.cgroups.run_dir(a, s, &id));
                let code = match e.errno() {
                    Some(libc::EAGAIN) => ErrorCode::Unavailable,
                    Some(libc::ENOSYS) | Some(libc::EINVAL) => ErrorCode::Unsupported,
                    _ => ErrorCode::Internal,
                };
                return Err(ErrorBody::new(
                    code,
                    format!("cannot start the sandbox: {e}"),
                ));
            }
        };
        // A rollback or delete may have fenced the session while the
        // sandbox was being made: then this run must not live on.
        if let Err(e) = self.check_fence(a, s) {
            let _ =
                rustix::process::pidfd_send_signal(&spawned.pidfd, rustix::process::Signal::KILL);
            let dir = self.cgroups.run_dir(a, s, &id);
            let cg = self.cgroups.clone();
            let pidfd = spawned.pidfd;
            let _ = tokio::task::spawn_blocking(move || {
                let _ = cg.kill(&dir, Duration::from_secs(10));
                let _ = rustix::process::waitid(
                    rustix::process::WaitId::PidFd(rustix::fd::AsFd::as_fd(&pidfd)),
                    rustix::process::WaitIdOptions::EXITED,
                );
                let _ = cg.remove(&dir);
            })
            .await;
            return Err(e);
        }
        let to_pipe_err = |e: std::io::Error| internal(format!("pipe: {e}"));
        let stdin =
            tokio::net::unix::pipe::Sender::from_owned_fd(spawned.stdin).map_err(to_pipe_err)?;
        let (tx, rx) = watch::channel(None);
        let run = Arc::new(Run {
            id: id.clone(),
            agent: a.to_string(),
            session: s.to_string(),
            pidfd: Mutex::new(Some(spawned.pidfd)),
            stdin: tokio::sync::Mutex::new(Some(stdin)),
            result: tx,
            timed_out: AtomicBool::new(false),
        });
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key(a, s, &id), run.clone());
        if let Some(ev) = &events {
            let _ = ev
                .send(Event::Started(RunStarted {
                    run_id: id.clone(),
                    pid: spawned.pid,
                }))
                .await;
        }
        // Output readers.
        let capture = Arc::new(Mutex::new(Capture::default()));
        let mut pipes = Vec::new();
        for (fd, kind) in [
            (spawned.stdout, StreamKind::Stdout),
            (spawned.stderr, StreamKind::Stderr),
        ] {
            let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(fd).map_err(to_pipe_err)?;
            pipes.push((rx, kind));
        }
        let readers = Readers::start(pipes, &id, events.clone(), &capture, self.cfg.capture_limit);
        // Initial stdin, then close.
        if let Some(data) = p.stdin.clone() {
            let run = run.clone();
            tokio::spawn(async move {
                let mut g = run.stdin.lock().await;
                if let Some(mut w) = g.take() {
                    // A program that never reads its input does not hold
                    // the run's end hostage.
                    let _ =
                        tokio::time::timeout(Duration::from_secs(10), w.write_all(data.as_bytes()))
                            .await;
                }
            });
        }
        // The end: status, then a short drain of the output.
        let status_rx =
            tokio::net::unix::pipe::Receiver::from_owned_fd(spawned.status).map_err(to_pipe_err)?;
        tokio::spawn(finish(
            self.clone(),
            run.clone(),
            status_rx,
            readers,
            capture,
        ));
        // Reap the init when the namespace empties, and drop its cgroup.
        tokio::spawn(reap(self.clone(), run.clone()));
        if let Some(ms) = p.timeout_ms {
            let (runs, run) = (self.clone(), run.clone());
            let mut done = rx.clone();
            tokio::spawn(async move {
                let expired = tokio::time::timeout(Duration::from_millis(ms), async {
                    while done.borrow_and_update().is_none() {
                        if done.changed().await.is_err() {
                            break;
                        }
                    }
                })
                .await
                .is_err();
                if expired {
                    run.timed_out.store(true, Ordering::SeqCst);
                    let dir = runs.cgroups.run_dir(&run.agent, &run.session, &run.id);
                    let cg = runs.cgroups.clone();
                    let _ =
                        tokio::task::spawn_blocking(move || cg.kill(&dir, Duration::from_secs(10)))
                            .await;
                }
            });
        }
        if !p.wait {
            return Ok(allox_protocol::Response::Started(RunStarted {
                run_id: id,
                pid: spawned.pid,
            }));
        }
        let r = wait_result(rx, None).await?;
        Ok(allox_protocol::Response::Exited(r))
    }

    /// Waits for a run's end (at most `timeout`).
    pub async fn wait(
        &self,
        a: &str,
        s: &str,
        run_id: &str,
        timeout: Option<Duration>,
    ) -> Result<RunResult, ErrorBody> {
        allox_protocol::validate_id("run_id", run_id).map_err(|e| invalid(e.to_string()))?;
        let run = self.get(a, s, run_id);
        match run {
            Some(run) => wait_result(run.result.subscribe(), timeout).await,
            None if self.cgroups.run_dir(a, s, run_id).exists() => {
                // Started by an earlier supervisor: its status is gone; wait
                // for its processes to end.
                let dir = self.cgroups.run_dir(a, s, run_id);
                let cg = self.cgroups.clone();
                let t = timeout.unwrap_or(Duration::from_secs(24 * 3600));
                tokio::task::spawn_blocking(move || cg.wait_empty(&dir, t))
                    .await
                    .map_err(|e| internal(e.to_string()))?
                    .map_err(|_| {
                        ErrorBody::new(
                            ErrorCode::Unavailable,
                            format!("run {run_id} is still running"),
                        )
                    })?;
                Ok(RunResult {
                    run_id: run_id.to_string(),
                    exit_code: None,
                    signal: None,
                    stdout: String::new(),
                    stderr: "(started by an earlier supervisor: exit status unknown)".into(),
                    truncated: false,
                    timed_out: false,
                    output_dropped: false,
                })
            }
            None => {
                let r = &self.cfg.finished;
                Err(ErrorBody::new(
                    ErrorCode::NotFound,
                    format!(
                        "run {a}/{s}/{run_id} does not exist (finished runs are kept {} s, the newest {} of them)",
                        r.keep_for.as_secs(),
                        r.max_runs
                    ),
                ))
            }
        }
    }

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

    /// Writes to a run's standard input, or closes it.
    pub async fn stdin(
        &self,
        a: &str,
        s: &str,
        run_id: &str,
        data: &[u8],
        close: bool,
    ) -> Result<allox_protocol::StdinWritten, ErrorBody> {
        allox_protocol::validate_id("run_id", run_id).map_err(|e| invalid(e.to_string()))?;
        let run = self.get(a, s, run_id).ok_or_else(|| {
            ErrorBody::new(
                ErrorCode::NotFound,
                format!("run {a}/{s}/{run_id} does not exist"),
            )
        })?;
        let mut g = run.stdin.lock().await;
        let Some(w) = g.as_mut() else {
            return Err(ErrorBody::new(
                ErrorCode::Conflict,
                format!("standard input of run {run_id} is closed"),
            ));
        };
        tokio::time::timeout(Duration::from_secs(10), w.write_all(data))
            .await
            .map_err(|_| {
                ErrorBody::new(
                    ErrorCode::Unavailable,
                    "the program does not read its input",
                )
            })?
            .map_err(|e| ErrorBody::new(ErrorCode::Conflict, format!("cannot write: {e}")))?;
        if close {
            *g = None;
        }
        Ok(allox_protocol::StdinWritten {
            written: data.len() as u64,
            closed: close,
        })
    }

    /// Kills or signals one run or the whole session.
    pub async fn kill(&self, p: &ProcessKill) -> Result<u32, ErrorBody> {
        let (a, s) = (p.agent_id.as_str(), p.session_id.as_str());
        if let Some(r) = &p.run_id {
            allox_protocol::validate_id("run_id", r).map_err(|e| invalid(e.to_string()))?;
        }
        let sig = p.signal.unwrap_or(libc::SIGKILL);
        let Some(signal) = rustix::process::Signal::from_named_raw(sig) else {
            return Err(invalid(format!(
                "signal {sig} is not a signal this supervisor sends"
            )));
        };
        if sig == libc::SIGSTOP {
            return Err(ErrorBody::new(
                ErrorCode::Unsupported,
                "SIGSTOP would stop the sandbox's init, not the program; send SIGTSTP",
            ));
        }
        let dir = match &p.run_id {
            Some(r) => {
                let d = self.cgroups.run_dir(a, s, r);
                if !d.exists() && self.get(a, s, r).is_none() {
                    return Err(ErrorBody::new(
                        ErrorCode::NotFound,
                        format!("run {a}/{s}/{r} does not exist"),
                    ));
                }
                d
            }
            None => self.cgroups.session_dir(a, s),
        };
        if sig == libc::SIGKILL {
            let n = self.programs_in(&dir) as u32;
            let cg = self.cgroups.clone();
            tokio::task::spawn_blocking(move || cg.kill(&dir, Duration::from_secs(10)))
                .await
                .map_err(|e| internal(e.to_string()))?
                .map_err(cg_err)?;
            return Ok(n);
        }
        // Other signals go to each run's init, which passes them on to its
        // program; only through pidfds.
        let runs: Vec<Arc<Run>> = self
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|r| {
                r.agent == a
                    && r.session == s
                    && p.run_id.as_deref().is_none_or(|id| id == r.id)
                    && r.result.borrow().is_none()
            })
            .cloned()
            .collect();
        let mut n = 0;
        for r in runs {
            let g = r.pidfd.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(fd) = g.as_ref() {
                if rustix::process::pidfd_send_signal(fd, signal).is_ok() {
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// The session's live processes (the sandbox inits left out), lowest
    /// PIDs first, within the bounds of one answer ([`listing`]).
    pub fn list(&self, a: &str, s: &str) -> ProcessListing {
        let mut pids = self.cgroups.procs(&self.cgroups.session_dir(a, s));
        let set: HashSet<i32> = pids.iter().copied().collect();
        pids.sort_unstable();
        pids.dedup();
        // Details are read only for the processes that are listed.
        let infos = pids
            .into_iter()
            .filter(|&p| procfs::ppid(p).is_some_and(|pp| set.contains(&pp)))
            .filter_map(procfs::info);
        listing::bounded(
            infos,
            ProcessListing::MAX_ENTRIES,
            ProcessListing::MAX_BYTES,
        )
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

    /// How many of the session's processes are the agent's (the sandbox
    /// inits are not counted).
    pub fn live(&self, a: &str, s: &str) -> usize {
        self.programs_in(&self.cgroups.session_dir(a, s))
    }

    fn programs_in(&self, dir: &Path) -> usize {
        self.programs(dir).len()
    }

    /// PIDs in `dir` and below, without the sandbox inits (the ones whose
    /// parent is outside the cgroup).
    fn programs(&self, dir: &Path) -> Vec<i32> {
        let pids = self.cgroups.procs(dir);
        let set: HashSet<i32> = pids.iter().copied().collect();
        pids.into_iter()
            .filter(|&p| procfs::ppid(p).is_some_and(|pp| set.contains(&pp)))
            .collect()
    }

    /// Refuses new runs in a session ([`fence::WHOLE_AGENT`]: every
    /// session of the agent) until the guard is dropped.
    pub fn fence(&self, a: &str, s: &str) -> Fence<'_> {
        self.fences.hold(a, s)
    }

    /// Runs `f` with new runs in the session (or agent) refused; they are
    /// allowed again however `f` ends, a panic included.
    pub fn fenced<T>(&self, a: &str, s: &str, f: impl FnOnce() -> T) -> T {
        let _fence = self.fence(a, s);
        f()
    }

    fn check_fence(&self, a: &str, s: &str) -> Result<(), ErrorBody> {
        if self.fences.is_fenced(a, s) {
            return Err(ErrorBody::new(
                ErrorCode::Conflict,
                format!("session {a}/{s} is being rolled back or deleted"),
            ));
        }
        Ok(())
    }

    /// Waits (blocking) up to `limit` for the session to hold no process,
    /// sandbox inits included.
    pub fn wait_unoccupied(&self, a: &str, s: &str, limit: Duration) {
        let until = Instant::now() + limit;
        while self.occupied(a, s) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the session has any process at all, sandbox inits included
    /// (a run still being set up counts).
    pub fn occupied(&self, a: &str, s: &str) -> bool {
        !self
            .cgroups
            .procs(&self.cgroups.session_dir(a, s))
            .is_empty()
    }

    /// Kills everything in `dir` (a session's or an agent's cgroup) and
    /// removes the cgroups. Blocking.
    pub fn kill_tree(&self, dir: &Path, remove: bool) -> Result<u32, ErrorBody> {
        let n = self.programs_in(dir) as u32;
        self.cgroups
            .kill(dir, Duration::from_secs(10))
            .map_err(cg_err)?;
        if remove {
            self.cgroups.remove(dir).map_err(cg_err)?;
        }
        Ok(n)
    }
}

/// Reads the init's status report, drains the output briefly, and
/// publishes the run's result.
async fn finish(
    runs: Arc<Runs>,
    run: Arc<Run>,
    mut status: tokio::net::unix::pipe::Receiver,
    readers: Readers,
    capture: Arc<Mutex<Capture>>,
) {
    let mut bytes = Vec::new();
    let _ = status.read_to_end(&mut bytes).await;
    let st: Option<InitStatus> = postcard::from_bytes(&bytes).ok();
    // A background process may keep the pipes open: wait a little, then
    // report what came, so a streamed answer is not held back.
    readers.drain(Duration::from_millis(100)).await;
    let c = std::mem::take(&mut *capture.lock().unwrap_or_else(|e| e.into_inner()));
    let mut stderr = String::from_utf8_lossy(&c.stderr).into_owned();
    let (exit_code, signal) = match st {
        Some(InitStatus::Exited(code)) => (Some(code), None),
        Some(InitStatus::Signaled(sig)) => (None, Some(sig)),
        Some(InitStatus::ExecFailed(errno)) => {
            stderr.push_str(&format!(
                "allox: cannot execute the program: {}\n",
                std::io::Error::from_raw_os_error(errno)
            ));
            (Some(127), None)
        }
        Some(InitStatus::SetupFailed(why)) => {
            stderr.push_str(&format!("allox: the sandbox could not be built: {why}\n"));
            (Some(126), None)
        }
        // The init itself died: the run's cgroup was killed.
        None => (None, Some(libc::SIGKILL)),
    };
    let result = RunResult {
        run_id: run.id.clone(),
        exit_code,
        signal,
        stdout: String::from_utf8_lossy(&c.stdout).into_owned(),
        stderr,
        truncated: c.truncated,
        timed_out: run.timed_out.load(Ordering::SeqCst),
        output_dropped: false,
    };
    if let Ok(mut g) = run.stdin.try_lock() {
        g.take();
    }
    let output_bytes = result.stdout.len() + result.stderr.len();
    // Kept whether or not anyone waits yet (`send` would drop it then).
    run.result.send_replace(Some(result));
    runs.retire(&run, output_bytes);
}

/// Reaps the init through its pidfd once the namespace is empty, then
/// removes the run's cgroup.
async fn reap(runs: Arc<Runs>, run: Arc<Run>) {
    use rustix::process::{waitid, WaitId, WaitIdOptions};
    let dup = {
        let g = run.pidfd.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref()
            .and_then(|fd| rustix::io::fcntl_dupfd_cloexec(fd, 0).ok())
    };
    if let Some(fd) = dup {
        // The descriptor is an OwnedFd moved in, so the I/O-safety concern
        // behind the deprecation does not apply.
        #[allow(deprecated)]
        let afd = tokio::io::unix::AsyncFd::with_interest(fd, tokio::io::Interest::READABLE);
        if let Ok(afd) = afd {
            let _ = afd.readable().await;
        }
    }
    // Reap without blocking a worker: poll until the init is gone.
    loop {
        let done = {
            let g = run.pidfd.lock().unwrap_or_else(|e| e.into_inner());
            match g.as_ref() {
                Some(fd) => !matches!(
                    waitid(
                        WaitId::PidFd(rustix::fd::AsFd::as_fd(fd)),
                        WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
                    ),
                    Ok(None)
                ),
                None => true,
            }
        };
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run.pidfd.lock().unwrap_or_else(|e| e.into_inner()).take();
    let dir = runs.cgroups.run_dir(&run.agent, &run.session, &run.id);
    let cg = runs.cgroups.clone();
    let _ = tokio::task::spawn_blocking(move || {
        if cg.wait_empty(&dir, Duration::from_secs(5)).is_ok() {
            let _ = cg.remove(&dir);
        }
    })
    .await;
}

async fn wait_result(
    mut rx: watch::Receiver<Option<RunResult>>,
    timeout: Option<Duration>,
) -> Result<RunResult, ErrorBody> {
    let wait = async {
        loop {
            if let Some(r) = rx.borrow_and_update().clone() {
                return Ok(r);
            }
            if rx.changed().await.is_err() {
                return Err(internal("the run's monitor stopped"));
            }
        }
    };
    match timeout {
        Some(t) => tokio::time::timeout(t, wait).await.unwrap_or_else(|_| {
            Err(ErrorBody::new(
                ErrorCode::Unavailable,
                format!("the run is still going after {} ms", t.as_millis()),
            ))
        }),
        None => wait.await,
    }
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
            let e = cfg.check().unwrap_err();
            assert!(e.starts_with(flag), "{e}");
            // Runs::new refuses it before touching anything.
            let e = Runs::new(cfg).err().unwrap();
            assert!(e.starts_with(flag), "{e}");
        }
    }
}
