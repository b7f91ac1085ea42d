//! `alloxctl port forward`: a plain TCP forward from an address of this
//! host to a session's exposed port. Each accepted connection gets a
//! connection to the port through the daemon (`port.connect`, with one
//! end of a socket pair the daemon relays to), and two threads copy the
//! bytes, each passing its end of stream on as a half close. At most
//! [`MAX_CONNECTIONS`] at once; one more is closed as it comes.

use allox_client::Client;
use allox_protocol::{PortConnect, PortList, Request, Response};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Connections forwarded at once.
pub const MAX_CONNECTIONS: usize = 256;

/// Forwards until the process is interrupted; an error only when it
/// cannot start (the port not exposed, the address taken).
pub fn forward(
    socket: &Path,
    agent: &str,
    session: &str,
    port: u16,
    listen: SocketAddr,
) -> Result<(), String> {
    let mut c = Client::connect(socket).map_err(|e| allox_protocol::error_chain(&e))?;
    let listed = c
        .call(Request::PortList(PortList {
            agent_id: agent.into(),
            session_id: Some(session.into()),
        }))
        .map_err(|e| allox_protocol::error_chain(&e))?;
    match listed {
        Ok(Response::Ports(l)) if l.ports.iter().any(|p| p.port == port) => {}
        Ok(_) => {
            return Err(format!(
                "port {port} of session {agent}/{session} is not exposed (alloxctl port expose {agent} {session} {port})"
            ))
        }
        Err(e) => return Err(e.message),
    }
    let l = TcpListener::bind(listen).map_err(|e| format!("listen on {listen}: {e}"))?;
    let at = l.local_addr().map_err(|e| e.to_string())?;
    eprintln!("forwarding {at} to port {port} of session {agent}/{session}");
    let open = Arc::new(AtomicUsize::new(0));
    for conn in l.incoming() {
        let Ok(conn) = conn else { continue };
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::SeqCst);
            drop(conn);
            continue;
        }
        let (socket, agent, session, open) = (
            PathBuf::from(socket),
            agent.to_string(),
            session.to_string(),
            open.clone(),
        );
        std::thread::spawn(move || {
            if let Err(e) = one(&socket, &agent, &session, port, conn) {
                eprintln!("alloxctl: port {port} of {agent}/{session}: {e}");
            }
            open.fetch_sub(1, Ordering::SeqCst);
        });
    }
    Ok(())
}

fn one(
    socket: &Path,
    agent: &str,
    session: &str,
    port: u16,
    conn: TcpStream,
) -> Result<(), String> {
    let (mine, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
    let mut c = Client::connect(socket).map_err(|e| allox_protocol::error_chain(&e))?;
    let answer = c
        .call_with_fd(
            Request::PortConnect(PortConnect {
                agent_id: agent.into(),
                session_id: session.into(),
                port,
                token: None,
                authorized: true,
                host: None,
            }),
            theirs.as_fd(),
        )
        .map_err(|e| allox_protocol::error_chain(&e))?;
    drop(theirs);
    if let Err(e) = answer {
        return Err(e.message);
    }
    let _ = conn.set_nodelay(true);
    let (c2, m2) = (
        conn.try_clone().map_err(|e| e.to_string())?,
        mine.try_clone().map_err(|e| e.to_string())?,
    );
    let up = std::thread::spawn(move || {
        let _ = pump(conn, m2).shutdown(Shutdown::Write);
    });
    let _ = pump(mine, c2).shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}

/// `from` to `to` until `from` ends (or either fails); `to`, for its
/// sending side to be shut.
fn pump<R: Read, W: Write>(mut from: R, mut to: W) -> W {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    to
}
