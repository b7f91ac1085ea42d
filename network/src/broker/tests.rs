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
    let attempt = broker.serve(s, policy).await;
    (client.await.unwrap(), attempt)
}

fn broker(dns: SocketAddr) -> Broker {
    Broker {
        resolver: Arc::new(DnsResolver::new(dns)),
        timeouts: Timeouts::default(),
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
