//! The gateway's calls to the daemon: a few connections, each carrying
//! many requests at once (the protocol matches answers to requests by id),
//! driven from the gateway's own tasks, so a plain request costs no hop to
//! another thread.
//!
//! A call goes on the open connection with the fewest calls waiting; a
//! new connection is made while every open one has [`BUSY`] waiting (the
//! daemon works on 64 requests of one connection at once, so a handful of
//! long waits never hold up a short call), up to [`MAX_CONNECTIONS`].
//! Each call waits at most the daemon timeout. A connection on which
//! nothing at all came back during a call's whole wait is taken for hung
//! and dropped, failing its calls (the next one connects anew); one that
//! breaks fails its calls, and a call that had not been sent, or that
//! changes nothing, is tried once more on a fresh connection.

use allox_client::client::{answer_of, connect_hint, random_words, Answer, ClientError};
use allox_protocol::{
    decode, encode, ClientFrame, FrameReader, Hello, Request, RequestEnvelope, ServerFrame,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::oneshot;

/// Calls waiting on one connection before another is opened.
pub const BUSY: usize = 16;
/// Connections to the daemon at most.
pub const MAX_CONNECTIONS: usize = 16;

type Reply = oneshot::Sender<Result<Answer, ClientError>>;

/// The daemon, as the gateway calls it.
pub struct Daemon {
    socket: PathBuf,
    timeout: Duration,
    conns: Mutex<Vec<Arc<Conn>>>,
    connecting: tokio::sync::Mutex<()>,
}

struct Conn {
    conversation: u64,
    next_id: AtomicU64,
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    /// The Hello, sent with the first request.
    hello: Mutex<Option<Vec<u8>>>,
    waiting: Mutex<HashMap<u64, Reply>>,
    /// Frames received so far (to tell a hung daemon from a slow call).
    received: AtomicU64,
    dead: AtomicBool,
    /// The task reading answers.
    reader: Mutex<Option<tokio::task::AbortHandle>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Conn {
    /// Fails every waiting call with what `why` makes.
    fn fail_all(&self, why: impl Fn() -> ClientError) {
        self.dead.store(true, Ordering::SeqCst);
        for (_, reply) in lock(&self.waiting).drain() {
            let _ = reply.send(Err(why()));
        }
    }

    fn load(&self) -> usize {
        lock(&self.waiting).len()
    }

    /// Reads answers until the connection ends.
    async fn read(self: Arc<Self>, mut rx: tokio::net::unix::OwnedReadHalf) {
        let mut reader = FrameReader::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            while let Some(frame) = reader.next_frame() {
                let Ok(payload) = frame else { continue };
                self.received.fetch_add(1, Ordering::SeqCst);
                match decode::<ServerFrame>(&payload) {
                    Ok(ServerFrame::Response(r))
                        if r.conversation == self.conversation || r.conversation == 0 =>
                    {
                        if r.request_id == 0 {
                            // The daemon could not read a request of ours:
                            // which one is unknown, so all of them.
                            let outcome = answer_of(r.outcome);
                            self.fail_all(|| match &outcome {
                                Err(body) => ClientError::Refused(body.clone()),
                                Ok(_) => ClientError::Unexpected("an answer to request 0"),
                            });
                            return;
                        }
                        if let Some(reply) = lock(&self.waiting).remove(&r.request_id) {
                            let _ = reply.send(Ok(answer_of(r.outcome)));
                        }
                    }
                    Ok(ServerFrame::Refused(body)) => {
                        self.fail_all(|| ClientError::Refused(body.clone()));
                        return;
                    }
                    // The Welcome, events (a plain call carries none out),
                    // frames of no conversation of ours.
                    Ok(_) => {}
                    Err(_) => {
                        self.fail_all(|| ClientError::Unexpected("a message it could not decode"));
                        return;
                    }
                }
            }
            match rx.read(&mut buf).await {
                Ok(0) => return self.fail_all(|| ClientError::Closed),
                Ok(n) => reader.push(&buf[..n]),
                Err(e) => {
                    let kind = e.kind();
                    return self.fail_all(|| ClientError::Read(kind.into()));
                }
            }
        }
    }
}

/// Whether a failed call may go again on a new connection.
fn retry(err: &ClientError, mutating: bool) -> bool {
    match err {
        ClientError::Write(_) => true,
        ClientError::Closed | ClientError::Read(_) => !mutating,
        _ => false,
    }
}

impl Daemon {
    pub fn new(socket: PathBuf, timeout: Duration) -> Daemon {
        Daemon {
            socket,
            timeout,
            conns: Mutex::new(Vec::new()),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    /// One request's answer.
    pub async fn call(&self, request: Request) -> Result<Answer, ClientError> {
        let mutating = request.is_mutating();
        let (conn, reused) = self.pick().await?;
        match self.call_on(&conn, request.clone()).await {
            Err(e) if reused && retry(&e, mutating) => {
                let (conn, _) = self.pick().await?;
                self.call_on(&conn, request).await
            }
            other => other,
        }
    }

    /// The least loaded live connection, or a new one (made by one call
    /// at a time, so a burst of first calls shares it).
    async fn pick(&self) -> Result<(Arc<Conn>, bool), ClientError> {
        if let Some(c) = self.ready() {
            return Ok((c, true));
        }
        let _one = self.connecting.lock().await;
        if let Some(c) = self.ready() {
            return Ok((c, true));
        }
        let conn = self.connect().await?;
        lock(&self.conns).push(Arc::clone(&conn));
        Ok((conn, false))
    }

    /// A live connection with room, or at the limit the least loaded.
    fn ready(&self) -> Option<Arc<Conn>> {
        let mut conns = lock(&self.conns);
        conns.retain(|c| !c.dead.load(Ordering::SeqCst));
        let best = conns.iter().min_by_key(|c| c.load()).cloned()?;
        (best.load() < BUSY || conns.len() >= MAX_CONNECTIONS).then_some(best)
    }

    async fn connect(&self) -> Result<Arc<Conn>, ClientError> {
        let connect_err = |source: std::io::Error| ClientError::Connect {
            path: self.socket.clone(),
            hint: connect_hint(&source),
            source,
        };
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(connect_err)?;
        let (rx, tx) = stream.into_split();
        let [conversation, first_id] = random_words();
        // A leading zero ends any torn frame before ours.
        let mut hello = vec![0];
        hello.extend(
            encode(&ClientFrame::Hello(Hello::new(conversation))).map_err(ClientError::Encode)?,
        );
        let conn = Arc::new(Conn {
            conversation,
            next_id: AtomicU64::new((first_id >> 2) | 1),
            writer: tokio::sync::Mutex::new(tx),
            hello: Mutex::new(Some(hello)),
            waiting: Mutex::new(HashMap::new()),
            received: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            reader: Mutex::new(None),
        });
        let reading = tokio::spawn(Arc::clone(&conn).read(rx));
        *lock(&conn.reader) = Some(reading.abort_handle());
        Ok(conn)
    }

    async fn call_on(&self, conn: &Arc<Conn>, request: Request) -> Result<Answer, ClientError> {
        let limit = self.limit_of(&request);
        let (request_id, mut rx) = self.send(conn, request).await?;
        let began = tokio::time::Instant::now();
        loop {
            // Looked at every `self.timeout`: a call longer than that (a
            // run waited for) is let go on while its connection lives.
            let step = match limit {
                Some(l) => l.saturating_sub(began.elapsed()).min(self.timeout),
                None => self.timeout,
            };
            let seen = conn.received.load(Ordering::SeqCst);
            match tokio::time::timeout(step, &mut rx).await {
                Ok(Ok(answer)) => return answer,
                Ok(Err(_)) => return Err(ClientError::Closed),
                Err(_) => {}
            }
            let over = limit.is_some_and(|l| began.elapsed() >= l);
            // Nothing at all came back meanwhile: hung, unless the daemon
            // answers a ping now (every call on the connection may be a
            // long wait: one of them timing out is no sign of a hang).
            if conn.received.load(Ordering::SeqCst) == seen && !self.answers_a_ping(conn).await {
                lock(&conn.waiting).remove(&request_id);
                conn.fail_all(|| ClientError::TimedOut(self.timeout));
                if let Some(reading) = lock(&conn.reader).take() {
                    reading.abort();
                }
                return Err(ClientError::TimedOut(self.timeout));
            }
            if over {
                lock(&conn.waiting).remove(&request_id);
                return Err(ClientError::TimedOut(limit.unwrap_or(self.timeout)));
            }
        }
    }

    /// How long a call may take: `--daemon-timeout-ms`, or for a call
    /// that waits for a run, the run's own limit and that again (`None`:
    /// as long as the run, while the daemon answers pings). A waited
    /// `process.start` or `process.wait` was cut at 30 s however long the
    /// run was let go, and the run went on with no id to wait on.
    fn limit_of(&self, request: &Request) -> Option<Duration> {
        let after = |ms: Option<u64>| ms.map(|ms| Duration::from_millis(ms) + self.timeout);
        match request {
            Request::ProcessStart(p) if p.wait => after(p.timeout_ms),
            Request::ProcessWait(w) => after(w.timeout_ms),
            _ => Some(self.timeout),
        }
    }

    /// Sends `request` on `conn`; its id and where its answer comes.
    async fn send(
        &self,
        conn: &Arc<Conn>,
        request: Request,
    ) -> Result<(u64, oneshot::Receiver<Result<Answer, ClientError>>), ClientError> {
        let request_id = conn.next_id.fetch_add(1, Ordering::SeqCst);
        let frame = encode(&ClientFrame::Request(RequestEnvelope {
            conversation: conn.conversation,
            request_id,
            request,
        }))
        .map_err(ClientError::Encode)?;
        let (tx, rx) = oneshot::channel();
        lock(&conn.waiting).insert(request_id, tx);
        if conn.dead.load(Ordering::SeqCst) {
            lock(&conn.waiting).remove(&request_id);
            return Err(ClientError::Write(std::io::ErrorKind::BrokenPipe.into()));
        }
        let mut w = conn.writer.lock().await;
        let hello = lock(&conn.hello).take();
        let out = match hello {
            Some(mut h) => {
                h.extend(frame);
                h
            }
            None => frame,
        };
        if let Err(e) = w.write_all(&out).await {
            lock(&conn.waiting).remove(&request_id);
            conn.fail_all(|| ClientError::Closed);
            return Err(ClientError::Write(e));
        }
        Ok((request_id, rx))
    }

    /// Whether the daemon answers a ping on `conn` within a few seconds.
    async fn answers_a_ping(&self, conn: &Arc<Conn>) -> bool {
        let Ok((id, rx)) = self
            .send(conn, Request::Ping(allox_protocol::Ping {}))
            .await
        else {
            return false;
        };
        let wait = self.timeout.min(Duration::from_secs(3));
        let answered = matches!(tokio::time::timeout(wait, rx).await, Ok(Ok(_)));
        lock(&conn.waiting).remove(&id);
        answered
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::{AgentDelete, ErrorCode, Outcome, Ping, Pong, Response, ResponseEnvelope};
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;
    use std::sync::atomic::AtomicUsize;

    /// A daemon that answers each connection's requests `hold` at a time,
    /// the last received first, with a Pong naming the request's id; after
    /// an `agent.delete` it answers nothing more on that connection (hung);
    /// `agent.list` it never answers (a long wait, the connection live);
    /// `process.wait` it answers after 800 ms. Counts its connections.
    fn fake(sock: &std::path::Path, hold: usize) -> Arc<AtomicUsize> {
        let listener = UnixListener::bind(sock).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&accepted);
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let mut s = s.unwrap();
                seen.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let mut r = FrameReader::new();
                    let mut buf = [0u8; 4096];
                    let mut held = Vec::new();
                    let mut hung = false;
                    loop {
                        while let Some(f) = r.next_frame() {
                            match decode::<ClientFrame>(&f.unwrap()).unwrap() {
                                ClientFrame::Hello(_) => {}
                                ClientFrame::Request(e) => match e.request {
                                    Request::AgentDelete(_) => hung = true,
                                    Request::AgentList(_) => {}
                                    Request::ProcessWait(_) => {
                                        let mut later = s.try_clone().unwrap();
                                        std::thread::spawn(move || {
                                            std::thread::sleep(Duration::from_millis(800));
                                            let answer = ServerFrame::Response(ResponseEnvelope {
                                                conversation: e.conversation,
                                                request_id: e.request_id,
                                                outcome: Outcome::Ok(Response::Pong(Pong {
                                                    version: 1,
                                                    build: "waited".into(),
                                                })),
                                            });
                                            let _ = later.write_all(&encode(&answer).unwrap());
                                        });
                                    }
                                    _ => held.push(e),
                                },
                            }
                        }
                        if hung {
                            held.clear();
                        }
                        if held.len() >= hold {
                            for e in held.drain(..).rev() {
                                let answer = ServerFrame::Response(ResponseEnvelope {
                                    conversation: e.conversation,
                                    request_id: e.request_id,
                                    outcome: Outcome::Ok(Response::Pong(Pong {
                                        version: 1,
                                        build: e.request_id.to_string(),
                                    })),
                                });
                                s.write_all(&encode(&answer).unwrap()).unwrap();
                            }
                        }
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => r.push(&buf[..n]),
                        }
                    }
                });
            }
        });
        accepted
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn answers_that_come_out_of_order_reach_their_own_calls() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let accepted = fake(&sock, 4);
        let d = Arc::new(Daemon::new(sock, Duration::from_secs(10)));
        rt().block_on(async {
            // Four at once on one connection, answered last first.
            let calls: Vec<_> = (0..4)
                .map(|_| {
                    let d = Arc::clone(&d);
                    tokio::spawn(async move { d.call(Request::Ping(Ping {})).await })
                })
                .collect();
            let mut ids = Vec::new();
            for c in calls {
                match c.await.unwrap().unwrap().unwrap() {
                    Response::Pong(p) => ids.push(p.build.parse::<u64>().unwrap()),
                    other => panic!("{other:?}"),
                }
            }
            ids.sort();
            ids.dedup();
            assert_eq!(ids.len(), 4, "two calls got one answer: {ids:?}");
        });
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_hung_connection_is_dropped_and_the_next_call_connects_anew() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let accepted = fake(&sock, 1);
        let d = Daemon::new(sock, Duration::from_millis(200));
        rt().block_on(async {
            for round in 1..=2 {
                let never = Request::AgentDelete(AgentDelete {
                    agent_id: "a".into(),
                    force: false,
                });
                let err = d.call(never).await.unwrap_err();
                assert!(matches!(err, ClientError::TimedOut(_)), "{err}");
                assert_eq!(err.code(), ErrorCode::Unavailable);
                assert_eq!(accepted.load(Ordering::SeqCst), round);
            }
            // A connection that answers is kept.
            d.call(Request::Ping(Ping {})).await.unwrap().unwrap();
            d.call(Request::Ping(Ping {})).await.unwrap().unwrap();
            assert_eq!(accepted.load(Ordering::SeqCst), 3);
        });
    }

    /// One call timing out on a connection whose other calls are long
    /// waits does not fail them: the daemon answers a ping, so the
    /// connection is live (the others failed at once, "did not answer
    /// within" the whole timeout, after a fraction of it).
    #[test]
    fn a_call_timing_out_does_not_fail_its_neighbours_on_a_live_connection() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let accepted = fake(&sock, 1);
        let d = Arc::new(Daemon::new(sock, Duration::from_millis(300)));
        rt().block_on(async {
            let long = || Request::AgentList(allox_protocol::AgentList {});
            let first = {
                let d = Arc::clone(&d);
                tokio::spawn(async move { d.call(long()).await })
            };
            tokio::time::sleep(Duration::from_millis(150)).await;
            let t0 = tokio::time::Instant::now();
            let second = d.call(long()).await.unwrap_err();
            assert!(matches!(second, ClientError::TimedOut(_)), "{second}");
            assert!(
                t0.elapsed() >= Duration::from_millis(290),
                "failed after {:?}, before its own timeout",
                t0.elapsed()
            );
            let first = first.await.unwrap().unwrap_err();
            assert!(matches!(first, ClientError::TimedOut(_)), "{first}");
            // The live connection is kept.
            d.call(Request::Ping(Ping {})).await.unwrap().unwrap();
        });
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    /// A call that waits for a run is let go as long as the run may be (it
    /// was cut at the daemon timeout whatever the run's own limit).
    #[test]
    fn a_wait_for_a_run_goes_past_the_daemon_timeout_to_its_own_limit() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        fake(&sock, 1);
        let d = Daemon::new(sock, Duration::from_millis(300));
        let wait = |timeout_ms| {
            Request::ProcessWait(allox_protocol::ProcessWait {
                agent_id: "a".into(),
                session_id: "s".into(),
                run_id: "r".into(),
                timeout_ms,
            })
        };
        rt().block_on(async {
            match d.call(wait(None)).await.unwrap().unwrap() {
                Response::Pong(p) => assert_eq!(p.build, "waited"),
                other => panic!("{other:?}"),
            }
            // Its own limit and the daemon timeout again: 100 + 300 ms.
            let e = d.call(wait(Some(100))).await.unwrap_err();
            assert!(matches!(e, ClientError::TimedOut(_)), "{e}");
        });
    }

    #[test]
    fn no_daemon_is_unavailable_naming_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let d = Daemon::new(sock.clone(), Duration::from_secs(1));
        let err = rt().block_on(d.call(Request::Ping(Ping {}))).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable);
        assert!(
            err.to_string().contains(&sock.display().to_string()),
            "{err}"
        );
    }
}
