//! What runs and sessions use, through the real daemon and real cgroups:
//! CPU time of a run, its result's figures, `session.stats` and
//! `session.update`. (On this host's hybrid hierarchy only `cpu.stat` is
//! in cgroup v2: memory, I/O and pids figures are `None` here and are
//! tested in the guest, `vm::guest_runs_report_oom_kills_and_a_live_session_takes_a_lower_pids_max`.)

use allox_integration::{call, make_sessions, process_start as start, require, ProcDaemon};
use allox_protocol::*;

fn setup(name: &str, extra: &[&str]) -> Option<ProcDaemon> {
    if !require(&format!("monitor::{name}")) {
        return None;
    }
    if allox_integration::cgroup2_mount().is_none() {
        panic!("monitor::{name} needs a cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified)");
    }
    if allox_integration::which("python3").is_none() {
        panic!("monitor::{name} needs python3 (its CPU burner)");
    }
    let d = ProcDaemon::start(name, extra);
    make_sessions(&d, &[("a", "s")]);
    Some(d)
}

fn run(d: &ProcDaemon, argv: &[&str]) -> RunResult {
    match call(d, Request::ProcessStart(start("a", "s", argv))) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{argv:?}: {other:?}"),
    }
}

fn cpu_us(u: &Usage) -> u64 {
    u.cpu_user_us.unwrap() + u.cpu_system_us.unwrap()
}

const BURN_1S: &str =
    "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0:\n    pass\n";

fn stats(d: &ProcDaemon) -> SessionStats {
    match call(
        d,
        Request::SessionStats(SessionStatsRequest {
            agent_id: "a".into(),
            session_id: "s".into(),
        }),
    ) {
        Ok(Response::SessionStats(s)) => *s,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_run_s_end_carries_its_cpu_time_and_the_session_its_total() {
    let Some(d) = setup(
        "a_run_s_end_carries_its_cpu_time_and_the_session_its_total",
        &[],
    ) else {
        return;
    };
    let burn = run(&d, &["python3", "-c", BURN_1S]);
    assert_eq!(burn.exit_code, Some(0), "{burn:?}");
    let u = burn.usage.clone().expect("usage");
    let cpu = cpu_us(&u);
    assert!(
        (900_000..=1_100_000).contains(&cpu),
        "a 1 s CPU burner reported {cpu} µs ({u:?})"
    );
    let idle = run(&d, &["sleep", "1"]);
    let idle_cpu = cpu_us(idle.usage.as_ref().unwrap());
    assert!(idle_cpu < 100_000, "sleep 1 reported {idle_cpu} µs of CPU");
    // The memory controller decides whether OOM kills can be told: where
    // it is missing, `oom_killed` says nothing rather than guess.
    let session_dir = d.cgroup.join("allox/a/s");
    let has_memory = session_dir.join("memory.events").exists();
    assert_eq!(idle.oom_killed.is_some(), has_memory, "{idle:?}");
    assert_eq!(
        idle.usage.as_ref().unwrap().memory_peak_bytes.is_some(),
        has_memory
    );
    // alloxctl top: a busy run shows most of a CPU, on its session's row
    // and its own.
    let Ok(Response::Started(busy)) = call(
        &d,
        Request::ProcessStart(ProcessStart {
            wait: false,
            ..start("a", "s", &["python3", "-c", "while True: pass"])
        }),
    ) else {
        panic!("no start")
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (code, out, err) =
        allox_integration::alloxctl(&d.daemon.socket, &["top", "--once", "--interval", "1"]);
    let out = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(code, 0, "{err}");
    let pct_of = |key: &str| -> f64 {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("no {key} in\n{out}"));
        line.split_whitespace()
            .find_map(|w| w.strip_suffix('%'))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no CPU share for {key} in\n{out}"))
    };
    let (session_pct, run_pct) = (pct_of("a/s"), pct_of(&busy.run_id));
    assert!(run_pct > 50.0 && session_pct >= run_pct * 0.9, "{out}");
    // With --json: the same sessions and runs, as session.stats answers
    // them (it printed the table before).
    let (code, out, err) =
        allox_integration::alloxctl(&d.daemon.socket, &["--json", "top", "--once"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out)));
    let sessions = v["sessions"].as_array().expect("sessions");
    let s = sessions
        .iter()
        .find(|s| s["agent_id"] == "a" && s["session_id"] == "s")
        .unwrap_or_else(|| panic!("no a/s in {v}"));
    assert!(s.to_string().contains(&busy.run_id), "{s}");
    call(
        &d,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: Some(busy.run_id.clone()),
            signal: Some(9),
        }),
    )
    .unwrap();
    let _ = call(
        &d,
        Request::ProcessWait(ProcessWait {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: busy.run_id,
            timeout_ms: Some(10_000),
        }),
    );
    // A run killed with SIGKILL is not an OOM kill.
    let Ok(Response::Started(r)) = call(
        &d,
        Request::ProcessStart(ProcessStart {
            wait: false,
            ..start("a", "s", &["sleep", "60"])
        }),
    ) else {
        panic!("no start")
    };
    // Meanwhile the session counts it as live: the run at once, its
    // program once the sandbox's init has forked it (a moment after the
    // start's answer).
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let live = loop {
        let live = stats(&d);
        assert_eq!(live.live_runs, 1, "{live:?}");
        if live.processes >= 1 || std::time::Instant::now() > until {
            break live;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(live.processes >= 1, "{live:?}");
    call(
        &d,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: Some(r.run_id.clone()),
            signal: Some(9),
        }),
    )
    .unwrap();
    let killed = match call(
        &d,
        Request::ProcessWait(ProcessWait {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: r.run_id,
            timeout_ms: Some(10_000),
        }),
    ) {
        Ok(Response::Exited(x)) => x,
        other => panic!("{other:?}"),
    };
    assert_eq!(killed.signal, Some(9), "{killed:?}");
    assert_ne!(killed.oom_killed, Some(true), "{killed:?}");
    // Its cgroup was still there to be read when it ended.
    assert!(
        killed
            .usage
            .as_ref()
            .is_some_and(|u| u.cpu_user_us.is_some()),
        "{killed:?}"
    );
    // The session's total holds the runs that ended.
    let st = stats(&d);
    assert_eq!(st.live_runs, 0, "{st:?}");
    assert!(
        cpu_us(&st.total) >= cpu,
        "{st:?} (the burner alone used {cpu} µs)"
    );
    // The same through alloxctl.
    let (code, out, err) = allox_integration::alloxctl(&d.daemon.socket, &["stats", "a", "s"]);
    let out = String::from_utf8_lossy(&out);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("session a/s: 0 live runs"), "{out}");
    assert!(out.contains("total   cpu user"), "{out}");
}

#[test]
fn session_update_changes_a_live_session_s_limits_or_names_the_missing_controller() {
    let Some(d) = setup(
        "session_update_changes_a_live_session_s_limits_or_names_the_missing_controller",
        &[],
    ) else {
        return;
    };
    let update = |u: SessionUpdate| call(&d, Request::SessionUpdate(u));
    let e = update(SessionUpdate {
        agent_id: "a".into(),
        session_id: "s".into(),
        ..SessionUpdate::default()
    })
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest);
    assert!(e.message.contains("changes nothing"), "{}", e.message);
    let e = update(SessionUpdate {
        agent_id: "a".into(),
        session_id: "s".into(),
        cpu_max: Some("half".into()),
        ..SessionUpdate::default()
    })
    .unwrap_err();
    assert!(e.message.contains("cpu_max \"half\""), "{}", e.message);
    // Limits no run could start under, or past what the kernel takes:
    // refused naming the one (they were accepted, and every run then
    // failed `internal`, or the kernel's refusal came back `conflict`).
    for (u, named) in [
        (
            SessionUpdate {
                pids_max: Some(0),
                ..SessionUpdate::default()
            },
            "pids_max 0",
        ),
        (
            SessionUpdate {
                pids_max: Some(1 << 32),
                ..SessionUpdate::default()
            },
            "pids_max 4294967296",
        ),
        (
            SessionUpdate {
                memory_max: Some(1),
                ..SessionUpdate::default()
            },
            "memory_max 1",
        ),
    ] {
        let e = update(SessionUpdate {
            agent_id: "a".into(),
            session_id: "s".into(),
            ..u
        })
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
        assert!(e.message.contains(named), "{}", e.message);
    }
    let mut req = SessionCreate::new("a", "starved");
    req.memory_max = Some(0);
    let e = call(&d, Request::SessionCreate(req)).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
    assert!(e.message.contains("memory_max 0"), "{}", e.message);
    assert!(matches!(
        call(
            &d,
            Request::SessionInfoRequest(SessionRef {
                agent_id: "a".into(),
                session_id: "starved".into(),
            })
        ),
        Err(ErrorBody {
            code: ErrorCode::NotFound,
            ..
        })
    ));
    let e = update(SessionUpdate {
        agent_id: "a".into(),
        session_id: "nope".into(),
        pids_max: Some(10),
        ..SessionUpdate::default()
    })
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    let session_dir = d.cgroup.join("allox/a/s");
    let r = update(SessionUpdate {
        agent_id: "a".into(),
        session_id: "s".into(),
        pids_max: Some(5),
        ..SessionUpdate::default()
    });
    if session_dir.join("pids.max").exists() {
        let st = match r {
            Ok(Response::SessionStats(s)) => s,
            other => panic!("{other:?}"),
        };
        assert_eq!(st.limits.pids_max, Some(5));
        let many = run(
            &d,
            &[
                "/bin/sh",
                "-c",
                "for i in 1 2 3 4 5 6 7 8; do sleep 5 & done; wait",
            ],
        );
        assert!(
            many.stderr.contains("fork") || many.exit_code != Some(0),
            "{many:?}"
        );
    } else {
        let e = r.unwrap_err();
        assert_eq!(e.code, ErrorCode::Unsupported, "{e:?}");
        assert!(e.message.contains("pids controller"), "{}", e.message);
    }
}

#[test]
fn without_run_usage_results_carry_none() {
    let Some(d) = setup("without_run_usage_results_carry_none", &["--no-run-usage"]) else {
        return;
    };
    let r = run(&d, &["true"]);
    assert_eq!((r.usage, r.oom_killed), (None, None));
}

/// Pings from its own connection until `stop`; the slowest answer.
fn watch_ping(
    d: &ProcDaemon,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<std::time::Duration> {
    let mut c = d.daemon.client();
    std::thread::spawn(move || {
        let mut worst = std::time::Duration::ZERO;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let t = std::time::Instant::now();
            match c.call(Request::Ping(Ping {})) {
                Ok(Ok(Response::Pong(_))) => worst = worst.max(t.elapsed()),
                other => panic!("ping: {other:?}"),
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        worst
    })
}

#[test]
fn a_sandbox_flooding_large_spans_cannot_fill_the_store() {
    let name = "a_sandbox_flooding_large_spans_cannot_fill_the_store";
    let Some(d) = setup(name, &["--plugin", "monitor", "--session-quota", "64M"]) else {
        return;
    };
    make_sessions(&d, &[("b", "s")]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pinger = watch_ping(&d, stop.clone());
    // Six spans of four 4 KiB attributes a request (~100 KB), as fast as
    // the sandbox can send them, for 8 s.
    let script = r#"
import json, subprocess, time
v = "x" * 4096
spans = [{"trace_id": "%032x" % 1, "span_id": "%016x" % (i + 1), "name": "t",
          "operation": "execute_tool", "tool": "bash", "start_unix_nano": 1,
          "end_unix_nano": 2, "attributes": {"k%d" % k: v for k in range(4)}}
         for i in range(6)]
p = json.dumps({"spans": spans})
ok = refused = 0
last = ""
end = time.time() + 8
while time.time() < end:
    r = subprocess.run(["allox", "call", "monitor.spans", p], capture_output=True, text=True)
    if r.returncode == 0:
        ok += 1
    else:
        refused += 1
        last = r.stderr
print(json.dumps({"ok": ok, "refused": refused, "last": last}))
"#;
    let r = run(&d, &["python3", "-c", script]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let worst = pinger.join().unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let out: serde_json::Value = serde_json::from_str(r.stdout.trim()).expect("JSON");
    assert!(out["refused"].as_u64().unwrap() > 0, "never refused: {out}");
    assert!(
        out["last"]
            .as_str()
            .unwrap()
            .contains("--monitor-bytes-per-s"),
        "{out}"
    );
    // At most the burst (8 MiB) and 1 MiB a second for ~8 s, with room.
    let kept = std::fs::metadata(d.daemon.root.join("state/monitor/records.log"))
        .unwrap()
        .len();
    assert!(kept < 24 << 20, "the monitor keeps {kept} bytes");
    assert!(
        worst < std::time::Duration::from_secs(1),
        "ping took {worst:?}"
    );
    // Another agent still writes, and sessions are still made.
    let w = match call(
        &d,
        Request::ProcessStart(start(
            "b",
            "s",
            &[
                "/bin/sh",
                "-c",
                "head -c 16777216 /dev/zero > f && echo done",
            ],
        )),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(w.exit_code, Some(0), "{w:?}");
    make_sessions(&d, &[("b", "t")]);
}

/// `allox_runs_live` and `allox_processes` as `alloxctl metrics` prints
/// them.
fn live_gauges(d: &ProcDaemon) -> (u64, u64) {
    let (code, out, err) = allox_integration::alloxctl(&d.daemon.socket, &["metrics"]);
    assert_eq!(code, 0, "{err}");
    let out = String::from_utf8_lossy(&out).into_owned();
    let gauge = |name: &str| -> u64 {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{out}"))
    };
    (gauge("allox_runs_live"), gauge("allox_processes"))
}

/// A run whose program ended but left a process going (a `setsid`
/// daemon) is a live run of the session with a program, in
/// `session.stats` (so `alloxctl top`) and the metrics, as `process.list`
/// lists it; and so are runs an earlier supervisor started, after a
/// restart. (They were counted 0 runs, 0 processes while they used a CPU.)
#[test]
fn runs_left_going_and_runs_of_an_earlier_supervisor_are_counted_live() {
    let Some(mut d) = setup(
        "runs_left_going_and_runs_of_an_earlier_supervisor_are_counted_live",
        &[],
    ) else {
        return;
    };
    let left = run(
        &d,
        &[
            "sh",
            "-c",
            "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo started",
        ],
    );
    assert_eq!(left.exit_code, Some(0), "{left:?}");
    let Ok(Response::Started(going)) = call(
        &d,
        Request::ProcessStart(ProcessStart {
            wait: false,
            ..start("a", "s", &["sleep", "300"])
        }),
    ) else {
        panic!("no start")
    };
    let check = |d: &ProcDaemon, when: &str| {
        let st = stats(d);
        let ids: Vec<&str> = st.runs.iter().map(|r| r.run_id.as_str()).collect();
        assert!(
            st.live_runs == 2
                && st.processes == 2
                && ids.contains(&left.run_id.as_str())
                && ids.contains(&going.run_id.as_str()),
            "{when}: {st:#?}"
        );
        assert_eq!(live_gauges(d), (2, 2), "{when}");
    };
    check(&d, "left going");
    d.restart(&[]);
    check(&d, "after a restart");
    // Killed: nothing live.
    call(
        &d,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: None,
            signal: Some(9),
        }),
    )
    .unwrap();
    let st = stats(&d);
    assert!(st.live_runs == 0 && st.processes == 0, "{st:#?}");
    assert_eq!(live_gauges(&d), (0, 0));
}
