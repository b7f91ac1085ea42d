//! `process.stdin`: writes to a run's standard input, or closes it.

use super::{RunError, Runs};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

impl Runs {
    /// Writes to a run's standard input, or closes it.
    pub async fn stdin(
        &self,
        a: &str,
        s: &str,
        run_id: &str,
        data: &[u8],
        close: bool,
    ) -> Result<allox_protocol::StdinWritten, RunError> {
        allox_protocol::validate_id("run_id", run_id)?;
        let run = self.get(a, s, run_id).ok_or_else(|| RunError::NoSuchRun {
            agent: a.to_string(),
            session: s.to_string(),
            run: run_id.to_string(),
        })?;
        let mut g = run.stdin.lock().await;
        let Some(w) = g.as_mut() else {
            return Err(RunError::StdinClosed(run_id.to_string()));
        };
        tokio::time::timeout(Duration::from_secs(10), w.write_all(data))
            .await
            .map_err(|_| RunError::StdinNotRead)?
            .map_err(RunError::StdinWrite)?;
        if close {
            *g = None;
        }
        Ok(allox_protocol::StdinWritten {
            written: data.len() as u64,
            closed: close,
        })
    }
}
