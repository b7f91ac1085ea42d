//! The control server: many clients, many requests per connection, no
//! client able to hold up another.
//!
//! Per connection, a reader task decodes frames and starts one task per
//! request (at most [`Limits::inflight`] at once; beyond that the reader
//! stops reading, which pushes back on the client), and a writer task sends
//! answers in the order they finish, from a queue bounded in bytes
//! ([`outbox`]). A client that stalls mid-frame, takes longer than
//! [`Limits::frame`] over one frame, never reads its answers, or keeps
//! sending garbage is disconnected (a stream's events alone wait for it:
//! a client stopped by Ctrl-Z slows the run it follows, see
//! [`outbox::Outgoing::patient`]); store work runs on the blocking pool,
//! never on the tasks that do I/O. Idle connections never lock a new client
//! out ([`registry`]).
//!
//! Every frame out is stamped with the conversation of the Hello its
//! request followed. A new Hello (a new host on a serial port) ends the
//! previous conversation: its waits and streams are cancelled and whatever
//! it still had to say is dropped, never sent to the new host.

mod outbox;
mod registry;

use crate::passed;
use crate::peer::{Peer, PeerPolicy, Refusals};
use crate::supervisor::Supervisor;
use allox_protocol::{
    decode, encode, ClientFrame, ErrorBody, ErrorCode, Event, EventEnvelope, FrameReader, Hello,
    OnDisconnect, Outcome, Request, ResponseEnvelope, Route, ServerFrame, PROTOCOL_VERSION,
};
use outbox::Outbox;
use registry::{Registered, Registry};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct Limits {
    /// Requests of one connection being worked on at once.
    pub inflight: usize,
    /// How long a half-received frame may wait for its next byte.
    pub stall: Duration,
    /// How long one frame may take from its first byte to its last,
    /// however steadily its bytes trickle in.
    pub frame: Duration,
    /// How long one answer may take to be written (a client that does not
    /// read is dropped after this).
    pub write: Duration,
    /// Bytes of answers and events queued for one connection.
    pub write_queue: usize,
    /// Store requests of one connection computing their answer at once:
    /// with [`Limits::write_queue`] this bounds what a client that reads
    /// nothing makes the supervisor hold (about `write_queue + computing
    /// × 1 MiB`); the other requests wait, unread, without cost.
    pub computing: usize,
    /// Bad frames tolerated on one connection before it is dropped.
    pub bad_frames: u32,
    /// Connections served at once; at the limit the longest idle one is
    /// closed for a new client.
    pub connections: usize,
    /// How long a new connection may take to say Hello.
    pub hello: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            inflight: 64,
            stall: Duration::from_secs(10),
            frame: Duration::from_secs(30),
            write: Duration::from_secs(10),
            write_queue: 4 << 20,
            computing: 4,
            bad_frames: 16,
            connections: 4096,
            hello: Duration::from_secs(10),
        }
    }
}

/// The supervisor a connection's requests go to. On the Unix socket it
/// is there from the start. A guest's control port is served before the
/// store is open, so that a host's Hello is answered at once: its
/// requests wait here until the daemon is ready ([`Ready::later`]).
#[derive(Clone)]
pub struct Ready(watch::Receiver<Option<Arc<Supervisor>>>);

impl Ready {
    /// A supervisor that is ready.
    pub fn now(sup: Arc<Supervisor>) -> Self {
        Ready(watch::channel(Some(sup)).1)
    }

    /// One made ready later, by sending it on the sender.
    pub fn later() -> (watch::Sender<Option<Arc<Supervisor>>>, Self) {
        let (tx, rx) = watch::channel(None);
        (tx, Ready(rx))
    }

    fn get(&self) -> Option<Arc<Supervisor>> {
        self.0.borrow().clone()
    }

    /// The supervisor once it is ready; `None` if the daemon stopped
    /// before it was.
    async fn wait(mut self) -> Option<Arc<Supervisor>> {
        self.0
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|s| s.clone())
    }
}

/// A connection's read buffer: small while it is idle, big while a large
/// frame comes in.
/// How long a start whose client hung up (asking its run killed then)
/// is let go on for its run to be known: a sandbox's build, at worst.
const START_SETTLES: Duration = Duration::from_secs(30);

const SMALL_READ: usize = 8 * 1024;
const BIG_READ: usize = 256 * 1024;

/// Accepts connections until the task is dropped, serving the peers that
/// `peers` allows and refusing the others ([`crate::peer`]).
pub async fn serve_unix(
    listener: UnixListener,
    sup: Arc<Supervisor>,
    limits: Limits,
    peers: PeerPolicy,
) {
    let registry = Registry::new(limits.connections);
    let mut refusals = Refusals::default();
    let mut refused_logged = None::<Instant>;
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let who = Peer::of(&stream);
                if !who.admitted(&peers) {
                    refusals.refuse(stream, &who, &sup);
                    continue;
                }
                let peer = who.label();
                let (r, mut w) = stream.into_split();
                let (r, passed) = passed::Reader::new(r);
                let Some(slot) = registry.admit() else {
                    // Every connection has a request in flight: this one
                    // is told so and closed.
                    if refused_logged.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                        tracing::warn!(%peer, connections = registry.len(), "every connection is busy; refusing a new one");
                        refused_logged = Some(Instant::now());
                    }
                    let f = ServerFrame::Refused(ErrorBody::new(
                        ErrorCode::Unavailable,
                        format!(
                            "all {} connections have requests in flight; retry shortly",
                            limits.connections
                        ),
                    ));
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(
                            Duration::from_secs(1),
                            w.write_all(&frame_bytes(&f)),
                        )
                        .await;
                    });
                    continue;
                };
                let (sup, limits) = (sup.clone(), limits.clone());
                tokio::spawn(serve(
                    r,
                    w,
                    peer,
                    Ready::now(sup),
                    limits,
                    Transport::Socket,
                    Some(slot),
                    Some(passed),
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn error_frame(conversation: u64, request_id: u64, code: ErrorCode, msg: String) -> ServerFrame {
    ServerFrame::Response(ResponseEnvelope {
        conversation,
        request_id,
        outcome: Outcome::Err(ErrorBody::new(code, msg)),
    })
}

fn frame_bytes(f: &ServerFrame) -> Vec<u8> {
    match encode(f) {
        Ok(b) => b,
        Err(e) => {
            let (conversation, id) = match f {
                ServerFrame::Response(r) => (r.conversation, r.request_id),
                ServerFrame::Event(ev) => (ev.conversation, ev.request_id),
                _ => (0, 0),
            };
            let fallback = error_frame(
                conversation,
                id,
                ErrorCode::Internal,
                format!("answer could not be sent: {e}; narrow the request"),
            );
            encode(&fallback).unwrap_or_default()
        }
    }
}

/// What carries a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A socket: the connection ends when the client goes or misbehaves.
    Socket,
    /// A serial port, which outlives its hosts: where a socket would be
    /// closed, the conversation starts over instead (its torn frame and
    /// greeting dropped), and answers nobody reads are dropped.
    Serial,
}

/// Serves one connection over any byte stream (Unix socket, serial port).
pub async fn connection<R, W>(rd: R, wr: W, peer: String, sup: Arc<Supervisor>, limits: Limits)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    serve(
        rd,
        wr,
        peer,
        Ready::now(sup),
        limits,
        Transport::Socket,
        None,
        None,
    )
    .await
}

/// Serves a byte stream until it ends ([`Transport::Socket`]) or for ever
/// ([`Transport::Serial`]).
pub async fn serve_stream<R, W>(
    rd: R,
    wr: W,
    peer: String,
    sup: Ready,
    limits: Limits,
    transport: Transport,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    serve(rd, wr, peer, sup, limits, transport, None, None).await
}

/// Writes queued frames of the current conversation; drops the others.
async fn write_loop<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<outbox::Outgoing>,
    current: watch::Receiver<u64>,
    limit: Duration,
    serial: bool,
    peer: String,
) {
    while let Some(out) = rx.recv().await {
        if out.conversation != 0 && out.conversation != *current.borrow() {
            tracing::debug!(%peer, conversation = out.conversation, "answer of an ended conversation dropped");
            continue;
        }
        // A stream's event waits as long as its client takes to read it
        // (a stopped `alloxctl exec`: the run is slowed, not killed as
        // "gone" when the client was dropped after 10 s); never on the
        // serial port, where no host may be reading.
        let write = wr.write_all(&out.bytes);
        let written = if out.patient && !serial {
            Ok(write.await)
        } else {
            tokio::time::timeout(limit, write).await
        };
        match written {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) if serial => {
                // No host reads the port: this answer is lost, the next
                // host gets the next ones.
                tracing::debug!(%peer, "answer dropped: no host reads the port");
            }
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "write failed; closing");
                break;
            }
            Err(_) => {
                tracing::warn!(%peer, "client does not read its answers; closing");
                break;
            }
        }
    }
}

/// What the connection is doing about the frame it is reading.
struct FrameClock {
    /// When the frame being received must be complete.
    deadline: Option<Instant>,
}

impl FrameClock {
    /// How long the next read may take, `None` for no limit.
    fn next_wait(&self, limits: &Limits, pending: bool, hello_due: bool) -> Option<Duration> {
        if pending {
            let left = self
                .deadline
                .map(|d| d.saturating_duration_since(Instant::now()))
                .unwrap_or(limits.frame);
            return Some(limits.stall.min(left));
        }
        hello_due.then_some(limits.hello)
    }

    /// After bytes were taken in: a partial frame starts its clock, a
    /// frame completed stops it (the next partial one starts anew).
    fn after_read(&mut self, limits: &Limits, pending: bool, completed: bool) {
        if !pending {
            self.deadline = None;
        } else if self.deadline.is_none() || completed {
            self.deadline = Some(Instant::now() + limits.frame);
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve<R, W>(
    mut rd: R,
    wr: W,
    peer: String,
    sup: Ready,
    limits: Limits,
    transport: Transport,
    slot: Option<Registered>,
    passed: Option<passed::Passed>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let serial = transport == Transport::Serial;
    let (outbox, rx) = Outbox::new(limits.write_queue);
    // The conversation frames are written for; 0 until the first Hello.
    let (conv_tx, conv_rx) = watch::channel(0u64);
    let writer = tokio::spawn(write_loop(
        wr,
        rx,
        conv_rx,
        limits.write,
        serial,
        peer.clone(),
    ));

    if serial {
        // A host still waiting on the other end was talking to a supervisor
        // that is gone: its request has no answer coming. An error with
        // request id 0 (to whoever is there) ends its wait; a host that is
        // saying Hello skips it.
        let f = error_frame(
            0,
            0,
            ErrorCode::Unavailable,
            "the supervisor (re)started: a request in flight before this has no answer; whether it was applied shows in the store (it is whole or not at all)".into(),
        );
        let mut bytes = vec![0];
        bytes.extend(frame_bytes(&f));
        let _ = outbox.send(0, bytes).await;
    }
    let gone = passed::Gone::default();
    // True once the client has hung up (its end of the connection read).
    let (hung_up_tx, hung_up) = watch::channel(false);
    let sem = Arc::new(Semaphore::new(limits.inflight));
    let computing = Arc::new(Semaphore::new(limits.computing.max(1)));
    let mut reader = FrameReader::new();
    let mut buf = vec![0u8; SMALL_READ];
    let mut greeted = false;
    let mut conversation = 0u64;
    let mut bad = 0u32;
    let mut clock = FrameClock { deadline: None };
    let evicted = async {
        match &slot {
            Some(s) => s.slot.evicted.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(evicted);
    'conn: loop {
        let wait = clock.next_wait(&limits, reader.pending() > 0, !greeted && !serial);
        let read = async {
            match wait {
                Some(t) => tokio::time::timeout(t, rd.read(&mut buf)).await.ok(),
                // A serial port waits for its next host without a deadline.
                None => Some(rd.read(&mut buf).await),
            }
        };
        let n = tokio::select! {
            r = read => r,
            _ = &mut evicted => {
                tracing::debug!(%peer, "idle connection closed for a new client");
                let f = error_frame(
                    conversation,
                    0,
                    ErrorCode::Unavailable,
                    "connection closed: it was idle the longest when the connection limit was reached".into(),
                );
                let _ = outbox.send(conversation, frame_bytes(&f)).await;
                break 'conn;
            }
        };
        let n = match n {
            Some(r) => r,
            None if serial => {
                tracing::debug!(%peer, "torn frame dropped: the host stopped mid-frame");
                (reader, greeted, bad) = (FrameReader::new(), false, 0);
                clock.deadline = None;
                continue;
            }
            None => {
                tracing::warn!(%peer, greeted, "client stalled or too slow over one frame; closing");
                break;
            }
        };
        let n = match n {
            Ok(0) | Err(_) if serial => {
                // No host on the other end (a read says so at once): look
                // again shortly. The conversation is not reset here: the
                // port's "host gone" and "host back" notices travel apart
                // from its data, so this end-of-file can arrive after the
                // next host's first bytes. A new host starts over itself,
                // with a zero byte (ending any torn frame) and a Hello.
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if writer.is_finished() {
            break;
        }
        if let Some(s) = &slot {
            s.slot.touch(&s.reg);
        }
        reader.push(&buf[..n]);
        // A big frame on its way (a file's chunk) is read in big pieces;
        // an idle connection keeps a small buffer.
        match reader.pending() {
            p if p > SMALL_READ && buf.len() < BIG_READ => buf.resize(BIG_READ, 0),
            0 if buf.len() > SMALL_READ => buf = vec![0u8; SMALL_READ],
            _ => {}
        }
        let mut completed = false;
        while let Some(frame) = reader.next_frame() {
            completed = true;
            let msg = frame
                .map_err(|e| allox_protocol::error_chain(&e))
                .and_then(|p| {
                    decode::<ClientFrame>(&p).map_err(|e| allox_protocol::error_chain(&e))
                });
            let msg = match msg {
                Ok(m) => m,
                Err(why) => {
                    bad += 1;
                    let f = error_frame(
                        conversation,
                        0,
                        ErrorCode::InvalidRequest,
                        format!("unreadable frame: {why}"),
                    );
                    if outbox.send(conversation, frame_bytes(&f)).await.is_err() {
                        break 'conn;
                    }
                    if bad > limits.bad_frames && serial {
                        tracing::warn!(%peer, bad, "too many bad frames; starting over");
                        (reader, greeted, bad) = (FrameReader::new(), false, 0);
                        clock.deadline = None;
                        continue 'conn;
                    }
                    if bad > limits.bad_frames {
                        tracing::warn!(%peer, bad, "too many bad frames; closing");
                        break 'conn;
                    }
                    continue;
                }
            };
            match msg {
                ClientFrame::Hello(h) => {
                    if h.version != PROTOCOL_VERSION {
                        let why = ErrorBody::new(
                            ErrorCode::VersionMismatch,
                            format!(
                                "client speaks protocol {} ({}), this supervisor speaks {} ({}); use matching builds",
                                h.version,
                                h.build,
                                PROTOCOL_VERSION,
                                allox_protocol::build_identity()
                            ),
                        );
                        let _ = outbox
                            .send(0, frame_bytes(&ServerFrame::Refused(why)))
                            .await;
                        if serial || greeted {
                            // The port (or the greeted connection) stays;
                            // the refused host gets nothing else.
                            (reader, greeted, bad) = (FrameReader::new(), false, 0);
                            conversation = 0;
                            conv_tx.send_replace(0);
                            clock.deadline = None;
                            continue 'conn;
                        }
                        break 'conn;
                    }
                    // A new conversation: whatever the previous one still
                    // has in flight is cancelled or its answers dropped. On
                    // a serial port a host that reconnects can reach us
                    // before its predecessor's end does.
                    greeted = true;
                    bad = 0;
                    conversation = h.conversation;
                    conv_tx.send_replace(conversation);
                    let f = ServerFrame::Welcome(Hello::new(conversation));
                    if outbox.send(conversation, frame_bytes(&f)).await.is_err() {
                        break 'conn;
                    }
                }
                ClientFrame::Request(_) if !greeted => {
                    let f = ServerFrame::Refused(ErrorBody::invalid(
                        "the first frame must be Hello; nothing else is accepted before it",
                    ));
                    let _ = outbox.send(0, frame_bytes(&f)).await;
                    if serial {
                        (reader, greeted, bad) = (FrameReader::new(), false, 0);
                        clock.deadline = None;
                        continue 'conn;
                    }
                    break 'conn;
                }
                ClientFrame::Request(env) if env.conversation != conversation => {
                    // A request of a conversation that has ended: nobody
                    // waits for its answer.
                    tracing::debug!(%peer, conversation = env.conversation, "request of an ended conversation ignored");
                }
                ClientFrame::Request(env) => {
                    let Ok(permit) = sem.clone().acquire_owned().await else {
                        break 'conn;
                    };
                    let busy = slot.as_ref().map(|s| s.slot.busy());
                    // The descriptor the client passed with it, on a
                    // socket that takes them.
                    let fd = match (&passed, env.request.passes_descriptor()) {
                        (Some(p), true) => p.oldest(),
                        _ => None,
                    };
                    let ctx = {
                        let (outbox, computing, peer, gone) = (
                            outbox.clone(),
                            computing.clone(),
                            peer.clone(),
                            gone.clone(),
                        );
                        let ended = conv_tx.subscribe();
                        let hung_up = hung_up.clone();
                        move |sup| RequestCtx {
                            sup,
                            outbox,
                            computing,
                            peer,
                            conversation,
                            ended,
                            hung_up,
                            fd,
                            gone,
                        }
                    };
                    let (id, req) = (env.request_id, env.request);
                    let ready = sup.get();
                    if let (Request::Ping(_), Some(sup)) = (&req, ready) {
                        // Cheap and lock-free: answered on the I/O task.
                        let out = sup.handle(&peer, id, &req);
                        drop((permit, busy));
                        if ctx(sup).answer(id, out).await.is_err() {
                            break 'conn;
                        }
                        continue;
                    }
                    let sup = sup.clone();
                    tokio::spawn(async move {
                        // A daemon still opening its store answers once
                        // it has; one that stopped first answers nothing
                        // (the host's next Hello says it restarted).
                        if let Some(sup) = sup.wait().await {
                            ctx(sup).run(id, req).await;
                        }
                        drop((permit, busy));
                    });
                }
            }
        }
        clock.after_read(&limits, reader.pending() > 0, completed);
    }
    gone.store(true, std::sync::atomic::Ordering::SeqCst);
    hung_up_tx.send_replace(true);
    drop(outbox);
    // Answers already being worked on still go out if the client reads.
    let _ = tokio::time::timeout(limits.write, writer).await;
}

/// What one request's task needs.
struct RequestCtx {
    sup: Arc<Supervisor>,
    outbox: Outbox,
    computing: Arc<Semaphore>,
    peer: String,
    conversation: u64,
    /// Changes when a new Hello ends this conversation.
    ended: watch::Receiver<u64>,
    /// True once the client has hung up (answers being made may still go
    /// out, for a while, to one that only closed its writing side).
    hung_up: watch::Receiver<bool>,
    /// The descriptor that came with the request.
    fd: Option<std::os::fd::OwnedFd>,
    /// Set when the connection's client has gone.
    gone: passed::Gone,
}

impl RequestCtx {
    async fn answer(
        &self,
        request_id: u64,
        out: Result<allox_protocol::Response, ErrorBody>,
    ) -> Result<(), outbox::Closed> {
        let f = ServerFrame::Response(ResponseEnvelope {
            conversation: self.conversation,
            request_id,
            outcome: out.into(),
        });
        self.outbox.send(self.conversation, frame_bytes(&f)).await
    }

    /// Answers one request (off the reader's task).
    async fn run(mut self, id: u64, req: Request) {
        if req.route() == Route::Core {
            // Held until the answer is queued: a client that does not read
            // stops new answers from being made, not only from being sent.
            let Ok(_computing) = self.computing.clone().acquire_owned().await else {
                return;
            };
            let (sup, peer, fd) = (self.sup.clone(), self.peer.clone(), self.fd.take());
            let gone = self.gone.clone();
            let out = tokio::task::spawn_blocking(move || {
                passed::with(fd, gone, || sup.handle(&peer, id, &req))
            })
            .await
            .unwrap_or_else(|e| {
                Err(ErrorBody::new(
                    ErrorCode::Internal,
                    format!("request handler failed: {e}"),
                ))
            });
            let _ = self.answer(id, out).await;
            return;
        }
        // Stream events go out as frames tagged with the request; a slow
        // client slows the run, not us.
        let (etx, mut erx) = mpsc::channel::<Event>(16);
        let (outbox, conversation) = (self.outbox.clone(), self.conversation);
        // A run to kill if its client goes first: its id, from the event
        // that says it started.
        let kill_on_disconnect = match &req {
            Request::ProcessStart(p) if p.on_disconnect == OnDisconnect::Kill => {
                Some((p.agent_id.clone(), p.session_id.clone()))
            }
            _ => None,
        };
        // A stream that only ends with its client, holding what it took
        // (a watch: one of root's few inotify instances): given back when
        // the client hangs up, not once its answers have had their time.
        let ends_with_client = matches!(req, Request::FsWatch(_));
        let (started_tx, mut started) = tokio::sync::watch::channel::<Option<String>>(None);
        let forward = tokio::spawn(async move {
            while let Some(event) = erx.recv().await {
                if let Event::Started(s) = &event {
                    started_tx.send_replace(Some(s.run_id.clone()));
                }
                let f = ServerFrame::Event(EventEnvelope {
                    conversation,
                    request_id: id,
                    event,
                });
                if outbox
                    .send_event(conversation, frame_bytes(&f))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        let mine = self.conversation;
        // In a task of its own, so that a panic in it (a bug) fails this
        // request with an answer instead of leaving the client waiting.
        let (sup, peer) = (self.sup.clone(), self.peer.clone());
        let action = req.action();
        let mut work =
            tokio::spawn(async move { sup.handle_async(&peer, id, &req, Some(etx)).await });
        let out = tokio::select! {
            out = &mut work => Some(out.unwrap_or_else(|e| {
                tracing::error!(action, error = %e, "request failed");
                Err(ErrorBody::new(
                    ErrorCode::Internal,
                    format!("{action} failed: the supervisor hit a bug ({e})"),
                ))
            })),
            // The host that asked is gone: stop waiting (a run it started
            // goes on; only the wait or the stream ends).
            _ = self.ended.wait_for(|c| *c != mine) => None,
            // A run to be killed with its client's going: killed when the
            // client hangs up, not once its connection's last answers
            // have had their time to go out.
            _ = self.hung_up.wait_for(|h| *h), if kill_on_disconnect.is_some() || ends_with_client => None,
        };
        let Some(out) = out else {
            if kill_on_disconnect.is_some() {
                // A start cut half-way left a run made and not known (and
                // the session's context broken): it is let go on until its
                // run is known, or it ends, then cancelled.
                tokio::select! {
                    _ = &mut work => {}
                    _ = started.wait_for(Option::is_some) => {}
                    _ = tokio::time::sleep(START_SETTLES) => {}
                }
            }
            work.abort();
            forward.abort();
            tracing::debug!(peer = %self.peer, id, "request of an ended conversation cancelled");
            let run = started.borrow().clone();
            if let (Some((agent_id, session_id)), Some(run)) = (kill_on_disconnect, run) {
                let kill = Request::ProcessKill(allox_protocol::ProcessKill {
                    agent_id,
                    session_id,
                    run_id: Some(run.clone()),
                    signal: None,
                });
                tracing::info!(peer = %self.peer, %run, "the run's client went away: killing it as asked");
                let _ = self.sup.handle_async(&self.peer, id, &kill, None).await;
            }
            return;
        };
        // Events come before the answer; the run's readers are stopped when
        // it ends, but never wait on them for long: 5 s with nothing
        // queued for the client. While events wait for a client that does
        // not read (a stopped `alloxctl exec`), the answer waits behind
        // them (it went out ahead of the run's last output).
        let mut forward = forward;
        let mut idle = Duration::ZERO;
        const STEP: Duration = Duration::from_millis(100);
        loop {
            if tokio::time::timeout(STEP, &mut forward).await.is_ok() {
                break;
            }
            if self.outbox.queued() > 0 {
                idle = Duration::ZERO;
            } else {
                idle += STEP;
                if idle >= Duration::from_secs(5) {
                    forward.abort();
                    break;
                }
            }
        }
        let _ = self.answer(id, out).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_frame_has_one_deadline_however_its_bytes_trickle() {
        let limits = Limits {
            stall: Duration::from_secs(3),
            frame: Duration::from_secs(10),
            ..Limits::default()
        };
        let mut clock = FrameClock { deadline: None };
        // Idle between frames: no limit on a greeted socket.
        assert_eq!(clock.next_wait(&limits, false, false), None);
        assert_eq!(clock.next_wait(&limits, false, true), Some(limits.hello));
        // A byte every 2 s keeps each read within the stall limit, but the
        // frame's own deadline shrinks the allowed wait to nothing.
        clock.after_read(&limits, true, false);
        for _ in 0..4 {
            tokio::time::advance(Duration::from_secs(2)).await;
            clock.after_read(&limits, true, false);
        }
        assert_eq!(
            clock.next_wait(&limits, true, false),
            Some(Duration::from_secs(2))
        );
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(clock.next_wait(&limits, true, false), Some(Duration::ZERO));
        // A completed frame gives the next one its own full deadline.
        clock.after_read(&limits, true, true);
        assert_eq!(clock.next_wait(&limits, true, false), Some(limits.stall));
        clock.after_read(&limits, false, true);
        assert_eq!(clock.deadline, None);
    }
}
