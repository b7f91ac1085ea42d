//! A run being started: what `process.start` has made for it so far, undone
//! on every path out of a start that fails — an error, a panic, or the
//! request dropped half-way — and kept once the run is handed over to the
//! tasks that follow it to its end ([`Starting::started`]).
//!
//! What is undone, in this order: the run's sandbox is killed (its init
//! through its pidfd, the rest through its cgroup) and its init reaped;
//! what the services attached to it (the in-sandbox interface's listener
//! and its directory) is released; its cgroup is removed; and the plugins
//! that were told of it hear that it is over.

use super::Runs;
use crate::plugin_api::{RunRef, SessionNetwork};
use rustix::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

/// Undoes what was made for a run when dropped, unless the run started.
#[must_use = "the start is undone as soon as the guard is dropped"]
pub(super) struct Starting {
    /// `None` once the run has started (or the undo has run).
    undo: Option<Undo>,
}

/// What there is to undo.
struct Undo {
    runs: Arc<Runs>,
    agent: String,
    session: String,
    run: String,
    network: SessionNetwork,
    /// What the services attached to the run.
    attached: Option<Box<dyn Send + Sync>>,
    /// The run's cgroup exists.
    cgroup: bool,
    /// The plugins heard `before_run`.
    told: bool,
    /// The sandbox's init.
    init: Option<OwnedFd>,
}

impl Starting {
    /// Nothing made yet for run `run` of session `agent/session`.
    pub(super) fn new(
        runs: &Arc<Runs>,
        agent: &str,
        session: &str,
        run: &str,
        network: &SessionNetwork,
    ) -> Starting {
        Starting {
            undo: Some(Undo {
                runs: runs.clone(),
                agent: agent.to_string(),
                session: session.to_string(),
                run: run.to_string(),
                network: network.clone(),
                attached: None,
                cgroup: false,
                told: false,
                init: None,
            }),
        }
    }

    /// What there is to undo, while there is.
    fn made(&mut self, f: impl FnOnce(&mut Undo)) {
        if let Some(u) = &mut self.undo {
            f(u);
        }
    }

    /// The services attached `guard` to the run.
    pub(super) fn attached(&mut self, guard: Box<dyn Send + Sync>) {
        self.made(|u| u.attached = Some(guard));
    }

    /// The run's cgroup exists (the sandbox may be cloned into it from now
    /// on: a failed spawn may still have left a process there).
    pub(super) fn cgroup_made(&mut self) {
        self.made(|u| u.cgroup = true);
    }

    /// The plugins heard `before_run`.
    pub(super) fn plugins_told(&mut self) {
        self.made(|u| u.told = true);
    }

    /// The sandbox exists; `init` is its PID 1's pidfd.
    pub(super) fn spawned(&mut self, init: OwnedFd) {
        self.made(|u| u.init = Some(init));
    }

    /// The run has started: nothing is undone. Returns its init's pidfd
    /// and what the services attached, which the run holds from now on.
    pub(super) fn started(mut self) -> (Option<OwnedFd>, Option<Box<dyn Send + Sync>>) {
        match self.undo.take() {
            Some(mut u) => (u.init.take(), u.attached.take()),
            None => (None, None),
        }
    }

    /// Undoes what was made, off the I/O workers, and waits for it: the
    /// start's error is answered once nothing of the run is left.
    pub(super) async fn undo_now(mut self) {
        if let Some(u) = self.undo.take() {
            let _ = tokio::task::spawn_blocking(move || u.run()).await;
        }
    }
}

impl Drop for Starting {
    /// A start that panicked or was dropped: the undo runs on a blocking
    /// thread, without anyone waiting for it.
    fn drop(&mut self) {
        let Some(u) = self.undo.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(move || u.run())),
            Err(_) => u.run(),
        }
    }
}

impl Undo {
    fn run(mut self) {
        let cgroups = &self.runs.cgroups;
        let dir = cgroups.run_dir(&self.agent, &self.session, &self.run);
        if let Some(init) = &self.init {
            let _ = rustix::process::pidfd_send_signal(init, rustix::process::Signal::KILL);
        }
        if self.cgroup {
            let _ = cgroups.kill(&dir, Duration::from_secs(10));
        }
        if let Some(init) = self.init.take() {
            let _ = rustix::process::waitid(
                rustix::process::WaitId::PidFd(rustix::fd::AsFd::as_fd(&init)),
                rustix::process::WaitIdOptions::EXITED,
            );
        }
        drop(self.attached.take());
        if self.cgroup {
            let _ = cgroups.remove(&dir);
        }
        if self.told {
            self.runs.cfg.plugins.after_run(&RunRef {
                agent: &self.agent,
                session: &self.session,
                run: &self.run,
                network: &self.network,
            });
        }
    }
}
