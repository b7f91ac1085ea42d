//! `process.resize` and `process.attach`: a terminal run's size, and its
//! output followed again by a client that left (or another one).

use super::{wait, Run, RunError, Runs};
use allox_protocol::{
    Bytes, Event, OutputChunk, ProcessAttach, ProcessResize, PtySize, Resized, RunResult,
    RunStarted, StreamKind,
};
use std::sync::Arc;
use tokio::sync::broadcast::error::RecvError;

impl Runs {
    /// The run, or why there is none.
    fn run_of(&self, a: &str, s: &str, run_id: &str) -> Result<Arc<Run>, RunError> {
        allox_protocol::validate_id("run_id", run_id)?;
        self.get(a, s, run_id).ok_or_else(|| RunError::NoSuchRun {
            agent: a.to_string(),
            session: s.to_string(),
            run: run_id.to_string(),
        })
    }

    /// Gives a terminal run's terminal a new size.
    pub fn resize(&self, p: &ProcessResize) -> Result<Resized, RunError> {
        super::validate::terminal(&PtySize {
            rows: p.rows,
            cols: p.cols,
            term: None,
        })?;
        let run = self.run_of(&p.agent_id, &p.session_id, &p.run_id)?;
        let t = terminal_of(&run)?;
        t.resize(p.rows, p.cols).map_err(RunError::Resize)?;
        Ok(Resized {
            run_id: p.run_id.clone(),
            rows: p.rows,
            cols: p.cols,
        })
    }

    /// Sends a terminal run's recent output (unless `replay` is false) and
    /// then its output as it comes to `events`, and answers with its end.
    pub async fn attach(
        &self,
        p: &ProcessAttach,
        events: Option<super::EventSink>,
    ) -> Result<RunResult, RunError> {
        let run = self.run_of(&p.agent_id, &p.session_id, &p.run_id)?;
        let done = run.result.subscribe();
        let t = terminal_of(&run)?;
        let (recent, mut follow) = t.follow();
        // The follower alone must not keep the terminal open.
        drop(t);
        let streamed = events.is_some();
        if let Some(ev) = events {
            let chunk = |data: Vec<u8>| {
                Event::Output(OutputChunk {
                    run_id: run.id.clone(),
                    stream: StreamKind::Stdout,
                    data: Bytes(data),
                })
            };
            // Followed from here on: said first, so that a client types
            // into the terminal only once its output is followed (input
            // that ends the run at once would otherwise leave the attach
            // to find the terminal gone).
            let started = Event::Started(RunStarted {
                run_id: run.id.clone(),
                pid: run.pid,
            });
            let mut gone = ev.send(started).await.is_err()
                || (p.replay != Some(false)
                    && !recent.is_empty()
                    && ev.send(chunk(recent)).await.is_err());
            // Until the terminal is gone (the run's output is all read) or
            // the client is.
            while !gone {
                let event = match follow.recv().await {
                    Ok(data) => chunk(data.0),
                    Err(RecvError::Lagged(n)) => Event::Progress {
                        message: format!(
                            "this client fell behind: {n} pieces of the run's output were skipped"
                        ),
                    },
                    Err(RecvError::Closed) => break,
                };
                gone = ev.send(event).await.is_err();
            }
        }
        let mut r = wait::result(done, None).await?;
        if streamed {
            // Its output came as events: not a second time in the answer.
            r.stdout.clear();
            r.stderr.clear();
        }
        Ok(r)
    }
}

/// A run's terminal while it lasts.
fn terminal_of(run: &Run) -> Result<Arc<super::terminal::Terminal>, RunError> {
    match run.terminal() {
        Some(t) => Ok(t),
        None if run.result.borrow().is_some() => Err(RunError::TerminalGone(run.id.clone())),
        None => Err(RunError::NoTerminal(run.id.clone())),
    }
}
