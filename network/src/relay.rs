//! The relay between a proxy client and its server, once the broker has
//! connected them: `splice(2)` through a pipe, one thread a direction, so
//! the bytes never enter user space.
//!
//! Each direction copies until its reader's end of stream, which it passes
//! on as a shutdown of the writer's sending side (a half close); an error
//! on either side shuts both sockets down, which ends the other direction
//! too. Dropping the relay's future (its session ended) shuts both down as
//! well, so no thread outlives it for long.

use rustix::pipe::{pipe_with, splice, PipeFlags, SpliceFlags};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;

/// The pipe's capacity asked for (an unprivileged process gets up to
/// `/proc/sys/fs/pipe-max-size`, 1 MiB by default), and what one `splice`
/// moves at most: fewer calls per byte than the default 64 KiB.
const PIPE: usize = 1024 * 1024;

/// Relays between `a` and `b` until both directions are done; returns the
/// bytes from `a` to `b` and from `b` to `a`.
pub async fn relay(a: tokio::net::TcpStream, b: tokio::net::TcpStream) -> (u64, u64) {
    let (Ok(a), Ok(b)) = (blocking(a), blocking(b)) else {
        return (0, 0);
    };
    let (a, b) = (Arc::new(a), Arc::new(b));
    let _both = ShutDown(a.clone(), b.clone());
    let up = direction(a.clone(), b.clone());
    let down = direction(b, a);
    (up.await.unwrap_or(0), down.await.unwrap_or(0))
}

fn blocking(s: tokio::net::TcpStream) -> std::io::Result<TcpStream> {
    let s = s.into_std()?;
    s.set_nonblocking(false)?;
    Ok(s)
}

/// Shuts both sockets down when dropped.
struct ShutDown(Arc<TcpStream>, Arc<TcpStream>);

impl Drop for ShutDown {
    fn drop(&mut self) {
        let _ = self.0.shutdown(Shutdown::Both);
        let _ = self.1.shutdown(Shutdown::Both);
    }
}

/// One direction on a thread of its own; its byte count when done.
fn direction(from: Arc<TcpStream>, to: Arc<TcpStream>) -> tokio::sync::oneshot::Receiver<u64> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    // Without a thread nothing moves: the receiver sees the sender
    // dropped, and the relay's end shuts both sockets down.
    let _ = std::thread::Builder::new()
        .name("allox-relay".into())
        .spawn(move || {
            let moved = pump(&from, &to);
            let _ = tx.send(moved);
        });
    rx
}

/// Copies `from` to `to` until `from` ends; returns the bytes moved.
fn pump(from: &TcpStream, to: &TcpStream) -> u64 {
    let Ok((r, w)) = pipe_with(PipeFlags::CLOEXEC) else {
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
        return 0;
    };
    // Smaller if that is all the system allows.
    let chunk = rustix::pipe::fcntl_setpipe_size(&w, PIPE).unwrap_or(64 * 1024);
    let mut total = 0u64;
    let broken = loop {
        let n = match splice(from, None, &w, None, chunk, SpliceFlags::MOVE) {
            Ok(0) => break false,
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break true,
        };
        let mut left = n;
        while left > 0 {
            match splice(&r, None, to, None, left, SpliceFlags::MOVE) {
                Ok(m) if m > 0 => left -= m,
                Err(rustix::io::Errno::INTR) => continue,
                _ => break,
            }
        }
        total += (n - left) as u64;
        if left > 0 {
            break true;
        }
    };
    if broken {
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    } else {
        let _ = to.shutdown(Shutdown::Write);
    }
    total
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
        let relayed = tokio::spawn(relay(a, b));
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
        let relayed = tokio::spawn(relay(a, b));
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
}
