//! Streamed answers: `POST /v1/rpc` with `Accept: application/x-ndjson`.
//!
//! The answer is `200` with one JSON object a line, each sent as soon as
//! it is known: `{"event": E}` for each stream event of the request, in
//! the order the daemon sent them (a streamed run's `started` and its
//! `output` chunks, a follow's `process`, `network` or `monitor` records,
//! `fs.watch`'s `fs` changes), then exactly one last line, the request's
//! answer as on the plain path: `{"result": R}` or `{"error": {...}}`. A
//! stream that ends without that line was cut (the gateway or the daemon
//! went away). What is refused before the call (access, a bad body) is
//! answered as on the plain path, with its status.
//!
//! A stream holds a daemon connection of its own, with no timeout (a
//! follow may be quiet for hours). When its client goes away, that
//! connection is closed, which ends the daemon's subscription; a streamed
//! run goes on (it is the session's, not the connection's), unless the
//! request said `Allox-On-Disconnect: kill`: the daemon is then asked
//! `on_disconnect: kill` (a run the connection follows dies with it, so
//! with the gateway too), and the gateway kills the run it started.

use crate::body::{respond, ChannelBody, HttpRequest, HttpResponse};
use crate::shared::Shared;
use crate::{error, failure, Reply};
use allox_client::client::Client;
use allox_protocol::json::answer_to_json;
use allox_protocol::{ErrorCode, Event, ProcessKill, Request};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The media type of a stream.
pub const NDJSON: &str = "application/x-ndjson";
/// The header that asks for a streamed run to be killed when its client
/// goes away.
pub const ON_DISCONNECT: &str = "Allox-On-Disconnect";
/// Lines held for a slow client before the daemon's events wait.
const LINES_AHEAD: usize = 16;

/// What a streamed request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Kill the run the request started if the client goes away first.
    pub kill_on_disconnect: bool,
}

impl Options {
    /// `Some` when the client accepts NDJSON; a bad
    /// `Allox-On-Disconnect` is refused, naming the values it takes.
    pub fn of(req: &HttpRequest) -> Result<Option<Options>, Reply> {
        let accepts = req
            .headers()
            .get_all("Accept")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|m| {
                m.split(';')
                    .next()
                    .is_some_and(|m| m.trim().eq_ignore_ascii_case(NDJSON))
            });
        let on_disconnect = req
            .headers()
            .get(ON_DISCONNECT)
            .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase());
        let kill_on_disconnect = match on_disconnect.as_deref() {
            None | Some("keep") => false,
            Some("kill") => true,
            Some(other) => {
                return Err(Reply::json(error(
                    400,
                    ErrorCode::InvalidRequest,
                    format!("{ON_DISCONNECT}: {other:?} is neither keep nor kill"),
                )))
            }
        };
        if !accepts && kill_on_disconnect {
            return Err(Reply::json(error(
                400,
                ErrorCode::InvalidRequest,
                format!("{ON_DISCONNECT} applies to streams: send Accept: {NDJSON}"),
            )));
        }
        Ok(accepts.then_some(Options { kill_on_disconnect }))
    }
}

/// One line of a stream.
fn line(v: &Value) -> Bytes {
    let mut text = v.to_string();
    text.push('\n');
    Bytes::from(text)
}

/// The JSON line of an event.
pub fn event_line(event: &Event) -> Value {
    json!({ "event": event })
}

/// Starts `request` on a daemon connection of its own and answers with
/// the stream of its events and its answer.
pub fn serve(mut request: Request, options: Options, shared: &Arc<Shared>) -> HttpResponse {
    // The daemon is asked too, where it can be (a run its connection
    // follows): the stream's connection then ends with the gateway however
    // the gateway goes (killed, or its own stop cutting the stream), and
    // the run with it. It went on for ever when only the gateway's kill
    // below was there to end it.
    if let Request::ProcessStart(p) = &mut request {
        if options.kill_on_disconnect && p.wait && p.stream {
            p.on_disconnect = allox_protocol::OnDisconnect::Kill;
        }
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(LINES_AHEAD);
    let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel();
    let (closer_tx, closer_rx) = tokio::sync::oneshot::channel();
    let finished = Arc::new(AtomicBool::new(false));
    let run = Arc::new(Mutex::new(None::<String>));
    let socket = shared.socket.clone();
    // Whose run a kill on disconnect would be.
    let owner = match &request {
        Request::ProcessStart(p) => Some((p.agent_id.clone(), p.session_id.clone())),
        _ => None,
    };
    {
        let (finished, run) = (Arc::clone(&finished), Arc::clone(&run));
        tokio::task::spawn_blocking(move || {
            let mut client = match Client::connect_pipelined(&socket, None) {
                Ok(c) => c,
                Err(e) => {
                    finished.store(true, Ordering::SeqCst);
                    let _ = tx.blocking_send(Ok(line(&failure(&e).1)));
                    return;
                }
            };
            if let Ok(c) = client.closer() {
                let _ = closer_tx.send(c);
            }
            let answer = client.call_with_events(request, |event| {
                if let Event::Started(s) = &event {
                    *run.lock().unwrap_or_else(|e| e.into_inner()) = Some(s.run_id.clone());
                }
                // A client gone: the watcher below closes the connection,
                // which ends this call.
                let _ = tx.blocking_send(Ok(line(&event_line(&event))));
            });
            finished.store(true, Ordering::SeqCst);
            let last = match answer {
                Ok(answer) => answer_to_json(&answer),
                Err(e) => failure(&e).1,
            };
            let _ = tx.blocking_send(Ok(line(&last)));
        });
    }
    // When the body is dropped before the answer came, its client went.
    let kill = options.kill_on_disconnect.then(|| Arc::clone(shared));
    tokio::spawn(async move {
        let _ = dropped_rx.await;
        if finished.load(Ordering::SeqCst) {
            return;
        }
        if let Ok(c) = closer_rx.await {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        let run = run.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let (Some(shared), Some(run), Some((agent_id, session_id))) = (kill, run, owner) {
            let kill = Request::ProcessKill(ProcessKill {
                agent_id,
                session_id,
                run_id: Some(run),
                signal: None,
            });
            let _ = shared
                .with_daemon(move |d| allox_client::Caller::call(d, kill))
                .await;
        }
    });
    let body = ChannelBody {
        rx,
        length: None,
        dropped: Some(dropped_tx),
    };
    hyper::Response::builder()
        .status(200)
        .header("Content-Type", NDJSON)
        .header("Cache-Control", "no-store")
        .body(body.boxed())
        .unwrap_or_else(|e| respond(Reply::json(error(500, ErrorCode::Internal, e.to_string()))))
}
