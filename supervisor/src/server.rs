//! The control server: many clients, many requests per connection, no
//! client able to hold up another.
//!
//! Per connection, a reader task decodes frames and starts one task per
//! request (at most [`Limits::inflight`] at once; beyond that the reader
//! stops reading, which pushes back on the client), and a writer task sends
//! answers in the order they finish. A client that stalls mid-frame, never
//! reads its answers, or keeps sending garbage is disconnected; store work
//! runs on the blocking pool, never on the tasks that do I/O.

use crate::dispatch::Supervisor;
use crate::peer::{Peer, PeerPolicy, Refusals};
use allox_protocol::{
    decode, encode, ClientFrame, ErrorBody, ErrorCode, Event, EventEnvelope, FrameReader, Hello,
    Outcome, Request, ResponseEnvelope, ServerFrame, PROTOCOL_VERSION,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, Semaphore};

#[derive(Debug, Clone)]
pub struct Limits {
    /// Requests of one connection being worked on at once.
    pub inflight: usize,
    /// How long a half-received frame may wait for its next byte.
    pub stall: Duration,
    /// How long one answer may take to be written (a client that does not
    /// read is dropped after this).
    pub write: Duration,
    /// Bad frames tolerated on one connection before it is dropped.
    pub bad_frames: u32,
    /// Connections served at once; more wait in the listen queue.
    pub connections: usize,
    /// How long a new connection may take to say Hello.
    pub hello: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            inflight: 64,
            stall: Duration::from_secs(10),
            write: Duration::from_secs(10),
            bad_frames: 16,
            connections: 256,
            hello: Duration::from_secs(10),
        }
    }
}

/// Accepts connections until the task is dropped, serving the peers that
/// `peers` allows and refusing the others ([`crate::peer`]).
pub async fn serve_unix(
    listener: UnixListener,
    sup: Arc<Supervisor>,
    limits: Limits,
    peers: PeerPolicy,
) {
    let slots = Arc::new(Semaphore::new(limits.connections));
    let mut refusals = Refusals::default();
    loop {
        // At the limit, stop accepting: new clients wait in the backlog
        // instead of taking file descriptors the store needs.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                let who = Peer::of(&stream);
                if !who.admitted(&peers) {
                    refusals.refuse(stream, &who, &sup);
                    continue;
                }
                let peer = who.label();
                let (r, w) = stream.into_split();
                let (sup, limits) = (sup.clone(), limits.clone());
                tokio::spawn(async move {
                    connection(r, w, peer, sup, limits).await;
                    drop(slot);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn error_frame(request_id: u64, code: ErrorCode, msg: String) -> ServerFrame {
    ServerFrame::Response(ResponseEnvelope {
        request_id,
        outcome: Outcome::Err(ErrorBody::new(code, msg)),
    })
}

fn frame_bytes(f: &ServerFrame) -> Vec<u8> {
    match encode(f) {
        Ok(b) => b,
        Err(e) => {
            let id = match f {
                ServerFrame::Response(r) => r.request_id,
                ServerFrame::Event(ev) => ev.request_id,
                _ => 0,
            };
            let fallback = error_frame(
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
    serve_stream(rd, wr, peer, sup, limits, Transport::Socket).await
}

/// Serves a byte stream until it ends ([`Transport::Socket`]) or for ever
/// ([`Transport::Serial`]).
pub async fn serve_stream<R, W>(
    mut rd: R,
    mut wr: W,
    peer: String,
    sup: Arc<Supervisor>,
    limits: Limits,
    transport: Transport,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(256);
    let write_limit = limits.write;
    let wpeer = peer.clone();
    let serial = transport == Transport::Serial;
    let writer = tokio::spawn(async move {
        while let Some(bytes) = rx.recv().await {
            match tokio::time::timeout(write_limit, wr.write_all(&bytes)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) if serial => {
                    // No host reads the port: this answer is lost, the
                    // next host gets the next ones.
                    tracing::debug!(peer = %wpeer, "answer dropped: no host reads the port");
                }
                Ok(Err(e)) => {
                    tracing::debug!(peer = %wpeer, error = %e, "write failed; closing");
                    break;
                }
                Err(_) => {
                    tracing::warn!(peer = %wpeer, "client does not read its answers; closing");
                    break;
                }
            }
        }
    });

    if serial {
        // A host still waiting on the other end was talking to a supervisor
        // that is gone: its request has no answer coming. An error with
        // request id 0 ends its wait; a host that is saying Hello skips it.
        let f = error_frame(
            0,
            ErrorCode::Unavailable,
            "the supervisor (re)started: a request in flight before this has no answer; whether it was applied shows in the store (it is whole or not at all)".into(),
        );
        let mut bytes = vec![0];
        bytes.extend(frame_bytes(&f));
        let _ = tx.send(bytes).await;
    }
    let sem = Arc::new(Semaphore::new(limits.inflight));
    let mut reader = FrameReader::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut greeted = false;
    let mut bad = 0u32;
    'conn: loop {
        // A serial port waits for its next host without a deadline.
        let n = if reader.pending() > 0 || (!greeted && !serial) {
            let limit = if greeted { limits.stall } else { limits.hello };
            match tokio::time::timeout(limit, rd.read(&mut buf)).await {
                Ok(r) => r,
                Err(_) if serial => {
                    tracing::debug!(%peer, "torn frame dropped: the host stopped mid-frame");
                    (reader, greeted, bad) = (FrameReader::new(), false, 0);
                    continue;
                }
                Err(_) => {
                    tracing::warn!(%peer, greeted, "client stalled; closing");
                    break;
                }
            }
        } else {
            rd.read(&mut buf).await
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
        reader.push(&buf[..n]);
        while let Some(frame) = reader.next_frame() {
            let msg = frame
                .map_err(|e| e.to_string())
                .and_then(|p| decode::<ClientFrame>(&p).map_err(|e| format!("{e}")));
            let msg = match msg {
                Ok(m) => m,
                Err(why) => {
                    bad += 1;
                    let f = error_frame(
                        0,
                        ErrorCode::InvalidRequest,
                        format!("unreadable frame: {why}"),
                    );
                    if tx.send(frame_bytes(&f)).await.is_err() {
                        break 'conn;
                    }
                    if bad > limits.bad_frames && serial {
                        tracing::warn!(%peer, bad, "too many bad frames; starting over");
                        (reader, greeted, bad) = (FrameReader::new(), false, 0);
                        continue 'conn;
                    }
                    if bad > limits.bad_frames {
                        tracing::warn!(%peer, bad, "too many bad frames; closing");
                        break 'conn;
                    }
                    continue;
                }
            };
            match (greeted, msg) {
                (false, ClientFrame::Hello(h)) => {
                    if h.version != PROTOCOL_VERSION {
                        let f = ServerFrame::Refused(ErrorBody::new(
                            ErrorCode::VersionMismatch,
                            format!(
                                "client speaks protocol {} ({}), this supervisor speaks {} ({}); use matching builds",
                                h.version,
                                h.build,
                                PROTOCOL_VERSION,
                                allox_protocol::build_identity()
                            ),
                        ));
                        let _ = tx.send(frame_bytes(&f)).await;
                        if serial {
                            (reader, greeted, bad) = (FrameReader::new(), false, 0);
                            continue 'conn;
                        }
                        break 'conn;
                    }
                    greeted = true;
                    let f = ServerFrame::Welcome(Hello {
                        version: PROTOCOL_VERSION,
                        build: allox_protocol::build_identity(),
                    });
                    if tx.send(frame_bytes(&f)).await.is_err() {
                        break 'conn;
                    }
                }
                (false, ClientFrame::Request(_)) => {
                    let f = ServerFrame::Refused(ErrorBody::invalid(
                        "the first frame must be Hello; nothing else is accepted before it",
                    ));
                    let _ = tx.send(frame_bytes(&f)).await;
                    if serial {
                        (reader, greeted, bad) = (FrameReader::new(), false, 0);
                        continue 'conn;
                    }
                    break 'conn;
                }
                (true, ClientFrame::Hello(h)) => {
                    // On a serial port a host that reconnects can reach us
                    // before its predecessor's end does: a new Hello starts
                    // a new conversation (requests already running finish).
                    let f = if h.version == PROTOCOL_VERSION {
                        bad = 0;
                        ServerFrame::Welcome(Hello {
                            version: PROTOCOL_VERSION,
                            build: allox_protocol::build_identity(),
                        })
                    } else {
                        error_frame(
                            0,
                            ErrorCode::VersionMismatch,
                            format!(
                            "client speaks protocol {}, this supervisor speaks {PROTOCOL_VERSION}",
                            h.version
                        ),
                        )
                    };
                    if tx.send(frame_bytes(&f)).await.is_err() {
                        break 'conn;
                    }
                }
                (true, ClientFrame::Request(env)) => {
                    let Ok(permit) = sem.clone().acquire_owned().await else {
                        break 'conn;
                    };
                    let (id, req) = (env.request_id, env.request);
                    if let Request::Ping(_) = req {
                        // Cheap and lock-free: answered on the I/O task.
                        let out = sup.handle(&peer, id, &req);
                        let f = ServerFrame::Response(ResponseEnvelope {
                            request_id: id,
                            outcome: out.into(),
                        });
                        drop(permit);
                        if tx.send(frame_bytes(&f)).await.is_err() {
                            break 'conn;
                        }
                        continue;
                    }
                    if Supervisor::is_process_request(&req) {
                        let (sup, tx, peer) = (sup.clone(), tx.clone(), peer.clone());
                        tokio::spawn(async move {
                            // Stream events go out as frames tagged with the
                            // request; a slow client slows the run, not us.
                            let (etx, mut erx) = mpsc::channel::<Event>(16);
                            let ftx = tx.clone();
                            let forward = tokio::spawn(async move {
                                while let Some(event) = erx.recv().await {
                                    let f = ServerFrame::Event(EventEnvelope {
                                        request_id: id,
                                        event,
                                    });
                                    if ftx.send(frame_bytes(&f)).await.is_err() {
                                        break;
                                    }
                                }
                            });
                            let out = sup.handle_process(&peer, id, &req, Some(etx)).await;
                            // Events come before the answer; the run's
                            // readers are stopped when it ends, but never
                            // wait on them for long.
                            let _ = tokio::time::timeout(Duration::from_secs(5), forward).await;
                            let f = ServerFrame::Response(ResponseEnvelope {
                                request_id: id,
                                outcome: out.into(),
                            });
                            let _ = tx.send(frame_bytes(&f)).await;
                            drop(permit);
                        });
                        continue;
                    }
                    let (sup, tx, peer) = (sup.clone(), tx.clone(), peer.clone());
                    tokio::spawn(async move {
                        let out = tokio::task::spawn_blocking(move || sup.handle(&peer, id, &req))
                            .await
                            .unwrap_or_else(|e| {
                                Err(ErrorBody::new(
                                    ErrorCode::Internal,
                                    format!("request handler failed: {e}"),
                                ))
                            });
                        let f = ServerFrame::Response(ResponseEnvelope {
                            request_id: id,
                            outcome: out.into(),
                        });
                        let _ = tx.send(frame_bytes(&f)).await;
                        drop(permit);
                    });
                }
            }
        }
    }
    drop(tx);
    // Answers already being worked on still go out if the client reads.
    let _ = tokio::time::timeout(limits.write, writer).await;
}
