//! `process.logs`: a run's output, with or without a terminal, live or
//! ended: what is kept of it, then (`follow`) what it writes from now on,
//! each byte once, until it ends.

use super::{wait, EventSink, RunError, Runs};
use allox_protocol::{Bytes, Event, OutputChunk, ProcessLogs, RunLogs, RunResult, StreamKind};
use tokio::sync::broadcast::error::RecvError;

impl Runs {
    /// The run's kept output; with `events`, sent as events, followed by
    /// what comes until the run ends.
    pub async fn logs(
        &self,
        p: &ProcessLogs,
        events: Option<EventSink>,
    ) -> Result<RunLogs, RunError> {
        allox_protocol::validate_id("run_id", &p.run_id)?;
        let run = self
            .get(&p.agent_id, &p.session_id, &p.run_id)
            .ok_or_else(|| RunError::NoSuchRun {
                agent: p.agent_id.clone(),
                session: p.session_id.clone(),
                run: p.run_id.clone(),
            })?;
        let ended = |r: RunResult| ended(r, events.as_ref());
        let done = run.result.subscribe();
        let finished = done.borrow().clone();
        if let Some(r) = finished {
            return Ok(ended(r).await);
        }
        // Its output goes to the result now: read it there.
        let Some((kept, mut follow)) = run.log.follow() else {
            return Ok(ended(wait::result(done, None).await?).await);
        };
        let Some(ev) = events else {
            return Ok(RunLogs {
                run_id: run.id.clone(),
                stdout: kept.stdout.into(),
                stderr: kept.stderr.into(),
                truncated: kept.truncated,
                result: None,
            });
        };
        let chunk = |stream, data: Vec<u8>| {
            Event::Output(OutputChunk {
                run_id: run.id.clone(),
                stream,
                data: Bytes(data),
            })
        };
        for (stream, data) in [
            (StreamKind::Stdout, kept.stdout),
            (StreamKind::Stderr, kept.stderr),
        ] {
            if !data.is_empty() && ev.send(chunk(stream, data)).await.is_err() {
                return Err(RunError::StillRunning(run.id.clone()));
            }
        }
        // From here on each piece comes as it is written: said, so that a
        // client knows it follows.
        let following = Event::Progress {
            message: format!("following run {} as it writes", run.id),
        };
        if ev.send(following).await.is_err() {
            return Err(RunError::StillRunning(run.id.clone()));
        }
        let mut truncated = kept.truncated;
        let mut done_rx = done.clone();
        loop {
            let event = tokio::select! {
                biased;
                got = follow.recv() => match got {
                    Ok(c) => Event::Output(c),
                    Err(RecvError::Lagged(n)) => {
                        truncated = true;
                        Event::Progress {
                            message: format!(
                                "this client fell behind: {n} pieces of the run's output were skipped"
                            ),
                        }
                    }
                    Err(RecvError::Closed) => break,
                },
                // The result is published after its output was all read
                // (and told): what is still queued comes first (biased).
                _ = done_rx.changed() => {
                    if follow.is_empty() {
                        break;
                    }
                    continue;
                }
            };
            if ev.send(event).await.is_err() {
                return Err(RunError::StillRunning(run.id.clone()));
            }
        }
        let mut r = wait::result(done, None).await?;
        // Its output came as events.
        r.stdout.clear();
        r.stderr.clear();
        Ok(RunLogs {
            run_id: run.id.clone(),
            stdout: Bytes::default(),
            stderr: Bytes::default(),
            truncated,
            result: Some(r),
        })
    }
}

/// An ended run's logs: its result's output, as events when there are
/// events to send, else in the answer.
async fn ended(mut r: RunResult, events: Option<&EventSink>) -> RunLogs {
    let (out, err) = (std::mem::take(&mut r.stdout), std::mem::take(&mut r.stderr));
    let truncated = r.truncated || r.output_dropped;
    let mut logs = RunLogs {
        run_id: r.run_id.clone(),
        stdout: Bytes::default(),
        stderr: Bytes::default(),
        truncated,
        result: None,
    };
    match events {
        Some(ev) => {
            for (stream, data) in [(StreamKind::Stdout, out), (StreamKind::Stderr, err)] {
                if data.is_empty() {
                    continue;
                }
                let _ = ev
                    .send(Event::Output(OutputChunk {
                        run_id: r.run_id.clone(),
                        stream,
                        data: Bytes(data.into_bytes()),
                    }))
                    .await;
            }
        }
        None => {
            logs.stdout = Bytes(out.into_bytes());
            logs.stderr = Bytes(err.into_bytes());
        }
    }
    logs.result = Some(r);
    logs
}
