//! `alloxctl gateway`: the JSON form over HTTP, `POST /v1/rpc`, and a
//! session's files as raw bytes, `GET` and `PUT
//! /v1/files/{agent}/{session}/{path}` ([`files`]).
//!
//! The answer body is the same JSON as `alloxctl rpc` prints; the status is
//! 200 for a result and the error code's [`ErrorCode::http_status`]
//! otherwise (503 `unavailable` when the daemon cannot be reached, 504
//! `unavailable` when it did not answer in time).
//!
//! It is served by hyper on a tokio runtime: HTTP/1.1 with keep-alive and
//! HTTP/2 (over TLS-less TCP, "h2c" with prior knowledge) on the same
//! port, `TCP_NODELAY` on every connection (an answer is never held back
//! for the client's delayed ACK), and a graceful stop on SIGINT or SIGTERM
//! (no new connection; those in flight finish, for at most
//! [`DRAIN_TIMEOUT`]). Plain calls share a few multiplexed daemon
//! connections driven from the runtime's tasks ([`daemon`]); a stream has
//! a daemon connection of its own ([`stream`]); file transfers run on the
//! blocking pool, each on a daemon connection taken from a small pool.
//! A slow call holds its own place, never the server.
//!
//! Before anything reaches the daemon a request must pass [`access`]: the
//! bearer token, a `Host` naming this gateway, no `Origin` but allowed
//! ones, a JSON content type (for `/v1/rpc`; a file's body may be of any
//! type). The listener is bound to loopback unless `--allow-remote` says
//! otherwise. The HTTP timeout bounds how long a request's head may take
//! and how long the gateway waits for each piece of a body (408 when it
//! stalls); the daemon timeout bounds every call to the daemon (a file
//! moves in many calls, each bounded, the transfer as a whole is not).
//!
//! The bearer token and its file are [`token`]'s (`alloxctl token` prints
//! it too).

pub mod access;
mod body;
mod daemon;
pub mod files;
mod http;
pub mod metrics;
pub mod openapi;
mod port_pool;
pub mod ports;
mod shared;
pub mod spool;
mod stream;
pub mod token;

use access::{Access, Refusal};
use allox_client::ClientError;
use allox_protocol::json::{answer_to_json, parse_request};
use allox_protocol::{ErrorBody, ErrorCode, Request};
use serde_json::Value;
use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;
use token::TokenError;

/// Where requests are posted.
pub const RPC_PATH: &str = "/v1/rpc";
/// Where the OpenAPI document is served.
pub const OPENAPI_PATH: &str = "/v1/openapi.json";
/// Liveness: the gateway answers (no token, no call to the daemon).
pub const HEALTHZ_PATH: &str = "/healthz";
/// Readiness: the daemon answers and its store takes changes (no token).
pub const READYZ_PATH: &str = "/readyz";
/// The daemon's and the gateway's metrics (the metrics token, or none on
/// the metrics address).
pub const METRICS_PATH: &str = "/metrics";
/// Largest request body accepted.
pub const MAX_BODY: usize = 1 << 20;
/// Threads of the gateway's runtime (daemon calls run beside them, on its
/// blocking pool).
pub const WORKERS: usize = 4;
/// How long a stop waits for the requests in flight.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a call to the daemon may take by default.
pub const DAEMON_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request's body and each write of an answer may take by
/// default.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum GatewayError {
    #[error(transparent)]
    Spool(#[from] spool::SpoolError),
    #[error("cannot resolve {listen:?}")]
    Resolve {
        listen: String,
        #[source]
        source: io::Error,
    },
    #[error("{listen:?} resolves to {addr}, which is not a loopback address: {risk}; listen on 127.0.0.1, or pass --allow-remote to do it anyway")]
    NotLoopback {
        listen: String,
        addr: SocketAddr,
        /// What serving there would risk (the gateway's address takes a
        /// token; the metrics address, another).
        risk: &'static str,
    },
    #[error("cannot listen on {listen}")]
    Bind {
        listen: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot start serving {listen}")]
    Serve {
        listen: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("--ports-domain {domain:?}: {why}")]
    PortsDomain { domain: String, why: &'static str },
    #[error("the metrics token is the gateway's own token: give the metrics (--metrics-token-file or --metrics-token-env) a token of their own (a scraper must not hold the token that can do everything)")]
    SameToken,
}

/// Where the gateway spools files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpoolAt {
    /// The system's temporary directory (`$TMPDIR`, else `/tmp`); where
    /// it cannot hold a file (a read-only root), every file goes in
    /// frames, as the start's log says.
    Temp,
    /// This directory, which must be able to hold a file.
    Dir(PathBuf),
    /// None: every file in frames.
    Off,
}

/// How to run a gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayConfig {
    /// `host:port` to listen on; port 0 picks a free one.
    pub listen: String,
    /// The daemon's control socket.
    pub socket: PathBuf,
    /// Where the bearer token is read from (or created).
    pub token_file: PathBuf,
    /// The environment variable holding the token, read instead of the
    /// file when set.
    pub token_env: Option<String>,
    /// Listen on an address that is not loopback.
    pub allow_remote: bool,
    /// `Host` values accepted besides the bound address and localhost.
    pub allow_hosts: Vec<String>,
    /// `Origin` values accepted (browsers' cross-origin requests).
    pub allow_origins: Vec<String>,
    /// The domain below which each exposed port has a host of its own
    /// (`{port}-{id}.{ports_domain}`: an origin of its own).
    pub ports_domain: String,
    /// Bound on each call to the daemon.
    pub daemon_timeout: Duration,
    /// Bound on waiting for a request's body and on each write of an
    /// answer.
    pub http_timeout: Duration,
    /// Threads of the runtime.
    pub workers: usize,
    /// Where the metrics token is read from: `GET /metrics` on `listen`
    /// takes it (and only it); without one, `/metrics` is not served
    /// there.
    pub metrics_token_file: Option<PathBuf>,
    /// The environment variable holding the metrics token, instead of a
    /// file.
    pub metrics_token_env: Option<String>,
    /// A second address serving only `GET /metrics` and `/healthz`, with
    /// no token (loopback only unless `allow_remote`).
    pub metrics_listen: Option<String>,
    /// Where file bodies larger than a chunk are spooled to be passed to
    /// the daemon as open files ([`spool`]).
    pub spool: SpoolAt,
}

impl GatewayConfig {
    /// The defaults: loopback only, the token beside the socket, no origin.
    pub fn new(listen: impl Into<String>, socket: impl Into<PathBuf>) -> GatewayConfig {
        let socket = socket.into();
        GatewayConfig {
            listen: listen.into(),
            token_file: token::default_path(&socket),
            token_env: None,
            socket,
            allow_remote: false,
            allow_hosts: Vec::new(),
            allow_origins: Vec::new(),
            ports_domain: "localhost".into(),
            daemon_timeout: DAEMON_TIMEOUT,
            http_timeout: HTTP_TIMEOUT,
            workers: WORKERS,
            metrics_token_file: None,
            metrics_token_env: None,
            metrics_listen: None,
            spool: SpoolAt::Temp,
        }
    }
}

/// Serves `cfg.listen` until SIGINT or SIGTERM.
pub fn serve(cfg: &GatewayConfig) -> Result<(), GatewayError> {
    Gateway::bind(cfg)?.run()
}

/// Refuses addresses that are not loopback unless `allow_remote`.
pub fn check_listen(
    listen: &str,
    addrs: &[SocketAddr],
    allow_remote: bool,
) -> Result<(), GatewayError> {
    check_listen_for(listen, addrs, allow_remote, GATEWAY_RISK)
}

/// What serving the gateway beyond the loopback risks.
const GATEWAY_RISK: &str =
    "anyone who can reach it could try tokens, and the token travels in clear text";
/// What serving the metrics beyond the loopback risks.
const METRICS_RISK: &str =
    "anyone who can reach it could read the metrics, which it serves without a token";

fn check_listen_for(
    listen: &str,
    addrs: &[SocketAddr],
    allow_remote: bool,
    risk: &'static str,
) -> Result<(), GatewayError> {
    match addrs.iter().find(|a| !a.ip().is_loopback()) {
        Some(&addr) if !allow_remote => Err(GatewayError::NotLoopback {
            listen: listen.to_owned(),
            addr,
            risk,
        }),
        _ => Ok(()),
    }
}

/// The addresses `listen` names, each loopback unless `allow_remote`.
fn resolve(
    listen: &str,
    allow_remote: bool,
    risk: &'static str,
) -> Result<Vec<SocketAddr>, GatewayError> {
    let addrs: Vec<SocketAddr> = listen
        .to_socket_addrs()
        .map_err(|source| GatewayError::Resolve {
            listen: listen.to_owned(),
            source,
        })?
        .collect();
    check_listen_for(listen, &addrs, allow_remote, risk)?;
    Ok(addrs)
}

/// A listener on the first of `addrs` that binds, and its address.
fn bind_to(listen: &str, addrs: &[SocketAddr]) -> Result<(TcpListener, SocketAddr), GatewayError> {
    let err = |source| GatewayError::Bind {
        listen: listen.to_owned(),
        source,
    };
    let l = TcpListener::bind(addrs).map_err(err)?;
    let bound = l.local_addr().map_err(err)?;
    Ok((l, bound))
}

/// A bound listener, not yet serving.
pub struct Gateway {
    listener: TcpListener,
    /// `--metrics-listen`'s, and its address.
    metrics_listener: Option<(TcpListener, SocketAddr)>,
    access: Access,
    addr: SocketAddr,
    token_created: bool,
    spool: Option<spool::Spool>,
    cfg: GatewayConfig,
}

impl Gateway {
    /// Checks the address, reads or creates the token, and binds.
    pub fn bind(cfg: &GatewayConfig) -> Result<Gateway, GatewayError> {
        let addrs = resolve(&cfg.listen, cfg.allow_remote, GATEWAY_RISK)?;
        let (token, token_created) = match &cfg.token_env {
            Some(name) => (token::from_env(name)?, false),
            None => token::load_or_create(&cfg.token_file)?,
        };
        let metrics_token = match (&cfg.metrics_token_env, &cfg.metrics_token_file) {
            (Some(name), _) => Some(token::from_env(name)?),
            (None, Some(f)) => Some(token::read(f)?),
            (None, None) => None,
        };
        if metrics_token
            .as_ref()
            .is_some_and(|m| token.matches(m.as_str().as_bytes()))
        {
            return Err(GatewayError::SameToken);
        }
        let metrics_addrs = match &cfg.metrics_listen {
            Some(m) => Some((m, resolve(m, cfg.allow_remote, METRICS_RISK)?)),
            None => None,
        };
        let spool = match &cfg.spool {
            SpoolAt::Dir(dir) => Some(spool::Spool::new(dir)?),
            SpoolAt::Temp => match spool::Spool::new(&std::env::temp_dir()) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "files go in frames");
                    None
                }
            },
            SpoolAt::Off => None,
        };
        let (listener, addr) = bind_to(&cfg.listen, &addrs)?;
        let metrics_listener = match metrics_addrs {
            Some((m, a)) => Some(bind_to(m, &a)?),
            None => None,
        };
        let access = Access::new(token, addr, &cfg.allow_hosts, &cfg.allow_origins)
            .with_metrics_token(metrics_token)
            .with_ports_domain(&cfg.ports_domain)
            .map_err(|why| GatewayError::PortsDomain {
                domain: cfg.ports_domain.clone(),
                why,
            })?;
        Ok(Gateway {
            listener,
            metrics_listener,
            access,
            addr,
            token_created,
            spool,
            cfg: cfg.clone(),
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The metrics address actually bound (`--metrics-listen`).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener.as_ref().map(|(_, a)| *a)
    }

    /// Whether the token file was created by this start.
    pub fn token_created(&self) -> bool {
        self.token_created
    }

    /// Serves until SIGINT or SIGTERM, then lets the requests in flight
    /// finish (at most [`DRAIN_TIMEOUT`]).
    pub fn run(self) -> Result<(), GatewayError> {
        self.run_ready(|| {})
    }

    /// [`Gateway::run`], calling `ready` once SIGINT and SIGTERM are
    /// caught, before the first request is served: what it says (the
    /// address) tells whoever reads it that the gateway answers, and that
    /// a signal from then on stops it.
    pub fn run_ready(self, ready: impl FnOnce()) -> Result<(), GatewayError> {
        let listen = self.cfg.listen.clone();
        let serve_err = |source| GatewayError::Serve {
            listen: listen.clone(),
            source,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.cfg.workers.max(1))
            .enable_all()
            .build()
            .map_err(serve_err)?;
        let served = rt.block_on(async move {
            // Caught from here on, before the first request is served:
            // one sent once the gateway answers is never lost. (Before,
            // SIGTERM ends the process.)
            let mut stop = allox_signals::StopSignals::install("the gateway");
            ready();
            http::serve(self, async move { stop.wait().await }).await
        });
        // A stream still open after the drain (a follow) holds a blocking
        // thread on its daemon connection: the process ends without it.
        rt.shutdown_timeout(Duration::from_millis(500));
        served.map_err(serve_err)
    }
}

/// A status, a JSON body (none for 204) and extra headers.
#[derive(Debug, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub body: Option<Value>,
    pub headers: Vec<(&'static str, String)>,
}

impl Reply {
    fn json((status, body): (u16, Value)) -> Reply {
        Reply {
            status,
            body: Some(body),
            headers: Vec::new(),
        }
    }

    fn refused(r: &Refusal) -> Reply {
        let mut reply = Reply::json(error(r.status(), r.code(), r.message()));
        if matches!(r, Refusal::Token | Refusal::MetricsToken) {
            reply.headers.push((
                "WWW-Authenticate",
                r#"Bearer realm="alloxctl gateway""#.into(),
            ));
        }
        reply
    }
}

/// Where a request goes.
#[derive(Debug, PartialEq)]
pub enum Route {
    /// `POST` or `OPTIONS` on `/v1/rpc` (`{"action", "params"}`), or on
    /// `/v1/rpc/{action}` (the params alone).
    Rpc(Option<String>),
    /// `GET` or `PUT` below `/v1/files/`.
    Files(files::FileRequest),
    /// Any method below `/v1/ports/`: a session's exposed port.
    Port(ports::PortRequest),
    /// `GET /v1/openapi.json`.
    OpenApi,
    /// `GET /healthz`.
    Health,
    /// `GET /readyz`.
    Ready,
    /// `GET /metrics`.
    Metrics,
    /// Answered at once: no such path, or not a method served there.
    Refused(Reply),
}

/// The route of a method and URL.
pub fn route(method: &str, url: &str) -> Route {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    if ports::is_ports_path(path) {
        return match ports::parse(url) {
            Ok(p) => Route::Port(p),
            Err(r) => Route::Refused(r),
        };
    }
    if files::is_files_path(path) {
        return match files::parse(method, url) {
            Ok(f) => Route::Files(f),
            Err(e) => Route::Refused(e.reply()),
        };
    }
    for (p, r) in [
        (HEALTHZ_PATH, Route::Health),
        (READYZ_PATH, Route::Ready),
        (METRICS_PATH, Route::Metrics),
    ] {
        if path == p {
            if method.eq_ignore_ascii_case("GET") || method.eq_ignore_ascii_case("HEAD") {
                return r;
            }
            return Route::Refused(not_allowed(p, method, "GET, HEAD"));
        }
    }
    if path == OPENAPI_PATH {
        if method.eq_ignore_ascii_case("GET") {
            return Route::OpenApi;
        }
        return Route::Refused(not_allowed(OPENAPI_PATH, method, "GET"));
    }
    let action = match path.strip_prefix(RPC_PATH) {
        Some("") => None,
        Some(rest) => match rest.strip_prefix('/') {
            Some(name) if !name.is_empty() && !name.contains('/') => Some(name.to_owned()),
            _ => return Route::Refused(no_such_path(path)),
        },
        None => return Route::Refused(no_such_path(path)),
    };
    if !method.eq_ignore_ascii_case("POST") && !method.eq_ignore_ascii_case("OPTIONS") {
        return Route::Refused(not_allowed(path, method, "POST, OPTIONS"));
    }
    Route::Rpc(action)
}

/// 405 for `method` on `path`, which takes `allow` (the first of which
/// the message names).
fn not_allowed(path: &str, method: &str, allow: &'static str) -> Reply {
    let first = allow.split(',').next().unwrap_or(allow);
    let mut reply = Reply::json(error(
        405,
        ErrorCode::InvalidRequest,
        format!("{path} takes {first}, not {method}"),
    ));
    reply.headers.push(("Allow", allow.into()));
    reply
}

fn no_such_path(path: &str) -> Reply {
    Reply::json(error(
        404,
        ErrorCode::NotFound,
        format!(
            "no such path {path:?}; the gateway serves POST {RPC_PATH} and {RPC_PATH}/{{action}}, GET {OPENAPI_PATH}, GET and PUT {}/{{agent}}/{{session}}/{{path}}, and GET {HEALTHZ_PATH}, {READYZ_PATH} and {METRICS_PATH}",
            files::FILES_PATH
        ),
    ))
}

/// The request a body makes: `{"action": ..., "params": ...}`, or with
/// `action` from the path, the params alone (an empty body is no params).
pub fn parse_body(body: &[u8], action: Option<&str>) -> Result<Request, (u16, Value)> {
    if body.len() > MAX_BODY {
        return Err(too_large());
    }
    let Ok(text) = std::str::from_utf8(body) else {
        return Err(error(
            400,
            ErrorCode::InvalidRequest,
            "request body is not UTF-8".into(),
        ));
    };
    let parsed = match action {
        None => parse_request(text),
        Some(action) if text.trim().is_empty() => Request::from_json(action, Value::Null),
        Some(action) => serde_json::from_str::<Value>(text)
            .map_err(|e| ErrorBody::invalid(format!("request body is not valid JSON: {e}")))
            .and_then(|params| {
                if params.is_object() {
                    Request::from_json(action, params)
                } else {
                    Err(ErrorBody::invalid(format!(
                        "the body of {RPC_PATH}/{action} must be its params, a JSON object"
                    )))
                }
            }),
    };
    parsed.map_err(|body| (body.code.http_status(), answer_to_json(&Err(body))))
}

/// The status and JSON answer of a call's outcome.
pub fn answer_json(outcome: Result<allox_client::Answer, ClientError>) -> (u16, Value) {
    let (status, answer) = match outcome {
        Ok(Ok(response)) => (200, Ok(response)),
        Ok(Err(body)) => (body.code.http_status(), Err(body)),
        Err(err) => return failure(&err),
    };
    (status, answer_to_json(&answer))
}

/// The status and JSON answer for a call that did not reach the daemon or
/// come back.
fn failure(err: &ClientError) -> (u16, Value) {
    let status = match err {
        // The daemon is there but slow: a gateway timeout.
        ClientError::TimedOut(_) => 504,
        err => err.code().http_status(),
    };
    (status, answer_to_json(&Err(err.to_body())))
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
    use allox_client::fake::{deleted, Fake};
    use allox_client::{Answer, Caller, ReconnectingClient};
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::sync::Arc;
    use std::thread;

    const DELETE: &[u8] = br#"{"action":"agent.delete","params":{"agent_id":"a"}}"#;

    /// What the gateway answers one body with, over a blocking caller.
    fn handle(body: &[u8], action: Option<&str>, daemon: &mut impl Caller) -> (u16, Value) {
        match parse_body(body, action) {
            Ok(request) => answer_json(daemon.call(request)),
            Err(answer) => answer,
        }
    }

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
        let (status, v) = handle(DELETE, None, &mut ok);
        assert_eq!((status, &v["result"]["deleted"]), (200, &"a".into()));

        for (code, status) in [
            (ErrorCode::InvalidRequest, 400),
            (ErrorCode::NotFound, 404),
            (ErrorCode::Conflict, 409),
            (ErrorCode::Unsupported, 501),
            (ErrorCode::Internal, 500),
        ] {
            let (got, v) = handle(DELETE, None, &mut Fails(code));
            assert_eq!(got, status, "{code}");
            assert_eq!(v["error"]["code"], code.as_str());
            assert_eq!(v["error"]["message"], "refused by the fake");
        }
    }

    #[test]
    fn unreachable_daemon_is_503_naming_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let (status, v) = handle(DELETE, None, &mut ReconnectingClient::new(&sock));
        assert_eq!(status, 503);
        assert_eq!(v["error"]["code"], "unavailable");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(&sock.display().to_string()), "{message}");

        let mut gone = fake(|_| Err(ClientError::Closed));
        assert_eq!(handle(DELETE, None, &mut gone).0, 503);
    }

    #[test]
    fn an_action_in_the_path_takes_its_params_as_the_body() {
        let mut ok = fake(deleted);
        let (status, v) = handle(br#"{"agent_id":"a"}"#, Some("agent.delete"), &mut ok);
        assert_eq!((status, &v["result"]["deleted"]), (200, &"a".into()));
        let (status, v) = handle(b"", Some("agent.list"), &mut ok);
        assert_eq!(status, 200, "{v}");
        assert_eq!(ok.calls, 2);
        for (body, action, says) in [
            (&br#"[1]"#[..], "agent.delete", "must be its params"),
            (b"{", "agent.delete", "not valid JSON"),
            (br#"{"agent_id":"a"}"#, "agent.explode", "unknown action"),
            (br#"{"agent_id":"a","x":1}"#, "agent.delete", "bad params"),
        ] {
            let (status, v) = handle(body, Some(action), &mut ok);
            assert_eq!(status, 400, "{v}");
            let message = v["error"]["message"].as_str().unwrap();
            assert!(message.contains(says), "{message}");
        }
        assert_eq!(ok.calls, 2);
    }

    #[test]
    fn bad_bodies_are_400_or_413_without_a_call() {
        let mut f = fake(deleted);
        assert_eq!(handle(b"{", None, &mut f).0, 400);
        assert_eq!(handle(b"\xff\xfe", None, &mut f).0, 400);
        assert_eq!(handle(&vec![b' '; MAX_BODY + 1], None, &mut f).0, 413);
        assert_eq!(f.calls, 0);
    }

    #[test]
    fn routes() {
        assert_eq!(route("POST", "/v1/rpc"), Route::Rpc(None));
        assert_eq!(route("POST", "/v1/rpc?pretty=1"), Route::Rpc(None));
        assert_eq!(route("OPTIONS", "/v1/rpc"), Route::Rpc(None));
        assert_eq!(
            route("POST", "/v1/rpc/agent.create"),
            Route::Rpc(Some("agent.create".into()))
        );
        assert_eq!(route("GET", "/v1/openapi.json"), Route::OpenApi);
        let refused = |method, url| match route(method, url) {
            Route::Refused(r) => r,
            other => panic!("{method} {url}: {other:?}"),
        };
        let r = refused("GET", "/v1/rpc");
        let v = r.body.as_ref().unwrap();
        assert_eq!(
            (r.status, &v["error"]["code"]),
            (405, &"invalid_request".into())
        );
        assert_eq!(r.headers, [("Allow", "POST, OPTIONS".to_string())]);
        let r = refused("POST", "/v2/rpc");
        let v = r.body.as_ref().unwrap();
        assert_eq!((r.status, &v["error"]["code"]), (404, &"not_found".into()));
        for url in ["/v1/rpc/", "/v1/rpc/a/b", "/v1/rpcx"] {
            assert_eq!(refused("POST", url).status, 404, "{url}");
        }
        assert_eq!(refused("POST", "/v1/openapi.json").status, 405);
        // The probes: GET and HEAD, their query ignored.
        assert_eq!(route("GET", "/healthz"), Route::Health);
        assert_eq!(route("HEAD", "/healthz"), Route::Health);
        assert_eq!(route("GET", "/readyz?verbose"), Route::Ready);
        assert_eq!(refused("POST", "/readyz").status, 405);
        assert_eq!(refused("GET", "/healthz/x").status, 404);
        assert_eq!(refused("GET", "/v1/rpc/agent.list").status, 405);
        // The files: GET and PUT, anything else 405 naming both.
        for method in ["GET", "PUT"] {
            let Route::Files(f) = route(method, "/v1/files/a/s/d%20e/f.txt?scope=shared") else {
                panic!("{method}");
            };
            assert_eq!(f.target.path, "d e/f.txt");
            assert_eq!(f.target.scope, allox_protocol::FsScope::Shared);
        }
        for method in ["POST", "DELETE", "PATCH", "OPTIONS", "HEAD"] {
            let r = refused(method, "/v1/files/a/s/f");
            assert_eq!(r.status, 405, "{method}");
            assert_eq!(r.headers, [("Allow", "GET, PUT".to_string())]);
        }
        assert_eq!(refused("GET", "/v1/files/a").status, 404);
        assert_eq!(refused("GET", "/v1/filesx/a/s/f").status, 404);
    }

    #[test]
    fn a_daemon_that_does_not_answer_in_time_is_504_and_reconnected() {
        use std::os::unix::net::UnixListener;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let seen = accepted.clone();
        // Welcomes every connection, then never answers.
        thread::spawn(move || {
            let mut held = Vec::new();
            for s in listener.incoming() {
                let mut s = s.unwrap();
                seen.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 256];
                let n = s.read(&mut buf).unwrap_or(0);
                let mut r = allox_protocol::FrameReader::new();
                r.push(&buf[..n]);
                let conversation = std::iter::from_fn(|| r.next_frame())
                    .filter_map(|f| f.ok())
                    .find_map(|p| match allox_protocol::decode(&p) {
                        Ok(allox_protocol::ClientFrame::Hello(h)) => Some(h.conversation),
                        _ => None,
                    })
                    .expect("a Hello");
                let welcome = allox_protocol::ServerFrame::Welcome(allox_protocol::Hello {
                    version: allox_protocol::PROTOCOL_VERSION,
                    build: "slow".into(),
                    conversation,
                });
                s.write_all(&allox_protocol::encode(&welcome).unwrap())
                    .unwrap();
                held.push(s);
            }
        });
        let mut daemon = ReconnectingClient::with_timeout(&sock, Some(Duration::from_millis(200)));
        for round in 1..=2 {
            let (status, v) = handle(DELETE, None, &mut daemon);
            assert_eq!(status, 504, "{v}");
            assert_eq!(v["error"]["code"], "unavailable");
            let message = v["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("did not answer within 200 ms"),
                "{message}"
            );
            // Not made again on the same call; a new connection for the next.
            assert_eq!(accepted.load(Ordering::SeqCst), round);
        }
    }

    /// A gateway on a free port with its token in `dir`, serving `sock`.
    fn start(
        dir: &std::path::Path,
        sock: &std::path::Path,
        tweak: impl FnOnce(&mut GatewayConfig),
    ) -> (SocketAddr, String) {
        let mut cfg = GatewayConfig::new("127.0.0.1:0", sock);
        cfg.token_file = dir.join("gateway.token");
        cfg.workers = 1;
        tweak(&mut cfg);
        let gateway = Gateway::bind(&cfg).unwrap();
        assert!(gateway.token_created());
        let addr = gateway.local_addr();
        thread::spawn(move || gateway.run());
        let token = token::read(&cfg.token_file).unwrap().as_str().to_owned();
        (addr, token)
    }

    /// Sends one request with `headers` and returns the whole reply.
    fn send(addr: SocketAddr, method: &str, headers: &[String], body: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut head = format!("{method} /v1/rpc HTTP/1.1\r\n");
        for h in headers {
            head.push_str(h);
            head.push_str("\r\n");
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        ));
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        reply
    }

    /// One request through a real listener on a free port.
    #[test]
    fn serves_http_with_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let (addr, token) = start(dir.path(), &sock, |_| {});
        let good = || {
            vec![
                format!("Host: {addr}"),
                format!("Authorization: Bearer {token}"),
                "Content-Type: application/json".to_string(),
            ]
        };
        let reply = send(addr, "POST", &good(), DELETE);
        assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
        assert!(reply.contains("application/json"), "{reply}");
        assert!(reply.contains(r#""code":"unavailable""#), "{reply}");

        let without = |name: &str| -> Vec<String> {
            good()
                .into_iter()
                .filter(|h| !h.starts_with(name))
                .collect()
        };
        let reply = send(addr, "POST", &without("Authorization"), DELETE);
        assert!(reply.starts_with("HTTP/1.1 401"), "{reply}");
        assert!(reply.contains(r#""code":"unauthorized""#), "{reply}");
        assert!(reply.contains("www-authenticate: Bearer"), "{reply}");

        let mut h = without("Host");
        h.push("Host: rebound.example".into());
        let reply = send(addr, "POST", &h, DELETE);
        assert!(reply.starts_with("HTTP/1.1 403"), "{reply}");
        assert!(reply.contains(r#""code":"unauthorized""#), "{reply}");

        let mut h = good();
        h.push("Origin: http://evil.example".into());
        let reply = send(addr, "POST", &h, DELETE);
        assert!(reply.starts_with("HTTP/1.1 403"), "{reply}");
        assert!(!reply.contains("access-control-allow-origin"), "{reply}");

        let mut h = without("Content-Type");
        h.push("Content-Type: text/plain".into());
        let reply = send(addr, "POST", &h, DELETE);
        assert!(reply.starts_with("HTTP/1.1 415"), "{reply}");
    }

    #[test]
    fn allowed_origins_get_preflight_and_cors_headers() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let (addr, token) = start(dir.path(), &sock, |c| {
            c.allow_origins = vec!["https://app.example".into()]
        });
        let pre = send(
            addr,
            "OPTIONS",
            &[
                format!("Host: localhost:{}", addr.port()),
                "Origin: https://app.example".into(),
                "Access-Control-Request-Method: POST".into(),
            ],
            b"",
        );
        assert!(pre.starts_with("HTTP/1.1 204"), "{pre}");
        assert!(
            pre.contains("access-control-allow-origin: https://app.example"),
            "{pre}"
        );
        assert!(
            pre.contains("access-control-allow-headers: Authorization, Content-Type"),
            "{pre}"
        );
        let reply = send(
            addr,
            "POST",
            &[
                format!("Host: {addr}"),
                "Origin: https://app.example".into(),
                format!("Authorization: Bearer {token}"),
                "Content-Type: application/json".into(),
            ],
            DELETE,
        );
        // Served (the daemon is absent here) and readable by the page.
        assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
        assert!(
            reply.contains("access-control-allow-origin: https://app.example"),
            "{reply}"
        );
        let pre = send(
            addr,
            "OPTIONS",
            &[
                format!("Host: {addr}"),
                "Origin: https://other.example".into(),
            ],
            b"",
        );
        assert!(pre.starts_with("HTTP/1.1 403"), "{pre}");
    }

    #[test]
    fn a_client_that_stalls_its_body_does_not_hold_the_gateway() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let (addr, token) = start(dir.path(), &sock, |c| {
            c.http_timeout = Duration::from_millis(300)
        });
        let good = |addr: SocketAddr| {
            send(
                addr,
                "POST",
                &[
                    format!("Host: {addr}"),
                    format!("Authorization: Bearer {token}"),
                    "Content-Type: application/json".into(),
                ],
                DELETE,
            )
        };
        // Each promises a body, sends 5 bytes of it, then nothing: a short
        // one and a long one; the gateway gives up on both.
        let stall = |length: usize| {
            let mut slow = TcpStream::connect(addr).unwrap();
            slow.set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            write!(
                slow,
                "POST /v1/rpc HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n{{\"act"
            )
            .unwrap();
            slow
        };
        let short = stall(100);
        let long = stall(5000);
        // The one worker serves the next clients meanwhile (and the
        // listener still accepts after a while without connections).
        let reply = good(addr);
        assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
        thread::sleep(Duration::from_millis(400));
        let reply = good(addr);
        assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
        // The slow client is answered when it gives up sending.
        long.shutdown(std::net::Shutdown::Write).unwrap();
        let mut reply = String::new();
        (&long).read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
        drop(short);
    }

    #[test]
    fn silent_and_idle_connections_are_closed_after_the_http_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let (addr, token) = start(dir.path(), &sock, |c| {
            c.http_timeout = Duration::from_millis(300)
        });
        let closed_within = |mut s: TcpStream| {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let t = std::time::Instant::now();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            t.elapsed()
        };
        // Never a byte.
        let silent = TcpStream::connect(addr).unwrap();
        assert!(closed_within(silent) < Duration::from_secs(5));
        // One request answered, then nothing more.
        let mut idle = TcpStream::connect(addr).unwrap();
        write!(
            idle,
            "POST /v1/rpc HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            DELETE.len()
        )
        .unwrap();
        idle.write_all(DELETE).unwrap();
        assert!(closed_within(idle) < Duration::from_secs(5));
    }

    #[test]
    fn non_loopback_addresses_need_allow_remote() {
        let any: SocketAddr = "0.0.0.0:8092".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:8092".parse().unwrap();
        let lo6: SocketAddr = "[::1]:8092".parse().unwrap();
        assert!(check_listen("x", &[lo, lo6], false).is_ok());
        let err = check_listen("0.0.0.0:8092", &[any], false).unwrap_err();
        assert!(err.to_string().contains("--allow-remote"), "{err}");
        assert!(check_listen("x", &[lo, any], false).is_err());
        assert!(check_listen("x", &[any], true).is_ok());
        // Refused before anything is bound or any token made.
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = GatewayConfig::new("0.0.0.0:0", dir.path().join("ctl.sock"));
        cfg.token_file = dir.path().join("t");
        assert!(matches!(
            Gateway::bind(&cfg),
            Err(GatewayError::NotLoopback { .. })
        ));
        assert!(!cfg.token_file.exists());
        // The metrics address is refused for what it risks: it takes no
        // token (it was refused as the gateway's, "could try tokens").
        let mut cfg = GatewayConfig::new("127.0.0.1:0", dir.path().join("ctl.sock"));
        cfg.token_file = dir.path().join("t");
        cfg.metrics_listen = Some("0.0.0.0:0".into());
        let err = Gateway::bind(&cfg).err().expect("refused").to_string();
        assert!(
            err.contains("could read the metrics") && !err.contains("try tokens"),
            "{err}"
        );
    }
}
