//! The booted guest under QEMU: PID 1, the supervisor it starts, the
//! control port on virtio-serial, the store on its virtio disk.

use allox_ctl::client::Client;
use allox_integration::vm::{require_vm, store_image, with_escape_helper, Vm, ESCAPE_RDINIT};
use allox_protocol::*;
use allox_store::index::Index;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "vm/manager.rs"]
mod manager;

const BOOT: Duration = Duration::from_secs(60);

fn ok(c: &mut Client, r: Request) -> Response {
    let what = format!("{r:?}");
    match c.call(r).expect("transport") {
        Ok(v) => v,
        Err(e) => panic!("{what} failed: {e:?}"),
    }
}

fn agent(a: &str) -> Request {
    Request::AgentCreate(AgentCreate::new(a.to_string()))
}

fn session(a: &str, s: &str) -> Request {
    Request::SessionCreate(SessionCreate::new(a, s))
}

fn ck(a: &str, s: &str, c: &str) -> Request {
    Request::CheckpointCreate(CheckpointCreate {
        agent_id: a.into(),
        session_id: s.into(),
        checkpoint_id: c.into(),
        pinned: false,
        label: None,
    })
}

/// Runs a shell command in the session's sandbox and returns its stdout.
fn run(a: &str, s: &str, script: &str, wait: bool) -> Request {
    Request::ProcessStart(ProcessStart {
        agent_id: a.into(),
        session_id: s.into(),
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
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
    })
}

/// `effects.verify` of `a/s`'s run `run` in the guest against `root`,
/// which must find it sound, and its `effects.export` written to `to`.
fn verified_and_exported(
    c: &mut Client,
    run: &str,
    root: &str,
    to: &Path,
) -> allox_protocol::EffectsVerified {
    let v = match ok(
        c,
        Request::EffectsVerify(EffectsVerify {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run.into(),
            evidence_root: Some(root.into()),
        }),
    ) {
        Response::EffectsVerified(v) => v,
        other => panic!("{other:?}"),
    };
    assert!(v.ok, "{v:?}");
    let mut tar = Vec::new();
    allox_ctl::effects::export(
        c,
        &EffectsExport {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run.into(),
            offset: None,
        },
        &mut tar,
    )
    .expect("the export");
    std::fs::write(to, &tar).unwrap();
    v
}

/// `effects.unfence` of `a/s` with run `run`'s root, which must lift it.
fn unfence(c: &mut Client, run: &str, root: &str) {
    match ok(
        c,
        Request::EffectsUnfence(allox_protocol::EffectsUnfence {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run.into(),
            evidence_root: root.into(),
        }),
    ) {
        Response::EffectsUnfenced(_) => {}
        other => panic!("unfence {run}: {other:?}"),
    }
}

/// `run` with `wait`, observed under protocol v3 (a baseline made,
/// `scrub_runtime` and `require_consistent`: the seed's request).
fn v3_run(a: &str, s: &str, script: &str) -> Request {
    let mut r = run(a, s, script, true);
    if let Request::ProcessStart(p) = &mut r {
        p.recovery = Some(Box::new(allox_protocol::ProcessRecovery {
            checkpoint_id: None,
            scrub_runtime: true,
            require_consistent: true,
        }));
    }
    r
}

fn sh(c: &mut Client, a: &str, s: &str, script: &str) -> String {
    let r = ok(c, run(a, s, script, true));
    match r {
        Response::Exited(x) => {
            assert_eq!(x.exit_code, Some(0), "{script}: {x:?}");
            x.stdout
        }
        other => panic!("{script}: {other:?}"),
    }
}

fn start(c: &mut Client, a: &str, s: &str, script: &str) -> String {
    match ok(c, run(a, s, script, false)) {
        Response::Started(r) => r.run_id,
        other => panic!("{other:?}"),
    }
}

fn info(c: &mut Client) -> SystemInfo {
    match ok(c, Request::SystemInfo(SystemInfoRequest {})) {
        Response::System(i) => i,
        other => panic!("{other:?}"),
    }
}

fn processes(c: &mut Client, a: &str, s: &str) -> Vec<ProcessInfo> {
    match ok(
        c,
        Request::ProcessList(SessionRef {
            agent_id: a.into(),
            session_id: s.into(),
        }),
    ) {
        Response::Processes(p) => p.processes,
        other => panic!("{other:?}"),
    }
}

/// Mounts the store image on the host (after the guest is gone) and
/// returns the journal's incomplete operations and the checkpoints' names.
fn inspect_store(img: &Path) -> (usize, Vec<String>) {
    let mnt = img.with_extension("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let st = Command::new("mount")
        .args(["-o", "loop"])
        .arg(img)
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success(), "the store image does not mount on the host");
    let root = mnt.join("allox");
    let pending = Index::open(&root.join("state/index.redb"))
        .map(|i| i.pending().expect("read the journal").len())
        .unwrap_or_else(|e| {
            let _ = Command::new("umount").arg(&mnt).status();
            panic!("cannot open the index: {e}")
        });
    let cks: Vec<String> =
        std::fs::read_dir(root.join("agents/a/workspace/sessions/s/checkpoints"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
    let _ = Command::new("umount").arg(&mnt).status();
    (pending, cks)
}

/// What is wrong with a console whose init and supervisor log JSON
/// (`allox.log_format=json`): a line of theirs in text, one that does not
/// parse, no line of init's, or no request line of the supervisor's with
/// its action and agent.
fn json_logs_wrong(console: &str) -> Option<String> {
    let mut init = 0;
    let mut requests = 0;
    for l in console.lines().map(|l| l.trim_end_matches('\r')) {
        if l.contains("] allox-init: ") {
            return Some(format!("a text line of init's: {l}"));
        }
        if !(l.starts_with('{') && l.contains("\"target\":\"allox_")) {
            continue;
        }
        let v: serde_json::Value = match serde_json::from_str(l) {
            Ok(v) => v,
            Err(e) => return Some(format!("not JSON ({e}): {l}")),
        };
        if v["timestamp"].is_null() || v["level"].is_null() || v["message"].is_null() {
            return Some(format!("without time, level or message: {l}"));
        }
        init += usize::from(v["target"] == "allox_init");
        requests += usize::from(
            v["message"] == "request answered"
                && v["span"]["agent"] == "a"
                && v["span"]["action"] == "session.create",
        );
    }
    match (init, requests) {
        (0, _) => Some("no JSON line of init's".into()),
        (_, 0) => Some("no JSON line of the session.create request".into()),
        _ => None,
    }
}

#[test]
fn guest_the_spine_and_exec_over_virtio_serial_then_an_orderly_shutdown() {
    let Some(img) = require_vm("vm::the_spine_and_exec_over_virtio_serial") else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = store_image(dir.path(), true);
    // With JSON logs (init's and the supervisor's), checked at the end.
    let mut vm = Vm::boot(&img, Some(&store), &["allox.log_format=json"]);
    let (mut c, t) = vm.connect(BOOT);
    eprintln!("Hello answered {t:?} after QEMU started");
    let i = info(&mut c);
    assert!(i.under_init, "the supervisor is PID 1's child: {i:?}");
    ok(&mut c, agent("a"));
    ok(&mut c, session("a", "s"));
    assert_eq!(
        sh(&mut c, "a", "s", "echo one > f; cat f; id -u"),
        "one\n10000\n"
    );
    // PID 1 empties the kernel's modprobe path while it mounts the kernel
    // filesystems (bpffs would start a modprobe) and puts it back.
    assert_eq!(
        sh(&mut c, "a", "s", "cat /proc/sys/kernel/modprobe"),
        "/sbin/modprobe\n"
    );
    // The default image has no network device: the sandbox (here in the
    // supervisor's network, mode disabled) sees a loopback only.
    assert_eq!(
        sh(
            &mut c,
            "a",
            "s",
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"
        ),
        "lo\n"
    );
    // A terminal run in the guest: a devpts of its own, the size asked
    // for.
    let mut p = match run("a", "s", "tty; stty size", true) {
        Request::ProcessStart(p) => p,
        _ => unreachable!(),
    };
    p.pty = Some(PtySize {
        rows: 33,
        cols: 99,
        term: None,
    });
    match ok(&mut c, Request::ProcessStart(p)) {
        Response::Exited(r) => assert_eq!(r.stdout, "/dev/pts/0\r\n33 99\r\n", "{r:?}"),
        other => panic!("{other:?}"),
    }
    // Files through the control port, without a process: 8 MiB of random
    // bytes in and back out, the same.
    let local = dir.path().join("random.bin");
    let data: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&local, &data).unwrap();
    let remote = allox_ctl::files::Remote::parse("a/s:random.bin").unwrap();
    let t = Instant::now();
    allox_ctl::files::upload(&mut c, &local, &remote).unwrap();
    let back = dir.path().join("back.bin");
    allox_ctl::files::download(&mut c, &remote, &back).unwrap();
    eprintln!(
        "8 MiB in and out through the control port in {:?}",
        t.elapsed()
    );
    assert!(
        std::fs::read(&back).unwrap() == data,
        "the file came back changed"
    );
    assert_eq!(
        sh(&mut c, "a", "s", "wc -c < random.bin; rm random.bin").trim(),
        "8388608"
    );
    ok(&mut c, ck("a", "s", "c1"));
    sh(&mut c, "a", "s", "echo two > f; echo new > g");
    match ok(
        &mut c,
        Request::CheckpointDiff(CheckpointDiff {
            agent_id: "a".into(),
            session_id: "s".into(),
            from: "c1".into(),
            to: "current".into(),
            patch: false,
        }),
    ) {
        Response::Diff(d) => assert_eq!((d.added, d.modified, d.deleted), (1, 1, 0), "{d:?}"),
        other => panic!("{other:?}"),
    }
    ok(
        &mut c,
        Request::SessionRollback(SessionRollback {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c1".into(),
            kill_processes: None,
        }),
    );
    assert_eq!(sh(&mut c, "a", "s", "cat f; ls"), "one\nf\n");
    // `alloxctl exec -t` through the control port, which takes one host
    // connection at a time: its keys go out on the request's connection
    // (here from a pipe, so they are passed on as they are, and the end
    // of the pipe types end-of-file).
    drop(c);
    let mut child = Command::new(allox_integration::workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(&vm.socket)
        .args([
            "exec",
            "-t",
            "--timeout-ms",
            "60000",
            "a",
            "s",
            "--",
            "/bin/sh",
            "-c",
        ])
        .arg("stty -echo; read x; echo got=$x; cat; echo eof-typed")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"over the port\nmore\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    assert!(out.status.success(), "{text}");
    assert!(text.contains("got=over the port\n"), "{text}");
    assert!(text.contains("more\neof-typed"), "{text}");
    let (mut c, _) = vm.connect(BOOT);
    // A process left running is killed by the shutdown, in order.
    start(&mut c, "a", "s", "sleep 600");
    match ok(&mut c, Request::Shutdown(Shutdown {})) {
        Response::Stopping(s) => assert!(s.power_off),
        other => panic!("{other:?}"),
    }
    let st = vm.wait_exit(Duration::from_secs(60));
    let console = vm.console();
    assert!(
        st.is_some(),
        "QEMU still running after system.shutdown; console:\n{console}"
    );
    assert!(console.contains("store unmounted"), "{console}");
    assert!(!console.contains("Kernel panic"), "{console}");
    assert_eq!(json_logs_wrong(&console), None, "{console}");
    drop(vm);
    let (pending, cks) = inspect_store(&store);
    assert_eq!(
        pending, 0,
        "the journal has incomplete operations after a clean shutdown"
    );
    assert_eq!(cks, ["c1"]);
}

#[test]
fn guest_a_host_is_welcomed_before_the_store_opens_and_one_that_reconnects_mid_frame_gets_a_clean_session(
) {
    let Some(img) = require_vm("vm::a_host_is_welcomed_before_the_store_opens") else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = store_image(dir.path(), true);
    // The supervisor waits 4 s between the store's mount and its opening:
    // the control port answers Hello meanwhile, and a request sent then
    // waits for the store rather than failing.
    let mut vm = Vm::boot(
        &img,
        Some(&store),
        &["allox.failpoints=daemon.before_store_open=delay:4000"],
    );
    let (mut c, _) = vm.connect(BOOT);
    let welcomed = vm.console();
    assert!(
        !welcomed.contains("supervisor ready"),
        "the Welcome waited for the store to open; console:\n{welcomed}"
    );
    ok(&mut c, agent("a"));
    let answered = vm.console();
    assert!(
        answered.contains("failpoint reached"),
        "the supervisor never waited before opening its store; console:\n{answered}"
    );
    drop(c);
    // A raw host: Hello, then half of an agent.create, then gone.
    for cut in [3usize, 9] {
        let mut raw = UnixStream::connect(&vm.socket).unwrap();
        raw.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut hello = vec![0u8];
        hello.extend(encode(&ClientFrame::Hello(Hello::new(1))).unwrap());
        raw.write_all(&hello).unwrap();
        let mut got = [0u8; 512];
        let n = raw.read(&mut got).unwrap();
        assert!(n > 0, "no answer to Hello");
        let frame = encode(&ClientFrame::Request(RequestEnvelope {
            conversation: 1,
            request_id: 7,
            request: agent("torn"),
        }))
        .unwrap();
        raw.write_all(&frame[..cut.min(frame.len() - 2)]).unwrap();
        drop(raw);
        // The next host sees a clean conversation.
        let (mut c, _) = vm.connect(Duration::from_secs(30));
        match ok(&mut c, Request::AgentList(AgentList {})) {
            Response::Agents(l) => {
                let names: Vec<_> = l.agents.iter().map(|a| a.agent_id.as_str()).collect();
                assert_eq!(names, ["a"], "a torn request was applied");
            }
            other => panic!("{other:?}"),
        }
        ok(&mut c, Request::Ping(Ping {}));
    }
}

/// A raw host on the serial port: a zero byte and Hello for
/// `conversation`; returns once its Welcome came, with every frame read.
fn raw_host(vm: &Vm, conversation: u64) -> (UnixStream, FrameReader) {
    let mut raw = UnixStream::connect(&vm.socket).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut hello = vec![0u8];
    hello.extend(encode(&ClientFrame::Hello(Hello::new(conversation))).unwrap());
    raw.write_all(&hello).unwrap();
    let mut r = FrameReader::new();
    let mut buf = [0u8; 4096];
    loop {
        while let Some(f) = r.next_frame() {
            let Ok(p) = f else { continue };
            if let Ok(ServerFrame::Welcome(h)) = decode::<ServerFrame>(&p) {
                if h.conversation == conversation {
                    return (raw, r);
                }
            }
        }
        let n = raw.read(&mut buf).expect("a Welcome in 30 s");
        assert!(n > 0, "the port closed before the Welcome");
        r.push(&buf[..n]);
    }
}

#[test]
fn guest_an_answer_never_reaches_a_host_that_did_not_ask() {
    let Some(img) = require_vm("vm::an_answer_never_reaches_a_host_that_did_not_ask") else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = store_image(dir.path(), true);
    let mut vm = Vm::boot(&img, Some(&store), &[]);
    let (mut c, _) = vm.connect(BOOT);
    ok(&mut c, agent("a"));
    ok(&mut c, session("a", "s"));
    drop(c);
    let slow = |conversation, script: &str| {
        encode(&ClientFrame::Request(RequestEnvelope {
            conversation,
            request_id: 1000,
            request: run("a", "s", script, true),
        }))
        .unwrap()
    };
    // Host A asks for something slow and goes away before the answer.
    let (mut a, _) = raw_host(&vm, 111);
    a.write_all(&slow(111, "sleep 3; echo from-A")).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    drop(a);
    // Host B comes next, with the same request id in flight.
    let (mut b, mut r) = raw_host(&vm, 222);
    b.write_all(&slow(222, "echo from-B")).unwrap();
    b.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut frames = Vec::new();
    let mut buf = [0u8; 4096];
    let t0 = Instant::now();
    // Long enough for host A's run to end and its answer to be made.
    while t0.elapsed() < Duration::from_secs(8) {
        match b.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => r.push(&buf[..n]),
            Err(_) => {}
        }
        while let Some(f) = r.next_frame() {
            if let Ok(p) = f {
                frames.push(decode::<ServerFrame>(&p).expect("a server frame"));
            }
        }
    }
    let mut answers = Vec::new();
    for f in &frames {
        match f {
            ServerFrame::Response(x) => {
                assert_eq!(
                    x.conversation, 222,
                    "host B got another host's answer: {x:?}"
                );
                answers.push(x.clone());
            }
            ServerFrame::Event(e) => {
                assert_eq!(
                    e.conversation, 222,
                    "host B got another host's event: {e:?}"
                )
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(answers.len(), 1, "{answers:?}");
    match &answers[0].outcome {
        Outcome::Ok(Response::Exited(x)) => assert_eq!(x.stdout, "from-B\n", "{x:?}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn guest_a_killed_supervisor_is_restarted_with_sessions_runs_and_no_zombies() {
    let Some(img) = require_vm("vm::a_killed_supervisor_is_restarted") else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = store_image(dir.path(), true);
    // The first supervisor kills itself (SIGKILL) in the middle of its
    // first checkpoint.create after the snapshot: a crash mid-operation.
    let mut vm = Vm::boot(
        &img,
        Some(&store),
        &["allox.failpoints=checkpoint_create.after_snapshot"],
    );
    let (mut c, _) = vm.connect(BOOT);
    ok(&mut c, agent("a"));
    ok(&mut c, session("a", "s"));
    sh(&mut c, "a", "s", "echo kept > f");
    let long = start(&mut c, "a", "s", "sleep 600");
    // 100 runs whose sandbox inits outlive the supervisor: when it dies
    // they are PID 1's orphans, and PID 1 must reap them.
    for _ in 0..100 {
        start(&mut c, "a", "s", "sleep 3");
    }
    let before = info(&mut c);
    let err = c.call(ck("a", "s", "c1")).expect("an answer");
    let e = err.expect_err("the supervisor died mid-request");
    assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
    drop(c);
    let (mut c, _) = vm.connect(Duration::from_secs(30));
    let after = info(&mut c);
    assert_ne!(after.supervisor_pid, before.supervisor_pid, "not restarted");
    // The session and its files are there; the interrupted checkpoint was
    // finished or undone by recovery, never left half-made.
    assert_eq!(sh(&mut c, "a", "s", "cat f"), "kept\n");
    match ok(
        &mut c,
        Request::CheckpointList(SessionRef {
            agent_id: "a".into(),
            session_id: "s".into(),
        }),
    ) {
        Response::Checkpoints(l) => {
            let ids: Vec<_> = l
                .checkpoints
                .iter()
                .map(|c| c.checkpoint_id.as_str())
                .collect();
            assert!(ids.is_empty() || ids == ["c1"], "{ids:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        processes(&mut c, "a", "s")
            .iter()
            .any(|p| p.run_id.as_deref() == Some(long.as_str())),
        "the run started before the restart is not listed"
    );
    // The short runs end; nothing stays a zombie under PID 1.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let i = info(&mut c);
        let left = processes(&mut c, "a", "s").len();
        if i.init_zombies == 0 && left == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} zombies under PID 1, {left} processes in the session",
            i.init_zombies
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Killing still works through the cgroup, for a run of the old supervisor.
    match ok(
        &mut c,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: None,
            signal: None,
        }),
    ) {
        Response::Killed(k) => assert!(k.killed >= 1, "{k:?}"),
        other => panic!("{other:?}"),
    }
    assert!(processes(&mut c, "a", "s").is_empty());
    let _ = c.call(Request::Shutdown(Shutdown {}));
    assert!(vm.wait_exit(Duration::from_secs(60)).is_some());
}

#[test]
fn guest_a_fork_bomb_and_a_memory_hog_stay_in_their_session() {
    let Some(img) = require_vm("vm::a_fork_bomb_and_a_memory_hog_stay_in_their_session") else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = store_image(dir.path(), true);
    let mut vm = Vm::boot(&img, Some(&store), &[]);
    let (mut c, _) = vm.connect(BOOT);
    let before = info(&mut c);
    ok(&mut c, agent("a"));
    ok(&mut c, session("a", "bad"));
    ok(&mut c, session("a", "good"));
    // Ctrl-Alt-Del is a signal to PID 1, not an instant reboot.
    assert_eq!(
        sh(&mut c, "a", "good", "cat /proc/sys/kernel/ctrl-alt-del"),
        "0\n"
    );
    // One session forks without end and doubles a string without end.
    start(&mut c, "a", "bad", "f() { f | f & }; f");
    start(
        &mut c,
        "a",
        "bad",
        "awk 'BEGIN { s = \"0123456789abcdef\"; while (1) s = s s }'",
    );
    // Meanwhile the other session keeps running commands and the control
    // port keeps answering.
    let t0 = Instant::now();
    let mut rounds = 0;
    let mut worst = Duration::ZERO;
    while t0.elapsed() < Duration::from_secs(20) {
        let t = Instant::now();
        assert_eq!(sh(&mut c, "a", "good", "echo ok"), "ok\n");
        ok(&mut c, Request::Ping(Ping {}));
        worst = worst.max(t.elapsed());
        rounds += 1;
    }
    let bad = processes(&mut c, "a", "bad").len();
    eprintln!(
        "{rounds} commands in the other session, the slowest {worst:?}; the bomb holds {bad} processes"
    );
    assert!(
        bad <= 1024,
        "the fork bomb has {bad} processes, past its session's pids.max"
    );
    let after = info(&mut c);
    assert_eq!(
        after.supervisor_pid, before.supervisor_pid,
        "the supervisor was killed or restarted"
    );
    match ok(
        &mut c,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "bad".into(),
            run_id: None,
            signal: None,
        }),
    ) {
        Response::Killed(_) => {}
        other => panic!("{other:?}"),
    }
    assert!(processes(&mut c, "a", "bad").is_empty());
    assert_eq!(sh(&mut c, "a", "good", "echo still"), "still\n");
    let _ = c.call(Request::Shutdown(Shutdown {}));
    assert!(vm.wait_exit(Duration::from_secs(60)).is_some());
    let console = vm.console();
    assert!(!console.contains("Kernel panic"), "{console}");
}

/// Boots with a store that cannot be used and expects `message` on the
/// console, then a clean power-off (QEMU ends) and no kernel panic.
fn refuses(store: Option<&Path>, settings: &[&str], message: &str) {
    let img = allox_integration::vm::guest_image().unwrap();
    let mut vm = Vm::boot(&img, store, settings);
    let st = vm.wait_exit(Duration::from_secs(90));
    let console = vm.console();
    assert!(st.is_some(), "QEMU still running; console:\n{console}");
    assert!(
        console.contains(message),
        "no {message:?} on the console:\n{console}"
    );
    assert!(console.contains("powering off"), "{console}");
    assert!(!console.contains("Kernel panic"), "{console}");
}

#[test]
fn guest_a_missing_blank_foreign_or_damaged_store_gives_a_clear_message_and_powers_off() {
    if require_vm("vm::a_missing_blank_foreign_or_damaged_store").is_none() {
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    refuses(None, &[], "the store device /dev/vda does not exist");
    let blank = store_image(dir.path(), false);
    refuses(Some(&blank), &[], "is blank; boot with allox.format=1");
    // Not blank, not Btrfs: never formatted over.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&blank)
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"someone else's data", 4096).unwrap();
    drop(f);
    refuses(
        Some(&blank),
        &["allox.format=1"],
        "holds no Btrfs filesystem",
    );
    // A Btrfs superblock over damaged trees: the mount fails.
    std::fs::remove_file(&blank).unwrap();
    let damaged = store_image(dir.path(), true);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&damaged)
        .unwrap();
    let junk = vec![0xA5u8; 4096];
    // Everything after the superblock's first 0x100 bytes (checksummed).
    std::os::unix::fs::FileExt::write_all_at(&f, &junk[..3000], 0x1_0000 + 0x100).unwrap();
    drop(f);
    refuses(
        Some(&damaged),
        &[],
        "cannot mount the store device /dev/vda",
    );
}

#[test]
fn guest_the_process_tracker_runs_inside_the_vm() {
    let Some(img) = require_vm("vm::the_process_tracker_runs_inside_the_vm") else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = store_image(dir.path(), true);
    let mut vm = Vm::boot(&img, Some(&store), &["allox.args=--process-tracker=ebpf"]);
    let (mut c, _) = vm.connect(BOOT);
    ok(&mut c, agent("a"));
    ok(&mut c, session("a", "s"));
    let out = sh(
        &mut c,
        "a",
        "s",
        "echo hi | cat | wc -c; (sleep 0.1 &); exit 0",
    );
    assert_eq!(out.trim(), "3");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let l = match ok(
            &mut c,
            Request::ProcessEvents(ProcessEvents {
                agent_id: Some("a".into()),
                session_id: Some("s".into()),
                limit: Some(1000),
                ..Default::default()
            }),
        ) {
            Response::ProcessEvents(l) => l,
            other => panic!("{other:?}"),
        };
        let execs: Vec<&str> = l
            .events
            .iter()
            .filter_map(|e| e.filename.as_deref())
            .collect();
        let exits = l
            .events
            .iter()
            .filter(|e| e.kind == ProcessEventKind::Exit)
            .count();
        // busybox runs its applets (cat, wc, sleep) by executing itself
        // again, as /proc/self/exe.
        let applets = execs.iter().filter(|x| **x == "/proc/self/exe").count();
        if execs.contains(&"/bin/sh") && applets >= 3 && exits >= 5 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the tracker in the guest saw {execs:?}, {exits} exits; console:\n{}",
            vm.console()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = c.call(Request::Shutdown(Shutdown {}));
    assert!(vm.wait_exit(Duration::from_secs(60)).is_some());
}

#[test]
fn guest_runs_of_a_session_share_its_network_and_a_run_ends_its_own_turn() {
    let Some(img) = require_vm("vm::runs_of_a_session_share_its_network") else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = store_image(dir.path(), true);
    let mut vm = Vm::boot(
        &img,
        Some(&store),
        &["allox.args=--sandbox-network=isolated,--share-tools"],
    );
    let (mut c, _) = vm.connect(BOOT);
    ok(&mut c, agent("a"));
    let mut auto = SessionCreate::new("a", "s");
    auto.auto_checkpoint = Some(true);
    ok(&mut c, Request::SessionCreate(auto));
    ok(&mut c, session("a", "t"));
    // A server in one run of the session, a client in another: they share
    // the session's loopback (busybox httpd and wget).
    sh(
        &mut c,
        "a",
        "s",
        "mkdir -p www && echo hello-from-s > www/index.html",
    );
    let _server = start(&mut c, "a", "s", "exec httpd -f -p 127.0.0.1:8000 -h www");
    let got = sh(
        &mut c,
        "a",
        "s",
        "for i in $(seq 100); do wget -q -O - http://127.0.0.1:8000/index.html && exit 0; \
         sleep 0.1; done; exit 1",
    );
    assert_eq!(got.trim(), "hello-from-s", "console:\n{}", vm.console());
    // Another session's loopback is its own: nothing listens there (busybox
    // wget's -T crashes on a refused connection, so none is given).
    match ok(
        &mut c,
        run("a", "t", "wget -O - http://127.0.0.1:8000/index.html", true),
    ) {
        Response::Exited(x) => assert!(
            x.exit_code == Some(1) && x.stderr.contains("Connection refused"),
            "session t reached s, or failed otherwise: {x:?}"
        ),
        other => panic!("{other:?}"),
    }
    // A program in the sandbox begins and ends its own turn through the
    // in-sandbox interface; the host sees the turn's checkpoint.
    let out = sh(
        &mut c,
        "a",
        "s",
        "set -e; allox whoami; allox turn begin; echo done > result.txt; \
         allox turn end --label 'from inside the VM'",
    );
    assert!(out.contains("turn turn-1 ended ok"), "{out}");
    let l = match ok(
        &mut c,
        Request::CheckpointList(SessionRef {
            agent_id: "a".into(),
            session_id: "s".into(),
        }),
    ) {
        Response::Checkpoints(l) => l,
        other => panic!("{other:?}"),
    };
    assert!(
        l.checkpoints
            .iter()
            .any(|k| k.origin == Origin::Turn && k.label.as_deref() == Some("from inside the VM")),
        "{l:?}"
    );
    // The share plugin in the guest: t offers a report, s (sharing too)
    // reads it by name and may not write it.
    sh(
        &mut c,
        "a",
        "t",
        "echo report-from-t > report.txt && allox share enable",
    );
    let got = sh(
        &mut c,
        "a",
        "s",
        "allox share enable >/dev/null && allox share read a/t report.txt && \
         ! echo x | allox share write a/t report.txt",
    );
    assert_eq!(got, "report-from-t\n");
}

#[test]
fn a_proxy_session_in_the_guest_reaches_the_host_only_through_the_broker() {
    use std::sync::atomic::Ordering;
    let Some(img) = require_vm("vm::a_proxy_session_in_the_guest_reaches_the_host") else {
        return;
    };
    let (server, seen) = allox_integration::hello_server();
    let port = server.port();
    // QEMU's user networking, restricted: the guest reaches 10.0.2.100:80,
    // which is the host's 127.0.0.1:<port>, and nothing else.
    let forward = format!("10.0.2.100:80={port}");
    // And 10.0.2.101:80, a server that checks a secret's header.
    let (auth, auth_heads) = secret_checking_server();
    let forward_auth = format!("10.0.2.101:80={}", auth.port());
    // Booted by the VM manager, whose forwards `alloxctl vm relay` carries.
    let vms = manager::Vms::new(None);
    vms.create_with(
        &img,
        "p",
        &[
            "--net-user",
            "--forward",
            &forward,
            "--forward",
            &forward_auth,
            "allox.args=--plugin=network,--session-network=proxy,--network-allow=10.0.2.100:80,--network-allow=10.0.2.101:80",
        ],
    );
    vms.vm(&["start", "p"]);
    let console = || std::fs::read_to_string(vms.paths("p").console()).unwrap_or_default();
    let mut c = vms.client("p");
    assert!(
        console().contains("network: eth0 10.0.2.15/24 via 10.0.2.2"),
        "console:\n{}",
        console()
    );
    ok(&mut c, agent("a"));
    ok(&mut c, session("a", "s"));
    // Through the session's proxy (busybox wget reads http_proxy).
    let got = sh(&mut c, "a", "s", "wget -q -O - http://10.0.2.100/hello");
    assert_eq!(got, "hello /hello\n", "console:\n{}", console());
    // A raw connection, as SSH would make it.
    let got = sh(
        &mut c,
        "a",
        "s",
        "printf 'GET /raw HTTP/1.0\\r\\n\\r\\n' | allox net connect 10.0.2.100 80",
    );
    assert!(got.ends_with("hello /raw\n"), "{got}");
    // Not allowed: the proxy's 403, no connection made.
    match ok(
        &mut c,
        run("a", "s", "wget -q -O - http://10.0.2.100:8080/no", true),
    ) {
        Response::Exited(x) => assert!(x.exit_code == Some(1) && x.stderr.contains("403"), "{x:?}"),
        other => panic!("{other:?}"),
    }
    // Around the proxy: the session has no route out.
    match ok(
        &mut c,
        run(
            "a",
            "s",
            "wget -q -Y off -O - http://10.0.2.100/direct",
            true,
        ),
    ) {
        Response::Exited(x) => assert!(
            x.exit_code == Some(1) && x.stderr.contains("unreachable"),
            "{x:?}"
        ),
        other => panic!("{other:?}"),
    }
    // The host's server saw the two allowed connections and no other.
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    // An attempt is recorded when its relay is over, which QEMU's user
    // networking can take a moment to report after the server closed.
    let deadline = Instant::now() + Duration::from_secs(20);
    let records = loop {
        let records = match ok(
            &mut c,
            Request::NetworkAudit(NetworkAudit {
                agent_id: Some("a".into()),
                ..NetworkAudit::default()
            }),
        ) {
            Response::NetworkAudit(l) => l.records,
            other => panic!("{other:?}"),
        };
        let closed = records.iter().filter(|r| r.allowed && !r.open).count();
        if (closed >= 2 && records.iter().any(|r| !r.allowed)) || Instant::now() > deadline {
            break records;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // Each allowed connection's record as it opened, and as it closed.
    let allowed: Vec<_> = records.iter().filter(|r| r.allowed && !r.open).collect();
    assert_eq!(allowed.len(), 2, "{records:?}");
    assert_eq!(records.iter().filter(|r| r.open).count(), 2, "{records:?}");
    assert!(
        allowed
            .iter()
            .all(|r| r.address.as_deref() == Some("10.0.2.100:80") && r.run_id.is_some()),
        "{records:?}"
    );
    assert!(
        records.iter().any(|r| !r.allowed && r.port == 8080),
        "{records:?}"
    );
    // A secret, put in by the guest's broker on the guest's uplink: the
    // run holds the placeholder, the host's server gets the value.
    let set = match ok(
        &mut c,
        Request::SecretSet(SecretSet {
            agent_id: "a".into(),
            session_id: None,
            name: "API_KEY".into(),
            value: SecretValue(VM_SECRET.into()),
            hosts: vec!["10.0.2.101:80".into()],
            header: Some("Authorization: Bearer {}".into()),
            query: None,
            intercept: false,
        }),
    ) {
        Response::Secret(i) => i,
        other => panic!("{other:?}"),
    };
    let got = sh(
        &mut c,
        "a",
        "s",
        "echo \"$API_KEY\"; wget -q -O - http://10.0.2.101/with-the-secret",
    );
    assert_eq!(got, format!("{}\nauth=ok\n", set.placeholder));
    assert!(
        auth_heads
            .lock()
            .unwrap()
            .iter()
            .any(|h| h.contains(&format!("Bearer {VM_SECRET}"))),
        "the host's server never got the value"
    );
    drop(c);
    vms.vm(&["stop", "p"]);
}

/// The value of the secret the guest's broker puts in.
const VM_SECRET: &str = "vm-secret-value-0f1e2d3c4b5a";

/// A server on the host's loopback answering `auth=ok` to a request whose
/// `Authorization` is `Bearer VM_SECRET` (`auth=no` otherwise), and
/// keeping every request head.
fn secret_checking_server() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = heads.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = Vec::new();
            let mut b = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&b[..n]),
                }
            }
            let head = String::from_utf8_lossy(&buf).into_owned();
            let ok = head
                .lines()
                .any(|l| l.eq_ignore_ascii_case(&format!("authorization: Bearer {VM_SECRET}")));
            let body = if ok { "auth=ok\n" } else { "auth=no\n" };
            kept.lock().unwrap().push(head);
            let _ = write!(
                s,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (addr, heads)
}

/// What a run used, in the guest (pure cgroup v2 with every controller):
/// an OOM kill told from the cgroup's events, not from the signal; a
/// `kill -9` that is none; a live session's `pids.max` lowered so that its
/// next fork fails.
/// Agent `a` with sessions `small` (`memory.max` 64 MiB) and `p`; a run
/// in `small` that doubles a string until it is stopped, waited for.
fn memory_hog_in_a_small_session(c: &mut Client) -> RunResult {
    ok(c, agent("a"));
    let mut small = SessionCreate::new("a", "small");
    small.memory_max = Some(64 << 20);
    ok(c, Request::SessionCreate(small));
    ok(c, session("a", "p"));
    let script = "awk 'BEGIN { s = \"0123456789abcdef\"; while (1) s = s s }'";
    match ok(c, run("a", "small", script, true)) {
        Response::Exited(x) => x,
        other => panic!("{other:?}"),
    }
}

/// A live run of `a`/`s` that forks five times after 2 s, while the
/// session's `pids.max` drops to what it holds (its init, sh, sleep): the
/// forks fail.
fn lowered_pids_max_stops_the_next_fork(c: &mut Client, a: &str, s: &str) {
    let exited = |r: Response| match r {
        Response::Exited(x) => x,
        other => panic!("{other:?}"),
    };
    // A live run that forks five times after 2 s; meanwhile the session's
    // pids.max drops to what it holds (its init, sh, sleep).
    let id = start(
        c,
        a,
        s,
        "sleep 2; for i in 1 2 3 4 5; do sleep 0 & done; wait; echo forked",
    );
    ok(
        c,
        Request::SessionUpdate(SessionUpdate {
            agent_id: a.into(),
            session_id: s.into(),
            pids_max: Some(3),
            ..SessionUpdate::default()
        }),
    );
    // A run started meanwhile meets the limit, and is told so: refused
    // `unavailable`, or ended 126, naming the session's pids.max (it was
    // `internal` naming a clone3, or 126 naming a fork alone).
    let said = match c.call(run(a, s, "true", true)).expect("transport") {
        Err(e) => {
            assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
            e.message
        }
        Ok(Response::Exited(r)) => {
            assert_eq!(r.exit_code, Some(126), "{r:?}");
            r.stderr
        }
        Ok(other) => panic!("{other:?}"),
    };
    assert!(
        said.contains(&format!("session {a}/{s} is at its pids.max (3 processes)")),
        "{said}"
    );
    let forks = exited(ok(
        c,
        Request::ProcessWait(ProcessWait {
            agent_id: a.into(),
            session_id: s.into(),
            run_id: id,
            timeout_ms: Some(30_000),
        }),
    ));
    assert!(
        forks.stderr.contains("fork") && forks.stderr.contains("Resource temporarily unavailable")
            || forks.stderr.contains("can't fork"),
        "the forks past pids.max did not fail: {forks:?}"
    );
}

#[test]
fn guest_runs_report_oom_kills_and_a_live_session_takes_a_lower_pids_max() {
    let Some(img) =
        require_vm("vm::runs_report_oom_kills_and_a_live_session_takes_a_lower_pids_max")
    else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = store_image(dir.path(), true);
    let mut vm = Vm::boot(&img, Some(&store), &[]);
    let (mut c, _) = vm.connect(BOOT);
    // A memory hog under memory.max: killed by the OOM killer, and told so.
    let hog = memory_hog_in_a_small_session(&mut c);
    let exited = |r: Response| match r {
        Response::Exited(x) => x,
        other => panic!("{other:?}"),
    };
    assert_eq!(hog.oom_killed, Some(true), "{hog:?}");
    let u = hog.usage.clone().unwrap();
    // (memory.peak may pass memory.max by what was charged before the
    // kernel reclaimed or killed.)
    assert!(
        u.memory_peak_bytes
            .is_some_and(|p| p > 32 << 20 && p <= 65 << 20),
        "{u:?}"
    );
    assert!(u.oom_kills.is_some_and(|n| n >= 1), "{u:?}");
    // A run killed with SIGKILL by the host: not an OOM kill.
    let id = start(&mut c, "a", "small", "exec sleep 60");
    ok(
        &mut c,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "small".into(),
            run_id: Some(id.clone()),
            signal: Some(9),
        }),
    );
    let killed = exited(ok(
        &mut c,
        Request::ProcessWait(ProcessWait {
            agent_id: "a".into(),
            session_id: "small".into(),
            run_id: id,
            timeout_ms: Some(10_000),
        }),
    ));
    assert_eq!(
        (killed.signal, killed.oom_killed),
        (Some(9), Some(false)),
        "{killed:?}"
    );
    let st = match ok(
        &mut c,
        Request::SessionStats(SessionStatsRequest {
            agent_id: "a".into(),
            session_id: "small".into(),
        }),
    ) {
        Response::SessionStats(s) => s,
        other => panic!("{other:?}"),
    };
    assert!(st.total.oom_kills.is_some_and(|n| n >= 1), "{st:?}");
    assert_eq!(st.limits.memory_max, Some(64 << 20), "{st:?}");
    lowered_pids_max_stops_the_next_fork(&mut c, "a", "p");
    a_session_with_a_run_going_on_forks_with_its_limits(&mut c);
    let _ = c.call(Request::Shutdown(Shutdown {}));
    assert!(vm.wait_exit(Duration::from_secs(60)).is_some());
}

/// `session.fork` in the guest (pure cgroup v2) of a session whose run
/// goes on writing: the fork has the source's memory limit and what the
/// run had written, runs in a tree of its own, and the run is not copied;
/// the session paused stops writing and goes on when resumed (by a start
/// or by `session.resume`).
fn a_session_with_a_run_going_on_forks_with_its_limits(c: &mut Client) {
    let writer = start(
        c,
        "a",
        "small",
        "i=0; while :; do echo $i >> log; i=$((i+1)); sleep 0.02; done",
    );
    // Forked once the run has written.
    sh(c, "a", "small", "while [ ! -s log ]; do sleep 0.02; done");
    let fork = |c: &mut Client, from: &str, to: &str| match ok(
        c,
        Request::SessionFork(SessionFork {
            agent_id: "a".into(),
            session_id: "small".into(),
            from: from.into(),
            new_agent_id: None,
            new_session_id: to.into(),
            label: None,
        }),
    ) {
        Response::Session(s) => s,
        other => panic!("{other:?}"),
    };
    let f = fork(c, "current", "small-fork");
    assert_eq!(f.head.as_deref(), Some(FORK_BASELINE), "{f:?}");
    let stats = |c: &mut Client, s: &str| match ok(
        c,
        Request::SessionStats(SessionStatsRequest {
            agent_id: "a".into(),
            session_id: s.into(),
        }),
    ) {
        Response::SessionStats(s) => s,
        other => panic!("{other:?}"),
    };
    assert_eq!(stats(c, "small-fork").limits.memory_max, Some(64 << 20));
    // No process of the source's came along.
    match ok(
        c,
        Request::ProcessList(SessionRef {
            agent_id: "a".into(),
            session_id: "small-fork".into(),
        }),
    ) {
        Response::Processes(p) => assert!(p.processes.is_empty(), "{p:?}"),
        other => panic!("{other:?}"),
    }
    // The fork's log stops where the fork was taken; the source's goes on.
    let lines =
        |c: &mut Client, s: &str| -> usize { sh(c, "a", s, "wc -l < log").trim().parse().unwrap() };
    let at_fork = lines(c, "small-fork");
    assert!(at_fork >= 1);
    sh(
        c,
        "a",
        "small",
        &format!(
            "while [ $(wc -l < log) -le {} ]; do sleep 0.02; done",
            at_fork + 5
        ),
    );
    assert_eq!(lines(c, "small-fork"), at_fork);
    sh(c, "a", "small-fork", "echo mine > only-here");
    assert_eq!(sh(c, "a", "small", "ls only-here 2>/dev/null; true"), "");
    // Paused with the run going on: the log stops; the next start resumes.
    let pause = |c: &mut Client| match ok(
        c,
        Request::SessionPause(SessionPause {
            agent_id: "a".into(),
            session_id: "small".into(),
            hold: false,
        }),
    ) {
        Response::Session(s) => assert!(s.paused.is_some(), "{s:?}"),
        other => panic!("{other:?}"),
    };
    pause(c);
    let size = |c: &mut Client| match ok(
        c,
        Request::FsStat(FsStat {
            agent_id: "a".into(),
            session_id: "small".into(),
            scope: FsScope::Session,
            checkpoint_id: None,
            path: "log".into(),
        }),
    ) {
        Response::FsEntry(e) => e.size,
        other => panic!("{other:?}"),
    };
    let frozen_at = size(c);
    // (fs.stat reads; it leaves the session paused.)
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(size(c), frozen_at, "a paused session wrote");
    let at = lines(c, "small");
    sh(
        c,
        "a",
        "small",
        &format!(
            "while [ $(wc -l < log) -le {} ]; do sleep 0.02; done",
            at + 3
        ),
    );
    // And with session.resume.
    pause(c);
    ok(
        c,
        Request::SessionResume(SessionRef {
            agent_id: "a".into(),
            session_id: "small".into(),
        }),
    );
    let grown = size(c);
    let t = Instant::now();
    while size(c) == grown {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the run did not go on after resume"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // From a checkpoint too, while the run goes on.
    ok(c, ck("a", "small", "mid"));
    let g = fork(c, "mid", "small-fork-2");
    assert_eq!(g.checkpoints, 1);
    assert!(lines(c, "small-fork-2") >= at_fork);
    ok(
        c,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "small".into(),
            run_id: Some(writer),
            signal: Some(9),
        }),
    );
}

#[test]
fn guest_spans_from_a_sandbox_and_traced_runs_reach_the_monitor_with_the_guest_s_memory_figures() {
    let Some(img) = require_vm(
        "vm::guest_spans_from_a_sandbox_and_traced_runs_reach_the_monitor_with_the_guest_s_memory_figures",
    ) else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = store_image(dir.path(), true);
    let mut vm = Vm::boot(&img, Some(&store), &["allox.args=--plugin=monitor"]);
    let (mut c, _) = vm.connect(BOOT);
    ok(&mut c, agent("a"));
    ok(&mut c, session("a", "s"));
    ok(&mut c, session("a", "t"));
    // A run under a tool call's span; inside, it continues the trace from
    // TRACEPARENT and sends a span of its own, claiming another session.
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut traced = run(
        "a",
        "s",
        "set -e; tp=$TRACEPARENT; t=${tp#00-}; t=${t%%-*}; p=${tp#00-*-}; p=${p%-*}; \
         head -c 8388608 /dev/zero | cat > /dev/null; \
         allox call monitor.spans \"{\\\"agent_id\\\":\\\"a\\\",\\\"session_id\\\":\\\"t\\\",\\\"spans\\\":[{\\\"trace_id\\\":\\\"$t\\\",\\\"span_id\\\":\\\"b000000000000001\\\",\\\"parent_span_id\\\":\\\"$p\\\",\\\"name\\\":\\\"inner\\\",\\\"operation\\\":\\\"other\\\",\\\"start_unix_nano\\\":1,\\\"end_unix_nano\\\":2}]}\"",
        true,
    );
    let Request::ProcessStart(p) = &mut traced else {
        unreachable!()
    };
    p.trace = Some(Box::new(TraceContext {
        trace_id: trace.into(),
        span_id: "a000000000000003".into(),
    }));
    let r = match ok(&mut c, traced) {
        Response::Exited(x) => x,
        other => panic!("{other:?}"),
    };
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let records = |c: &mut Client, s: &str| match ok(
        c,
        Request::MonitorRecords(MonitorRecords {
            agent_id: Some("a".into()),
            session_id: Some(s.into()),
            ..MonitorRecords::default()
        }),
    ) {
        Response::MonitorRecords(l) => l.records,
        other => panic!("{other:?}"),
    };
    let mine = records(&mut c, "s");
    assert_eq!(mine.len(), 2, "{mine:?}");
    let MonitorBody::Span(sp) = &mine[0].body else {
        panic!("{mine:?}")
    };
    assert_eq!(mine[0].source, format!("run:{}", r.run_id));
    assert_eq!(
        (sp.trace_id.as_str(), sp.parent_span_id.as_deref()),
        (trace, Some("a000000000000003")),
        "the run did not continue its trace: {sp:?}"
    );
    let MonitorBody::Run(run_rec) = &mine[1].body else {
        panic!("{mine:?}")
    };
    assert_eq!(run_rec.run_id, r.run_id);
    assert_eq!(
        run_rec.trace.as_ref().map(|t| t.span_id.as_str()),
        Some("a000000000000003")
    );
    // The guest has the memory controller: the peak is known.
    let peak = run_rec.usage.as_ref().and_then(|u| u.memory_peak_bytes);
    assert!(peak.is_some_and(|p| p > 0), "{run_rec:?}");
    assert!(records(&mut c, "t").is_empty());
    // The tool call's span, sent from the host; the summary puts the run
    // and its memory under it.
    ok(
        &mut c,
        Request::MonitorIngest(MonitorIngest {
            agent_id: "a".into(),
            session_id: "s".into(),
            spans: vec![Span {
                trace_id: trace.into(),
                span_id: "a000000000000003".into(),
                parent_span_id: None,
                name: "execute_tool bash".into(),
                operation: SpanOperation::ExecuteTool,
                start_unix_nano: run_rec.start_unix_nano,
                end_unix_nano: run_rec.end_unix_nano,
                tool: Some("bash".into()),
                model: None,
                input_tokens: None,
                output_tokens: None,
                error: None,
                attributes: Default::default(),
            }],
        }),
    );
    let summary = match ok(
        &mut c,
        Request::MonitorSummary(MonitorSummaryRequest {
            agent_id: Some("a".into()),
            session_id: Some("s".into()),
            group_by: GroupBy::Tool,
        }),
    ) {
        Response::MonitorSummary(s) => s,
        other => panic!("{other:?}"),
    };
    assert_eq!(summary.rows.len(), 1, "{summary:?}");
    let row = &summary.rows[0];
    assert_eq!((row.key.as_str(), row.spans, row.runs), ("bash", 1, 1));
    assert_eq!(row.memory_peak_bytes, peak, "{row:?}");
    let _ = c.call(Request::Shutdown(Shutdown {}));
    assert!(vm.wait_exit(Duration::from_secs(60)).is_some());
}

/// Container mode where a Kata guest runs it: a pure cgroup v2 kernel, a
/// runtime that made a pod cgroup with limits, a container cgroup below
/// it, new namespaces and cgroup2 mounted read-write (the test's launcher
/// does what runc or kata-agent would), then `allox-init container` as
/// the container's PID 1.
#[test]
fn guest_container_mode_on_pure_cgroup_v2_moves_to_a_leaf_and_enforces_limits() {
    let test = "vm::guest_container_mode_on_pure_cgroup_v2_moves_to_a_leaf_and_enforces_limits";
    let Some(img) = require_vm(test) else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    // The guest's allox-init, which scripts/build-guest.sh leaves beside
    // the initramfs, and the launcher, into one initramfs.
    let init = img.initrd.with_file_name("allox-init");
    assert!(
        init.is_file(),
        "{} is missing: build the guest with scripts/build-guest.sh",
        init.display()
    );
    let launcher = dir.path().join("allox-pod-launcher");
    let st = Command::new("strip")
        .arg("-o")
        .arg(&launcher)
        .arg(env!("CARGO_BIN_EXE_allox-pod-launcher"))
        .status()
        .unwrap();
    assert!(st.success(), "strip the launcher");
    let initrd = dir.path().join("initrd.img");
    let out = Command::new(allox_integration::container::rootfs_builder())
        .arg("initramfs")
        .arg("--init")
        .arg(&init)
        .arg("--add")
        .arg(format!(
            "{}:/usr/sbin/allox-pod-launcher",
            launcher.display()
        ))
        .args(["--compress", "gzip", "--out"])
        .arg(&initrd)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pod = allox_integration::vm::GuestImage {
        kernel_dir: img.kernel_dir.clone(),
        initrd,
    };
    let store = store_image(dir.path(), true);
    let mut vm = Vm::boot(
        &pod,
        Some(&store),
        &[
            "--append",
            "rdinit=/usr/sbin/allox-pod-launcher allox_pod.args=--store=/dev/vda,\
             --listen=unix:/run/allox/ctl.sock,--listen=virtio:org.allox.ctl,--stop-timeout=10",
        ],
    );
    let (mut c, _) = vm.connect(BOOT);
    let console = vm.console();
    assert!(
        console.contains(
            "cgroup v2: 1 processes moved to /sys/fs/cgroup/allox-init; enabled for the sessions: pids memory cpu"
        ),
        "{console}"
    );
    // memory.max, enabled below the container's cgroup, is enforced.
    let hog = memory_hog_in_a_small_session(&mut c);
    assert_eq!(hog.oom_killed, Some(true), "{hog:?}");
    assert_eq!(sh(&mut c, "a", "p", "echo in the pod"), "in the pod\n");
    // So is pids.max, lowered on a live session.
    lowered_pids_max_stops_the_next_fork(&mut c, "a", "p");
    // system.shutdown ends the container with status 0 (it never reboots:
    // the launcher, the VM's PID 1, reports the exit and powers off).
    let _ = c.call(Request::Shutdown(Shutdown {}));
    assert!(
        vm.wait_exit(Duration::from_secs(60)).is_some(),
        "{}",
        vm.console()
    );
    let console = vm.console();
    assert!(console.contains("store unmounted"), "{console}");
    assert!(
        console.contains("allox-pod-launcher: the container exited (status Some(0))"),
        "{console}"
    );
    // The store, on the host: nothing half done.
    let (pending, _) = inspect_store(&store);
    assert_eq!(pending, 0);
}

/// The system-effects plugin in the guest, with the scope file the image
/// carries (every domain of the machine but `filesystem`).
/// The guest's supervisor killed (by a failpoint of the first supervisor)
/// after an observed run's A is sealed, and after its end's freeze: PID 1
/// starts a new one, which fences the session, keeps its evidence at best
/// INCOMPLETE and refuses its runs. One boot per point (failpoints arm the
/// first supervisor only).
#[test]
fn guest_the_supervisor_killed_in_an_observed_run_leaves_the_session_fenced() {
    let Some(img) =
        require_vm("vm::guest_the_supervisor_killed_in_an_observed_run_leaves_the_session_fenced")
    else {
        return;
    };
    for point in [
        "run_start.after_plugins",
        "run_end.after_freeze",
        "effects_v3.after_fence",
        "rollback.after_exchange",
    ] {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let store = store_image(dir.path(), true);
        let fp = format!("allox.failpoints={point}");
        let mut vm = Vm::boot(&img, Some(&store), &[EFFECTS_ARGS, &fp]);
        let (mut c, _) = vm.connect(BOOT);
        ok(&mut c, agent("a"));
        ok(&mut c, session("a", "s"));
        let before = info(&mut c);
        let wait = point.starts_with("run_end");
        let script = if wait {
            "echo x > f"
        } else {
            "echo x > f; sleep 30"
        };
        let v3 = !point.starts_with("run_");
        let before_run = if v3 {
            sh(&mut c, "a", "s", "echo A > f; cat f")
        } else {
            String::new()
        };
        // The supervisor dies at the point: the call fails or answers.
        let _ = c.call(if v3 {
            v3_run("a", "s", "echo B > f")
        } else {
            run("a", "s", script, wait)
        });
        drop(c);
        let (mut c, _) = vm.connect(Duration::from_secs(60));
        let after = info(&mut c);
        assert_ne!(
            after.supervisor_pid,
            before.supervisor_pid,
            "{point}: the supervisor was not restarted\n{}",
            vm.console()
        );
        let status = match ok(
            &mut c,
            Request::EffectsStatus(EffectsStatusRequest { agent_id: None }),
        ) {
            Response::EffectsStatus(s) => s,
            other => panic!("{point}: {other:?}"),
        };
        let f = status
            .fences
            .iter()
            .find(|f| f.agent_id == "a" && f.session_id == "s")
            .unwrap_or_else(|| panic!("{point}: a/s is not fenced: {status:?}"));
        assert!(f.reason.contains("stopped in the middle"), "{point}: {f:?}");
        let refused = c
            .call(run("a", "s", "true", true))
            .expect("transport")
            .expect_err("a fenced session runs nothing");
        assert_eq!(refused.code, ErrorCode::Unavailable, "{point}: {refused:?}");
        match ok(
            &mut c,
            Request::EffectsGet(EffectsGet {
                agent_id: "a".into(),
                session_id: "s".into(),
                run_id: f.run_id.clone(),
            }),
        ) {
            Response::Effects(e) => {
                assert_eq!(e.verdict, EffectsVerdict::Incomplete, "{point}: {e:?}");
                assert_eq!(e.evidence_root, f.evidence_root, "{point}");
            }
            other => panic!("{point}: {other:?}"),
        }
        // Nothing of the run is left running in the session.
        let left = processes(&mut c, "a", "s");
        assert!(left.is_empty(), "{point}: left {left:?}");
        if v3 {
            // current/ is exactly A (the restore done) or B (not begun),
            // read through the file API; the root unfences it.
            let want = if point == "effects_v3.after_fence" {
                "B\n"
            } else {
                before_run.as_str()
            };
            match ok(
                &mut c,
                Request::FsRead(allox_protocol::FsRead {
                    agent_id: "a".into(),
                    session_id: "s".into(),
                    scope: Default::default(),
                    checkpoint_id: None,
                    path: "f".into(),
                    offset: None,
                    length: None,
                }),
            ) {
                Response::FsData(d) => assert_eq!(d.data.as_ref(), want.as_bytes(), "{point}"),
                other => panic!("{point}: fs.read {other:?}"),
            }
            unfence(&mut c, &f.run_id, &f.evidence_root);
        }
        let _ = c.call(Request::Shutdown(Shutdown {}));
        assert!(
            vm.wait_exit(Duration::from_secs(60)).is_some(),
            "{point}: {}",
            vm.console()
        );
    }
}

const EFFECTS_ARGS: &str =
    "allox.args=--plugin=system-effects,--system-effects-scope=/etc/allox/effects-scope.json";

/// Runs `script` in `a/s` under the plugin and returns its effects.
fn observed(c: &mut Client, a: &str, s: &str, script: &str) -> RunEffects {
    match ok(c, run(a, s, script, true)) {
        Response::Exited(x) => {
            assert_eq!(x.exit_code, Some(0), "{script}: {x:?}");
            *x.effects
                .unwrap_or_else(|| panic!("{script}: run {} has no effects", x.run_id))
        }
        other => panic!("{script}: {other:?}"),
    }
}

fn effects_domain(e: &RunEffects, d: EffectsDomain) -> &DomainEffects {
    e.domains
        .iter()
        .find(|x| x.domain == d)
        .expect("every domain is listed")
}

/// What is wrong with `e` as the effects of the seed's command: CHANGED,
/// `effect.txt` added to `workspace` by the run, every other observed
/// domain CONSISTENT, not fenced.
fn seed_command_wrong(e: &RunEffects) -> Option<String> {
    let ws = effects_domain(e, EffectsDomain::Workspace);
    let listed = ws.changes.iter().any(|c| {
        c.item == "effect.txt"
            && c.kind == EffectChangeKind::Added
            && c.by.by == By::Run
            && c.by.run_id.as_deref() == Some(e.run_id.as_str())
    });
    if !listed || ws.verdict != EffectsVerdict::Changed {
        return Some(format!(
            "workspace does not list effect.txt by the run: {ws:?}"
        ));
    }
    for d in &e.domains {
        if d.domain == EffectsDomain::Workspace || d.verdict == EffectsVerdict::NotObserved {
            continue;
        }
        if d.verdict != EffectsVerdict::Consistent {
            return Some(format!("{} is {:?}: {d:?}", d.domain.as_str(), d.verdict));
        }
    }
    (e.verdict != EffectsVerdict::Changed || e.fenced)
        .then(|| format!("verdict {:?}, fenced {}", e.verdict, e.fenced))
}

/// What is wrong with `e` as the effects of a run that added `item` to
/// domain `d`: listed there, added by that run, the domain and the run
/// CHANGED.
fn added_by_run_wrong(e: &RunEffects, d: EffectsDomain, item: &str) -> Option<String> {
    let dom = effects_domain(e, d);
    let listed = dom.changes.iter().any(|c| {
        c.item == item
            && c.kind == EffectChangeKind::Added
            && c.by.by == By::Run
            && c.by.run_id.as_deref() == Some(e.run_id.as_str())
    });
    if !listed || dom.verdict != EffectsVerdict::Changed {
        return Some(format!(
            "{} does not list {item} by the run: {dom:?}",
            d.as_str()
        ));
    }
    (e.verdict != EffectsVerdict::Changed).then(|| format!("the run's verdict is {:?}", e.verdict))
}

/// A run that left `residue` in its agent's `shared/`.
fn shared_residue_wrong(e: &RunEffects) -> Option<String> {
    added_by_run_wrong(e, EffectsDomain::Shared, "residue")
}

/// A run in whose cgroup the tests' module `dummy` was loaded.
fn module_loaded_wrong(e: &RunEffects) -> Option<String> {
    added_by_run_wrong(e, EffectsDomain::Modules, "module dummy")
}

/// What is wrong with `h` as the history of a run that wrote
/// `effect.txt`: no `open_write` record of it (a record only the BPF LSM
/// hook `file_open` makes).
fn lsm_history_wrong(h: &[HistoryRecord]) -> Option<String> {
    let found = h.iter().any(|r| {
        r.kind == "open_write"
            && r.detail
                .as_deref()
                .is_some_and(|d| d.contains("effect.txt"))
    });
    (!found).then(|| {
        let kinds: std::collections::BTreeSet<&str> = h.iter().map(|r| r.kind.as_str()).collect();
        format!(
            "no open_write of effect.txt in {} records (kinds {kinds:?})",
            h.len()
        )
    })
}

/// What is wrong with `e` as the effects of `/bin/true` under the image's
/// scope: every domain CONSISTENT but `filesystem` (not in the scope:
/// NOT_OBSERVED), and the run too.
fn true_wrong(e: &RunEffects) -> Option<String> {
    for d in &e.domains {
        let want = if d.domain == EffectsDomain::Filesystem {
            EffectsVerdict::NotObserved
        } else {
            EffectsVerdict::Consistent
        };
        if d.verdict != want {
            return Some(format!("{} is {:?}: {d:?}", d.domain.as_str(), d.verdict));
        }
    }
    (e.verdict != EffectsVerdict::Consistent || e.fenced)
        .then(|| format!("verdict {:?}, fenced {}", e.verdict, e.fenced))
}

fn effects_history(c: &mut Client, a: &str, s: &str, run: &str) -> Vec<HistoryRecord> {
    match ok(
        c,
        Request::EffectsHistory(EffectsHistory {
            agent_id: a.into(),
            session_id: s.into(),
            run_id: run.into(),
            cursor: None,
            limit: Some(10_000),
        }),
    ) {
        Response::EffectsHistory(h) => h.records,
        other => panic!("{other:?}"),
    }
}

/// A guest of its own: the plugin is on from boot, and an observed run
/// holds its session alone, which the other tests' concurrent runs would
/// meet.
#[test]
fn guest_system_effects_observe_runs_with_the_bpf_lsm_in_the_vm() {
    let Some(img) = require_vm("vm::guest_system_effects_observe_runs_with_the_bpf_lsm_in_the_vm")
    else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = store_image(dir.path(), true);
    // With a root helper beside the init that a run can ask to load the
    // tests' module from inside its cgroup (the control for `modules`).
    let img = with_escape_helper(&img, dir.path());
    let mut vm = Vm::boot_with(&img, Some(&store), &[EFFECTS_ARGS], Some(ESCAPE_RDINIT));
    let (mut c, t) = vm.connect(BOOT);
    eprintln!("Hello answered {t:?} after QEMU started, with the plugin");
    // The plugin runs with its BPF LSM hooks: the guest kernel's LSM list
    // ends in bpf (kernel/config/effects.config), and the image's observer
    // is the one allox-init pins.
    match ok(
        &mut c,
        Request::EffectsStatus(EffectsStatusRequest { agent_id: None }),
    ) {
        Response::EffectsStatus(s) => {
            assert!(s.lsm_hooks, "the history runs without its LSM hooks: {s:?}");
            assert_eq!(
                s.scope_file.as_deref(),
                Some("/etc/allox/effects-scope.json"),
                "{s:?}"
            );
            for d in [
                EffectsDomain::Bpf,
                EffectsDomain::Sysctl,
                EffectsDomain::Mount,
                EffectsDomain::Network,
                EffectsDomain::Modules,
                EffectsDomain::Processes,
            ] {
                assert!(s.domains.contains(&d), "{} not in scope: {s:?}", d.as_str());
            }
        }
        other => panic!("{other:?}"),
    }
    ok(&mut c, agent("a"));
    ok(&mut c, session("a", "s"));

    let t = Instant::now();
    let truth = observed(&mut c, "a", "s", "/bin/true");
    eprintln!("/bin/true observed in {:?}", t.elapsed());
    assert_eq!(true_wrong(&truth), None, "{truth:#?}");

    let t = Instant::now();
    let seed = observed(&mut c, "a", "s", "printf changed > effect.txt");
    eprintln!("the seed's command observed in {:?}", t.elapsed());
    assert_eq!(seed_command_wrong(&seed), None, "{seed:#?}");
    // Controls: each check fails the other run.
    assert!(seed_command_wrong(&truth).is_some());
    assert!(true_wrong(&seed).is_some());

    // The BPF LSM hooks run in the guest: the write open of effect.txt is
    // in the seed command's history; the run that wrote nothing has none.
    let h = effects_history(&mut c, "a", "s", &seed.run_id);
    assert_eq!(lsm_history_wrong(&h), None);
    assert!(lsm_history_wrong(&effects_history(&mut c, "a", "s", &truth.run_id)).is_some());

    // A residue in the agent's shared/, attributed to the run that left it.
    let residue = observed(
        &mut c,
        "a",
        "s",
        "echo left behind > \"$ALLOX_AGENT_SHARED/residue\"",
    );
    assert_eq!(shared_residue_wrong(&residue), None, "{residue:#?}");
    assert!(shared_residue_wrong(&seed).is_some());
    // What effects.get keeps is what the run was answered.
    match ok(
        &mut c,
        Request::EffectsGet(EffectsGet {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: residue.run_id.clone(),
        }),
    ) {
        Response::Effects(got) => {
            assert_eq!(got.evidence_root, residue.evidence_root);
            assert_eq!(shared_residue_wrong(&got), None);
        }
        other => panic!("{other:?}"),
    }
    // The verifier in the guest, and a verifier built for the host over
    // the guest's export of the same set: the same report bytes. A byte
    // flipped in the export's verdict body is named.
    let root = residue.evidence_root.clone();
    let export = dir.path().join("residue.tar");
    let v = verified_and_exported(&mut c, &residue.run_id, &root, &export);
    let host_verify = |args: &[&str], path: &Path| {
        let out = Command::new(allox_integration::workspace_bin(
            "allox-system-effects-verify",
        ))
        .args(args)
        .arg(path)
        .output()
        .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, report) = host_verify(&["--root", &root, "--export"], &export);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report, format!("{}\n", v.report));
    let unpacked = dir.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    assert!(Command::new("tar")
        .arg("-xf")
        .arg(&export)
        .arg("-C")
        .arg(&unpacked)
        .status()
        .unwrap()
        .success());
    let set = std::fs::read_dir(&unpacked)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // The verdict's body, line 4 of bodies.jsonl: a byte in its middle.
    let bodies = set.join("bodies.jsonl");
    let mut b = std::fs::read(&bodies).unwrap();
    let text = String::from_utf8(b.clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let i = lines[..4].iter().map(|l| l.len() + 1).sum::<usize>() + lines[4].len() / 2;
    b[i] ^= 1;
    std::fs::write(&bodies, &b).unwrap();
    let (code, report) = host_verify(&["--root", &root], &set);
    assert_eq!(code, Some(1), "{report}");
    let r: allox_protocol::effects_report::Report = serde_json::from_str(&report).unwrap();
    assert_eq!(
        r.first_bad.as_ref().map(|b| (b.file.as_str(), b.seq)),
        Some(("bodies.jsonl", Some(4))),
        "{report}"
    );

    // A module loaded by a root process in the run's cgroup (standing in
    // for an escaped agent; hosts boot with `nomodule`, so only the guest
    // can show this): `modules` CHANGED, the module listed, by the run.
    let t = Instant::now();
    let script = "touch .escape-module; i=0; while [ ! -e .escape-done ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; exit $(cat .escape-done || echo 99)";
    let loaded = match ok(&mut c, run("a", "s", script, true)) {
        Response::Exited(x) if x.exit_code == Some(0) && x.effects.is_some() => *x.effects.unwrap(),
        other => panic!(
            "the helper's module load (99: no answer): {other:?}\nconsole:\n{}",
            vm.console()
        ),
    };
    eprintln!("the module load observed in {:?}", t.elapsed());
    assert_eq!(module_loaded_wrong(&loaded), None, "{loaded:#?}");
    // Controls: the runs that loaded nothing fail the same check.
    assert!(module_loaded_wrong(&seed).is_some());
    assert!(module_loaded_wrong(&residue).is_some());

    // Protocol v3 in the guest: the seed's example restores the workspace
    // (A→C CONSISTENT, not fenced); a run writing shared/ is fenced with
    // the residue named, unfenced with its root, and its export verifies
    // on the host with the guest's report bytes.
    let v3 = |c: &mut Client, script: &str| match ok(c, v3_run("a", "s", script)) {
        Response::Exited(x) => *x.effects.expect("effects"),
        other => panic!("v3 {script}: {other:?}"),
    };
    let restored = v3(&mut c, "printf changed > effect3.txt");
    let rec = restored.recovery.as_ref().expect("recovery");
    assert!(
        restored.protocol == 3
            && rec.consistent
            && rec.a_to_c_verdict == EffectsVerdict::Consistent
            && rec.b_to_c_verdict == EffectsVerdict::Changed
            && !restored.fenced,
        "{restored:#?}"
    );
    let ls = sh(&mut c, "a", "s", "ls effect3.txt 2>&1 || true");
    assert!(
        ls.contains("No such file"),
        "effect3.txt is still there: {ls}"
    );
    let left = v3(&mut c, "echo v3 > \"$ALLOX_AGENT_SHARED/v3-residue\"");
    let named = left.recovery.as_ref().is_some_and(|r| {
        !r.consistent
            && r.a_to_c.iter().any(|d| {
                d.domain == EffectsDomain::Shared
                    && d.changes.iter().any(|x| x.item == "v3-residue")
            })
    });
    assert!(named && left.fenced, "{left:#?}");
    unfence(&mut c, &left.run_id, &left.evidence_root);
    let v3_export = dir.path().join("v3.tar");
    let v3_report = verified_and_exported(&mut c, &left.run_id, &left.evidence_root, &v3_export);
    let (code, report) = host_verify(&["--root", &left.evidence_root, "--export"], &v3_export);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report, format!("{}\n", v3_report.report));

    // The power cut right after an observed run was answered: after the
    // next boot its set verifies with the root it was answered with (the
    // files beside the chain, whose hashes it holds, included), effects.get
    // gives what was answered, and the session is not fenced.
    let last = observed(&mut c, "a", "s", "echo last > last.txt");
    assert!(!last.fenced, "{last:#?}");
    vm.power_cut();
    vm = Vm::boot_with(&img, Some(&store), &[EFFECTS_ARGS], Some(ESCAPE_RDINIT));
    c = vm.connect(BOOT).0;
    let after_cut = dir.path().join("last.tar");
    verified_and_exported(&mut c, &last.run_id, &last.evidence_root, &after_cut);
    match ok(
        &mut c,
        Request::EffectsGet(EffectsGet {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: last.run_id.clone(),
        }),
    ) {
        Response::Effects(got) => assert!(
            got.evidence_root == last.evidence_root && got.verdict == last.verdict && !got.fenced,
            "answered {last:#?}\nkept {got:#?}"
        ),
        other => panic!("{other:?}"),
    }
    match ok(
        &mut c,
        Request::EffectsStatus(EffectsStatusRequest { agent_id: None }),
    ) {
        Response::EffectsStatus(s) => assert!(s.fences.is_empty(), "{s:#?}"),
        other => panic!("{other:?}"),
    }
    let again = observed(&mut c, "a", "s", "/bin/true");
    assert_eq!(true_wrong(&again), None, "{again:#?}");

    let _ = c.call(Request::Shutdown(Shutdown {}));
    assert!(
        vm.wait_exit(Duration::from_secs(60)).is_some(),
        "{}",
        vm.console()
    );
    let (pending, _) = inspect_store(&store);
    assert_eq!(pending, 0);
    // The set on the VM's store, read on the host after the power-off: the
    // guest's report again.
    let mnt = store.with_extension("mnt");
    assert!(Command::new("mount")
        .args(["-o", "loop,ro"])
        .arg(&store)
        .arg(&mnt)
        .status()
        .unwrap()
        .success());
    let on_store = mnt.join("allox/state/effects/a/s").join(&residue.run_id);
    let (code, report) = host_verify(&["--root", &root], &on_store);
    let _ = Command::new("umount").arg(&mnt).status();
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report, format!("{}\n", v.report));
}

/// Every file of `a/s`'s `current/` with its sha256, as a run there sees
/// it (the same command in the guest and on the host).
const TREE_SUMS: &str = "find . -type f | LC_ALL=C sort | xargs sha256sum";

/// The head, and each checkpoint's id, parent, label and pin.
type Listing = (
    Option<String>,
    Vec<(String, Option<String>, Option<String>, bool)>,
);

fn checkpoint_ids(c: &mut Client, a: &str, s: &str) -> Listing {
    match ok(
        c,
        Request::CheckpointList(SessionRef {
            agent_id: a.into(),
            session_id: s.into(),
        }),
    ) {
        Response::Checkpoints(l) => {
            let mut ids: Vec<_> = l
                .checkpoints
                .into_iter()
                .map(|c| (c.checkpoint_id, c.parent, c.label, c.pinned))
                .collect();
            ids.sort();
            (l.head, ids)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn guest_a_session_moves_to_the_host_daemon_and_back_through_the_control_port() {
    let Some(img) = require_vm("vm::a_session_moves_to_the_host_daemon_and_back") else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = store_image(dir.path(), true);
    let mut vm = Vm::boot(&img, Some(&store), &[]);
    let (mut g, _) = vm.connect(BOOT);
    ok(&mut g, agent("a"));
    ok(&mut g, session("a", "s"));
    // A history made in the guest: 300 files, two checkpoints (one
    // labelled and pinned), then a change not checkpointed.
    sh(
        &mut g,
        "a",
        "s",
        "mkdir d && for i in $(seq 300); do echo \"file $i\" > d/f$i; done",
    );
    ok(&mut g, ck("a", "s", "c0"));
    sh(
        &mut g,
        "a",
        "s",
        "echo edited > d/f7; rm d/f8; mkdir e; echo e > e/x",
    );
    ok(
        &mut g,
        Request::CheckpointCreate(CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c1".into(),
            pinned: true,
            label: Some("in the guest".into()),
        }),
    );
    sh(&mut g, "a", "s", "echo after > after");
    let guest_sums = sh(&mut g, "a", "s", TREE_SUMS);

    // Guest → host, over the VM's control port and the host daemon's
    // socket.
    let host = allox_integration::ProcDaemon::start("vm-move", &[]);
    let mut h = host.daemon.client();
    let t = Instant::now();
    let done = allox_ctl::transfer::move_session(&mut g, &mut h, "a", "s", None, None, None)
        .unwrap_or_else(|e| panic!("guest → host: {e}"));
    eprintln!("guest → host in {:?}: {done:?}", t.elapsed());
    assert_eq!(done.checkpoints, 2, "{done:?}");
    assert_eq!(sh(&mut h, "a", "s", TREE_SUMS), guest_sums);
    assert_eq!(
        checkpoint_ids(&mut h, "a", "s"),
        checkpoint_ids(&mut g, "a", "s")
    );
    // A rollback there to what the guest had first.
    ok(
        &mut h,
        Request::SessionRollback(SessionRollback {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c0".into(),
            kill_processes: None,
        }),
    );
    assert_eq!(sh(&mut h, "a", "s", "cat d/f7 d/f8"), "file 7\nfile 8\n");

    // Work on the host, then back to the guest: only what came after c1.
    sh(&mut h, "a", "s", "echo host > d/f9; echo new > on-host");
    ok(&mut h, ck("a", "s", "h1"));
    let host_sums = sh(&mut h, "a", "s", TREE_SUMS);
    let done = allox_ctl::transfer::move_session(&mut h, &mut g, "a", "s", None, Some("c1"), None)
        .unwrap_or_else(|e| panic!("host → guest since c1: {e}"));
    assert_eq!(done.checkpoints, 1, "{done:?}");
    assert_eq!(sh(&mut g, "a", "s", TREE_SUMS), host_sums);
    assert_eq!(
        checkpoint_ids(&mut g, "a", "s"),
        checkpoint_ids(&mut h, "a", "s")
    );
    // And whole, under another name, beside it.
    allox_ctl::transfer::move_session(&mut h, &mut g, "a", "s", Some("copy"), None, None)
        .unwrap_or_else(|e| panic!("host → guest whole: {e}"));
    assert_eq!(sh(&mut g, "a", "copy", TREE_SUMS), host_sums);
    assert_eq!(sh(&mut g, "a", "copy", "cat on-host"), "new\n");
    // Limits the session was given move with it. Through a file, in the
    // guest (pure cgroup v2, every controller).
    let mut lim = SessionCreate::new("a", "lim");
    lim.pids_max = Some(40);
    lim.memory_max = Some(96 << 20);
    ok(&mut g, Request::SessionCreate(lim));
    let export = |c: &mut Client| {
        let mut archive = Vec::new();
        let q = SessionExport {
            agent_id: "a".into(),
            session_id: "lim".into(),
            since: None,
        };
        allox_ctl::transfer::export(c, q, &mut archive).expect("export a/lim");
        archive
    };
    let archive = export(&mut g);
    allox_ctl::transfer::import(&mut g, "a", Some("lim2"), &mut &archive[..], None)
        .unwrap_or_else(|e| panic!("a/lim as a/lim2: {e}"));
    let limits = |c: &mut Client, s: &str| match ok(
        c,
        Request::SessionStats(SessionStatsRequest {
            agent_id: "a".into(),
            session_id: s.into(),
        }),
    ) {
        Response::SessionStats(x) => (x.limits.pids_max, x.limits.memory_max),
        other => panic!("{other:?}"),
    };
    assert_eq!(limits(&mut g, "lim2"), (Some(40), Some(96 << 20)));
    // A host whose cgroup2 lacks a controller the limits need refuses the
    // session whole, naming it, and keeps nothing of it.
    let controllers = std::fs::read_to_string(host.cgroup.join("cgroup.controllers")).unwrap();
    let host_has = controllers.contains("pids") && controllers.contains("memory");
    let to_host = allox_ctl::transfer::import(&mut h, "a", Some("lim"), &mut &archive[..], None);
    match (host_has, to_host) {
        (true, Ok(_)) => assert_eq!(limits(&mut h, "lim"), (Some(40), Some(96 << 20))),
        (false, Err(e)) => {
            assert!(e.contains("pids") || e.contains("memory"), "{e}");
            match h.call(Request::SessionInfoRequest(SessionRef {
                agent_id: "a".into(),
                session_id: "lim".into(),
            })) {
                Ok(Err(e)) => assert_eq!(e.code, ErrorCode::NotFound, "{e:?}"),
                other => panic!("a/lim is on the host after a refusal: {other:?}"),
            }
        }
        (has, got) => panic!("controllers {controllers:?} (pids and memory: {has}): {got:?}"),
    }
    // The guest's store is sound after the imports.
    match ok(&mut g, Request::StoreCheck(StoreCheckRequest {})) {
        Response::StoreCheck(r) => assert!(r.is_consistent(), "{r:?}"),
        other => panic!("{other:?}"),
    }
}
