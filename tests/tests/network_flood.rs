//! The session network under attack from inside a `proxy` sandbox (uid
//! 10000, default limits), through the real daemon: thousands of
//! connections to the proxy, a daemon out of descriptors, name lookups
//! that never answer, two runs connecting at once, and the host's own
//! (non-loopback) address. Meanwhile other clients ping the daemon, list
//! agents and use other sessions: they keep being answered within a
//! second (two for a run), the daemon's threads do not grow with
//! connections, and whatever is refused names the budget and its flag.

use allox_integration::{call, process_start as start, require, ProcDaemon};
use allox_network::stub::DnsStub;
use allox_protocol::*;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Worst answer time allowed of a ping or `agent.list` during a flood.
const ANSWER_BOUND: Duration = Duration::from_secs(1);
/// Worst time allowed of another session's run (`/bin/true`) during one.
const RUN_BOUND: Duration = Duration::from_secs(2);

fn ctl_ok(d: &ProcDaemon, args: &[&str]) -> String {
    let (code, out, err) = allox_integration::alloxctl(&d.daemon.socket, args);
    let out = String::from_utf8_lossy(&out).into_owned();
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

/// Starts `script` in `a/s` without waiting; its run id.
fn sh_bg(d: &ProcDaemon, a: &str, s: &str, script: &str) -> String {
    let p = ProcessStart {
        wait: false,
        ..start(a, s, &["/bin/sh", "-c", script])
    };
    match call(d, Request::ProcessStart(p)) {
        Ok(Response::Started(r)) => r.run_id,
        other => panic!("{script}: {other:?}"),
    }
}

fn wait_run(d: &ProcDaemon, a: &str, s: &str, run_id: &str) -> RunResult {
    match call(
        d,
        Request::ProcessWait(ProcessWait {
            agent_id: a.into(),
            session_id: s.into(),
            run_id: run_id.into(),
            timeout_ms: Some(120_000),
        }),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{other:?}"),
    }
}

/// Every audit record of `a/s`.
fn audit(d: &ProcDaemon, a: &str, s: &str) -> Vec<serde_json::Value> {
    let mut all = Vec::new();
    let mut cursor = 0u64;
    loop {
        let c = cursor.to_string();
        let out = ctl_ok(
            d,
            &[
                "--json", "net", "audit", a, s, "--cursor", &c, "--limit", "10000",
            ],
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let page = v["records"].as_array().unwrap().clone();
        if page.is_empty() {
            return all;
        }
        cursor = page.last().unwrap()["seq"].as_u64().unwrap();
        all.extend(page);
    }
}

fn setup(name: &str) -> bool {
    if !require(&format!("network_flood::{name}")) {
        return false;
    }
    assert!(
        allox_integration::which("python3").is_some(),
        "network_flood::{name} needs python3"
    );
    true
}

/// A field of the daemon's `/proc/PID/status`.
fn status(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|r| r.count())
        .unwrap_or(0)
}

/// Pings the daemon and lists its agents from connections of their own
/// until stopped; the worst answer times, and the most threads and
/// descriptors the daemon had at any sample.
struct Watch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Watched>>,
}

#[derive(Debug, Default)]
struct Watched {
    ping: Duration,
    list: Duration,
    threads: u64,
    fds: usize,
    failed: Option<String>,
}

impl Watch {
    fn start(d: &ProcDaemon) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, mut ping, mut list) = (stop.clone(), d.daemon.client(), d.daemon.client());
        let pid = d.daemon.child.id();
        let thread = std::thread::spawn(move || {
            let mut w = Watched::default();
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                match ping.call(Request::Ping(Ping {})) {
                    Ok(Ok(Response::Pong(_))) => w.ping = w.ping.max(t.elapsed()),
                    other => {
                        w.failed = Some(format!("ping: {other:?}"));
                        break;
                    }
                }
                let t = Instant::now();
                match list.call(Request::AgentList(AgentList::default())) {
                    Ok(Ok(Response::Agents(_))) => w.list = w.list.max(t.elapsed()),
                    other => {
                        w.failed = Some(format!("agent.list: {other:?}"));
                        break;
                    }
                }
                w.threads = w.threads.max(status(pid, "Threads:"));
                w.fds = w.fds.max(fds(pid));
                std::thread::sleep(Duration::from_millis(20));
            }
            w
        });
        Watch {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> Watched {
        self.stop.store(true, Ordering::Relaxed);
        let w = self.thread.take().unwrap().join().unwrap();
        eprintln!("during the flood: {w:?}");
        assert!(w.failed.is_none(), "the daemon stopped answering: {w:?}");
        assert!(w.ping < ANSWER_BOUND, "a ping took {:?}", w.ping);
        assert!(w.list < ANSWER_BOUND, "agent.list took {:?}", w.list);
        w
    }
}

/// Opens `n` connections to the session's proxy one after another, each
/// asking `CONNECT target`; keeps those answered 200, closes the others.
/// Writes `held refused named other` to /allox/session/NAME.result (named:
/// refusals naming `flag`), then holds its connections until
/// /allox/session/NAME.done exists.
fn flood_script(name: &str, n: usize, target: &str, flag: &str) -> String {
    format!(
        r#"import os, socket, time
held, refused, named, other = [], 0, 0, 0
for i in range({n}):
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(b"CONNECT {target} HTTP/1.1\r\n\r\n")
    s.settimeout(10)
    head = b""
    while b"\r\n\r\n" not in head:
        got = s.recv(4096)
        if not got:
            break
        head += got
    if head.startswith(b"HTTP/1.1 200"):
        held.append(s)
        continue
    if head.startswith(b"HTTP/1.1 503"):
        refused += 1
        if b"{flag}" in head:
            named += 1
    else:
        other += 1
    s.close()
with open("/allox/session/{name}.result", "w") as f:
    f.write("%d %d %d %d" % (len(held), refused, named, other))
while not os.path.exists("/allox/session/{name}.done"):
    time.sleep(0.05)
"#
    )
}

fn wait_for(path: &std::path::Path, within: Duration) {
    let t = Instant::now();
    while !path.exists() {
        assert!(t.elapsed() < within, "{} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn result(path: &std::path::Path) -> [usize; 4] {
    let text = std::fs::read_to_string(path).unwrap();
    let v: Vec<usize> = text.split(' ').map(|n| n.parse().unwrap()).collect();
    [v[0], v[1], v[2], v[3]]
}

#[test]
fn a_connection_flood_meets_the_budgets_and_holds_up_no_one_else() {
    let name = "a_connection_flood_meets_the_budgets_and_holds_up_no_one_else";
    if !setup(name) {
        return;
    }
    let (server, _) = allox_integration::hello_server();
    let dns = DnsStub::start(HashMap::new()).unwrap();
    let resolver = dns.addr().to_string();
    let allow = server.to_string();
    let d = ProcDaemon::start(
        "netflood",
        &[
            "--plugin",
            "network",
            "--network-resolver",
            &resolver,
            "--network-allow",
            &allow,
            "--proxy-connections-per-session",
            "200",
            "--proxy-connections",
            "260",
            // The connection budgets, not the audit's rate, are what the
            // flood meets here.
            "--audit-lines-per-s",
            "0",
        ],
    );
    ctl_ok(&d, &["agent", "create", "a"]);
    for s in ["s", "t", "u"] {
        ctl_ok(&d, &["session", "create", "a", s, "--network", "proxy"]);
    }
    let get = format!("curl -sS http://{server}/other");
    let r = sh_in(&d, "a", "t", &get);
    assert_eq!(r.stdout, "hello /other\n", "{r:?}");
    let pid = d.daemon.child.id();
    let (threads_before, fds_before) = (status(pid, "Threads:"), fds(pid));

    // Session s: 5,000 connections, each relayed to the server and left
    // idle; past 200 refused at once.
    let watch = Watch::start(&d);
    let cur = allox_integration::session_current(&d, "a", "s");
    let flood = flood_script("s", 5000, &allow, "--proxy-connections-per-session");
    std::fs::write(cur.join("flood.py"), flood).unwrap();
    let run = sh_bg(&d, "a", "s", "python3 /allox/session/flood.py");
    wait_for(&cur.join("s.result"), Duration::from_secs(300));
    let [held, refused, named, other] = result(&cur.join("s.result"));
    assert_eq!(
        (held, refused, named, other),
        (200, 4800, 4800, 0),
        "held, refused, refusals naming the flag, other answers"
    );
    let (threads_during, fds_during) = (status(pid, "Threads:"), fds(pid));
    eprintln!(
        "daemon: {threads_before} threads and {fds_before} descriptors before, \
         {threads_during} and {fds_during} with 200 connections relayed"
    );
    assert!(
        threads_during <= threads_before + 8,
        "the daemon's threads grew with connections: {threads_before} -> {threads_during}"
    );
    assert!(
        fds_during <= fds_before + 2 * 200 + 40,
        "the daemon's descriptors: {fds_before} -> {fds_during}"
    );

    // Another session's proxy still works; past the daemon's budget
    // (260 of all sessions) a third session is refused naming it.
    let r = sh_in(&d, "a", "t", &get);
    assert_eq!(r.stdout, "hello /other\n", "{r:?}");
    let cur_u = allox_integration::session_current(&d, "a", "u");
    std::fs::write(
        cur_u.join("flood.py"),
        flood_script("u", 100, &allow, "--proxy-connections"),
    )
    .unwrap();
    let run_u = sh_bg(&d, "a", "u", "python3 /allox/session/flood.py");
    wait_for(&cur_u.join("u.result"), Duration::from_secs(60));
    let [held_u, refused_u, named_u, other_u] = result(&cur_u.join("u.result"));
    assert_eq!(
        (held_u, refused_u, named_u, other_u),
        (60, 40, 40, 0),
        "session u: held, refused, refusals naming --proxy-connections, other"
    );
    let w = watch.stop();
    assert!(w.threads <= threads_before + 8, "{w:?}");
    std::fs::write(cur.join("s.done"), "").unwrap();
    std::fs::write(cur_u.join("u.done"), "").unwrap();
    assert_eq!(wait_run(&d, "a", "s", &run).exit_code, Some(0));
    assert_eq!(wait_run(&d, "a", "u", &run_u).exit_code, Some(0));

    // The refusals are in the audit, naming the budget, at most one
    // record a second, counting the others.
    let records = audit(&d, "a", "s");
    let over: Vec<_> = records
        .iter()
        .filter(|r| {
            r["verdict"]
                .as_str()
                .is_some_and(|v| v.contains("its budget (--proxy-connections-per-session)"))
        })
        .collect();
    assert!(!over.is_empty(), "no refusal recorded");
    assert!(
        over.len() < 4800 / 10,
        "{} refusal records: not rate-limited",
        over.len()
    );
    assert_eq!(over[0]["allowed"], false);
}

#[test]
fn out_of_descriptors_the_proxy_pauses_instead_of_spinning() {
    let name = "out_of_descriptors_the_proxy_pauses_instead_of_spinning";
    if !setup(name) {
        return;
    }
    let (server, _) = allox_integration::hello_server();
    let dns = DnsStub::start(HashMap::new()).unwrap();
    let resolver = dns.addr().to_string();
    let allow = server.to_string();
    let d = ProcDaemon::start(
        "netfds",
        &[
            "--plugin",
            "network",
            "--network-resolver",
            &resolver,
            "--network-allow",
            &allow,
        ],
    );
    ctl_ok(&d, &["agent", "create", "a"]);
    ctl_ok(&d, &["session", "create", "a", "s", "--network", "proxy"]);
    let pid = d.daemon.child.id();
    let cur = allox_integration::session_current(&d, "a", "s");
    // Connections the daemon cannot accept stay queued; their clients
    // wait for an answer that does not come.
    std::fs::write(
        cur.join("fill.py"),
        r#"import os, socket, time
while not os.path.exists("/allox/session/go"):
    time.sleep(0.01)
held = []
for i in range(300):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", 3128))
    except BlockingIOError:
        pass
    held.append(s)
open("/allox/session/full", "w").close()
while not os.path.exists("/allox/session/done"):
    time.sleep(0.05)
"#,
    )
    .unwrap();
    let run = sh_bg(&d, "a", "s", "python3 /allox/session/fill.py");
    let watch = Watch::start(&d);
    std::thread::sleep(Duration::from_millis(300));
    // The daemon may now open only a few more descriptors.
    let limit = fds(pid) as u64 + 40;
    let raw = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::prlimit(
        Some(raw),
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(limit),
            maximum: Some(limit),
        },
    )
    .expect("prlimit the daemon's descriptors");
    std::fs::write(cur.join("go"), "").unwrap();
    wait_for(&cur.join("full"), Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    let cpu = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<u64> = after
            .split(' ')
            .skip(11)
            .take(2)
            .map(|n| n.parse().unwrap())
            .collect();
        f[0] + f[1]
    };
    let ticks = rustix::param::clock_ticks_per_second();
    let (t0, c0) = (Instant::now(), cpu(pid));
    std::thread::sleep(Duration::from_secs(3));
    let used = (cpu(pid) - c0) as f64 / ticks as f64 / t0.elapsed().as_secs_f64();
    eprintln!(
        "out of descriptors, the daemon used {:.0}% of a core",
        used * 100.0
    );
    watch.stop();
    assert!(
        used < 0.3,
        "out of descriptors, the daemon used {:.0}% of a core",
        used * 100.0
    );
    std::fs::write(cur.join("done"), "").unwrap();
    assert_eq!(wait_run(&d, "a", "s", &run).exit_code, Some(0));
}

/// A UDP socket on 127.0.0.1 that takes every question and answers none.
struct SilentDns(std::net::UdpSocket);

impl SilentDns {
    fn start() -> SilentDns {
        SilentDns(std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
    }
    fn addr(&self) -> SocketAddr {
        self.0.local_addr().unwrap()
    }
}

#[test]
fn lookups_that_never_answer_hold_up_no_one_else() {
    let name = "lookups_that_never_answer_hold_up_no_one_else";
    if !setup(name) {
        return;
    }
    let (server, _) = allox_integration::hello_server();
    let dns = SilentDns::start();
    let resolver = dns.addr().to_string();
    let allow = server.to_string();
    let d = ProcDaemon::start(
        "netdns",
        &[
            "--plugin",
            "network",
            "--network-resolver",
            &resolver,
            "--network-allow",
            "*.test",
            "--network-allow",
            &allow,
            "--proxy-lookups-per-session",
            "16",
        ],
    );
    ctl_ok(&d, &["agent", "create", "a"]);
    ctl_ok(&d, &["session", "create", "a", "s", "--network", "proxy"]);
    ctl_ok(&d, &["session", "create", "a", "t", "--network", "proxy"]);
    let cur = allox_integration::session_current(&d, "a", "s");
    // 200 names asked at once, each on a connection of its own.
    std::fs::write(
        cur.join("names.py"),
        r#"import socket, threading
answers = []
def ask(i):
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(b"CONNECT n%d.silent.test:80 HTTP/1.1\r\n\r\n" % i)
    s.settimeout(60)
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            got = s.recv(4096)
            if not got:
                break
            head += got
    except OSError:
        pass
    answers.append(head)
ts = [threading.Thread(target=ask, args=(i,)) for i in range(200)]
for t in ts:
    t.start()
for t in ts:
    t.join()
budget = sum(1 for a in answers if b"--proxy-lookups-per-session" in a)
print(len(answers), budget)
"#,
    )
    .unwrap();
    let watch = Watch::start(&d);
    let run = sh_bg(&d, "a", "s", "python3 /allox/session/names.py");
    std::thread::sleep(Duration::from_millis(500));
    // Meanwhile another session's runs and proxy.
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let t = Instant::now();
        let r = sh_in(&d, "a", "t", &format!("curl -sS http://{server}/other"));
        worst = worst.max(t.elapsed());
        assert_eq!(r.stdout, "hello /other\n", "{r:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    watch.stop();
    eprintln!("another session's run through its proxy: worst {worst:?}");
    assert!(worst < RUN_BOUND, "another session's run took {worst:?}");
    let r = wait_run(&d, "a", "s", &run);
    let counts: Vec<usize> = r
        .stdout
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(counts.len(), 2, "{r:?}");
    // 16 wait for the resolver; the others are refused at once.
    assert_eq!(counts[0], 200, "{r:?}");
    assert!(
        counts[1] >= 200 - 16,
        "{} of 200 refused naming --proxy-lookups-per-session",
        counts[1]
    );
}

#[test]
fn two_runs_connecting_at_once_are_each_named_in_the_audit() {
    let name = "two_runs_connecting_at_once_are_each_named_in_the_audit";
    if !setup(name) {
        return;
    }
    let (one, _) = allox_integration::hello_server();
    let (two, _) = allox_integration::hello_server();
    let dns = DnsStub::start(HashMap::new()).unwrap();
    let resolver = dns.addr().to_string();
    let (a1, a2) = (one.to_string(), two.to_string());
    let d = ProcDaemon::start(
        "netruns",
        &[
            "--plugin",
            "network",
            "--network-resolver",
            &resolver,
            "--network-allow",
            &a1,
            "--network-allow",
            &a2,
        ],
    );
    ctl_ok(&d, &["agent", "create", "a"]);
    ctl_ok(&d, &["session", "create", "a", "s", "--network", "proxy"]);
    let cur = allox_integration::session_current(&d, "a", "s");
    const N: usize = 500;
    std::fs::write(
        cur.join("connect.py"),
        format!(
            r#"import os, socket, sys, time
target = sys.argv[1].encode()
while not os.path.exists("/allox/session/go"):
    time.sleep(0.01)
for i in range({N}):
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(b"CONNECT " + target + b" HTTP/1.1\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        got = s.recv(4096)
        if not got:
            break
        head += got
    assert head.startswith(b"HTTP/1.1 200"), head
    s.close()
"#
        ),
    )
    .unwrap();
    let r1 = sh_bg(
        &d,
        "a",
        "s",
        &format!("python3 /allox/session/connect.py {a1}"),
    );
    let r2 = sh_bg(
        &d,
        "a",
        "s",
        &format!("python3 /allox/session/connect.py {a2}"),
    );
    std::fs::write(cur.join("go"), "").unwrap();
    assert_eq!(wait_run(&d, "a", "s", &r1).exit_code, Some(0));
    assert_eq!(wait_run(&d, "a", "s", &r2).exit_code, Some(0));
    // The target tells which run made each connection.
    let records = audit(&d, "a", "s");
    let (mut right, mut wrong, mut unnamed) = (0, Vec::new(), 0);
    for r in &records {
        let expect = match r["port"].as_u64() {
            Some(p) if p == one.port() as u64 => &r1,
            Some(p) if p == two.port() as u64 => &r2,
            _ => continue,
        };
        // Its record as it opened names the run too; counted once.
        match r["run_id"].as_str() {
            Some(id) if id == expect && r["open"] == true => {}
            Some(id) if id == expect => right += 1,
            Some(_) => wrong.push(r.clone()),
            None => unnamed += 1,
        }
    }
    eprintln!(
        "{right} records name their run, {} another, {unnamed} none",
        wrong.len()
    );
    assert!(
        wrong.is_empty(),
        "{} records name the other run: {:?}",
        wrong.len(),
        wrong.first()
    );
    assert_eq!(unnamed, 0, "records without their run");
    assert_eq!(right, 2 * N);
}

/// A non-loopback IPv4 address of one of this machine's interfaces.
fn own_address() -> Ipv4Addr {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .expect("ip -4 addr");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next()?.parse().ok())
        .expect(
            "network_flood::the_host_s_own_address needs a non-loopback IPv4 address on an \
             interface (`ip -4 addr` shows none)",
        )
}

/// An HTTP server on every address (`0.0.0.0`) answering `hello`.
fn server_on_every_address() -> u16 {
    let l = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n",
                );
            });
        }
    });
    port
}

#[test]
fn the_host_s_own_address_is_refused_unless_a_rule_names_it() {
    let name = "the_host_s_own_address_is_refused_unless_a_rule_names_it";
    if !setup(name) {
        return;
    }
    let own = own_address();
    let port = server_on_every_address();
    let dns = DnsStub::start(HashMap::from([("host.test".to_string(), own)])).unwrap();
    let resolver = dns.addr().to_string();
    let d = ProcDaemon::start(
        "netown",
        &["--plugin", "network", "--network-resolver", &resolver],
    );
    ctl_ok(&d, &["agent", "create", "a", "--allow", "*"]);
    ctl_ok(&d, &["session", "create", "a", "s", "--network", "proxy"]);
    let get = |host: &str| format!("curl -sS http://{host}:{port}/");
    // By address and by a name resolving to it: refused, saying why.
    for host in [own.to_string(), "host.test".to_string()] {
        let r = sh_in(&d, "a", "s", &get(&host));
        assert!(
            r.stdout.contains("403")
                || r.stdout
                    .contains("an address of this machine's own interfaces"),
            "{host}: {r:?}"
        );
        assert!(
            r.stdout
                .contains("an address of this machine's own interfaces"),
            "{host}: {r:?}"
        );
    }
    // Named by a rule: reached.
    let named = format!("{own}:{port}");
    ctl_ok(
        &d,
        &["net", "policy", "a", "--allow", "*", "--allow", &named],
    );
    let r = sh_in(&d, "a", "s", &get(&own.to_string()));
    assert_eq!(r.stdout, "hello\n", "{r:?}");
}

#[test]
fn refused_attempts_in_a_tight_loop_keep_the_network_audit_bounded() {
    let name = "refused_attempts_in_a_tight_loop_keep_the_network_audit_bounded";
    if !setup(name) {
        return;
    }
    const BOUND: u64 = 1024 * 1024;
    let d = ProcDaemon::start(
        "netauditfill",
        &["--plugin", "network", "--audit-file-bytes", "1M"],
    );
    ctl_ok(&d, &["agent", "create", "a", "--allow", "allowed.test"]);
    ctl_ok(&d, &["session", "create", "a", "s", "--network", "proxy"]);
    // An attempt the agent would hide, made before its flood.
    let r = sh_in(
        &d,
        "a",
        "s",
        "python3 -c 'import socket; s = socket.create_connection((\"127.0.0.1\", 3128)); s.sendall(b\"CONNECT earlier-attempt.denied.test:443 HTTP/1.1\\r\\n\\r\\n\"); s.recv(4096)'",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let mut c = d.daemon.client();
    let pinger = std::thread::spawn(move || {
        let mut worst = Duration::ZERO;
        while !s2.load(Ordering::Relaxed) {
            let t = Instant::now();
            match c.call(Request::Ping(Ping {})) {
                Ok(Ok(Response::Pong(_))) => worst = worst.max(t.elapsed()),
                other => panic!("ping: {other:?}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        worst
    });
    // Denied CONNECTs with long names, as fast as the proxy answers, until
    // their records (200 bytes of name each) are past what both files may
    // hold together by a fifth, or 40 s at most (a loaded host made 9,000
    // in 6 s); the script prints how many it made.
    let enough = 2 * BOUND * 6 / 5 / 200;
    let script = r#"
import socket, time
end = time.time() + 40
n = 0
name = ("x" * 60 + ".") * 3 + "denied.test"
while n < ENOUGH and time.time() < end:
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(("CONNECT %s%d:443 HTTP/1.1\r\n\r\n" % (name, n)).encode())
    s.recv(4096)
    s.close()
    n += 1
print(n)
"#;
    let script = script.replace("ENOUGH", &enough.to_string());
    let r = sh_in(&d, "a", "s", &format!("python3 -c '{script}'"));
    stop.store(true, Ordering::Relaxed);
    let worst = pinger.join().unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let made: u64 = r.stdout.trim().parse().expect("a count");
    // Each refusal's record names the 200-byte host: the flood wrote more
    // than both files may hold together.
    assert!(
        made * 200 > 2 * BOUND,
        "only {made} attempts: the flood did not pass the bound"
    );
    assert!(worst < ANSWER_BOUND, "ping took {worst:?}");
    let state = d.daemon.root.join("state");
    for f in ["network-audit.log", "network-audit.log.1"] {
        let n = std::fs::metadata(state.join(f)).map_or(0, |m| m.len());
        assert!(n <= BOUND + 4096, "{f} holds {n} bytes");
    }
    // The newest refusals are kept and read.
    let recs = audit(&d, "a", "s");
    assert!(!recs.is_empty(), "no record kept");
    assert!(
        recs.iter()
            .rev()
            .take(5)
            .any(|r| r["allowed"] == false
                && r["host"].as_str().unwrap_or("").contains(".denied.test")),
        "{:?}",
        recs.last()
    );
    // And the flood did not push the session's earlier attempt out of the
    // files kept: past the session's audit rate its attempts are refused,
    // counted (they rotated both files away in 40 s).
    assert!(
        recs.iter()
            .any(|r| r["host"] == "earlier-attempt.denied.test"),
        "the earlier attempt was rotated away ({} records kept)",
        recs.len()
    );
    assert!(
        recs.iter().any(|r| r["verdict"]
            .as_str()
            .unwrap_or("")
            .contains("--audit-lines-per-s")),
        "no refusal past the audit rate is recorded"
    );
}

/// A server that accepts and never closes a connection, whatever the
/// client does (a half-close included); its address.
fn holding_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            held.push(s);
        }
    });
    addr
}

/// A deleted session's relayed connections end with it, even to a server
/// that never closes its side: their descriptors leave the daemon and
/// their permits of the daemon's budget go back, so another session can
/// connect. (Before, each stayed half-closed for good, holding its permit:
/// two such sessions deleted left every other session refused.)
#[test]
fn a_deleted_session_s_connections_end_with_it() {
    let name = "a_deleted_session_s_connections_end_with_it";
    if !setup(name) {
        return;
    }
    let server = holding_server();
    let dns = DnsStub::start(HashMap::new()).unwrap();
    let resolver = dns.addr().to_string();
    let allow = server.to_string();
    let d = ProcDaemon::start(
        "netdeleted",
        &[
            "--plugin",
            "network",
            "--network-resolver",
            &resolver,
            "--network-allow",
            &allow,
            "--proxy-connections",
            "20",
        ],
    );
    ctl_ok(&d, &["agent", "create", "a"]);
    ctl_ok(&d, &["agent", "create", "b"]);
    ctl_ok(&d, &["session", "create", "a", "s", "--network", "proxy"]);
    ctl_ok(&d, &["session", "create", "b", "t", "--network", "proxy"]);
    let pid = d.daemon.child.id();
    let fds_before = fds(pid);
    let cur = allox_integration::session_current(&d, "a", "s");
    std::fs::write(
        cur.join("flood.py"),
        flood_script("s", 20, &allow, "--proxy-connections"),
    )
    .unwrap();
    sh_bg(&d, "a", "s", "python3 /allox/session/flood.py");
    wait_for(&cur.join("s.result"), Duration::from_secs(60));
    assert_eq!(result(&cur.join("s.result")), [20, 0, 0, 0]);
    ctl_ok(&d, &["session", "delete", "a", "s", "--force"]);
    // Its connections' descriptors leave the daemon.
    let t0 = Instant::now();
    while fds(pid) > fds_before + 10 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the deleted session's connections stay: {fds_before} descriptors before, {} now",
            fds(pid)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Another agent's session has the daemon's whole budget again.
    let cur_t = allox_integration::session_current(&d, "b", "t");
    std::fs::write(
        cur_t.join("flood.py"),
        flood_script("t", 20, &allow, "--proxy-connections"),
    )
    .unwrap();
    let run = sh_bg(&d, "b", "t", "python3 /allox/session/flood.py");
    wait_for(&cur_t.join("t.result"), Duration::from_secs(60));
    assert_eq!(
        result(&cur_t.join("t.result")),
        [20, 0, 0, 0],
        "held, refused, named, other: the deleted session's permits are still held"
    );
    std::fs::write(cur_t.join("t.done"), "").unwrap();
    assert_eq!(wait_run(&d, "b", "t", &run).exit_code, Some(0));
}
