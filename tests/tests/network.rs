//! The session network through the real daemon, real sandboxes and real
//! clients: curl, pip, git (over HTTP and over SSH) and ssh inside a
//! `proxy` session go through the session's proxy at 127.0.0.1:3128; the
//! broker resolves names at a DNS stub on 127.0.0.1 that counts the
//! queries, and reaches servers on the host's loopback only when the
//! policy names them. Every name is under `.test`; nothing leaves this
//! machine.

use allox_integration::{call, process_start as start, require, ProcDaemon};
use allox_network::stub::DnsStub;
use allox_protocol::*;
use std::collections::HashMap;
use std::io::BufRead;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};

fn hello_server() -> SocketAddr {
    allox_integration::hello_server().0
}

/// A child process killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Python's static file server for `dir` on 127.0.0.1; its port.
fn file_server(dir: &Path) -> (Server, u16) {
    let mut child = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import functools, http.server, sys\n\
             h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])\n\
             s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), h)\n\
             print(s.server_address[1], flush=True)\n\
             s.serve_forever()\n",
        ])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3's http.server");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().parse().expect("the server's port");
    (Server(child), port)
}

/// A port free on the loopback now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `alloxctl --socket … ARGS`: exit status, stdout, stderr.
fn ctl(d: &ProcDaemon, args: &[&str]) -> (i32, String, String) {
    let (code, out, err) = allox_integration::alloxctl(&d.daemon.socket, args);
    (code, String::from_utf8_lossy(&out).into_owned(), err)
}

/// `alloxctl … ARGS`, which must succeed; its stdout.
fn ctl_ok(d: &ProcDaemon, args: &[&str]) -> String {
    let (code, out, err) = ctl(d, args);
    assert_eq!(code, 0, "alloxctl {args:?}: {out}{err}");
    out
}

fn sh_in(d: &ProcDaemon, a: &str, s: &str, script: &str) -> RunResult {
    match call(
        d,
        Request::ProcessStart(start(a, s, &["/bin/sh", "-c", script])),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{script}: {other:?}"),
    }
}

fn sh(d: &ProcDaemon, script: &str) -> RunResult {
    sh_in(d, "a", "s", script)
}

/// A daemon with the network plugin, its broker asking `dns`; `allow`
/// and `deny` are the daemon's rules.
fn daemon(name: &str, dns: &DnsStub, rules: &[&str], extra: &[&str]) -> ProcDaemon {
    let resolver = dns.addr().to_string();
    let mut args = vec!["--plugin", "network", "--network-resolver", &resolver];
    args.extend_from_slice(rules);
    args.extend_from_slice(extra);
    ProcDaemon::start(name, &args)
}

fn audit(d: &ProcDaemon, args: &[&str]) -> Vec<serde_json::Value> {
    let mut all = vec!["--json", "net", "audit"];
    all.extend_from_slice(args);
    let v: serde_json::Value = serde_json::from_str(&ctl_ok(d, &all)).unwrap();
    v["records"].as_array().unwrap().clone()
}

fn needs(name: &str, programs: &[&str]) -> bool {
    if !require(name) {
        return false;
    }
    for p in programs {
        if allox_integration::which(p).is_none() && !Path::new(p).exists() {
            panic!("{name} needs {p}");
        }
    }
    true
}

#[test]
fn a_proxy_session_reaches_allowed_hosts_through_its_proxy_and_nothing_else() {
    let name = "network::a_proxy_session_reaches_allowed_hosts_through_its_proxy_and_nothing_else";
    if !needs(name, &["curl", "/usr/bin/python3"]) {
        return;
    }
    let server = hello_server();
    let dns = DnsStub::start(HashMap::from([
        ("files.test".to_string(), Ipv4Addr::LOCALHOST),
        ("inside.test".to_string(), Ipv4Addr::new(10, 1, 2, 3)),
    ]))
    .unwrap();
    let port = server.port().to_string();
    let local = format!("127.0.0.1:{port}");
    let d = daemon(
        "network_proxy",
        &dns,
        &[
            "--network-allow",
            "*.test",
            "--network-allow",
            &local,
            "--network-deny",
            "blocked.test",
        ],
        &[],
    );
    ctl_ok(&d, &["agent", "create", "a"]);
    ctl_ok(&d, &["session", "create", "a", "s", "--network", "proxy"]);

    // The proxy's port is taken before the first run: nothing inside can
    // listen there.
    let r = sh(
        &d,
        "python3 -c 'import socket; socket.socket().bind((\"127.0.0.1\", 3128))'",
    );
    assert_ne!(r.exit_code, Some(0), "a run took the proxy's port: {r:?}");
    assert!(r.stderr.contains("Address already in use"), "{r:?}");

    // The environment points at it; 127.0.0.1, which a daemon rule
    // names, is not the session's own loopback but the host's, through
    // the proxy.
    let r = sh(&d, "env | grep -i _proxy= | sort");
    for line in [
        "HTTPS_PROXY=http://127.0.0.1:3128",
        "HTTP_PROXY=http://127.0.0.1:3128",
        "NO_PROXY=localhost,::1",
        "http_proxy=http://127.0.0.1:3128",
        "https_proxy=http://127.0.0.1:3128",
        "no_proxy=localhost,::1",
    ] {
        assert!(r.stdout.lines().any(|l| l == line), "{line} missing: {r:?}");
    }

    // Allowed by name (resolved by the broker, at the stub) and by
    // address: through.
    let r = sh(&d, &format!("curl -sS http://files.test:{port}/hello"));
    assert_eq!(r.stdout, "hello /hello\n", "{r:?}");
    let hello_run = r.run_id.clone();
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

    // A CONNECT relayed by a program inside the sandbox (its own proxy
    // in front of the session's) is judged like a direct one.
    std::fs::write(
        allox_integration::session_current(&d, "a", "s").join("relay.py"),
        r#"import socket, threading
l = socket.socket()
l.bind(("127.0.0.1", 8888))
l.listen()
def pipe(a, b):
    while True:
        d = a.recv(65536)
        if not d:
            b.shutdown(socket.SHUT_WR)
            return
        b.sendall(d)
while True:
    c, _ = l.accept()
    u = socket.create_connection(("127.0.0.1", 3128))
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
"#,
    )
    .unwrap();
    let r = sh(
        &d,
        &format!(
            "python3 /allox/session/relay.py & sleep 0.5; \
             curl -sS -x http://127.0.0.1:8888 -p http://files.test:{port}/relayed; \
             curl -sS -x http://127.0.0.1:8888 -p -o /dev/null http://blocked.test/ 2>&1; kill $!"
        ),
    );
    assert!(r.stdout.starts_with("hello /relayed\n"), "{r:?}");
    assert!(
        r.stdout.contains("CONNECT tunnel failed, response 403"),
        "{r:?}"
    );
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

    // Around the proxy: the host's loopback is not the session's; there
    // is no device but the loopback and no route; raw and packet sockets
    // are refused; a datagram to the stub's port stays in the session.
    let r = sh(
        &d,
        &format!("curl -sS --noproxy '*' --max-time 5 http://{local}/direct"),
    );
    assert_eq!(r.exit_code, Some(7), "a direct connection got out: {r:?}");
    let r = sh(
        &d,
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; tail -n +2 /proc/net/route | wc -l",
    );
    assert_eq!(r.stdout, "lo\n0\n", "{r:?}");
    let before = dns.asked().len();
    std::fs::write(
        allox_integration::session_current(&d, "a", "s").join("sockets.py"),
        format!(
            r#"import socket
for name, fam, kind, proto in [("raw", socket.AF_INET, socket.SOCK_RAW, 1),
                               ("packet", socket.AF_PACKET, socket.SOCK_RAW, 0)]:
    try:
        socket.socket(fam, kind, proto)
        print(name, "opened")
    except OSError:
        print(name, "refused")
q = bytes.fromhex("abcd01000001000000000000") + b"\x05files\x04test\x00\x00\x01\x00\x01"
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(q, ("127.0.0.1", {}))
print("udp sent")
"#,
            dns.addr().port()
        ),
    )
    .unwrap();
    let r = sh(&d, "python3 /allox/session/sockets.py");
    assert_eq!(r.stdout, "raw refused\npacket refused\nudp sent\n", "{r:?}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(dns.asked().len(), before, "a datagram left the session");

    // Every attempt is in the audit, outside the workspace.
    let lines = audit(&d, &["a", "s"]);
    let find = |host: &str| {
        lines
            .iter()
            .find(|v| v["host"] == host && v["open"] == false)
            .unwrap_or_else(|| panic!("no record of {host}: {lines:?}"))
    };
    let ok = find("files.test");
    // An allowed connection is in the audit from when it opens: a record
    // marked open, before the one with its bytes, naming the same run.
    let opened = lines
        .iter()
        .find(|v| v["host"] == "files.test" && v["open"] == true)
        .unwrap_or_else(|| panic!("no open record of files.test: {lines:?}"));
    assert!(
        opened["seq"].as_u64() < ok["seq"].as_u64()
            && opened["run_id"] == ok["run_id"]
            && opened["allowed"] == true
            && opened["bytes_received"] == 0,
        "{opened} {ok}"
    );
    assert!(
        !lines
            .iter()
            .any(|v| v["host"] == "blocked.test" && v["open"] == true),
        "a refused attempt opened: {lines:?}"
    );
    assert_eq!(ok["allowed"], true, "{ok}");
    // The run that connected, as the kernel says (its socket's cgroup).
    assert_eq!(ok["run_id"], hello_run.as_str(), "{ok}");
    assert_eq!(ok["agent_id"], "a");
    assert_eq!(ok["address"], local.as_str(), "{ok}");
    assert!(ok["bytes_received"].as_u64().unwrap() > 0, "{ok}");
    assert!(ok["seq"].as_u64().unwrap() >= 1, "{ok}");
    let no = find("blocked.test");
    assert_eq!(no["allowed"], false, "{no}");
    assert!(
        no["verdict"]
            .as_str()
            .unwrap()
            .contains("denied by the daemon rule \"blocked.test\""),
        "{no}"
    );
    // Paged with a cursor: the records after it.
    let first = lines[0]["seq"].as_u64().unwrap();
    let rest = audit(&d, &["a", "s", "--cursor", &first.to_string()]);
    assert_eq!(rest.len(), lines.len() - 1);
    // And for people.
    let text = ctl_ok(&d, &["net", "audit", "a", "s"]);
    assert!(
        text.contains("refused (")
            && text.contains(&format!("files.test:{port} -> {local} allowed"))
            && text.contains(&format!("files.test:{port} -> {local} open\n")),
        "{text}"
    );
    // A tunnel while it is open: in the audit already, marked open, and
    // its record with the bytes only once it closed. (It was recorded at
    // its end only: a connection that lasted was in no answer meanwhile.)
    let cur = allox_integration::session_current(&d, "a", "s");
    let tunnel = format!(
        r#"import os, socket, time
h, p = os.environ["HTTP_PROXY"].split("//")[1].rstrip("/").rsplit(":", 1)
s = socket.create_connection((h, int(p)))
s.sendall(b"CONNECT files.test:{port} HTTP/1.1\r\nHost: files.test:{port}\r\n\r\n")
assert s.recv(100).startswith(b"HTTP/1.1 200")
open("/allox/session/tunnel-open", "w").close()
while not os.path.exists("/allox/session/tunnel-close"):
    time.sleep(0.02)
s.close()
"#
    );
    std::fs::write(cur.join("tunnel.py"), tunnel).unwrap();
    let run = ctl_ok(
        &d,
        &[
            "start",
            "a",
            "s",
            "--",
            "python3",
            "/allox/session/tunnel.py",
        ],
    );
    let run = run.trim();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !cur.join("tunnel-open").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the tunnel did not open"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let tunnels = |records: &[serde_json::Value]| -> Vec<bool> {
        records
            .iter()
            .filter(|v| v["kind"] == "CONNECT" && v["host"] == "files.test" && v["run_id"] == run)
            .map(|v| v["open"] == true)
            .collect()
    };
    let during = audit(&d, &["a", "s"]);
    assert_eq!(tunnels(&during), [true], "{during:?}");
    std::fs::write(cur.join("tunnel-close"), b"").unwrap();
    ctl_ok(&d, &["wait", "a", "s", run]);
    // (Recorded as the broker sees the client go: at once, or soon.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let after = audit(&d, &["a", "s"]);
        if tunnels(&after) == [true, false] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{after:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_policy_change_applies_to_the_next_connection_and_rollback_keeps_it() {
    let name = "network::a_policy_change_applies_to_the_next_connection_and_rollback_keeps_it";
    if !needs(name, &["curl"]) {
        return;
    }
    let server = hello_server();
    let dns = DnsStub::start(HashMap::from([
        ("files.test".to_string(), Ipv4Addr::LOCALHOST),
        ("other.test".to_string(), Ipv4Addr::LOCALHOST),
    ]))
    .unwrap();
    let port = server.port().to_string();
    let local = format!("127.0.0.1:{port}");
    // No rule at the daemon's level: the agent's and the session's decide.
    let d = daemon("network_policy", &dns, &[], &["--session-network", "proxy"]);
    ctl_ok(
        &d,
        &[
            "agent", "create", "a", "--allow", "*.test", "--allow", &local,
        ],
    );
    ctl_ok(&d, &["session", "create", "a", "s"]);
    let get =
        |what: &str| format!("curl -sS -o /dev/null -w '%{{http_code}}' http://{what}:{port}/");
    assert_eq!(sh(&d, &get("files.test")).stdout, "200");
    assert_eq!(sh(&d, &get("other.test")).stdout, "200");

    // Mid-session: the session denies other.test. A run that is going on
    // sees the change at its next connection.
    let cur = allox_integration::session_current(&d, "a", "s");
    let bg = allox_protocol::ProcessStart {
        wait: false,
        ..start(
            "a",
            "s",
            &[
                "/bin/sh",
                "-c",
                &format!(
                    "{} > /allox/session/before; touch /allox/session/ready; \
                     while [ ! -e /allox/session/changed ]; do sleep 0.05; done; {} > /allox/session/after",
                    get("other.test"),
                    get("other.test")
                ),
            ],
        )
    };
    let run_id = match call(&d, Request::ProcessStart(bg)) {
        Ok(Response::Started(s)) => s.run_id,
        other => panic!("{other:?}"),
    };
    while !cur.join("ready").exists() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = ctl_ok(&d, &["net", "policy", "a", "s", "--deny", "other.test"]);
    assert!(out.contains("session a/s: network proxy"), "{out}");
    std::fs::write(cur.join("changed"), "").unwrap();
    match call(
        &d,
        Request::ProcessWait(ProcessWait {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id,
            timeout_ms: Some(30_000),
        }),
    ) {
        Ok(Response::Exited(r)) => assert_eq!(r.exit_code, Some(0), "{r:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read_to_string(cur.join("before")).unwrap(), "200");
    assert_eq!(std::fs::read_to_string(cur.join("after")).unwrap(), "403");
    assert_eq!(sh(&d, &get("files.test")).stdout, "200");

    // The policy as the daemon has it, level by level.
    let v: serde_json::Value =
        serde_json::from_str(&ctl_ok(&d, &["--json", "net", "policy", "a", "s"])).unwrap();
    assert_eq!(v["mode"], "proxy", "{v}");
    let levels: Vec<&str> = v["levels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["level"].as_str().unwrap())
        .collect();
    assert_eq!(levels, ["daemon", "agent", "session"], "{v}");
    assert_eq!(v["levels"][2]["egress"]["deny"][0], "other.test", "{v}");
    assert_eq!(v["levels"][1]["egress"]["allow"][0], "*.test", "{v}");

    // `net audit --follow` prints the backlog, then each attempt as it
    // is decided.
    let (mut follow, mut lines) = allox_integration::alloxctl_following(
        &d.daemon.socket,
        &["--json", "net", "audit", "a", "s", "--follow"],
    );
    let backlog = audit(&d, &["a", "s"]).len();
    for _ in 0..backlog {
        lines.next().unwrap().unwrap();
    }
    let r = sh(&d, &format!("curl -sS http://files.test:{port}/followed"));
    assert_eq!(r.stdout, "hello /followed\n");
    let next = lines.next().expect("no record followed").unwrap();
    let next: serde_json::Value = serde_json::from_str(&next).unwrap();
    assert_eq!(next["host"], "files.test", "{next}");
    assert_eq!(next["run_id"], r.run_id.as_str(), "{next}");
    let _ = follow.kill();
    let _ = follow.wait();

    // A rollback keeps the session's network and its policy (and the
    // proxy: the context is the session's, not the workspace's).
    ctl_ok(&d, &["checkpoint", "create", "a", "s", "c1"]);
    sh(&d, "echo later > /allox/session/later");
    ctl_ok(&d, &["rollback", "a", "s", "c1"]);
    assert!(!cur.join("later").exists());
    let after: serde_json::Value =
        serde_json::from_str(&ctl_ok(&d, &["--json", "net", "policy", "a", "s"])).unwrap();
    assert_eq!(after, v, "the rollback changed the policy");
    assert_eq!(sh(&d, &get("other.test")).stdout, "403");
    assert_eq!(sh(&d, &get("files.test")).stdout, "200");

    // An agent's change reaches its live sessions too: the agent now
    // denies files.test (a later session allow cannot reopen it).
    ctl_ok(
        &d,
        &[
            "net",
            "policy",
            "a",
            "--allow",
            "*.test",
            "--allow",
            &local,
            "--deny",
            "files.test",
        ],
    );
    ctl_ok(&d, &["net", "policy", "a", "s", "--allow", "files.test"]);
    let r = sh(&d, &format!("curl -sS http://files.test:{port}/"));
    assert!(
        r.stdout.contains("denied by the agent rule \"files.test\""),
        "{r:?}"
    );

    // A session without an allow list anywhere reaches nothing.
    ctl_ok(&d, &["agent", "create", "b"]);
    ctl_ok(&d, &["session", "create", "b", "s"]);
    let r = sh_in(&d, "b", "s", &format!("curl -sS http://files.test:{port}/"));
    assert!(r.stdout.contains("no allow list at any level"), "{r:?}");

    // Bad requests name what is wrong, and make nothing.
    let (code, _, err) = ctl(&d, &["session", "create", "a", "t", "--allow", "bad host"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("egress allow list") && err.contains("\"bad host\""),
        "{err}"
    );
    let (code, _, err) = ctl(&d, &["net", "policy", "a", "s", "--deny", "x.test:99999"]);
    assert_eq!(code, 1);
    assert!(err.contains("port \"99999\""), "{err}");
    let sessions = ctl_ok(&d, &["--json", "session", "list", "a"]);
    assert!(!sessions.contains("\"t\""), "{sessions}");
    let now: serde_json::Value =
        serde_json::from_str(&ctl_ok(&d, &["--json", "net", "policy", "a", "s"])).unwrap();
    assert_eq!(
        now["levels"][2]["egress"],
        serde_json::json!({"allow": ["files.test"], "deny": []}),
        "a refused change changed the policy: {now}"
    );
}

#[test]
fn modes_are_per_session_and_proxy_needs_the_plugin() {
    let name = "network::modes_are_per_session_and_proxy_needs_the_plugin";
    if !needs(name, &["curl", "/usr/bin/python3"]) {
        return;
    }
    let server = hello_server();
    let local = format!("127.0.0.1:{}", server.port());
    // No plugin: `isolated` and `disabled` work, `proxy` is refused.
    let d = ProcDaemon::start("network_modes", &[]);
    ctl_ok(&d, &["agent", "create", "a"]);
    let (code, _, err) = ctl(&d, &["session", "create", "a", "p", "--network", "proxy"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("network mode proxy needs the network plugin")
            && err.contains("--plugin network"),
        "{err}"
    );
    assert!(!ctl_ok(&d, &["session", "list", "a"]).contains("p "));
    ctl_ok(
        &d,
        &["session", "create", "a", "s", "--network", "isolated"],
    );
    ctl_ok(
        &d,
        &["session", "create", "a", "t", "--network", "isolated"],
    );
    ctl_ok(&d, &["session", "create", "a", "h"]);
    let direct = format!("curl -sS --max-time 5 http://{local}/x");
    // `disabled` (the daemon's default): the host's network, as before.
    assert_eq!(sh_in(&d, "a", "h", &direct).stdout, "hello /x\n");
    // `isolated`: nothing leaves, no proxy in the environment.
    let r = sh_in(&d, "a", "s", &direct);
    assert_eq!(r.exit_code, Some(7), "{r:?}");
    let r = sh_in(
        &d,
        "a",
        "s",
        "env | grep -ci proxy; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
    );
    assert_eq!(r.stdout, "0\nlo\n", "{r:?}");
    // Its runs reach each other; another session cannot reach them.
    for sess in ["s", "t"] {
        std::fs::write(
            allox_integration::session_current(&d, "a", sess).join("get.py"),
            r#"import socket, time
for i in range(30):
    try:
        print(socket.create_connection(("127.0.0.1", 7000)).recv(100).decode(), end="")
        break
    except OSError:
        time.sleep(0.1)
else:
    print("refused")
"#,
        )
        .unwrap();
    }
    std::fs::write(
        allox_integration::session_current(&d, "a", "s").join("serve.py"),
        r#"import socket
l = socket.socket()
l.bind(("127.0.0.1", 7000))
l.listen()
while True:
    c, _ = l.accept()
    c.sendall(b"same session\n")
    c.close()
"#,
    )
    .unwrap();
    let serve = allox_protocol::ProcessStart {
        wait: false,
        ..start("a", "s", &["/usr/bin/python3", "/allox/session/serve.py"])
    };
    assert!(matches!(
        call(&d, Request::ProcessStart(serve)),
        Ok(Response::Started(_))
    ));
    let get = "python3 /allox/session/get.py";
    assert_eq!(sh_in(&d, "a", "s", get).stdout, "same session\n");
    assert_eq!(sh_in(&d, "a", "t", get).stdout, "refused\n");
    // An unknown mode is refused, naming it.
    let (code, out, _) = ctl(
        &d,
        &[
            "rpc",
            r#"{"action":"session.create","params":{"agent_id":"a","session_id":"u","network":"bogus"}}"#,
        ],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("bogus"), "{out}");
    // Without the plugin the network's own actions say what is missing.
    let (code, _, err) = ctl(&d, &["net", "audit"]);
    assert_eq!(code, 1);
    assert!(err.contains("network"), "{err}");
}

/// A minimal wheel of the package `allox-demo` (module `allox_demo`,
/// `VALUE = 42`) in a PEP 503 index under `dir`.
fn package_index(dir: &Path) {
    let files = dir.join("files");
    let simple = dir.join("simple/allox-demo");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::create_dir_all(&simple).unwrap();
    let wheel = files.join("allox_demo-1.0-py3-none-any.whl");
    run(Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(
            "import sys, zipfile\n\
             z = zipfile.ZipFile(sys.argv[1], 'w')\n\
             z.writestr('allox_demo/__init__.py', 'VALUE = 42\\n')\n\
             z.writestr('allox_demo-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: allox-demo\\nVersion: 1.0\\n')\n\
             z.writestr('allox_demo-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: allox-test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n\
             z.writestr('allox_demo-1.0.dist-info/RECORD', 'allox_demo/__init__.py,,\\nallox_demo-1.0.dist-info/METADATA,,\\nallox_demo-1.0.dist-info/WHEEL,,\\nallox_demo-1.0.dist-info/RECORD,,\\n')\n\
             z.close()\n",
        )
        .arg(&wheel));
    std::fs::write(
        simple.join("index.html"),
        "<!DOCTYPE html><html><body>\
         <a href=\"/files/allox_demo-1.0-py3-none-any.whl\">allox_demo-1.0-py3-none-any.whl</a>\
         </body></html>\n",
    )
    .unwrap();
}

#[test]
fn pip_and_git_install_and_clone_through_the_proxy() {
    let name = "network::pip_and_git_install_and_clone_through_the_proxy";
    if !needs(name, &["git", "/usr/bin/python3"]) {
        return;
    }
    let pip = Command::new("/usr/bin/python3")
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !pip {
        panic!("{name} needs pip for /usr/bin/python3 (python3-pip)");
    }
    let root = tempfile::tempdir().unwrap();
    package_index(root.path());
    allox_integration::bare_git_repo(root.path(), "from the host\n");
    let (_server, port) = file_server(root.path());
    let dns = DnsStub::start(HashMap::from([
        ("pypi.test".to_string(), Ipv4Addr::LOCALHOST),
        ("git.test".to_string(), Ipv4Addr::LOCALHOST),
        ("blocked.test".to_string(), Ipv4Addr::LOCALHOST),
    ]))
    .unwrap();
    let local = format!("127.0.0.1:{port}");
    let d = daemon(
        "network_clients",
        &dns,
        &[
            "--network-allow",
            "pypi.test",
            "--network-allow",
            "git.test",
            "--network-allow",
            &local,
        ],
        &["--session-network", "proxy"],
    );
    ctl_ok(&d, &["agent", "create", "a"]);
    ctl_ok(&d, &["session", "create", "a", "s"]);

    let pip = |index: &str| {
        format!(
            "python3 -m pip install -q --no-cache-dir --disable-pip-version-check \
             --index-url http://{index}:{port}/simple/ --trusted-host {index} --target /tmp/pkgs allox-demo 2>&1; \
             echo pip=$?; PYTHONPATH=/tmp/pkgs python3 -c 'import allox_demo; print(allox_demo.VALUE)' 2>/dev/null"
        )
    };
    let r = sh(&d, &pip("pypi.test"));
    assert!(r.stdout.ends_with("pip=0\n42\n"), "{r:?}");
    // Refused: pip finds nothing (the proxy answered its index request
    // with a 403, as the audit records).
    let r = sh(&d, &pip("blocked.test"));
    assert!(r.stdout.contains("pip=1\n"), "{r:?}");

    let r = sh(
        &d,
        &format!(
            "git clone -q http://git.test:{port}/repo.git /tmp/clone && cat /tmp/clone/README"
        ),
    );
    assert_eq!(r.stdout, "from the host\n", "{r:?}");
    let r = sh(
        &d,
        &format!("git clone -q http://blocked.test:{port}/repo.git /tmp/no 2>&1; echo git=$?"),
    );
    assert!(
        r.stdout.contains("403") && r.stdout.ends_with("git=128\n"),
        "{r:?}"
    );
    let asked = dns.asked();
    assert!(!asked.iter().any(|n| n == "blocked.test"), "{asked:?}");
    let records = audit(&d, &["a", "s"]);
    let seen = |host: &str, allowed: bool| {
        records
            .iter()
            .any(|v| v["host"] == host && v["allowed"] == allowed && v["kind"] == "HTTP")
    };
    assert!(seen("pypi.test", true), "{records:?}");
    assert!(seen("git.test", true), "{records:?}");
    assert!(seen("blocked.test", false), "{records:?}");
}

#[test]
fn ssh_and_git_over_ssh_go_through_allox_net_connect() {
    let name = "network::ssh_and_git_over_ssh_go_through_allox_net_connect";
    if !needs(name, &["/usr/sbin/sshd", "ssh", "ssh-keygen", "git"]) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let bare = allox_integration::bare_git_repo(dir, "from the host\n");
    // An sshd of the test's own on the loopback: its host key, one
    // authorized key, root's login by key only.
    run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(dir.join("host_key")));
    run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "agent", "-f"])
        .arg(dir.join("client_key")));
    std::fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys")).unwrap();
    let port = free_port();
    std::fs::write(
        dir.join("sshd_config"),
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nPermitRootLogin prohibit-password\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n",
            d = dir.display()
        ),
    )
    .unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    let _sshd = Server(
        Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(dir.join("sshd_config"))
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let dns = DnsStub::start(HashMap::from([(
        "ssh.test".to_string(),
        Ipv4Addr::LOCALHOST,
    )]))
    .unwrap();
    let local = format!("127.0.0.1:{port}");
    // The sandbox's default user, which the host's /etc/passwd does not
    // have: the OpenSSH client finds it in the sandbox's own.
    let d = daemon(
        "network_ssh",
        &dns,
        &["--network-allow", "ssh.test", "--network-allow", &local],
        &["--session-network", "proxy"],
    );
    ctl_ok(&d, &["agent", "create", "a"]);
    ctl_ok(&d, &["session", "create", "a", "s"]);
    // The agent's key, in its workspace, its own and private.
    let key = allox_integration::session_current(&d, "a", "s").join("id_agent");
    std::fs::copy(dir.join("client_key"), &key).unwrap();
    run(Command::new("chown").arg("10000:10000").arg(&key));
    run(Command::new("chmod").arg("600").arg(&key));

    let ssh = "ssh -F /dev/null -i /allox/session/id_agent -o BatchMode=yes \
               -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR \
               -o 'ProxyCommand=allox net connect %h %p'";
    let r = sh(&d, &format!("{ssh} -p {port} root@ssh.test echo over ssh"));
    assert_eq!(r.stdout, "over ssh\n", "{r:?}");
    let r = sh(
        &d,
        &format!(
            "GIT_SSH_COMMAND=\"{}\" git clone -q ssh://root@ssh.test:{port}{} /tmp/clone && cat /tmp/clone/README",
            ssh.replace('"', "\\\""),
            bare.display()
        ),
    );
    assert_eq!(r.stdout, "from the host\n", "{r:?}");
    // The proxy's python entry point works as the ProxyCommand too.
    let r = sh(
        &d,
        &format!(
            "{} -p {port} root@ssh.test echo again",
            ssh.replace(
                "allox net connect %h %p",
                "python3 /run/allox/network.py connect %h %p"
            )
        ),
    );
    assert_eq!(r.stdout, "again\n", "{r:?}");
    // A host the policy does not allow: ssh fails, saying why.
    let r = sh(&d, &format!("{ssh} -p 22 root@other.test true 2>&1"));
    assert_ne!(r.exit_code, Some(0));
    assert!(r.stdout.contains("not on the daemon allow list"), "{r:?}");
    let records = audit(&d, &["a", "s"]);
    let ok: Vec<_> = records
        .iter()
        .filter(|v| v["host"] == "ssh.test" && v["allowed"] == true && v["open"] == false)
        .collect();
    assert_eq!(ok.len(), 3, "{records:?}");
    assert!(ok
        .iter()
        .all(|v| v["kind"] == "CONNECT" && v["bytes_sent"].as_u64().unwrap() > 0));
}

#[test]
fn a_loopback_port_an_allow_rule_names_is_reached_through_the_proxy() {
    let name = "network::a_loopback_port_an_allow_rule_names_is_reached_through_the_proxy";
    if !needs(name, &["curl", "/usr/bin/python3"]) {
        return;
    }
    let pip = Command::new("/usr/bin/python3")
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !pip {
        panic!("{name} needs pip for /usr/bin/python3 (python3-pip)");
    }
    let root = tempfile::tempdir().unwrap();
    package_index(root.path());
    let (_server, port) = file_server(root.path());
    let local = format!("127.0.0.1:{port}");
    let dns = DnsStub::start(HashMap::new()).unwrap();
    // No rule at the daemon's level: each session's decides.
    let d = daemon(
        "network_loopback",
        &dns,
        &[],
        &["--session-network", "proxy"],
    );
    ctl_ok(&d, &["agent", "create", "a"]);
    ctl_ok(&d, &["session", "create", "a", "s", "--allow", &local]);
    ctl_ok(&d, &["session", "create", "a", "t", "--allow", "*"]);
    let meant = "the loopback is that of the machine the supervisor runs on, \
                 not the session's own";

    // The rule names the host's 127.0.0.1: it is not in NO_PROXY, so plain
    // curl and pip go through the proxy, and the broker lets them by.
    let r = sh(&d, "echo $NO_PROXY $no_proxy");
    assert_eq!(r.stdout, "localhost,::1 localhost,::1\n", "{r:?}");
    let r = sh(&d, &format!("curl -sS http://{local}/simple/allox-demo/"));
    assert!(
        r.stdout.contains("allox_demo-1.0-py3-none-any.whl"),
        "{r:?}"
    );
    let curl_run = r.run_id.clone();
    let r = sh(
        &d,
        &format!(
            "python3 -m pip install -q --no-cache-dir --disable-pip-version-check \
             --index-url http://{local}/simple/ --target /tmp/pkgs allox-demo 2>&1; \
             echo pip=$?; PYTHONPATH=/tmp/pkgs python3 -c 'import allox_demo; print(allox_demo.VALUE)'"
        ),
    );
    assert!(r.stdout.ends_with("pip=0\n42\n"), "{r:?}");
    // Another port of it is refused by the broker, saying which loopback
    // it is; `localhost` stays the session's own (nothing listens there).
    let other = free_port();
    let r = sh(&d, &format!("curl -sS http://127.0.0.1:{other}/"));
    assert!(
        r.stdout.contains("not on the session allow list") && r.stdout.contains(meant),
        "{r:?}"
    );
    let r = sh(
        &d,
        &format!("curl -sS --max-time 5 http://localhost:{port}/"),
    );
    assert_eq!(r.exit_code, Some(7), "{r:?}");
    let records = audit(&d, &["a", "s"]);
    let to = |p: u16| {
        records
            .iter()
            .filter(|v| v["host"] == "127.0.0.1" && v["port"] == p)
            .collect::<Vec<_>>()
    };
    let allowed = to(port);
    assert!(
        allowed.len() >= 2
            && allowed.iter().all(|v| v["allowed"] == true
                && v["kind"] == "HTTP"
                && v["address"] == local.as_str()),
        "{records:?}"
    );
    assert_eq!(allowed[0]["run_id"], curl_run.as_str(), "{records:?}");
    let refused = to(other);
    assert!(
        refused.len() == 1
            && refused[0]["allowed"] == false
            && refused[0]["verdict"].as_str().unwrap().contains(meant),
        "{records:?}"
    );

    // Without a rule naming it, 127.0.0.1 is the session's own loopback:
    // plain curl goes there (nothing listens), and asked through the
    // proxy the broker refuses it, saying which loopback that would be.
    let r = sh_in(&d, "a", "t", "echo $NO_PROXY");
    assert_eq!(r.stdout, "localhost,127.0.0.1,::1\n", "{r:?}");
    let r = sh_in(
        &d,
        "a",
        "t",
        &format!("curl -sS --max-time 5 http://{local}/"),
    );
    assert_eq!(r.exit_code, Some(7), "{r:?}");
    let r = sh_in(
        &d,
        "a",
        "t",
        &format!("curl -sS --noproxy '' -w ' %{{http_code}}' http://{local}/"),
    );
    assert!(
        r.stdout.ends_with(" 403")
            && r.stdout.contains("127.0.0.1 (loopback)")
            && r.stdout.contains(meant),
        "{r:?}"
    );
    let records = audit(&d, &["a", "t"]);
    assert!(
        records.len() == 1 && records[0]["allowed"] == false,
        "{records:?}"
    );
}

/// The bytes of a connection the proxy relays are counted as they move:
/// a download held open half-way shows its first half in
/// `allox_network_bytes_total` while it lasts, not only once it ends.
/// (Before, a connection's bytes were counted at its end: a session could
/// move gigabytes on one long connection with the metrics showing none.)
#[test]
fn a_long_connection_s_bytes_are_counted_while_it_lasts() {
    let name = "network::a_long_connection_s_bytes_are_counted_while_it_lasts";
    if !needs(name, &["curl"]) {
        return;
    }
    const HALF: usize = 1024 * 1024;
    // A server that sends half of its answer, then waits to be let go on.
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (go_on, wait) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut c, _) = listener.accept().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && c.read(&mut byte).unwrap() == 1 {
            head.push(byte[0]);
        }
        let body = vec![b'x'; HALF];
        let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", 2 * HALF);
        c.write_all(answer.as_bytes()).unwrap();
        c.write_all(&body).unwrap();
        let _ = wait.recv();
        let _ = c.write_all(&body);
    });
    let local = format!("127.0.0.1:{port}");
    let dns = DnsStub::start(HashMap::new()).unwrap();
    let d = daemon("network_long", &dns, &[], &["--session-network", "proxy"]);
    ctl_ok(&d, &["agent", "create", "a"]);
    ctl_ok(&d, &["session", "create", "a", "s", "--allow", &local]);
    let received = || -> u64 {
        ctl_ok(&d, &["metrics"])
            .lines()
            .find_map(|l| l.strip_prefix("allox_network_bytes_total{direction=\"received\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    assert_eq!(received(), 0);
    let p = ProcessStart {
        wait: false,
        ..start(
            "a",
            "s",
            &[
                "curl",
                "-sS",
                "-o",
                "/dev/null",
                &format!("http://{local}/"),
            ],
        )
    };
    let run = match call(&d, Request::ProcessStart(p)) {
        Ok(Response::Started(r)) => r.run_id,
        other => panic!("{other:?}"),
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut seen = received();
    while seen < HALF as u64 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
        seen = received();
    }
    // The connection is still open (the server holds its second half).
    let live = ctl_ok(&d, &["--json", "ps", "a", "s"]);
    assert!(live.contains(&run), "the download ended early: {live}");
    assert!(
        (HALF as u64..2 * HALF as u64).contains(&seen),
        "received while the connection lasts: {seen} bytes, not its first {HALF}"
    );
    go_on.send(()).unwrap();
    server.join().unwrap();
    let r = match call(
        &d,
        Request::ProcessWait(ProcessWait {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run.clone(),
            timeout_ms: Some(60_000),
        }),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    // Counted once: the whole answer, its head besides.
    let all = received();
    assert!(
        (2 * HALF as u64..2 * HALF as u64 + 200).contains(&all),
        "{all}"
    );
}

/// On a disk an agent filled, a proxied connection is recorded in
/// `network-audit.log` (its room kept, as the daemon's audit log's) or
/// refused `503` before a byte of it goes on: never made unrecorded.
/// (Before, every connection went through, none of them recorded.)
#[test]
fn on_a_full_disk_no_connection_goes_unrecorded() {
    let name = "network::on_a_full_disk_no_connection_goes_unrecorded";
    if !needs(name, &["curl"]) {
        return;
    }
    let server = hello_server();
    let local = format!("127.0.0.1:{}", server.port());
    let dns = DnsStub::start(HashMap::new()).unwrap();
    let keys = tempfile::tempdir_in("/var/tmp").unwrap();
    let key_file = keys.path().join("secrets.key");
    let d = daemon(
        "network_full",
        &dns,
        &[],
        &[
            "--session-network",
            "proxy",
            "--secrets-key-file",
            key_file.to_str().unwrap(),
        ],
    );
    ctl_ok(&d, &["agent", "create", "a"]);
    ctl_ok(&d, &["session", "create", "a", "s", "--allow", &local]);
    ctl_ok(
        &d,
        &["session", "create", "a", "fill", "--network", "isolated"],
    );
    allox_integration::fill_disk(
        &d.daemon
            .root
            .join("agents/a/workspace/sessions/fill/current"),
    );
    let log = d.daemon.root.join("state/network-audit.log");
    let records = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"open\":true"))
            .count()
    };
    for _ in 0..10 {
        let before = records();
        let r = sh(
            &d,
            &format!("curl -sS -o /dev/null -w '%{{http_code}}' http://{local}/"),
        );
        let after = records();
        match r.stdout.as_str() {
            // Its opening is recorded before a byte of it goes on (its
            // end a moment after the answer).
            "200" => assert_eq!(after, before + 1, "served unrecorded"),
            "503" => {}
            other => panic!("{other}: {r:?}"),
        }
    }
    // A secret set on the full disk is kept, or refused as the full disk
    // (`unavailable`, not `internal`), with nothing half-written left.
    let value = keys.path().join("value");
    std::fs::write(&value, "s3cret").unwrap();
    let (code, _, err) = ctl(
        &d,
        &[
            "secret",
            "set",
            "a",
            "TOKEN",
            "--host",
            "api.test",
            "--value-file",
            value.to_str().unwrap(),
        ],
    );
    assert!(code == 0 || err.contains("unavailable"), "{err}");
    let secrets = d.daemon.root.join("state/network-secrets");
    let debris: Vec<_> = walk(&secrets)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".new"))
        .collect();
    assert!(debris.is_empty(), "{debris:?}");
}

/// Every path below `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|e| {
            let p = e.path();
            let mut below = if p.is_dir() { walk(&p) } else { Vec::new() };
            below.push(p);
            below
        })
        .collect()
}
