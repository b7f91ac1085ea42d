//! The relay between a proxy client and its server, once the broker has
//! connected them: `splice(2)` through a pipe, so the bytes never enter
//! user space, driven by the sockets' readiness on the async runtime's
//! workers. An idle connection costs no thread: each direction waits for
//! its reader to be readable, moves what is there into its pipe without
//! blocking (`SPLICE_F_NONBLOCK`, on non-blocking sockets), then waits for
//! its writer to be writable until the pipe is empty again. A direction's
//! pipe is made when its first bytes arrive and holds at most what one
//! `splice` moved, so writing into it never waits.
//!
//! Each direction copies until its reader's end of stream, which it passes
//! on as a shutdown of the writer's sending side (a half close); an error
//! on either side shuts both sockets down, which ends the other direction
//! too. Dropping the relay's future (its session ended) closes both.

use rustix::fd::{AsFd, OwnedFd};
use rustix::net::Shutdown;
use rustix::pipe::{pipe_with, splice, PipeFlags, SpliceFlags};
use std::io;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// The pipe's capacity asked for (an unprivileged process gets up to
/// `/proc/sys/fs/pipe-max-size`, 1 MiB by default), and what one `splice`
/// moves at most: fewer calls per byte than the default 64 KiB.
const PIPE: usize = 1024 * 1024;

/// Relays between `a` and `b` until both directions are done, or until
/// `ended` (the session's end: both are then shut down, however far they
/// were); returns the bytes from `a` to `b` and from `b` to `a`. `tally`
/// is told of them as they move (from `a` to `b`, from `b` to `a`), so
/// that a long connection is counted while it lasts.
pub async fn relay(
    a: TcpStream,
    b: TcpStream,
    ended: impl std::future::Future,
    tally: &(dyn Fn(u64, u64) + Sync),
) -> (u64, u64) {
    let (mut up, mut down) = (0u64, 0u64);
    {
        let to_b = |n| tally(n, 0);
        let to_a = |n| tally(0, n);
        let both = async {
            tokio::join!(
                direction(&a, &b, &mut up, &to_b),
                direction(&b, &a, &mut down, &to_a)
            )
        };
        tokio::select! {
            _ = both => {}
            _ = ended => {
                let _ = rustix::net::shutdown(a.as_fd(), Shutdown::Both);
                let _ = rustix::net::shutdown(b.as_fd(), Shutdown::Both);
            }
        }
    }
    (up, down)
}

/// Copies `from` to `to` until `from` ends, counting the bytes moved in
/// `moved` and telling `tally` of them.
async fn direction(
    from: &TcpStream,
    to: &TcpStream,
    moved: &mut u64,
    tally: &(dyn Fn(u64) + Sync),
) {
    match pump(from, to, moved, tally).await {
        Ok(()) => {
            let _ = rustix::net::shutdown(to.as_fd(), Shutdown::Write);
        }
        Err(_) => {
            let _ = rustix::net::shutdown(from.as_fd(), Shutdown::Both);
            let _ = rustix::net::shutdown(to.as_fd(), Shutdown::Both);
        }
    }
}

/// A direction's pipe: its read and write ends, and what one `splice`
/// into it moves at most.
struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
    chunk: usize,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let (r, w) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        // Smaller if that is all the system allows.
        let chunk = rustix::pipe::fcntl_setpipe_size(&w, PIPE).unwrap_or(64 * 1024);
        Ok(Pipe { r, w, chunk })
    }
}

const NONBLOCK_MOVE: SpliceFlags = SpliceFlags::MOVE.union(SpliceFlags::NONBLOCK);

/// The loop of [`direction`]: `Ok` at `from`'s end of stream, `Err` when
/// either side fails.
async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    moved: &mut u64,
    tally: &(dyn Fn(u64) + Sync),
) -> io::Result<()> {
    let mut pipe: Option<Pipe> = None;
    loop {
        from.readable().await?;
        let p = match &pipe {
            Some(p) => p,
            None => pipe.insert(Pipe::new()?),
        };
        let n = match from.try_io(Interest::READABLE, || {
            splice(from, None, &p.w, None, p.chunk, NONBLOCK_MOVE).map_err(io::Error::from)
        }) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                splice(&p.r, None, to, None, left, NONBLOCK_MOVE).map_err(io::Error::from)
            }) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(m) => {
                    left -= m;
                    *moved += m as u64;
                    tally(m as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// A TCP stream that asks for quick acknowledgements after each read: a
/// peer that sends an answer in two writes with Nagle on (a head, then a
/// body) sends the second only once the first is acknowledged, which a
/// kept-alive connection otherwise delays by up to 40 ms. Quick-ACK mode
/// lapses by itself, so it is asked for again after each read.
pub struct QuickAck(pub TcpStream);

impl tokio::io::AsyncRead for QuickAck {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.0).poll_read(cx, buf);
        if matches!(polled, std::task::Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let _ = rustix::net::sockopt::set_tcp_quickack(&self.0, true);
        }
        polled
    }
}

impl tokio::io::AsyncWrite for QuickAck {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, data)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A connected pair of loopback sockets.
    async fn pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap());
        let (c, s) = tokio::join!(c, l.accept());
        (c.unwrap(), s.unwrap().0)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_byte_goes_each_way_and_a_half_close_passes_on() {
        // client <-> (a relay b) <-> server
        let (mut client, a) = pair().await;
        let (b, mut server) = pair().await;
        let relayed = tokio::spawn(relay(a, b, std::future::pending::<()>(), &uncounted));
        let up: Vec<u8> = (0..5_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let down: Vec<u8> = (0..3_000_001u32).map(|i| (i * 13 % 241) as u8).collect();
        let (u, d) = (up.clone(), down.clone());
        let srv = tokio::spawn(async move {
            let mut got = Vec::new();
            // The client's end of stream arrives as the server's.
            server.read_to_end(&mut got).await.unwrap();
            server.write_all(&d).await.unwrap();
            server.shutdown().await.unwrap();
            got
        });
        client.write_all(&u).await.unwrap();
        client.shutdown().await.unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        assert!(srv.await.unwrap() == up, "the server got other bytes");
        assert!(back == down, "the client got other bytes");
        assert_eq!(relayed.await.unwrap(), (up.len() as u64, down.len() as u64));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_relay_ends_both_connections() {
        let (mut client, a) = pair().await;
        let (b, mut server) = pair().await;
        let relayed = tokio::spawn(relay(a, b, std::future::pending::<()>(), &uncounted));
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).await.unwrap();
        relayed.abort();
        let _ = relayed.await;
        // Both ends see the end of stream (or a reset), not silence.
        let mut rest = Vec::new();
        let c = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            client.read_to_end(&mut rest),
        );
        assert!(c.await.is_ok(), "the client's side was left open");
        let s = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            server.read_to_end(&mut rest),
        );
        assert!(s.await.is_ok(), "the server's side was left open");
    }

    /// The session's end ends a relay whose server never closes its side,
    /// with the client's side half-closed (FIN-WAIT-2 for ever, before):
    /// both ends see the end, and the bytes moved are counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_session_s_end_ends_a_relay_a_server_holds_open() {
        let (mut client, a) = pair().await;
        let (b, mut server) = pair().await;
        let (end, mut ended) = tokio::sync::watch::channel(false);
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let tallied = sent.clone();
        let relayed = tokio::spawn(async move {
            let tally = |up: u64, down: u64| {
                assert_eq!(down, 0);
                tallied.fetch_add(up, std::sync::atomic::Ordering::Relaxed);
            };
            let ended = async move {
                let _ = ended.wait_for(|e| *e).await;
            };
            relay(a, b, ended, &tally).await
        });
        client.write_all(b"ping").await.unwrap();
        client.shutdown().await.unwrap();
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).await.unwrap();
        // The server holds its side open: the relay waits, as it should,
        // and the bytes it moved are told of meanwhile.
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(200), async {}).await;
        assert!(waiting.is_ok() && !relayed.is_finished());
        // (Told just after the bytes reached the server, maybe a moment
        // after it read them.)
        let told = async {
            while sent.load(std::sync::atomic::Ordering::Relaxed) < 4 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        };
        let told = tokio::time::timeout(std::time::Duration::from_secs(5), told).await;
        assert!(
            told.is_ok() && !relayed.is_finished(),
            "not told while relaying"
        );
        assert_eq!(sent.load(std::sync::atomic::Ordering::Relaxed), 4);
        end.send_replace(true);
        let moved = tokio::time::timeout(std::time::Duration::from_secs(5), relayed)
            .await
            .expect("the relay outlived its session")
            .unwrap();
        assert_eq!(moved, (4, 0));
        let mut rest = Vec::new();
        let s = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            server.read_to_end(&mut rest),
        );
        assert!(s.await.is_ok(), "the server's side was left open");
    }

    /// A relay's tally that counts nothing.
    fn uncounted(_: u64, _: u64) {}

    /// This process's thread count.
    fn threads() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn relayed_connections_cost_no_thread() {
        let before = threads();
        let mut ends = Vec::new();
        let mut relays = Vec::new();
        for _ in 0..200 {
            let (mut client, a) = pair().await;
            let (b, mut server) = pair().await;
            relays.push(tokio::spawn(relay(
                a,
                b,
                std::future::pending::<()>(),
                &uncounted,
            )));
            // Each moves a little, then idles.
            client.write_all(b"x").await.unwrap();
            let mut one = [0u8; 1];
            server.read_exact(&mut one).await.unwrap();
            ends.push((client, server));
        }
        let during = threads();
        assert!(
            during <= before + 4,
            "200 relays took threads: {before} before, {during} during"
        );
        drop(ends);
        for r in relays {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), r).await;
        }
    }
}
