//! The `workspace`/`shared` evidence on a real Btrfs: the hashing walk of
//! read-only snapshots at A and B, the fanotify watcher on the filesystem,
//! and the attribution of each difference to the run, another session or
//! nobody known, with writers placed in real cgroups shaped as a daemon's
//! runs (`ROOT/allox/AGENT/SESSION/run-RUN`, under a cgroup root of the
//! test's own).

#![allow(unsafe_code)]

use allox_effects::collect::fanotify::{Observed, Owner, Watch, WatchOptions};
use allox_effects::collect::snapshots::{attribute, Who};
use allox_effects::collect::tree::{capture, TreeLimits};
use allox_effects::collect::{compare, Difference};
use allox_effects::observer::files::{self, Snapshots};
use allox_integration::{cgroup2_mount, remove_cgroup_tree, require, BtrfsFs};
use allox_protocol::EffectChangeKind;
use std::collections::HashSet;
use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn btrfs(args: &[&str], paths: &[&Path]) {
    let st = Command::new("btrfs")
        .args(args)
        .args(paths)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "btrfs {args:?} {paths:?}");
}

/// A cgroup root of the test's own, removed (its processes killed) at the
/// end.
struct CgRoot(PathBuf);

impl CgRoot {
    fn new(name: &str) -> CgRoot {
        let mount = cgroup2_mount().expect("a cgroup2 mount");
        let p = mount.join(format!("allox-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        CgRoot(p)
    }

    /// `ROOT/allox/a/SESSION/run-RUN`, made.
    fn run(&self, session: &str, run: &str) -> PathBuf {
        let p = self
            .0
            .join("allox/a")
            .join(session)
            .join(format!("run-{run}"));
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}

impl Drop for CgRoot {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("cgroup.kill"), "1");
        for _ in 0..100 {
            let ev = std::fs::read_to_string(self.0.join("cgroup.events")).unwrap_or_default();
            if ev.contains("populated 0") {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        remove_cgroup_tree(&self.0);
    }
}

/// Starts `sh -c script` in `dir`, moved into `cgroup` before it runs
/// (and, there, unlinking `unlink` first when given), with piped stdin and
/// stdout.
fn spawn_in(cgroup: &Path, dir: &Path, script: &str, unlink: Option<&Path>) -> Child {
    let procs = CString::new(cgroup.join("cgroup.procs").as_os_str().as_bytes()).unwrap();
    let unlink = unlink.map(|p| CString::new(p.as_os_str().as_bytes()).unwrap());
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and only
    // makes async-signal-safe system calls (open, write, close, unlink)
    // with strings built before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            if let Some(u) = &unlink {
                if libc::unlink(u.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

/// Waits for the child's first line (its script says it is done writing).
fn wait_line(c: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(c.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    line
}

fn end(mut c: Child) {
    drop(c.stdin.take());
    let _ = c.wait();
}

/// A store-shaped tree: `agents/a/workspace` (a subvolume) holding
/// `shared/` (with `old`) and a session's `current` (a nested subvolume).
fn store(fs: &BtrfsFs) -> PathBuf {
    let ws = fs.path().join("agents/a/workspace");
    std::fs::create_dir_all(ws.parent().unwrap()).unwrap();
    btrfs(&["subvolume", "create"], &[&ws]);
    std::fs::create_dir_all(ws.join("shared")).unwrap();
    std::fs::write(ws.join("shared/old"), b"old").unwrap();
    std::fs::create_dir_all(ws.join("sessions/sA")).unwrap();
    btrfs(&["subvolume", "create"], &[&ws.join("sessions/sA/current")]);
    ws
}

/// The check of the attribution test: exactly `old` removed and `y` added
/// by session B's run, `x` added by the run. Err says what differs.
fn check(got: &[(Difference, Who)]) -> Result<(), String> {
    let b = Who::Session(Owner {
        agent: Some("a".into()),
        session: Some("sB".into()),
        run: Some("r2".into()),
    });
    let want = vec![
        ("old".to_string(), EffectChangeKind::Removed, b.clone()),
        ("x".to_string(), EffectChangeKind::Added, Who::Run),
        ("y".to_string(), EffectChangeKind::Added, b),
    ];
    let have: Vec<_> = got
        .iter()
        .map(|(d, w)| (d.key.clone(), d.kind, w.clone()))
        .collect();
    if have == want {
        Ok(())
    } else {
        Err(format!("want {want:?}, have {have:?}"))
    }
}

#[test]
fn shared_writes_are_attributed_to_the_run_and_to_another_session() {
    if !require("shared_writes_are_attributed_to_the_run_and_to_another_session") {
        return;
    }
    let fs = BtrfsFs::new(512).unwrap();
    let ws = store(&fs);
    let cg = CgRoot::new("effects-files");
    let run_a = cg.run("sA", "r1");
    let run_b = cg.run("sB", "r2");

    let watch = Watch::start(std::slice::from_ref(&ws)).unwrap();
    let snap_a = fs.path().join("A");
    btrfs(&["subvolume", "snapshot", "-r"], &[&ws, &snap_a]);

    // The observed run (session A) writes shared/x; session B's run
    // removes shared/old and writes shared/y. Both stay alive until the
    // watch has stopped, so their cgroups can be read.
    let mut a = spawn_in(
        &run_a,
        &ws,
        "echo x > shared/x && echo done && read _",
        None,
    );
    let mut b = spawn_in(
        &run_b,
        &ws,
        "echo y > shared/y && echo done && read _",
        Some(&ws.join("shared/old")),
    );
    assert_eq!(wait_line(&mut a), "done\n");
    assert_eq!(wait_line(&mut b), "done\n");
    let run_pids: HashSet<u32> = [a.id()].into();

    let snap_b = fs.path().join("B");
    btrfs(&["subvolume", "snapshot", "-r"], &[&ws, &snap_b]);
    let seen = watch.stop();
    end(a);
    end(b);
    assert!(seen.is_complete(), "{seen:?}");

    let limits = TreeLimits::default();
    let (ta, tb) = (
        capture(&snap_a.join("shared"), &limits),
        capture(&snap_b.join("shared"), &limits),
    );
    assert!(
        ta.is_complete() && tb.is_complete(),
        "{:?} {:?}",
        ta.gaps,
        tb.gaps
    );
    let diffs = compare(&ta, &tb);
    let run = Owner {
        agent: Some("a".into()),
        session: Some("sA".into()),
        run: Some("r1".into()),
    };
    let got = attribute(
        &diffs,
        &ws.join("shared"),
        &seen.events,
        &run_pids,
        &run,
        &cg.0,
    );
    check(&got).unwrap();

    // Positive control: the same check without the watch's events fails
    // (every difference is then unknown).
    let blind = attribute(&diffs, &ws.join("shared"), &[], &run_pids, &run, &cg.0);
    assert!(check(&blind).is_err(), "the check passed without events");
    assert!(blind.iter().all(|(_, w)| *w == Who::Unknown));

    // The whole workspace walked live: the session's nested subvolume is a
    // boundary, not entered, and a gap.
    let live = capture(&ws, &limits);
    assert!(
        live.items["sessions/sA/current"].starts_with("boundary "),
        "{:?}",
        live.items.get("sessions/sA/current")
    );
    assert!(live.gaps.iter().any(|g| g.contains("sessions/sA/current")));
    // In a snapshot it is the empty directory Btrfs leaves: a boundary too.
    assert!(tb.items.contains_key("x"));
    let snap = capture(&snap_b, &limits);
    assert!(snap.items["sessions/sA/current"].starts_with("boundary "));
}

/// What `files::diff` lists between two points' `shared/`, as
/// `(key, kind)`.
fn shared_diff(a: &Snapshots, b: &Snapshots) -> Vec<(String, EffectChangeKind)> {
    let (d, cut) = files::diff(&a.shared(), &b.shared(), false).expect("diff");
    assert!(!cut);
    d.into_iter().map(|d| (d.key, d.kind)).collect()
}

#[test]
fn an_empty_shared_is_an_empty_tree_without_a_snapshot() {
    if !require("an_empty_shared_is_an_empty_tree_without_a_snapshot") {
        return;
    }
    let fs = BtrfsFs::new(512).unwrap();
    let ws = store(&fs);
    let current = ws.join("sessions/sA/current");
    let shared = ws.join("shared");
    std::fs::remove_file(shared.join("old")).unwrap();
    let ev = fs.path().join("evidence");
    std::fs::create_dir(&ev).unwrap();
    // Empty at A: no snapshot of the agent's workspace.
    let a = Snapshots::take(&ev, "a", &current, &ws).unwrap();
    assert_eq!(a.agent, None, "{a:?}");
    assert!(!a.shared().exists());
    // A file written: B is a snapshot, the file added against the empty A.
    std::fs::write(shared.join("x"), b"x").unwrap();
    let b = Snapshots::take(&ev, "b", &current, &ws).unwrap();
    let agent_b = b.agent.clone().expect("B snapshots the agent's workspace");
    assert!(agent_b.join("shared/x").exists());
    assert_eq!(
        shared_diff(&a, &b),
        vec![("x".to_string(), EffectChangeKind::Added)]
    );
    // Removed again: empty at C, no snapshot, the removal listed against B.
    std::fs::remove_file(shared.join("x")).unwrap();
    let c = Snapshots::take(&ev, "c", &current, &ws).unwrap();
    assert_eq!(c.agent, None, "{c:?}");
    assert_eq!(
        shared_diff(&b, &c),
        vec![("x".to_string(), EffectChangeKind::Removed)]
    );
    // Empty at both points: nothing, as between two snapshots.
    assert_eq!(shared_diff(&a, &c), vec![]);
    // A hidden entry is an entry: snapshotted.
    std::fs::write(shared.join(".h"), b"h").unwrap();
    let d = Snapshots::take(&ev, "d", &current, &ws).unwrap();
    assert!(d.agent.is_some(), "{d:?}");
    assert_eq!(
        shared_diff(&c, &d),
        vec![(".h".to_string(), EffectChangeKind::Added)]
    );
    for s in [&a, &b, &c, &d] {
        s.remove();
    }
    assert!(!agent_b.exists(), "the snapshots are deleted");
}

#[test]
fn a_reader_that_falls_behind_the_kernels_queue_says_it_overflowed() {
    if !require("a_reader_that_falls_behind_the_kernels_queue_says_it_overflowed") {
        return;
    }
    let fs = BtrfsFs::new(512).unwrap();
    let dir = fs.path().join("many");
    std::fs::create_dir(&dir).unwrap();

    // Control: a reader that keeps up sees every creation.
    let watch = Watch::start(&[fs.path().to_path_buf()]).unwrap();
    for i in 0..1000 {
        std::fs::File::create(dir.join(format!("c{i}"))).unwrap();
    }
    let seen = watch.stop();
    assert!(!seen.overflowed, "{} received", seen.received);
    let created = seen
        .events
        .iter()
        .filter(|e| e.mask & libc::FAN_CREATE != 0 && e.name.starts_with(b"c"))
        .count();
    assert_eq!(created, 1000);
    assert!(seen
        .events
        .iter()
        .all(|e| e.dir.as_deref() == Some(dir.as_path()) || !e.name.starts_with(b"c")));

    // Held: the kernel's queue (16,384 events) overflows.
    let watch = Watch::start(&[fs.path().to_path_buf()]).unwrap();
    watch.hold(true);
    for i in 0..20_000 {
        std::fs::File::create(dir.join(format!("h{i}"))).unwrap();
    }
    let seen = watch.stop();
    assert!(seen.overflowed, "{} received", seen.received);
    assert!(!seen.is_complete());
    assert!(
        seen.received >= 16_384 && seen.received < 20_000,
        "{}",
        seen.received
    );

    // Past the kept-events cap: counted, not kept, and incomplete.
    let watch = Watch::start_with(
        &[fs.path().to_path_buf()],
        WatchOptions {
            max_events: 10,
            ..WatchOptions::default()
        },
    )
    .unwrap();
    for i in 0..100 {
        std::fs::File::create(dir.join(format!("k{i}"))).unwrap();
    }
    let seen = watch.stop();
    assert_eq!(seen.events.len(), 10);
    assert!(seen.dropped >= 90, "{}", seen.dropped);
    assert!(!seen.overflowed && !seen.is_complete());
}

/// A watch kept to the agent's workspace subvolume (what the observer asks
/// for when only `shared/` needs the events): a session writing in its own
/// `current/` (a subvolume of its own) is counted, not kept, and nothing
/// is read for it; what is written in `shared/` is kept with its writer.
/// Control: the same writes watched without the filter are all kept.
#[test]
fn a_watch_kept_to_one_subvolume_counts_the_others_events_without_keeping_them() {
    if !require("a_watch_kept_to_one_subvolume_counts_the_others_events_without_keeping_them") {
        return;
    }
    let fs = BtrfsFs::new(512).unwrap();
    let ws = store(&fs);
    let cur = ws.join("sessions/sA/current");
    let id = |p: &Path| allox_store::btrfs::subvolume_id(p).unwrap();
    assert_ne!(id(&ws), id(&cur));
    let write = |tag: &str| {
        for i in 0..500 {
            std::fs::write(cur.join(format!("{tag}{i}")), b"x").unwrap();
        }
        std::fs::write(ws.join(format!("shared/{tag}")), b"s").unwrap();
    };
    let in_current = |seen: &Observed| {
        seen.events
            .iter()
            .filter(|e| e.dir.as_deref() == Some(cur.as_path()))
            .count()
    };
    let shared_kept = |seen: &Observed, tag: &str| {
        seen.events.iter().any(|e| {
            e.path() == Some(ws.join(format!("shared/{tag}")))
                && e.mask & libc::FAN_CREATE != 0
                && e.cgroup.is_some()
        })
    };

    let watch = Watch::start_with(
        std::slice::from_ref(&ws),
        WatchOptions {
            subvolumes: Some(HashSet::from([id(&ws)])),
            ..WatchOptions::default()
        },
    )
    .unwrap();
    write("f");
    let seen = watch.stop();
    assert!(seen.is_complete(), "{seen:?}");
    assert!(shared_kept(&seen, "f"), "{:?}", seen.events);
    assert_eq!(in_current(&seen), 0);
    // At least one event a file (the kernel merges a file's events that
    // queue back to back).
    assert!(seen.elsewhere >= 500, "{} elsewhere", seen.elsewhere);
    assert_eq!(seen.received, seen.elsewhere + seen.events.len() as u64);

    // Control: without the filter the session's writes are all kept.
    let watch = Watch::start(std::slice::from_ref(&ws)).unwrap();
    write("g");
    let seen = watch.stop();
    assert!(shared_kept(&seen, "g"));
    assert!(in_current(&seen) >= 500, "{} in current", in_current(&seen));
    assert_eq!(seen.elsewhere, 0);
}

/// Numbers for the report (run by hand: `--ignored --nocapture`): the walk
/// of 10,000 small files and of one 1 GiB file, fanotify events drained per
/// second, and how often a short-lived writer's cgroup is missed.
#[test]
#[ignore]
fn measure_walk_and_watch() {
    if !require("measure_walk_and_watch") {
        return;
    }
    let fs = BtrfsFs::new(4096).unwrap();
    let small = fs.path().join("small");
    for d in 0..100 {
        let sub = small.join(format!("d{d}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..100 {
            std::fs::write(
                sub.join(format!("f{f}")),
                format!("file {d} {f}\n").repeat(10),
            )
            .unwrap();
        }
    }
    let big = fs.path().join("big");
    std::fs::create_dir(&big).unwrap();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(big.join("g")).unwrap();
        let chunk = vec![0x5au8; 1 << 20];
        for _ in 0..1024 {
            f.write_all(&chunk).unwrap();
        }
    }
    let _ = Command::new("sync").status();
    for threads in [1, 2] {
        let limits = TreeLimits {
            threads,
            ..TreeLimits::default()
        };
        let mut times = Vec::new();
        for _ in 0..5 {
            let t = std::time::Instant::now();
            let c = capture(&small, &limits);
            times.push(t.elapsed());
            assert_eq!(c.items.len(), 10_101);
        }
        times.sort();
        eprintln!(
            "walk 10,000 files, {threads} thread(s): median {:?}, min {:?}",
            times[2], times[0]
        );
        let t = std::time::Instant::now();
        let c = capture(&big, &limits);
        eprintln!(
            "walk one 1 GiB file (page cache), {threads} thread(s): {:?}",
            t.elapsed()
        );
        assert!(c.is_complete());
    }
    let t = std::time::Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "find {} -type f -print0 | xargs -0 sha256sum >/dev/null",
            small.display()
        ))
        .status()
        .unwrap();
    assert!(out.success());
    eprintln!("find + sha256sum of the 10,000 files: {:?}", t.elapsed());

    // Events drained: 15,000 creations queued while the reader is held,
    // then read at once (the drain alone is timed).
    let ev = fs.path().join("ev");
    std::fs::create_dir(&ev).unwrap();
    let watch = Watch::start(&[fs.path().to_path_buf()]).unwrap();
    watch.hold(true);
    let t = std::time::Instant::now();
    for i in 0..15_000 {
        std::fs::File::create(ev.join(format!("e{i}"))).unwrap();
    }
    eprintln!("15,000 creations (while watched): {:?}", t.elapsed());
    std::thread::sleep(Duration::from_millis(100));
    let t = std::time::Instant::now();
    let seen = watch.stop();
    let el = t.elapsed();
    eprintln!(
        "fanotify: {} events drained in {:?} ({:.0}/s), overflowed {}",
        seen.received,
        el,
        seen.received as f64 / el.as_secs_f64(),
        seen.overflowed
    );

    // Short-lived writers: how often is the cgroup gone when read?
    let cg = CgRoot::new("effects-measure");
    let run = cg.run("s", "r");
    let watch = Watch::start(&[fs.path().to_path_buf()]).unwrap();
    let mut pids = HashSet::new();
    for i in 0..200 {
        let mut c = spawn_in(&run, &ev, &format!(": > w{i}"), None);
        pids.insert(c.id());
        let _ = c.wait();
    }
    let seen = watch.stop();
    let mine: Vec<_> = seen
        .events
        .iter()
        .filter(|e| pids.contains(&e.pid) && e.mask & libc::FAN_CREATE != 0)
        .collect();
    let missed = mine.iter().filter(|e| e.cgroup.is_none()).count();
    eprintln!(
        "short-lived writers: {} creations, cgroup missed for {missed}",
        mine.len()
    );
}
