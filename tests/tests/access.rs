//! Who may drive the supervisor from the host: the control socket's mode
//! and peer check, and the HTTP gateway's token, Host, Origin, content type,
//! listen address and timeouts (docs/host-access.md), with the real daemon
//! and real curl.

use allox_integration::{gateway_token, require, workspace_bin, BtrfsFs, Daemon};
use allox_protocol::*;
use std::io::Read;
use std::process::Command;
use std::time::{Duration, Instant};

fn setup(name: &str, args: &[&str]) -> Option<(BtrfsFs, Daemon)> {
    Daemon::on_new_store(name, args)
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
        "access::gateway_serves_only_the_token_holder_from_here",
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
    let token = gateway_token(&d.socket);
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
    if !require("access::slow_daemon_calls_do_not_hold_every_gateway_worker") {
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
    let gw = allox_integration::Gateway::start(&socket, &["--daemon-timeout-ms", "500"]);
    let (url, auth) = (
        gw.url(),
        format!("Authorization: Bearer {}", gateway_token(&socket)),
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
    // The long calls are let go past the daemon timeout (a wait for a run
    // goes on as long as the run may: it was cut at the daemon timeout,
    // with no run id to wait on) and answered when their runs end.
    std::thread::sleep(Duration::from_millis(1200));
    assert!(waits.iter().all(|w| !w.is_finished()), "a wait was cut");
    c.call(Request::ProcessKill(ProcessKill {
        agent_id: "a".into(),
        session_id: "s".into(),
        run_id: None,
        signal: None,
    }))
    .unwrap()
    .unwrap();
    for w in waits {
        let (code, body) = w.join().unwrap();
        assert_eq!(code, "200", "{body}");
        assert_eq!(json(&body)["result"]["signal"], 9, "{body}");
    }
    for _ in 0..2 * allox_ctl::gateway::WORKERS {
        let (code, body) = call(&url, &auth, ping);
        assert_eq!(code, "200", "{body}");
    }
}

#[test]
fn control_socket_is_0600_from_the_moment_it_exists() {
    if !require("access::control_socket_is_0600_from_the_moment_it_exists") {
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
    // Nothing is left of the directory it was made in, once the daemon
    // serves (it is removed as the listener is handed over, a moment
    // after the rename: a look at once met it, under load).
    d.client().call(Request::Ping(Ping {})).unwrap().unwrap();
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["ctl.sock"]);
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
        "access::peers_not_allowed_are_refused_and_audited",
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
                before_seq: None,
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

/// `cmd ARGS` as `nobody` (uid and gid 65534, no supplementary groups),
/// through setpriv: its success and stderr.
fn as_nobody(cmd: &str, args: &[&std::path::Path]) -> (bool, String) {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", cmd])
        .args(args)
        .output()
        .expect("setpriv (util-linux) is needed");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn other_users_cannot_read_the_store() {
    let name = "access::other_users_cannot_read_the_store";
    if !require(name) {
        return;
    }
    assert!(
        allox_integration::cgroup2_mount().is_some(),
        "{name} needs a cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified)"
    );
    use std::os::unix::fs::PermissionsExt;
    let args = ["--plugin", "monitor", "--share-tools"];
    let mut d = allox_integration::ProcDaemon::start("other_users_cannot_read_the_store", &args);
    allox_integration::make_sessions(&d, &[("a", "s"), ("b", "s")]);
    // The store at an ordinary mount point: every directory above it
    // lets others through, the root too (it says so at start).
    std::fs::set_permissions(d.fs.scratch(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = d.daemon.root.clone();
    assert_eq!(mode(&root), 0o755);
    let run = |a: &str, script: &str| -> RunResult {
        let p = allox_integration::process_start(a, "s", &["/bin/sh", "-c", script]);
        match allox_integration::call(&d, Request::ProcessStart(p)) {
            Ok(Response::Exited(r)) => r,
            other => panic!("{script}: {other:?}"),
        }
    };
    // An agent's file, readable by all by its own mode.
    let r = run("a", "echo secret > private.txt && chmod 644 private.txt");
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let l = allox_store::layout::Layout::new(&root);
    let private = l.current("a", "s").join("private.txt");
    let records = l.state_dir().join("monitor/records.log");
    let audit = l.state_dir().join("audit.log");
    assert!(records.exists() && audit.exists());
    let check = |d: &allox_integration::ProcDaemon| {
        // The root is listed (so what refuses is below it) ...
        let (ok, err) = as_nobody("ls", &[&root]);
        assert!(ok, "{err}");
        // ... and nothing under it is read or listed.
        for (cmd, p) in [
            ("cat", &private),
            ("cat", &records),
            ("cat", &audit),
            ("ls", &l.state_dir()),
            ("ls", &l.agents_dir()),
            ("ls", &l.current("b", "s")),
        ] {
            let (ok, err) = as_nobody(cmd, &[p]);
            assert!(
                !ok && err.contains("Permission denied"),
                "nobody ran {cmd} {}: {err}",
                p.display()
            );
        }
        for dir in [
            l.agents_dir(),
            l.state_dir(),
            l.agent_dir("a"),
            l.workspace("a"),
            l.sessions_dir("a"),
            l.session_dir("a", "s"),
            l.checkpoints_dir("a", "s"),
            l.state_dir().join("monitor"),
        ] {
            assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        }
        for f in [&records, &audit, &l.state_dir().join("index.redb")] {
            assert_eq!(mode(f), 0o600, "{}", f.display());
        }
        // The agent's own modes stay.
        assert_eq!(mode(&private), 0o644);
        // The daemon works on: a sandbox reads the file, the files API
        // reads and writes, a checkpoint is taken.
        let p = allox_integration::process_start("a", "s", &["cat", "private.txt"]);
        match allox_integration::call(d, Request::ProcessStart(p)) {
            Ok(Response::Exited(r)) => assert_eq!(r.stdout, "secret\n", "{r:?}"),
            other => panic!("{other:?}"),
        }
        let read = FsRead {
            agent_id: "a".into(),
            session_id: "s".into(),
            scope: FsScope::Session,
            checkpoint_id: None,
            path: "private.txt".into(),
            offset: None,
            length: None,
        };
        match allox_integration::call(d, Request::FsRead(read)) {
            Ok(Response::FsData(f)) => assert_eq!(f.data.as_ref(), b"secret\n"),
            other => panic!("{other:?}"),
        }
        let w = allox_integration::call(
            d,
            Request::FsWrite(FsWrite::whole("a", "s", "new.txt", "n")),
        );
        assert!(w.is_ok(), "{w:?}");
    };
    check(&d);
    let ckpt = |d: &allox_integration::ProcDaemon, c: &str| {
        let r = allox_integration::call(
            d,
            Request::CheckpointCreate(CheckpointCreate {
                agent_id: "a".into(),
                session_id: "s".into(),
                checkpoint_id: c.into(),
                pinned: false,
                label: None,
            }),
        );
        assert!(r.is_ok(), "{r:?}");
    };
    ckpt(&d, "c1");
    // A store made before (or loosened by hand) is made private again at
    // the next start.
    for p in [l.agents_dir(), l.state_dir(), l.session_dir("a", "s")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for p in [&audit, &records] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    d.restart(&args);
    check(&d);
    ckpt(&d, "c2");
    let (ok, err) = as_nobody("ls", &[&l.checkpoint("a", "s", "c2")]);
    assert!(!ok && err.contains("Permission denied"), "{err}");
}
