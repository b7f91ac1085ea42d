//! The session network's broker against direct connections on the
//! loopback, for `allox-bench` (`ALLOX_BENCH_ONLY=network`): connection
//! setup, relay throughput, the spawn of a run in a session with the
//! network plugin against one without, and the daemon's `ping` while a
//! session floods its proxy with connections, or with lookups that never
//! answer, against `ping` with no flood, in the same run.

use allox_integration::BtrfsFs;
use allox_network::broker::{Broker, SystemResolver, Timeouts};
use allox_network::own::OwnAddresses;
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
        resolver: Arc::new(SystemResolver::new()),
        timeouts: Timeouts::default(),
        own: Arc::new(OwnAddresses::new()),
        upstream_tls: Err("not measured here".into()),
        ended: None,
        tally: None,
    };
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let (b, p) = (broker.clone(), policy.clone());
            tokio::spawn(async move {
                b.serve(c, &p, &Default::default(), &|_| true).await;
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
    crate::intercept_bench::run(quick)?;
    spawn_with_and_without(fs, quick)?;
    ping_under_floods(fs, quick)
}

/// A session's program that floods its proxy until `/allox/session/done`
/// exists: `connections` keeps 2,000 connections open (past the session's
/// budget each new one is refused) and opens and closes more; `lookups`
/// asks, from 64 threads, for names the resolver never answers.
const FLOOD: &str = r#"import os, socket, sys, threading, time
def done():
    return os.path.exists("/allox/session/done")
def connections():
    held = []
    while not done():
        try:
            s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
            held.append(s)
        except OSError:
            time.sleep(0.01)
        if len(held) >= 2000:
            held.pop(0).close()
def lookups(k):
    i = 0
    while not done():
        i += 1
        try:
            s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
            s.sendall(b"CONNECT n%d-%d.silent.test:80 HTTP/1.1

" % (k, i))
            s.settimeout(30)
            s.recv(4096)
            s.close()
        except OSError:
            pass
if sys.argv[1] == "connections":
    connections()
else:
    ts = [threading.Thread(target=lookups, args=(k,)) for k in range(64)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
"#;

/// The daemon's `ping`, `n` times 2 ms apart.
fn pings(c: &mut allox_ctl::client::Client, n: usize) -> anyhow::Result<Vec<Duration>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = c.call(Request::Ping(allox_protocol::Ping {}))?;
        v.push(t.elapsed());
        anyhow::ensure!(matches!(r, Ok(Response::Pong(_))), "{r:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(v)
}

/// `ping` with no flood, during a connection flood and during a lookup
/// flood from a `proxy` session (its resolver a UDP socket that never
/// answers).
fn ping_under_floods(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let silent = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let resolver = silent.local_addr()?.to_string();
    let bd = crate::BenchDaemon::start(
        fs,
        "netflood",
        &[
            "--plugin",
            "network",
            "--network-resolver",
            &resolver,
            "--network-allow",
            "*.test",
        ],
    )?;
    let d = &bd.daemon;
    let mut c = d.client();
    c.call(Request::AgentCreate(allox_protocol::AgentCreate::new(
        "bench",
    )))?
    .map_err(anyhow::Error::msg)?;
    let n = if quick { 300 } else { 2000 };
    let mut rows = Vec::new();
    rows.push(("no flood (baseline)", pings(&mut c, n)?));
    for kind in ["connections", "lookups"] {
        c.call(Request::SessionCreate(SessionCreate {
            network: Some(NetworkMode::Proxy),
            ..SessionCreate::new("bench", kind)
        }))?
        .map_err(anyhow::Error::msg)?;
        let current = match c.call(Request::SessionList(allox_protocol::AgentRef {
            agent_id: "bench".into(),
        }))? {
            Ok(Response::Sessions(l)) => l
                .sessions
                .into_iter()
                .find(|x| x.session_id == kind)
                .map(|x| std::path::PathBuf::from(x.current))
                .ok_or_else(|| anyhow::anyhow!("no session {kind}"))?,
            other => anyhow::bail!("{other:?}"),
        };
        std::fs::write(current.join("flood.py"), FLOOD)?;
        let start = allox_protocol::ProcessStart {
            wait: false,
            ..allox_integration::process_start(
                "bench",
                kind,
                &["python3", "/allox/session/flood.py", kind],
            )
        };
        let run = match c.call(Request::ProcessStart(start))? {
            Ok(Response::Started(s)) => s.run_id,
            other => anyhow::bail!("{other:?}"),
        };
        // Let it reach its peak.
        std::thread::sleep(Duration::from_secs(3));
        let v = pings(&mut c, n)?;
        std::fs::write(current.join("done"), "")?;
        let _ = c.call(Request::ProcessWait(allox_protocol::ProcessWait {
            agent_id: "bench".into(),
            session_id: kind.into(),
            run_id: run,
            timeout_ms: Some(60_000),
        }))?;
        rows.push((
            match kind {
                "connections" => "a session holding 2,000 proxy connections and opening more",
                _ => "a session asking 64 names at a time that never resolve",
            },
            v,
        ));
    }
    drop(bd);
    println!("The daemon's `ping` ({n} each, 2 ms apart) while a `proxy` session floods its proxy, against no flood, in one run.\n");
    println!("| during | p50 | p99 |");
    println!("|---|---:|---:|");
    for (name, v) in &rows {
        println!(
            "| {name} | {} | {} |",
            us_or_ms(pct(v, 0.5)),
            us_or_ms(pct(v, 0.99))
        );
    }
    println!();
    Ok(())
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
