//! The eBPF process tracker through the daemon: real programs on the
//! scheduler tracepoints of this kernel, real sandboxes and cgroups.

use allox_integration::{needs, require, ProcDaemon};
use allox_protocol::*;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// One tracked daemon at a time: the fork storm slows the whole machine,
/// and the tests that wait for events would time out beside it.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A daemon with the tracker on, holding the test's turn.
struct Tracked {
    d: ProcDaemon,
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl std::ops::Deref for Tracked {
    type Target = ProcDaemon;
    fn deref(&self) -> &ProcDaemon {
        &self.d
    }
}

impl std::ops::DerefMut for Tracked {
    fn deref_mut(&mut self) -> &mut ProcDaemon {
        &mut self.d
    }
}

/// The daemon with the tracker on, or `None` after saying why not (BTF).
fn daemon(name: &str, extra: &[&str]) -> Option<Tracked> {
    if !require(name) {
        return None;
    }
    let btf = allox_ebpf_probes::KERNEL_BTF;
    let missing =
        (!std::path::Path::new(btf).exists()).then(|| format!("a kernel with BTF ({btf})"));
    if !needs(name, missing) {
        return None;
    }
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut args = vec!["--process-tracker", "ebpf"];
    args.extend_from_slice(extra);
    Some(Tracked {
        d: ProcDaemon::start(name, &args),
        _turn: turn,
    })
}

fn call(d: &ProcDaemon, r: Request) -> Result<Response, ErrorBody> {
    d.daemon.client().call(r).expect("transport")
}

fn setup(d: &ProcDaemon, a: &str, sessions: &[&str]) {
    call(d, Request::AgentCreate(AgentCreate::new(a))).unwrap();
    for s in sessions {
        call(d, Request::SessionCreate(SessionCreate::new(a, *s))).unwrap();
    }
}

fn run(d: &ProcDaemon, a: &str, s: &str, argv: &[&str], wait: bool) -> String {
    let r = call(
        d,
        Request::ProcessStart(ProcessStart {
            agent_id: a.into(),
            session_id: s.into(),
            argv: argv.iter().map(|x| x.to_string()).collect(),
            env: Default::default(),
            cwd: None,
            stdin: None,
            timeout_ms: None,
            wait,
            stream: false,
            pty: None,
            trace: None,
            on_disconnect: Default::default(),
            recovery: None,
        }),
    )
    .unwrap();
    match r {
        Response::Exited(x) => x.run_id,
        Response::Started(x) => x.run_id,
        other => panic!("{other:?}"),
    }
}

fn events(
    d: &ProcDaemon,
    a: Option<&str>,
    s: Option<&str>,
    r: Option<&str>,
) -> ProcessEventListing {
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let page = match call(
            d,
            Request::ProcessEvents(ProcessEvents {
                agent_id: a.map(Into::into),
                session_id: s.map(Into::into),
                run_id: r.map(Into::into),
                cursor,
                limit: Some(10_000),
                follow: false,
            }),
        )
        .unwrap()
        {
            Response::ProcessEvents(p) => p,
            other => panic!("{other:?}"),
        };
        let done = page.events.is_empty();
        cursor = Some(page.next_cursor);
        all.extend(page.events);
        if done {
            return ProcessEventListing {
                events: all,
                next_cursor: page.next_cursor,
                lost: page.lost,
                evicted: page.evicted,
            };
        }
    }
}

/// Waits until at least `forks` processes of the run were forked and every
/// one of them has exited (the tracker drains on a timer).
fn settle(d: &ProcDaemon, a: &str, s: &str, run: &str, forks: usize) -> Vec<ProcessEvent> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let evs = events(d, Some(a), Some(s), Some(run)).events;
        let forked: HashSet<u32> = evs
            .iter()
            .filter(|e| e.kind == ProcessEventKind::Fork)
            .map(|e| e.host_pid)
            .collect();
        let exited: HashSet<u32> = evs
            .iter()
            .filter(|e| e.kind == ProcessEventKind::Exit)
            .map(|e| e.host_pid)
            .collect();
        if forked.len() >= forks && forked.is_subset(&exited) {
            return evs;
        }
        assert!(
            Instant::now() < deadline,
            "{} forked (want {forks}), {} of them exited: {evs:#?}",
            forked.len(),
            forked.intersection(&exited).count()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn tree(d: &ProcDaemon, a: &str, s: &str, run: Option<&str>) -> Vec<ProcessNode> {
    match call(
        d,
        Request::ProcessTree(ProcessTreeRequest {
            agent_id: a.into(),
            session_id: s.into(),
            run_id: run.map(Into::into),
        }),
    )
    .unwrap()
    {
        Response::ProcessTree(t) => t.roots,
        other => panic!("{other:?}"),
    }
}

fn count(n: &ProcessNode) -> usize {
    1 + n.children.iter().map(count).sum::<usize>()
}

fn find<'a>(n: &'a ProcessNode, prog: &str) -> Option<&'a ProcessNode> {
    if n.execs.iter().any(|e| e.ends_with(prog)) {
        return Some(n);
    }
    n.children.iter().find_map(|c| find(c, prog))
}

#[test]
fn a_pipeline_a_double_fork_and_setsid_are_attributed_exactly() {
    pipeline_double_fork_and_setsid("tracker::a_pipeline_a_double_fork_and_setsid", &[]);
}

/// The same with each run's PID 1 made ahead: it is forked outside the
/// run's cgroup and moved in when the run claims it, which counts as its
/// fork.
#[test]
fn a_run_made_ahead_is_attributed_as_one_cloned_when_asked() {
    pipeline_double_fork_and_setsid(
        "tracker::a_run_made_ahead_is_attributed_as_one_cloned_when_asked",
        &["--prepared-runs", "always"],
    );
}

fn pipeline_double_fork_and_setsid(name: &str, extra: &[&str]) {
    let Some(d) = daemon(name, extra) else {
        return;
    };
    setup(&d, "a", &["s"]);
    // The first run makes the session's context; the second is the one
    // looked at (with `--prepared-runs always`, made ahead).
    run(&d, "a", "s", &["/bin/true"], true);
    let script = "echo hi | cat | wc -c >/dev/null; \
                  (sh -c 'sleep 0.2; exit 7' &) ; \
                  setsid sh -c 'exec sleep 0.3' & \
                  wait; sleep 0.5; exit 3";
    let run_id = run(&d, "a", "s", &["/bin/sh", "-c", script], true);
    // sandbox init, sh, echo-subshells/cat/wc, subshell, sh(exit 7), sleep,
    // setsid's sh → sleep, sleep 0.5: at least 7 processes end.
    let evs = settle(&d, "a", "s", &run_id, 9);
    assert!(evs
        .iter()
        .all(|e| e.agent_id == "a" && e.session_id == "s" && e.run_id == run_id));
    let execs: Vec<&str> = evs.iter().filter_map(|e| e.filename.as_deref()).collect();
    for prog in ["/sh", "/cat", "/wc", "/sleep", "/setsid"] {
        assert!(
            execs.iter().any(|x| x.ends_with(prog)),
            "no exec of {prog}: {execs:?}"
        );
    }
    // Every fork's parent is a process of the run (or the supervisor, for
    // the sandbox's init); every process that exited was forked first.
    let forked: HashSet<u32> = evs
        .iter()
        .filter(|e| e.kind == ProcessEventKind::Fork)
        .map(|e| e.host_pid)
        .collect();
    for e in evs.iter().filter(|e| e.kind == ProcessEventKind::Exit) {
        assert!(
            forked.contains(&e.host_pid),
            "exit of an unknown process: {e:?}"
        );
    }
    // Exit statuses: the shell's 3 and the double-forked child's 7.
    let codes: Vec<i32> = evs.iter().filter_map(|e| e.exit_code).collect();
    assert!(codes.contains(&3) && codes.contains(&7), "{codes:?}");
    // Pids as the sandbox sees them: its init is 1.
    assert!(
        evs.iter()
            .any(|e| e.kind == ProcessEventKind::Fork && e.pid == 1),
        "{evs:#?}"
    );
    // The lineage: one root (the sandbox init), the double-forked sleep and
    // the setsid'ed one in it although their parents exited first.
    let roots = tree(&d, "a", "s", Some(&run_id));
    assert_eq!(roots.len(), 1, "{roots:#?}");
    assert_eq!(count(&roots[0]), forked.len());
    assert!(find(&roots[0], "/setsid").is_some());
    assert!(roots[0].ended_ms.is_some());
}

#[test]
fn threads_are_not_processes_and_sessions_never_mix() {
    let Some(d) = daemon("tracker::threads_are_not_processes", &[]) else {
        return;
    };
    setup(&d, "a", &["s1", "s2"]);
    let py = "import threading, time\n\
              ts = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(8)]\n\
              [t.start() for t in ts]; [t.join() for t in ts]";
    let r1 = run(&d, "a", "s1", &["/usr/bin/python3", "-c", py], false);
    let r2 = run(
        &d,
        "a",
        "s2",
        &["/bin/sh", "-c", "for i in 1 2 3 4 5; do /bin/true; done"],
        false,
    );
    let e1 = settle(&d, "a", "s1", &r1, 2);
    let e2 = settle(&d, "a", "s2", &r2, 7);
    // python: the init and python itself; eight threads are not processes.
    let forks1 = e1
        .iter()
        .filter(|e| e.kind == ProcessEventKind::Fork)
        .count();
    assert_eq!(forks1, 2, "{e1:#?}");
    assert!(e1.iter().all(|e| e.session_id == "s1"));
    assert!(e2.iter().all(|e| e.session_id == "s2"));
    let forks2 = e2
        .iter()
        .filter(|e| e.kind == ProcessEventKind::Fork)
        .count();
    assert_eq!(forks2, 7, "init, sh and five /bin/true: {e2:#?}");
    // The two sessions' pids never cross.
    let p1: HashSet<u32> = e1.iter().map(|e| e.host_pid).collect();
    let p2: HashSet<u32> = e2.iter().map(|e| e.host_pid).collect();
    assert!(p1.is_disjoint(&p2));
}

#[test]
fn runs_after_a_supervisor_restart_are_attributed_and_old_runs_too() {
    let Some(mut d) = daemon("tracker::runs_after_a_supervisor_restart", &[]) else {
        return;
    };
    setup(&d, "a", &["s"]);
    // A run that outlives the supervisor, forking after the restart.
    let old = run(
        &d,
        "a",
        "s",
        &["/bin/sh", "-c", "sleep 1; /bin/true; exit 4"],
        false,
    );
    d.restart(&["--process-tracker", "ebpf"]);
    let new = run(&d, "a", "s", &["/bin/sh", "-c", "/bin/true; exit 5"], true);
    let evs = settle(&d, "a", "s", &new, 3);
    assert!(evs.iter().any(|e| e.exit_code == Some(5)));
    let olds = settle(&d, "a", "s", &old, 2);
    assert!(
        olds.iter().any(|e| e.exit_code == Some(4)),
        "the old run's end after the restart is not attributed: {olds:#?}"
    );
}

#[test]
fn a_fork_storm_loses_nothing_or_says_how_much_and_kill_still_works() {
    let Some(d) = daemon("tracker::a_fork_storm", &[]) else {
        return;
    };
    setup(&d, "a", &["s"]);
    // A small static C program forks as fast as the machine can (reaping
    // in batches): python's fork is far too slow for a storm.
    let n = 50_000;
    let cur = d.daemon.root.join("agents/a/workspace/sessions/s/current");
    std::fs::write(
        cur.join("storm.c"),
        "#include <unistd.h>\n#include <sys/wait.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <time.h>\n\
         int main(int c, char **v) { int n = atoi(v[1]); struct timespec a, b;\n\
         clock_gettime(CLOCK_MONOTONIC, &a);\n\
         for (int i = 0; i < n; i++) { pid_t p = fork(); if (p == 0) _exit(0);\n\
           if (p < 0) { while (wait(NULL) > 0); i--; continue; }\n\
           if ((i & 63) == 63) while (waitpid(-1, NULL, WNOHANG) > 0); }\n\
         while (wait(NULL) > 0);\n\
         clock_gettime(CLOCK_MONOTONIC, &b);\n\
         printf(\"%d\\n\", (int)(n / ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9))); return 0; }\n",
    )
    .unwrap();
    let cc = std::process::Command::new("cc")
        .args(["-O2", "-static", "-o"])
        .arg(cur.join("storm"))
        .arg(cur.join("storm.c"))
        .status()
        .expect("run cc (apt-get install gcc libc6-dev)");
    assert!(cc.success(), "cc failed");
    let script = format!("exec ./storm {n}");
    let storm = run(&d, "a", "s", &["/bin/sh", "-c", &script], false);
    // Killing works meanwhile: it relies on the cgroup, not on the tracker.
    let victim = run(&d, "a", "s", &["/bin/sleep", "600"], false);
    std::thread::sleep(Duration::from_millis(300));
    let killed = call(
        &d,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: Some(victim.clone()),
            signal: None,
        }),
    )
    .unwrap();
    assert!(
        matches!(&killed, Response::Killed(k) if k.killed >= 1),
        "{killed:?}"
    );
    let r = call(
        &d,
        Request::ProcessWait(ProcessWait {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: storm.clone(),
            timeout_ms: Some(120_000),
        }),
    )
    .unwrap();
    let Response::Exited(x) = r else {
        panic!("{r:?}")
    };
    eprintln!("fork storm: {} forks per second", x.stdout.trim());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let l = events(&d, Some("a"), Some("s"), Some(&storm));
        let exits = l
            .events
            .iter()
            .filter(|e| e.kind == ProcessEventKind::Exit)
            .count() as u64;
        let want = n as u64 + 2; // the children, the storm, the sandbox's init
        if exits >= want || (l.lost > 0 && exits + l.lost >= want) {
            eprintln!(
                "fork storm: {exits} exits recorded, {} events lost (counted)",
                l.lost
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{exits} exits of {want}, lost {}",
            l.lost
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_event_store_at_its_cap_keeps_working_and_says_what_it_dropped() {
    let Some(d) = daemon(
        "tracker::the_event_store_at_its_cap",
        &["--process-events-max", "200"],
    ) else {
        return;
    };
    setup(&d, "a", &["s"]);
    let r = run(
        &d,
        "a",
        "s",
        &["/bin/sh", "-c", "for i in $(seq 150); do /bin/true; done"],
        true,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let l = events(&d, None, None, None);
        if l.evicted > 0
            && l.events.iter().any(|e| {
                e.run_id == r && e.exit_code == Some(0) && e.filename.is_none() && e.pid == 1
            })
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no eviction: {} events, evicted {}",
            l.events.len(),
            l.evicted
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The run has ended, so nothing more is appended: one listing now is
    // what the store holds (while the run went on, its pages spanned more
    // than one store's worth).
    let l = events(&d, None, None, None);
    assert!(l.events.len() <= 201, "{}", l.events.len());
    let noted: u64 = l.events.iter().filter_map(|e| e.evicted).sum();
    assert!(
        noted > 0 && noted <= l.evicted,
        "eviction not recorded: {noted} of {}",
        l.evicted
    );
    // And it keeps working: a new run is recorded whole.
    let again = run(&d, "a", "s", &["/bin/true"], true);
    let evs = settle(&d, "a", "s", &again, 2);
    let kinds: HashMap<ProcessEventKind, usize> = evs.iter().fold(HashMap::new(), |mut m, e| {
        *m.entry(e.kind).or_default() += 1;
        m
    });
    assert_eq!(kinds.get(&ProcessEventKind::Fork), Some(&2), "{evs:#?}");
}

#[test]
fn without_the_flag_nothing_is_loaded_and_the_api_says_so() {
    if !require("tracker::without_the_flag_nothing_is_loaded") {
        return;
    }
    let d = ProcDaemon::start("tracker-off", &[]);
    let e = call(&d, Request::ProcessEvents(ProcessEvents::default())).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unsupported);
    assert!(
        e.message.contains("--process-tracker ebpf"),
        "{}",
        e.message
    );
}

#[test]
fn a_subscription_streams_new_events_as_they_happen() {
    let Some(d) = daemon("tracker::a_subscription_streams_new_events", &[]) else {
        return;
    };
    setup(&d, "a", &["s", "other"]);
    let sock = d.daemon.socket.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut c = allox_ctl::client::Client::connect(&sock).unwrap();
        c.set_timeout(Some(Duration::from_secs(15))).unwrap();
        let _ = c.call_with_events(
            Request::ProcessEvents(ProcessEvents {
                agent_id: Some("a".into()),
                session_id: Some("s".into()),
                follow: true,
                ..Default::default()
            }),
            |e| {
                if let Event::Process(p) = e {
                    let _ = tx.send(p);
                }
            },
        );
    });
    std::thread::sleep(Duration::from_millis(300));
    run(&d, "a", "other", &["/bin/true"], true);
    let r = run(&d, "a", "s", &["/bin/sh", "-c", "/bin/true; exit 6"], true);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while !got.iter().any(|e: &ProcessEvent| e.exit_code == Some(6)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(e) => got.push(e),
            Err(_) => panic!("no exit 6 on the subscription; got {got:#?}"),
        }
    }
    assert!(
        got.iter().all(|e| e.session_id == "s" && e.run_id == r),
        "{got:#?}"
    );
    assert!(got
        .iter()
        .any(|e| e.filename.as_deref() == Some("/bin/true")));
}

#[test]
fn asked_for_where_it_cannot_load_the_daemon_says_why_and_does_not_start() {
    if !require("tracker::asked_for_where_it_cannot_load") {
        return;
    }
    // A kernel without BTF, as the daemon sees it: a private mount
    // namespace with an empty tmpfs over /sys/kernel/btf.
    let fs = allox_integration::BtrfsFs::new(256).unwrap();
    let root = fs.path().join("store");
    std::fs::create_dir(&root).unwrap();
    let cg = allox_integration::cgroup2_mount()
        .unwrap()
        .join(format!("allox-test-{}-nobtf", std::process::id()));
    std::fs::create_dir_all(&cg).unwrap();
    let init = allox_integration::workspace_bin("allox-init");
    let script = format!(
        "mount -t tmpfs none /sys/kernel/btf && exec {} supervise --root {} --listen unix:{} \
         --cgroup-root {} --sandbox-stage {} --process-tracker ebpf",
        init.display(),
        root.display(),
        fs.scratch().join("ctl.sock").display(),
        cg.display(),
        fs.scratch().join("stage").display()
    );
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("run unshare");
    let _ = std::fs::remove_dir(&cg);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "the daemon started: {err}");
    assert!(err.contains("--process-tracker ebpf"), "{err}");
    assert!(
        err.contains("/sys/kernel/btf/vmlinux"),
        "the cause is not named: {err}"
    );
    assert!(!fs.scratch().join("ctl.sock").exists(), "it listened");
}

/// An agent that fills the disk, then grows the event store past its kept
/// room with its own processes: the store takes an I/O error, and runs of
/// every session still start (each was refused "Previous I/O error" for
/// the daemon's life); once there is room the store is reopened and
/// records again.
#[test]
fn an_event_store_out_of_room_on_a_full_disk_refuses_no_run_and_recovers() {
    let Some(d) = daemon("tracker::an_event_store_out_of_room_on_a_full_disk", &[]) else {
        return;
    };
    setup(&d, "a", &["s", "t"]);
    let current = match call(
        &d,
        Request::SessionInfoRequest(SessionRef {
            agent_id: "a".into(),
            session_id: "s".into(),
        }),
    )
    .unwrap()
    {
        Response::Session(s) => std::path::PathBuf::from(s.current),
        other => panic!("{other:?}"),
    };
    let filled = allox_integration::fill_disk(&current);
    let store = d.daemon.root.join("state/events.redb");
    let allocated = |p: &std::path::Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.len(), std::os::unix::fs::MetadataExt::blocks(&m) * 512)
    };
    let (_, room) = allocated(&store);
    // Processes until the store outgrows what it holds on the disk, and
    // the events it could not take are counted lost.
    let lost = |d: &ProcDaemon| match call(
        d,
        Request::ProcessEvents(ProcessEvents {
            agent_id: None,
            session_id: None,
            run_id: None,
            cursor: None,
            limit: Some(1),
            follow: false,
        }),
    )
    .unwrap()
    {
        Response::ProcessEvents(p) => p.lost,
        other => panic!("{other:?}"),
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    while lost(&d) == 0 {
        run(
            &d,
            "a",
            "s",
            &[
                "/bin/sh",
                "-c",
                "i=0; while [ $i -lt 2000 ]; do /bin/true; i=$((i+1)); done",
            ],
            true,
        );
        let (len, now) = allocated(&store);
        assert!(
            Instant::now() < deadline,
            "the event store never ran out of room: {len} bytes, {now} allocated (at the start {room})"
        );
    }
    // Runs of both sessions start and end; what was not stored is
    // counted lost.
    for s in ["s", "t", "t"] {
        run(&d, "a", s, &["/bin/true"], true);
    }
    // Room again: the store is reopened and a new run's events recorded.
    for f in filled {
        let _ = std::fs::remove_file(f);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = run(&d, "a", "t", &["/bin/true"], true);
        std::thread::sleep(Duration::from_millis(1500));
        if events(&d, Some("a"), Some("t"), Some(&r))
            .events
            .iter()
            .any(|e| e.kind == ProcessEventKind::Exit)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no events recorded once there is room"
        );
    }
}
