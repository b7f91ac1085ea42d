//! What the broker reads from a client: an HTTP/1.1 proxy request head,
//! either `CONNECT host:port` (a tunnel, for HTTPS and any TCP) or a
//! request with an absolute URI (`GET http://host[:port]/path`), and what
//! it answers when it refuses one.

use crate::policy::{Host, RuleError};

/// Longest request head read (request line and headers).
pub const MAX_HEAD: usize = 16 * 1024;
/// Most headers in a head.
const MAX_HEADERS: usize = 64;

/// What the client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// A tunnel: after the broker's `200`, bytes both ways as they are.
    Connect,
    /// A plain-HTTP request: `head` is what goes to the server — the
    /// request line in origin form, the headers less the proxy's own
    /// (`Proxy-*`, `Connection`, `Keep-Alive`) and `Connection: close`
    /// added — then the client's bytes as they come.
    Forward { head: Vec<u8> },
}

/// A proxy request: where to, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub ask: Ask,
    pub host: Host,
    pub port: u16,
    /// Bytes of the buffer the head took.
    pub head_len: usize,
}

/// Why a head is refused; each maps to an HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("request head over {MAX_HEAD} bytes")]
    TooLarge,
    #[error("malformed request: {0}")]
    Malformed(String),
    #[error("{0}")]
    Unsupported(String),
}

impl HeadError {
    /// The status the broker answers with.
    pub fn status(&self) -> (u16, &'static str) {
        match self {
            HeadError::TooLarge => (431, "Request Header Fields Too Large"),
            HeadError::Malformed(_) => (400, "Bad Request"),
            HeadError::Unsupported(_) => (501, "Not Implemented"),
        }
    }
}

/// `host:port` (IPv6 in brackets); `default` when the port is left out.
fn authority(s: &str, default: Option<u16>) -> Result<(Host, u16), HeadError> {
    let bad = |why: &str| HeadError::Malformed(format!("{s:?}: {why}"));
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(|| bad("'[' without ']'"))?;
        (format!("[{h}]"), after.strip_prefix(':'))
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (s.to_string(), None),
        }
    };
    let port = match port {
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return Err(bad("the port is not a number from 1 to 65535")),
        },
        None => default.ok_or_else(|| bad("no port"))?,
    };
    let host = Host::parse(&host).map_err(|e| match e {
        RuleError::Host { why, .. } => bad(why),
        other => bad(&other.to_string()),
    })?;
    Ok((host, port))
}

/// Parses the head at the start of `buf` into `req`: the bytes it took,
/// `Ok(None)` when more are needed; a head too large or malformed is
/// refused.
fn read_head<'h, 'b>(
    req: &mut httparse::Request<'h, 'b>,
    buf: &'b [u8],
) -> Result<Option<usize>, HeadError> {
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HeadError::Malformed(format!(
                "more than {MAX_HEADERS} headers"
            )))
        }
        Err(e) => return Err(HeadError::Malformed(e.to_string())),
    };
    if head_len > MAX_HEAD {
        return Err(HeadError::TooLarge);
    }
    Ok(Some(head_len))
}

/// Reads a request head from the start of `buf`: `Ok(None)` when more
/// bytes are needed.
pub fn parse(buf: &[u8]) -> Result<Option<Request>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let Some(head_len) = read_head(&mut req, buf)? else {
        return Ok(None);
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Malformed("incomplete request line".into()));
    };
    // HTTP/1.0 too: Python's `http.client` (and so `requests`, `urllib`
    // and pip) asks for its tunnels in it. A forwarded request goes on as
    // HTTP/1.1 with `Connection: close`, which a 1.0 client reads alike.
    let _ = version;
    if method == "CONNECT" {
        let (host, port) = authority(target, None)?;
        return Ok(Some(Request {
            ask: Ask::Connect,
            host,
            port,
            head_len,
        }));
    }
    let lower = target.to_ascii_lowercase();
    let Some(rest) = lower.strip_prefix("http://").map(|_| &target[7..]) else {
        return Err(if lower.starts_with("https://") {
            HeadError::Unsupported(
                "an https:// URI goes through CONNECT (set HTTPS_PROXY, not only HTTP_PROXY)"
                    .into(),
            )
        } else {
            HeadError::Malformed(format!(
                "{target:?}: a proxy request names an absolute http:// URI, or is CONNECT host:port"
            ))
        });
    };
    let (auth, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if auth.contains('@') {
        return Err(HeadError::Unsupported(
            "user information in the URI is not forwarded".into(),
        ));
    }
    let (host, port) = authority(auth, Some(80))?;
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    let head = origin_form(method, &path, req.headers, auth);
    Ok(Some(Request {
        ask: Ask::Forward { head },
        host,
        port,
        head_len,
    }))
}

/// A head in origin form for the server: `method path`, `Host:
/// authority` — the host the request was judged (and a secret injected)
/// for, whatever `Host` the client wrote, as a proxy must (RFC 9112
/// §3.2.2): a client's own `Host` would reach another virtual host behind
/// the same address with what was meant for this one — the headers less
/// the proxy's own (`Proxy-*`, `Connection`, `Keep-Alive`) and the
/// client's `Host`s, and `Connection: close`.
fn origin_form(
    method: &str,
    path: &str,
    headers: &[httparse::Header<'_>],
    authority: &str,
) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\n",
        authority.to_ascii_lowercase()
    )
    .into_bytes();
    for h in headers.iter() {
        let n = h.name.to_ascii_lowercase();
        if n.starts_with("proxy-") || n == "connection" || n == "keep-alive" || n == "host" {
            continue;
        }
        head.extend_from_slice(h.name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(h.value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    head
}

/// Reads a request head a client sends a server (origin form, inside an
/// intercepted TLS connection to `authority`) from the start of `buf`:
/// the head as it goes on ([`origin_form`]: one request per connection)
/// and the bytes it took; `Ok(None)` when more bytes are needed.
pub fn parse_origin(buf: &[u8], authority: &str) -> Result<Option<(Vec<u8>, usize)>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let Some(head_len) = read_head(&mut req, buf)? else {
        return Ok(None);
    };
    let (Some(method), Some(path), Some(_)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Malformed("incomplete request line".into()));
    };
    if method == "CONNECT" || !path.starts_with('/') {
        return Err(HeadError::Malformed(format!(
            "{method} {path:?}: inside an intercepted connection a request names a path"
        )));
    }
    Ok(Some((
        origin_form(method, path, req.headers, authority),
        head_len,
    )))
}

/// A complete answer from the broker itself (a refusal or an error), with
/// a one-line text body saying why.
pub fn answer(status: u16, reason: &str, why: &str) -> Vec<u8> {
    let body = format!("allox proxy: {why}\n");
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nX-Allox-Proxy: refused\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The answer to a CONNECT once the tunnel is open.
pub const CONNECTED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

#[cfg(test)]
mod tests;
