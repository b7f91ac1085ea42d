//! Keeps the supervisor running: the loop the guest's PID 1 and the
//! container's PID 1 share.
//!
//! It starts the supervisor (a command the caller makes), restarts it with
//! backoff when it dies, reaps every child and orphan (this is the one
//! place that calls `wait` for unknown children), and on SIGTERM, SIGINT,
//! SIGPWR or the supervisor's exit after `system.shutdown` stops it in
//! order: SIGTERM to the supervisor, which refuses new work, kills the
//! sessions and flushes the store; whatever is left is killed when it has
//! not stopped within the stop timeout. What happens after (power off,
//! exit) is the caller's.

use crate::guest::{log, supervisor::restart_delay, supervisor::STABLE_AFTER};
use crate::guest::{EXIT_SETTINGS_REFUSED, EXIT_SHUTDOWN_REQUESTED, EXIT_USAGE};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use rustix::process::{Pid, WaitOptions};
use std::process::Command;
use std::time::{Duration, Instant};

/// The signals the keeper takes through its descriptor: blocked in every
/// thread, never handled asynchronously.
pub const SIGNALS: [Signal; 5] = [
    Signal::SIGCHLD,
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGPWR,
    Signal::SIGHUP,
];

/// Blocks [`SIGNALS`] and opens the descriptor they arrive on. Call it
/// before any thread starts, so that no thread takes them.
pub fn signal_fd() -> nix::Result<SignalFd> {
    let mut mask = SigSet::empty();
    for s in SIGNALS {
        mask.add(s);
    }
    mask.thread_block()?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
}

/// Unblocks [`SIGNALS`]. A child inherits the blocked mask across exec
/// (std's `Command` does not reset it), so the supervisor the keeper
/// starts calls this first: otherwise SIGTERM would wait in its mask and
/// every stop would run into the stop timeout.
pub fn unblock_signals() {
    let mut mask = SigSet::empty();
    for s in SIGNALS {
        mask.add(s);
    }
    let _ = mask.thread_unblock();
}

/// How everything else is killed once the supervisor has stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillRest {
    /// SIGKILL to every process this one can signal but itself: right only
    /// for the PID 1 of a machine or of a PID namespace.
    Everything,
    /// Leave the rest alone (not PID 1: `kill(-1)` would reach processes
    /// that are not ours).
    Nothing,
}

/// The supervisor kept running.
pub struct Keeper<F: FnMut() -> Command> {
    /// Makes the supervisor's command, at each start.
    command: F,
    sfd: SignalFd,
    stop_timeout: Duration,
    supervisor: Option<(Pid, Instant)>,
    restarts: u32,
    next_start: Option<Instant>,
    /// Set once a stop has begun: the supervisor ending is then expected.
    stopping: bool,
}

impl<F: FnMut() -> Command> Keeper<F> {
    pub fn new(sfd: SignalFd, stop_timeout: Duration, command: F) -> Self {
        Keeper {
            command,
            sfd,
            stop_timeout,
            supervisor: None,
            restarts: 0,
            next_start: Some(Instant::now()),
            stopping: false,
        }
    }

    /// Runs until a stop is asked for, stops the supervisor and what it
    /// leaves (as `rest` says), and returns why it stopped.
    pub fn run(mut self, rest: KillRest) -> String {
        let why = loop {
            if let Some(at) = self.next_start {
                if Instant::now() >= at {
                    self.next_start = None;
                    self.start_supervisor();
                }
            }
            let wait = self
                .next_start
                .map(|at| at.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(60));
            let mut fds = [rustix::event::PollFd::new(
                &self.sfd,
                rustix::event::PollFlags::IN,
            )];
            let ts = rustix::event::Timespec {
                tv_sec: wait.as_secs() as _,
                tv_nsec: wait.subsec_nanos() as _,
            };
            let _ = rustix::event::poll(&mut fds, Some(&ts));
            let mut stop = None;
            while let Ok(Some(info)) = self.sfd.read_signal() {
                if let Ok(Signal::SIGTERM | Signal::SIGINT | Signal::SIGPWR) =
                    Signal::try_from(info.ssi_signo as i32)
                {
                    stop = Some(format!("signal {}", info.ssi_signo));
                }
            }
            if let Some(why) = self.reap() {
                stop = Some(why);
            }
            if let Some(why) = stop {
                break why;
            }
        };
        self.stop(&why, rest);
        why
    }

    fn start_supervisor(&mut self) {
        match (self.command)().spawn() {
            Ok(child) => {
                let pid = Pid::from_raw(child.id() as i32).expect("a child has a pid");
                log(format_args!(
                    "supervisor started (pid {})",
                    pid.as_raw_nonzero()
                ));
                self.supervisor = Some((pid, Instant::now()));
                // std's Child would reap on drop only if waited; the reaper
                // below collects it.
                std::mem::forget(child);
            }
            Err(e) => {
                log(format_args!("cannot start the supervisor: {e}"));
                self.schedule_restart();
            }
        }
    }

    fn schedule_restart(&mut self) {
        let delay = restart_delay(self.restarts);
        self.restarts += 1;
        log(format_args!(
            "restarting the supervisor in {} ms",
            delay.as_millis()
        ));
        self.next_start = Some(Instant::now() + delay);
    }

    /// Reaps every exited child. Returns why to shut down, if the
    /// supervisor asked for it.
    fn reap(&mut self) -> Option<String> {
        let mut stop = None;
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, status))) => {
                    if self.supervisor.map(|(p, _)| p) == Some(pid) {
                        let (_, since) = self.supervisor.take().expect("checked");
                        if since.elapsed() > STABLE_AFTER {
                            self.restarts = 0;
                        }
                        if self.stopping {
                            log(format_args!("supervisor stopped ({status:?})"));
                        } else if status.exit_status() == Some(EXIT_SHUTDOWN_REQUESTED as _) {
                            stop = Some("system.shutdown request".to_string());
                        } else if matches!(
                            status.exit_status(),
                            Some(EXIT_USAGE | EXIT_SETTINGS_REFUSED)
                        ) {
                            // Its options are refused (what it said is
                            // above): another start would say the same, for
                            // ever, while the host waits for an answer.
                            stop = Some(
                                "the supervisor's options are refused (allox.args=, or the \
                                 container's arguments); not restarting it"
                                    .to_string(),
                            );
                        } else {
                            log(format_args!("supervisor ended ({status:?})"));
                            self.schedule_restart();
                        }
                    }
                }
                Ok(None) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => break,
            }
        }
        stop
    }

    /// SIGTERM to the supervisor, up to the stop timeout for it to finish,
    /// then SIGKILL to what is left (as `rest` says) and two seconds to
    /// reap it.
    fn stop(&mut self, why: &str, rest: KillRest) {
        log(format_args!("shutting down ({why})"));
        self.next_start = None;
        self.stopping = true;
        if let Some((pid, _)) = self.supervisor {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            let deadline = Instant::now() + self.stop_timeout;
            while self.supervisor.is_some() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
                let _ = self.reap();
            }
            if let Some((pid, _)) = self.supervisor {
                log("the supervisor did not stop in time; killing it");
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        if rest == KillRest::Everything {
            kill_everything();
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some(_)) => continue,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => break,
            }
        }
    }
}

/// SIGKILL to every process this one may signal, but itself.
pub fn kill_everything() {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-1), Signal::SIGKILL);
}
