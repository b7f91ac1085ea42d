//! A run's output: read from its pipes as it comes, streamed to the client
//! or captured up to a limit, and drained when the run ends.
//!
//! When the program ends, the readers get a short grace to reach the end of
//! their pipes (a background process may hold them open for ever). Past it
//! they are told to stop: each takes what its pipe holds at that moment,
//! without waiting for more, and returns. So what the program wrote before
//! it ended is never lost to a busy supervisor that was slow to read.

use super::terminal::Terminal;
use super::EventSink;
use allox_protocol::{Event, OutputChunk, StreamKind};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

/// Bytes a stopped reader takes at most: a background process that keeps
/// writing cannot hold the answer.
const STOP_DRAIN_MAX: usize = 1 << 20;

/// How long stopped readers get to return: a safety net only, since they
/// no longer wait on their pipes (a client that reads its stream slowly can
/// still hold one, as it holds the program while it runs).
const STOP_WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(super) struct Capture {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub truncated: bool,
    /// Taken for the run's result: what it holds is there now.
    pub ended: bool,
}

/// Pieces of output held for a follower that reads slowly; past them it
/// is told how many it missed.
const FOLLOW_BACKLOG: usize = 256;

/// A run's output as `process.logs` reads it: what is captured, and the
/// followers of what comes next. A piece is captured or sent to the
/// client, and told to the followers, under one lock; a new follower takes
/// what is captured and subscribes under it too, so it gets each byte
/// once. The followers' channel is made for the first of them (a run
/// nobody follows, and every finished run, holds none).
pub(super) struct Log(Mutex<LogInner>);

#[derive(Default)]
struct LogInner {
    capture: Capture,
    followers: Option<broadcast::Sender<OutputChunk>>,
}

impl LogInner {
    fn tell(&self, chunk: OutputChunk) {
        if let Some(f) = self.followers.as_ref().filter(|f| f.receiver_count() > 0) {
            let _ = f.send(chunk);
        }
    }
}

impl Log {
    pub fn new() -> Log {
        Log(Mutex::new(LogInner::default()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogInner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn followed(&self) -> bool {
        self.lock()
            .followers
            .as_ref()
            .is_some_and(|f| f.receiver_count() > 0)
    }

    /// Keeps a piece (within `limit`) and tells the followers.
    fn keep(&self, chunk: OutputChunk, limit: usize) {
        let mut l = self.lock();
        l.capture.keep(chunk.stream, &chunk.data.0, limit);
        l.tell(chunk);
    }

    /// Tells the followers of a piece sent to the run's client.
    fn tell(&self, chunk: OutputChunk) {
        self.lock().tell(chunk);
    }

    /// What is captured so far, and what comes after it; `None` once the
    /// capture was taken for the result.
    pub fn follow(&self) -> Option<(Capture, broadcast::Receiver<OutputChunk>)> {
        let mut l = self.lock();
        if l.capture.ended {
            return None;
        }
        let kept = Capture {
            stdout: l.capture.stdout.clone(),
            stderr: l.capture.stderr.clone(),
            truncated: l.capture.truncated,
            ended: false,
        };
        let followers = l
            .followers
            .get_or_insert_with(|| broadcast::channel(FOLLOW_BACKLOG).0);
        Some((kept, followers.subscribe()))
    }

    /// Takes the capture for the result; the followers' channel closes
    /// once they have read what it holds.
    pub fn take(&self) -> Capture {
        let mut l = self.lock();
        let out = std::mem::take(&mut l.capture);
        l.capture.ended = true;
        l.followers = None;
        out
    }
}

impl Capture {
    fn keep(&mut self, kind: StreamKind, data: &[u8], limit: usize) {
        let dst = match kind {
            StreamKind::Stdout => &mut self.stdout,
            StreamKind::Stderr => &mut self.stderr,
        };
        let room = limit.saturating_sub(dst.len());
        if data.len() > room {
            self.truncated = true;
        }
        dst.extend_from_slice(&data[..data.len().min(room)]);
    }
}

/// What a reader reads: a pipe, or a terminal's master side.
pub(super) enum Source {
    Pipe(tokio::net::unix::pipe::Receiver),
    Pty(Arc<Terminal>),
}

impl Source {
    async fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::Pipe(rx) => rx.read(buf).await,
            Source::Pty(t) => t.read(buf).await,
        }
    }

    fn try_read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::Pipe(rx) => rx.try_read(buf),
            Source::Pty(t) => t.try_read(buf),
        }
    }

    /// What was read, kept for those who attach to a terminal.
    fn record(&self, data: &[u8]) {
        if let Source::Pty(t) = self {
            t.record(data);
        }
    }
}

/// The readers of one run's stdout and stderr (or its terminal).
pub(super) struct Readers {
    tasks: Vec<JoinHandle<()>>,
    stop: watch::Sender<bool>,
}

/// What a reader writes to.
struct Sink {
    kind: StreamKind,
    run_id: String,
    events: Option<EventSink>,
    log: Arc<Log>,
    limit: usize,
}

impl Readers {
    /// Starts reading `pipes`, streaming to `events` when given, capturing
    /// into `log` otherwise (and once the client is gone).
    pub fn start(
        pipes: Vec<(Source, StreamKind)>,
        run_id: &str,
        events: Option<EventSink>,
        log: &Arc<Log>,
        limit: usize,
    ) -> Readers {
        let (stop, stopped) = watch::channel(false);
        let tasks = pipes
            .into_iter()
            .map(|(rx, kind)| {
                let sink = Sink {
                    kind,
                    run_id: run_id.to_string(),
                    events: events.clone(),
                    log: log.clone(),
                    limit,
                };
                tokio::spawn(read(rx, sink, stopped.clone()))
            })
            .collect();
        Readers { tasks, stop }
    }

    /// Once the program has ended: waits up to `grace` for the pipes to
    /// close, then stops the readers after they take what the pipes hold.
    pub async fn drain(self, grace: Duration) {
        let mut tasks = self.tasks;
        let closed = async {
            for t in tasks.iter_mut() {
                let _ = t.await;
            }
        };
        if tokio::time::timeout(grace, closed).await.is_ok() {
            return;
        }
        let _ = self.stop.send(true);
        let stopped = async {
            for t in tasks.iter_mut().filter(|t| !t.is_finished()) {
                let _ = t.await;
            }
        };
        let _ = tokio::time::timeout(STOP_WAIT, stopped).await;
        for t in &tasks {
            t.abort();
        }
    }
}

async fn read(mut rx: Source, mut sink: Sink, mut stop: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut stopping = false;
    let mut after_stop = 0;
    loop {
        let n = if stopping {
            // Only what the pipe holds now.
            match rx.try_read(&mut buf) {
                Ok(n) if n > 0 && after_stop < STOP_DRAIN_MAX => n,
                _ => return,
            }
        } else {
            tokio::select! {
                r = rx.read(&mut buf) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                _ = stop.changed() => {
                    stopping = true;
                    continue;
                }
            }
        };
        if stopping {
            after_stop += n;
        }
        rx.record(&buf[..n]);
        sink.take(&buf[..n], stopping, &mut stop).await;
    }
}

impl Sink {
    async fn take(&mut self, data: &[u8], stopping: bool, stop: &mut watch::Receiver<bool>) {
        let mut chunk = OutputChunk {
            run_id: self.run_id.clone(),
            stream: self.kind,
            data: data.into(),
        };
        if let Some(ev) = &self.events {
            // A copy only for followers, when there are any.
            let copy = self.log.followed().then(|| chunk.clone());
            // Waiting here is the throttle: a slow client slows the
            // program. Once the run has ended nothing waits: what the
            // client cannot take now goes to the captured output.
            let event = Event::Output(chunk);
            // A wait for room that the run's end interrupts: the stop of
            // the readers is not held up by a client that does not read
            // (a stopped `alloxctl exec` held a shutdown for 10 s).
            let refused = if stopping {
                ev.try_send(event).err().map(|e| e.into_inner())
            } else {
                tokio::select! {
                    room = ev.reserve() => match room {
                        Ok(room) => {
                            room.send(event);
                            None
                        }
                        Err(_) => Some(event),
                    },
                    Ok(()) = stop.changed() => Some(event),
                }
            };
            match refused {
                None => {
                    if let Some(c) = copy {
                        self.log.tell(c);
                    }
                    return;
                }
                Some(Event::Output(c)) => chunk = c,
                // What comes back is what was sent: output.
                Some(_) => return,
            }
            self.events = None;
        }
        self.log.keep(chunk, self.limit);
    }
}
