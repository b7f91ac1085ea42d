//! `process.stdin`: writes to a run's standard input, or closes it.

use super::{Input, RunError, Runs};
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
        // A run that ended is said to have ended, not to have its input
        // closed (or the write to have failed).
        let ended = || {
            run.result.borrow().as_ref().map(|r| RunError::StdinEnded {
                run: run_id.to_string(),
                how: match (r.exit_code, r.signal) {
                    (Some(c), _) => format!("exit code {c}"),
                    (None, Some(s)) => format!("killed by signal {s}"),
                    (None, None) => "exit status unknown".into(),
                },
            })
        };
        let closed = || ended().unwrap_or_else(|| RunError::StdinClosed(run_id.to_string()));
        let written = async {
            match g.as_mut().ok_or_else(closed)? {
                Input::Pipe(w) => in_time(w.write_all(data)).await?,
                Input::Terminal => {
                    let t = run.terminal().ok_or_else(closed)?;
                    in_time(t.write_all(data)).await?;
                    if close {
                        // As a terminal closes its input: end of file for
                        // a program that reads lines.
                        in_time(t.write_all(&t.end_of_input())).await?;
                    }
                }
            }
            Ok::<(), RunError>(())
        };
        match written.await {
            Err(RunError::StdinWrite(e)) => return Err(ended().unwrap_or(RunError::StdinWrite(e))),
            other => other?,
        }
        if close {
            *g = None;
        }
        Ok(allox_protocol::StdinWritten {
            written: data.len() as u64,
            closed: close,
        })
    }
}

/// A write the program takes within 10 s, or an error: one that never
/// reads its input does not hold the caller.
pub(super) async fn in_time(
    write: impl std::future::Future<Output = std::io::Result<()>>,
) -> Result<(), RunError> {
    tokio::time::timeout(Duration::from_secs(10), write)
        .await
        .map_err(|_| RunError::StdinNotRead)?
        .map_err(RunError::StdinWrite)
}
