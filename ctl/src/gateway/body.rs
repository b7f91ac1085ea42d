//! Reading a request's body without letting a slow client hold a worker.
//!
//! tiny_http reads a body of up to 1 KiB itself, on the connection's own
//! thread, before the request reaches a worker. A longer (or chunked) one
//! is read from the socket as the worker asks for it, and tiny_http gives
//! no hold on that socket to bound those reads (a read timeout set on the
//! listening socket would be inherited by every connection, but it also
//! makes `accept` time out, which stops tiny_http's accept loop for good).
//! So such a body is read on a thread of its own while the worker waits
//! for it at most the body timeout: a client that stalls holds that thread
//! until it sends the rest or goes (and is then answered 408), not a
//! worker. At most [`MAX_READERS`] of these threads live at once; past
//! that, such requests are answered 503 at once.
//!
//! A body to stream (`PUT /v1/files`, any size) is read the same way, on
//! a thread of its own, which hands it on in pieces ([`stream`]): the
//! worker waits at most the timeout for each piece, and at most
//! [`PIECES_AHEAD`] pieces wait for it, so memory stays bounded whatever
//! the body's size.

use std::io::{self, Read};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;
use tiny_http::Request;

/// Body threads alive at once, across all workers.
pub const MAX_READERS: usize = 64;
/// Bodies tiny_http has read into memory before the worker gets them.
const READ_BY_TINY_HTTP: usize = 1024;
/// The most bytes one piece of a streamed body holds.
pub const PIECE: usize = 64 * 1024;
/// Pieces read ahead of the worker.
pub const PIECES_AHEAD: usize = 8;

static READERS: AtomicUsize = AtomicUsize::new(0);

/// What became of a request's body.
pub enum Body {
    /// Read (or failed to be), within the timeout.
    Read(Request, io::Result<Vec<u8>>),
    /// Not there in time: its thread answers the client when the body
    /// comes or the client goes.
    Late,
    /// Too many clients are slow already; the body was not read.
    Busy(Request),
}

/// Reads at most `limit` bytes (and one more, to tell a longer body) of
/// `request`'s body, waiting at most `timeout` for them.
pub fn read(mut request: Request, limit: usize, timeout: Duration) -> Body {
    if request
        .body_length()
        .is_some_and(|n| n <= READ_BY_TINY_HTTP)
    {
        let read = read_all(&mut request, limit);
        return Body::Read(request, read);
    }
    if !take_reader() {
        return Body::Busy(request);
    }
    let (tx, rx) = mpsc::sync_channel(1);
    let reader = move || {
        let read = read_all(&mut request, limit);
        if let Err(mpsc::SendError((request, _))) = tx.send((request, read)) {
            let _ = request.respond(late(timeout));
        }
        READERS.fetch_sub(1, Ordering::SeqCst);
    };
    if thread::Builder::new()
        .name("gateway-body".into())
        .spawn(reader)
        .is_err()
    {
        // The request went with the closure: tiny_http answers 500.
        READERS.fetch_sub(1, Ordering::SeqCst);
        return Body::Late;
    }
    match rx.recv_timeout(timeout) {
        Ok((request, read)) => Body::Read(request, read),
        Err(_) => Body::Late,
    }
}

/// Counts one more body thread, unless there are too many already.
fn take_reader() -> bool {
    if READERS.fetch_add(1, Ordering::SeqCst) >= MAX_READERS {
        READERS.fetch_sub(1, Ordering::SeqCst);
        return false;
    }
    true
}

/// What a body thread hands on.
pub enum Piece {
    /// The next bytes of the body.
    Data(Vec<u8>),
    /// The body's end (or the error that ended it), with the total read.
    End(io::Result<()>, u64),
}

/// The answer a body thread gives for its request.
pub type Answer = tiny_http::Response<io::Cursor<Vec<u8>>>;

/// A streamed body.
pub enum Stream {
    /// Read on its own thread: its pieces come on `pieces`; the answer
    /// goes on `answer`, and the thread gives it once it stops reading.
    Reading {
        pieces: mpsc::Receiver<Piece>,
        answer: mpsc::SyncSender<Answer>,
    },
    /// Too many clients are slow already; the body was not read.
    Busy(Request),
    /// The thread could not be started (tiny_http answered 500).
    Failed,
}

/// Starts reading `request`'s body on a thread of its own, which keeps
/// the request. The thread reads until the body ends or the worker stops
/// receiving, then gives the worker's answer (408, the body being late,
/// if the worker went without one).
pub fn stream(mut request: Request, timeout: Duration) -> Stream {
    if !take_reader() {
        return Stream::Busy(request);
    }
    let (tx, pieces) = mpsc::sync_channel(PIECES_AHEAD);
    let (answer, answer_rx) = mpsc::sync_channel::<Answer>(1);
    let reader = move || {
        let mut total = 0u64;
        let end = loop {
            let mut buf = vec![0u8; PIECE];
            match request.as_reader().read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    buf.truncate(n);
                    total += n as u64;
                    if tx.send(Piece::Data(buf)).is_err() {
                        break Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        let _ = tx.send(Piece::End(end, total));
        drop(tx);
        let response = answer_rx.recv().unwrap_or_else(|_| late(timeout));
        // The client may have gone; nothing to tell it then.
        let _ = request.respond(response);
        READERS.fetch_sub(1, Ordering::SeqCst);
    };
    match thread::Builder::new()
        .name("gateway-stream".into())
        .spawn(reader)
    {
        Ok(_) => Stream::Reading { pieces, answer },
        Err(_) => {
            READERS.fetch_sub(1, Ordering::SeqCst);
            Stream::Failed
        }
    }
}

fn read_all(request: &mut Request, limit: usize) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    request
        .as_reader()
        .take(limit as u64 + 1)
        .read_to_end(&mut body)?;
    Ok(body)
}

/// The answer for a body that came too late, or never.
fn late(timeout: Duration) -> tiny_http::Response<io::Cursor<Vec<u8>>> {
    let (status, body) = super::error(
        408,
        allox_protocol::ErrorCode::InvalidRequest,
        format!(
            "the request body did not arrive within {} ms",
            timeout.as_millis()
        ),
    );
    super::json_response(status, Some(body))
}
