//! A run's end: the init's status read, the output drained, the result
//! published and kept for `process.wait`, the init reaped through its
//! pidfd, and the run's cgroup removed.

use super::output::Readers;
use super::{Run, Runs};
use allox_protocol::RunResult;
use allox_sandbox::InitStatus;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// Reads the init's status reports, drains the output briefly, and
/// publishes the run's result. `program` is told (dropped) once the
/// program's process exists, or once the init has said or done anything
/// else (ended, died).
pub(super) async fn finish(
    runs: Arc<Runs>,
    run: Arc<Run>,
    mut status: tokio::net::unix::pipe::Receiver,
    readers: Readers,
    program: tokio::sync::oneshot::Sender<()>,
) {
    let mut bytes = Vec::new();
    let mut program = Some(program);
    let mut chunk = [0u8; 256];
    loop {
        match status.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
        }
        if program.is_some() && postcard::take_from_bytes::<InitStatus>(&bytes).is_ok() {
            program.take();
        }
    }
    drop(program);
    let (st, notes) = end_status(&bytes);
    // An observed run: its whole tree ends here, before the output is
    // drained, so that nothing it left behind runs on while B is taken.
    let effects = match run.observed {
        Some(init) => {
            let status = match &st {
                Some(InitStatus::Exited(c)) => format!("exit {c}"),
                Some(InitStatus::Signaled(s)) => format!("signal {s}"),
                Some(InitStatus::ExecFailed(e)) => format!("exec failed (errno {e})"),
                Some(InitStatus::SetupFailed(w)) => format!("setup failed: {w}"),
                Some(InitStatus::ProgramStarted | InitStatus::Note(_)) | None => {
                    "killed".to_string()
                }
            };
            let (runs2, run2) = (runs.clone(), run.clone());
            tokio::task::spawn_blocking(move || observe_end(&runs2, &run2, init, status))
                .await
                .ok()
                .flatten()
        }
        None => None,
    };
    // A background process may keep the pipes open: wait a little, then
    // report what came, so a streamed answer is not held back.
    readers.drain(Duration::from_millis(100)).await;
    let c = run.log.take();
    let mut stderr = String::from_utf8_lossy(&c.stderr).into_owned();
    // What the daemon adds begins a line of its own, whatever the program
    // left unfinished.
    let own_line = |stderr: &mut String| {
        if !stderr.is_empty() && !stderr.ends_with('\n') {
            stderr.push('\n');
        }
    };
    let (exit_code, signal) = match st {
        Some(InitStatus::Exited(code)) => (Some(code), None),
        Some(InitStatus::Signaled(sig)) => (None, Some(sig)),
        Some(InitStatus::ExecFailed(errno)) => {
            own_line(&mut stderr);
            stderr.push_str(&format!(
                "allox: cannot execute the program: {}\n",
                std::io::Error::from_raw_os_error(errno)
            ));
            (Some(127), None)
        }
        Some(InitStatus::SetupFailed(why)) => {
            // A fork refused at a process limit: said as that limit.
            let limit = runs
                .pids_full(&run.agent, &run.session)
                .map(|w| format!(" ({w})"))
                .unwrap_or_default();
            own_line(&mut stderr);
            stderr.push_str(&format!(
                "allox: the sandbox could not be built: {why}{limit}\n"
            ));
            (Some(126), None)
        }
        // The init itself died: the run's cgroup was killed.
        Some(InitStatus::ProgramStarted | InitStatus::Note(_)) | None => {
            (None, Some(libc::SIGKILL))
        }
    };
    // What the init said after the program's end, last.
    for n in &notes {
        own_line(&mut stderr);
        stderr.push_str(n);
    }
    let output_lossy =
        std::str::from_utf8(&c.stdout).is_err() || std::str::from_utf8(&c.stderr).is_err();
    let mut result = RunResult {
        run_id: run.id.clone(),
        exit_code,
        signal,
        stdout: String::from_utf8_lossy(&c.stdout).into_owned(),
        stderr,
        output_lossy,
        truncated: c.truncated,
        timed_out: run.timed_out.load(Ordering::SeqCst),
        output_dropped: false,
        usage: None,
        oom_killed: None,
        effects: effects.map(Box::new),
    };
    if let Ok(mut g) = run.stdin.try_lock() {
        g.take();
    }
    // The terminal's master side closes with its reader, which is done.
    run.terminal
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    let output_bytes = result.stdout.len() + result.stderr.len();
    if runs.cfg.run_usage {
        let dir = runs.cgroups.run_dir(&run.agent, &run.session, &run.id);
        let u = allox_sandbox::usage::usage(&dir);
        result.oom_killed = u.oom_kills.map(|n| n > 0);
        result.usage = Some(super::usage_of(&u));
    }
    if !runs.cfg.plugins.is_empty() {
        runs.cfg.plugins.run_ended(&crate::plugin_api::RunEnded {
            run: crate::plugin_api::RunRef {
                agent: &run.agent,
                session: &run.session,
                run: &run.id,
                network: &run.network,
            },
            argv: &run.asked.argv,
            trace: run.asked.trace.as_ref(),
            started: run.asked.started,
            ended: std::time::SystemTime::now(),
            result: &result,
        });
    }
    runs.cfg.metrics.run_ended(how_ended(&result));
    // Answered: what the program left in the run is no longer its
    // client's to end (a successor killed a finished exec's `setsid`
    // child as "its client went away").
    super::start::forget_kill_on_disconnect(&runs.cgroups.run_dir(
        &run.agent,
        &run.session,
        &run.id,
    ));
    // Kept whether or not anyone waits yet (`send` would drop it then).
    run.result.send_replace(Some(result));
    runs.retire(&run, output_bytes);
}

/// How a run ended, for the metrics.
fn how_ended(r: &RunResult) -> crate::plugin_api::metrics::RunEnd {
    use crate::plugin_api::metrics::RunEnd;
    if r.timed_out {
        RunEnd::timed_out
    } else if r.oom_killed == Some(true) {
        RunEnd::oom
    } else if r.signal == Some(libc::SIGKILL) {
        RunEnd::killed
    } else if r.signal.is_some() {
        RunEnd::signaled
    } else {
        RunEnd::exited
    }
}

/// The end of an observed run, once its program has ended: the cgroup
/// frozen, what is still alive listed with its lineage (the survivors),
/// everything killed and the cgroup waited for empty and frozen (unless
/// nothing was left), and the
/// observing plugins told. A freeze or kill that does not finish in time
/// is a fault the evidence carries; the plugins are told regardless.
fn observe_end(
    runs: &Runs,
    run: &Run,
    init: i32,
    status: String,
) -> Option<allox_protocol::RunEffects> {
    let dir = runs.cgroups.run_dir(&run.agent, &run.session, &run.id);
    let mut faults = Vec::new();
    if let Err(e) = runs.cgroups.freeze(&dir, runs.cfg.freeze_wait) {
        faults.push(e.to_string());
    }
    runs.cfg.failpoints.hit("run_end.after_freeze");
    let listed = runs.cgroups.procs(&dir);
    let survivors = survivors(&listed, init);
    // The usual end, the program's tree gone: frozen, nothing listed, and
    // the kernel says nothing is left (nothing can enter a frozen cgroup
    // but by the supervisor). No one to kill, nothing to freeze again.
    let over = faults.is_empty() && listed.is_empty() && runs.cgroups.is_empty(&dir);
    if !over {
        if let Err(e) = runs.cgroups.kill(&dir, Duration::from_secs(10)) {
            faults.push(e.to_string());
        }
        if let Err(e) = runs.cgroups.freeze(&dir, runs.cfg.freeze_wait) {
            faults.push(e.to_string());
        }
    }
    runs.cfg.failpoints.hit("run_end.after_kill");
    let fault = (!faults.is_empty()).then(|| faults.join("; "));
    /// The session's context, renewed on the plugin's request.
    struct Contexts<'a> {
        runs: &'a Runs,
        run: &'a Run,
    }
    impl crate::plugin_api::RunCore for Contexts<'_> {
        fn renew_context(&self) -> Result<i32, String> {
            self.runs
                .renew_context(&self.run.agent, &self.run.session, &self.run.network)
                .map_err(|e| allox_protocol::error_chain(&e))
        }
    }
    runs.cfg.plugins.observe_end(
        &crate::plugin_api::RunRef {
            agent: &run.agent,
            session: &run.session,
            run: &run.id,
            network: &run.network,
        },
        crate::plugin_api::ObservedEnd {
            status,
            survivors,
            init_pid: Some(init as u32),
            fault,
        },
        &Contexts { runs, run },
    )
}

/// The processes of `listed` but the sandbox's init, each with its
/// ancestors up to the init's child (the run's program), nearest first.
fn survivors(listed: &[i32], init: i32) -> Vec<allox_protocol::Survivor> {
    let ppid_of = |pid: i32| -> Option<i32> {
        let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid …`: comm may hold anything.
        let rest = &st[st.rfind(')')? + 1..];
        rest.split_whitespace().nth(1)?.parse().ok()
    };
    let mut out = Vec::new();
    for &pid in listed {
        if pid == init {
            continue;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_default();
        let mut lineage = Vec::new();
        let mut at = pid;
        while let Some(pp) = ppid_of(at) {
            if pp == init || pp <= 1 || lineage.len() >= 64 {
                break;
            }
            lineage.push(pp as u32);
            at = pp;
        }
        out.push(allox_protocol::Survivor {
            pid: pid as u32,
            comm,
            lineage,
        });
    }
    out
}

/// Reaps the init through its pidfd once the namespace is empty, then
/// removes the run's cgroup.
pub(super) async fn reap(runs: Arc<Runs>, run: Arc<Run>) {
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
    // The run's end reads what it used from its cgroup: the cgroup stays
    // until the result is out (which `finish` always publishes).
    let mut published = run.result.subscribe();
    let _ = tokio::time::timeout(Duration::from_secs(5), published.wait_for(|r| r.is_some())).await;
    // Nothing of the run is left to use what was attached to it. Released
    // once the result is out: an observed run's B is captured by then, so
    // the run's own guest socket (made before A) is in A and in B alike,
    // never a change of the run's.
    run.attached
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    let dir = runs.cgroups.run_dir(&run.agent, &run.session, &run.id);
    let cg = runs.cgroups.clone();
    let _ = tokio::task::spawn_blocking(move || {
        if cg.wait_empty(&dir, Duration::from_secs(5)).is_ok() {
            let _ = cg.remove(&dir);
        }
    })
    .await;
    runs.cfg.plugins.after_run(&crate::plugin_api::RunRef {
        agent: &run.agent,
        session: &run.session,
        run: &run.id,
        network: &run.network,
    });
}

/// The last of the init's reports that is neither
/// [`InitStatus::ProgramStarted`] nor a note (the program's end, or why it
/// never ran); `None` if there is none (the init was killed) or what came
/// cannot be read. And the init's notes, in order.
fn end_status(mut bytes: &[u8]) -> (Option<InitStatus>, Vec<String>) {
    let mut end = None;
    let mut notes = Vec::new();
    while !bytes.is_empty() {
        let Ok((st, rest)) = postcard::take_from_bytes::<InitStatus>(bytes) else {
            return (None, notes);
        };
        match st {
            InitStatus::ProgramStarted => {}
            InitStatus::Note(n) => notes.push(n),
            st => end = Some(st),
        }
        bytes = rest;
    }
    (end, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(list: &[InitStatus]) -> Vec<u8> {
        list.iter()
            .flat_map(|s| postcard::to_stdvec(s).unwrap())
            .collect()
    }

    #[test]
    fn the_end_is_the_last_report_that_is_not_the_programs_start() {
        use InitStatus::*;
        let cases = [
            (vec![ProgramStarted, Exited(3)], Some(Exited(3))),
            (vec![ProgramStarted, ExecFailed(2)], Some(ExecFailed(2))),
            (
                vec![SetupFailed("mount proc".into())],
                Some(SetupFailed("mount proc".into())),
            ),
            (vec![ProgramStarted, Signaled(9)], Some(Signaled(9))),
            // The init killed after the program started, or before.
            (vec![ProgramStarted], None),
            (vec![], None),
        ];
        for (reports, want) in cases {
            assert_eq!(end_status(&encoded(&reports)).0, want, "{reports:?}");
        }
        // A note is no end; it is kept for the run's stderr.
        assert_eq!(
            end_status(&encoded(&[ProgramStarted, Note("n\n".into()), Exited(0)])),
            (Some(Exited(0)), vec!["n\n".to_string()])
        );
        // A report cut short (the init killed while writing it) is none.
        let mut cut = encoded(&[ProgramStarted, SetupFailed("a long reason".into())]);
        cut.truncate(cut.len() - 3);
        assert_eq!(end_status(&cut).0, None);
    }
}
