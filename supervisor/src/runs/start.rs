//! `process.start`: a run's cgroup, its sandbox, its pipes, and the tasks
//! that follow it to its end.
//!
//! The order matters: the run's cgroup is made (and tagged for the process
//! tracker) before the sandbox is cloned straight into it, and the fence is
//! checked again once the sandbox exists, since a rollback or delete may
//! have fenced the session while it was being made.
//!
//! What a start has made is undone if it fails, however it fails: its
//! guard ([`super::starting`]) is disarmed only when the run is handed
//! over to the tasks that follow it to its end.

use super::output::{Log, Readers, Source};
use super::starting::Starting;
use super::terminal::Terminal;
use super::{end, key, validate, EventSink, Input, Run, RunError, RunRequest, Runs, SessionPaths};
use crate::plugin_api::RunRef;
use allox_protocol::{Event, ProcessStart, RunResult, RunStarted, StreamKind};
use allox_sandbox::{RunIo, SandboxSpec};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The longest `process.start` without `wait` waits for the program's
/// process after its PID 1 is made (a few hundred microseconds, unless the
/// run's cgroup is frozen meanwhile).
const PROGRAM_START_WAIT: Duration = Duration::from_secs(5);

impl Runs {
    fn new_run_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        // Four hex digits of the counter until a restore reseeds it (see
        // `reseed_ids`), eight after: two guests restored from one
        // snapshot then differ in the counter as well as in the time.
        if n >> 16 == 0 {
            format!("{:x}{:04x}", allox_store::clock::now_ms(), n)
        } else {
            format!("{:x}{:08x}", allox_store::clock::now_ms(), n & 0xffff_ffff)
        }
    }

    /// Starts the run ids' counter at a random place (after a restore
    /// from a snapshot, once the kernel's pool was reseeded).
    pub fn reseed_ids(&self) {
        let mut b = [0u8; 4];
        if getrandom::fill(&mut b).is_ok() {
            let r = u32::from_le_bytes(b) as u64;
            self.next.store((1 << 32) | r, Ordering::Relaxed);
        }
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
    ) -> Result<allox_protocol::Response, RunError> {
        let (a, s) = (p.agent_id.as_str(), p.session_id.as_str());
        let cwd = validate::check(&p.argv, &p.env, p.cwd.as_deref())?;
        let term = p.pty.as_ref().map(validate::terminal).transpose()?;
        if let Some(t) = &p.trace {
            t.check().map_err(|e| RunError::BadTrace(e.message))?;
        }
        if p.recovery.is_some() && !self.cfg.plugins.observes_runs() {
            return Err(RunError::RecoveryUnobserved);
        }
        if p.on_disconnect == allox_protocol::OnDisconnect::Kill && !(p.wait && p.stream) {
            return Err(RunError::KillNeedsStream);
        }
        let id = self.new_run_id();
        // What is made for the run from here on is undone if the start
        // fails, however it fails (an error, a panic, the request dropped).
        let mut starting = Starting::new(self, a, s, &id, &paths.network);
        let made = match self.make(&mut starting, p, &paths, &id, cwd, term).await {
            Ok(m) => m,
            Err(e) => {
                // Answered once nothing of the run is left.
                starting.undo_now().await;
                // A rollback or delete that began after the start's check
                // took what the start was making (its cgroup, its tree):
                // the start lost that race, which is no fault of the
                // daemon's.
                let raced = !matches!(e, RunError::Plugin(_))
                    && (self.fences.is_fenced(a, s) || !paths.current.is_dir());
                if raced {
                    tracing::debug!(agent = a, session = s, error = %e, "a start lost a race with a rollback or delete");
                    return Err(RunError::Fenced {
                        agent: a.to_string(),
                        session: s.to_string(),
                    });
                }
                return Err(e);
            }
        };
        // From here the run's end tasks own what was made.
        let (pidfd, attached) = starting.started();
        let (tx, rx) = watch::channel(None);
        let run = Arc::new(Run {
            id: id.clone(),
            agent: a.to_string(),
            session: s.to_string(),
            pid: made.pid,
            pidfd: Mutex::new(pidfd),
            stdin: tokio::sync::Mutex::new(made.input),
            terminal: Mutex::new(made.terminal),
            result: tx,
            log: Arc::new(Log::new()),
            timed_out: AtomicBool::new(false),
            attached: Mutex::new(attached),
            metadata: made.metadata,
            observed: made.observed.then_some(made.pid),
            network: paths.network.clone(),
            asked: RunRequest {
                argv: p.argv.clone(),
                trace: p.trace.as_deref().cloned(),
                started: made.started,
            },
        });
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key(a, s, &id), run.clone());
        self.cfg.metrics.run_started(a);
        super::note_started(&id);
        if let Some(ev) = &events {
            let _ = ev
                .send(Event::Started(RunStarted {
                    run_id: id.clone(),
                    pid: made.pid,
                }))
                .await;
        }
        // Output readers.
        let readers = Readers::start(
            made.sources,
            &id,
            events.clone(),
            &run.log,
            self.cfg.capture_limit,
        );
        // Initial stdin, then close.
        if let Some(data) = p.stdin.clone() {
            let runs = self.clone();
            let (a, s, r) = (a.to_string(), s.to_string(), id.clone());
            tokio::spawn(async move {
                // A program that never reads its input does not hold the
                // run's end hostage (the write gives up after 10 s).
                let _ = runs.stdin(&a, &s, &r, &data, true).await;
            });
        }
        // The end: status, then a short drain of the output.
        let (program, program_started) = tokio::sync::oneshot::channel();
        tokio::spawn(end::finish(
            self.clone(),
            run.clone(),
            made.status,
            readers,
            program,
        ));
        // Reap the init when the namespace empties, and drop its cgroup.
        tokio::spawn(end::reap(self.clone(), run.clone()));
        if p.on_disconnect == allox_protocol::OnDisconnect::Kill {
            // Kept on the run's cgroup too: the connection that follows the
            // run dies with this supervisor, and the one that takes the run
            // up kills it as asked (it went on for ever, its client gone).
            keep_mark(
                &self.cgroups.run_dir(&p.agent_id, &p.session_id, &id),
                KILL_ON_DISCONNECT_XATTR,
                "kill",
            );
        }
        if let Some(ms) = p.timeout_ms {
            // Kept on the run's cgroup, so that a supervisor that takes the
            // run up after a restart keeps its limit (it ran on for ever).
            keep_deadline(
                &self.cgroups.run_dir(&p.agent_id, &p.session_id, &id),
                allox_store::clock::since_boot() + Duration::from_millis(ms),
            );
            tokio::spawn(kill_after(
                self.clone(),
                run.clone(),
                rx.clone(),
                Duration::from_millis(ms),
            ));
        }
        if !p.wait {
            // Answered once the program's process exists, so that a run
            // said to be started is in `process.list` (or once the run has
            // ended); bounded, should its cgroup be frozen meanwhile.
            let _ = tokio::time::timeout(PROGRAM_START_WAIT, program_started).await;
            return Ok(allox_protocol::Response::Started(RunStarted {
                run_id: id,
                pid: made.pid,
            }));
        }
        let r = super::wait::result(rx, None).await?;
        Ok(allox_protocol::Response::Exited(r))
    }

    /// Makes run `id`'s sandbox and its stdio, telling `starting` of each
    /// thing made; a failpoint after each step
    /// (`allox_store::failpoint::RUN_STARTS`).
    async fn make(
        self: &Arc<Self>,
        starting: &mut Starting,
        p: &ProcessStart,
        paths: &SessionPaths,
        id: &str,
        cwd: String,
        term: Option<String>,
    ) -> Result<ContextWithGuards, RunError> {
        let (a, s) = (p.agent_id.as_str(), p.session_id.as_str());
        let mode = paths.network.mode;
        let run_ref = RunRef {
            agent: a,
            session: s,
            run: id,
            network: &paths.network,
        };
        let added = self
            .cfg
            .plugins
            .contributions(&run_ref)
            .map_err(RunError::Plugin)?;
        if let Some(dir) = p.cwd.as_deref() {
            // As the sandbox will see it: the session's links followed as
            // there, none on the host.
            if !validate::is_session_dir(dir, &paths.current, &self.cfg.system_dirs, &[]) {
                return Err(RunError::NoCwd(dir.to_string()));
            }
        }
        // The in-sandbox interface's listener (and what else is attached to
        // every run): held by the run until its sandbox is gone.
        let attached = match self.services.get() {
            Some(svc) => svc
                .attach(&super::RunIdentity {
                    agent: a.to_string(),
                    session: s.to_string(),
                    run: id.to_string(),
                })
                .map_err(RunError::Attach)?,
            None => super::Attachment::none(),
        };
        starting.attached(attached.guard);
        self.cfg.failpoints.hit("run_start.after_attach");
        let path = std::iter::once(validate::PATH)
            .chain(attached.path.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(":");
        // The core's binds first, then the plugins'.
        let binds: Vec<_> = attached.binds.iter().chain(&added.binds).cloned().collect();
        // What the program may be found in: those and the session's own.
        let visible: Vec<_> = self
            .session_files()
            .binds
            .iter()
            .chain(&binds)
            .cloned()
            .collect();
        // A plugin's prefix (a wrapper) comes first on the command line.
        let argv: Vec<String> = added.prefix.iter().chain(&p.argv).cloned().collect();
        // Looked up in the `PATH` the program will have: the request's,
        // else a plugin's, else the sandbox's own (as `execvp` in that
        // environment would).
        let run_path = p
            .env
            .get("PATH")
            .or_else(|| added.env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v))
            .unwrap_or(&path);
        let program = validate::resolve(
            &argv[0],
            &cwd,
            &paths.current,
            &self.cfg.system_dirs,
            &validate::Lookup {
                path: run_path,
                binds: &visible,
            },
        )?;
        self.check_fence(a, s)?;
        self.cgroups.ensure_session(a, s, &self.cfg.limits)?;
        let cg = self.cgroups.create_run(a, s, id)?;
        starting.cgroup_made();
        self.cfg.failpoints.hit("run_start.after_cgroup");
        let observed = self.cfg.plugins.observes_runs();
        if !self.cfg.plugins.is_empty() {
            // The cgroup's id is its directory's inode number.
            let st = rustix::fs::fstat(&cg).map_err(|e| RunError::Io {
                op: "stat",
                path: self.cgroups.run_dir(a, s, id),
                source: e.into(),
            })?;
            self.cfg
                .plugins
                .before_run(&run_ref, st.st_ino)
                .map_err(RunError::Plugin)?;
            starting.plugins_told();
            if observed {
                self.observe_begin(p, paths, id, st.st_ino).await?;
            }
        }
        self.cfg.failpoints.hit("run_start.after_plugins");
        let mut env = vec![
            ("PATH".to_string(), path),
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
            ("ALLOX_RUN_ID".to_string(), id.to_string()),
        ];
        if let Some(t) = &term {
            env.push(("TERM".to_string(), t.clone()));
        }
        // The tool call it serves, for the frameworks inside to continue.
        if let Some(t) = &p.trace {
            env.push(("TRACEPARENT".to_string(), t.traceparent()));
        }
        // The plugins' variables, then the request's, each replacing what
        // was there.
        for (k, v) in added.env.iter().map(|(k, v)| (k, v)).chain(&p.env) {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        let spec = SandboxSpec {
            program,
            argv,
            env,
            cwd,
            uid: self.cfg.uid,
            gid: self.cfg.gid,
            session: paths.current.clone(),
            shared: paths.shared.clone(),
            stage: self.cfg.stage.clone(),
            system_dirs: self.cfg.system_dirs.clone(),
            hostname: "allox".into(),
            isolate_network: self.isolates(mode),
            tmp_sync_cap: self.cfg.tmp_sync_cap,
            binds,
            pty: p.pty.as_ref().map(|t| allox_sandbox::TermSize {
                rows: t.rows,
                cols: t.cols,
            }),
        };
        // Also for sessions and agents made before (or adopted by recovery).
        self.own(&paths.current);
        self.own(&paths.shared);
        // The session's context makes the sandbox; asking it blocks, so
        // off the I/O workers. A context that died after making the run's
        // PID 1 but before answering leaves it unsupervised, in the run's
        // cgroup: the undo kills it.
        let runs = self.clone();
        let (aa, ss) = (a.to_string(), s.to_string());
        let net = paths.network.clone();
        // Before the spawn: the run may be done before the spawn returns.
        let started = std::time::SystemTime::now();
        let spawned =
            tokio::task::spawn_blocking(move || runs.spawn_in_context(&aa, &ss, &net, &spec, &cg))
                .await??;
        starting.spawned(spawned.pidfd);
        self.cfg.failpoints.hit("run_start.after_spawn");
        if observed {
            // The run's first process is in its frozen cgroup, A is sealed:
            // let it go.
            self.cgroups.thaw(&self.cgroups.run_dir(a, s, id))?;
        }
        // A rollback or delete may have fenced the session while the
        // sandbox was being made: then this run must not live on.
        self.check_fence(a, s)?;
        // The program's stdio: pipes, or a terminal. A terminal that did
        // not come leaves the run without stdio; it reports why itself.
        let (input, terminal, sources) = match spawned.io {
            RunIo::Pipes {
                stdin,
                stdout,
                stderr,
            } => {
                let stdin =
                    tokio::net::unix::pipe::Sender::from_owned_fd(stdin).map_err(RunError::Pipe)?;
                let mut sources = Vec::new();
                for (fd, kind) in [(stdout, StreamKind::Stdout), (stderr, StreamKind::Stderr)] {
                    let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
                        .map_err(RunError::Pipe)?;
                    sources.push((Source::Pipe(rx), kind));
                }
                (Some(Input::Pipe(stdin)), None, sources)
            }
            // Sent by the run's PID 1 once it runs: after the thaw above.
            RunIo::Pty(pending) => match tokio::task::spawn_blocking(move || pending.receive())
                .await
                .unwrap_or_else(|e| Err(format!("receive the run's terminal: {e}")))
            {
                Ok(master) => {
                    let t = Arc::new(Terminal::new(master).map_err(RunError::Pipe)?);
                    let sources = vec![(Source::Pty(t.clone()), StreamKind::Stdout)];
                    (Some(Input::Terminal), Some(t), sources)
                }
                Err(why) => {
                    tracing::warn!(run = %id, %why, "a terminal run has no terminal");
                    (None, None, Vec::new())
                }
            },
        };
        let status = tokio::net::unix::pipe::Receiver::from_owned_fd(spawned.status)
            .map_err(RunError::Pipe)?;
        self.cfg.failpoints.hit("run_start.after_stdio");
        Ok(ContextWithGuards {
            pid: spawned.pid,
            input,
            terminal,
            sources,
            status,
            metadata: added.metadata,
            started,
            observed,
        })
    }
}

impl Runs {
    /// An observed run: its cgroup frozen (so that its first process,
    /// cloned into it, cannot run an instruction before A), then the
    /// observing plugins told, which returns once A is sealed.
    async fn observe_begin(
        self: &Arc<Self>,
        p: &ProcessStart,
        paths: &SessionPaths,
        id: &str,
        cgroup_id: u64,
    ) -> Result<(), RunError> {
        let (a, s) = (p.agent_id.clone(), p.session_id.clone());
        let dir = self.cgroups.run_dir(&a, &s, id);
        let (runs, aa, ss, net) = (self.clone(), a.clone(), s.clone(), paths.network.clone());
        let context_pid =
            tokio::task::spawn_blocking(move || runs.ensure_context(&aa, &ss, &net)).await??;
        self.cgroups.freeze(&dir, self.cfg.freeze_wait)?;
        let runs = self.clone();
        let (argv, id, recovery) = (p.argv.clone(), id.to_string(), p.recovery.clone());
        let (current, shared, network) = (
            paths.current.clone(),
            paths.shared.clone(),
            paths.network.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let agent_workspace = shared.parent().unwrap_or(&shared).to_path_buf();
            runs.cfg
                .plugins
                .observe_begin(&crate::plugin_api::ObservedRun {
                    run: RunRef {
                        agent: &a,
                        session: &s,
                        run: &id,
                        network: &network,
                    },
                    argv: &argv,
                    cgroup: &dir,
                    cgroup_id,
                    cgroup_root: runs.cgroups.base().parent().unwrap_or(runs.cgroups.base()),
                    workspace: &current,
                    agent_workspace: &agent_workspace,
                    context_pid: Some(context_pid),
                    recovery: recovery.as_deref(),
                })
        })
        .await?
        .map_err(RunError::Plugin)
    }
}

/// A run's sandbox as [`Runs::make`] made it, for the run to hold.
struct ContextWithGuards {
    pid: i32,
    input: Option<Input>,
    terminal: Option<Arc<Terminal>>,
    sources: Vec<(Source, StreamKind)>,
    /// The init's status pipe.
    status: tokio::net::unix::pipe::Receiver,
    metadata: Vec<(String, String)>,
    started: std::time::SystemTime,
    /// Whether the plugins observe it.
    observed: bool,
}

/// Kills the run's cgroup once `limit` has passed, unless it ended first.
/// The extended attribute of a run's cgroup that holds when its time
/// limit ends: milliseconds of the boot clock (runs do not outlive a boot).
const DEADLINE_XATTR: &str = "trusted.allox.deadline_ms";

/// The extended attribute of a run's cgroup that says the run dies with
/// the connection that follows it (`on_disconnect: kill`).
const KILL_ON_DISCONNECT_XATTR: &str = "trusted.allox.on_disconnect";

/// Keeps a run's deadline on its cgroup `dir`.
fn keep_deadline(dir: &std::path::Path, at: Duration) {
    keep_mark(dir, DEADLINE_XATTR, &(at.as_millis() as u64).to_string());
}

/// Keeps `name` = `value` on a run's cgroup `dir` (best effort: a cgroup
/// filesystem without extended attributes keeps it in this supervisor
/// only, as before).
fn keep_mark(dir: &std::path::Path, name: &str, value: &str) {
    if let Err(e) =
        rustix::fs::setxattr(dir, name, value.as_bytes(), rustix::fs::XattrFlags::empty())
    {
        tracing::debug!(error = %e, dir = %dir.display(), name, "cannot keep a mark of the run on its cgroup");
    }
}

/// The run of cgroup `dir` has been answered: its wish to die with its
/// client is over.
pub(super) fn forget_kill_on_disconnect(dir: &std::path::Path) {
    let _ = rustix::fs::removexattr(dir, KILL_ON_DISCONNECT_XATTR);
}

/// Whether the run of cgroup `dir` asked to die with its client.
pub(super) fn kept_kill_on_disconnect(dir: &std::path::Path) -> bool {
    let mut buf = [0u8; 8];
    rustix::fs::getxattr(dir, KILL_ON_DISCONNECT_XATTR, &mut buf)
        .is_ok_and(|n| &buf[..n] == b"kill")
}

/// A run's deadline kept on its cgroup `dir`, as time left from now
/// (zero when it has passed); `None` when it has none.
pub(super) fn kept_deadline(dir: &std::path::Path) -> Option<Duration> {
    let mut buf = [0u8; 32];
    let n = rustix::fs::getxattr(dir, DEADLINE_XATTR, &mut buf).ok()?;
    let ms: u64 = std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()?;
    Some(Duration::from_millis(ms).saturating_sub(allox_store::clock::since_boot()))
}

pub(super) async fn kill_after(
    runs: Arc<Runs>,
    run: Arc<Run>,
    mut done: watch::Receiver<Option<RunResult>>,
    limit: Duration,
) {
    let deadline = tokio::time::Instant::now() + limit;
    let expired = tokio::time::timeout(limit, async {
        while done.borrow_and_update().is_none() {
            if done.changed().await.is_err() {
                break;
            }
        }
    })
    .await
    .is_err();
    let dir = runs.cgroups.run_dir(&run.agent, &run.session, &run.id);
    let cg = runs.cgroups.clone();
    if expired {
        run.timed_out.store(true, Ordering::SeqCst);
    } else {
        // The program ended in time, and the run was answered; what it
        // left in its tree (a `setsid` daemon) is still the run's, and
        // goes at its time limit too (it went on for ever). Only the
        // cgroup's path is held meanwhile, not the run.
        let id = run.id.clone();
        drop((run, runs, done));
        tokio::time::sleep_until(deadline).await;
        if !cg.populated(&dir) {
            return;
        }
        tracing::info!(
            run = id,
            "the run's time limit passed: killing what its program left"
        );
    }
    let _ = tokio::task::spawn_blocking(move || cg.kill(&dir, Duration::from_secs(10))).await;
}
