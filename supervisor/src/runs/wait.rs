//! `process.wait`: a run's result, once its end is published (`end.rs`);
//! for a run of an earlier supervisor, the end of its processes.

use super::{RunError, Runs};
use allox_protocol::RunResult;
use std::time::Duration;
use tokio::sync::watch;

impl Runs {
    /// Waits for a run's end (at most `timeout`).
    pub async fn wait(
        &self,
        a: &str,
        s: &str,
        run_id: &str,
        timeout: Option<Duration>,
    ) -> Result<RunResult, RunError> {
        allox_protocol::validate_id("run_id", run_id)?;
        let run = self.get(a, s, run_id);
        match run {
            Some(run) => result(run.result.subscribe(), timeout).await,
            None if self.cgroups.run_dir(a, s, run_id).exists() => {
                // Started by an earlier supervisor: its status is gone; wait
                // for its processes to end.
                let dir = self.cgroups.run_dir(a, s, run_id);
                let cg = self.cgroups.clone();
                let t = timeout.unwrap_or(Duration::from_secs(24 * 3600));
                tokio::task::spawn_blocking(move || cg.wait_empty(&dir, t))
                    .await?
                    .map_err(|_| RunError::StillRunning(run_id.to_string()))?;
                Ok(RunResult {
                    run_id: run_id.to_string(),
                    exit_code: None,
                    signal: None,
                    stdout: String::new(),
                    stderr: "(started by an earlier supervisor: exit status unknown)".into(),
                    truncated: false,
                    timed_out: false,
                    output_dropped: false,
                    output_lossy: false,
                    usage: None,
                    oom_killed: None,
                    effects: None,
                })
            }
            None => {
                let r = &self.cfg.finished;
                // An id from before this supervisor began: if it was a
                // run, its end went with the earlier supervisor (it was
                // said to be past the bounds of the runs kept, two seconds
                // after it ended). Said as a possibility: an id alone does
                // not say a run was ever started under it.
                if started_ms(run_id).is_some_and(|t| t < self.began_ms) {
                    return Err(RunError::EndedBeforeRestart {
                        agent: a.to_string(),
                        session: s.to_string(),
                        run: run_id.to_string(),
                    });
                }
                Err(RunError::NotKept {
                    agent: a.to_string(),
                    session: s.to_string(),
                    run: run_id.to_string(),
                    keep_for: r.keep_for,
                    max_runs: r.max_runs,
                })
            }
        }
    }
}

/// The run's result once it is published (at most `timeout`).
pub(super) async fn result(
    mut rx: watch::Receiver<Option<RunResult>>,
    timeout: Option<Duration>,
) -> Result<RunResult, RunError> {
    let wait = async {
        loop {
            if let Some(r) = rx.borrow_and_update().clone() {
                return Ok(r);
            }
            if rx.changed().await.is_err() {
                return Err(RunError::MonitorStopped);
            }
        }
    };
    match timeout {
        Some(t) => tokio::time::timeout(t, wait)
            .await
            .unwrap_or(Err(RunError::StillGoing(t))),
        None => wait.await,
    }
}

/// When run `id` started (ms since the Unix epoch): its id is that time in
/// hex, then four hex digits of a counter (eight after a reseed).
fn started_ms(id: &str) -> Option<u64> {
    // The time has 11 hex digits from 1975 to 2527.
    if !matches!(id.len(), 15 | 19) {
        return None;
    }
    u64::from_str_radix(id.get(..11)?, 16).ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_run_id_says_when_it_started() {
        assert_eq!(super::started_ms("1a25296d6a60018"), Some(0x1a25296d6a6));
        assert_eq!(
            super::started_ms("1a25296d6a612345678"),
            Some(0x1a25296d6a6)
        );
        assert_eq!(super::started_ms("nosuch"), None);
        assert_eq!(super::started_ms("zz25296d6a60018"), None);
    }
}
