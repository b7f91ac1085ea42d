//! A blocking client for the control socket.
//!
//! One [`Client`] is one connection: it says `Hello`, then sends requests one
//! at a time and reads frames until the answer with the request's id comes.
//! Stream events for that request go to a callback ([`Client::call_with_events`]);
//! frames about other requests (left over from an earlier, abandoned call) are
//! skipped.

use allox_protocol::{
    build_identity, codec::EncodeError, decode, encode, ClientFrame, DecodeError, ErrorBody,
    ErrorCode, Event, FrameError, FrameReader, Hello, Outcome, Request, RequestEnvelope, Response,
    ServerFrame, PROTOCOL_VERSION,
};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// What the server answered to one request: a response or a protocol error.
pub type Answer = Result<Response, ErrorBody>;

/// Anything that can carry a request to the daemon and bring back its answer.
///
/// [`Client`] is the real one; [`crate::daemon::Daemon`] connects lazily;
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
            | ClientError::Closed => ErrorCode::Unavailable,
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

/// An error and its sources, joined with `": "`.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// Says what a failed `connect` most likely means.
fn connect_hint(err: &io::Error) -> &'static str {
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
    server: Hello,
}

impl Client {
    /// Connects to the socket at `path` and does the handshake.
    pub fn connect(path: impl AsRef<Path>) -> Result<Client, ClientError> {
        let path = path.as_ref();
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.to_owned(),
            hint: connect_hint(&source),
            source,
        })?;
        Client::handshake(stream)
    }

    /// Does the handshake over an already connected stream.
    pub fn handshake(mut stream: UnixStream) -> Result<Client, ClientError> {
        // A leading zero ends whatever torn frame a previous writer left on a
        // shared transport (the QEMU chardev); the server skips empty frames.
        let mut bytes = vec![0];
        bytes.extend(
            encode(&ClientFrame::Hello(Hello {
                version: PROTOCOL_VERSION,
                build: build_identity(),
            }))
            .map_err(ClientError::Encode)?,
        );
        stream.write_all(&bytes).map_err(ClientError::Write)?;
        let mut client = Client {
            stream,
            reader: FrameReader::new(),
            next_id: 1,
            server: Hello {
                version: 0,
                build: String::new(),
            },
        };
        loop {
            // Before the handshake, garbage is a torn frame from an earlier
            // conversation on the same transport: skip it.
            let payload = match client.next_payload() {
                Ok(p) => p,
                Err(ClientError::BadFrame(_)) => continue,
                Err(e) => return Err(e),
            };
            match decode::<ServerFrame>(&payload) {
                Ok(ServerFrame::Welcome(hello)) => {
                    client.server = hello;
                    return Ok(client);
                }
                Ok(ServerFrame::Refused(body)) => return Err(ClientError::Refused(body)),
                Ok(_) | Err(_) => continue,
            }
        }
    }

    /// What the server said about itself in its `Welcome`.
    pub fn server(&self) -> &Hello {
        &self.server
    }

    /// Bounds each wait for the daemon; `None` waits for ever (the default).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.stream.set_read_timeout(timeout)?;
        self.stream.set_write_timeout(timeout)
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
        mut on_event: impl FnMut(Event),
    ) -> Result<Answer, ClientError> {
        let request_id = self.next_id;
        self.next_id += 1;
        let frame = encode(&ClientFrame::Request(RequestEnvelope {
            request_id,
            request,
        }))
        .map_err(ClientError::Encode)?;
        self.stream.write_all(&frame).map_err(ClientError::Write)?;
        loop {
            let payload = self.next_payload()?;
            match decode::<ServerFrame>(&payload).map_err(ClientError::BadMessage)? {
                // Id 0: the server could not read a request; only ours is open.
                ServerFrame::Response(r) if r.request_id == request_id || r.request_id == 0 => {
                    return Ok(match r.outcome {
                        Outcome::Ok(v) => Ok(v),
                        Outcome::Err(e) => Err(e),
                    });
                }
                ServerFrame::Event(e) if e.request_id == request_id => on_event(e.event),
                ServerFrame::Response(_) | ServerFrame::Event(_) => {}
                // A late answer to an earlier Hello (a host on a serial
                // port that said Hello again): nothing to do.
                ServerFrame::Welcome(_) => {}
                ServerFrame::Refused(body) => return Err(ClientError::Refused(body)),
            }
        }
    }

    /// The next frame's payload, reading from the socket as needed.
    fn next_payload(&mut self) -> Result<Vec<u8>, ClientError> {
        let mut buf = [0u8; 64 * 1024];
        loop {
            if let Some(frame) = self.reader.next_frame() {
                return frame.map_err(ClientError::BadFrame);
            }
            let n = match self.stream.read(&mut buf) {
                Ok(0) => return Err(ClientError::Closed),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ClientError::Read(e)),
            };
            self.reader.push(&buf[..n]);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::{AgentRef, Deleted, EventEnvelope, Ping, Pong, ResponseEnvelope};
    use std::thread;

    /// Reads client frames from one end of a socket pair.
    struct FakeServer {
        stream: UnixStream,
        reader: FrameReader,
    }

    impl FakeServer {
        fn recv(&mut self) -> ClientFrame {
            let mut buf = [0u8; 4096];
            loop {
                if let Some(f) = self.reader.next_frame() {
                    return decode(&f.unwrap()).unwrap();
                }
                let n = self.stream.read(&mut buf).unwrap();
                assert!(n > 0, "client hung up");
                self.reader.push(&buf[..n]);
            }
        }

        fn send(&mut self, frame: &ServerFrame) {
            self.stream.write_all(&encode(frame).unwrap()).unwrap();
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
            })
        });
        (a, t)
    }

    fn welcome() -> ServerFrame {
        ServerFrame::Welcome(Hello {
            version: PROTOCOL_VERSION,
            build: "fake".into(),
        })
    }

    #[test]
    fn handshake_then_answers_matched_by_id() {
        let (stream, t) = pair(|mut s| {
            assert!(matches!(s.recv(), ClientFrame::Hello(h) if h.version == PROTOCOL_VERSION));
            s.stream.write_all(b"\x07garbage\x00").unwrap();
            s.send(&welcome());
            let ClientFrame::Request(r) = s.recv() else {
                panic!("expected a request")
            };
            assert_eq!(r.request_id, 1);
            // A stale answer and an event for another request are skipped.
            s.send(&ServerFrame::Response(ResponseEnvelope {
                request_id: 99,
                outcome: Outcome::Err(ErrorBody::invalid("stale")),
            }));
            s.send(&ServerFrame::Event(EventEnvelope {
                request_id: 1,
                event: Event::Progress {
                    message: "working".into(),
                },
            }));
            s.send(&ServerFrame::Response(ResponseEnvelope {
                request_id: 1,
                outcome: Outcome::Ok(Response::Pong(Pong {
                    version: 1,
                    build: "fake".into(),
                })),
            }));
            let ClientFrame::Request(r) = s.recv() else {
                panic!("expected a request")
            };
            assert_eq!(r.request_id, 2);
            s.send(&ServerFrame::Response(ResponseEnvelope {
                request_id: 2,
                outcome: Outcome::Err(ErrorBody::new(ErrorCode::NotFound, "no agent x")),
            }));
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
            .call(Request::AgentDelete(AgentRef {
                agent_id: "x".into(),
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
                data: data.to_vec(),
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
            s.send(&welcome());
            let ClientFrame::Request(r) = s.recv() else {
                panic!("expected a request")
            };
            for event in events {
                s.send(&ServerFrame::Event(EventEnvelope {
                    request_id: r.request_id,
                    event,
                }));
            }
            s.send(&ServerFrame::Response(ResponseEnvelope {
                request_id: r.request_id,
                outcome: Outcome::Ok(Response::Exited(RunResult {
                    run_id: "r1".into(),
                    exit_code: Some(0),
                    signal: None,
                    stdout: String::new(),
                    stderr: String::new(),
                    truncated: false,
                    timed_out: false,
                    output_dropped: false,
                })),
            }));
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
    fn server_hanging_up_is_unavailable() {
        let (stream, t) = pair(|mut s| {
            s.recv();
            s.send(&welcome());
            s.recv();
            s.send(&ServerFrame::Response(ResponseEnvelope {
                request_id: 7,
                outcome: Outcome::Ok(Response::Deleted(Deleted {
                    deleted: "other".into(),
                })),
            }));
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
