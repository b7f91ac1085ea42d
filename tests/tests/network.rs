//! The `network` plugin through the real daemon and real sandboxes: curl
//! inside a session goes through the session's proxy at 127.0.0.1:3128,
//! the broker resolves names at a DNS stub on 127.0.0.1 that counts the
//! queries, and reaches a server on the host's loopback only when the
//! policy names it. Every name is under `.test`; nothing leaves this
//! machine.

use allox_integration::{call, make_sessions, process_start as start, require, ProcDaemon};
use allox_network::stub::DnsStub;
use allox_protocol::*;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};

/// An HTTP server on the host's loopback answering `hello <path>`.
fn http_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).to_string();
                let path = head.split(' ').nth(1).unwrap_or("").to_string();
                let body = format!("hello {path}\n");
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    addr
}

fn sh(d: &ProcDaemon, script: &str) -> RunResult {
    match call(
        d,
        Request::ProcessStart(start("a", "s", &["/bin/sh", "-c", script])),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{script}: {other:?}"),
    }
}

#[test]
fn a_session_reaches_allowed_hosts_through_its_proxy_and_nothing_else() {
    let name = "network::a_session_reaches_allowed_hosts_through_its_proxy";
    if !require(name) {
        return;
    }
    if allox_integration::which("curl").is_none() {
        panic!("{name} needs curl");
    }
    let server = http_server();
    let dns = DnsStub::start(HashMap::from([
        ("files.test".to_string(), Ipv4Addr::LOCALHOST),
        ("inside.test".to_string(), Ipv4Addr::new(10, 1, 2, 3)),
    ]))
    .unwrap();
    let port = server.port().to_string();
    let local = format!("127.0.0.1:{port}");
    let d = ProcDaemon::start(
        "network",
        &[
            "--sandbox-network",
            "isolated",
            "--plugin",
            "network",
            "--network-resolver",
            &dns.addr().to_string(),
            "--network-allow",
            "*.test",
            "--network-allow",
            &local,
            "--network-deny",
            "blocked.test",
        ],
    );
    make_sessions(&d, &[("a", "s")]);

    // The proxy's port is taken before the first run: nothing inside can
    // listen there.
    let r = sh(
        &d,
        "python3 -c 'import socket; socket.socket().bind((\"127.0.0.1\", 3128))'",
    );
    assert_ne!(r.exit_code, Some(0), "a run took the proxy's port: {r:?}");
    assert!(r.stderr.contains("Address already in use"), "{r:?}");

    // The environment points at it.
    let r = sh(&d, "env | grep -i _proxy= | sort");
    for line in [
        "HTTPS_PROXY=http://127.0.0.1:3128",
        "HTTP_PROXY=http://127.0.0.1:3128",
        "NO_PROXY=localhost,127.0.0.1,::1",
        "http_proxy=http://127.0.0.1:3128",
        "https_proxy=http://127.0.0.1:3128",
        "no_proxy=localhost,127.0.0.1,::1",
    ] {
        assert!(r.stdout.lines().any(|l| l == line), "{line} missing: {r:?}");
    }

    // Allowed by name (resolved by the broker, at the stub) and by
    // address: through.
    let r = sh(&d, &format!("curl -sS http://files.test:{port}/hello"));
    assert_eq!(r.stdout, "hello /hello\n", "{r:?}");
    // A tunnel, as for HTTPS.
    let r = sh(
        &d,
        &format!("curl -sS -p http://files.test:{port}/tunnelled"),
    );
    assert_eq!(r.stdout, "hello /tunnelled\n", "{r:?}");

    // Denied by name: the proxy's 403, and no DNS query for it.
    let r = sh(
        &d,
        "curl -sS -o /dev/null -w '%{http_code}' http://blocked.test/",
    );
    assert_eq!(r.stdout, "403", "{r:?}");
    // Allowed by name, but it resolves to a private address.
    let r = sh(&d, "curl -sS http://inside.test/");
    assert!(r.stdout.contains("10.1.2.3 (private)"), "{r:?}");
    // A port of the loopback not named by a rule.
    let r = sh(&d, "curl -sS http://files.test:1/");
    assert!(r.stdout.contains("127.0.0.1 (loopback)"), "{r:?}");
    {
        let asked = dns.asked();
        assert!(asked.iter().any(|n| n == "files.test"), "{asked:?}");
        assert!(
            !asked.iter().any(|n| n == "blocked.test"),
            "a denied name was resolved: {asked:?}"
        );
    }

    // A raw TCP connection through the proxy, as SSH's ProxyCommand uses
    // it: `allox net connect`, and the seed's entry point.
    let ask = "printf 'GET /raw HTTP/1.1\\r\\nHost: files.test\\r\\n\\r\\n'";
    let r = sh(&d, &format!("{ask} | allox net connect files.test {port}"));
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert!(r.stdout.ends_with("hello /raw\n"), "{r:?}");
    let r = sh(
        &d,
        &format!("{ask} | python3 /run/allox/network.py connect files.test {port}"),
    );
    assert!(r.stdout.ends_with("hello /raw\n"), "{r:?}");
    let r = sh(&d, "allox net connect blocked.test 22 </dev/null");
    assert_eq!(r.exit_code, Some(1), "{r:?}");
    assert!(
        r.stderr.contains("403 Forbidden")
            && r.stderr
                .contains("denied by the daemon rule \"blocked.test\""),
        "{r:?}"
    );

    // Around the proxy: the host's loopback is not the session's.
    let r = sh(
        &d,
        &format!("curl -sS --noproxy '*' --max-time 5 http://{local}/direct"),
    );
    assert_eq!(r.exit_code, Some(7), "a direct connection got out: {r:?}");

    // Every attempt is in the audit, outside the workspace.
    let log = std::fs::read_to_string(d.daemon.root.join("state/network-audit.log")).unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let find = |host: &str| {
        lines
            .iter()
            .find(|v| v["host"] == host)
            .unwrap_or_else(|| panic!("no record of {host}: {log}"))
    };
    let ok = find("files.test");
    assert_eq!(ok["allowed"], true, "{ok}");
    assert_eq!(ok["agent_id"], "a");
    assert_eq!(ok["address"], local.as_str(), "{ok}");
    assert!(ok["bytes_received"].as_u64().unwrap() > 0, "{ok}");
    let no = find("blocked.test");
    assert_eq!(no["allowed"], false, "{no}");
    assert!(
        no["verdict"]
            .as_str()
            .unwrap()
            .contains("denied by the daemon rule \"blocked.test\""),
        "{no}"
    );
}
