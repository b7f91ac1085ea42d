//! The broker against real sockets on the loopback: a small HTTP server,
//! and the DNS stub on 127.0.0.1, which records the names it is asked.

use super::*;
use crate::policy::Layer;
use crate::stub::DnsStub;
use std::net::Ipv4Addr;
use tokio::net::TcpListener;

/// The DNS stub on 127.0.0.1, answering `names`.
fn dns_stub(names: &[(&str, Ipv4Addr)]) -> DnsStub {
    let table = names.iter().map(|(n, a)| (n.to_string(), *a)).collect();
    DnsStub::start(table).unwrap()
}

/// An HTTP server that answers every request with `hello <path>`.
async fn http_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let head = String::from_utf8_lossy(&buf).to_string();
                let path = head.split(' ').nth(1).unwrap_or("").to_string();
                let body = format!("hello {path}\n");
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Seen-Head: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len(),
                    head.lines().count()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    addr
}

fn policy(allow: &[&str], deny: &[&str]) -> Policy {
    Policy::new(vec![Layer::new("session", Some(allow), deny).unwrap()])
}

/// Sends `request` through the broker; returns what the client read and
/// the broker's record.
async fn through(broker: &Broker, policy: &Policy, request: &[u8]) -> (String, Attempt) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let request = request.to_vec();
    let client = tokio::spawn(async move {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&request).await.unwrap();
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).to_string()
    });
    let (s, _) = l.accept().await.unwrap();
    let opens = std::sync::atomic::AtomicUsize::new(0);
    let attempt = broker
        .serve(s, policy, &Default::default(), &|a| {
            assert!(a.allowed && a.received == 0, "{a:?}");
            opens.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            true
        })
        .await;
    // Told once of a connection it allowed, never of one it refused.
    let opens = opens.into_inner();
    assert!(
        opens == 0 || (opens == 1 && attempt.allowed),
        "{opens} {attempt:?}"
    );
    (client.await.unwrap(), attempt)
}

fn broker(dns: SocketAddr) -> Broker {
    Broker {
        resolver: Arc::new(DnsResolver::new(dns)),
        timeouts: Timeouts::default(),
        own: Arc::new(OwnAddresses::new()),
        upstream_tls: Err("no interception in this test".into()),
        ended: None,
        tally: None,
    }
}

#[tokio::test]
async fn an_allowed_request_by_name_is_resolved_by_the_broker_and_relayed() {
    let server = http_server().await;
    let dns = dns_stub(&[("files.test", Ipv4Addr::LOCALHOST)]);
    let b = broker(dns.addr());
    // The name and, since it resolves to the loopback, its address.
    let p = policy(
        &["files.test", &format!("127.0.0.1:{}", server.port())],
        &[],
    );
    let req = format!(
        "GET http://files.test:{}/simple/ HTTP/1.1\r\nHost: files.test\r\nProxy-Connection: keep-alive\r\n\r\n",
        server.port()
    );
    let (out, a) = through(&b, &p, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    assert!(out.ends_with("hello /simple/\n"), "{out}");
    // Request line, Host, Connection: close, blank line: the proxy's own
    // header was not forwarded.
    assert!(out.contains("X-Seen-Head: 4"), "{out}");
    assert!(a.allowed, "{a:?}");
    assert_eq!(
        (a.kind, a.host.as_str(), a.port),
        ("HTTP", "files.test", server.port())
    );
    assert_eq!(a.addr, Some(server));
    assert!(a.sent > 0 && a.received as usize == out.len(), "{a:?}");
    assert!(dns.asked().contains(&"files.test".to_string()));
}

#[tokio::test]
async fn connect_opens_a_tunnel() {
    let server = http_server().await;
    let dns = dns_stub(&[]);
    let b = broker(dns.addr());
    let p = policy(&[&format!("127.0.0.1:{}", server.port())], &[]);
    let req = format!(
        "CONNECT 127.0.0.1:{0} HTTP/1.1\r\nHost: 127.0.0.1:{0}\r\n\r\nGET /tunnelled HTTP/1.1\r\nHost: x\r\n\r\n",
        server.port()
    );
    let (out, a) = through(&b, &p, req.as_bytes()).await;
    assert!(
        out.starts_with("HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK"),
        "{out}"
    );
    assert!(out.ends_with("hello /tunnelled\n"), "{out}");
    assert!(a.allowed && a.kind == "CONNECT", "{a:?}");
}

#[tokio::test]
async fn a_denied_name_is_refused_before_any_dns_query() {
    let dns = dns_stub(&[("blocked.test", Ipv4Addr::new(198, 51, 100, 1))]);
    let b = broker(dns.addr());
    for (p, why) in [
        (
            policy(&["*.test"], &["blocked.test"]),
            "denied by the session rule \"blocked.test\"",
        ),
        (
            policy(&["allowed.test"], &[]),
            "not on the session allow list",
        ),
    ] {
        let (out, a) = through(&b, &p, b"CONNECT blocked.test:443 HTTP/1.1\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 403 Forbidden"), "{out}");
        assert!(out.contains(why), "{out}");
        assert!(!a.allowed && a.verdict.contains(why), "{a:?}");
        assert_eq!(a.addr, None);
    }
    assert!(dns.asked().is_empty(), "the broker asked the resolver");
}

#[tokio::test]
async fn a_name_that_resolves_to_a_private_or_loopback_address_is_refused() {
    let server = http_server().await;
    let dns = dns_stub(&[
        ("inside.test", Ipv4Addr::new(10, 1, 2, 3)),
        ("local.test", Ipv4Addr::LOCALHOST),
    ]);
    let b = broker(dns.addr());
    let p = policy(&["*.test"], &[]);
    let (out, a) = through(&b, &p, b"CONNECT inside.test:443 HTTP/1.1\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 403 Forbidden"), "{out}");
    assert!(out.contains("10.1.2.3 (private)"), "{out}");
    assert!(!a.allowed);
    let req = format!("CONNECT local.test:{} HTTP/1.1\r\n\r\n", server.port());
    let (out, _) = through(&b, &p, req.as_bytes()).await;
    assert!(out.contains("127.0.0.1 (loopback)"), "{out}");
    assert_eq!(dns.asked(), ["inside.test", "local.test"]);
}

#[tokio::test]
async fn unknown_names_unreachable_ports_and_bad_heads_get_their_own_answers() {
    let dns = dns_stub(&[]);
    let b = broker(dns.addr());
    let p = policy(&["*"], &[]);
    let (out, a) = through(&b, &p, b"CONNECT nowhere.test:443 HTTP/1.1\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 502 Bad Gateway"), "{out}");
    assert!(out.contains("cannot resolve nowhere.test"), "{out}");
    assert!(!a.allowed);
    // A port nothing listens on (allowed, so the connection is tried).
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let p = policy(&[&format!("127.0.0.1:{}", closed.port())], &[]);
    let req = format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", closed.port());
    let (out, _) = through(&b, &p, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 502 Bad Gateway"), "{out}");
    assert!(out.contains("refused"), "{out}");
    let (out, a) = through(&b, &p, b"GET /not-a-proxy-request HTTP/1.1\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 400 Bad Request"), "{out}");
    assert!(a.host.is_empty());
}

#[tokio::test]
async fn a_refused_loopback_is_named_as_the_supervisor_s_not_the_session_s() {
    let dns = dns_stub(&[("local.test", Ipv4Addr::LOCALHOST)]);
    let b = broker(dns.addr());
    let meant = "the loopback is that of the machine the supervisor runs on, \
                 not the session's own";
    // Not on the allow list (another port of it is), as a special address,
    // by name, by a name that resolves to it: each refusal says which.
    let p = policy(&["127.0.0.1:8095", "*.test", "localhost:1"], &[]);
    for req in [
        "GET http://127.0.0.1:8096/ HTTP/1.1\r\n\r\n",
        "CONNECT [::1]:8095 HTTP/1.1\r\n\r\n",
        "CONNECT localhost:2 HTTP/1.1\r\n\r\n",
        "CONNECT local.test:8096 HTTP/1.1\r\n\r\n",
    ] {
        let (out, a) = through(&b, &p, req.as_bytes()).await;
        assert!(out.starts_with("HTTP/1.1 403 Forbidden"), "{req}: {out}");
        assert!(out.contains(meant), "{req}: {out}");
        assert!(!a.allowed && a.verdict.contains(meant), "{a:?}");
    }
    // Other refusals do not speak of it.
    let (out, _) = through(&b, &p, b"CONNECT other.example:443 HTTP/1.1\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 403 Forbidden"), "{out}");
    assert!(!out.contains("loopback"), "{out}");
}

/// A UDP socket on 127.0.0.1 that takes every question and answers none.
fn silent_dns() -> std::net::UdpSocket {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap()
}

#[test]
fn the_system_resolver_waits_for_no_thread() {
    // A runtime whose blocking pool has one thread, as the daemon's is
    // bounded: lookups that never answer must not take it.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let silent = silent_dns();
    // As /etc/resolv.conf would say it, but at the silent server's port
    // (a resolv.conf names none).
    let (_, options) = hickory_resolver::system_conf::parse_resolv_conf(
        "nameserver 127.0.0.1\noptions timeout:5 attempts:1\n",
    )
    .unwrap();
    let port = silent.local_addr().unwrap().port();
    let group = hickory_resolver::config::NameServerConfigGroup::from_ips_clear(
        &[Ipv4Addr::LOCALHOST.into()],
        port,
        true,
    );
    let config = hickory_resolver::config::ResolverConfig::from_parts(None, vec![], group);
    let r = Arc::new(SystemResolver::from_parts(config, options));
    rt.block_on(async move {
        let mut asked = Vec::new();
        for i in 0..32 {
            let r = r.clone();
            asked.push(tokio::spawn(async move {
                let _ = r.resolve(&format!("n{i}.silent.test")).await;
            }));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let pool = tokio::task::spawn_blocking(|| ());
        tokio::time::timeout(Duration::from_secs(1), pool)
            .await
            .expect("the blocking pool was held by lookups")
            .unwrap();
        // /etc/hosts is read: localhost resolves at once.
        let local = tokio::time::timeout(Duration::from_secs(1), r.resolve("localhost")).await;
        assert!(
            matches!(&local, Ok(Ok(a)) if a.iter().any(|a| a.is_loopback())),
            "{local:?}"
        );
        for a in asked {
            a.abort();
        }
    });
}

#[test]
fn the_system_resolver_reads_a_resolv_conf() {
    let d = std::env::temp_dir().join(format!("allox-resolv-{}.conf", std::process::id()));
    std::fs::write(&d, "nameserver 127.0.0.1\nsearch example.test\n").unwrap();
    let r = SystemResolver::from_resolv_conf(&d);
    let _ = std::fs::remove_file(&d);
    assert!(r.is_ok());
    let missing =
        SystemResolver::from_resolv_conf(std::path::Path::new("/nonexistent/resolv.conf"));
    assert!(missing.is_err());
}

/// A resolver whose lookups never end.
struct Never;

impl Resolve for Never {
    fn resolve<'a>(
        &'a self,
        _: &'a str,
    ) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send + 'a>> {
        Box::pin(std::future::pending())
    }
}

#[tokio::test]
async fn lookups_past_a_session_s_budget_are_refused_at_once_naming_it() {
    let budget = Arc::new(LookupBudget::new(
        Arc::new(Never),
        2,
        "2 lookups in flight (--budget-flag)".into(),
    ));
    let held: Vec<_> = (0..2)
        .map(|_| {
            let b = budget.clone();
            tokio::spawn(async move { b.resolve("a.test").await })
        })
        .collect();
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let third = tokio::time::timeout(Duration::from_secs(1), budget.resolve("b.test"))
        .await
        .expect("the lookup past the budget waited");
    let e = third.unwrap_err();
    assert!(e.to_string().contains("--budget-flag"), "{e}");
    // One ends: room for the next.
    held[0].abort();
    let _ = held.into_iter().next().unwrap().await;
    let next = tokio::time::timeout(Duration::from_millis(100), budget.resolve("c.test")).await;
    assert!(
        next.is_err(),
        "a lookup within the budget was refused: {next:?}"
    );
}
