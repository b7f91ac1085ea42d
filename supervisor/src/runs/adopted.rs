//! Runs an earlier supervisor started, taken up again after a restart.
//!
//! A run's PID 1 keeps the supervisor's ends of the run's pipes (and a
//! terminal run's master side) open at [`allox_sandbox::KEPT_FDS`] for as
//! long as the run lives. A supervisor that finds the run's cgroup
//! populated at its start takes them with `pidfd_getfd` and follows the run
//! as one of its own: its output is read on (into `process.logs`, so a
//! program's next write never meets a pipe without a reader and dies of
//! `SIGPIPE`), its terminal can be attached to, and its end is known from
//! its status pipe: the exit status of what the program did after the
//! restart, not "unknown". A pipe's standard input closed with the
//! earlier supervisor (as a writer end that is gone, it reads end-of-file);
//! a terminal run's input is its terminal, typed into again.

use super::output::{Log, Readers, Source};
use super::terminal::Terminal;
use super::{end, key, Run, RunRequest, Runs};
use allox_protocol::StreamKind;
use allox_sandbox::KEPT_FDS;
use rustix::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// What an adopted run's PID 1 kept for its supervisor.
struct Kept {
    pid: i32,
    pidfd: OwnedFd,
    sources: Vec<(Source, StreamKind)>,
    terminal: Option<Arc<Terminal>>,
    status: tokio::net::unix::pipe::Receiver,
}

/// The run's PID 1 among the processes of its cgroup `dir`: the one that
/// is 1 in its own PID namespace.
fn init_of(dir: &Path) -> Option<i32> {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).ok()?;
    procs
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .find(|&pid: &i32| {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|st| {
                    st.lines()
                        .find_map(|l| l.strip_prefix("NSpid:"))
                        .map(|ns| ns.split_whitespace().last() == Some("1"))
                })
                .unwrap_or(false)
        })
}

/// Takes what the PID 1 of the run in cgroup `dir` kept; `None` when it
/// kept nothing (a run of a build before this) or cannot be reached.
fn take_kept(dir: &Path) -> Result<Kept, String> {
    use rustix::process::{pidfd_getfd, pidfd_open, Pid, PidfdFlags, PidfdGetfdFlags};
    let pid = init_of(dir).ok_or("no PID 1 in its cgroup")?;
    let pidfd = Pid::from_raw(pid)
        .ok_or("a bad pid")
        .and_then(|p| pidfd_open(p, PidfdFlags::empty()).map_err(|_| "pidfd_open"))
        .map_err(|e| format!("its PID 1 {pid}: {e}"))?;
    let get = |fd: i32| pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty());
    let status = get(KEPT_FDS.status).map_err(|e| {
        format!("its PID 1 {pid} kept no status pipe (started by an older build?): {e}")
    })?;
    let pipe = |fd: OwnedFd| {
        tokio::net::unix::pipe::Receiver::from_owned_fd(fd).map_err(|e| format!("a kept pipe: {e}"))
    };
    let status = pipe(status)?;
    let (sources, terminal) = match (get(KEPT_FDS.stdout), get(KEPT_FDS.stderr)) {
        (Ok(out), Ok(err)) => (
            vec![
                (Source::Pipe(pipe(out)?), StreamKind::Stdout),
                (Source::Pipe(pipe(err)?), StreamKind::Stderr),
            ],
            None,
        ),
        _ => match get(KEPT_FDS.terminal) {
            Ok(master) => {
                let t = Arc::new(Terminal::new(master).map_err(|e| format!("its terminal: {e}"))?);
                (vec![(Source::Pty(t.clone()), StreamKind::Stdout)], Some(t))
            }
            // A terminal run whose terminal never came: nothing to read.
            Err(_) => (Vec::new(), None),
        },
    };
    Ok(Kept {
        pid,
        pidfd,
        sources,
        terminal,
        status,
    })
}

impl Runs {
    /// Takes up the run `agent/session/run` (cgroup `dir`) an earlier
    /// supervisor started, as one of this one's; `attached` is what the
    /// services attached to it again, released at its end. Within the
    /// async runtime. Says why not when its PID 1 kept nothing to take.
    pub(super) fn take_up(
        self: &Arc<Self>,
        id: &crate::runs::RunIdentity,
        dir: &Path,
        attached: Option<Box<dyn Send + Sync>>,
    ) -> Result<(), (String, Option<Box<dyn Send + Sync>>)> {
        let kept = match take_kept(dir) {
            Ok(k) => k,
            Err(why) => return Err((why, attached)),
        };
        let started = std::fs::metadata(dir)
            .and_then(|m| m.modified())
            .unwrap_or_else(|_| std::time::SystemTime::now());
        let (tx, _) = tokio::sync::watch::channel(None);
        // A terminal run is typed into through its terminal, which was
        // taken: its input goes on (every key was refused "standard input
        // is closed", the shell in it neither usable nor ended from it). A
        // pipe's writer end went with the earlier supervisor.
        let input = kept.terminal.as_ref().map(|_| super::Input::Terminal);
        let run = Arc::new(Run {
            id: id.run.clone(),
            agent: id.agent.clone(),
            session: id.session.clone(),
            pid: kept.pid,
            pidfd: Mutex::new(Some(kept.pidfd)),
            stdin: tokio::sync::Mutex::new(input),
            terminal: Mutex::new(kept.terminal),
            result: tx,
            log: Arc::new(Log::new()),
            timed_out: AtomicBool::new(false),
            attached: Mutex::new(attached),
            metadata: Vec::new(),
            observed: None,
            network: Default::default(),
            asked: RunRequest {
                argv: Vec::new(),
                trace: None,
                started,
            },
        });
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key(&id.agent, &id.session, &id.run), run.clone());
        let readers = Readers::start(
            kept.sources,
            &id.run,
            None,
            &run.log,
            self.cfg.capture_limit,
        );
        let (program, _) = tokio::sync::oneshot::channel();
        tokio::spawn(end::finish(
            self.clone(),
            run.clone(),
            kept.status,
            readers,
            program,
        ));
        // Its time limit, as its start kept it on the cgroup: it goes on
        // counting from the start (it was lost: the run ran on for ever).
        if let Some(left) = super::start::kept_deadline(dir) {
            tokio::spawn(super::start::kill_after(
                self.clone(),
                run.clone(),
                run.result.subscribe(),
                left,
            ));
        }
        // A run that asked to die with its client: the connection that
        // followed it went with the earlier supervisor.
        if super::start::kept_kill_on_disconnect(dir) {
            tracing::info!(
                agent = id.agent,
                session = id.session,
                run = id.run,
                "the run's client went away with the earlier supervisor: killing it as asked"
            );
            let (cg, dir) = (self.cgroups.clone(), dir.to_path_buf());
            tokio::task::spawn_blocking(move || cg.kill(&dir, std::time::Duration::from_secs(10)));
        }
        tokio::spawn(end::reap(self.clone(), run));
        tracing::info!(
            agent = id.agent,
            session = id.session,
            run = id.run,
            "a run an earlier supervisor started is followed again: its output, terminal and end"
        );
        Ok(())
    }
}
