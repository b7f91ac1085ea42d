//! The daemon over its socket: the JSON forms, concurrency, hostile peers.

use allox_integration::{require, workspace_bin, BtrfsFs, Daemon};
use allox_protocol::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn setup(name: &str, args: &[&str]) -> Option<(BtrfsFs, Daemon)> {
    if !require(name) {
        return None;
    }
    std::fs::create_dir_all("/var/tmp").ok();
    let fs = BtrfsFs::new(512).expect("make btrfs");
    let root = fs.path().join("store");
    std::fs::create_dir(&root).unwrap();
    let sock = fs.scratch().join("ctl.sock");
    let d = Daemon::start(&root, &sock, &[], args);
    Some((fs, d))
}

fn alloxctl(d: &Daemon, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(&d.socket)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn hello() -> Vec<u8> {
    encode(&ClientFrame::Hello(Hello {
        version: PROTOCOL_VERSION,
        build: "test".into(),
    }))
    .unwrap()
}

fn req(id: u64, r: Request) -> Vec<u8> {
    encode(&ClientFrame::Request(RequestEnvelope {
        request_id: id,
        request: r,
    }))
    .unwrap()
}

fn ping(id: u64) -> Vec<u8> {
    req(id, Request::Ping(Ping {}))
}

/// Reads frames until `n` have arrived (or the peer closes).
fn read_frames(s: &mut UnixStream, n: usize) -> Vec<ServerFrame> {
    let mut r = FrameReader::new();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    while out.len() < n {
        let k = match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => k,
        };
        r.push(&buf[..k]);
        while let Some(f) = r.next_frame() {
            out.push(decode::<ServerFrame>(&f.unwrap()).unwrap());
        }
    }
    out
}

fn greeted(d: &Daemon) -> UnixStream {
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.write_all(&hello()).unwrap();
    let f = read_frames(&mut s, 1);
    assert!(matches!(f[0], ServerFrame::Welcome(_)), "{f:?}");
    s
}

fn outcome(f: &ServerFrame) -> (u64, &Outcome) {
    match f {
        ServerFrame::Response(r) => (r.request_id, &r.outcome),
        other => panic!("expected a response, got {other:?}"),
    }
}

#[test]
fn rpc_json_and_human_cli() {
    let Some((_fs, d)) = setup("daemon::rpc_json_and_human_cli", &[]) else {
        return;
    };
    let (ok, out, _) = alloxctl(
        &d,
        &[
            "rpc",
            r#"{"action":"agent.create","params":{"agent_id":"agent-a"}}"#,
        ],
    );
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["result"]["agent_id"], "agent-a");
    let (ok, out, _) = alloxctl(
        &d,
        &[
            "rpc",
            r#"{"action":"agent.create","params":{"agent_id":"agent-a"}}"#,
        ],
    );
    assert!(!ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["error"]["code"], "conflict");
    let (ok, out, _) = alloxctl(
        &d,
        &[
            "rpc",
            r#"{"action":"agent.create","params":{"agent_id":"../x"}}"#,
        ],
    );
    assert!(!ok);
    assert!(out.contains("invalid_request"), "{out}");
    // Human subcommands.
    assert!(alloxctl(&d, &["session", "create", "agent-a", "s1"]).0);
    assert!(
        alloxctl(
            &d,
            &[
                "checkpoint",
                "create",
                "agent-a",
                "s1",
                "c1",
                "--label",
                "first"
            ]
        )
        .0
    );
    assert!(alloxctl(&d, &["rollback", "agent-a", "s1", "c1"]).0);
    assert!(alloxctl(&d, &["checkpoint", "create", "agent-a", "s1", "c2"]).0);
    let (ok, out, _) = alloxctl(&d, &["checkpoint", "list", "agent-a", "s1"]);
    assert!(
        ok && out.contains("c1") && out.contains("c2") && out.contains("current"),
        "{out}"
    );
    let (ok, _, err) = alloxctl(&d, &["session", "delete", "agent-a", "nope"]);
    assert!(!ok && err.contains("not_found"), "{err}");
    let (ok, out, _) = alloxctl(&d, &["--json", "audit"]);
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let recs = v["records"].as_array().unwrap();
    let actions: Vec<(&str, &str)> = recs
        .iter()
        .map(|r| {
            (
                r["action"].as_str().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(actions.contains(&("agent.create", "ok")));
    assert!(actions.contains(&("agent.create", "conflict")));
    assert!(actions.contains(&("agent.create", "invalid_request")));
    assert!(actions.contains(&("session.rollback", "ok")));
    assert!(actions.contains(&("session.delete", "not_found")));
    assert!(recs
        .iter()
        .all(|r| r["peer"].as_str().unwrap().starts_with("uid=0")));
}

#[test]
fn seed_curl_examples_work_through_the_gateway() {
    let Some((_fs, d)) = setup("daemon::seed_curl_examples_work_through_the_gateway", &[]) else {
        return;
    };
    assert!(
        allox_integration::which("curl").is_some(),
        "curl is needed (apt-get install curl)"
    );
    let mut gw = Command::new(workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["gateway", "--listen", "127.0.0.1:8092"])
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::net::TcpStream::connect("127.0.0.1:8092").is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "gateway did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let auth = format!("Authorization: Bearer {}", token(&d.socket));
    // The four calls exactly as the design document gives them.
    let calls = [
        r#"{"action":"agent.create","params":{"agent_id":"agent-a"}}"#,
        r#"{"action":"session.create","params":{"agent_id":"agent-a","session_id":"session-1"}}"#,
        r#"{"action":"checkpoint.create","params":{"agent_id":"agent-a","session_id":"session-1","checkpoint_id":"clean"}}"#,
        r#"{"action":"session.rollback","params":{"agent_id":"agent-a","session_id":"session-1","checkpoint_id":"clean"}}"#,
    ];
    let curl = |body: &str| {
        let out = Command::new("curl")
            .args([
                "-sS",
                "http://127.0.0.1:8092/v1/rpc",
                "-H",
                &auth,
                "-H",
                "Content-Type: application/json",
                "-d",
                body,
            ])
            .args(["-w", "\n%{http_code}"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (json, code) = text.rsplit_once('\n').unwrap();
        (
            code.to_string(),
            serde_json::from_str::<serde_json::Value>(json).unwrap(),
        )
    };
    for body in calls {
        let (code, v) = curl(body);
        assert_eq!(code, "200", "{body}: {v}");
        assert!(v.get("result").is_some(), "{v}");
    }
    let (code, v) = curl(calls[0]);
    assert_eq!(
        (code.as_str(), v["error"]["code"].as_str()),
        ("409", Some("conflict"))
    );
    let (code, v) = curl(
        r#"{"action":"session.rollback","params":{"agent_id":"agent-a","session_id":"session-1","checkpoint_id":"missing"}}"#,
    );
    assert_eq!(
        (code.as_str(), v["error"]["code"].as_str()),
        ("404", Some("not_found"))
    );
    let (code, _) = curl("{not json");
    assert_eq!(code, "400");
    let _ = gw.kill();
    let _ = gw.wait();
}

#[test]
fn many_clients_at_once() {
    let Some((_fs, d)) = setup("daemon::many_clients_at_once", &[]) else {
        return;
    };
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let sock = d.socket.clone();
            std::thread::spawn(move || {
                let mut c = allox_ctl::Client::connect(&sock).unwrap();
                let a = format!("agent-{t}");
                c.call(Request::AgentCreate(AgentCreate::new(a.clone())))
                    .unwrap()
                    .unwrap();
                for s in 0..5 {
                    let s = format!("s{s}");
                    c.call(Request::SessionCreate(SessionCreate::new(
                        a.clone(),
                        s.clone(),
                    )))
                    .unwrap()
                    .unwrap();
                    c.call(Request::CheckpointCreate(CheckpointCreate {
                        agent_id: a.clone(),
                        session_id: s.clone(),
                        checkpoint_id: "c".into(),
                        pinned: false,
                        label: None,
                    }))
                    .unwrap()
                    .unwrap();
                    c.call(Request::SessionRollback(SessionRollback {
                        agent_id: a.clone(),
                        session_id: s,
                        checkpoint_id: "c".into(),
                        kill_processes: None,
                    }))
                    .unwrap()
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let Response::Agents(l) = d
        .client()
        .call(Request::AgentList(AgentList {}))
        .unwrap()
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(l.agents.len(), 8);
    assert!(l.agents.iter().all(|a| a.sessions == 5));
}

#[test]
fn one_connection_carries_many_requests_in_flight() {
    let Some((_fs, d)) = setup("daemon::one_connection_carries_many_requests", &[]) else {
        return;
    };
    let mut s = greeted(&d);
    let mut batch = Vec::new();
    for i in 1..=40u64 {
        batch.extend(req(
            i,
            Request::AgentCreate(AgentCreate::new(format!("a{i}"))),
        ));
        batch.extend(ping(1000 + i));
    }
    s.write_all(&batch).unwrap();
    let frames = read_frames(&mut s, 80);
    let mut ids: Vec<u64> = frames
        .iter()
        .map(|f| {
            let (id, o) = outcome(f);
            assert!(matches!(o, Outcome::Ok(_)), "{o:?}");
            id
        })
        .collect();
    ids.sort();
    let mut want: Vec<u64> = (1..=40).chain(1001..=1040).collect();
    want.sort();
    assert_eq!(ids, want);
}

#[test]
fn hostile_frames_get_errors_and_the_connection_recovers() {
    let Some((_fs, d)) = setup("daemon::hostile_frames", &[]) else {
        return;
    };
    let mut s = greeted(&d);
    // Garbage that is not COBS, a frame that decodes to nonsense, trailing
    // bytes after a valid message, then a good request.
    let mut bad_trailing = postcard::to_stdvec(&ClientFrame::Request(RequestEnvelope {
        request_id: 5,
        request: Request::Ping(Ping {}),
    }))
    .unwrap();
    bad_trailing.push(0x01);
    let mut bytes = vec![0x05, 0x01, 0x00];
    bytes.extend(allox_protocol::frame::frame(&[0x01, 0x02, 0xc8, 0x00]).unwrap());
    bytes.extend(allox_protocol::frame::frame(&bad_trailing).unwrap());
    bytes.extend(ping(9));
    s.write_all(&bytes).unwrap();
    let f = read_frames(&mut s, 4);
    for x in &f[..3] {
        let (id, o) = outcome(x);
        assert_eq!(id, 0);
        let Outcome::Err(e) = o else { panic!("{o:?}") };
        assert_eq!(e.code, ErrorCode::InvalidRequest);
    }
    assert_eq!(outcome(&f[3]).0, 9);
    // An oversized frame is dropped up to its delimiter without buffering it.
    let mut big = vec![0x55u8; 2 << 20];
    big.push(0);
    big.extend(ping(10));
    s.write_all(&big).unwrap();
    let f = read_frames(&mut s, 2);
    let Outcome::Err(e) = outcome(&f[0]).1 else {
        panic!()
    };
    assert!(e.message.contains("longer than"), "{}", e.message);
    assert_eq!(outcome(&f[1]).0, 10);
}

#[test]
fn handshake_is_enforced() {
    let Some((_fs, d)) = setup("daemon::handshake_is_enforced", &[]) else {
        return;
    };
    // Wrong version: refused with version_mismatch, then closed.
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.write_all(
        &encode(&ClientFrame::Hello(Hello {
            version: 999,
            build: "old".into(),
        }))
        .unwrap(),
    )
    .unwrap();
    // The server may already have closed after its refusal.
    let _ = s.write_all(&ping(1));
    let f = read_frames(&mut s, 5);
    assert_eq!(f.len(), 1, "nothing but the refusal: {f:?}");
    let ServerFrame::Refused(e) = &f[0] else {
        panic!("{f:?}")
    };
    assert_eq!(e.code, ErrorCode::VersionMismatch);
    assert!(e.message.contains("999"), "{}", e.message);
    // A request before Hello is refused.
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.write_all(&ping(1)).unwrap();
    let f = read_frames(&mut s, 5);
    assert!(
        matches!(&f[..], [ServerFrame::Refused(e)] if e.code == ErrorCode::InvalidRequest),
        "{f:?}"
    );
    // The refused connections left the daemon serving: a proper handshake
    // still works.
    let ok = allox_ctl::Client::handshake(UnixStream::connect(&d.socket).unwrap()).map(|_| ());
    assert!(ok.is_ok());
}

#[test]
fn stalled_vanishing_and_non_reading_clients_do_not_hold_up_others() {
    let Some((_fs, d)) = setup(
        "daemon::stalled_vanishing_and_non_reading_clients",
        &["--stall-timeout-ms", "500", "--write-timeout-ms", "1000"],
    ) else {
        return;
    };
    // Vanishes mid-frame.
    {
        let mut s = greeted(&d);
        let f = ping(1);
        s.write_all(&f[..f.len() / 2]).unwrap();
    }
    // Stalls mid-frame: dropped after the stall limit.
    let mut stalled = greeted(&d);
    let f = ping(1);
    stalled.write_all(&f[..2]).unwrap();
    // Never reads: floods requests with large answers.
    let mut flood = greeted(&d);
    let mut c = d.client();
    for i in 0..200 {
        c.call(Request::AgentCreate(AgentCreate::new(format!(
            "agent-with-a-long-name-{i:04}"
        ))))
        .unwrap()
        .unwrap();
    }
    let flooder = std::thread::spawn(move || {
        let frame = req(7, Request::AgentList(AgentList {}));
        let mut sent = 0;
        flood
            .set_write_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        while flood.write_all(&frame).is_ok() {
            sent += 1;
            if sent > 200_000 {
                break;
            }
        }
        sent
    });
    // Meanwhile another client is served promptly.
    let t0 = Instant::now();
    let mut worst = Duration::ZERO;
    while t0.elapsed() < Duration::from_secs(3) {
        let t = Instant::now();
        c.call(Request::Ping(Ping {})).unwrap().unwrap();
        worst = worst.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        worst < Duration::from_millis(500),
        "a healthy client waited {worst:?}"
    );
    // The staller was dropped: its socket reads EOF.
    stalled
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut b = [0u8; 16];
    assert!(
        matches!(stalled.read(&mut b), Ok(0) | Err(_)),
        "stalled client still connected"
    );
    // The flooder was dropped: its writes end.
    let sent = flooder.join().unwrap();
    assert!(
        sent < 200_000,
        "a client that never reads was never dropped"
    );
    c.call(Request::Ping(Ping {})).unwrap().unwrap();
}

#[test]
fn turns_through_the_json_form() {
    let Some((_fs, d)) = setup("daemon::turns_through_the_json_form", &[]) else {
        return;
    };
    let rpc = |j: &str| {
        let (ok, out, err) = alloxctl(&d, &["rpc", j]);
        assert!(ok, "{j}: {out} {err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    rpc(r#"{"action":"agent.create","params":{"agent_id":"a"}}"#);
    rpc(
        r#"{"action":"session.create","params":{"agent_id":"a","session_id":"s","auto_checkpoint":true,"keep_last":3}}"#,
    );
    let t = rpc(r#"{"action":"turn.begin","params":{"agent_id":"a","session_id":"s"}}"#);
    assert_eq!(t["result"]["turn_id"], "turn-1");
    let t = rpc(
        r#"{"action":"turn.end","params":{"agent_id":"a","session_id":"s","turn_id":"turn-1","status":"ok","label":"wrote the parser"}}"#,
    );
    assert_eq!(t["result"]["checkpoint_id"], "turn-1");
    let (ok, out, _) = alloxctl(&d, &["log", "a", "s"]);
    assert!(
        ok && out.contains("baseline") && out.contains("wrote the parser"),
        "{out}"
    );
}

/// The gateway's token, as a script gets it.
fn token(socket: &std::path::Path) -> String {
    let out = Command::new(workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(socket)
        .arg("token")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// One call with curl: its status code (`000` when it got no answer) and
/// body; `args` go before the body.
fn curl(url: &str, args: &[&str], body: &str) -> (String, String) {
    assert!(
        allox_integration::which("curl").is_some(),
        "curl is needed (scripts/deps.sh installs it)"
    );
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "60", url])
        .args(args)
        .args(["-d", body, "-w", "\n%{http_code}"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.to_owned(), body.to_owned())
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"))
}

fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn gateway_serves_only_the_token_holder_from_here() {
    let Some((fs, d)) = setup(
        "daemon::gateway_serves_only_the_token_holder_from_here",
        &[],
    ) else {
        return;
    };
    let gw =
        allox_integration::Gateway::start(&d.socket, &["--allow-origin", "http://app.example"]);
    // The token file is made beside the socket, 0600, and named at start.
    let file = fs.scratch().join("gateway.token");
    assert_eq!(mode(&file), 0o600);
    assert!(gw.log.lock().unwrap().contains(&file.display().to_string()));
    let token = token(&d.socket);
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), token);
    assert_eq!(token.len(), 64);
    let url = gw.url();
    let auth = format!("Authorization: Bearer {token}");
    let json_type = "Content-Type: application/json";
    let create =
        |agent: &str| format!(r#"{{"action":"agent.create","params":{{"agent_id":"{agent}"}}}}"#);

    // No token, a wrong one, another scheme: 401 unauthorized.
    let wrong = format!("Authorization: Bearer {}", "0".repeat(64));
    let basic = format!("Authorization: Basic {token}");
    for args in [
        &["-H", json_type][..],
        &["-H", json_type, "-H", &wrong],
        &["-H", json_type, "-H", &basic],
    ] {
        let (code, body) = curl(&url, args, &create("refused"));
        assert_eq!(code, "401", "{args:?}: {body}");
        assert_eq!(json(&body)["error"]["code"], "unauthorized", "{body}");
    }
    // The right one: served.
    let (code, body) = curl(&url, &["-H", json_type, "-H", &auth], &create("served"));
    assert_eq!(code, "200", "{body}");
    assert_eq!(json(&body)["result"]["agent_id"], "served");
    // Not JSON: 415 (curl -d says form-urlencoded unless told).
    let (code, body) = curl(&url, &["-H", &auth], &create("refused"));
    assert_eq!(code, "415", "{body}");
    let (code, body) = curl(
        &url,
        &["-H", &auth, "-H", "Content-Type: text/plain"],
        &create("refused"),
    );
    assert_eq!(code, "415", "{body}");
    // A name that rebinds to 127.0.0.1: refused.
    let host = format!("Host: rebind.example:{}", gw.addr.port());
    let (code, body) = curl(
        &url,
        &["-H", json_type, "-H", &auth, "-H", &host],
        &create("refused"),
    );
    assert_eq!(code, "403", "{body}");
    assert_eq!(json(&body)["error"]["code"], "unauthorized", "{body}");
    // localhost is this gateway.
    let local = format!("http://localhost:{}/v1/rpc", gw.addr.port());
    let (code, body) = curl(
        &local,
        &["-H", json_type, "-H", &auth],
        &create("via-localhost"),
    );
    assert_eq!(code, "200", "{body}");
    // A page of another origin: refused; the allowed one: served, and
    // its preflight answered.
    let (code, body) = curl(
        &url,
        &[
            "-H",
            json_type,
            "-H",
            &auth,
            "-H",
            "Origin: http://evil.example",
        ],
        &create("refused"),
    );
    assert_eq!(code, "403", "{body}");
    let (code, body) = curl(
        &url,
        &[
            "-H",
            json_type,
            "-H",
            &auth,
            "-H",
            "Origin: http://app.example",
            "-i",
        ],
        &create("from-app"),
    );
    assert_eq!(code, "200", "{body}");
    assert!(
        body.to_ascii_lowercase()
            .contains("access-control-allow-origin: http://app.example"),
        "{body}"
    );
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "60",
            "-X",
            "OPTIONS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &url,
        ])
        .args([
            "-H",
            "Origin: http://app.example",
            "-H",
            "Access-Control-Request-Method: POST",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "204");

    // Nothing refused reached the daemon.
    let Response::Agents(l) = d
        .client()
        .call(Request::AgentList(AgentList {}))
        .unwrap()
        .unwrap()
    else {
        panic!()
    };
    let mut names: Vec<_> = l.agents.iter().map(|a| a.agent_id.as_str()).collect();
    names.sort();
    assert_eq!(names, ["from-app", "served", "via-localhost"]);
    // A restart reads the same token; the file is not rewritten.
    let before = std::fs::metadata(&file).unwrap().modified().unwrap();
    drop(gw);
    let gw = allox_integration::Gateway::start(&d.socket, &[]);
    assert!(
        gw.log.lock().unwrap().contains("existing"),
        "{}",
        gw.log.lock().unwrap()
    );
    assert_eq!(
        std::fs::metadata(&file).unwrap().modified().unwrap(),
        before
    );
    let (code, body) = curl(
        &gw.url(),
        &["-H", json_type, "-H", &auth],
        r#"{"action":"system.ping","params":{}}"#,
    );
    assert_eq!(code, "200", "{body}");
}

#[test]
fn gateway_refuses_remote_addresses_and_open_token_files() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ctl.sock");
    // Each of these must stop at once with an error, not serve.
    let gateway = |args: &[&str]| {
        let mut child = Command::new(workspace_bin("alloxctl"))
            .arg("--socket")
            .arg(&socket)
            .arg("gateway")
            .args(args)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("alloxctl gateway {args:?} went on serving");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status.code(), err)
    };
    // Not loopback without --allow-remote: a clear error, nothing bound.
    let (status, err) = gateway(&["--listen", "0.0.0.0:0"]);
    assert_eq!(status, Some(1), "{err}");
    assert!(
        err.contains("not a loopback address") && err.contains("--allow-remote"),
        "{err}"
    );
    assert!(!dir.path().join("gateway.token").exists());

    // A token file open to its group is refused, by the gateway and by
    // `alloxctl token`, and left as it was.
    use std::os::unix::fs::PermissionsExt;
    let open = dir.path().join("open.token");
    std::fs::write(&open, "a".repeat(64)).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o640)).unwrap();
    let open_arg = open.to_str().unwrap();
    let (status, err) = gateway(&["--token-file", open_arg]);
    assert_eq!(status, Some(1), "{err}");
    assert!(
        err.contains("open to its group or others") && err.contains("chmod 600"),
        "{err}"
    );
    let out = Command::new(workspace_bin("alloxctl"))
        .args(["token", "--token-file", open_arg])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("chmod 600"));
    assert_eq!(std::fs::read_to_string(&open).unwrap(), "a".repeat(64));
    assert_eq!(mode(&open), 0o640);

    // A new one is made 0600 and printed.
    let new = dir.path().join("new.token");
    let out = Command::new(workspace_bin("alloxctl"))
        .args(["token", "--token-file", new.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(mode(&new), 0o600);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        std::fs::read_to_string(&new).unwrap()
    );
}

#[test]
fn slow_daemon_calls_do_not_hold_every_gateway_worker() {
    if !require("daemon::slow_daemon_calls_do_not_hold_every_gateway_worker") {
        return;
    }
    let d = allox_integration::ProcDaemon::start("gateway_slow", &[]);
    let socket = d.daemon.socket.clone();
    let mut c = d.daemon.client();
    c.call(Request::AgentCreate(AgentCreate::new("a")))
        .unwrap()
        .unwrap();
    c.call(Request::SessionCreate(SessionCreate::new("a", "s")))
        .unwrap()
        .unwrap();
    let gw = allox_integration::Gateway::start(&socket, &["--daemon-timeout-ms", "1500"]);
    let (url, auth) = (
        gw.url(),
        format!("Authorization: Bearer {}", token(&socket)),
    );
    let call = move |url: &str, auth: &str, body: &str| {
        curl(
            url,
            &["-H", "Content-Type: application/json", "-H", auth],
            body,
        )
    };
    // As many long waits as the gateway has workers.
    let slow = r#"{"action":"process.start","params":{"agent_id":"a","session_id":"s","argv":["sleep","40"],"wait":true}}"#;
    let waits: Vec<_> = (0..allox_ctl::gateway::WORKERS)
        .map(|_| {
            let (url, auth) = (url.clone(), auth.clone());
            std::thread::spawn(move || call(&url, &auth, slow))
        })
        .collect();
    // Until the daemon runs all of them.
    let t0 = Instant::now();
    loop {
        let Response::Processes(l) = c
            .call(Request::ProcessList(SessionRef {
                agent_id: "a".into(),
                session_id: "s".into(),
            }))
            .unwrap()
            .unwrap()
        else {
            panic!()
        };
        let mut runs: Vec<_> = l
            .processes
            .iter()
            .filter_map(|p| p.run_id.clone())
            .collect();
        runs.sort();
        runs.dedup();
        if runs.len() >= allox_ctl::gateway::WORKERS {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "runs did not start: {runs:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Another client is served long before the runs end (liveness bound
    // far below their 40 s).
    let ping = r#"{"action":"system.ping","params":{}}"#;
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &url,
        ])
        .args([
            "-H",
            "Content-Type: application/json",
            "-H",
            &auth,
            "-d",
            ping,
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{out:?}");
    // Each long call got a clear gateway timeout...
    for w in waits {
        let (code, body) = w.join().unwrap();
        assert_eq!(code, "504", "{body}");
        let v = json(&body);
        assert_eq!(v["error"]["code"], "unavailable");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("did not answer within 1500 ms"),
            "{message}"
        );
    }
    // ...and every worker serves again over a new daemon connection.
    for _ in 0..2 * allox_ctl::gateway::WORKERS {
        let (code, body) = call(&url, &auth, ping);
        assert_eq!(code, "200", "{body}");
    }
    c.call(Request::ProcessKill(ProcessKill {
        agent_id: "a".into(),
        session_id: "s".into(),
        run_id: None,
        signal: None,
    }))
    .unwrap()
    .unwrap();
}

#[test]
fn control_socket_is_0600_from_the_moment_it_exists() {
    if !require("daemon::control_socket_is_0600_from_the_moment_it_exists") {
        return;
    }
    use rustix::fs::inotify;
    use std::os::unix::fs::FileTypeExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    std::fs::create_dir_all("/var/tmp").ok();
    let fs = BtrfsFs::new(256).expect("make btrfs");
    let root = fs.path().join("store");
    std::fs::create_dir(&root).unwrap();
    let dir = fs.scratch().join("run");
    std::fs::create_dir(&dir).unwrap();
    let sock = dir.join("ctl.sock");
    // Every change under the directory, and a thread looking all along.
    let ino =
        inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK).unwrap();
    inotify::add_watch(
        &ino,
        &dir,
        inotify::WatchFlags::CREATE | inotify::WatchFlags::MOVED_TO | inotify::WatchFlags::ATTRIB,
    )
    .unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let watcher = {
        let (stop, sock) = (stop.clone(), sock.clone());
        std::thread::spawn(move || {
            let (mut looks, mut seen) = (0u64, Vec::new());
            // Until told to stop, and at least once after the socket is
            // there (the daemon serves by then).
            while !(stop.load(Ordering::SeqCst) && looks > 0) {
                if let Ok(m) = std::fs::symlink_metadata(&sock) {
                    use std::os::unix::fs::PermissionsExt;
                    looks += 1;
                    let bits = m.permissions().mode() & 0o7777;
                    if !m.file_type().is_socket() || bits != 0o600 {
                        seen.push(bits);
                    }
                }
            }
            (looks, seen)
        })
    };
    let d = Daemon::start(&root, &sock, &[], &["--no-processes"]);
    stop.store(true, Ordering::SeqCst);
    let (_, seen) = watcher.join().unwrap();
    let seen: Vec<String> = seen.iter().map(|m| format!("{m:o}")).collect();
    assert!(seen.is_empty(), "the socket was seen with modes {seen:?}");
    let mut events = Vec::new();
    let mut buf = [std::mem::MaybeUninit::uninit(); 4096];
    let mut reader = inotify::Reader::new(&ino, &mut buf);
    while let Ok(e) = reader.next() {
        let name = e.file_name().map(|n| n.to_string_lossy().into_owned());
        events.push((name, e.events()));
    }
    let on_socket: Vec<_> = events
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("ctl.sock"))
        .map(|(_, e)| *e)
        .collect();
    // It appears by a rename, already 0600, and never changes after.
    assert_eq!(on_socket, [inotify::ReadFlags::MOVED_TO], "{events:?}");
    assert_eq!(mode(&sock), 0o600);
    // Nothing is left of the directory it was made in.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["ctl.sock"]);
    d.client().call(Request::Ping(Ping {})).unwrap().unwrap();
    // Another user cannot even connect (the file mode is the first gate).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(fs.scratch(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ok, _, err) = as_user(&d, 65534, &["ping"]);
    assert!(!ok && err.contains("permission denied"), "{err}");
}

/// `alloxctl ARGS` run as `uid` (group the same number).
fn as_user(d: &Daemon, uid: u32, args: &[&str]) -> (bool, String, String) {
    use std::os::unix::process::CommandExt;
    let out = Command::new(workspace_bin("alloxctl"))
        .uid(uid)
        .gid(uid)
        .arg("--socket")
        .arg(&d.socket)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn peers_not_allowed_are_refused_and_audited() {
    let Some((fs, d)) = setup(
        "daemon::peers_not_allowed_are_refused_and_audited",
        &["--no-processes", "--allow-uid", "65533"],
    ) else {
        return;
    };
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(fs.scratch(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Other users may connect now; their credentials decide.
    assert_eq!(mode(&d.socket), 0o666);
    let (ok, _, err) = as_user(&d, 65534, &["agent", "create", "intruder"]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("unauthorized") && err.contains("uid 65534"),
        "{err}"
    );
    let (ok, out, err) = as_user(&d, 65533, &["agent", "create", "allowed"]);
    assert!(ok, "{out} {err}");
    // Root still is served; the refusal is in the audit log (written off
    // the accept loop: looked for until it is there), the allowed user's
    // request too, the intruder's never reached the store.
    let t0 = Instant::now();
    let a = loop {
        let Response::Audit(a) = d
            .client()
            .call(Request::AuditList(AuditList {
                after_seq: None,
                limit: None,
            }))
            .unwrap()
            .unwrap()
        else {
            panic!()
        };
        if a.records.iter().any(|r| r.action == "connection.refused") {
            break a;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no refusal audited: {:?}",
            a.records
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let refused: Vec<_> = a
        .records
        .iter()
        .filter(|r| r.action == "connection.refused")
        .collect();
    assert_eq!(refused.len(), 1, "{:?}", a.records);
    assert_eq!(refused[0].outcome, "unauthorized");
    assert!(
        refused[0].peer.starts_with("uid=65534 pid="),
        "{}",
        refused[0].peer
    );
    assert!(a.records.iter().any(|r| r.action == "agent.create"
        && r.target == "allowed"
        && r.peer.starts_with("uid=65533")));
    assert!(!a.records.iter().any(|r| r.target == "intruder"));
}
