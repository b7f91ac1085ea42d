//! The in-sandbox interface through the real daemon and real sandboxes: the
//! `allox` client inside a run, the Python entry points, a hostile raw
//! client, and what 1,000 runs leave behind.

use allox_integration::sandbox_api_raw::{
    frames, raw_exchange, sandbox_error, sandbox_frame, sandbox_request,
};
use allox_integration::{
    call, make_sessions, process_start as start, require, workspace_bin, ProcDaemon,
};
use allox_protocol::sandbox_api::*;
use allox_protocol::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn setup(name: &str) -> Option<ProcDaemon> {
    if !require(&format!("guest::{name}")) {
        return None;
    }
    if allox_integration::cgroup2_mount().is_none() {
        panic!("guest::{name} needs a cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified)");
    }
    let d = ProcDaemon::start(name, &[]);
    make_sessions(&d, &[("a", "s"), ("a", "t"), ("b", "s")]);
    Some(d)
}

fn run(d: &ProcDaemon, p: ProcessStart) -> RunResult {
    match call(d, Request::ProcessStart(p.clone())) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{:?}: {other:?}", p.argv),
    }
}

/// Runs `sh -c script` in a/s and waits.
fn sh(d: &ProcDaemon, a: &str, s: &str, script: &str) -> RunResult {
    run(d, start(a, s, &["/bin/sh", "-c", script]))
}

fn guest_dir(d: &ProcDaemon) -> PathBuf {
    allox_supervisor::sandbox_api::dir_for(&d.daemon.socket)
}

fn turn_begin(d: &ProcDaemon, a: &str, s: &str) -> Result<TurnInfo, ErrorBody> {
    call(
        d,
        Request::TurnBegin(TurnBegin {
            agent_id: a.into(),
            session_id: s.into(),
            turn_id: None,
        }),
    )
    .map(|r| match r {
        Response::Turn(t) => t,
        other => panic!("{other:?}"),
    })
}

fn audit(d: &ProcDaemon) -> Vec<AuditRecord> {
    match call(
        d,
        Request::AuditList(AuditList {
            after_seq: None,
            limit: Some(10_000),
            before_seq: None,
        }),
    ) {
        Ok(Response::Audit(l)) => l.records,
        other => panic!("{other:?}"),
    }
}

fn ok(r: &RunResult) {
    assert_eq!(r.exit_code, Some(0), "{r:?}");
}

#[test]
fn allox_whoami_prints_the_runs_identity() {
    let Some(d) = setup("allox_whoami_prints_the_runs_identity") else {
        return;
    };
    let r = sh(&d, "a", "s", "allox whoami && allox whoami --json");
    ok(&r);
    let mut lines = r.stdout.lines();
    let human: Vec<_> = lines.by_ref().take(3).collect();
    assert_eq!(
        human,
        [
            "agent   a".to_string(),
            "session s".to_string(),
            format!("run     {}", r.run_id)
        ]
    );
    let json: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"agent_id": "a", "session_id": "s", "run_id": r.run_id})
    );
    // Found on PATH by process.start itself, in another session.
    let r = run(&d, start("b", "s", &["allox", "whoami", "--json"]));
    ok(&r);
    let json: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(json["agent_id"], "b");
    assert_eq!(json["run_id"], r.run_id.as_str());
    // An error: exit status 1, its message on stderr.
    let r = sh(&d, "a", "s", "allox turn end");
    assert_eq!(r.exit_code, Some(1), "{r:?}");
    assert!(
        r.stderr
            .starts_with("allox: conflict: session a/s has no turn"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_script_ends_its_own_turn_and_the_host_sees_it() {
    let Some(d) = setup("a_script_ends_its_own_turn_and_the_host_sees_it") else {
        return;
    };
    let mut auto = SessionCreate::new("a", "auto");
    auto.auto_checkpoint = Some(true);
    call(&d, Request::SessionCreate(auto)).unwrap();
    let r = sh(
        &d,
        "a",
        "auto",
        "set -e; allox turn begin; echo work > result.txt; allox turn end --status ok --label 'did the work'",
    );
    ok(&r);
    assert_eq!(
        r.stdout,
        "turn turn-1 began (number 1 of session a/auto)\nturn turn-1 ended ok; checkpoint turn-1\n"
    );
    // The host sees the turn ended, with its automatic checkpoint.
    let Ok(Response::Checkpoints(l)) = call(
        &d,
        Request::CheckpointList(SessionRef {
            agent_id: "a".into(),
            session_id: "auto".into(),
        }),
    ) else {
        panic!("checkpoint.list")
    };
    let turn = l
        .checkpoints
        .iter()
        .find(|c| c.origin == Origin::Turn)
        .unwrap_or_else(|| panic!("no turn checkpoint: {l:?}"));
    assert_eq!(turn.turn_id.as_deref(), Some("turn-1"));
    assert_eq!(turn.label.as_deref(), Some("did the work"));
    assert_eq!(l.head.as_deref(), Some("turn-1"));
    // The turn is over: the next one is the session's second.
    assert_eq!(turn_begin(&d, "a", "auto").unwrap().number, 2);
    // Audited as the host's turn actions, with the run as the peer.
    let peer = format!("guest a/auto/{}", r.run_id);
    let recs = audit(&d);
    for action in ["turn.begin", "turn.end"] {
        assert!(
            recs.iter()
                .any(|x| x.peer == peer && x.action == action && x.outcome == "ok"),
            "{action} by {peer} not audited: {recs:?}"
        );
    }
}

#[test]
fn a_run_cannot_act_on_another_session_through_the_guest_socket() {
    let Some(d) = setup("a_run_cannot_act_on_another_session_through_the_guest_socket") else {
        return;
    };
    if allox_integration::which("python3").is_none() {
        panic!("guest::a_run_cannot_act_on_another_session_through_the_guest_socket needs python3");
    }
    // Another session of the same agent has an open turn, turn-1.
    let theirs = turn_begin(&d, "a", "t").unwrap();
    assert_eq!(theirs.turn_id, "turn-1");
    let audited_before = audit(&d).len();

    // Through the client: no argument names another session.
    let r = sh(&d, "a", "s", "allox turn end --turn-id turn-1");
    assert_eq!(r.exit_code, Some(1), "{r:?}");
    assert!(
        r.stderr.contains("not_found: turn a/s/turn-1"),
        "{}",
        r.stderr
    );
    for forged in [
        "allox turn begin --session t",
        "allox turn end --agent b --session s",
        "allox whoami --run x",
    ] {
        let r = sh(&d, "a", "s", forged);
        assert_eq!(r.exit_code, Some(2), "{forged}: {r:?}");
    }
    let r = sh(
        &d,
        "a",
        "s",
        r#"allox call session.delete '{"agent_id":"a","session_id":"t"}'"#,
    );
    assert_eq!(r.exit_code, Some(1), "{r:?}");
    assert!(
        r.stderr
            .contains("not_found: no plugin owns route \"session.delete\""),
        "{}",
        r.stderr
    );

    // A raw client: host frames, forged bytes.
    let hello = sandbox_frame(&SandboxClientFrame::Hello(SandboxHello::new()));
    let host_hello = encode(&ClientFrame::Hello(Hello::new(1))).unwrap();
    let host = |request| {
        encode(&ClientFrame::Request(RequestEnvelope {
            conversation: 1,
            request_id: 5,
            request,
        }))
        .unwrap()
    };
    let host_turn_end = host(Request::TurnEnd(TurnEnd {
        agent_id: "a".into(),
        session_id: "t".into(),
        turn_id: "turn-1".into(),
        status: TurnStatus::Ok,
        label: None,
    }));
    let host_delete = host(Request::SessionDelete(SessionDelete {
        agent_id: "b".into(),
        session_id: "s".into(),
        force: true,
    }));
    // A guest turn.end whose payload carries another identity after it.
    let mut forged = postcard::to_stdvec(&SandboxClientFrame::Request(SandboxRequestEnvelope {
        request_id: 7,
        request: SandboxRequest::TurnEnd(SandboxTurnEnd {
            turn_id: Some("turn-1".into()),
            status: TurnStatus::Ok,
            label: None,
        }),
    }))
    .unwrap();
    forged.extend(postcard::to_stdvec(&("a", "t")).unwrap());
    let forged = allox_protocol::frame::frame(&forged).unwrap();
    let whoami = sandbox_request(8, SandboxRequest::Whoami(Whoami {}));
    let cat = |parts: &[&[u8]]| parts.concat();
    let got = raw_exchange(
        &d,
        "a",
        "s",
        &[
            (host_hello, 1),
            (cat(&[&hello, &host_turn_end]), 2),
            (host_delete, 1),
            (cat(&[&hello, &forged]), 2),
            (cat(&[&host_turn_end, &hello, &whoami]), 3),
        ],
    );
    assert_eq!(got.len(), 5, "{got:?}");
    // A host Hello: refused, unsupported, in the host's framing.
    let f = frames(&got[0]);
    assert!(
        matches!(decode::<ServerFrame>(&f[0]).unwrap(), ServerFrame::Refused(e) if e.code == ErrorCode::Unsupported),
        "{f:?}"
    );
    // Host turn.end naming the other session, and a host session.delete:
    // unsupported, naming the action.
    for (bytes, action) in [(&got[1], "turn.end"), (&got[2], "session.delete")] {
        let f = frames(bytes);
        let ServerFrame::Response(r) = decode::<ServerFrame>(f.last().unwrap()).unwrap() else {
            panic!("{f:?}")
        };
        assert_eq!(r.request_id, 5);
        let Outcome::Err(e) = r.outcome else {
            panic!("{action} went through")
        };
        assert_eq!(e.code, ErrorCode::Unsupported, "{e:?}");
        assert!(
            e.message.starts_with(&format!("{action} is a host action")),
            "{}",
            e.message
        );
    }
    // Extra bytes carrying another identity: the frame is refused whole.
    let e = sandbox_error(&frames(&got[3])[1]);
    assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
    // After all that, the connection still is the run's own.
    let f = frames(&got[4]);
    match decode::<SandboxServerFrame>(&f[2]).unwrap() {
        SandboxServerFrame::Response(SandboxResponseEnvelope {
            request_id: 8,
            outcome: SandboxOutcome::Ok(SandboxResponse::Identity(i)),
        }) => assert_eq!((i.agent_id.as_str(), i.session_id.as_str()), ("a", "s")),
        other => panic!("{other:?}"),
    }

    // Nothing happened to the other sessions: a/t's turn is still open,
    // b/s still exists, and no turn action was recorded against them.
    let Ok(Response::Turn(t)) = call(
        &d,
        Request::TurnEnd(TurnEnd {
            agent_id: "a".into(),
            session_id: "t".into(),
            turn_id: "turn-1".into(),
            status: TurnStatus::Cancelled,
            label: None,
        }),
    ) else {
        panic!("a/t's turn was ended from a/s")
    };
    assert_eq!(t.status, Some(TurnStatus::Cancelled));
    assert!(matches!(
        call(
            &d,
            Request::CheckpointList(SessionRef {
                agent_id: "b".into(),
                session_id: "s".into()
            })
        ),
        Ok(Response::Checkpoints(_))
    ));
    let recs = audit(&d);
    for r in &recs[audited_before..] {
        if r.peer.starts_with("guest ") {
            assert!(r.target.starts_with("a/s"), "{r:?}");
        }
    }
}

#[test]
fn the_python_entry_points_work() {
    let Some(d) = setup("the_python_entry_points_work") else {
        return;
    };
    if allox_integration::which("python3").is_none() {
        panic!("guest::the_python_entry_points_work needs python3");
    }
    let r = sh(
        &d,
        "a",
        "s",
        "set -e; python3 /run/allox/whoami.py --json; python3 /run/allox/turn.py begin --turn-id t1; \
         python3 /run/allox/turn.py end --status failed",
    );
    ok(&r);
    let mut lines = r.stdout.lines();
    let who: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(who["run_id"], r.run_id.as_str());
    assert_eq!(
        lines.collect::<Vec<_>>(),
        [
            "turn t1 began (number 1 of session a/s)",
            "turn t1 ended failed"
        ]
    );
    assert_eq!(turn_begin(&d, "a", "s").unwrap().number, 2);
}

#[test]
fn host_users_cannot_reach_a_runs_guest_socket() {
    let Some(d) = setup("host_users_cannot_reach_a_runs_guest_socket") else {
        return;
    };
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    let dir = guest_dir(&d);
    let md = std::fs::metadata(&dir).unwrap();
    assert_eq!((md.mode() & 0o777, md.uid()), (0o700, 0));
    let mut p = start("a", "s", &["sleep", "60"]);
    p.wait = false;
    let Ok(Response::Started(started)) = call(&d, Request::ProcessStart(p)) else {
        panic!("start")
    };
    let sock = dir.join(&started.run_id).join("sock");
    assert!(
        sock.exists(),
        "no listener for a live run at {}",
        sock.display()
    );
    // Entered, not listed, by the sandbox's user.
    let run_dir = std::fs::metadata(dir.join(&started.run_id)).unwrap();
    assert_eq!(run_dir.mode() & 0o777, 0o711);
    let client = |uid: Option<u32>| {
        let mut c = std::process::Command::new(workspace_bin("allox-init"));
        c.arg0("allox")
            .args(["whoami", "--json"])
            .env("ALLOX_GUEST_SOCKET", &sock);
        if let Some(uid) = uid {
            c.uid(uid).gid(uid);
        }
        c.output().unwrap()
    };
    // The sandbox's uid on the host: the directory keeps it out.
    let out = client(Some(10_000));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{out:?}"
    );
    // Root on the host passes the directory, and is refused by the
    // listener: it is no process of the run.
    let out = client(None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let refused = refusal(&sock, None);
    assert!(
        refused.contains("pid ") && refused.contains("(uid 0)"),
        "{refused}"
    );
    // The sandbox's uid reaches the socket through a process of the run,
    // /proc/<pid>/root (the run's programs are its own and dumpable): the
    // listener refuses it, naming it.
    let pid = sandbox_user_process(&d, "a", "s", &started.run_id);
    let through_proc = PathBuf::from(format!("/proc/{pid}/root/run/allox/guest/sock"));
    let refused = refusal(&through_proc, Some(10_000));
    assert!(
        refused.contains("(uid 10000) is not a process of run")
            && refused.contains(&started.run_id),
        "{refused}"
    );
    let mut c = std::process::Command::new(workspace_bin("allox-init"));
    c.arg0("allox")
        .args(["whoami", "--json"])
        .env("ALLOX_GUEST_SOCKET", &through_proc)
        .uid(10_000)
        .gid(10_000);
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    // Inside, the run's own programs are answered.
    let r = sh(&d, "a", "s", "allox whoami --json");
    ok(&r);
    assert!(r.stdout.contains("\"agent_id\":\"a\""), "{r:?}");
    let _ = call(
        &d,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: Some(started.run_id.clone()),
            signal: None,
        }),
    );
    wait_until("the killed run's listener to go", || !sock.exists());
}

/// A process of run `run` of a/s running as the sandbox's user (not the
/// sandbox's init, which is root's).
fn sandbox_user_process(d: &ProcDaemon, a: &str, s: &str, run: &str) -> i32 {
    let procs = d
        .cgroup
        .join(format!("allox/{a}/{s}/run-{run}/cgroup.procs"));
    let mut found = None;
    wait_until("a process of the run as the sandbox's user", || {
        let text = std::fs::read_to_string(&procs).unwrap_or_default();
        found = text
            .lines()
            .filter_map(|l| l.parse::<i32>().ok())
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .unwrap_or_default()
                    .lines()
                    .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("10000"))
            });
        found.is_some()
    });
    found.unwrap()
}

/// Connects to `sock` (as `uid`, through setpriv and python3, or as this
/// process), sends nothing, and returns the message of the `Refused` frame
/// the listener answers with before closing.
fn refusal(sock: &std::path::Path, uid: Option<u32>) -> String {
    let bytes = match uid {
        None => {
            use std::io::Read;
            let mut c = std::os::unix::net::UnixStream::connect(sock).unwrap();
            let mut b = Vec::new();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.read_to_end(&mut b).unwrap();
            b
        }
        Some(uid) => {
            let out = std::process::Command::new("setpriv")
                .arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .arg("--clear-groups")
                .args(["/usr/bin/python3", "-c"])
                .arg(
                    "import socket, sys\n\
                     s = socket.socket(socket.AF_UNIX)\n\
                     s.settimeout(10)\n\
                     s.connect(sys.argv[1])\n\
                     b = b''\n\
                     while True:\n\
                     \x20   c = s.recv(65536)\n\
                     \x20   if not c: break\n\
                     \x20   b += c\n\
                     sys.stdout.buffer.write(b)\n",
                )
                .arg(sock)
                .output()
                .expect("setpriv (util-linux) and /usr/bin/python3 are needed");
            assert!(out.status.success(), "{out:?}");
            out.stdout
        }
    };
    let f = frames(&bytes);
    match f.as_slice() {
        [one] => match decode::<SandboxServerFrame>(one) {
            Ok(SandboxServerFrame::Refused(e)) => {
                assert_eq!(e.code, ErrorCode::Unauthorized, "{e:?}");
                e.message
            }
            other => panic!("not refused: {other:?}"),
        },
        other => panic!("not one frame: {other:?}"),
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sockets among a process's descriptors.
fn socket_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .map(|l| l.to_string_lossy().starts_with("socket:"))
                .unwrap_or(false)
        })
        .count()
}

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_thousand_runs_leave_no_listeners_behind() {
    let Some(d) = setup("a_thousand_runs_leave_no_listeners_behind") else {
        return;
    };
    let pid = d.daemon.child.id();
    let dir = guest_dir(&d);
    // A first run in each session: its context (one control socket in the
    // supervisor, kept as long as the session) is part of the baseline.
    for (a, sess) in [("a", "s"), ("a", "t"), ("b", "s")] {
        ok(&run(&d, start(a, sess, &["true"])));
    }
    wait_until("the first runs' listeners to go", || {
        entries(&dir) == ["turn.py", "whoami.py"]
    });
    let before = socket_fds(pid);
    let sessions = [("a", "s"), ("a", "t"), ("b", "s"), ("a", "s")];
    std::thread::scope(|s| {
        for (a, sess) in sessions {
            let d = &d;
            s.spawn(move || {
                for i in 0..250 {
                    // Some use the interface, most do not.
                    let r = if i % 10 == 0 {
                        sh(d, a, sess, "allox whoami >/dev/null")
                    } else {
                        run(d, start(a, sess, &["true"]))
                    };
                    ok(&r);
                }
            });
        }
    });
    // The last runs' sandboxes are reaped just after their answers.
    let t0 = Instant::now();
    loop {
        let (files, sockets) = (entries(&dir), socket_fds(pid));
        if files == ["turn.py", "whoami.py"] && sockets <= before {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "after 1,000 runs: {} files in {} ({files:?}), {sockets} sockets in the supervisor (before: {before})",
            files.len(),
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_run_left_by_a_stopped_daemon_reaches_its_guest_interface_through_the_next() {
    let Some(mut d) = setup("a_run_left_by_a_stopped_daemon_reaches_its_guest_interface") else {
        return;
    };
    let dir = guest_dir(&d);
    let session = d.daemon.root.join("agents/a/workspace/sessions/s/current");
    turn_begin(&d, "a", "s").unwrap();
    // Asks once before the restart, then waits for the go-ahead and asks
    // again: who it is, and to end its session's turn.
    let mut p = start(
        "a",
        "s",
        &[
            "/bin/sh",
            "-c",
            "allox whoami > before.txt 2>&1; touch asked; \
             while [ ! -e go ]; do sleep 0.05; done; \
             allox whoami > after.txt 2>&1; allox turn end --label after-restart > end.txt 2>&1",
        ],
    );
    p.wait = false;
    let Ok(Response::Started(started)) = call(&d, Request::ProcessStart(p)) else {
        panic!("start")
    };
    wait_until("the first question", || session.join("asked").exists());
    let before = std::fs::read_to_string(session.join("before.txt")).unwrap();
    assert!(before.contains(&started.run_id), "{before}");
    d.restart(&[]);
    // The run's directory is still there, served by the new daemon.
    assert!(
        dir.join(&started.run_id).join("sock").exists(),
        "no socket for the adopted run: {:?}",
        entries(&dir)
    );
    std::fs::write(session.join("go"), "").unwrap();
    wait_until("the run to end its turn", || {
        session.join("end.txt").exists()
    });
    wait_until("the run to finish writing", || {
        std::fs::read_to_string(session.join("end.txt")).is_ok_and(|s| !s.is_empty())
    });
    let after = std::fs::read_to_string(session.join("after.txt")).unwrap();
    assert!(after.contains(&started.run_id), "{after}");
    let end = std::fs::read_to_string(session.join("end.txt")).unwrap();
    assert!(end.contains("ended ok"), "{end}");
    // Once the adopted run is gone, so is its directory.
    wait_until("the adopted run's directory to go", || {
        entries(&dir) == ["turn.py", "whoami.py"]
    });
}
