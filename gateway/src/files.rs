//! `GET` and `PUT /v1/files/{agent}/{session}/{path}`: a file's raw
//! bytes, streamed both ways.
//!
//! A `GET` asks `fs.read` for the first chunk, answers with the file's size
//! as its `Content-Length`, then reads on ([`Download`]) as the body is
//! written: a few chunks of [`FS_CHUNK`] at most are held. A `PUT` hands
//! the body, as it comes, to the upload `alloxctl cp` makes
//! ([`upload_from`]): chunks under an upload id, the last one committing,
//! so the target keeps its old content unless the whole body came (hyper
//! tells a body cut short by an error, which the upload never commits).
//!
//! Where the daemon is on this machine, a file of more than one chunk
//! goes without frames instead ([`crate::spool`]): a `PUT`'s body is
//! spooled and the open file passed to the daemon, a `GET` is copied by
//! the daemon into a spooled file and sent from it. Every answer says how
//! in its `Allox-Copied-By` header (`reflink`, `copy_file_range`,
//! `sendfile`, or `frames`).
//!
//! `?scope=shared` names the agent's shared files, `?checkpoint=ID` (`GET`
//! only) the tree as it was at that checkpoint. Path segments are
//! percent-decoded; what the path may be is the daemon's to say, and its
//! refusals come back with their status, as on `/v1/rpc`.

use crate::body::{headers_of, next_piece, respond, ChannelBody, HttpRequest, HttpResponse};
use crate::shared::Shared;
use crate::{error, failure, spool, Reply};
use allox_client::client::Caller;
use allox_client::files::{CopyError, Remote};
use allox_protocol::json::answer_to_json;
use allox_protocol::{ErrorCode, FsData, FsRead, FsScope, Request, Response, FS_CHUNK};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::json;
use std::io::{self, Read};
use std::sync::Arc;
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
    #[error("query parameter {0:?} is given twice: give it once")]
    Twice(String),
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
    let mut seen = std::collections::HashSet::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decode(value)?;
        let key = decode(key)?;
        // The last one silently won: an ambiguous request is refused.
        if !seen.insert(key.clone()) {
            return Err(UrlError::Twice(key));
        }
        match key.as_str() {
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
pub(super) async fn serve(req: HttpRequest, f: FileRequest, shared: &Arc<Shared>) -> HttpResponse {
    if let Err(r) = shared.access.check_files(&headers_of(&req)) {
        // A PUT's body is not read: hyper ends the connection after the
        // answer rather than wait for it.
        return respond(Reply::refused(&r));
    }
    match f.method {
        Method::Get => get(f.target, shared).await,
        Method::Put => put(req, f.target, shared).await,
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

/// Pieces of a download sent ahead of the client.
const PIECES_AHEAD: usize = 2;

/// The first `fs.read` answers the status; the rest of the file follows
/// from the same blocking task, one chunk at a time, into the body.
async fn get(target: Remote, shared: &Arc<Shared>) -> HttpResponse {
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let (tx, rx) = tokio::sync::mpsc::channel(PIECES_AHEAD);
    let me = Arc::clone(shared);
    let sent = shared.with_daemon(move |daemon| {
        // Where the file can be spooled, its size first (no bytes): more
        // than a chunk is copied by the daemon into the spool, and sent
        // from there (a first chunk read and thrown away was counted out
        // on top of the whole file).
        let local = me.local();
        let first = match read_chunk(
            daemon,
            &target,
            0,
            if local.is_some() { 0 } else { FS_CHUNK },
        ) {
            Ok(d) => d,
            Err(answer) => {
                let _ = first_tx.send(Err(answer));
                return;
            }
        };
        let spooled = match &local {
            Some(local) if first.size > FS_CHUNK => spool::get(local, &target, first.size),
            _ => None,
        };
        if let Some((file, copied)) = spooled {
            let _ = first_tx.send(Ok((copied.size, Some(copied.by))));
            send_file(file, copied.size, &target, &tx);
            return;
        }
        // Not spooled: read in frames from the start.
        let first = if local.is_some() {
            match read_chunk(daemon, &target, 0, FS_CHUNK) {
                Ok(d) => d,
                Err(answer) => {
                    let _ = first_tx.send(Err(answer));
                    return;
                }
            }
        } else {
            first
        };
        let _ = first_tx.send(Ok((first.size, None)));
        let mut download = Download::new(daemon, &target, first);
        loop {
            let mut piece = vec![0u8; FS_CHUNK as usize];
            let piece = match download.read(&mut piece) {
                Ok(0) => return,
                Ok(n) => {
                    piece.truncate(n);
                    Ok(Bytes::from(piece))
                }
                Err(e) => {
                    // The body is cut short of its Content-Length: the
                    // connection is ended, or the client would wait.
                    tracing::warn!(path = %target.path, error = %e, "GET of a file cut short");
                    Err(e)
                }
            };
            let failed = piece.is_err();
            // The client went: nothing more to read for it.
            if tx.blocking_send(piece).is_err() || failed {
                return;
            }
        }
    });
    // The download runs on; its first answer decides the status.
    match first_rx.await {
        Ok(Ok((size, by))) => {
            let body = ChannelBody {
                rx,
                length: Some(size),
                dropped: None,
            };
            hyper::Response::builder()
                .status(200)
                .header("Content-Type", "application/octet-stream")
                .header(spool::COPIED_BY, spool::copied_by(by))
                .body(body.boxed())
                .unwrap_or_else(|e| {
                    respond(Reply::json(error(500, ErrorCode::Internal, e.to_string())))
                })
        }
        Ok(Err(answer)) => respond(Reply::json(answer)),
        Err(_) => match sent.await {
            Err(reply) => respond(reply),
            _ => respond(Reply::json(error(
                500,
                ErrorCode::Internal,
                "the download stopped before its first chunk".into(),
            ))),
        },
    }
}

/// The spooled file, `size` bytes, into the body piece by piece; one
/// that ends short of `size` cuts the body (the connection is ended).
fn send_file(
    mut file: std::fs::File,
    size: u64,
    target: &Remote,
    tx: &tokio::sync::mpsc::Sender<io::Result<Bytes>>,
) {
    let mut left = size;
    while left > 0 {
        let mut piece = Vec::with_capacity(FS_CHUNK.min(left) as usize);
        let piece = match (&mut file).take(FS_CHUNK.min(left)).read_to_end(&mut piece) {
            Ok(0) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the spooled file ended {left} bytes short of {size}"),
            )),
            Ok(n) => {
                left -= n as u64;
                Ok(Bytes::from(piece))
            }
            Err(e) => Err(e),
        };
        if let Err(e) = &piece {
            tracing::warn!(path = %target.path, error = %e, "GET of a file cut short");
        }
        let failed = piece.is_err();
        if tx.blocking_send(piece).is_err() || failed {
            return;
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
    /// The file's inode: every chunk must be of it.
    inode: u64,
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
            inode: first.inode,
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
            if d.inode != self.inode {
                // Replaced at its path: the rest is another file's.
                return Err(io::Error::other(
                    "the file was replaced while it was sent (the body would mix two files)",
                ));
            }
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

/// The body is read by a task of its own (each piece waited for at most
/// the HTTP timeout) and handed, as it comes, to the upload on the
/// blocking pool. hyper tells a body cut short (a chunked one that ends
/// inside a chunk or without its last chunk, a `Content-Length` one short
/// of its length) by an error, so the upload never commits it.
async fn put(req: HttpRequest, target: Remote, shared: &Arc<Shared>) -> HttpResponse {
    let timeout = shared.http_timeout;
    let (tx, rx) = tokio::sync::mpsc::channel(PIECES_AHEAD_UP);
    let mut body = req.into_body();
    tokio::spawn(async move {
        loop {
            let piece = next_piece(&mut body, timeout).await;
            let end = !matches!(piece, Ok(Some(_)));
            if end {
                let _ = tx.send(piece).await;
                return;
            }
            // The upload stopped reading (refused, or failed): the rest is
            // not wanted, but read and dropped (up to DRAINED), so that the
            // answer reaches a client still sending instead of being lost
            // to the reset of a connection closed with its bytes unread.
            if tx.send(piece).await.is_err() {
                let mut drained = 0usize;
                while let Ok(Some(b)) = next_piece(&mut body, timeout).await {
                    drained += b.len();
                    if drained > DRAINED {
                        break;
                    }
                }
                return;
            }
        }
    });
    let me = Arc::clone(shared);
    let answer = shared
        .with_daemon(move |daemon| {
            let mut body = Pieces {
                rx,
                piece: Bytes::new(),
                taken: 0,
                ended: false,
            };
            match spool::put(daemon, &mut body, &target, me.local().as_ref()) {
                Ok((path, size, by)) => (200, json!({ "path": path, "size": size }), Some(by)),
                Err(e) => {
                    let (status, v) = upload_failure(e, timeout);
                    (status, v, None)
                }
            }
        })
        .await;
    match answer {
        Ok((status, v, by)) => {
            let mut reply = Reply::json((status, v));
            if let Some(by) = by {
                reply
                    .headers
                    .push((spool::COPIED_BY, spool::copied_by(by).into()));
            }
            respond(reply)
        }
        Err(reply) => respond(reply),
    }
}

/// Pieces of an upload read ahead of the daemon.
const PIECES_AHEAD_UP: usize = 8;

/// The most of a refused upload's body read and dropped after the answer
/// (past it the connection is closed with the rest unread).
const DRAINED: usize = 256 << 20;

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

/// A streamed body as a reader: its pieces as the body's task hands them
/// on; a stall or a body cut short is an error, never an end.
struct Pieces {
    rx: tokio::sync::mpsc::Receiver<io::Result<Option<Bytes>>>,
    piece: Bytes,
    taken: usize,
    ended: bool,
}

impl spool::Body for Pieces {
    fn next_piece(&mut self) -> io::Result<Option<Bytes>> {
        if self.taken < self.piece.len() {
            let rest = self.piece.slice(self.taken..);
            self.taken = self.piece.len();
            return Ok(Some(rest));
        }
        if self.ended {
            return Ok(None);
        }
        match self.rx.blocking_recv() {
            Some(Ok(Some(d))) => Ok(Some(d)),
            Some(Ok(None)) => {
                self.ended = true;
                Ok(None)
            }
            Some(Err(e)) => Err(e),
            None => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the body's reader went",
            )),
        }
    }
}

impl Read for Pieces {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.taken == self.piece.len() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Ok(Some(d))) => {
                    self.piece = d;
                    self.taken = 0;
                }
                Some(Ok(None)) => {
                    self.ended = true;
                    return Ok(0);
                }
                Some(Err(e)) => return Err(e),
                None => {
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
    use allox_client::client::{Answer, ClientError};
    use allox_protocol::{ErrorBody, FsWritten};

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
            parse("GET", "/v1/files/a/s/f?scope=shared&scope=session"),
            Err(UrlError::Twice("scope".into()))
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
        inode: u64,
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
                data: allox_protocol::Bytes(data),
                inode: self.inode,
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
            inode: 7,
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

    /// A download of a file of `size` bytes that `change` alters once its
    /// first chunk was read: the error it ends with, and the bytes sent.
    fn altered_while_sent(size: u64, change: impl FnOnce(&mut File)) -> (io::Error, u64) {
        let mut daemon = File {
            size,
            largest: 0,
            reads: 0,
            inode: 7,
        };
        let t = target("f");
        let first = read_chunk(&mut daemon, &t, 0, FS_CHUNK).unwrap();
        change(&mut daemon);
        let mut d = Download::new(&mut daemon, &t, first);
        let mut sink = Vec::new();
        let e = io::copy(&mut d, &mut sink).unwrap_err();
        (e, sink.len() as u64)
    }

    #[test]
    fn a_file_that_shrinks_while_it_is_sent_is_an_error_not_a_short_body() {
        let (e, sent) = altered_while_sent(2 * FS_CHUNK, |f| f.size = FS_CHUNK);
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(sent, FS_CHUNK);
    }

    #[test]
    fn a_file_replaced_while_it_is_sent_is_an_error_not_a_mix() {
        let (e, sent) = altered_while_sent(3 * FS_CHUNK, |f| f.inode = 8);
        assert!(e.to_string().contains("replaced"), "{e}");
        assert_eq!(sent, FS_CHUNK);
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

    /// A body's reader fed `parts` (then left open: what follows them
    /// never comes).
    fn pieces(parts: Vec<io::Result<Option<Bytes>>>) -> (Pieces, impl Drop) {
        let (tx, rx) = tokio::sync::mpsc::channel(parts.len() + 1);
        for p in parts {
            tx.try_send(p).unwrap();
        }
        let body = Pieces {
            rx,
            piece: Bytes::new(),
            taken: 0,
            ended: false,
        };
        (body, KeepOpen(tx))
    }

    struct KeepOpen(#[allow(dead_code)] tokio::sync::mpsc::Sender<io::Result<Option<Bytes>>>);

    impl Drop for KeepOpen {
        fn drop(&mut self) {}
    }

    #[test]
    fn a_whole_body_is_uploaded_in_chunks_and_committed_last() {
        let size = 2 * FS_CHUNK as usize + 1000;
        let parts: Vec<_> = vec![0u8; size]
            .chunks(64 << 10)
            .map(|c| Ok(Some(Bytes::copy_from_slice(c))))
            .chain([Ok(None)])
            .collect();
        let (mut body, _open) = pieces(parts);
        let mut daemon = Uploads::default();
        let (_, put, by) = spool::put(&mut daemon, &mut body, &target("f"), None).unwrap();
        assert_eq!((put, by), (size as u64, None));
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

    /// A daemon that takes no descriptors (as over a VM's control port):
    /// each request is answered `unsupported`. Counts its connections.
    fn no_fds_daemon(sock: &std::path::Path) -> Arc<std::sync::atomic::AtomicUsize> {
        use allox_protocol::{
            decode, encode, ClientFrame, FrameReader, Hello, Outcome, ResponseEnvelope,
            ServerFrame, PROTOCOL_VERSION,
        };
        use std::io::Write;
        let listener = std::os::unix::net::UnixListener::bind(sock).unwrap();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&connections);
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(mut s) = s else { return };
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut reader = FrameReader::new();
                let mut buf = [0u8; 4096];
                'conn: loop {
                    while let Some(f) = reader.next_frame() {
                        let frame = match decode::<ClientFrame>(&f.unwrap()).unwrap() {
                            ClientFrame::Hello(h) => ServerFrame::Welcome(Hello {
                                version: PROTOCOL_VERSION,
                                build: "fake".into(),
                                conversation: h.conversation,
                            }),
                            ClientFrame::Request(r) => ServerFrame::Response(ResponseEnvelope {
                                conversation: r.conversation,
                                request_id: r.request_id,
                                outcome: Outcome::Err(ErrorBody::new(
                                    ErrorCode::Unsupported,
                                    "no descriptors over this port",
                                )),
                            }),
                        };
                        if s.write_all(&encode(&frame).unwrap()).is_err() {
                            break 'conn;
                        }
                    }
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => reader.push(&buf[..n]),
                    }
                }
            }
        });
        connections
    }

    #[test]
    fn a_daemon_that_takes_no_descriptors_gets_every_file_in_frames() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ctl.sock");
        let connections = no_fds_daemon(&sock);
        let spool_dir = dir.path().join("spool");
        std::fs::create_dir(&spool_dir).unwrap();
        let spool = spool::Spool::new(&spool_dir).unwrap();
        let local = spool::Local {
            spool: &spool,
            socket: &sock,
            daemon_timeout: Duration::from_secs(5),
        };
        let size = 3 * FS_CHUNK as usize + 7;
        let body = || {
            let parts: Vec<_> = vec![3u8; size]
                .chunks(100 << 10)
                .map(|c| Ok(Some(Bytes::copy_from_slice(c))))
                .chain([Ok(None)])
                .collect();
            pieces(parts)
        };
        // Spooled whole and offered; refused; sent in frames from the
        // spool, every byte.
        let (mut b, _open) = body();
        let mut daemon = Uploads::default();
        let (_, put, by) = spool::put(&mut daemon, &mut b, &target("f"), Some(&local)).unwrap();
        assert_eq!((put, by), (size as u64, None));
        let sent: usize = daemon.chunks.iter().map(|c| c.1).sum();
        assert_eq!(sent, size);
        assert_eq!(daemon.chunks.last().map(|c| c.2), Some(true));
        assert!(!spool.takes_fds());
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
        // From then on, frames at once: the daemon is not asked again.
        let (mut b, _open) = body();
        let mut daemon = Uploads::default();
        spool::put(&mut daemon, &mut b, &target("f"), Some(&local)).unwrap();
        assert!(spool::get(&local, &target("f"), size as u64).is_none());
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(std::fs::read_dir(&spool_dir).unwrap().count(), 0);
    }

    #[test]
    fn a_body_cut_short_or_stalled_is_never_committed() {
        let data = || Ok(Some(Bytes::from(vec![1u8; 10])));
        for (parts, kind) in [
            // Cut short: hyper's error for a body that ended early.
            (
                vec![
                    data(),
                    Err(io::Error::new(io::ErrorKind::UnexpectedEof, "ended early")),
                ],
                io::ErrorKind::UnexpectedEof,
            ),
            // A read error.
            (
                vec![data(), Err(io::ErrorKind::ConnectionReset.into())],
                io::ErrorKind::ConnectionReset,
            ),
            // Nothing more came in time.
            (
                vec![
                    data(),
                    Err(io::Error::new(io::ErrorKind::TimedOut, "stalled")),
                ],
                io::ErrorKind::TimedOut,
            ),
        ] {
            let (mut body, _open) = pieces(parts);
            let mut daemon = Uploads::default();
            let e = spool::put(&mut daemon, &mut body, &target("f"), None).unwrap_err();
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
        }
        // The body's task gone before its end.
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tx.try_send(data()).unwrap();
        drop(tx);
        let mut body = Pieces {
            rx,
            piece: Bytes::new(),
            taken: 0,
            ended: false,
        };
        let mut daemon = Uploads::default();
        assert!(spool::put(&mut daemon, &mut body, &target("f"), None).is_err());
        assert!(daemon.chunks.is_empty());
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
