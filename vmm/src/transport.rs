//! How the host reaches a guest's control port. QEMU gives it as a
//! virtio-serial port behind a Unix socket ([`ControlTransport::Serial`]).
//! Firecracker and Cloud Hypervisor have no virtio-serial; their guests'
//! ports are vsock ports, which both expose on the host as one Unix socket
//! per VM where a client first says `CONNECT <port>\n` and is answered
//! `OK <host port>\n` before the stream is the guest's
//! ([`ControlTransport::HybridVsock`]). The guest side of that (the
//! supervisor listening on an `AF_VSOCK` port) is not built: this
//! machine has no `vhost-vsock` to test it on (docs/guest.md, "Other
//! VMMs").

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// Where and how to connect to the control port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlTransport {
    /// A Unix socket whose stream is the port (QEMU's chardev).
    Serial { socket: PathBuf },
    /// A hybrid vsock Unix socket and the guest's vsock port.
    HybridVsock { socket: PathBuf, port: u32 },
}

impl ControlTransport {
    /// A stream to the guest's control port, after the transport's own
    /// handshake (none for serial). `timeout` bounds that handshake.
    pub fn connect(&self, timeout: Duration) -> std::io::Result<UnixStream> {
        match self {
            ControlTransport::Serial { socket } => UnixStream::connect(socket),
            ControlTransport::HybridVsock { socket, port } => {
                let mut s = UnixStream::connect(socket)?;
                s.set_read_timeout(Some(timeout))?;
                s.write_all(format!("CONNECT {port}\n").as_bytes())?;
                // Byte by byte: nothing of the guest's stream is read here.
                let mut line = Vec::new();
                let mut b = [0u8; 1];
                while line.len() < 64 {
                    if s.read(&mut b)? == 0 {
                        break;
                    }
                    if b[0] == b'\n' {
                        let text = String::from_utf8_lossy(&line);
                        if text.starts_with("OK ") {
                            s.set_read_timeout(None)?;
                            return Ok(s);
                        }
                        break;
                    }
                    line.push(b[0]);
                }
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    format!(
                        "vsock port {port} behind {}: the VMM answered {:?} to CONNECT (no guest listening?)",
                        socket.display(),
                        String::from_utf8_lossy(&line)
                    ),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::os::unix::net::UnixListener;

    /// A VMM's hybrid vsock socket as Firecracker serves it: `CONNECT
    /// <port>` answered `OK <n>` when a guest listens on `port` (then the
    /// bytes are the guest's: an echo here), else the connection closed.
    fn vmm(listen_port: u32) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("v.sock");
        let l = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let mut s = s.unwrap();
                let mut r = std::io::BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                if line != format!("CONNECT {listen_port}\n") {
                    continue;
                }
                s.write_all(b"OK 1073741824\n").unwrap();
                let mut buf = [0u8; 64];
                let n = r.read(&mut buf).unwrap();
                s.write_all(&buf[..n]).unwrap();
            }
        });
        (d, path)
    }

    #[test]
    fn hybrid_vsock_connects_after_its_handshake() {
        let (_d, socket) = vmm(52);
        let t = ControlTransport::HybridVsock { socket, port: 52 };
        let mut s = t.connect(Duration::from_secs(5)).unwrap();
        // The first bytes after `OK` are the guest's, none lost.
        s.write_all(b"\0hello").unwrap();
        let mut back = [0u8; 6];
        s.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"\0hello");
    }

    #[test]
    fn a_port_nobody_listens_on_is_refused_naming_it() {
        let (_d, socket) = vmm(52);
        let t = ControlTransport::HybridVsock { socket, port: 53 };
        let e = t.connect(Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
        assert!(e.to_string().contains("vsock port 53"), "{e}");
    }
}
