//! Trees an agent builds to hurt the supervisor, through the real daemon:
//! a 100,000-level directory chain, a directory of 1,000,000 entries,
//! FIFOs swapped in while a diff reads, 1 TiB sparse files. Meanwhile
//! another connection pings the daemon: it must keep answering within a
//! second, its peak RSS and its open descriptors stay under stated bounds,
//! and where it must stop, its answer is an error naming the limit.

use allox_integration::{call, require, ProcDaemon};
use allox_protocol::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Peak RSS of the daemon allowed (its `VmHWM`).
const RSS_BOUND_KIB: u64 = 160 * 1024;
/// Open descriptors of the daemon allowed at any sample.
const FD_BOUND: usize = 400;
/// Worst answer time of a ping allowed, while the daemon works.
const PING_BOUND: Duration = Duration::from_secs(1);
/// Longest a diff may take before the test calls it stuck.
const STUCK: Duration = Duration::from_secs(120);

fn setup(name: &str, size_mb: u64) -> Option<ProcDaemon> {
    if !require(&format!("hostile::{name}")) {
        return None;
    }
    if allox_integration::cgroup2_mount().is_none() {
        panic!("hostile::{name} needs a cgroup2 mount");
    }
    let d = ProcDaemon::start_on(name, &[], size_mb);
    let mut c = d.daemon.client();
    c.call(Request::AgentCreate(AgentCreate::new("a")))
        .unwrap()
        .unwrap();
    c.call(Request::SessionCreate(SessionCreate::new("a", "s")))
        .unwrap()
        .unwrap();
    Some(d)
}

/// Runs a Python program in the session and waits for it.
fn py(d: &ProcDaemon, script: &str) {
    let p = ProcessStart {
        agent_id: "a".into(),
        session_id: "s".into(),
        argv: vec!["python3".into(), "-c".into(), script.into()],
        env: BTreeMap::new(),
        cwd: None,
        stdin: Some(Default::default()),
        timeout_ms: None,
        wait: true,
        stream: false,
        pty: None,
        trace: None,
        on_disconnect: Default::default(),
        recovery: None,
    };
    match call(d, Request::ProcessStart(p)) {
        Ok(Response::Exited(r)) => assert_eq!(r.exit_code, Some(0), "{script}: {r:?}"),
        other => panic!("{script}: {other:?}"),
    }
}

/// Starts a Python program in the session without waiting.
fn py_bg(d: &ProcDaemon, script: &str) -> String {
    let p = ProcessStart {
        agent_id: "a".into(),
        session_id: "s".into(),
        argv: vec!["python3".into(), "-c".into(), script.into()],
        env: BTreeMap::new(),
        cwd: None,
        stdin: Some(Default::default()),
        timeout_ms: None,
        wait: false,
        stream: false,
        pty: None,
        trace: None,
        on_disconnect: Default::default(),
        recovery: None,
    };
    match call(d, Request::ProcessStart(p)) {
        Ok(Response::Started(r)) => r.run_id,
        other => panic!("{script}: {other:?}"),
    }
}

fn ck(d: &ProcDaemon, c: &str) {
    call(
        d,
        Request::CheckpointCreate(CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: c.into(),
            pinned: false,
            label: None,
        }),
    )
    .unwrap();
}

/// `checkpoint.diff`, failing the test (and killing the daemon, which a
/// stuck request would keep from stopping) if it takes longer than
/// [`STUCK`].
fn diff(d: &ProcDaemon, from: &str, to: &str) -> Result<DiffListing, ErrorBody> {
    let mut c = d.daemon.client();
    let req = Request::CheckpointDiff(CheckpointDiff {
        agent_id: "a".into(),
        session_id: "s".into(),
        from: from.into(),
        to: to.into(),
        patch: false,
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(c.call(req));
    });
    match rx.recv_timeout(STUCK) {
        Ok(r) => match r.expect("transport") {
            Ok(Response::Diff(l)) => Ok(l),
            Ok(other) => panic!("diff answered {other:?}"),
            Err(e) => Err(e),
        },
        Err(_) => {
            kill(d);
            panic!("checkpoint.diff {from} -> {to} did not answer in {STUCK:?}");
        }
    }
}

fn kill(d: &ProcDaemon) {
    if let Some(pid) = rustix::process::Pid::from_raw(d.daemon.child.id() as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// Pings the daemon from its own connection and samples its descriptors
/// until stopped.
struct Watch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<(Duration, usize, Option<String>)>>,
    pid: u32,
}

impl Watch {
    fn start(d: &ProcDaemon) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, mut c, pid) = (stop.clone(), d.daemon.client(), d.daemon.child.id());
        let thread = std::thread::spawn(move || {
            let (mut worst, mut fds, mut failed) = (Duration::ZERO, 0usize, None);
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                match c.call(Request::Ping(Ping {})) {
                    Ok(Ok(Response::Pong(_))) => worst = worst.max(t.elapsed()),
                    other => {
                        failed = Some(format!("{other:?}"));
                        break;
                    }
                }
                let n = std::fs::read_dir(format!("/proc/{pid}/fd"))
                    .map(|r| r.count())
                    .unwrap_or(0);
                fds = fds.max(n);
                std::thread::sleep(Duration::from_millis(20));
            }
            (worst, fds, failed)
        });
        Watch {
            stop,
            thread: Some(thread),
            pid,
        }
    }

    /// Stops watching and checks every bound.
    fn check(mut self) {
        let hwm = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("daemon's VmHWM");
        self.stop.store(true, Ordering::Relaxed);
        let (worst, fds, failed) = self.thread.take().unwrap().join().unwrap();
        eprintln!(
            "daemon: worst ping {worst:?}, peak RSS {} MiB, at most {fds} descriptors",
            hwm / 1024
        );
        assert!(failed.is_none(), "the daemon stopped answering: {failed:?}");
        assert!(worst < PING_BOUND, "a ping took {worst:?}");
        assert!(
            hwm < RSS_BOUND_KIB,
            "peak RSS {} MiB over {} MiB",
            hwm / 1024,
            RSS_BOUND_KIB / 1024
        );
        assert!(fds < FD_BOUND, "{fds} descriptors open at once");
    }
}

fn rollback_and_delete(d: &ProcDaemon, to: &str, drop_ck: &str) {
    call(
        d,
        Request::SessionRollback(SessionRollback {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: to.into(),
            kill_processes: Some(true),
        }),
    )
    .unwrap();
    call(
        d,
        Request::CheckpointDelete(CheckpointRef {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: drop_ck.into(),
        }),
    )
    .unwrap();
    call(
        d,
        Request::SessionDelete(SessionDelete {
            agent_id: "a".into(),
            session_id: "s".into(),
            force: true,
        }),
    )
    .unwrap();
    // Deleting the agent walks its workspace for nested subvolumes,
    // through whatever the agent left in shared/.
    call(
        d,
        Request::AgentDelete(AgentDelete {
            agent_id: "a".into(),
            force: true,
        }),
    )
    .unwrap();
    // The removals run in the background: a new agent of the same name
    // waits for them.
    call(d, Request::AgentCreate(AgentCreate::new("a"))).unwrap();
}

#[test]
fn a_hundred_thousand_levels_deep() {
    let Some(d) = setup("a_hundred_thousand_levels_deep", 2048) else {
        return;
    };
    ck(&d, "c0");
    // The agent's shared/ made writable to its runs (it belongs to root
    // otherwise), as the session's current/ is: removal must be safe
    // against whatever is there.
    py(&d, "pass");
    let ws = d.daemon.root.join("agents/a/workspace");
    let owner = std::fs::metadata(ws.join("sessions/s/current")).unwrap();
    use std::os::unix::fs::MetadataExt;
    std::os::unix::fs::chown(ws.join("shared"), Some(owner.uid()), Some(owner.gid())).unwrap();
    let w = Watch::start(&d);
    // The same chain in the session and in the agent's shared/.
    py(
        &d,
        r#"
import os
for root in [".", os.environ["ALLOX_AGENT_SHARED"]]:
    os.chdir(root)
    for i in range(100000):
        os.mkdir("d")
        os.chdir("d")
    open("bottom", "w").write("bottom")
    os.chdir(os.environ["HOME"])
open("top", "w").write("top")
"#,
    );
    ck(&d, "c1");
    // Where the chain is new, the diff goes down it and stops at its depth
    // limit, naming it.
    let e = diff(&d, "c0", "c1").unwrap_err();
    assert_eq!(e.code, ErrorCode::Unsupported, "{e:?}");
    assert!(e.message.contains("directory depth"), "{}", e.message);
    assert!(e.message.contains("4096"), "{}", e.message);
    // A change beside the unchanged chain: the right answer, or the
    // depth error where the walk cannot prune the chain.
    py(&d, "open('top2', 'w').write('x')");
    match diff(&d, "c1", "current") {
        Ok(l) => {
            assert_eq!((l.added, l.modified, l.deleted), (1, 0, 0), "{l:?}");
            assert_eq!(l.changes[0].path, "top2");
        }
        Err(e) => assert!(e.message.contains("directory depth"), "{e:?}"),
    }
    // A change at the bottom: the walk follows it down to the limit.
    py(
        &d,
        r#"
for i in range(100000):
    __import__("os").chdir("d")
open("bottom", "w").write("changed")
"#,
    );
    ck(&d, "c2");
    let e = diff(&d, "c1", "c2").unwrap_err();
    assert_eq!(e.code, ErrorCode::Unsupported, "{e:?}");
    rollback_and_delete(&d, "c0", "c1");
    w.check();
}

#[test]
fn a_million_entries_in_one_directory() {
    let Some(d) = setup("a_million_entries_in_one_directory", 6144) else {
        return;
    };
    ck(&d, "c0");
    let w = Watch::start(&d);
    // Hard links (a file takes 65,535 at most) with long names.
    py(
        &d,
        r#"
import os
os.mkdir("wide")
for k in range(20):
    open("wide/target-%02d" % k, "w").close()
for i in range(1000000):
    os.link("wide/target-%02d" % (i % 20), "wide/an-entry-with-a-long-name-%020d" % i)
"#,
    );
    ck(&d, "c1");
    let l = diff(&d, "c0", "c1").unwrap();
    assert_eq!(l.added, 1_000_021, "{}", l.added);
    assert!(l.truncated);
    // As many as fit 10,000 entries and 512 KiB of paths, so the answer
    // fits one frame.
    assert!(l.changes.len() > 5_000 && l.changes.len() <= 10_000);
    let bytes = postcard::to_allocvec(&Response::Diff(l.clone())).unwrap();
    assert!(bytes.len() < MAX_FRAME / 2, "{} bytes", bytes.len());
    assert!(l.changes.windows(2).all(|w| w[0].path < w[1].path));
    // A few changes among the million: both sides are read in parts.
    py(
        &d,
        r#"
import os
for i in range(0, 1000000, 100000):
    os.unlink("wide/an-entry-with-a-long-name-%020d" % i)
    open("wide/new-%d" % i, "w").write("new")
"#,
    );
    ck(&d, "c2");
    let l = diff(&d, "c1", "c2").unwrap();
    assert_eq!((l.added, l.deleted, l.modified), (10, 10, 0), "{l:?}");
    assert!(!l.truncated);
    let l = diff(&d, "c2", "current").unwrap();
    assert_eq!(l.changes.len(), 0, "{l:?}");
    rollback_and_delete(&d, "c0", "c1");
    w.check();
}

#[test]
fn fifos_and_sparse_files_do_not_stall_a_diff() {
    let Some(d) = setup("fifos_and_sparse_files_do_not_stall_a_diff", 1024) else {
        return;
    };
    // A FIFO; a file a FIFO will be swapped over while diffs read; two
    // 1 TiB sparse files with one byte of data at their end.
    py(
        &d,
        r#"
import os
os.mkfifo("fifo")
open("swapped", "w").write("x" * 4096)
for n in ["big-same", "big-diff"]:
    with open(n, "wb") as f:
        f.truncate(1 << 40)
        f.seek((1 << 40) - 1)
        f.write(b"z")
"#,
    );
    ck(&d, "c0");
    // The same bytes again (so only reading tells), one byte changed, the
    // FIFO's times changed, and the file to swap rewritten alike.
    py(
        &d,
        r#"
import os, time
time.sleep(0.01)
for n, b in [("big-same", b"z"), ("big-diff", b"y")]:
    with open(n, "r+b") as f:
        f.seek((1 << 40) - 1)
        f.write(b)
os.utime("fifo")
open("orig", "w").write("x" * 4096)
os.link("orig", "swapped.new")
os.rename("swapped.new", "swapped")
"#,
    );
    ck(&d, "c1");
    let w = Watch::start(&d);
    let l = diff(&d, "c0", "c1").unwrap();
    let got: Vec<(&str, ChangeKind)> = l
        .changes
        .iter()
        .map(|c| (c.path.as_str(), c.kind))
        .collect();
    assert_eq!(
        got,
        [
            ("big-diff", ChangeKind::Modified),
            ("orig", ChangeKind::Added)
        ],
        "{l:?}"
    );
    // Now a FIFO is swapped over `swapped` and back, as fast as it goes,
    // while diffs read it: each answers, and sees it as it was at some
    // moment (the same bytes, or a FIFO, or changed while compared).
    let run = py_bg(
        &d,
        r#"
import os
while True:
    os.mkfifo("p.new")
    os.rename("p.new", "swapped")
    os.link("orig", "f.new")
    os.rename("f.new", "swapped")
"#,
    );
    let t = Instant::now();
    let mut seen = BTreeMap::new();
    let mut n = 0;
    while t.elapsed() < Duration::from_secs(20) && n < 400 {
        let l = diff(&d, "c0", "current").unwrap();
        let k = l
            .changes
            .iter()
            .find(|c| c.path == "swapped")
            .map(|c| c.kind);
        // A directory read while entries are renamed over each other may
        // miss the one being replaced (readdir promises nothing else for
        // concurrent renames), so it may also show as deleted; never
        // anything else, and never a stall.
        assert!(
            matches!(
                k,
                None | Some(ChangeKind::TypeChanged)
                    | Some(ChangeKind::Modified)
                    | Some(ChangeKind::Deleted)
            ),
            "{l:?}"
        );
        *seen.entry(format!("{k:?}")).or_insert(0) += 1;
        n += 1;
    }
    eprintln!("{n} diffs while swapping: {seen:?}");
    call(
        &d,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: Some(run),
            signal: None,
        }),
    )
    .unwrap();
    w.check();
}
