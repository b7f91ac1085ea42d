//! The gateway's HTTP side: connections served by hyper (HTTP/1.1 and
//! h2c on one port, `TCP_NODELAY`, quick ACKs, a bounded wait for a
//! connection's first byte and each request's head), the screening every
//! request passes, and the routes' dispatch.

use crate::access::Access;
use crate::body::{header, headers_of, read_body, respond, HttpRequest, HttpResponse};
use crate::shared::Shared;
use crate::{
    answer_json, files, openapi::openapi, parse_body, route, stream, too_large, Gateway, Reply,
    Route, MAX_BODY,
};
use hyper::body::Body as _;
use hyper::header::HeaderValue;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// Client connections served at once; one more is closed as it comes.
pub const MAX_CONNECTIONS: usize = 1024;
/// [`MAX_CONNECTIONS`], or fewer where descriptors are short: each
/// connection may hold a daemon connection too, and the soft limit is
/// raised to the hard one first.
fn connection_limit() -> usize {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let l = getrlimit(Resource::Nofile);
    let mut have = l.current.unwrap_or(1024);
    if let Some(hard) = l.maximum.filter(|&h| h > have) {
        let raised = Rlimit {
            current: Some(hard),
            maximum: Some(hard),
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            have = hard;
        }
    }
    MAX_CONNECTIONS.min((have / 4).max(16) as usize)
}

/// Serves `gateway` until `stop` completes, then waits for the
/// connections in flight (at most [`crate::DRAIN_TIMEOUT`]).
pub async fn serve(gateway: Gateway, stop: impl Future<Output = ()>) -> io::Result<()> {
    gateway.listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(gateway.listener)?;
    let metrics_listener = match gateway.metrics_listener {
        Some((l, _)) => {
            l.set_nonblocking(true)?;
            Some(tokio::net::TcpListener::from_std(l)?)
        }
        None => None,
    };
    let shared = Arc::new(
        Shared::new(
            gateway.access,
            gateway.cfg.socket.clone(),
            gateway.cfg.daemon_timeout,
            gateway.cfg.http_timeout,
        )
        .with_spool(gateway.spool),
    );
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(gateway.cfg.http_timeout);
    builder.http2().timer(TokioTimer::new());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let connections = Arc::new(tokio::sync::Semaphore::new(connection_limit()));
    tokio::pin!(stop);
    loop {
        // Whether the connection came to the metrics address.
        let accepted = tokio::select! {
            a = listener.accept() => a.map(|(s, _)| (s, false)),
            a = accept_either(metrics_listener.as_ref()) => a.map(|(s, _)| (s, true)),
            () = &mut stop => break,
        };
        let (stream, metrics_only) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors, say: not a reason to stop.
                tracing::warn!(error = %e, "accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        shared.metrics.connection();
        // Answers go out as written, not after the client's delayed ACK.
        let _ = stream.set_nodelay(true);
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            // At the limit: the newcomer is told at once rather than left
            // to wait (a client retries; a flood does not pile up).
            drop(stream);
            continue;
        };
        let shared = Arc::clone(&shared);
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            // hyper's header timeout starts with the first byte: a
            // connection that sends nothing is closed here instead.
            let mut first = [0u8; 1];
            if !matches!(
                tokio::time::timeout(shared.http_timeout, stream.peek(&mut first)).await,
                Ok(Ok(1..))
            ) {
                return;
            }
            let service = hyper::service::service_fn(move |req| {
                let shared = Arc::clone(&shared);
                async move {
                    Ok::<_, std::convert::Infallible>(answer(req, &shared, metrics_only).await)
                }
            });
            let conn = builder
                .serve_connection_with_upgrades(TokioIo::new(QuickAck(stream)), service)
                .into_owned();
            // A client that goes away is no error of the gateway's.
            let _ = watcher.watch(conn).await;
            drop(permit);
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(crate::DRAIN_TIMEOUT, graceful.shutdown()).await;
    Ok(())
}

/// A connection to `l`; never, without it.
async fn accept_either(
    l: Option<&tokio::net::TcpListener>,
) -> io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    match l {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// One request's answer, with the CORS headers for an allowed origin; on
/// the metrics address (`metrics_only`), `/metrics` without a token and
/// `/healthz`, nothing else.
async fn answer(req: HttpRequest, shared: &Arc<Shared>, metrics_only: bool) -> HttpResponse {
    let origin = header(&req, "Origin").map(str::to_owned);
    let url = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".into());
    let method = req.method().as_str().to_owned();
    // One Host, or none is trusted (RFC 9112: 400): a second could name
    // another port's host to the app.
    if req.headers().get_all(hyper::header::HOST).iter().count() > 1 {
        let r = respond(Reply::json(crate::error(
            400,
            allox_protocol::ErrorCode::InvalidRequest,
            "the request has more than one Host header".into(),
        )));
        shared.metrics.request("other", r.status().as_u16());
        return r;
    }
    // A port's own host is the app's, every path of it.
    let own_host = match metrics_only {
        // `Host`, or over HTTP/2 the URL's authority.
        false => shared.access.port_host(crate::body::headers_of(&req).host),
        true => None,
    };
    let routed = match own_host {
        Some(label) => Route::Port(crate::ports::PortRequest::at_host(label, &url)),
        None => route(&method, &url),
    };
    let route = match routed {
        r @ (Route::Metrics | Route::Health) => r,
        _ if metrics_only => Route::Refused(Reply::json(crate::error(
            404,
            allox_protocol::ErrorCode::NotFound,
            format!(
                "the metrics address serves only GET {} and {}",
                crate::METRICS_PATH,
                crate::HEALTHZ_PATH
            ),
        ))),
        r => r,
    };
    let label = crate::metrics::route_label(&route);
    let mut response = match route {
        Route::Files(f) => {
            let (agent, session) = (f.target.agent.clone(), f.target.session.clone());
            let r = files::serve(req, f, shared).await;
            // The path is the request's; the bytes never are logged.
            tracing::info!(
                method,
                agent,
                session,
                status = r.status().as_u16(),
                "files request answered"
            );
            r
        }
        Route::Port(p) => {
            let (agent, session, port) = (p.agent.clone(), p.session.clone(), p.port);
            let host = p.host.clone().unwrap_or_default();
            let r = crate::ports::serve(req, p, shared).await;
            tracing::info!(
                method,
                agent,
                session,
                port,
                host,
                status = r.status().as_u16(),
                "port request answered"
            );
            r
        }
        Route::Refused(reply) => refuse(req, reply, shared).await,
        Route::Health => respond(Reply {
            status: 200,
            body: Some(serde_json::json!({"status": "ok"})),
            headers: Vec::new(),
        }),
        Route::Ready => respond(ready(shared).await),
        Route::Metrics if metrics_only => {
            crate::metrics::scrape(&shared.daemon, &shared.metrics).await
        }
        Route::Metrics => match shared.access.check_metrics(&headers_of(&req)) {
            Ok(()) => crate::metrics::scrape(&shared.daemon, &shared.metrics).await,
            Err(r) => respond(Reply::refused(&r)),
        },
        Route::OpenApi => match shared.access.check_document(&headers_of(&req)) {
            Ok(()) => openapi(),
            Err(r) => respond(Reply::refused(&r)),
        },
        Route::Rpc(action) => match screen(&req, &shared.access) {
            Some(reply) => refuse(req, reply, shared).await,
            None => rpc(req, action, shared).await,
        },
    };
    if let Some(origin) = origin.filter(|o| shared.access.allows_origin(o)) {
        if let Ok(v) = HeaderValue::from_str(&origin) {
            let h = response.headers_mut();
            h.insert("Access-Control-Allow-Origin", v);
            h.insert("Vary", HeaderValue::from_static("Origin"));
        }
    }
    shared.metrics.request(label, response.status().as_u16());
    response
}

/// How long `/readyz` waits for the daemon.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// `GET /readyz`: 200 when the daemon answers `system.info` within
/// [`READY_WAIT`] and its store takes changes (mounted read-write, opened
/// whole, its journal replayed); 503 naming which is not so. The reason
/// the store gives is the daemon's to tell (`alloxctl info`): an
/// unauthenticated probe gets only which condition failed.
async fn ready(shared: &Arc<Shared>) -> Reply {
    let not = |why: &str| Reply {
        status: 503,
        body: Some(serde_json::json!({"ready": false, "why": why})),
        headers: Vec::new(),
    };
    let call = shared.daemon.call(allox_protocol::Request::SystemInfo(
        allox_protocol::SystemInfoRequest {},
    ));
    match tokio::time::timeout(READY_WAIT, call).await {
        Ok(Ok(Ok(allox_protocol::Response::System(info)))) => match info.store_read_only {
            None => Reply {
                status: 200,
                body: Some(serde_json::json!({"ready": true})),
                headers: Vec::new(),
            },
            Some(_) => not("the store refuses changes"),
        },
        Ok(Ok(_)) => not("the daemon does not answer system.info"),
        Ok(Err(_)) => not("the daemon cannot be reached"),
        Err(_) => not("the daemon did not answer in time"),
    }
}

/// The answer to give without reading the body, or `None` when the body
/// is to be read and forwarded.
fn screen(req: &HttpRequest, access: &Access) -> Option<Reply> {
    let headers = headers_of(req);
    if req.method() == hyper::Method::OPTIONS {
        return Some(match access.check_preflight(&headers) {
            Ok(()) => Reply {
                status: 204,
                body: None,
                headers: vec![
                    ("Access-Control-Allow-Methods", "POST".into()),
                    (
                        "Access-Control-Allow-Headers",
                        "Authorization, Content-Type".into(),
                    ),
                    ("Access-Control-Max-Age", "600".into()),
                ],
            },
            Err(r) => Reply::refused(&r),
        });
    }
    if let Err(r) = access.check_post(&headers) {
        return Some(Reply::refused(&r));
    }
    req.body()
        .size_hint()
        .exact()
        .filter(|&len| len > MAX_BODY as u64)
        .map(|_| Reply::json(too_large()))
}

/// A refusal, once the request's body is read (up to the limit, each
/// piece within the HTTP timeout): answered early, an HTTP/2 stream is
/// reset under a client still sending it, which then loses the answer
/// (curl: "stream error"); and an HTTP/1 connection stays usable.
async fn refuse(req: HttpRequest, reply: Reply, shared: &Shared) -> HttpResponse {
    let _ = read_body(req.into_body(), MAX_BODY, shared.http_timeout).await;
    respond(reply)
}

/// `POST /v1/rpc[/{action}]`: the body read (bounded), the call made,
/// the answer; as an NDJSON stream when the client accepts one.
async fn rpc(req: HttpRequest, action: Option<String>, shared: &Arc<Shared>) -> HttpResponse {
    let streamed = match stream::Options::of(&req) {
        Ok(o) => o,
        Err(reply) => return refuse(req, reply, shared).await,
    };
    let body = match read_body(req.into_body(), MAX_BODY, shared.http_timeout).await {
        Ok(b) => b,
        Err(reply) => return respond(reply),
    };
    if let Some(options) = streamed {
        return match parse_body(&body, action.as_deref()) {
            Ok(request) => {
                log_answered(request.action(), &request.target(), 200, true);
                stream::serve(request, options, shared)
            }
            Err(answer) => respond(Reply::json(answer)),
        };
    }
    let request = match parse_body(&body, action.as_deref()) {
        Ok(r) => r,
        Err(answer) => return respond(Reply::json(answer)),
    };
    let (action, target) = (request.action(), request.target());
    let reply = Reply::json(answer_json(shared.daemon.call(request).await));
    log_answered(action, &target, reply.status, false);
    respond(reply)
}

/// One line per call in the gateway's log: the action and the agent and
/// session its target names, and the HTTP status; never its params or
/// the token.
pub(crate) fn log_answered(action: &str, target: &str, status: u16, streamed: bool) {
    let (agent, session) = allox_protocol::target::agent_and_session(target);
    tracing::info!(action, agent, session, status, streamed, "request answered");
}

/// A client connection that ACKs what it reads at once.
///
/// A client that writes a request's head and body in two writes with
/// Nagle on (httpx with h11 does) sends the body only once the head is
/// ACKed; the kernel delays that ACK up to 40 ms hoping to send it with an
/// answer, which cannot come before the body. Quick-ACK mode lapses by
/// itself, so it is asked for again after each read.
struct QuickAck(tokio::net::TcpStream);

impl tokio::io::AsyncRead for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.0).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let _ = rustix::net::sockopt::set_tcp_quickack(&self.0, true);
        }
        polled
    }
}

impl tokio::io::AsyncWrite for QuickAck {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
