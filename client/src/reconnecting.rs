//! A lazily (re)connected client: connects on first use, and after a broken
//! or timed-out connection connects again on the next call.

use crate::client::{Answer, Caller, Client, ClientError};
use allox_protocol::{Event, Request};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The daemon behind a socket path, connected when first needed.
#[derive(Debug)]
pub struct ReconnectingClient {
    socket: PathBuf,
    client: Option<Client>,
    timeout: Option<Duration>,
}

impl ReconnectingClient {
    /// Does not connect yet.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        ReconnectingClient::with_timeout(socket, None)
    }

    /// Each wait for the daemon bounded by `timeout`: a call that runs out
    /// fails with [`ClientError::TimedOut`], is not made again, and its
    /// connection is dropped (the next call makes a new one).
    pub fn with_timeout(socket: impl Into<PathBuf>, timeout: Option<Duration>) -> Self {
        ReconnectingClient {
            socket: socket.into(),
            client: None,
            timeout,
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Calls with `fd` passed alongside the request ([`Client::call_with_fd`]),
    /// over the current connection or a new one; a call on an old
    /// connection that could not be sent is made once more on a fresh one.
    pub fn call_with_fd(
        &mut self,
        request: Request,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<Answer, ClientError> {
        let reused = self.client.is_some();
        let retry = request.clone();
        match self.client()?.call_with_fd(request, fd) {
            Ok(a) => Ok(a),
            Err(err) => {
                self.client = None;
                if reused && matches!(err, ClientError::Write(_)) {
                    let answer = self.client()?.call_with_fd(retry, fd);
                    if answer.is_err() {
                        self.client = None;
                    }
                    answer
                } else {
                    Err(err)
                }
            }
        }
    }

    fn client(&mut self) -> Result<&mut Client, ClientError> {
        if self.client.is_none() {
            // The Hello goes out with the first request.
            self.client = Some(Client::connect_pipelined(&self.socket, self.timeout)?);
        }
        Ok(self.client.as_mut().expect("connected just above"))
    }
}

impl Caller for ReconnectingClient {
    /// Calls over the current connection, making one if there is none.
    ///
    /// A connection that fails is dropped. If it was an old one (the daemon
    /// may have restarted since), the call is made once more on a fresh
    /// connection, but only when that cannot apply a change twice: the
    /// request was never sent, or it changes nothing.
    fn call(&mut self, request: Request) -> Result<Answer, ClientError> {
        self.call_with_events(request, &mut |_| {})
    }

    /// As [`ReconnectingClient::call`]; a call made again on a fresh connection passes
    /// its events too.
    fn call_with_events(
        &mut self,
        request: Request,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Answer, ClientError> {
        let reused = self.client.is_some();
        let retry = request.clone();
        match self.client()?.call_with_events(request, &mut *on_event) {
            Ok(answer) => Ok(answer),
            Err(err) => {
                self.client = None;
                let unsent = matches!(err, ClientError::Write(_));
                let harmless = !retry.is_mutating()
                    && matches!(err, ClientError::Closed | ClientError::Read(_));
                if reused && (unsent || harmless) {
                    let answer = self.client()?.call_with_events(retry, on_event);
                    if answer.is_err() {
                        self.client = None;
                    }
                    answer
                } else {
                    Err(err)
                }
            }
        }
    }

    /// Over the current connection (made if there is none). A connection
    /// that fails is dropped, and the requests are not made again: some
    /// of them may have been done.
    fn pipeline(
        &mut self,
        window: usize,
        next: &mut dyn FnMut() -> Option<Request>,
        done: &mut dyn FnMut(Answer) -> bool,
    ) -> Result<(), ClientError> {
        let out = self.client()?.pipeline(window, next, done);
        if out.is_err() {
            self.client = None;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::{
        decode, encode, AgentCreate, ClientFrame, ErrorCode, FrameReader, Hello, Outcome, Ping,
        Pong, Response, ResponseEnvelope, ServerFrame, PROTOCOL_VERSION,
    };
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::thread;

    /// Serves each connection: welcome, then answers `answers` requests and
    /// hangs up.
    fn serve_connection(mut s: UnixStream, answers: usize) {
        let mut reader = FrameReader::new();
        let mut buf = [0u8; 4096];
        let mut seen = 0;
        loop {
            while let Some(f) = reader.next_frame() {
                match decode::<ClientFrame>(&f.unwrap()).unwrap() {
                    ClientFrame::Hello(h) => {
                        let w = ServerFrame::Welcome(Hello {
                            version: PROTOCOL_VERSION,
                            build: "fake".into(),
                            conversation: h.conversation,
                        });
                        s.write_all(&encode(&w).unwrap()).unwrap();
                    }
                    ClientFrame::Request(r) => {
                        if seen == answers {
                            return;
                        }
                        seen += 1;
                        let resp = ServerFrame::Response(ResponseEnvelope {
                            conversation: r.conversation,
                            request_id: r.request_id,
                            outcome: Outcome::Ok(Response::Pong(Pong {
                                version: 1,
                                build: "fake".into(),
                            })),
                        });
                        s.write_all(&encode(&resp).unwrap()).unwrap();
                    }
                }
            }
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => reader.push(&buf[..n]),
            }
        }
    }

    #[test]
    fn unreachable_daemon_is_unavailable_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let mut d = ReconnectingClient::new(&sock);
        let err = d.call(Request::Ping(Ping {})).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable);
        assert!(err.to_body().message.contains(&sock.display().to_string()));
    }

    #[test]
    fn reconnects_for_reads_but_not_for_changes() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        // Each connection answers one request, then drops the next one.
        let t = thread::spawn(move || {
            for s in listener.incoming().take(3) {
                serve_connection(s.unwrap(), 1);
            }
        });
        let mut d = ReconnectingClient::new(&sock);
        assert!(d.call(Request::Ping(Ping {})).unwrap().is_ok());
        // Dropped on the old connection, retried on a second one.
        assert!(d.call(Request::Ping(Ping {})).unwrap().is_ok());
        // A change dropped on the old connection is not retried...
        let create = Request::AgentCreate(AgentCreate::new("a"));
        let err = d.call(create.clone()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable);
        // ...but the next call connects again (third connection).
        assert!(d.call(create).unwrap().is_ok());
        drop(d);
        t.join().unwrap();
    }
}
