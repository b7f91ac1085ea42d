//! A blocking client for the control socket.
//!
//! One [`Client`] is one connection: it says `Hello`, then sends requests one
//! at a time and reads frames until the answer with the request's id comes.
//! Stream events for that request go to a callback ([`Client::call_with_events`]);
//! frames about other requests (left over from an earlier, abandoned call) are
//! skipped.

use allox_protocol::{
    codec::EncodeError, decode, encode, ClientFrame, DecodeError, ErrorBody, ErrorCode, Event,
    FrameError, FrameReader, Hello, Outcome, Request, RequestEnvelope, Response, ServerFrame,
};
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

/// What the server answered to one request: a response or a protocol error.
pub type Answer = Result<Response, ErrorBody>;

/// Anything that can carry a request to the daemon and bring back its answer.
///
/// [`Client`] is the real one; [`crate::reconnecting::ReconnectingClient`] connects lazily;
/// tests use fakes.
pub trait Caller {
    fn call(&mut self, request: Request) -> Result<Answer, ClientError>;

    /// Like [`Caller::call`], and passes the request's stream events to
    /// `on_event` as they come. A caller that cannot carry events (a fake)
    /// answers without any.
    fn call_with_events(
        &mut self,
        request: Request,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Answer, ClientError> {
        let _ = on_event;
        self.call(request)
    }

    /// Sends the requests `next` gives, with up to `window` of them
    /// unanswered at a time, and passes their answers to `done` in the
    /// order of the requests, until `next` has no more or `done` says
    /// stop (then what is still unanswered is awaited and dropped). A
    /// caller that cannot pipeline sends them one at a time.
    fn pipeline(
        &mut self,
        window: usize,
        next: &mut dyn FnMut() -> Option<Request>,
        done: &mut dyn FnMut(Answer) -> bool,
    ) -> Result<(), ClientError> {
        let _ = window;
        while let Some(r) = next() {
            if !done(self.call(r)?) {
                break;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("cannot connect to {} ({hint})", path.display())]
    Connect {
        path: PathBuf,
        hint: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("cannot send to the daemon")]
    Write(#[source] io::Error),
    #[error("cannot read from the daemon")]
    Read(#[source] io::Error),
    #[error("the daemon closed the connection")]
    Closed,
    #[error("the daemon did not answer within {} ms; the connection was dropped (the request may still complete: look before repeating it)", .0.as_millis())]
    TimedOut(Duration),
    #[error("cannot encode the request")]
    Encode(#[source] EncodeError),
    #[error("bad frame from the daemon")]
    BadFrame(#[source] FrameError),
    #[error("bad message from the daemon")]
    BadMessage(#[source] DecodeError),
    #[error("the daemon sent {0} where it should not")]
    Unexpected(&'static str),
    #[error("the daemon refused the handshake: {}", .0.message)]
    Refused(ErrorBody),
}

impl ClientError {
    /// The protocol error code this failure counts as.
    pub fn code(&self) -> ErrorCode {
        match self {
            ClientError::Connect { .. }
            | ClientError::Write(_)
            | ClientError::Read(_)
            | ClientError::Closed
            | ClientError::TimedOut(_) => ErrorCode::Unavailable,
            ClientError::Encode(_) => ErrorCode::InvalidRequest,
            ClientError::BadFrame(_) | ClientError::BadMessage(_) | ClientError::Unexpected(_) => {
                ErrorCode::Internal
            }
            ClientError::Refused(body) => body.code,
        }
    }

    /// The failure as a protocol error, its message being the whole chain.
    pub fn to_body(&self) -> ErrorBody {
        ErrorBody::new(self.code(), error_chain(self))
    }
}

pub use allox_protocol::error_chain;

/// The send buffer asked for on a connection to the daemon.
const SEND_BUFFER: usize = 4 << 20;

/// A connected socket whose reads and writes are bounded by `timeout`
/// (none: unbounded, as a new socket is).
fn connect_stream(path: &Path, timeout: Option<Duration>) -> Result<UnixStream, ClientError> {
    let connect_err = |source: io::Error| ClientError::Connect {
        path: path.to_owned(),
        hint: connect_hint(&source),
        source,
    };
    let stream = UnixStream::connect(path).map_err(connect_err)?;
    // Room for a few whole chunks of a file in flight: fewer switches
    // between alloxctl and the daemon per MiB sent (beyond
    // `net.core.wmem_max` only as root; the default otherwise).
    if rustix::net::sockopt::set_socket_send_buffer_size_force(&stream, SEND_BUFFER).is_err() {
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(&stream, SEND_BUFFER);
    }
    // A new socket's reads and writes are unbounded already.
    if timeout.is_some() {
        stream.set_read_timeout(timeout).map_err(connect_err)?;
        stream.set_write_timeout(timeout).map_err(connect_err)?;
    }
    Ok(stream)
}

/// Says what a failed `connect` most likely means.
pub fn connect_hint(err: &io::Error) -> &'static str {
    match err.kind() {
        io::ErrorKind::NotFound => "no socket there: is the daemon running?",
        io::ErrorKind::ConnectionRefused => "nothing listens there: the daemon is not running",
        io::ErrorKind::PermissionDenied => "permission denied: try as root or fix the socket mode",
        _ => "is the daemon running?",
    }
}

/// One handshaken connection to the daemon.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    reader: FrameReader,
    next_id: u64,
    conversation: u64,
    server: Hello,
    /// The bound on each read and write, if any.
    timeout: Option<Duration>,
    /// A Hello not yet sent: it goes out with the first request
    /// ([`Client::connect_pipelined`]).
    unsent_hello: Vec<u8>,
    /// Whether the server's Welcome has come.
    welcomed: bool,
    /// Answers for this connection's [`Sender`]s, once one is made.
    replies: Option<Arc<Replies>>,
    /// Where frames are read into (made at the first read; only what a
    /// read fills is touched).
    read_buf: Vec<u8>,
    /// What to do once a call has waited so long ([`Client::when_waiting`]).
    when_waiting: Option<WhenWaiting>,
    /// The socket's path as it was given, when connected by path.
    socket: Option<std::path::PathBuf>,
}

/// Bytes asked for by each read of the socket.
const READ_CHUNK: usize = 64 * 1024;

/// Something to do once, when a call has waited until `at` for the daemon.
struct WhenWaiting {
    at: Instant,
    then: Box<dyn FnOnce() + Send>,
}

impl std::fmt::Debug for WhenWaiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhenWaiting").field("at", &self.at).finish()
    }
}

/// A frame of a [`Client`]'s conversation ([`Client::next_frame`]).
enum Incoming {
    /// The server's Welcome to this client's Hello (now in `server`).
    Welcome,
    /// The answer to the request with this id (0: to whichever is open,
    /// when the server could not read a request or restarted).
    Response(u64, Answer),
    /// A stream event of the request with this id.
    Event(u64, Event),
}

/// Sends requests on a [`Client`]'s connection from other threads, in
/// its conversation, while the client waits on a long request (its reads
/// pass their answers back): for a transport that takes one connection at
/// a time (the VM's control port), a terminal's keys and size changes.
#[derive(Clone)]
pub struct Sender {
    stream: Arc<Mutex<UnixStream>>,
    conversation: u64,
    next_id: Arc<std::sync::atomic::AtomicU64>,
    replies: Arc<Replies>,
}

/// Answers to a [`Sender`]'s requests, by id (`None` until it comes).
#[derive(Default, Debug)]
struct Replies {
    waiting: Mutex<std::collections::HashMap<u64, Option<Answer>>>,
    came: std::sync::Condvar,
}

impl Replies {
    /// Keeps the answer if it is one a sender waits for.
    fn offer(&self, id: u64, answer: Answer) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = w.get_mut(&id) {
            *slot = Some(answer);
            self.came.notify_all();
        }
    }
}

impl Sender {
    /// How long an answer may take.
    const WAIT: Duration = Duration::from_secs(30);

    /// Sends `request` and waits for its answer, which the client reads
    /// while it waits on its own request.
    pub fn call(&self, request: Request) -> Result<Answer, ClientError> {
        let request_id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let bytes = encode(&ClientFrame::Request(RequestEnvelope {
            conversation: self.conversation,
            request_id,
            request,
        }))
        .map_err(ClientError::Encode)?;
        let r = &self.replies;
        r.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(request_id, None);
        let sent = self
            .stream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write_all(&bytes);
        let mut w = r.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = sent {
            w.remove(&request_id);
            return Err(ClientError::Write(e));
        }
        let deadline = std::time::Instant::now() + Self::WAIT;
        loop {
            if let Some(Some(_)) = w.get(&request_id) {
                return w.remove(&request_id).flatten().ok_or(ClientError::Closed);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                w.remove(&request_id);
                return Err(ClientError::TimedOut(Self::WAIT));
            }
            w = r
                .came
                .wait_timeout(w, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// A response's outcome as an answer.
pub fn answer_of(outcome: Outcome) -> Answer {
    match outcome {
        Outcome::Ok(v) => Ok(v),
        Outcome::Err(e) => Err(e),
    }
}

/// Two random words from the kernel (`getrandom`, as `/dev/urandom`
/// gives them); the time and the process id if it cannot give them.
pub fn random_words() -> [u64; 2] {
    let mut b = [0u8; 16];
    let read = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::INSECURE);
    if !matches!(read, Ok(16)) {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let x = t ^ (u64::from(std::process::id()) << 32);
        b[..8].copy_from_slice(&x.to_le_bytes());
        b[8..].copy_from_slice(
            &x.rotate_left(29)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .to_le_bytes(),
        );
    }
    let w = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
    // 0 is the conversation of notices to whoever is there.
    [w(0).max(1), w(8)]
}

impl Client {
    /// Connects to the socket at `path` and does the handshake.
    pub fn connect(path: impl AsRef<Path>) -> Result<Client, ClientError> {
        Client::connect_timeout(path, None)
    }

    /// As [`Client::connect`], every wait for the daemon (the handshake
    /// too) bounded by `timeout`; one that runs out fails the call with
    /// [`ClientError::TimedOut`].
    pub fn connect_timeout(
        path: impl AsRef<Path>,
        timeout: Option<Duration>,
    ) -> Result<Client, ClientError> {
        let mut client = Client::handshake(connect_stream(path.as_ref(), timeout)?)?;
        client.socket = Some(path.as_ref().to_path_buf());
        Ok(client)
    }

    /// As [`Client::connect_timeout`], without waiting for the Welcome:
    /// the Hello goes out with the first request, in one write, and the
    /// Welcome is read before its answer. Saves a round trip to the daemon
    /// for a command that makes one call; the frames on the wire are those
    /// of [`Client::connect`], in the same order.
    pub fn connect_pipelined(
        path: impl AsRef<Path>,
        timeout: Option<Duration>,
    ) -> Result<Client, ClientError> {
        let stream = connect_stream(path.as_ref(), timeout)?;
        let (mut client, hello) = Client::unwelcomed(stream, timeout)?;
        client.unsent_hello = hello;
        client.socket = Some(path.as_ref().to_path_buf());
        Ok(client)
    }

    /// A client whose Hello (returned, to be sent) has no answer yet.
    fn unwelcomed(
        stream: UnixStream,
        timeout: Option<Duration>,
    ) -> Result<(Client, Vec<u8>), ClientError> {
        // A leading zero ends whatever torn frame a previous writer left on a
        // shared transport (the QEMU chardev); the server skips empty frames.
        let mut bytes = vec![0];
        let [conversation, first_id] = random_words();
        bytes.extend(
            encode(&ClientFrame::Hello(Hello::new(conversation))).map_err(ClientError::Encode)?,
        );
        let client = Client {
            stream,
            reader: FrameReader::new(),
            // Random, and far from wrapping: ids of two hosts in turn on one
            // serial port do not meet.
            next_id: (first_id >> 2) | 1,
            conversation,
            server: Hello {
                version: 0,
                build: String::new(),
                conversation: 0,
            },
            timeout,
            unsent_hello: Vec::new(),
            welcomed: false,
            replies: None,
            read_buf: Vec::new(),
            when_waiting: None,
            socket: None,
        };
        Ok((client, bytes))
    }

    /// Another handle on this connection's socket: shutting it down (from
    /// any thread) ends a call waiting on the daemon with an error, and
    /// the daemon sees the connection close.
    pub fn closer(&self) -> io::Result<UnixStream> {
        self.stream.try_clone()
    }

    /// Does the handshake over an already connected stream.
    pub fn handshake(stream: UnixStream) -> Result<Client, ClientError> {
        let timeout = stream.read_timeout().ok().flatten();
        let (mut client, bytes) = Client::unwelcomed(stream, timeout)?;
        let sent = client.stream.write_all(&bytes);
        loop {
            match client.next_frame() {
                Ok(Incoming::Welcome) => return Ok(client),
                Ok(_) => continue,
                Err(ClientError::Refused(body)) => return Err(ClientError::Refused(body)),
                // A server that refuses a peer may close before reading
                // its Hello: the refusal is still there to read.
                Err(e) => return Err(sent.map_or_else(ClientError::Write, |()| e)),
            }
        }
    }

    /// A [`Sender`] on this connection (once it is welcomed: a request
    /// sent first makes sure of that).
    pub fn sender(&mut self) -> Result<Sender, ClientError> {
        let stream = self.stream.try_clone().map_err(ClientError::Write)?;
        let replies = self.replies.get_or_insert_with(Default::default).clone();
        Ok(Sender {
            stream: Arc::new(Mutex::new(stream)),
            conversation: self.conversation,
            // Far from the client's own ids, which go up one at a time.
            next_id: Arc::new(std::sync::atomic::AtomicU64::new(
                self.next_id.wrapping_add(1 << 40),
            )),
            replies,
        })
    }

    /// Runs `then` once, on this thread, the first time a read for a call
    /// would wait past `after` from now (a call whose answer is in by then
    /// never runs it): what only a long call needs (`alloxctl exec`'s
    /// signal thread) is not made for a short one.
    pub fn when_waiting(&mut self, after: Duration, then: impl FnOnce() + Send + 'static) {
        self.when_waiting = Some(WhenWaiting {
            at: Instant::now() + after,
            then: Box::new(then),
        });
    }

    /// This connection's conversation number (see [`Hello`]).
    pub fn conversation(&self) -> u64 {
        self.conversation
    }

    /// Sets the id of the next request (tests of id collisions).
    pub fn set_next_request_id(&mut self, id: u64) {
        self.next_id = id;
    }

    /// The path of the socket this connection was made to, as it was
    /// given (`None` for a stream handed to [`Client::handshake`]).
    pub fn socket_path(&self) -> Option<&Path> {
        self.socket.as_deref()
    }

    /// What the server said about itself in its `Welcome` (empty until it
    /// came, for a [`Client::connect_pipelined`] one).
    pub fn server(&self) -> &Hello {
        &self.server
    }

    /// Bounds each wait for the daemon; `None` waits for ever (the default).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.stream.set_read_timeout(timeout)?;
        self.stream.set_write_timeout(timeout)?;
        self.timeout = timeout;
        Ok(())
    }

    /// A read or write error as a client error: a timeout is
    /// [`ClientError::TimedOut`].
    fn io_error(&self, e: io::Error, other: fn(io::Error) -> ClientError) -> ClientError {
        match (self.timeout, e.kind()) {
            (Some(t), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                ClientError::TimedOut(t)
            }
            _ => other(e),
        }
    }

    /// Sends one request and waits for its answer.
    pub fn call(&mut self, request: Request) -> Result<Answer, ClientError> {
        self.call_with_events(request, |_| {})
    }

    /// Sends one request, passes its stream events to `on_event` as they
    /// come, and returns its answer.
    pub fn call_with_events(
        &mut self,
        request: Request,
        on_event: impl FnMut(Event),
    ) -> Result<Answer, ClientError> {
        self.call_passing(request, None, on_event)
    }

    /// Sends one request with `fd` passed alongside it (`SCM_RIGHTS`:
    /// `fs.upload_local`, `fs.download_local`) and waits for its answer.
    /// Over a connection that does not carry descriptors (the VM's control
    /// port) the daemon answers `unsupported`.
    pub fn call_with_fd(
        &mut self,
        request: Request,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<Answer, ClientError> {
        self.call_passing(request, Some(fd), |_| {})
    }

    fn call_passing(
        &mut self,
        request: Request,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
        mut on_event: impl FnMut(Event),
    ) -> Result<Answer, ClientError> {
        let request_id = self.send_passing(request, fd)?;
        loop {
            match self.next_frame()? {
                // Id 0: the server could not read a request, or restarted
                // (conversation 0); only ours is open.
                Incoming::Response(id, answer) if id == request_id || id == 0 => {
                    return Ok(answer);
                }
                Incoming::Event(id, event) if id == request_id => on_event(event),
                // A sender's answer goes to it.
                Incoming::Response(id, answer) => {
                    if let Some(replies) = &self.replies {
                        replies.offer(id, answer);
                    }
                }
                Incoming::Event(..) | Incoming::Welcome => {}
            }
        }
    }

    /// [`Caller::pipeline`] over this connection: a sliding window, each
    /// answer making room for the next request.
    pub fn pipeline(
        &mut self,
        window: usize,
        next: &mut dyn FnMut() -> Option<Request>,
        done: &mut dyn FnMut(Answer) -> bool,
    ) -> Result<(), ClientError> {
        if !self.welcomed {
            // The Hello's answer first, as a lone call waits for it.
            let Some(first) = next() else { return Ok(()) };
            if !done(self.call(first)?) {
                return Ok(());
            }
        }
        let window = window.max(1);
        // Ids sent and not yet passed on, in order; answers that came
        // before their turn.
        let mut waiting: std::collections::VecDeque<u64> = Default::default();
        let mut early: std::collections::HashMap<u64, Answer> = Default::default();
        let mut more = true;
        let mut stopped = false;
        loop {
            while more && !stopped && waiting.len() < window {
                let Some(request) = next() else {
                    more = false;
                    break;
                };
                let request_id = self.send(request)?;
                waiting.push_back(request_id);
            }
            let Some(&head) = waiting.front() else {
                return Ok(());
            };
            if let Some(a) = early.remove(&head) {
                waiting.pop_front();
                if !stopped && !done(a) {
                    stopped = true;
                }
                continue;
            }
            match self.next_frame()? {
                // Nothing more will come for any of them.
                Incoming::Response(0, answer) => {
                    for id in &waiting {
                        early.entry(*id).or_insert_with(|| answer.clone());
                    }
                    more = false;
                }
                Incoming::Response(id, answer) if waiting.contains(&id) => {
                    early.insert(id, answer);
                }
                Incoming::Response(..) | Incoming::Event(..) | Incoming::Welcome => {}
            }
        }
    }

    /// Sends `request` under the next id, after the Hello if that has not
    /// gone yet, and returns the id.
    fn send(&mut self, request: Request) -> Result<u64, ClientError> {
        self.send_passing(request, None)
    }

    /// [`Client::send`], with `fd` passed with the request's first byte.
    fn send_passing(
        &mut self,
        request: Request,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<u64, ClientError> {
        let request_id = self.next_id;
        self.next_id += 1;
        let frame = encode(&ClientFrame::Request(RequestEnvelope {
            conversation: self.conversation,
            request_id,
            request,
        }))
        .map_err(ClientError::Encode)?;
        let mut out = std::mem::take(&mut self.unsent_hello);
        out.extend(frame);
        let sent = match fd {
            None => self.stream.write_all(&out),
            Some(fd) => send_with_fd(&self.stream, &out, fd),
        };
        if let Err(e) = sent {
            // A server that refuses a peer closes without reading its
            // Hello: the refusal is still there to read.
            if !self.welcomed {
                if let Some(body) = self.refusal() {
                    return Err(ClientError::Refused(body));
                }
            }
            return Err(self.io_error(e, ClientError::Write));
        }
        Ok(request_id)
    }

    /// The next frame of this conversation, for the handshake, a call and
    /// a pipeline alike (the one place that reads the server's frames).
    ///
    /// Before the Welcome, garbage is a torn frame from an earlier
    /// conversation on the same transport: skipped. Frames of another
    /// conversation (a host before us on a serial port) are never ours,
    /// whatever their id; a Welcome to another Hello (another host's, or
    /// an earlier one of ours) is nothing to do. A refusal is an error.
    fn next_frame(&mut self) -> Result<Incoming, ClientError> {
        loop {
            let payload = match self.next_payload() {
                Ok(p) => p,
                Err(ClientError::BadFrame(_)) if !self.welcomed => continue,
                Err(e) => return Err(e),
            };
            let frame = match decode::<ServerFrame>(&payload) {
                Ok(f) => f,
                Err(_) if !self.welcomed => continue,
                Err(e) => return Err(ClientError::BadMessage(e)),
            };
            match frame {
                ServerFrame::Welcome(hello)
                    if !self.welcomed && hello.conversation == self.conversation =>
                {
                    self.server = hello;
                    self.welcomed = true;
                    return Ok(Incoming::Welcome);
                }
                ServerFrame::Welcome(_) => {}
                ServerFrame::Response(r)
                    if r.conversation != self.conversation && r.conversation != 0 => {}
                // A restarted supervisor's notice (conversation 0) that came
                // before our Welcome was for a host its predecessor served
                // (on a serial port it waits for whoever comes): not an
                // answer to a request of ours, which the new one answers.
                ServerFrame::Response(r) if r.conversation == 0 && !self.welcomed => {}
                ServerFrame::Event(e) if e.conversation != self.conversation => {}
                ServerFrame::Response(r) => {
                    return Ok(Incoming::Response(r.request_id, answer_of(r.outcome)))
                }
                ServerFrame::Event(e) => return Ok(Incoming::Event(e.request_id, e.event)),
                ServerFrame::Refused(body) => return Err(ClientError::Refused(body)),
            }
        }
    }

    /// A refusal the server sent before closing, if it sent one.
    fn refusal(&mut self) -> Option<allox_protocol::ErrorBody> {
        loop {
            match self.next_payload() {
                Ok(p) => {
                    if let Ok(ServerFrame::Refused(body)) = decode::<ServerFrame>(&p) {
                        return Some(body);
                    }
                }
                Err(ClientError::BadFrame(_)) => continue,
                Err(_) => return None,
            }
        }
    }

    /// The next frame's payload, reading from the socket as needed.
    fn next_payload(&mut self) -> Result<Vec<u8>, ClientError> {
        loop {
            if let Some(frame) = self.reader.next_frame() {
                return frame.map_err(ClientError::BadFrame);
            }
            self.before_waiting();
            self.read_buf.clear();
            self.read_buf.reserve(READ_CHUNK);
            match rustix::io::read(
                &self.stream,
                rustix::buffer::spare_capacity(&mut self.read_buf),
            ) {
                Ok(0) => return Err(ClientError::Closed),
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(self.io_error(e.into(), ClientError::Read)),
            };
            self.reader.push(&self.read_buf);
        }
    }

    /// Runs the [`Client::when_waiting`] hook if its time has come or
    /// comes before the socket has something to read.
    fn before_waiting(&mut self) {
        let Some(hook) = &self.when_waiting else {
            return;
        };
        let at = hook.at;
        loop {
            let left = at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let mut fds = [rustix::event::PollFd::new(
                &self.stream,
                rustix::event::PollFlags::IN,
            )];
            let timeout = rustix::event::Timespec::try_from(left).ok();
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                Ok(0) => break,
                Ok(_) => return,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => break,
            }
        }
        if let Some(hook) = self.when_waiting.take() {
            (hook.then)();
        }
    }
}

impl Caller for Client {
    fn call(&mut self, request: Request) -> Result<Answer, ClientError> {
        Client::call(self, request)
    }

    fn call_with_events(
        &mut self,
        request: Request,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Answer, ClientError> {
        Client::call_with_events(self, request, on_event)
    }

    fn pipeline(
        &mut self,
        window: usize,
        next: &mut dyn FnMut() -> Option<Request>,
        done: &mut dyn FnMut(Answer) -> bool,
    ) -> Result<(), ClientError> {
        Client::pipeline(self, window, next, done)
    }
}

/// Writes `bytes` with `fd` passed alongside the first of them.
fn send_with_fd(
    stream: &UnixStream,
    bytes: &[u8],
    fd: std::os::fd::BorrowedFd<'_>,
) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("no room for the descriptor"));
    }
    let n = loop {
        match rustix::net::sendmsg(
            stream,
            &[io::IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    };
    let mut s = stream;
    s.write_all(&bytes[n..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::{
        AgentDelete, Deleted, EventEnvelope, Ping, Pong, ResponseEnvelope, PROTOCOL_VERSION,
    };
    use std::io::Read;
    use std::thread;

    /// Reads client frames from one end of a socket pair.
    struct FakeServer {
        stream: UnixStream,
        reader: FrameReader,
        /// The conversation of the client's Hello.
        conv: u64,
    }

    impl FakeServer {
        fn recv(&mut self) -> ClientFrame {
            let mut buf = [0u8; 4096];
            loop {
                if let Some(f) = self.reader.next_frame() {
                    let frame: ClientFrame = decode(&f.unwrap()).unwrap();
                    match &frame {
                        ClientFrame::Hello(h) => self.conv = h.conversation,
                        ClientFrame::Request(r) => assert_eq!(r.conversation, self.conv),
                    }
                    return frame;
                }
                let n = self.stream.read(&mut buf).unwrap();
                assert!(n > 0, "client hung up");
                self.reader.push(&buf[..n]);
            }
        }

        fn send(&mut self, frame: &ServerFrame) {
            self.stream.write_all(&encode(frame).unwrap()).unwrap();
        }

        fn welcome(&mut self) {
            let w = ServerFrame::Welcome(Hello {
                version: PROTOCOL_VERSION,
                build: "fake".into(),
                conversation: self.conv,
            });
            self.send(&w);
        }

        fn respond(&mut self, request_id: u64, outcome: Outcome) {
            let conversation = self.conv;
            self.send(&ServerFrame::Response(ResponseEnvelope {
                conversation,
                request_id,
                outcome,
            }));
        }

        fn event(&mut self, request_id: u64, event: Event) {
            let conversation = self.conv;
            self.send(&ServerFrame::Event(EventEnvelope {
                conversation,
                request_id,
                event,
            }));
        }
    }

    fn pair(
        script: impl FnOnce(FakeServer) + Send + 'static,
    ) -> (UnixStream, thread::JoinHandle<()>) {
        let (a, b) = UnixStream::pair().unwrap();
        let t = thread::spawn(move || {
            script(FakeServer {
                stream: b,
                reader: FrameReader::new(),
                conv: 0,
            })
        });
        (a, t)
    }

    /// A Pong for request `id`.
    fn pong(s: &mut FakeServer, id: u64) {
        s.respond(
            id,
            Outcome::Ok(Response::Pong(Pong {
                version: 1,
                build: "fake".into(),
            })),
        );
    }

    /// `when_waiting`'s hook runs, on the caller's thread, only for a
    /// call still without its answer when the time is up: not for one
    /// answered sooner, and not again for the calls after it.
    #[test]
    fn the_waiting_hook_runs_once_and_only_for_a_call_still_waiting() {
        use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
        let (answer_now, answer_later) = (mpsc_pair(), mpsc_pair());
        let (go_first, go_second) = (answer_now.0, answer_later.0);
        let (wait_first, wait_second) = (answer_now.1, answer_later.1);
        let (stream, t) = pair(move |mut s| {
            assert!(matches!(s.recv(), ClientFrame::Hello(_)));
            s.welcome();
            let ClientFrame::Request(r) = s.recv() else {
                panic!("expected a request")
            };
            // Answered at once: the client's hook time (10 s) is far off.
            pong(&mut s, r.request_id);
            wait_first.recv().unwrap();
            let ClientFrame::Request(r) = s.recv() else {
                panic!("expected a request")
            };
            // Answered once the hook has run (or after 20 s without it,
            // for the client to fail its check rather than wait for ever).
            let _ = wait_second.recv_timeout(Duration::from_secs(20));
            pong(&mut s, r.request_id);
            let ClientFrame::Request(r) = s.recv() else {
                panic!("expected a request")
            };
            pong(&mut s, r.request_id);
        });
        let ran = Arc::new(AtomicU32::new(0));
        let mut c = Client::handshake(stream).unwrap();
        let r = ran.clone();
        c.when_waiting(Duration::from_secs(10), move || {
            r.fetch_add(1, SeqCst);
        });
        assert!(c.call(Request::Ping(Ping {})).unwrap().is_ok());
        assert_eq!(ran.load(SeqCst), 0, "an answer in time runs no hook");
        go_first.send(()).unwrap();
        // A call still waiting after 50 ms runs the hook, which lets the
        // server answer: without the hook the call would never end.
        let r = ran.clone();
        let caller = thread::current().id();
        c.when_waiting(Duration::from_millis(50), move || {
            assert_eq!(thread::current().id(), caller);
            r.fetch_add(1, SeqCst);
            let _ = go_second.send(());
        });
        assert!(c.call(Request::Ping(Ping {})).unwrap().is_ok());
        assert_eq!(ran.load(SeqCst), 1);
        assert!(c.call(Request::Ping(Ping {})).unwrap().is_ok());
        assert_eq!(ran.load(SeqCst), 1, "the hook runs once");
        t.join().unwrap();
    }

    fn mpsc_pair() -> (std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>) {
        std::sync::mpsc::channel()
    }

    #[test]
    fn a_pipelined_client_sends_hello_and_request_together() {
        let (stream, t) = pair(|mut s| {
            // Both frames are there before anything is answered.
            assert!(matches!(s.recv(), ClientFrame::Hello(_)));
            let ClientFrame::Request(r) = s.recv() else {
                panic!("expected a request")
            };
            s.stream.write_all(b"\x07garbage\x00").unwrap();
            // A restarted supervisor's notice, left on the port for a host
            // its predecessor served: not this call's answer.
            s.send(&ServerFrame::Response(ResponseEnvelope {
                conversation: 0,
                request_id: 0,
                outcome: Outcome::Err(ErrorBody::new(
                    allox_protocol::ErrorCode::Unavailable,
                    "the supervisor (re)started",
                )),
            }));
            s.welcome();
            s.respond(
                r.request_id,
                Outcome::Ok(Response::Pong(Pong {
                    version: 1,
                    build: "fake".into(),
                })),
            );
        });
        let (mut c, hello) = Client::unwelcomed(stream, None).unwrap();
        c.unsent_hello = hello;
        let answer = c.call(Request::Ping(Ping {})).unwrap();
        assert!(matches!(answer, Ok(Response::Pong(_))), "{answer:?}");
        assert_eq!(c.server().build, "fake");
        t.join().unwrap();
    }

    #[test]
    fn handshake_then_answers_matched_by_id() {
        let (stream, t) = pair(|mut s| {
            assert!(matches!(s.recv(), ClientFrame::Hello(h) if h.version == PROTOCOL_VERSION));
            s.stream.write_all(b"\x07garbage\x00").unwrap();
            // A Welcome to another host's Hello is not this client's.
            s.send(&ServerFrame::Welcome(Hello::new(s.conv ^ 1)));
            s.welcome();
            let ClientFrame::Request(r) = s.recv() else {
                panic!("expected a request")
            };
            let first = r.request_id;
            // A stale answer and an event for another request are skipped,
            // and so is anything of another conversation, even with the
            // same request id.
            s.respond(99, Outcome::Err(ErrorBody::invalid("stale")));
            let (conv, other) = (s.conv, s.conv ^ 1);
            s.conv = other;
            s.respond(first, Outcome::Err(ErrorBody::invalid("another host's")));
            s.event(
                first,
                Event::Progress {
                    message: "another host's".into(),
                },
            );
            s.conv = conv;
            s.event(
                first,
                Event::Progress {
                    message: "working".into(),
                },
            );
            s.respond(
                first,
                Outcome::Ok(Response::Pong(Pong {
                    version: 1,
                    build: "fake".into(),
                })),
            );
            let ClientFrame::Request(r) = s.recv() else {
                panic!("expected a request")
            };
            assert_eq!(r.request_id, first + 1);
            s.respond(
                r.request_id,
                Outcome::Err(ErrorBody::new(ErrorCode::NotFound, "no agent x")),
            );
        });
        let mut c = Client::handshake(stream).unwrap();
        assert_eq!(c.server().build, "fake");
        let mut events = Vec::new();
        let answer = c
            .call_with_events(Request::Ping(Ping {}), |e| events.push(e))
            .unwrap();
        assert!(matches!(answer, Ok(Response::Pong(_))), "{answer:?}");
        assert_eq!(events.len(), 1);
        let answer = c
            .call(Request::AgentDelete(AgentDelete {
                agent_id: "x".into(),
                force: false,
            }))
            .unwrap();
        assert_eq!(answer.unwrap_err().code, ErrorCode::NotFound);
        t.join().unwrap();
    }

    #[test]
    fn output_events_come_in_order_before_the_answer() {
        use allox_protocol::{OutputChunk, RunResult, RunStarted, StreamKind};
        let chunk = |stream, data: &[u8]| {
            Event::Output(OutputChunk {
                run_id: "r1".into(),
                stream,
                data: data.into(),
            })
        };
        let sent = vec![
            Event::Started(RunStarted {
                run_id: "r1".into(),
                pid: 9,
            }),
            chunk(StreamKind::Stdout, b"a"),
            chunk(StreamKind::Stderr, b"b"),
            chunk(StreamKind::Stdout, b"c"),
        ];
        let events = sent.clone();
        let (stream, t) = pair(move |mut s| {
            s.recv();
            s.welcome();
            let ClientFrame::Request(r) = s.recv() else {
                panic!("expected a request")
            };
            for event in events {
                s.event(r.request_id, event);
            }
            s.respond(
                r.request_id,
                Outcome::Ok(Response::Exited(RunResult {
                    run_id: "r1".into(),
                    exit_code: Some(0),
                    signal: None,
                    stdout: String::new(),
                    stderr: String::new(),
                    truncated: false,
                    timed_out: false,
                    output_dropped: false,
                    output_lossy: false,
                    usage: None,
                    oom_killed: None,
                    effects: None,
                })),
            );
        });
        let mut c = Client::handshake(stream).unwrap();
        let mut got = Vec::new();
        // Through the trait, as `alloxctl exec` calls it.
        let answer =
            Caller::call_with_events(&mut c, Request::Ping(Ping {}), &mut |e| got.push(e)).unwrap();
        assert!(matches!(answer, Ok(Response::Exited(_))), "{answer:?}");
        assert_eq!(got, sent);
        t.join().unwrap();
    }

    #[test]
    fn refusal_carries_the_error_body() {
        let (stream, t) = pair(|mut s| {
            s.recv();
            s.send(&ServerFrame::Refused(ErrorBody::new(
                ErrorCode::VersionMismatch,
                "server speaks 2",
            )));
        });
        let err = Client::handshake(stream).unwrap_err();
        assert_eq!(err.code(), ErrorCode::VersionMismatch);
        assert!(err.to_body().message.contains("server speaks 2"), "{err}");
        t.join().unwrap();
    }

    #[test]
    fn a_pipeline_passes_answers_on_in_the_order_of_its_requests() {
        let (stream, t) = pair(|mut s| {
            s.recv();
            s.welcome();
            let id = |s: &mut FakeServer| match s.recv() {
                ClientFrame::Request(r) => r.request_id,
                ClientFrame::Hello(_) => panic!("expected a request"),
            };
            let deleted = |what: &str| {
                Outcome::Ok(Response::Deleted(Deleted {
                    deleted: what.into(),
                }))
            };
            // A window of two: the third request comes once the first is
            // answered.
            let (a, b) = (id(&mut s), id(&mut s));
            // Out of order, with an event, a stale answer and another
            // conversation's answer between them.
            s.event(
                a,
                Event::Progress {
                    message: "working".into(),
                },
            );
            s.respond(b, deleted("b"));
            s.respond(99, deleted("stale"));
            let conv = s.conv;
            s.conv = conv ^ 1;
            s.respond(a, deleted("another host's"));
            s.conv = conv;
            s.respond(a, deleted("a"));
            let c = id(&mut s);
            s.respond(c, deleted("c"));
        });
        let mut c = Client::handshake(stream).unwrap();
        let mut requests = (0..3).map(|_| Request::Ping(Ping {}));
        let mut got = Vec::new();
        c.pipeline(2, &mut || requests.next(), &mut |a| {
            got.push(match a {
                Ok(Response::Deleted(d)) => d.deleted,
                other => panic!("{other:?}"),
            });
            true
        })
        .unwrap();
        assert_eq!(got, ["a", "b", "c"]);
        t.join().unwrap();
    }

    #[test]
    fn server_hanging_up_is_unavailable() {
        let (stream, t) = pair(|mut s| {
            s.recv();
            s.welcome();
            s.recv();
            s.respond(
                7,
                Outcome::Ok(Response::Deleted(Deleted {
                    deleted: "other".into(),
                })),
            );
        });
        let mut c = Client::handshake(stream).unwrap();
        let err = c.call(Request::Ping(Ping {})).unwrap_err();
        assert!(matches!(err, ClientError::Closed), "{err:?}");
        assert_eq!(err.code(), ErrorCode::Unavailable);
        t.join().unwrap();
    }

    #[test]
    fn connect_failure_names_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing.sock");
        let err = Client::connect(&path).unwrap_err();
        let text = error_chain(&err);
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("daemon"), "{text}");
        assert_eq!(err.code(), ErrorCode::Unavailable);
    }
}
