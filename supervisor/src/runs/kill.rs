//! `process.kill`: signals for one run or a whole session, and the killing
//! of a session's (or agent's) cgroup tree that rollbacks, deletes and
//! shutdown use.
//!
//! SIGKILL goes through `cgroup.kill`, which reaches every process however
//! it was forked; other signals go to every program in the run's (or the
//! session's) cgroups, through pidfds, with the cgroups frozen meanwhile
//! ([`allox_sandbox::cgroup::Cgroups::signal`]).

use super::{RunError, Runs};
use allox_protocol::ProcessKill;
use std::path::Path;
use std::time::Duration;

impl Runs {
    /// Kills or signals one run or the whole session.
    pub async fn kill(&self, p: &ProcessKill) -> Result<u32, RunError> {
        let (a, s) = (p.agent_id.as_str(), p.session_id.as_str());
        if let Some(r) = &p.run_id {
            allox_protocol::validate_id("run_id", r)?;
        }
        let sig = p.signal.unwrap_or(libc::SIGKILL);
        let Some(signal) = rustix::process::Signal::from_named_raw(sig) else {
            return Err(RunError::NoSuchSignal(sig));
        };
        if sig == libc::SIGSTOP {
            return Err(RunError::SigStop);
        }
        let dir = match &p.run_id {
            Some(r) => {
                let d = self.cgroups.run_dir(a, s, r);
                if !d.exists() && self.get(a, s, r).is_none() {
                    return Err(RunError::NoSuchRun {
                        agent: a.to_string(),
                        session: s.to_string(),
                        run: r.to_string(),
                    });
                }
                d
            }
            None => self.cgroups.session_dir(a, s),
        };
        if sig == libc::SIGKILL {
            let n = self.programs_in(&dir) as u32;
            let cg = self.cgroups.clone();
            tokio::task::spawn_blocking(move || cg.kill(&dir, Duration::from_secs(10))).await??;
            return Ok(n);
        }
        // Other signals go to every program of the run (or session), as
        // SIGKILL does: a shell's children as well as the shell.
        let cg = self.cgroups.clone();
        Ok(tokio::task::spawn_blocking(move || cg.signal(&dir, signal)).await??)
    }

    /// Kills every run that has not ended, each in its own cgroup only
    /// (the sessions' contexts stay: an observed run's end captures the
    /// session's namespaces through its context), and waits up to `limit`
    /// for each one's end to be settled: its result published, after its
    /// observation closed (woken by the publication, not by polling). How
    /// many there were. An orderly shutdown calls it before it kills the
    /// rest. With `only_bound`, only the runs that asked to die with their
    /// client (`on_disconnect: kill`), whose connections the stop closes:
    /// a daemon stopped by a signal leaves the others to its successor.
    pub async fn end_live_runs(&self, limit: Duration, only_bound: bool) -> usize {
        let live: Vec<_> = self
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|r| r.result.borrow().is_none())
            .map(|r| {
                (
                    self.cgroups.run_dir(&r.agent, &r.session, &r.id),
                    r.result.subscribe(),
                )
            })
            .filter(|(dir, _)| !only_bound || super::start::kept_kill_on_disconnect(dir))
            .collect();
        let n = live.len();
        let (dirs, ended): (Vec<_>, Vec<_>) = live.into_iter().unzip();
        let cg = self.cgroups.clone();
        let killed = tokio::task::spawn_blocking(move || {
            for dir in &dirs {
                if let Err(e) = cg.kill(dir, Duration::from_secs(10)) {
                    tracing::warn!(error = %e, dir = %dir.display(), "cannot kill a run at shutdown");
                }
            }
        });
        if let Err(e) = killed.await {
            tracing::warn!(error = %e, "cannot kill the runs at shutdown");
        }
        let settled = async {
            for mut rx in ended {
                // An error: the run's record is gone, its end with it.
                let _ = rx.wait_for(Option::is_some).await;
            }
        };
        if tokio::time::timeout(limit, settled).await.is_err() {
            tracing::warn!(
                limit_s = limit.as_secs(),
                "runs not settled within the limit at shutdown"
            );
        }
        n
    }

    /// Kills everything in `dir` (a session's or an agent's cgroup) and
    /// removes the cgroups. Blocking.
    pub fn kill_tree(&self, dir: &Path, remove: bool) -> Result<u32, RunError> {
        let n = self.programs_in(dir) as u32;
        self.cgroups.kill(dir, Duration::from_secs(10))?;
        if remove {
            self.cgroups.remove(dir)?;
        }
        Ok(n)
    }
}
