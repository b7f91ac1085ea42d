//! `process.kill`: signals for one run or a whole session, and the killing
//! of a session's (or agent's) cgroup tree that rollbacks, deletes and
//! shutdown use.
//!
//! SIGKILL goes through `cgroup.kill`, which reaches every process however
//! it was forked; other signals go to each run's init through its pidfd,
//! which passes them on to its program.

use super::{Run, RunError, Runs};
use allox_protocol::ProcessKill;
use std::path::Path;
use std::sync::Arc;
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
