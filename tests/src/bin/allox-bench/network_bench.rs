//! The session network's broker against direct connections on the
//! loopback, for `allox-bench` (`ALLOX_BENCH_ONLY=network`): connection
//! setup, relay throughput, and the spawn of a run in a session with the
//! network plugin against one without.

use allox_integration::BtrfsFs;
use allox_network::broker::{Broker, SystemResolver, Timeouts};
use allox_network::{Layer, Policy};
use allox_protocol::{NetworkMode, Request, Response, SessionCreate};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::{pct, us_or_ms};

/// A server that answers each byte with the same byte until end of
/// stream (setup), or reads everything and answers the count (bulk).
async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                let mut total = 0u64;
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(1) if total == 0 && buf[0] == b'?' => {
                            // A one-byte ping: echo it.
                            if s.write_all(&buf[..1]).await.is_err() {
                                return;
                            }
                        }
                        Ok(n) => total += n as u64,
                    }
                }
                let _ = s.write_all(&total.to_le_bytes()).await;
            });
        }
    });
    addr
}

/// The broker on a listener of its own, allowing only `server`.
async fn broker_for(server: SocketAddr) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let allow = [server.to_string()];
    let none: &[String] = &[];
    let policy = Arc::new(Policy::new(vec![Layer::new(
        "session",
        Some(&allow[..]),
        none,
    )
    .unwrap()]));
    let broker = Broker {
        resolver: Arc::new(SystemResolver),
        timeouts: Timeouts::default(),
    };
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let (b, p) = (broker.clone(), policy.clone());
            tokio::spawn(async move {
                b.serve(c, &p).await;
            });
        }
    });
    addr
}

/// A connection to `server`, directly or through the broker at `proxy`.
async fn open(server: SocketAddr, proxy: Option<SocketAddr>) -> TcpStream {
    let Some(proxy) = proxy else {
        let s = TcpStream::connect(server).await.unwrap();
        s.set_nodelay(true).unwrap();
        return s;
    };
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(format!("CONNECT {server} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

/// Connect, one byte there and back, close.
async fn setup_once(server: SocketAddr, proxy: Option<SocketAddr>) -> Duration {
    let t = Instant::now();
    let mut s = open(server, proxy).await;
    s.write_all(b"?").await.unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await.unwrap();
    let el = t.elapsed();
    drop(s);
    el
}

/// `bytes` to the server and its count back; MB/s.
async fn bulk(server: SocketAddr, proxy: Option<SocketAddr>, bytes: u64) -> f64 {
    let mut s = open(server, proxy).await;
    let chunk = vec![7u8; 256 * 1024];
    let t = Instant::now();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        s.write_all(&chunk[..n]).await.unwrap();
        left -= n as u64;
    }
    s.shutdown().await.unwrap();
    let mut count = [0u8; 8];
    s.read_exact(&mut count).await.unwrap();
    assert_eq!(u64::from_le_bytes(count), bytes);
    bytes as f64 / t.elapsed().as_secs_f64() / 1e6
}

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let n = if quick { 200 } else { 2000 };
    let bytes: u64 = if quick { 64 << 20 } else { 512 << 20 };
    let (setup, through) = rt.block_on(async {
        let server = echo_server().await;
        let proxy = broker_for(server).await;
        let (mut direct, mut brokered) = (Vec::new(), Vec::new());
        for _ in 0..n {
            direct.push(setup_once(server, None).await);
            brokered.push(setup_once(server, Some(proxy)).await);
        }
        let (mut d, mut b) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            d.push(bulk(server, None, bytes).await);
            b.push(bulk(server, Some(proxy), bytes).await);
        }
        ((direct, brokered), (d, b))
    });
    println!("## Session network: the broker against direct connections\n");
    println!(
        "On the loopback, alternating. Setup: connect (through the broker: CONNECT and its `200`), one byte there and back; {n} each.\n"
    );
    println!("| what | p50 | p99 |");
    println!("|---|---:|---:|");
    let (direct, brokered) = setup;
    for (name, v) in [("direct", &direct), ("through the broker", &brokered)] {
        println!(
            "| {name} | {} | {} |",
            us_or_ms(pct(v, 0.5)),
            us_or_ms(pct(v, 0.99))
        );
    }
    let extra = pct(&brokered, 0.5).saturating_sub(pct(&direct, 0.5));
    println!("\nThe broker adds {} at p50.\n", us_or_ms(extra));
    let (d, b) = through;
    let med = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "Throughput, {} MiB one way, median of 5: direct {:.0} MB/s, through the broker {:.0} MB/s ({:.0}%).\n",
        bytes >> 20,
        med(&d),
        med(&b),
        100.0 * med(&b) / med(&d)
    );
    spawn_with_and_without(fs, quick)
}

/// `process.start` with wait of `/bin/true` in three sessions of one
/// daemon with the network plugin: `disabled` (the host's network),
/// `isolated` and `proxy`, alternating.
fn spawn_with_and_without(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let bd = crate::BenchDaemon::start(fs, "net", &["--plugin", "network"])?;
    let d = &bd.daemon;
    let mut c = d.client();
    c.call(Request::AgentCreate(allox_protocol::AgentCreate::new(
        "bench",
    )))?
    .map_err(anyhow::Error::msg)?;
    let modes = [
        NetworkMode::Disabled,
        NetworkMode::Isolated,
        NetworkMode::Proxy,
    ];
    for m in modes {
        c.call(Request::SessionCreate(SessionCreate {
            network: Some(m),
            ..SessionCreate::new("bench", m.as_str())
        }))?
        .map_err(anyhow::Error::msg)?;
    }
    let n = if quick { 100 } else { 1000 };
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for i in 0..n + 10 {
        for (k, m) in modes.iter().enumerate() {
            let start = allox_integration::process_start("bench", m.as_str(), &["/bin/true"]);
            let t = Instant::now();
            let r = c.call(Request::ProcessStart(start))?;
            let el = t.elapsed();
            anyhow::ensure!(
                matches!(r, Ok(Response::Exited(ref x)) if x.exit_code == Some(0)),
                "{r:?}"
            );
            if i >= 10 {
                times[k].push(el);
            }
        }
    }
    drop(bd);
    println!("`process.start` with wait of `/bin/true`, {n} each, alternating between three sessions of one daemon with `--plugin network`.\n");
    println!("| session network | p50 | p99 |");
    println!("|---|---:|---:|");
    for (name, v) in [
        ("`disabled` (the host's network; baseline)", &times[0]),
        ("`isolated`", &times[1]),
        ("`proxy`", &times[2]),
    ] {
        println!(
            "| {name} | {} | {} |",
            us_or_ms(pct(v, 0.5)),
            us_or_ms(pct(v, 0.99))
        );
    }
    let d = pct(&times[2], 0.5).as_secs_f64() - pct(&times[0], 0.5).as_secs_f64();
    println!(
        "\nA `proxy` session's run costs {:+.3} ms at p50 against a `disabled` one's.\n",
        d * 1e3
    );
    Ok(())
}
