//! `allox net connect HOST PORT`: a TCP connection to HOST:PORT through the
//! session's proxy (`CONNECT` at 127.0.0.1:3128, which the network plugin
//! serves), relayed on stdin and stdout — usable as SSH's `ProxyCommand`
//! (`ssh -o ProxyCommand='allox net connect %h %p' ...`, and so Git over
//! SSH). The broker judges it like any other connection.

use std::io::{Read, Write};

use std::net::{Shutdown, TcpStream};

/// Where the session's proxy listens.
const PROXY: &str = "127.0.0.1:3128";
/// Longest answer head read from the proxy.
const MAX_HEAD: usize = 16 * 1024;

/// Opens the tunnel and relays until both directions are done.
pub fn connect(host: &str, port: u16) -> Result<(), String> {
    let mut s = TcpStream::connect(PROXY).map_err(|e| {
        format!("cannot reach the session's proxy at {PROXY}: {e} (the daemon's network plugin serves it)")
    })?;
    let _ = s.set_nodelay(true);
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    write!(
        s,
        "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
    )
    .map_err(|e| format!("cannot ask the proxy: {e}"))?;
    // The answer's head, a byte at a time: what follows it is the server's.
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEAD {
            return Err("the proxy's answer is too long".into());
        }
        match s.read(&mut b) {
            Ok(0) => return Err("the proxy closed the connection without an answer".into()),
            Ok(_) => head.push(b[0]),
            Err(e) => return Err(format!("cannot read the proxy's answer: {e}")),
        }
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let status = head.lines().next().unwrap_or("");
    if status.split(' ').nth(1) != Some("200") {
        // The proxy says why in its body's one line.
        let mut body = String::new();
        let _ = s.take(4096).read_to_string(&mut body);
        let why = body.trim().trim_start_matches("allox proxy: ").to_string();
        return Err(format!("{authority}: {status}: {why}"));
    }
    let mut up = s.try_clone().map_err(|e| format!("{e}"))?;
    let sender = std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut up);
        let _ = up.shutdown(Shutdown::Write);
    });
    let copied = to_stdout(&mut s);
    // The server is done: whatever stdin still holds has nowhere to go.
    drop(sender);
    copied.map_err(|e| format!("relay: {e}"))
}

/// Copies `s` to descriptor 1 as it comes: Rust's stdout holds bytes back
/// until a newline, which a binary protocol (SSH's) may never send.
fn to_stdout(s: &mut TcpStream) -> std::io::Result<()> {
    let out = rustix::stdio::stdout();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let mut done = 0;
        while done < n {
            match rustix::io::write(out, &buf[done..n]) {
                Ok(m) => done += m,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}
