//! The TCP connection behind a request, for the two things tiny_http
//! gives no way to do: end it, and ask whether the client has closed it.
//!
//! tiny_http keeps its sockets to itself. The socket is found among this
//! process's own descriptors (`/proc/self/fd`) by the client's address and
//! the listening port, and duplicated with `pidfd_getfd` on our own pidfd
//! (safe code; a process may always take its own descriptors). The
//! duplicate shares the socket, so a shutdown through it ends the
//! connection for tiny_http too, and checking the addresses on the
//! duplicate itself means a descriptor number reused meanwhile is never
//! mistaken for the connection.

use rustix::fd::OwnedFd;
use rustix::net::{RecvFlags, Shutdown};
use rustix::process::{PidfdFlags, PidfdGetfdFlags};
use std::net::SocketAddr;

/// One connection's socket, duplicated.
pub struct Conn(OwnedFd);

/// The socket whose peer is `peer` on the local port `port`, if it is
/// still open.
pub fn find(peer: SocketAddr, port: u16) -> Option<Conn> {
    let me = rustix::process::pidfd_open(rustix::process::getpid(), PidfdFlags::empty()).ok()?;
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        let Some(n) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|t| t.as_os_str().as_encoded_bytes().starts_with(b"socket:"));
        if !is_socket {
            continue;
        }
        let Ok(fd) = rustix::process::pidfd_getfd(&me, n, PidfdGetfdFlags::empty()) else {
            continue;
        };
        let addr =
            |a: Option<rustix::net::SocketAddrAny>| a.and_then(|a| SocketAddr::try_from(a).ok());
        let local = addr(rustix::net::getsockname(&fd).ok());
        let remote = addr(rustix::net::getpeername(&fd).ok().flatten());
        if remote == Some(peer) && local.is_some_and(|l| l.port() == port) {
            return Some(Conn(fd));
        }
    }
    None
}

impl Conn {
    /// Ends the connection both ways: tiny_http's reads of it see its end
    /// at once, and the client sees the answer cut where it is.
    pub fn hang_up(&self) {
        let _ = rustix::net::shutdown(&self.0, Shutdown::Both);
    }

    /// Stops reading from the client: tiny_http's reads of what is left
    /// of a body end at once instead of waiting for it.
    pub fn stop_reading(&self) {
        let _ = rustix::net::shutdown(&self.0, Shutdown::Read);
    }

    /// Whether the client has closed its side (its end of the stream has
    /// come) or reset the connection.
    pub fn closed_by_peer(&self) -> bool {
        let mut b = [0u8; 1];
        match rustix::net::recv(&self.0, &mut b[..], RecvFlags::PEEK | RecvFlags::DONTWAIT) {
            Ok((_, 0)) => true,
            Ok(_) => false,
            Err(e) => e != rustix::io::Errno::AGAIN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn a_connection_is_found_by_its_peer_and_its_end_seen() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_served, peer) = listener.accept().unwrap();
        let conn = find(peer, port).expect("the accepted socket");
        assert!(!conn.closed_by_peer());
        client.write_all(b"x").unwrap();
        assert!(!conn.closed_by_peer(), "data waiting is not an end");
        client.shutdown(std::net::Shutdown::Write).unwrap();
        drop(client);
        let mut closed = false;
        for _ in 0..100 {
            // The byte sent first is still there to read: drain it.
            let mut b = [0u8; 1];
            let _ = rustix::net::recv(&conn.0, &mut b[..], RecvFlags::DONTWAIT);
            if conn.closed_by_peer() {
                closed = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(closed);
        // Not the listening socket, nor one on another port.
        assert!(find(peer, port.wrapping_add(1)).is_none());
    }
}
