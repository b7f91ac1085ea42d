//! The control port on virtio-serial: one host connection at a time over a
//! character device (`/dev/vportNpM`), found by the name QEMU gave the port.
//!
//! The port stays open for the life of the supervisor; hosts come and go
//! on the other end, and the guest cannot tell reliably when one leaves
//! and the next arrives (the port's open/close notices travel apart from
//! its data). So a host starts its conversation itself: a zero byte, which
//! ends any frame a predecessor tore, then `Hello`, which starts a new
//! conversation whatever came before (`alloxctl` does both). A frame that
//! stops half-way for the stall limit is dropped too. Requests already
//! being answered finish (each store operation is whole or not at all);
//! only their answers may be lost.

use crate::server::{serve_stream, Limits, Transport};
use crate::supervisor::Supervisor;
use rustix::fs::{Mode, OFlags};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::unix::pipe;

/// The device of the virtio-serial port named `name`, from
/// `/sys/class/virtio-ports/*/name` (devtmpfs names the nodes `vportNpM`).
pub fn find_port(name: &str) -> Option<PathBuf> {
    find_port_in(
        Path::new("/sys/class/virtio-ports"),
        Path::new("/dev"),
        name,
    )
}

fn find_port_in(class: &Path, dev: &Path, name: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(class)
        .ok()?
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("name"))
                .map(|n| n.trim_end() == name)
                .unwrap_or(false)
        })
        .map(|e| dev.join(e.file_name()))
        .collect();
    found.sort();
    found.into_iter().next()
}

/// The port's reading half. A read of a virtio-serial port returns what
/// one of the guest's receive buffers holds — often less than asked while
/// more is queued behind it — and tokio takes a short read for a drained
/// descriptor and waits for the next readiness edge, which data already
/// queued never brings: a frame longer than one buffer would wait for
/// ever. So each read takes what the port has until it says it would
/// block (which is what re-arms the readiness).
pub(crate) struct PortReader(pipe::Receiver);

impl tokio::io::AsyncRead for PortReader {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        use std::task::Poll;
        loop {
            let mut got = 0;
            loop {
                let dst = buf.initialize_unfilled();
                if dst.is_empty() {
                    break;
                }
                match self.0.try_read(dst) {
                    // End of file: no host on the other end.
                    Ok(0) => break,
                    Ok(n) => {
                        buf.advance(n);
                        got += n;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if got == 0 => return Poll::Ready(Err(e)),
                    Err(_) => break,
                }
            }
            if got > 0 {
                return Poll::Ready(Ok(()));
            }
            match self.0.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => {
                    // Ready, yet nothing was read: end of file, said once.
                    match self.0.try_read(buf.initialize_unfilled()) {
                        Ok(0) => return Poll::Ready(Ok(())),
                        Ok(n) => {
                            buf.advance(n);
                            continue;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Opens the port as two async halves on two descriptors of one open
/// file (tokio's pipe types poll any pollable descriptor).
fn open_port(dev: &Path) -> io::Result<(PortReader, pipe::Sender)> {
    let fd = rustix::fs::open(
        dev,
        OFlags::RDWR | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )?;
    let dup = rustix::io::fcntl_dupfd_cloexec(&fd, 3)?;
    Ok((
        PortReader(pipe::Receiver::from_file_unchecked(std::fs::File::from(
            fd,
        ))?),
        pipe::Sender::from_file_unchecked(std::fs::File::from(dup))?,
    ))
}

/// Serves the port named `name` until the task is dropped. The port is
/// opened once and kept open: closing it would tell QEMU the guest went
/// away. Hosts come and go on it; each starts a new conversation.
pub async fn serve_virtio(name: String, sup: Arc<Supervisor>, limits: Limits) {
    let mut said_missing = false;
    loop {
        let Some(dev) = find_port(&name) else {
            if !said_missing {
                tracing::warn!(port = %name, "no virtio-serial port by that name yet; waiting");
                said_missing = true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let (rd, wr) = match open_port(&dev) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(port = %name, dev = %dev.display(), error = %e, "cannot open the control port");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let boot_ms = allox_store::clock::since_boot().as_millis() as u64;
        tracing::info!(port = %name, dev = %dev.display(), boot_ms, "control port ready");
        let peer = format!("virtio:{name}");
        serve_stream(rd, wr, peer, sup.clone(), limits.clone(), Transport::Serial).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_found_by_name_not_by_number() {
        let d = tempfile::tempdir().unwrap();
        for (dir, name) in [("vport1p1", "org.other\n"), ("vport2p1", "org.allox.ctl\n")] {
            std::fs::create_dir_all(d.path().join(dir)).unwrap();
            std::fs::write(d.path().join(dir).join("name"), name).unwrap();
        }
        assert_eq!(
            find_port_in(d.path(), Path::new("/dev"), "org.allox.ctl"),
            Some(PathBuf::from("/dev/vport2p1"))
        );
        assert_eq!(find_port_in(d.path(), Path::new("/dev"), "org.none"), None);
        assert_eq!(
            find_port_in(&d.path().join("missing"), Path::new("/dev"), "x"),
            None
        );
    }
}
