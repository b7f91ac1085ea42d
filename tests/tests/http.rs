//! The HTTP gateway as agent platforms drive it: many requests on one
//! keep-alive connection, HTTP/2 without TLS, NDJSON streams of runs and
//! watches (in order, ending with the answer), clients that go away
//! mid-stream, the OpenAPI document, an orderly stop. A real daemon on a
//! real Btrfs store, `alloxctl gateway` in front of it, curl and a plain
//! keep-alive client on the loopback.

use allox_integration::http::KeepAlive;
use allox_integration::{call, gateway_token, require, which, Gateway, ProcDaemon};
use allox_protocol::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Setup {
    d: ProcDaemon,
    gw: Gateway,
    token: String,
}

fn setup(name: &str) -> Option<Setup> {
    if !require(&format!("http::{name}")) {
        return None;
    }
    let missing = which("curl").is_none().then(|| "curl".to_string());
    if !allox_integration::needs(&format!("http::{name}"), missing) {
        return None;
    }
    let d = ProcDaemon::start(name, &[]);
    allox_integration::make_sessions(&d, &[("a", "s")]);
    let gw = Gateway::start(&d.daemon.socket, &[]);
    let token = gateway_token(&d.daemon.socket);
    Some(Setup { d, gw, token })
}

impl Setup {
    fn url(&self, action: &str) -> String {
        format!("http://{}/v1/rpc/{action}", self.gw.addr)
    }

    /// curl with the token and a JSON body; more `args` before the URL.
    fn curl(&self, action: &str, params: &Value, args: &[&str]) -> Command {
        let mut c = Command::new("curl");
        c.args(["-sS", "-N", "--max-time", "300"])
            .args(["-H", &format!("Authorization: Bearer {}", self.token)])
            .args(["-H", "Content-Type: application/json"])
            .args(["--data-binary", &params.to_string()])
            .args(args)
            .arg(self.url(action));
        c
    }

    /// A streamed request: curl's output, line by line, as it comes.
    fn stream(&self, action: &str, params: &Value, extra: &[&str]) -> Stream {
        let mut args = vec!["-H", "Accept: application/x-ndjson"];
        args.extend_from_slice(extra);
        let mut child = self
            .curl(action, params, &args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("run curl");
        let lines = BufReader::new(child.stdout.take().expect("piped"));
        Stream { child, lines }
    }
}

struct Stream {
    child: std::process::Child,
    lines: BufReader<std::process::ChildStdout>,
}

impl Stream {
    fn next(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.lines.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")),
            ),
        }
    }

    /// The client goes away.
    fn cut(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sh(script: &str) -> Value {
    json!({"agent_id": "a", "session_id": "s", "argv": ["/bin/sh", "-c", script],
           "wait": true, "stream": true})
}

/// The output of a stream's events, per stream, and its last line.
fn drain(s: &mut Stream) -> (Vec<u8>, Vec<u8>, Value, usize) {
    let (mut out, mut err, mut events) = (Vec::new(), Vec::new(), 0);
    while let Some(v) = s.next() {
        if let Some(e) = v.get("event") {
            events += 1;
            if let Some(o) = e.get("output") {
                let data = base64_decode(o["data"].as_str().unwrap());
                match o["stream"].as_str() {
                    Some("stdout") => out.extend(data),
                    Some("stderr") => err.extend(data),
                    other => panic!("stream {other:?}"),
                }
            }
            continue;
        }
        assert!(s.next().is_none(), "a line after the answer");
        return (out, err, v, events);
    }
    panic!("the stream ended without its answer");
}

fn base64_decode(s: &str) -> Vec<u8> {
    let v: Bytes = serde_json::from_value(Value::String(s.into())).expect("base64");
    v.0
}

fn live_runs(d: &ProcDaemon) -> Vec<String> {
    match call(
        d,
        Request::ProcessList(SessionRef {
            agent_id: "a".into(),
            session_id: "s".into(),
        }),
    )
    .unwrap()
    {
        Response::Processes(p) => {
            let mut runs: Vec<String> = p.processes.into_iter().filter_map(|p| p.run_id).collect();
            runs.dedup();
            runs
        }
        other => panic!("{other:?}"),
    }
}

fn gateway_sockets(gw: &Gateway) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", gw.child.id()))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy().starts_with("socket:"))
                .count()
        })
        .unwrap_or(0)
}

fn percentile(v: &mut [Duration], p: usize) -> Duration {
    v.sort();
    v[(v.len() * p / 100).min(v.len() - 1)]
}

#[test]
fn a_thousand_requests_of_each_action_on_one_connection_do_not_stall() {
    let Some(st) = setup("keep_alive") else {
        return;
    };
    for i in 0..10 {
        call(
            &st.d,
            Request::CheckpointCreate(CheckpointCreate {
                agent_id: "a".into(),
                session_id: "s".into(),
                checkpoint_id: format!("c{i}"),
                pinned: false,
                label: None,
            }),
        )
        .unwrap();
    }
    let actions = [
        ("system.ping", json!({})),
        ("agent.list", json!({})),
        ("session.list", json!({"agent_id": "a"})),
        (
            "checkpoint.list",
            json!({"agent_id": "a", "session_id": "s"}),
        ),
    ];
    let mut one = KeepAlive::connect(st.gw.addr, &st.token);
    for (action, params) in &actions {
        let body = json!({"action": action, "params": params}).to_string();
        let mut reused = Vec::new();
        for _ in 0..1000 {
            let t = Instant::now();
            let (code, v) = one.post("/v1/rpc", &body);
            reused.push(t.elapsed());
            assert_eq!(code, 200, "{action}: {v}");
            assert!(v.get("result").is_some(), "{v}");
        }
        let mut fresh = Vec::new();
        for _ in 0..100 {
            let t = Instant::now();
            let (code, _) = KeepAlive::connect(st.gw.addr, &st.token).post("/v1/rpc", &body);
            fresh.push(t.elapsed());
            assert_eq!(code, 200);
        }
        let (p50, p99) = (percentile(&mut reused, 50), percentile(&mut reused, 99));
        let most = reused.iter().max().copied().unwrap_or_default();
        let f50 = percentile(&mut fresh, 50);
        println!(
            "{action}: one connection p50 {p50:?} p99 {p99:?} max {most:?}; a new connection each p50 {f50:?}"
        );
        // A delayed-ACK stall costs 40 ms a request: it would be the median.
        assert!(
            p50 < Duration::from_millis(20),
            "{action}: p50 {p50:?} on one connection"
        );
        // A kept connection saves the handshake: never dearer than a new one
        // (with room for a loaded machine).
        assert!(
            p50.as_secs_f64() <= 1.5 * f50.as_secs_f64(),
            "{action}: p50 {p50:?} on one connection, {f50:?} on new ones"
        );
    }
    // A client that writes the head and the body apart, Nagle on (httpx
    // does): its body waits for the head's ACK, which the gateway gives at
    // once (a delayed ACK is 40 ms a request).
    let mut split = KeepAlive::connect(st.gw.addr, &st.token);
    let mut times = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let (code, v) = split.post_split("/v1/rpc/agent.list", "{}");
        times.push(t.elapsed());
        assert_eq!(code, 200, "{v}");
    }
    let p50 = percentile(&mut times, 50);
    println!("head and body in two writes: p50 {p50:?}");
    assert!(
        p50 < Duration::from_millis(20),
        "p50 {p50:?} with the body sent apart"
    );
    // The same, each action at its own path.
    let (code, v) = one.post(
        "/v1/rpc/checkpoint.list",
        r#"{"agent_id":"a","session_id":"s"}"#,
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["result"]["checkpoints"].as_array().unwrap().len(), 10);
    let (code, v) = one.post("/v1/rpc/agent.nothing", "{}");
    assert_eq!(
        (code, &v["error"]["code"]),
        (400, &json!("invalid_request"))
    );
}

#[test]
fn http2_and_http1_are_served_on_one_port() {
    let Some(st) = setup("h2c") else {
        return;
    };
    for (flag, want) in [("--http2-prior-knowledge", "2"), ("--http1.1", "1.1")] {
        let out = st
            .curl(
                "agent.list",
                &json!({}),
                &[flag, "-w", "\n%{http_version} %{http_code}"],
            )
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let (body, version) = text.rsplit_once('\n').unwrap();
        assert_eq!(version, format!("{want} 200"), "{flag}: {text}");
        let v: Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["result"]["agents"][0]["agent_id"], "a", "{v}");
    }
    // The token is checked over HTTP/2 as well; the refusal reaches a
    // client still sending its body (its stream is not reset under it).
    for _ in 0..20 {
        let out = Command::new("curl")
            .args(["-sS", "--http2-prior-knowledge", "-o", "/dev/null"])
            .args(["-w", "%{http_code}", "-H", "Content-Type: application/json"])
            .args(["-d", "{}"])
            .arg(st.url("agent.list"))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "401",
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn a_streamed_run_comes_in_order_before_it_ends_and_ends_with_its_answer() {
    let Some(st) = setup("stream_run") else {
        return;
    };
    // The run prints, then waits for a file only the test makes after it
    // read that first chunk: the chunk came before the run ended.
    let script = "echo first; while [ ! -e go ]; do sleep 0.05; done; \
                  for i in $(seq 500); do echo out $i; echo err $i >&2; done; exit 3";
    let mut s = st.stream("process.start", &sh(script), &[]);
    let started = s.next().unwrap();
    let run = started["event"]["started"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let first = s.next().unwrap();
    assert_eq!(first["event"]["output"]["stream"], "stdout", "{first}");
    assert_eq!(
        base64_decode(first["event"]["output"]["data"].as_str().unwrap()),
        b"first\n"
    );
    assert_eq!(
        live_runs(&st.d),
        std::slice::from_ref(&run),
        "the run ended before its first chunk came"
    );
    call(
        &st.d,
        Request::FsWrite(FsWrite::whole("a", "s", "go", Vec::<u8>::new())),
    )
    .unwrap();
    let (out, err, last, _) = drain(&mut s);
    let want = |k: &str| -> Vec<u8> {
        (1..=500)
            .flat_map(|i| format!("{k} {i}\n").into_bytes())
            .collect()
    };
    assert_eq!(out, want("out"));
    assert_eq!(err, want("err"));
    assert_eq!(last["result"]["exit_code"], 3, "{last}");
    assert_eq!(last["result"]["run_id"], run.as_str());

    // The binary protocol sends the same: per stream the same bytes, and
    // the same answer.
    let mut c = st.d.daemon.client();
    let (mut bout, mut berr) = (Vec::new(), Vec::new());
    let mut p = allox_integration::process_start(
        "a",
        "s",
        &[
            "/bin/sh",
            "-c",
            "rm go; echo first; for i in $(seq 500); do echo out $i; echo err $i >&2; done; exit 3",
        ],
    );
    p.stream = true;
    let answer = c
        .call_with_events(Request::ProcessStart(p), |e| {
            if let Event::Output(o) = e {
                match o.stream {
                    StreamKind::Stdout => bout.extend(o.data.0),
                    StreamKind::Stderr => berr.extend(o.data.0),
                }
            }
        })
        .unwrap()
        .unwrap();
    let Response::Exited(r) = answer else {
        panic!("{answer:?}")
    };
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(bout, [b"first\n".to_vec(), want("out")].concat());
    assert_eq!(berr, want("err"));

    // An error ends a stream as its last line (here the only one).
    let mut s = st.stream(
        "process.start",
        &json!({"agent_id": "a", "session_id": "nope", "argv": ["true"], "wait": true, "stream": true}),
        &[],
    );
    let (_, _, last, events) = drain(&mut s);
    assert_eq!(
        (events, &last["error"]["code"]),
        (0, &json!("not_found")),
        "{last}"
    );
}

#[test]
fn a_hundred_megabytes_stream_through_with_bounded_gateway_memory() {
    let Some(st) = setup("stream_100mb") else {
        return;
    };
    let hwm = |gw: &Gateway| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", gw.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    };
    // Warm: the first stream's buffers.
    let mut s = st.stream("process.start", &sh("head -c 1000000 /dev/zero"), &[]);
    drain(&mut s);
    let before = hwm(&st.gw);
    let t = Instant::now();
    let mut s = st.stream("process.start", &sh("head -c 100000000 /dev/zero"), &[]);
    let (out, err, last, events) = drain(&mut s);
    let took = t.elapsed();
    assert_eq!(out.len(), 100_000_000);
    assert!(out.iter().all(|&b| b == 0) && err.is_empty());
    assert_eq!(last["result"]["exit_code"], 0, "{last}");
    let after = hwm(&st.gw);
    println!(
        "100 MB in {events} events in {took:?}; gateway peak RSS {before} kB before, {after} kB after"
    );
    assert!(
        after < before + 64 * 1024,
        "the gateway's peak memory grew from {before} kB to {after} kB"
    );
}

#[test]
fn a_gateway_that_dies_takes_only_the_runs_that_asked_to_die_with_their_client() {
    let Some(mut st) = setup("gateway_dies") else {
        return;
    };
    let started = |s: &mut Stream| {
        let run = s.next().unwrap()["event"]["started"]["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
        s.next().unwrap();
        run
    };
    let mut kept = st.stream("process.start", &sh("echo up; exec sleep 600"), &[]);
    let kept_run = started(&mut kept);
    let mut doomed = st.stream(
        "process.start",
        &sh("echo up; exec sleep 601"),
        &["-H", "Allox-On-Disconnect: kill"],
    );
    let doomed_run = started(&mut doomed);
    // The gateway goes at once, with no chance to send a kill of its own.
    st.gw.child.kill().unwrap();
    st.gw.child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while live_runs(&st.d).contains(&doomed_run) {
        assert!(
            Instant::now() < deadline,
            "the run outlived the gateway its client came through"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        live_runs(&st.d).contains(&kept_run),
        "the run that asked to be kept was killed"
    );
    kept.cut();
    doomed.cut();
}

#[test]
fn a_client_that_goes_cancels_only_what_it_owned() {
    let Some(st) = setup("disconnect") else {
        return;
    };
    // Kept: the run is the session's.
    let mut s = st.stream("process.start", &sh("echo up; exec sleep 600"), &[]);
    let run = s.next().unwrap()["event"]["started"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    s.next().unwrap();
    s.cut();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        live_runs(&st.d).contains(&run),
        "the run died with its client"
    );

    // Asked for: killed when the client goes.
    let mut s = st.stream(
        "process.start",
        &sh("echo up; exec sleep 600"),
        &["-H", "Allox-On-Disconnect: kill"],
    );
    let doomed = s.next().unwrap()["event"]["started"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    s.next().unwrap();
    s.cut();
    let deadline = Instant::now() + Duration::from_secs(10);
    while live_runs(&st.d).contains(&doomed) {
        assert!(Instant::now() < deadline, "the run outlived its client");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(live_runs(&st.d).contains(&run), "the other run was touched");
    let (code, body) = {
        let out = st
            .curl(
                "process.start",
                &sh("true"),
                &[
                    "-H",
                    "Allox-On-Disconnect: maybe",
                    "-H",
                    "Accept: application/x-ndjson",
                    "-w",
                    "\n%{http_code}",
                ],
            )
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (b, c) = text.rsplit_once('\n').unwrap();
        (c.to_owned(), b.to_owned())
    };
    assert_eq!(code, "400", "{body}");
    assert!(body.contains("neither keep nor kill"), "{body}");

    // Watches cut again and again: each one's daemon connection is closed,
    // and the gateway goes on serving.
    let baseline = gateway_sockets(&st.gw);
    for _ in 0..30 {
        let mut w = st.stream(
            "fs.watch",
            &json!({"agent_id": "a", "session_id": "s", "path": "."}),
            &[],
        );
        let ready = w.next().unwrap();
        assert_eq!(ready["event"]["fs"]["change"], "ready", "{ready}");
        w.cut();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while gateway_sockets(&st.gw) > baseline + 2 {
        assert!(
            Instant::now() < deadline,
            "the gateway holds {} sockets after 30 watches went (was {baseline})",
            gateway_sockets(&st.gw)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = st.curl("system.ping", &json!({}), &[]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"result\""));
    let _ = call(
        &st.d,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: None,
            signal: None,
        }),
    );
}

#[test]
fn the_openapi_document_is_served_and_names_every_action() {
    let Some(mut st) = setup("openapi") else {
        return;
    };
    // No token needed; the Host still is.
    let url = format!("http://{}/v1/openapi.json", st.gw.addr);
    let out = Command::new("curl")
        .args(["-sS", "-f", &url])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for action in Request::ACTIONS {
        assert!(
            doc["paths"].get(format!("/v1/rpc/{action}")).is_some(),
            "{action} is missing"
        );
    }
    let out = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            "Host: evil.test",
            &url,
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "403");

    // An orderly stop: SIGTERM, a plain exit, even with a watch still
    // streaming (it is cut after the drain).
    let mut watch = st.stream(
        "fs.watch",
        &json!({"agent_id": "a", "session_id": "s", "path": "."}),
        &[],
    );
    assert_eq!(watch.next().unwrap()["event"]["fs"]["change"], "ready");
    let pid = nix::unistd::Pid::from_raw(st.gw.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = st.gw.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the gateway did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    drop(watch);
}

/// `/healthz` and `/readyz` as a Kubernetes probe fetches them (curl, no
/// token): ready while the daemon answers and its store takes changes;
/// not ready (503, saying which) on a store that opened degraded (its
/// index unreadable), ready again after a restart on the healthy store,
/// and not ready while the daemon is down; `/healthz` 200 throughout.
#[test]
fn readyz_follows_the_daemon_and_its_store_and_healthz_stays_up() {
    let Some(mut st) = setup("readyz") else {
        return;
    };
    let addr = st.gw.addr;
    let probe = |path: &str| -> (u16, Value) {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
            .arg(format!("http://{addr}{path}"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').expect("a status line");
        (
            code.parse().unwrap(),
            serde_json::from_str(body).unwrap_or_else(|e| panic!("{path}: {e}: {body}")),
        )
    };
    assert_eq!(probe("/healthz"), (200, json!({"status": "ok"})));
    assert_eq!(probe("/readyz"), (200, json!({"ready": true})));

    // The daemon restarted on a store whose index cannot be opened: it
    // serves, read-only; the gateway is not ready.
    let index = st.d.daemon.root.join("state/index.redb");
    let kept = st.d.daemon.root.join("state/index.redb.kept");
    std::fs::rename(&index, &kept).unwrap();
    std::fs::write(&index, b"not an index").unwrap();
    st.d.restart(&[]);
    assert_eq!(
        probe("/readyz"),
        (
            503,
            json!({"ready": false, "why": "the store refuses changes"})
        )
    );
    assert_eq!(probe("/healthz").0, 200);
    match call(&st.d, Request::SystemInfo(SystemInfoRequest {})) {
        Ok(Response::System(i)) => {
            let why = i.store_read_only.unwrap_or_default();
            assert!(why.contains("index"), "{why}");
        }
        other => panic!("system.info: {other:?}"),
    }
    // The healthy store again.
    std::fs::rename(&kept, &index).unwrap();
    st.d.restart(&[]);
    assert_eq!(probe("/readyz"), (200, json!({"ready": true})));
    // The daemon down.
    st.d.daemon.terminate();
    assert_eq!(
        probe("/readyz"),
        (
            503,
            json!({"ready": false, "why": "the daemon cannot be reached"})
        )
    );
    assert_eq!(probe("/healthz").0, 200);
}

/// Every line of a JSON log, parsed; what is wrong with one, if anything.
fn json_lines(log: &str, what: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {l}"));
            for k in ["timestamp", "level", "target", "message"] {
                assert!(v.get(k).is_some(), "{what}: no {k} in {l}");
            }
            v
        })
        .collect()
}

/// `--log-format json` on the supervisor and on the gateway: every line
/// one JSON object with time, level, target and message; the supervisor's
/// request lines carry the action, agent and session (and a run's id), the
/// gateway's each call's action and status; after a workload that used the
/// token, wrote a file through the gateway and ran a program that printed
/// a secret, neither log holds the token, the file's content or the
/// program's output.
#[test]
fn json_logs_parse_line_by_line_and_carry_the_request_never_its_content() {
    if !require("http::json_logs") {
        return;
    }
    let fs = allox_integration::BtrfsFs::new(512).expect("btrfs");
    let root = fs.path().join("store");
    std::fs::create_dir(&root).unwrap();
    let sock = fs.scratch().join("ctl.sock");
    let log_path = fs.scratch().join("supervisor.log");
    let d = allox_integration::Daemon::start_logging(
        &root,
        &sock,
        &[("ALLOX_LOG", "info")],
        &["--log-format", "json"],
        Some(std::fs::File::create(&log_path).unwrap()),
    );
    let gw = Gateway::start(&sock, &["--log-format", "json"]);
    let token = gateway_token(&sock);
    let base = format!("http://{}", gw.addr);
    let post = |action: &str, params: Value| -> Value {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "60"])
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .args(["-H", "Content-Type: application/json"])
            .args(["--data-binary", &params.to_string()])
            .arg(format!("{base}/v1/rpc/{action}"))
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    post("agent.create", json!({"agent_id": "a"}));
    post(
        "session.create",
        json!({"agent_id": "a", "session_id": "s"}),
    );
    let ran = post(
        "process.start",
        json!({"agent_id": "a", "session_id": "s", "wait": true,
               "argv": ["/bin/sh", "-c", "echo OUTPUT-SECRET-1234; echo CONTENT-SECRET-5678 > made.txt"]}),
    );
    let run_id = ran["result"]["run_id"].as_str().expect("a run").to_string();
    let put = Command::new("curl")
        .args([
            "-sS",
            "-f",
            "-X",
            "PUT",
            "--data-binary",
            "UPLOAD-SECRET-9012",
        ])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .arg(format!("{base}/v1/files/a/s/up.txt"))
        .output()
        .unwrap();
    assert!(put.status.success(), "{put:?}");
    post(
        "session.delete",
        json!({"agent_id": "a", "session_id": "nosuch"}),
    );
    // Its last line comes a moment after the answer.
    let gw_log = gw.log_once(
        |l| l.contains(r#""action":"session.delete""#),
        Duration::from_secs(10),
    );
    drop(gw);
    drop(d);
    let sup_log = std::fs::read_to_string(&log_path).unwrap();

    let sup = json_lines(&sup_log, "supervisor");
    let answered: Vec<&Value> = sup
        .iter()
        .filter(|v| v["message"] == "request answered")
        .collect();
    let of = |action: &str| {
        answered
            .iter()
            .find(|v| v["span"]["action"] == action)
            .copied()
    };
    let created =
        of("session.create").unwrap_or_else(|| panic!("no session.create line: {sup_log}"));
    assert_eq!(
        (&created["span"]["agent"], &created["span"]["session"]),
        (&json!("a"), &json!("s"))
    );
    assert_eq!(created["outcome"], "ok");
    let started = of("process.start").expect("a process.start line");
    assert_eq!(started["run_id"], json!(run_id));
    let refused = of("session.delete").expect("a session.delete line");
    assert_eq!(refused["outcome"], "not_found");
    assert_eq!(of("fs.write").expect("the upload")["span"]["session"], "s");

    let gws = json_lines(&gw_log, "gateway");
    assert!(
        gws.iter()
            .any(|v| v["action"] == "agent.create" && v["status"] == 200),
        "{gw_log}"
    );
    assert!(
        gws.iter()
            .any(|v| v["action"] == "session.delete" && v["status"] == 404),
        "{gw_log}"
    );
    assert!(
        gws.iter()
            .any(|v| v["message"] == "files request answered" && v["session"] == "s"),
        "{gw_log}"
    );
    for (name, log) in [("supervisor", &sup_log), ("gateway", &gw_log)] {
        for secret in [
            token.as_str(),
            "OUTPUT-SECRET-1234",
            "CONTENT-SECRET-5678",
            "UPLOAD-SECRET-9012",
        ] {
            assert!(!log.contains(secret), "the {name} log holds {secret:?}");
        }
    }
}

/// SIGTERM at any moment of the gateway's start, or SIGTERM or SIGINT the
/// moment it has said where it listens, stops it: never a gateway that
/// runs on. (Its listeners were made after its port was bound, in two
/// steps, and a signal between the two was lost: see docs/http.md.)
#[test]
fn a_stop_signal_at_any_moment_of_the_gateways_start_stops_it() {
    if !require("http::a_stop_signal_at_any_moment_of_the_gateways_start_stops_it") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // No daemon: the gateway starts without one (and says so on requests).
    let sock = dir.path().join("ctl.sock");
    for i in 0..20u32 {
        let mut child = Command::new(allox_integration::workspace_bin("alloxctl"))
            .arg("--socket")
            .arg(&sock)
            .args(["gateway", "--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut said = BufReader::new(child.stderr.take().unwrap());
        if i % 2 == 0 {
            // From at once to 10 ms into the start.
            std::thread::sleep(Duration::from_micros(u64::from(i) * 1000));
        } else {
            let mut line = String::new();
            said.read_line(&mut line).unwrap();
            assert!(line.contains("POST http://127.0.0.1:"), "{line}");
        }
        // SIGINT only once it has said it listens (see `stop_signal_for`).
        let signal = allox_integration::stop_signal_for(i);
        allox_integration::signal_stops(&mut child, signal, &format!("gateway {i}"));
    }
}
