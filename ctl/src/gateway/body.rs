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
    if READERS.fetch_add(1, Ordering::SeqCst) >= MAX_READERS {
        READERS.fetch_sub(1, Ordering::SeqCst);
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
