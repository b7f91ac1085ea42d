//! `alloxctl gateway`: the JSON form over HTTP, `POST /v1/rpc`.
//!
//! The answer body is the same JSON as `alloxctl rpc` prints; the status is
//! 200 for a result and the error code's [`ErrorCode::http_status`]
//! otherwise (503 `unavailable` when the daemon cannot be reached). A few
//! worker threads serve requests, each with its own daemon connection, made
//! on first use and made again after it breaks.

use crate::client::Caller;
use crate::daemon::Daemon;
use crate::rpc::rpc_answer;
use allox_protocol::json::answer_to_json;
use allox_protocol::{ErrorBody, ErrorCode};
use serde_json::Value;
use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use thiserror::Error;
use tiny_http::{Header, Server};

/// The one path served.
pub const RPC_PATH: &str = "/v1/rpc";
/// Largest request body accepted.
pub const MAX_BODY: usize = 1 << 20;
/// Requests served at once.
pub const WORKERS: usize = 4;

#[derive(Debug, Error)]
pub enum GatewayError {
    #[error("cannot listen on {listen}")]
    Bind {
        listen: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Serves `listen` for ever, forwarding to the daemon at `socket`.
pub fn serve(listen: &str, socket: PathBuf) -> Result<(), GatewayError> {
    Gateway::bind(listen)?.run(socket, WORKERS);
    Ok(())
}

/// A bound listener, not yet serving.
pub struct Gateway {
    server: Arc<Server>,
}

impl Gateway {
    /// Binds `listen` (`host:port`; port 0 picks a free one).
    pub fn bind(listen: &str) -> Result<Gateway, GatewayError> {
        let server = Server::http(listen).map_err(|source| GatewayError::Bind {
            listen: listen.to_owned(),
            source,
        })?;
        Ok(Gateway {
            server: Arc::new(server),
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.server.server_addr().to_ip()
    }

    /// Serves with `workers` threads; never returns.
    pub fn run(self, socket: PathBuf, workers: usize) {
        let threads: Vec<_> = (0..workers.max(1))
            .map(|_| {
                let server = Arc::clone(&self.server);
                let socket = socket.clone();
                thread::spawn(move || worker(&server, Daemon::new(socket)))
            })
            .collect();
        for t in threads {
            // A worker only ends by panicking; the others go on serving.
            let _ = t.join();
        }
    }
}

fn worker(server: &Server, mut daemon: Daemon) {
    loop {
        match server.recv() {
            Ok(request) => serve_one(request, &mut daemon),
            Err(e) => eprintln!("alloxctl gateway: {e}"),
        }
    }
}

fn serve_one(mut request: tiny_http::Request, daemon: &mut impl Caller) {
    let early = route(request.method().as_str(), request.url()).or_else(|| {
        request
            .body_length()
            .filter(|&len| len > MAX_BODY)
            .map(|_| too_large())
    });
    let (status, body) = match early {
        Some(answer) => answer,
        None => {
            let mut body = Vec::new();
            match request
                .as_reader()
                .take(MAX_BODY as u64 + 1)
                .read_to_end(&mut body)
            {
                Ok(_) => handle(&body, daemon),
                Err(e) => error(
                    400,
                    ErrorCode::InvalidRequest,
                    format!("cannot read the request body: {e}"),
                ),
            }
        }
    };
    let content_type =
        Header::from_bytes("Content-Type", "application/json").expect("a constant, valid header");
    let mut response = tiny_http::Response::from_data(body.to_string().into_bytes())
        .with_status_code(status)
        .with_header(content_type);
    if status == 405 {
        response.add_header(Header::from_bytes("Allow", "POST").expect("a constant, valid header"));
    }
    // The HTTP client may have gone away; nothing to tell it then.
    let _ = request.respond(response);
}

/// The answer for a method and URL that are not `POST /v1/rpc`, or `None`
/// when the request is one to serve.
pub fn route(method: &str, url: &str) -> Option<(u16, Value)> {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    if path != RPC_PATH {
        return Some(error(
            404,
            ErrorCode::NotFound,
            format!("no such path {path:?}; the gateway serves POST {RPC_PATH}"),
        ));
    }
    if !method.eq_ignore_ascii_case("POST") {
        return Some(error(
            405,
            ErrorCode::InvalidRequest,
            format!("{RPC_PATH} takes POST, not {method}"),
        ));
    }
    None
}

/// The status and JSON answer for one `POST /v1/rpc` body.
pub fn handle(body: &[u8], daemon: &mut impl Caller) -> (u16, Value) {
    if body.len() > MAX_BODY {
        return too_large();
    }
    let Ok(text) = std::str::from_utf8(body) else {
        return error(
            400,
            ErrorCode::InvalidRequest,
            "request body is not UTF-8".into(),
        );
    };
    let answer = rpc_answer(daemon, text);
    let status = match &answer {
        Ok(_) => 200,
        Err(e) => e.code.http_status(),
    };
    (status, answer_to_json(&answer))
}

fn too_large() -> (u16, Value) {
    error(
        413,
        ErrorCode::InvalidRequest,
        format!("request body is larger than {MAX_BODY} bytes"),
    )
}

fn error(status: u16, code: ErrorCode, message: String) -> (u16, Value) {
    (status, answer_to_json(&Err(ErrorBody::new(code, message))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Answer, ClientError};
    use crate::rpc::tests::{deleted, Fake};
    use std::io::Write;
    use std::net::TcpStream;

    const DELETE: &[u8] = br#"{"action":"agent.delete","params":{"agent_id":"a"}}"#;

    fn fake(answer: fn(&allox_protocol::Request) -> Result<Answer, ClientError>) -> Fake {
        Fake { calls: 0, answer }
    }

    /// Answers every request with one error code.
    struct Fails(ErrorCode);

    impl Caller for Fails {
        fn call(&mut self, _: allox_protocol::Request) -> Result<Answer, ClientError> {
            Ok(Err(ErrorBody::new(self.0, "refused by the fake")))
        }
    }

    #[test]
    fn statuses_follow_the_error_code() {
        let mut ok = fake(deleted);
        let (status, v) = handle(DELETE, &mut ok);
        assert_eq!((status, &v["result"]["deleted"]), (200, &"a".into()));

        for (code, status) in [
            (ErrorCode::InvalidRequest, 400),
            (ErrorCode::NotFound, 404),
            (ErrorCode::Conflict, 409),
            (ErrorCode::Unsupported, 501),
            (ErrorCode::Internal, 500),
        ] {
            let (got, v) = handle(DELETE, &mut Fails(code));
            assert_eq!(got, status, "{code}");
            assert_eq!(v["error"]["code"], code.as_str());
            assert_eq!(v["error"]["message"], "refused by the fake");
        }
    }

    #[test]
    fn unreachable_daemon_is_503_naming_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let (status, v) = handle(DELETE, &mut Daemon::new(&sock));
        assert_eq!(status, 503);
        assert_eq!(v["error"]["code"], "unavailable");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(&sock.display().to_string()), "{message}");

        let mut gone = fake(|_| Err(ClientError::Closed));
        assert_eq!(handle(DELETE, &mut gone).0, 503);
    }

    #[test]
    fn bad_bodies_are_400_or_413_without_a_call() {
        let mut f = fake(deleted);
        assert_eq!(handle(b"{", &mut f).0, 400);
        assert_eq!(handle(b"\xff\xfe", &mut f).0, 400);
        assert_eq!(handle(&vec![b' '; MAX_BODY + 1], &mut f).0, 413);
        assert_eq!(f.calls, 0);
    }

    #[test]
    fn routes() {
        assert_eq!(route("POST", "/v1/rpc"), None);
        assert_eq!(route("POST", "/v1/rpc?pretty=1"), None);
        let (status, v) = route("GET", "/v1/rpc").unwrap();
        assert_eq!(
            (status, &v["error"]["code"]),
            (405, &"invalid_request".into())
        );
        let (status, v) = route("POST", "/v2/rpc").unwrap();
        assert_eq!((status, &v["error"]["code"]), (404, &"not_found".into()));
    }

    /// One request through a real listener on a free port.
    #[test]
    fn serves_http() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let gateway = Gateway::bind("127.0.0.1:0").unwrap();
        let addr = gateway.local_addr().unwrap();
        thread::spawn(move || gateway.run(sock, 1));
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST /v1/rpc HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            DELETE.len()
        )
        .unwrap();
        s.write_all(DELETE).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
        assert!(reply.contains("application/json"), "{reply}");
        assert!(reply.contains(r#""code":"unavailable""#), "{reply}");
    }
}
