//! HTTPS through an intercepting secret against HTTPS through a plain
//! `CONNECT` tunnel to the same server, for `allox-bench`
//! (`ALLOX_BENCH_ONLY=network`): the same client, the same TLS server on
//! the loopback, one broker serving both ways (the tunnel's client
//! verifies the server's own certificate end to end; the intercepted
//! client verifies the session's authority's, and the broker the
//! server's). Setup: connect, `CONNECT`, TLS handshake, one request and
//! its whole answer. Throughput: one upload, the server answering the
//! count.

use allox_network::broker::{Broker, SessionSecrets, SystemResolver, Timeouts};
use allox_network::intercept::{self, SessionCa};
use allox_network::own::OwnAddresses;
use allox_network::rustls;
use allox_network::secrets::Secret;
use allox_network::tokio_rustls::{TlsAcceptor, TlsConnector};
use allox_network::{Layer, Policy};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::{pct, us_or_ms};

/// Reads up to and including the end of a head; what came after it.
async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(i + 4);
            return (String::from_utf8_lossy(&buf).into_owned(), rest);
        }
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the stream ended inside a head");
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn content_length(head: &str) -> u64 {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0)
}

/// A TLS server on 127.0.0.1 answering each request with the count of its
/// body's bytes (and whether it carried the injected header), then
/// closing.
async fn tls_server(config: Arc<rustls::ServerConfig>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(s).await else {
                    return;
                };
                let (head, rest) = read_head(&mut s).await;
                let want = content_length(&head);
                let mut got = rest.len() as u64;
                let mut buf = vec![0u8; 256 * 1024];
                while got < want {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n as u64,
                    }
                }
                let body = format!("{got} {}", head.contains("Bearer bench-value"));
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// The broker on a listener of its own, allowing only `server`, with
/// `secrets`.
async fn broker(
    server: SocketAddr,
    secrets: SessionSecrets,
    upstream: Arc<rustls::ClientConfig>,
) -> SocketAddr {
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
        upstream_tls: Ok(upstream),
        ended: None,
        tally: None,
    };
    let secrets = Arc::new(secrets);
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let (b, p, s) = (broker.clone(), policy.clone(), secrets.clone());
            tokio::spawn(async move {
                b.serve(c, &p, &s, &|_| true).await;
            });
        }
    });
    addr
}

/// Through `proxy` to `server` over TLS trusting `roots`: one request
/// with `body` bytes; the answer's body.
async fn request(
    server: SocketAddr,
    proxy: SocketAddr,
    roots: Arc<rustls::ClientConfig>,
    body: u64,
) -> String {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(format!("CONNECT {server} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (head, _) = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let name = intercept::server_name("127.0.0.1").unwrap();
    let mut t = TlsConnector::from(roots).connect(name, s).await.unwrap();
    t.write_all(
        format!(
            "POST /v1/x HTTP/1.1\r\nHost: {server}\r\nAuthorization: Bearer PLACEHOLDER\r\nContent-Length: {body}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let chunk = vec![7u8; 256 * 1024];
    let mut left = body;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        t.write_all(&chunk[..n]).await.unwrap();
        left -= n as u64;
    }
    t.flush().await.unwrap();
    let (head, mut rest) = read_head(&mut t).await;
    let want = content_length(&head) as usize;
    let mut b = [0u8; 256];
    while rest.len() < want {
        let n = t.read(&mut b).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        rest.extend_from_slice(&b[..n]);
    }
    drop(t);
    String::from_utf8_lossy(&rest).into_owned()
}

fn client_trusting(pem: &str, dir: &std::path::Path, name: &str) -> Arc<rustls::ClientConfig> {
    let f = dir.join(name);
    std::fs::write(&f, pem).unwrap();
    intercept::upstream_config(Some(&f)).unwrap()
}

pub fn run(quick: bool) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let n = if quick { 100 } else { 1000 };
    let bytes: u64 = if quick { 32 << 20 } else { 256 << 20 };
    let dir = tempfile::tempdir()?;
    // The server's authority (which the broker and the tunnel's client
    // trust) and the session's (which the intercepted client trusts).
    let (server_ca, server_key) = intercept::new_ca("bench/server")?;
    let server_tls = SessionCa::load("bench/server", &server_key)?.server_config("127.0.0.1")?;
    let (session_cert, session_key) = intercept::new_ca("bench/session")?;
    let session_ca = Arc::new(SessionCa::load("bench/session", &session_key)?);
    let to_server = client_trusting(&server_ca, dir.path(), "server.pem");
    let to_session = client_trusting(&session_cert, dir.path(), "session.pem");
    let (setup, through) = rt.block_on(async {
        let server = tls_server(server_tls).await;
        let secret = Secret::new(
            "API_KEY",
            "PLACEHOLDER".into(),
            zeroize::Zeroizing::new("bench-value".into()),
            &[server.to_string()],
            None,
            None,
            true,
        )
        .unwrap();
        let tunnel = broker(server, SessionSecrets::default(), to_server.clone()).await;
        let intercepting = broker(
            server,
            SessionSecrets {
                list: vec![secret],
                ca: Some(session_ca),
            },
            to_server.clone(),
        )
        .await;
        assert_eq!(
            request(server, tunnel, to_server.clone(), 0).await,
            "0 false"
        );
        assert_eq!(
            request(server, intercepting, to_session.clone(), 0).await,
            "0 true",
            "the intercepting broker put the secret in"
        );
        let (mut t, mut i) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let s = Instant::now();
            request(server, tunnel, to_server.clone(), 0).await;
            t.push(s.elapsed());
            let s = Instant::now();
            request(server, intercepting, to_session.clone(), 0).await;
            i.push(s.elapsed());
        }
        let (mut tb, mut ib) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let s = Instant::now();
            request(server, tunnel, to_server.clone(), bytes).await;
            tb.push(bytes as f64 / s.elapsed().as_secs_f64() / 1e6);
            let s = Instant::now();
            request(server, intercepting, to_session.clone(), bytes).await;
            ib.push(bytes as f64 / s.elapsed().as_secs_f64() / 1e6);
        }
        ((t, i), (tb, ib))
    });
    let (t, i) = setup;
    println!("## Secrets: HTTPS intercepted against a CONNECT tunnel\n");
    println!(
        "One TLS server on the loopback; one broker each way; alternating. Setup: connect, `CONNECT`, TLS handshake, a request and its whole answer; {n} each.\n"
    );
    println!("| way | p50 | p99 |");
    println!("|---|---:|---:|");
    for (name, v) in [
        ("CONNECT tunnel, TLS end to end (baseline)", &t),
        ("intercepted, secret injected", &i),
    ] {
        println!(
            "| {name} | {} | {} |",
            us_or_ms(pct(v, 0.5)),
            us_or_ms(pct(v, 0.99))
        );
    }
    let extra = pct(&i, 0.5).saturating_sub(pct(&t, 0.5));
    println!(
        "\nInterception adds {} at p50 (budget ≤ +2 ms: {}).\n",
        us_or_ms(extra),
        if extra <= Duration::from_millis(2) {
            "met"
        } else {
            "not met"
        }
    );
    let (tb, ib) = through;
    let med = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let ratio = med(&ib) / med(&tb);
    println!(
        "Throughput, {} MiB uploaded, median of 5: tunnel {:.0} MB/s, intercepted {:.0} MB/s ({:.0}%; budget ≥ 50%: {}).\n",
        bytes >> 20,
        med(&tb),
        med(&ib),
        100.0 * ratio,
        if ratio >= 0.5 { "met" } else { "not met" }
    );
    Ok(())
}
