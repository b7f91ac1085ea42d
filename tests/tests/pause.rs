//! `session.pause` and `session.resume` with real processes in real
//! cgroups: a paused session uses no CPU and writes nothing, the next
//! request that needs it resumes it, `hold` refuses instead, and no other
//! session is touched.

use allox_integration::{call, make_sessions, process_start, require, ProcDaemon};
use allox_protocol::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn setup(name: &str) -> Option<ProcDaemon> {
    if !require(&format!("pause::{name}")) {
        return None;
    }
    if allox_integration::cgroup2_mount().is_none() {
        panic!("pause::{name} needs a cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified)");
    }
    let d = ProcDaemon::start(name, &[]);
    make_sessions(&d, &[("a", "s"), ("a", "t")]);
    Some(d)
}

fn bg(d: &ProcDaemon, s: &str, script: &str) -> String {
    let mut p = process_start("a", s, &["/bin/sh", "-c", script]);
    p.wait = false;
    match call(d, Request::ProcessStart(p)) {
        Ok(Response::Started(r)) => r.run_id,
        other => panic!("{script}: {other:?}"),
    }
}

fn sh(d: &ProcDaemon, s: &str, script: &str) -> Result<RunResult, ErrorBody> {
    match call(
        d,
        Request::ProcessStart(process_start("a", s, &["/bin/sh", "-c", script])),
    ) {
        Ok(Response::Exited(r)) => Ok(r),
        Ok(other) => panic!("{script}: {other:?}"),
        Err(e) => Err(e),
    }
}

fn log(d: &ProcDaemon, s: &str) -> PathBuf {
    d.daemon
        .root
        .join(format!("agents/a/workspace/sessions/{s}/current/log"))
}

fn len(p: &PathBuf) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// The session's CPU time so far, µs (`cpu.stat` of its cgroup).
fn cpu_us(d: &ProcDaemon, s: &str) -> u64 {
    let stat = std::fs::read_to_string(d.cgroup.join(format!("allox/a/{s}/cpu.stat")))
        .expect("the session's cpu.stat");
    stat.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
        .expect("usage_usec")
}

/// Waits (bounded) until `f` holds.
fn until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{what}: not after 10 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a session did over the same window: CPU µs used and log bytes
/// written.
fn activity(d: &ProcDaemon, s: &str, window: Duration) -> (u64, u64) {
    let (c0, l0) = (cpu_us(d, s), len(&log(d, s)));
    std::thread::sleep(window);
    (cpu_us(d, s) - c0, len(&log(d, s)) - l0)
}

fn pause(d: &ProcDaemon, s: &str, hold: bool) -> Result<SessionInfo, ErrorBody> {
    match call(
        d,
        Request::SessionPause(SessionPause {
            agent_id: "a".into(),
            session_id: s.into(),
            hold,
        }),
    ) {
        Ok(Response::Session(i)) => Ok(i),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e),
    }
}

fn resume(d: &ProcDaemon, s: &str) -> Result<Response, ErrorBody> {
    call(
        d,
        Request::SessionResume(SessionRef {
            agent_id: "a".into(),
            session_id: s.into(),
        }),
    )
}

fn paused_in_list(d: &ProcDaemon) -> Vec<(String, bool)> {
    match call(
        d,
        Request::SessionList(AgentRef {
            agent_id: "a".into(),
        }),
    ) {
        Ok(Response::Sessions(l)) => l
            .sessions
            .into_iter()
            .map(|s| (s.session_id, s.paused.is_some()))
            .collect(),
        other => panic!("{other:?}"),
    }
}

const WRITER: &str = "i=0; while :; do echo $i >> log; i=$((i+1)); sleep 0.02; done";

#[test]
fn a_paused_session_uses_nothing_and_the_next_start_resumes_it() {
    let Some(d) = setup("a_paused_session_uses_nothing_and_the_next_start_resumes_it") else {
        return;
    };
    bg(&d, "s", "while :; do :; done");
    bg(&d, "s", WRITER);
    bg(&d, "t", WRITER);
    until("both sessions write", || {
        len(&log(&d, "s")) > 0 && len(&log(&d, "t")) > 0
    });
    let window = Duration::from_millis(400);
    // Control: a running session uses CPU and writes in the window.
    let (cpu, wrote) = activity(&d, "s", window);
    assert!(
        cpu > 100_000 && wrote > 0,
        "running: {cpu} µs, {wrote} bytes"
    );

    let t = Instant::now();
    let info = pause(&d, "s", false).unwrap();
    eprintln!("session.pause answered in {:?}", t.elapsed());
    let p = info.paused.expect("paused");
    assert!(!p.hold && p.since_ms > 0, "{p:?}");
    let (cpu, wrote) = activity(&d, "s", window);
    assert!(cpu < 5_000 && wrote == 0, "paused: {cpu} µs, {wrote} bytes");
    // The other session goes on, and only the paused one is listed so.
    let (_, other) = activity(&d, "t", window);
    assert!(other > 0, "session t stopped writing");
    assert_eq!(
        paused_in_list(&d),
        [("s".to_string(), true), ("t".to_string(), false)]
    );

    // A start resumes it: the run runs, and so do the session's others.
    let r = sh(&d, "s", "wc -l < log").unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let at = len(&log(&d, "s"));
    until("the writer goes on", || len(&log(&d, "s")) > at);
    let (cpu, _) = activity(&d, "s", window);
    assert!(cpu > 100_000, "resumed: {cpu} µs");
    assert_eq!(
        paused_in_list(&d),
        [("s".to_string(), false), ("t".to_string(), false)]
    );
    // Resuming a session that is not paused is refused.
    let e = resume(&d, "s").unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict);
    assert!(e.message.contains("a/s is not paused"), "{}", e.message);
}

#[test]
fn a_held_session_refuses_what_needs_it_to_run_until_it_is_resumed() {
    let Some(mut d) = setup("a_held_session_refuses_what_needs_it_to_run_until_it_is_resumed")
    else {
        return;
    };
    bg(&d, "s", WRITER);
    until("s writes", || len(&log(&d, "s")) > 0);
    pause(&d, "s", true).unwrap();
    let at = len(&log(&d, "s"));
    let e = sh(&d, "s", "true").unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict);
    assert!(
        e.message.contains("a/s is paused with hold") && e.message.contains("session.resume"),
        "{}",
        e.message
    );
    let e = call(
        &d,
        Request::FsWrite(
            serde_json::from_value(serde_json::json!({
                "agent_id": "a", "session_id": "s", "path": "x", "data": "eA=="
            }))
            .unwrap(),
        ),
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict, "{}", e.message);
    // What does not need it to run still works, and leaves it paused.
    call(
        &d,
        Request::CheckpointCreate(CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "while-paused".into(),
            pinned: false,
            label: None,
        }),
    )
    .unwrap();
    assert_eq!(len(&log(&d, "s")), at, "a held session wrote");
    // The other session runs as ever.
    assert_eq!(sh(&d, "t", "true").unwrap().exit_code, Some(0));
    // A supervisor started again keeps the hold, since when and why (it
    // was lost: the next request resumed the session).
    let held = session_info(&d, "s").paused.expect("paused");
    d.restart(&[]);
    assert_eq!(session_info(&d, "s").paused.as_ref(), Some(&held));
    let e = sh(&d, "s", "true").unwrap_err();
    assert!(
        e.code == ErrorCode::Conflict && e.message.contains("a/s is paused with hold"),
        "after a restart: {e:?}"
    );
    assert_eq!(
        len(&log(&d, "s")),
        at,
        "a held session wrote after a restart"
    );
    resume(&d, "s").unwrap();
    assert!(session_info(&d, "s").paused.is_none());
    assert_eq!(sh(&d, "s", "true").unwrap().exit_code, Some(0));
    until("the writer goes on", || len(&log(&d, "s")) > at);
    // A paused session can be deleted; its processes go with it.
    pause(&d, "s", true).unwrap();
    call(
        &d,
        Request::SessionDelete(SessionDelete {
            force: true,
            ..SessionDelete::new("a", "s")
        }),
    )
    .unwrap();
    assert!(!d.cgroup.join("allox/a/s").exists());
}

fn session_info(d: &ProcDaemon, s: &str) -> SessionInfo {
    info_of(d, "a", s)
}

/// An idle timeout of 2 s pauses a session whose program sleeps, and the
/// next start resumes it; a lifetime of 5 s kills a session's processes
/// and refuses its changes until `session.update` gives it more time. The
/// clocks are the store's: a supervisor restarted meanwhile keeps them.
#[test]
fn idle_sessions_pause_and_old_ones_expire_across_a_restart() {
    let name = "idle_sessions_pause_and_old_ones_expire_across_a_restart";
    if !require(&format!("pause::{name}")) {
        return;
    }
    let mut d = ProcDaemon::start(name, &[]);
    make_sessions(&d, &[("a", "long")]);
    for (s, idle, life) in [("idle", Some(2_000), None), ("short", None, Some(5_000))] {
        call(
            &d,
            Request::SessionCreate(SessionCreate {
                idle_timeout_ms: idle,
                max_lifetime_ms: life,
                ..SessionCreate::new("a", s)
            }),
        )
        .unwrap();
    }
    for s in ["idle", "short", "long"] {
        assert_eq!(sh(&d, s, "echo kept > kept").unwrap().exit_code, Some(0));
        bg(&d, s, "exec sleep 600");
    }
    // An agent's default: its sessions take it unless they ask for their
    // own; the daemon has none.
    call(
        &d,
        Request::AgentCreate(AgentCreate {
            idle_timeout_ms: Some(7_000),
            max_lifetime_ms: Some(3_600_000),
            ..AgentCreate::new("b")
        }),
    )
    .unwrap();
    for (s, own) in [("x", None), ("y", Some(3_000))] {
        let Ok(Response::Session(i)) = call(
            &d,
            Request::SessionCreate(SessionCreate {
                idle_timeout_ms: own,
                ..SessionCreate::new("b", s)
            }),
        ) else {
            panic!()
        };
        assert_eq!(i.idle_timeout_ms, Some(own.unwrap_or(7_000)), "{i:?}");
        assert_eq!(i.expires_ms, Some(i.created_ms + 3_600_000), "{i:?}");
    }
    assert_eq!(session_info(&d, "long").idle_timeout_ms, None);
    let made = |d: &ProcDaemon, s: &str| session_info(d, s).created_ms;
    let short = session_info(&d, "short");
    assert_eq!(
        short.expires_ms,
        Some(short.created_ms + 5_000),
        "{short:?}"
    );
    // Restarted: the runs go on, and so do the clocks.
    d.restart(&[]);

    let t = Instant::now();
    until("the idle session is paused", || {
        session_info(&d, "idle").paused.is_some()
    });
    let idle = session_info(&d, "idle");
    let p = idle.paused.clone().unwrap();
    // Paused by this supervisor, or (on a loaded machine, where 2 s pass
    // before the restart) by the first one, found frozen at start.
    match p.reason.as_str() {
        "idle" => assert!(
            p.since_ms >= made(&d, "idle") + 2_000,
            "paused too early: {idle:?}"
        ),
        "earlier supervisor" => assert_eq!(p.since_ms, 0, "{idle:?}"),
        other => panic!("paused for {other}: {idle:?}"),
    }
    eprintln!("idle pause seen {:?} after the restart", t.elapsed());
    assert!(session_info(&d, "long").paused.is_none());
    // The next start resumes it.
    assert_eq!(sh(&d, "idle", "cat kept").unwrap().stdout, "kept\n");
    assert!(session_info(&d, "idle").paused.is_none());

    until("the short session expires", || {
        session_info(&d, "short").expired_ms.is_some()
    });
    let short = session_info(&d, "short");
    assert!(
        short.expired_ms.unwrap() >= short.created_ms + 5_000,
        "expired too early: {short:?}"
    );
    // Its processes are gone, its changes refused, its files kept.
    match call(
        &d,
        Request::ProcessList(SessionRef {
            agent_id: "a".into(),
            session_id: "short".into(),
        }),
    ) {
        Ok(Response::Processes(l)) => assert!(l.processes.is_empty(), "{l:?}"),
        other => panic!("{other:?}"),
    }
    let e = sh(&d, "short", "true").unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable);
    assert!(
        e.message.contains("a/short expired") && e.message.contains("session.update"),
        "{}",
        e.message
    );
    match call(
        &d,
        Request::FsRead(
            serde_json::from_value(
                serde_json::json!({"agent_id": "a", "session_id": "short", "path": "kept"}),
            )
            .unwrap(),
        ),
    ) {
        Ok(Response::FsData(f)) => assert_eq!(f.data.as_ref(), b"kept\n"),
        other => panic!("{other:?}"),
    }
    // Control: the session without a lifetime still runs.
    assert_eq!(sh(&d, "long", "true").unwrap().exit_code, Some(0));
    // More time: it takes changes again.
    call(
        &d,
        Request::SessionUpdate(SessionUpdate {
            agent_id: "a".into(),
            session_id: "short".into(),
            max_lifetime_ms: Some(60_000),
            ..SessionUpdate::default()
        }),
    )
    .unwrap();
    assert_eq!(sh(&d, "short", "cat kept").unwrap().stdout, "kept\n");
    assert!(session_info(&d, "short").expired_ms.is_none());
    // Both are in the audit log.
    match call(
        &d,
        Request::AuditList(AuditList {
            after_seq: None,
            before_seq: None,
            limit: Some(1000),
        }),
    ) {
        Ok(Response::Audit(l)) => {
            for (action, target) in [("session.idle", "a/idle"), ("session.expire", "a/short")] {
                assert!(
                    l.records
                        .iter()
                        .any(|r| r.action == action && r.target == target),
                    "no {action} of {target} in the audit log"
                );
            }
        }
        other => panic!("{other:?}"),
    }
}

fn create(d: &ProcDaemon, a: &str, s: &str, idle: Option<u64>, life: Option<u64>) -> SessionInfo {
    match call(
        d,
        Request::SessionCreate(SessionCreate {
            idle_timeout_ms: idle,
            max_lifetime_ms: life,
            ..SessionCreate::new(a, s)
        }),
    ) {
        Ok(Response::Session(i)) => i,
        other => panic!("create {a}/{s}: {other:?}"),
    }
}

fn info_of(d: &ProcDaemon, a: &str, s: &str) -> SessionInfo {
    match call(
        d,
        Request::SessionInfoRequest(SessionRef {
            agent_id: a.into(),
            session_id: s.into(),
        }),
    ) {
        Ok(Response::Session(i)) => i,
        other => panic!("info {a}/{s}: {other:?}"),
    }
}

/// The clocks of a session's whole life: a client waiting for a run is a
/// use (the idle pause froze the run under it, for ever); a restarted
/// supervisor does not take a session that computes for an idle one; a
/// fork gets its agent's limits over time (it had none); an expired
/// session deleted frees its name (a new one of that name was refused as
/// expired until a restart).
#[test]
fn clocks_follow_waiting_clients_restarts_forks_and_deletes() {
    let name = "clocks_follow_waiting_clients_restarts_forks_and_deletes";
    if !require(&format!("pause::{name}")) {
        return;
    }
    let mut d = ProcDaemon::start(name, &[]);
    make_sessions(&d, &[("a", "plain")]);
    // A run that sleeps past the idle timeout while its client waits.
    create(&d, "a", "w", Some(1_000), None);
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let socket = d.daemon.socket.clone();
        std::thread::spawn(move || {
            let mut c = allox_ctl::client::Client::connect(&socket).unwrap();
            let p = process_start("a", "w", &["/bin/sh", "-c", "sleep 2.5; echo done"]);
            let _ = tx.send(c.call(Request::ProcessStart(p)));
        });
    }
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok(Ok(Response::Exited(r)))) => {
            assert_eq!(
                (r.exit_code, r.stdout.as_str()),
                (Some(0), "done\n"),
                "{r:?}"
            )
        }
        Ok(other) => panic!("the waited run: {other:?}"),
        Err(_) => panic!("the waited run did not end within 20 s: paused as idle under its client"),
    }
    // Idle after its client went: paused (the control: the clock runs).
    until("the session is paused once nobody waits", || {
        info_of(&d, "a", "w").paused.is_some()
    });
    // The same with a client that follows the run's output.
    create(&d, "a", "l", Some(1_000), None);
    let mut p = process_start("a", "l", &["/bin/sh", "-c", "sleep 2.5; echo done"]);
    p.wait = false;
    let run = match call(&d, Request::ProcessStart(p)) {
        Ok(Response::Started(r)) => r.run_id,
        other => panic!("{other:?}"),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let socket = d.daemon.socket.clone();
        std::thread::spawn(move || {
            let mut c = allox_ctl::client::Client::connect(&socket).unwrap();
            let _ = tx.send(c.call(Request::ProcessLogs(ProcessLogs {
                agent_id: "a".into(),
                session_id: "l".into(),
                run_id: run,
                follow: true,
            })));
        });
    }
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok(Ok(_))) => {}
        Ok(other) => panic!("the followed logs: {other:?}"),
        Err(_) => {
            panic!("the followed logs did not end within 20 s: paused as idle under their client")
        }
    }

    // An agent's default limits: a fork of its session takes them.
    call(
        &d,
        Request::AgentCreate(AgentCreate {
            idle_timeout_ms: Some(700_000),
            max_lifetime_ms: Some(3_600_000),
            ..AgentCreate::new("c")
        }),
    )
    .unwrap();
    create(&d, "c", "s0", None, None);
    let fork = match call(
        &d,
        Request::SessionFork(SessionFork {
            agent_id: "c".into(),
            session_id: "s0".into(),
            new_agent_id: None,
            new_session_id: "f".into(),
            from: "current".into(),
            label: None,
        }),
    ) {
        Ok(Response::Session(i)) => i,
        other => panic!("fork: {other:?}"),
    };
    assert_eq!(fork.idle_timeout_ms, Some(700_000), "{fork:?}");
    assert_eq!(
        fork.expires_ms,
        Some(fork.created_ms + 3_600_000),
        "{fork:?}"
    );

    // An expired session deleted: a new one of its name is a session.
    create(&d, "a", "exp", None, Some(300));
    until("the session expires", || {
        info_of(&d, "a", "exp").expired_ms.is_some()
    });
    call(
        &d,
        Request::SessionDelete(SessionDelete {
            agent_id: "a".into(),
            session_id: "exp".into(),
            force: true,
        }),
    )
    .unwrap();
    let again = create(&d, "a", "exp", None, None);
    assert_eq!(again.expires_ms, None, "{again:?}");
    assert_eq!(sh(&d, "exp", "echo ran").unwrap().stdout, "ran\n");

    // A session that computes, across a restart: not paused as idle.
    create(&d, "a", "busy", Some(1_500), None);
    bg(&d, "busy", "while :; do :; done");
    // Computing for longer than its idle timeout, with no request: the
    // restarted supervisor finds its last request older than the timeout.
    let t = Instant::now();
    while cpu_us(&d, "busy") < 1_700_000 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the session does not compute"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    d.restart(&[]);
    let t = Instant::now();
    let before = cpu_us(&d, "busy");
    while t.elapsed() < Duration::from_millis(3_500) {
        let i = info_of(&d, "a", "busy");
        assert!(
            i.paused.is_none(),
            "a session that computes was paused {:?} after the restart: {i:?}",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        cpu_us(&d, "busy") > before + 1_000_000,
        "it did not compute"
    );
}
