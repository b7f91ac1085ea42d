//! The HTTP side's plain parts every route is served with: the request
//! and response types, a request's headers and body (read piece by piece,
//! bounded), and building answers.

use crate::access::Headers;
use crate::{error, too_large, Reply};
use allox_protocol::ErrorCode;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::CONTENT_TYPE;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// A response body: whole, or streamed from a channel.
pub type Body = http_body_util::combinators::BoxBody<Bytes, io::Error>;
pub type HttpRequest = hyper::Request<Incoming>;
pub type HttpResponse = hyper::Response<Body>;

pub fn header<'a>(req: &'a HttpRequest, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// The headers access is decided on; over HTTP/2 the host is the URL's
/// authority.
pub fn headers_of(req: &HttpRequest) -> Headers<'_> {
    Headers {
        host: header(req, "Host").or_else(|| req.uri().authority().map(|a| a.as_str())),
        origin: header(req, "Origin"),
        authorization: header(req, "Authorization"),
        content_type: header(req, "Content-Type"),
    }
}

/// The next piece of a body, waited for at most `timeout`: `None` at its
/// end.
pub async fn next_piece(body: &mut Incoming, timeout: Duration) -> io::Result<Option<Bytes>> {
    loop {
        match tokio::time::timeout(timeout, body.frame()).await {
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no more of the body came in time",
                ))
            }
            Ok(None) => return Ok(None),
            Ok(Some(Err(e))) => return Err(io::Error::other(e)),
            Ok(Some(Ok(frame))) => {
                // Trailers are not data.
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// A whole body of at most `limit` bytes.
pub async fn read_body(
    mut body: Incoming,
    limit: usize,
    timeout: Duration,
) -> Result<Vec<u8>, Reply> {
    let mut out = Vec::new();
    loop {
        match next_piece(&mut body, timeout).await {
            Ok(Some(data)) => {
                out.extend_from_slice(&data);
                if out.len() > limit {
                    return Err(Reply::json(too_large()));
                }
            }
            Ok(None) => return Ok(out),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                return Err(Reply::json(error(
                    408,
                    ErrorCode::InvalidRequest,
                    format!("the request body stalled for {} ms", timeout.as_millis()),
                )))
            }
            Err(e) => {
                return Err(Reply::json(error(
                    400,
                    ErrorCode::InvalidRequest,
                    format!("cannot read the request body: {e}"),
                )))
            }
        }
    }
}

/// A whole body.
pub fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed()
}

/// The HTTP response of a [`Reply`].
pub fn respond(reply: Reply) -> HttpResponse {
    let mut b = hyper::Response::builder().status(reply.status);
    for (name, value) in &reply.headers {
        b = b.header(*name, value.as_str());
    }
    let built = match reply.body {
        Some(v) => b
            .header(CONTENT_TYPE, "application/json")
            .body(full(v.to_string())),
        None => b.body(full(Bytes::new())),
    };
    built.unwrap_or_else(|e| {
        let mut r = hyper::Response::new(full(format!("cannot build the answer: {e}")));
        *r.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
        r
    })
}

/// A body fed through a channel by a thread: pieces as they come, an
/// error to cut it (the connection is then ended, so a client never takes
/// a short body for a whole one).
pub struct ChannelBody {
    pub rx: tokio::sync::mpsc::Receiver<io::Result<Bytes>>,
    /// Its length, when known in advance.
    pub length: Option<u64>,
    /// Told when the body is dropped: sent whole, or its client gone.
    pub dropped: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for ChannelBody {
    fn drop(&mut self) {
        if let Some(tx) = self.dropped.take() {
            let _ = tx.send(());
        }
    }
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|piece| piece.map(|r| r.map(Frame::data)))
    }

    fn size_hint(&self) -> SizeHint {
        self.length.map(SizeHint::with_exact).unwrap_or_default()
    }
}
