//! `GET` and `PUT /v1/files/{agent}/{session}/{path}`: a file's raw
//! bytes, streamed both ways.
//!
//! A `GET` asks `fs.read` for the first chunk, answers with the file's size
//! as its `Content-Length`, then reads on ([`Download`]) as the body is
//! written: at most one chunk of [`FS_CHUNK`] is held. A `PUT` hands the
//! body, as it comes ([`body::stream`]), to the upload `alloxctl cp`
//! makes ([`upload_from`]): chunks under an upload id, the last one
//! committing, so the target keeps its old content unless the whole body
//! came. Whether it did is checked before the commit: a `Content-Length`
//! body must have all its bytes, and a chunked one must end with the
//! connection still open (tiny_http's decoder takes a connection closed
//! inside a chunk for the end of the body).
//!
//! `?scope=shared` names the agent's shared files, `?checkpoint=ID` (`GET`
//! only) the tree as it was at that checkpoint. Path segments are
//! percent-decoded; what the path may be is the daemon's to say, and its
//! refusals come back with their status, as on `/v1/rpc`.

use super::access::Headers;
use super::body::{self, Piece, Stream};
use super::conn;
use super::{error, failure, json_response, send, send_reply, Ctx, Reply};
use crate::client::Caller;
use crate::files::{upload_from, CopyError, Remote};
use allox_protocol::json::answer_to_json;
use allox_protocol::{ErrorCode, FsData, FsRead, FsScope, Request, Response, FS_CHUNK};
use serde_json::json;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;
use thiserror::Error;

/// Where the files are served.
pub const FILES_PATH: &str = "/v1/files";
/// The methods served there.
pub const ALLOW: &str = "GET, PUT";

/// What a files request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Put,
}

/// A `GET` or `PUT` of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRequest {
    pub method: Method,
    pub target: Remote,
}

/// Why a files URL is not served.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum UrlError {
    #[error("{FILES_PATH} takes GET and PUT, not {0}")]
    Method(String),
    #[error("{0:?} names no agent and session: files are at {FILES_PATH}/{{agent}}/{{session}}/{{path}}")]
    Incomplete(String),
    #[error("{0:?} is not percent-encoded UTF-8")]
    Encoding(String),
    #[error("unknown query parameter {0:?}: files take checkpoint= and scope=")]
    Parameter(String),
    #[error("scope {0:?} is neither session nor shared")]
    Scope(String),
    #[error("a checkpoint is read-only: PUT takes no checkpoint=")]
    CheckpointWrite,
}

impl UrlError {
    /// The HTTP status answered.
    pub fn status(&self) -> u16 {
        match self {
            UrlError::Method(_) => 405,
            UrlError::Incomplete(_) => 404,
            _ => 400,
        }
    }

    fn code(&self) -> ErrorCode {
        match self {
            UrlError::Incomplete(_) => ErrorCode::NotFound,
            _ => ErrorCode::InvalidRequest,
        }
    }

    pub(super) fn reply(&self) -> Reply {
        let mut reply = Reply::json(error(self.status(), self.code(), self.to_string()));
        if self.status() == 405 {
            reply.headers.push(("Allow", ALLOW.into()));
        }
        reply
    }
}

/// Whether `path` (without its query) is below [`FILES_PATH`].
pub fn is_files_path(path: &str) -> bool {
    path.strip_prefix(FILES_PATH)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The request a method and URL below [`FILES_PATH`] make.
pub fn parse(method: &str, url: &str) -> Result<FileRequest, UrlError> {
    let method = match method {
        m if m.eq_ignore_ascii_case("GET") => Method::Get,
        m if m.eq_ignore_ascii_case("PUT") => Method::Put,
        m => return Err(UrlError::Method(m.to_owned())),
    };
    let url = url.split('#').next().unwrap_or(url);
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let incomplete = || UrlError::Incomplete(path.to_owned());
    let rest = path
        .strip_prefix(FILES_PATH)
        .and_then(|r| r.strip_prefix('/'))
        .ok_or_else(incomplete)?;
    let (agent, rest) = rest.split_once('/').ok_or_else(incomplete)?;
    // No path at all is an empty one: the daemon says what it makes of it.
    let (session, file) = rest.split_once('/').unwrap_or((rest, ""));
    if agent.is_empty() || session.is_empty() {
        return Err(incomplete());
    }
    let mut target = Remote {
        agent: decode(agent)?,
        session: decode(session)?,
        path: decode(file)?,
        scope: FsScope::Session,
        checkpoint: None,
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decode(value)?;
        match decode(key)?.as_str() {
            "checkpoint" => target.checkpoint = Some(value),
            "scope" => {
                target.scope = match value.as_str() {
                    "session" => FsScope::Session,
                    "shared" => FsScope::Shared,
                    _ => return Err(UrlError::Scope(value)),
                }
            }
            other => return Err(UrlError::Parameter(other.to_owned())),
        }
    }
    if method == Method::Put && target.checkpoint.is_some() {
        return Err(UrlError::CheckpointWrite);
    }
    Ok(FileRequest { method, target })
}

/// `%XX` escapes decoded (a `+` stays a `+`); the result must be UTF-8.
pub fn decode(s: &str) -> Result<String, UrlError> {
    let bad = || UrlError::Encoding(s.to_owned());
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).ok_or_else(bad)?;
            let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// Serves one files request that passed its route.
pub(super) fn serve(
    request: tiny_http::Request,
    f: FileRequest,
    ctx: &Ctx<'_>,
    daemon: &mut impl Caller,
) {
    let header = |name| super::header(&request, name);
    let headers = Headers {
        host: header("Host"),
        origin: header("Origin"),
        authorization: header("Authorization"),
        content_type: header("Content-Type"),
    };
    let origin = headers.origin.map(str::to_owned);
    if let Err(r) = ctx.access.check_files(&headers) {
        if f.method == Method::Put {
            // Its body is not wanted: shut reading, or tiny_http would
            // wait for all of it before it let the worker go.
            stop_reading(&request, ctx.port);
        }
        let _ = send_reply(request, Reply::refused(&r), origin.as_deref(), ctx.access);
        return;
    }
    match f.method {
        Method::Get => get(request, &f.target, ctx, daemon, origin.as_deref()),
        Method::Put => put(request, &f.target, ctx, daemon, origin.as_deref()),
    }
}

fn stop_reading(request: &tiny_http::Request, port: u16) {
    if let Some(c) = request.remote_addr().and_then(|&p| conn::find(p, port)) {
        c.stop_reading();
    }
}

fn read_request(target: &Remote, offset: u64, length: u64) -> Request {
    Request::FsRead(FsRead {
        agent_id: target.agent.clone(),
        session_id: target.session.clone(),
        scope: target.scope,
        checkpoint_id: target.checkpoint.clone(),
        path: target.path.clone(),
        offset: Some(offset),
        length: Some(length),
    })
}

/// One `fs.read`'s data, or the status and JSON body of its failure.
fn read_chunk(
    daemon: &mut impl Caller,
    target: &Remote,
    offset: u64,
    length: u64,
) -> Result<FsData, (u16, serde_json::Value)> {
    match daemon.call(read_request(target, offset, length)) {
        Ok(Ok(Response::FsData(d))) => Ok(d),
        Ok(Ok(_)) => Err(error(
            500,
            ErrorCode::Internal,
            format!(
                "{}: the daemon answered fs.read with something not data",
                target.path
            ),
        )),
        Ok(Err(body)) => Err((body.code.http_status(), answer_to_json(&Err(body)))),
        Err(e) => Err(failure(&e)),
    }
}

fn get(
    request: tiny_http::Request,
    target: &Remote,
    ctx: &Ctx<'_>,
    daemon: &mut impl Caller,
    origin: Option<&str>,
) {
    let first = match read_chunk(daemon, target, 0, FS_CHUNK) {
        Ok(d) => d,
        Err(answer) => {
            let _ = send_reply(request, Reply::json(answer), origin, ctx.access);
            return;
        }
    };
    let Ok(length) = usize::try_from(first.size) else {
        let answer = error(
            500,
            ErrorCode::Internal,
            format!("{}: {} bytes is too large to send", target.path, first.size),
        );
        let _ = send_reply(request, Reply::json(answer), origin, ctx.access);
        return;
    };
    let peer = request.remote_addr().copied();
    let mut download = Download::new(daemon, target, first);
    let response = tiny_http::Response::new(
        200.into(),
        vec![super::constant_header(
            "Content-Type",
            "application/octet-stream",
        )],
        &mut download,
        Some(length),
        None,
    )
    // A Content-Length, whatever the size: the client knows what to expect.
    .with_chunked_threshold(usize::MAX);
    let sent = send(request, response, &[], origin, ctx.access);
    if let Err(e) = sent {
        // The body is cut short of its Content-Length: end the connection,
        // or the client would wait for the rest.
        eprintln!("alloxctl gateway: GET {}: {e}", target.path);
        if let Some(c) = peer.and_then(|p| conn::find(p, ctx.port)) {
            c.hang_up();
        }
    }
}

/// A file read from the daemon chunk by chunk as it is sent: `fs.read`
/// at increasing offsets, up to the size the first answer gave.
pub struct Download<'a, C> {
    daemon: &'a mut C,
    target: &'a Remote,
    /// What the last answer brought, and how much of it was sent.
    chunk: Vec<u8>,
    sent: usize,
    /// The offset of the next `fs.read`.
    offset: u64,
    size: u64,
}

impl<'a, C: Caller> Download<'a, C> {
    /// Starting with `first`, the answer at offset 0.
    pub fn new(daemon: &'a mut C, target: &'a Remote, first: FsData) -> Self {
        let mut chunk = first.data.0;
        chunk.truncate(usize::try_from(first.size).unwrap_or(usize::MAX));
        Download {
            daemon,
            target,
            offset: chunk.len() as u64,
            chunk,
            sent: 0,
            size: first.size,
        }
    }
}

impl<C: Caller> Read for Download<'_, C> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.sent == self.chunk.len() {
            if self.offset >= self.size {
                return Ok(0);
            }
            let want = (self.size - self.offset).min(FS_CHUNK);
            let d = read_chunk(self.daemon, self.target, self.offset, want).map_err(|(_, v)| {
                io::Error::other(format!("fs.read at {}: {}", self.offset, v["error"]))
            })?;
            if d.data.is_empty() {
                // Fewer bytes than the Content-Length promised.
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "the file shrank to {} bytes while it was sent ({} promised)",
                        d.size, self.size
                    ),
                ));
            }
            self.chunk = d.data.0;
            self.chunk
                .truncate(usize::try_from(want).unwrap_or(usize::MAX));
            self.offset += self.chunk.len() as u64;
            self.sent = 0;
        }
        let n = buf.len().min(self.chunk.len() - self.sent);
        buf[..n].copy_from_slice(&self.chunk[self.sent..self.sent + n]);
        self.sent += n;
        Ok(n)
    }
}

fn put(
    request: tiny_http::Request,
    target: &Remote,
    ctx: &Ctx<'_>,
    daemon: &mut impl Caller,
    origin: Option<&str>,
) {
    let ending = match (
        request.body_length(),
        super::header(&request, "Transfer-Encoding"),
    ) {
        (_, Some(_)) => Ending::Chunked {
            peer: request.remote_addr().copied(),
            port: ctx.port,
        },
        (n, None) => Ending::Length(n.unwrap_or(0) as u64),
    };
    let (pieces, answer) = match body::stream(request, ctx.http_timeout) {
        Stream::Reading { pieces, answer } => (pieces, answer),
        Stream::Busy(request) => {
            stop_reading(&request, ctx.port);
            let reply = Reply::json(error(
                503,
                ErrorCode::Unavailable,
                "too many clients are slow to send their request bodies; try again later".into(),
            ));
            let _ = send_reply(request, reply, origin, ctx.access);
            return;
        }
        Stream::Failed => return,
    };
    let mut body = Pieces {
        rx: pieces,
        timeout: ctx.http_timeout,
        piece: Vec::new(),
        taken: 0,
        ending,
    };
    let (status, value) = match upload_from(daemon, &mut body, Path::new("request body"), target) {
        Ok(w) => (200, json!({ "path": w.path, "size": w.size })),
        Err(e) => upload_failure(e, ctx.http_timeout),
    };
    // Its thread gives the answer once it stops reading; the rest of the
    // body, if any, is not wanted.
    drop(body);
    let mut response = json_response(status, Some(value));
    super::decorate(&mut response, &[], origin, ctx.access);
    let _ = answer.send(response);
}

fn upload_failure(e: CopyError, timeout: Duration) -> (u16, serde_json::Value) {
    match e {
        CopyError::Daemon { body, .. } => (body.code.http_status(), answer_to_json(&Err(body))),
        CopyError::Transport(e) => failure(&e),
        CopyError::Local { source, .. } if source.kind() == io::ErrorKind::TimedOut => error(
            408,
            ErrorCode::InvalidRequest,
            format!(
                "the request body stalled for {} ms; the file was not changed",
                timeout.as_millis()
            ),
        ),
        CopyError::Local { source, .. } => error(
            400,
            ErrorCode::InvalidRequest,
            format!("cannot read the request body ({source}); the file was not changed"),
        ),
        CopyError::Other(m) => error(500, ErrorCode::Internal, m),
    }
}

/// How to tell a whole body from one cut short.
enum Ending {
    /// All of its `Content-Length` came.
    Length(u64),
    /// Chunked: the connection is still open after its end.
    Chunked { peer: Option<SocketAddr>, port: u16 },
}

/// A streamed body as a reader: each piece waited for at most `timeout`;
/// its end is an end only if the body was whole.
struct Pieces {
    rx: mpsc::Receiver<Piece>,
    timeout: Duration,
    piece: Vec<u8>,
    taken: usize,
    ending: Ending,
}

impl Pieces {
    fn check_end(&self, total: u64) -> io::Result<()> {
        let cut = |why: String| Err(io::Error::new(io::ErrorKind::UnexpectedEof, why));
        match self.ending {
            Ending::Length(n) if total < n => cut(format!(
                "it ended after {total} of the {n} bytes its Content-Length promised"
            )),
            Ending::Length(_) => Ok(()),
            Ending::Chunked { peer, port } => match peer.and_then(|p| conn::find(p, port)) {
                Some(c) if !c.closed_by_peer() => Ok(()),
                Some(_) => cut(format!(
                    "the connection closed after {total} bytes, which may be inside a chunk"
                )),
                None => cut(format!(
                    "the connection was gone after {total} bytes, or could not be found to see whether the chunked body was whole"
                )),
            },
        }
    }
}

impl Read for Pieces {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.taken == self.piece.len() {
            match self.rx.recv_timeout(self.timeout) {
                Ok(Piece::Data(d)) => {
                    self.piece = d;
                    self.taken = 0;
                }
                Ok(Piece::End(Ok(()), total)) => {
                    self.check_end(total)?;
                    return Ok(0);
                }
                Ok(Piece::End(Err(e), _)) => return Err(e),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no more of the body came in time",
                    ))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "the body's reader went",
                    ))
                }
            }
        }
        let n = buf.len().min(self.piece.len() - self.taken);
        buf[..n].copy_from_slice(&self.piece[self.taken..self.taken + n]);
        self.taken += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Answer, ClientError};
    use allox_protocol::{Bytes, ErrorBody, FsWritten};

    fn target(path: &str) -> Remote {
        Remote {
            agent: "a".into(),
            session: "s".into(),
            path: path.into(),
            scope: FsScope::Session,
            checkpoint: None,
        }
    }

    #[test]
    fn urls_name_agent_session_and_a_decoded_path() {
        let f = parse("GET", "/v1/files/a/s/src/main.py").unwrap();
        assert_eq!(f.method, Method::Get);
        assert_eq!(f.target, target("src/main.py"));
        let f = parse(
            "put",
            "/v1/files/ag%2Dx/s%201/d%2Fe/with%20space+plus%C3%A9",
        )
        .unwrap();
        assert_eq!(f.method, Method::Put);
        assert_eq!(
            (f.target.agent.as_str(), f.target.session.as_str()),
            ("ag-x", "s 1")
        );
        assert_eq!(f.target.path, "d/e/with space+plusé");
        // No path, or an empty one, is the daemon's to refuse.
        assert_eq!(parse("GET", "/v1/files/a/s").unwrap().target.path, "");
        assert_eq!(parse("GET", "/v1/files/a/s/").unwrap().target.path, "");
        // `..` too: it is passed on as it is.
        assert_eq!(
            parse("GET", "/v1/files/a/s/x/../../y").unwrap().target.path,
            "x/../../y"
        );
    }

    #[test]
    fn query_names_scope_and_checkpoint() {
        let f = parse("GET", "/v1/files/a/s/f?checkpoint=c%201&scope=shared").unwrap();
        assert_eq!(f.target.checkpoint.as_deref(), Some("c 1"));
        assert_eq!(f.target.scope, FsScope::Shared);
        let f = parse("PUT", "/v1/files/a/s/f?scope=session&").unwrap();
        assert_eq!(f.target.scope, FsScope::Session);
        assert_eq!(
            parse("GET", "/v1/files/a/s/f?scope=all"),
            Err(UrlError::Scope("all".into()))
        );
        assert_eq!(
            parse("GET", "/v1/files/a/s/f?offset=3"),
            Err(UrlError::Parameter("offset".into()))
        );
        assert_eq!(
            parse("PUT", "/v1/files/a/s/f?checkpoint=c1"),
            Err(UrlError::CheckpointWrite)
        );
    }

    #[test]
    fn bad_urls_and_methods_are_refused_with_their_status() {
        for (method, url, status) in [
            ("POST", "/v1/files/a/s/f", 405),
            ("DELETE", "/v1/files/a/s/f", 405),
            ("OPTIONS", "/v1/files/a/s/f", 405),
            ("GET", "/v1/files", 404),
            ("GET", "/v1/files/", 404),
            ("GET", "/v1/files/a", 404),
            ("GET", "/v1/files//s/f", 404),
            ("GET", "/v1/files/a//f", 404),
            ("GET", "/v1/files/a/s/%zz", 400),
            ("GET", "/v1/files/a/s/%e9", 400),
            ("GET", "/v1/files/a/s/f%", 400),
        ] {
            let e = parse(method, url).unwrap_err();
            assert_eq!(e.status(), status, "{method} {url}: {e}");
            let reply = e.reply();
            assert_eq!(reply.status, status);
            let allow = reply
                .headers
                .iter()
                .any(|(n, v)| *n == "Allow" && v == ALLOW);
            assert_eq!(allow, status == 405, "{method} {url}");
        }
        assert!(is_files_path("/v1/files"));
        assert!(is_files_path("/v1/files/a/s/f"));
        assert!(!is_files_path("/v1/filesx"));
        assert!(!is_files_path("/v1/rpc"));
    }

    /// A fake daemon holding one file of `size` bytes, `i as u8` at `i`,
    /// that notes the largest read it answered.
    struct File {
        size: u64,
        largest: usize,
        reads: usize,
    }

    impl Caller for File {
        fn call(&mut self, request: Request) -> Result<Answer, ClientError> {
            let Request::FsRead(r) = request else {
                return Ok(Err(ErrorBody::new(ErrorCode::Unsupported, "not a read")));
            };
            if r.path != "f" {
                return Ok(Err(ErrorBody::new(ErrorCode::NotFound, "no such file")));
            }
            let offset = r.offset.unwrap_or(0);
            let end = (offset + r.length.unwrap_or(FS_CHUNK).min(FS_CHUNK)).min(self.size);
            let data: Vec<u8> = (offset..end).map(|i| i as u8).collect();
            self.largest = self.largest.max(data.len());
            self.reads += 1;
            Ok(Ok(Response::FsData(FsData {
                path: r.path,
                offset,
                eof: end == self.size,
                size: self.size,
                data: Bytes(data),
            })))
        }
    }

    #[test]
    fn a_download_reads_chunk_by_chunk_as_it_is_sent() {
        let size = 3 * FS_CHUNK + 17;
        let mut daemon = File {
            size,
            largest: 0,
            reads: 0,
        };
        let t = target("f");
        let first = read_chunk(&mut daemon, &t, 0, FS_CHUNK).unwrap();
        let mut d = Download::new(&mut daemon, &t, first);
        let mut got = Vec::new();
        let mut buf = vec![0u8; 8192];
        loop {
            let n = d.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got.len() as u64, size);
        assert!(got.iter().enumerate().all(|(i, &b)| b == i as u8));
        assert_eq!(daemon.reads, 4);
        assert!(daemon.largest <= FS_CHUNK as usize);
        // A missing file is the daemon's error, with its status.
        let (status, v) = read_chunk(&mut daemon, &target("g"), 0, FS_CHUNK).unwrap_err();
        assert_eq!((status, &v["error"]["code"]), (404, &"not_found".into()));
    }

    #[test]
    fn a_file_that_shrinks_while_it_is_sent_is_an_error_not_a_short_body() {
        let mut daemon = File {
            size: 2 * FS_CHUNK,
            largest: 0,
            reads: 0,
        };
        let t = target("f");
        let first = read_chunk(&mut daemon, &t, 0, FS_CHUNK).unwrap();
        daemon.size = FS_CHUNK;
        let mut d = Download::new(&mut daemon, &t, first);
        let mut sink = Vec::new();
        let e = io::copy(&mut d, &mut sink).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(sink.len() as u64, FS_CHUNK);
    }

    /// Records the chunks of an upload.
    #[derive(Default)]
    struct Uploads {
        chunks: Vec<(u64, usize, bool)>,
    }

    impl Caller for Uploads {
        fn call(&mut self, request: Request) -> Result<Answer, ClientError> {
            let Request::FsWrite(w) = request else {
                return Ok(Err(ErrorBody::new(ErrorCode::Unsupported, "not a write")));
            };
            let offset = w.offset.unwrap_or(0);
            self.chunks.push((offset, w.data.len(), w.commit));
            Ok(Ok(Response::FsWritten(FsWritten {
                path: w.path,
                size: offset + w.data.len() as u64,
                committed: w.commit,
            })))
        }
    }

    fn pieces(parts: Vec<Piece>, ending: Ending) -> Pieces {
        let (tx, rx) = mpsc::sync_channel(parts.len() + 1);
        for p in parts {
            tx.send(p).unwrap();
        }
        Pieces {
            rx,
            timeout: Duration::from_millis(100),
            piece: Vec::new(),
            taken: 0,
            ending,
        }
    }

    #[test]
    fn a_whole_body_is_uploaded_in_chunks_and_committed_last() {
        let size = 2 * FS_CHUNK as usize + 1000;
        let parts: Vec<Piece> = vec![0u8; size]
            .chunks(body::PIECE)
            .map(|c| Piece::Data(c.to_vec()))
            .chain([Piece::End(Ok(()), size as u64)])
            .collect();
        let mut body = pieces(parts, Ending::Length(size as u64));
        let mut daemon = Uploads::default();
        let w = upload_from(&mut daemon, &mut body, Path::new("body"), &target("f")).unwrap();
        assert_eq!(w.size, size as u64);
        let c = FS_CHUNK as usize;
        assert_eq!(
            daemon.chunks,
            [
                (0, c, false),
                (FS_CHUNK, c, false),
                (2 * FS_CHUNK, 1000, true)
            ]
        );
    }

    #[test]
    fn a_body_cut_short_or_stalled_is_never_committed() {
        for (parts, ending, kind) in [
            // Fewer bytes than its Content-Length.
            (
                vec![Piece::Data(vec![1; 10]), Piece::End(Ok(()), 10)],
                Ending::Length(20),
                io::ErrorKind::UnexpectedEof,
            ),
            // Chunked, on a connection that cannot be found (it is gone).
            (
                vec![Piece::Data(vec![1; 10]), Piece::End(Ok(()), 10)],
                Ending::Chunked {
                    peer: Some("127.0.0.1:9".parse().unwrap()),
                    port: 9,
                },
                io::ErrorKind::UnexpectedEof,
            ),
            // A read error.
            (
                vec![
                    Piece::Data(vec![1; 10]),
                    Piece::End(Err(io::ErrorKind::ConnectionReset.into()), 10),
                ],
                Ending::Length(20),
                io::ErrorKind::ConnectionReset,
            ),
            // Nothing more comes.
            (
                vec![Piece::Data(vec![1; 10])],
                Ending::Length(20),
                io::ErrorKind::TimedOut,
            ),
        ] {
            let (tx, rx) = mpsc::sync_channel(4);
            for p in parts {
                tx.send(p).unwrap();
            }
            let mut body = Pieces {
                rx,
                timeout: Duration::from_millis(100),
                piece: Vec::new(),
                taken: 0,
                ending,
            };
            let mut daemon = Uploads::default();
            let e =
                upload_from(&mut daemon, &mut body, Path::new("body"), &target("f")).unwrap_err();
            let CopyError::Local { source, .. } = &e else {
                panic!("{e}");
            };
            assert_eq!(source.kind(), kind, "{e}");
            assert!(daemon.chunks.is_empty(), "{:?}", daemon.chunks);
            let (status, _) = upload_failure(e, Duration::from_millis(100));
            let want = if kind == io::ErrorKind::TimedOut {
                408
            } else {
                400
            };
            assert_eq!(status, want);
            drop(tx);
        }
    }

    #[test]
    fn the_daemon_s_refusal_of_an_upload_keeps_its_status() {
        let (status, v) = upload_failure(
            CopyError::Daemon {
                what: "../x".into(),
                body: ErrorBody::new(ErrorCode::InvalidRequest, "`..` is not allowed"),
            },
            Duration::from_secs(1),
        );
        assert_eq!(
            (status, &v["error"]["code"]),
            (400, &"invalid_request".into())
        );
    }
}
