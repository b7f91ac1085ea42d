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

use crate::server::{serve_stream, Limits, Ready, Transport};
use rustix::fs::{Mode, OFlags};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// One half of the port: its own descriptor of the port's open file.
///
/// The port's readiness does not reliably come as epoll edges (a read
/// returns what one of the guest's buffers holds, often less than is
/// queued; a write takes at most 32 KiB; "the host took it" and "more came"
/// may pass before anyone waits for them), and tokio, taking a short read
/// or write for a drained descriptor, would wait for an edge that never
/// comes: a request or answer longer than one buffer (a file's chunk)
/// could wait for ever. So each read and write is a plain non-blocking
/// call, and one that would block waits for the next edge or a short
/// timer, whichever comes first (1 ms, doubling to 20 ms while nothing
/// comes, back to 1 ms once something does).
pub(crate) struct PortHalf {
    fd: tokio::io::unix::AsyncFd<rustix::fd::OwnedFd>,
    retry: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    backoff: Duration,
}

const RETRY_MIN: Duration = Duration::from_millis(1);
const RETRY_MAX: Duration = Duration::from_millis(20);

impl PortHalf {
    fn new(fd: rustix::fd::OwnedFd) -> io::Result<PortHalf> {
        // The descriptor is an OwnedFd moved in, so the I/O-safety concern
        // behind the deprecation does not apply.
        #[allow(deprecated)]
        let fd = tokio::io::unix::AsyncFd::new(fd)?;
        Ok(PortHalf {
            fd,
            retry: None,
            backoff: RETRY_MIN,
        })
    }

    /// `op` until it does not say "would block"; between tries, the next
    /// edge or the timer.
    fn poll_op<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        write: bool,
        mut op: impl FnMut(&rustix::fd::OwnedFd) -> rustix::io::Result<T>,
    ) -> std::task::Poll<io::Result<T>> {
        use std::task::Poll;
        loop {
            match op(self.fd.get_ref()) {
                Ok(v) => {
                    self.retry = None;
                    self.backoff = RETRY_MIN;
                    return Poll::Ready(Ok(v));
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => {}
                Err(e) => return Poll::Ready(Err(e.into())),
            }
            let edge = if write {
                self.fd
                    .poll_write_ready(cx)
                    .map(|r| r.map(|mut g| g.clear_ready()))
            } else {
                self.fd
                    .poll_read_ready(cx)
                    .map(|r| r.map(|mut g| g.clear_ready()))
            };
            match edge {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {}
            }
            if self.retry.is_none() {
                self.retry = Some(Box::pin(tokio::time::sleep(self.backoff)));
                self.backoff = (self.backoff * 2).min(RETRY_MAX);
            }
            if let Some(sleep) = self.retry.as_mut() {
                if std::future::Future::poll(sleep.as_mut(), cx).is_pending() {
                    return Poll::Pending;
                }
            }
            self.retry = None;
        }
    }
}

impl tokio::io::AsyncRead for PortHalf {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let this = self.get_mut();
        let dst = buf.initialize_unfilled();
        match this.poll_op(cx, false, |fd| rustix::io::read(fd, &mut *dst)) {
            std::task::Poll::Ready(Ok(n)) => {
                buf.advance(n);
                std::task::Poll::Ready(Ok(()))
            }
            std::task::Poll::Ready(Err(e)) => std::task::Poll::Ready(Err(e)),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl tokio::io::AsyncWrite for PortHalf {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        self.get_mut()
            .poll_op(cx, true, |fd| rustix::io::write(fd, buf))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Opens the port as two async halves on two descriptors of one open
/// file.
fn open_port(dev: &Path) -> io::Result<(PortHalf, PortHalf)> {
    let fd = rustix::fs::open(
        dev,
        OFlags::RDWR | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )?;
    let dup = rustix::io::fcntl_dupfd_cloexec(&fd, 3)?;
    Ok((PortHalf::new(fd)?, PortHalf::new(dup)?))
}

/// Serves the port named `name` until the task is dropped. The port is
/// opened once and kept open: closing it would tell QEMU the guest went
/// away. Hosts come and go on it; each starts a new conversation. It is
/// served from the daemon's start: a Hello is answered before the store
/// is open, and requests wait until `sup` is ready.
pub async fn serve_virtio(name: String, sup: Ready, limits: Limits) {
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
