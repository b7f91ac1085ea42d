//! The broker against real sockets on the loopback: a small HTTP server,
//! and a DNS stub on 127.0.0.1 that counts the queries it gets.

use super::*;
use crate::policy::{Egress, Layer};
use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{rdata::A, RData, Record, RecordType};
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::net::{TcpListener, UdpSocket};

/// A DNS server answering A queries from `names`; counts every query.
async fn dns_stub(names: HashMap<String, Ipv4Addr>) -> (SocketAddr, Arc<AtomicUsize>) {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        loop {
            let Ok((n, from)) = sock.recv_from(&mut buf).await else {
                return;
            };
            seen.fetch_add(1, Ordering::SeqCst);
            let Ok(q) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut r = Message::new();
            r.set_id(q.id());
            r.set_message_type(MessageType::Response);
            r.set_op_code(q.op_code());
            r.set_recursion_desired(q.recursion_desired());
            r.set_recursion_available(true);
            let mut known = false;
            for query in q.queries() {
                r.add_query(query.clone());
                let name = query.name().to_ascii();
                if let Some(ip) = names.get(name.trim_end_matches('.')) {
                    known = true;
                    if query.query_type() == RecordType::A {
                        r.add_answer(Record::from_rdata(
                            query.name().clone(),
                            60,
                            RData::A(A(*ip)),
                        ));
                    }
                }
            }
            if !known {
                r.set_response_code(ResponseCode::NXDomain);
            }
            let _ = sock.send_to(&r.to_vec().unwrap(), from).await;
        }
    });
    (addr, count)
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
    let e = Egress {
        allow: Some(allow.iter().map(|s| s.to_string()).collect()),
        deny: deny.iter().map(|s| s.to_string()).collect(),
    };
    Policy::new(vec![Layer::new("session", &e).unwrap()])
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
    let (dns, queries) = dns_stub(HashMap::from([(
        "files.test".to_string(),
        Ipv4Addr::LOCALHOST,
    )]))
    .await;
    let b = broker(dns);
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
    assert!(queries.load(Ordering::SeqCst) >= 1);
}

#[tokio::test]
async fn connect_opens_a_tunnel() {
    let server = http_server().await;
    let (dns, _) = dns_stub(HashMap::new()).await;
    let b = broker(dns);
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
    let (dns, queries) = dns_stub(HashMap::from([(
        "blocked.test".to_string(),
        Ipv4Addr::new(198, 51, 100, 1),
    )]))
    .await;
    let b = broker(dns);
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
    assert_eq!(
        queries.load(Ordering::SeqCst),
        0,
        "the broker asked the resolver"
    );
}

#[tokio::test]
async fn a_name_that_resolves_to_a_private_or_loopback_address_is_refused() {
    let server = http_server().await;
    let (dns, queries) = dns_stub(HashMap::from([
        ("inside.test".to_string(), Ipv4Addr::new(10, 1, 2, 3)),
        ("local.test".to_string(), Ipv4Addr::LOCALHOST),
    ]))
    .await;
    let b = broker(dns);
    let p = policy(&["*.test"], &[]);
    let (out, a) = through(&b, &p, b"CONNECT inside.test:443 HTTP/1.1\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 403 Forbidden"), "{out}");
    assert!(out.contains("10.1.2.3 (private)"), "{out}");
    assert!(!a.allowed);
    let req = format!("CONNECT local.test:{} HTTP/1.1\r\n\r\n", server.port());
    let (out, _) = through(&b, &p, req.as_bytes()).await;
    assert!(out.contains("127.0.0.1 (loopback)"), "{out}");
    assert_eq!(queries.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn unknown_names_unreachable_ports_and_bad_heads_get_their_own_answers() {
    let (dns, _) = dns_stub(HashMap::new()).await;
    let b = broker(dns);
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
