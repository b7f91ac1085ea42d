//! The process tracker's eBPF programs (`allox-ebpf-probes`) against the
//! real kernel, without the daemon. Needs root in the initial pid
//! namespace, kernel BTF and a cgroup2 mount (`/sys/fs/cgroup/unified` on
//! a hybrid host, else `/sys/fs/cgroup`), plus sh, cat, wc, sleep, unshare
//! and python3; without them each test skips or fails through
//! [`allox_integration::needs`].
//!
//! Tests run one at a time (they share the machine's process table, and
//! the fork storm would disturb the others' timing).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use allox_ebpf_probes::{cgroup_id, enable_stats, EventKind, ProgStats, RawEvent, Tracker};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const OWNER: u64 = 42;

// ---------------------------------------------------------------- harness

/// Whether the machine can run the test; prints the skip line or panics.
fn require(test: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let missing = if !is_root() {
        Some("root".to_owned())
    } else if !in_initial_pid_namespace() {
        // Events carry kernel pids; the tests compare them with their own.
        Some("the initial pid namespace".to_owned())
    } else if !Path::new(allox_ebpf_probes::KERNEL_BTF).exists() {
        Some(format!("kernel BTF at {}", allox_ebpf_probes::KERNEL_BTF))
    } else if cgroup2_root().is_none() {
        Some("a cgroup2 mount at /sys/fs/cgroup/unified or /sys/fs/cgroup".to_owned())
    } else if !Path::new("/usr/bin/unshare").exists() {
        Some("/usr/bin/unshare (util-linux)".to_owned())
    } else if python3().is_none() {
        Some("python3 at /usr/bin/python3 or /usr/local/bin/python3".to_owned())
    } else {
        None
    };
    allox_integration::needs(test, missing).then_some(guard)
}

fn is_root() -> bool {
    // Effective uid, the second field of "Uid:".
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// One pid in "NSpid:": this process sees pids as the kernel does.
fn in_initial_pid_namespace() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .map(|ids| ids.split_whitespace().count() == 1)
        })
        .unwrap_or(false)
}

fn cgroup2_root() -> Option<&'static Path> {
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.subtree_control").exists())
}

/// A real interpreter, not a shim script that would add processes.
fn python3() -> Option<&'static str> {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

/// A cgroup of its own, emptied and removed on drop.
struct TestCgroup {
    dir: PathBuf,
}

impl TestCgroup {
    fn new(name: &str) -> TestCgroup {
        let dir = cgroup2_root()
            .unwrap()
            .join(format!("allox-ebpf-test-{}-{name}", std::process::id()));
        if dir.exists() {
            TestCgroup { dir: dir.clone() }.empty();
            let _ = std::fs::remove_dir(&dir);
        }
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", dir.display()));
        TestCgroup { dir }
    }

    fn id(&self) -> u64 {
        cgroup_id(&self.dir).unwrap()
    }

    /// Starts `script` under `sh -c` in this cgroup: a wrapper shell moves
    /// itself in and then executes the script's shell, so nothing of the
    /// script runs outside. The first event is therefore the exec of `sh`
    /// (the wrapper was forked before it was owned).
    fn spawn(&self, script: &str) -> Child {
        Command::new("/bin/sh")
            .arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && exec /bin/sh -c "$1""#)
            .arg(&self.dir)
            .arg(script)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn sh")
    }

    fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    fn empty(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.pids().is_empty() && Instant::now() < deadline {
            if std::fs::write(self.dir.join("cgroup.kill"), "1").is_err() {
                for pid in self.pids() {
                    let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        self.empty();
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("cannot remove {}: {e}", self.dir.display());
        }
    }
}

/// Drains until nothing new came for `quiet`.
fn collect(t: &mut Tracker, quiet: Duration) -> Vec<RawEvent> {
    let mut out = Vec::new();
    let mut last = Instant::now();
    while last.elapsed() < quiet {
        std::thread::sleep(Duration::from_millis(10));
        if t.drain(|e| out.push(e)) > 0 {
            last = Instant::now();
        }
    }
    out
}

fn of(events: &[RawEvent], pid: u32) -> Vec<&RawEvent> {
    events.iter().filter(|e| e.pid == pid).collect()
}

fn kinds(events: &[&RawEvent]) -> Vec<EventKind> {
    events.iter().map(|e| e.kind).collect()
}

fn load() -> Tracker {
    Tracker::load().unwrap_or_else(|e| panic!("load: {e}\n{e:?}"))
}

// ------------------------------------------------------------------ tests

#[test]
fn a_pipeline_in_a_tagged_cgroup_is_reported_and_nothing_else() {
    let Some(_one) = require("a_pipeline_in_a_tagged_cgroup_is_reported_and_nothing_else") else {
        return;
    };
    let mut t = load();
    let cg = TestCgroup::new("pipeline");
    t.tag_cgroup(cg.id(), OWNER).unwrap();
    assert_eq!(t.tracked_pids(), 0);

    let mut outsider = Command::new("/bin/sh")
        .args(["-c", "/bin/true; cat /dev/null"])
        .spawn()
        .unwrap();
    let mut root = cg.spawn("echo a | cat | wc -c; (sleep 0.1 &) ; exit 3");
    let status = root.wait().unwrap();
    assert_eq!(status.code(), Some(3));
    outsider.wait().unwrap();
    std::thread::sleep(Duration::from_millis(300)); // the orphaned sleep
    let events = collect(&mut t, Duration::from_millis(200));
    assert_eq!(t.lost(), 0);

    let root_pid = root.id();
    let dump = || {
        events
            .iter()
            .map(|e| format!("{e:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        of(&events, outsider.id()).is_empty(),
        "outsider seen:\n{}",
        dump()
    );
    assert!(events.iter().all(|e| e.owner == OWNER), "{}", dump());

    // The root: exec of the script's shell, then its exit with status 3.
    let r = of(&events, root_pid);
    assert_eq!(kinds(&r), [EventKind::Exec, EventKind::Exit], "{}", dump());
    assert!(
        r[0].filename.as_deref().unwrap().ends_with("/sh"),
        "{:?}",
        r[0]
    );
    assert_eq!(r[1].exit_status, Some(3 << 8));

    // Every other process: forked by a known process, exited, in order.
    let mut known: BTreeSet<u32> = [root_pid].into();
    let mut by_pid: BTreeMap<u32, Vec<&RawEvent>> = BTreeMap::new();
    for e in &events {
        by_pid.entry(e.pid).or_default().push(e);
    }
    for e in events.iter().filter(|e| e.kind == EventKind::Fork) {
        assert!(
            known.contains(&e.ppid),
            "fork of {} by unknown {}:\n{}",
            e.pid,
            e.ppid,
            dump()
        );
        known.insert(e.pid);
    }
    for (pid, evs) in &by_pid {
        if *pid == root_pid {
            continue;
        }
        let k = kinds(evs);
        assert_eq!(k.first(), Some(&EventKind::Fork), "pid {pid}: {k:?}");
        assert_eq!(k.last(), Some(&EventKind::Exit), "pid {pid}: {k:?}");
        assert!(k.len() <= 3, "pid {pid}: {k:?}");
        assert!(
            evs.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns),
            "pid {pid} out of order"
        );
    }
    // echo's subshell, cat, wc, the ( ) subshell and sleep.
    assert!(by_pid.len() >= 6, "{} processes:\n{}", by_pid.len(), dump());
    let execs: BTreeSet<String> = events
        .iter()
        .filter_map(|e| e.filename.as_deref())
        .filter_map(|f| f.rsplit('/').next().map(str::to_owned))
        .collect();
    for program in ["sh", "cat", "wc", "sleep"] {
        assert!(execs.contains(program), "no exec of {program}: {execs:?}");
    }
    let cat = events
        .iter()
        .find(|e| e.filename.as_deref().is_some_and(|f| f.ends_with("/cat")))
        .unwrap();
    assert_eq!(cat.comm, "cat");
    assert!(cat.filename.as_deref().unwrap().starts_with('/'), "{cat:?}");

    // All of them live in the initial pid namespace: both views agree.
    for e in &events {
        assert_eq!((e.ns_pid, e.ns_ppid), (e.pid, e.ppid), "{e:?}");
    }
    // Everything exited: nothing is left in PIDS.
    assert_eq!(t.tracked_pids(), 0);
}

#[test]
fn threads_are_not_processes_and_one_exit_per_process() {
    let Some(_one) = require("threads_are_not_processes_and_one_exit_per_process") else {
        return;
    };
    let py = python3().unwrap();
    let mut t = load();
    let cg = TestCgroup::new("threads");
    t.tag_cgroup(cg.id(), OWNER).unwrap();

    // 1: four threads that finish; the process exits normally.
    // 2..: four threads busy on the CPUs when the main thread calls
    // exit_group (os._exit), so that they die at the same moment: the
    // case where more than one thread can see signal->live at 0.
    let joined = "import threading,time,os\n\
                  ts=[threading.Thread(target=time.sleep,args=(0.2,)) for _ in range(4)]\n\
                  [t.start() for t in ts]\n\
                  print(\" \".join(str(t.native_id) for t in ts), flush=True)\n\
                  [t.join() for t in ts]\n";
    let racing = "import threading,os\n\
                  def spin():\n    while True: pass\n\
                  ts=[threading.Thread(target=spin,daemon=True) for _ in range(4)]\n\
                  [t.start() for t in ts]\n\
                  print(\" \".join(str(t.native_id) for t in ts), flush=True)\n\
                  os._exit(5)\n";
    let rounds = 10;
    let mut script = format!("{py} -c '{joined}'; echo $?");
    for _ in 0..rounds {
        script.push_str(&format!("; {py} -c '{racing}'"));
    }
    script.push_str("; exit 0");
    let child = cg.spawn(&script);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let events = collect(&mut t, Duration::from_millis(200));
    let dump = || {
        events
            .iter()
            .map(|e| format!("{e:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    };

    let stdout = String::from_utf8(out.stdout).unwrap();
    let tids: BTreeSet<u32> = stdout
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .filter(|&n| n > 1)
        .collect();
    assert_eq!(tids.len(), 4 * (rounds + 1), "thread ids: {stdout}");
    for e in &events {
        assert!(!tids.contains(&e.pid), "event for a thread: {e:?}");
    }

    let pythons: Vec<u32> = events
        .iter()
        .filter(|e| e.kind == EventKind::Exec && e.filename.as_deref() == Some(py))
        .map(|e| e.pid)
        .collect();
    assert_eq!(pythons.len(), rounds + 1, "{}", dump());
    for (i, pid) in pythons.iter().enumerate() {
        let evs = of(&events, *pid);
        assert_eq!(
            kinds(&evs),
            [EventKind::Fork, EventKind::Exec, EventKind::Exit],
            "python {pid}:\n{}",
            dump()
        );
        let expected = if i == 0 { 0 } else { 5 << 8 };
        assert_eq!(
            evs[2].exit_status,
            Some(expected),
            "python {pid}: {:?}",
            evs[2]
        );
    }
    assert_eq!(t.lost(), 0);
    assert_eq!(t.tracked_pids(), 0, "exits must empty PIDS");
}

#[test]
fn pids_are_reported_in_the_process_own_namespace_too() {
    let Some(_one) = require("pids_are_reported_in_the_process_own_namespace_too") else {
        return;
    };
    let mut t = load();
    let cg = TestCgroup::new("pidns");
    t.tag_cgroup(cg.id(), OWNER).unwrap();
    // unshare forks pid 1 of the new namespace, which forks a child (2).
    let child = cg.spawn("/usr/bin/unshare --pid --fork /bin/sh -c '/bin/true; exit 7'");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    let events = collect(&mut t, Duration::from_millis(200));
    let dump = || {
        events
            .iter()
            .map(|e| format!("{e:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    };

    let init = events
        .iter()
        .find(|e| e.kind == EventKind::Fork && e.ns_pid == 1)
        .unwrap_or_else(|| panic!("no pid 1:\n{}", dump()));
    assert_ne!(init.pid, 1);
    assert_eq!(
        init.ns_ppid, 0,
        "unshare is outside the new namespace: {init:?}"
    );
    let second = events
        .iter()
        .find(|e| e.kind == EventKind::Fork && e.ppid == init.pid)
        .unwrap_or_else(|| panic!("no child of pid 1:\n{}", dump()));
    assert_eq!((second.ns_pid, second.ns_ppid), (2, 1), "{second:?}");
    let true_exec = of(&events, second.pid);
    assert_eq!(
        kinds(&true_exec),
        [EventKind::Fork, EventKind::Exec, EventKind::Exit]
    );
    assert_eq!((true_exec[1].ns_pid, true_exec[1].ns_ppid), (2, 1));
    let init_exit = of(&events, init.pid)
        .into_iter()
        .find(|e| e.kind == EventKind::Exit)
        .unwrap();
    assert_eq!(init_exit.exit_status, Some(7 << 8));
    assert_eq!(t.tracked_pids(), 0);
}

#[test]
fn a_tagged_pid_and_an_untagged_cgroup() {
    let Some(_one) = require("a_tagged_pid_and_an_untagged_cgroup") else {
        return;
    };
    let mut t = load();
    let cg = TestCgroup::new("untag");
    t.tag_cgroup(cg.id(), OWNER).unwrap();
    t.untag_cgroup(cg.id()).unwrap();
    t.untag_cgroup(cg.id()).unwrap(); // not an error twice
    let root = cg.spawn("/bin/true; exit 0");
    root.wait_with_output().unwrap();
    assert!(
        collect(&mut t, Duration::from_millis(100)).is_empty(),
        "untagged cgroup reported"
    );

    // A process tagged by pid: its children are owned, it is not reported
    // before the tag.
    let mut waiter = Command::new("/bin/sh")
        .args(["-c", "read x; /bin/true; exit 4"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    t.tag_pid(waiter.id(), 7).unwrap();
    assert_eq!(t.tracked_pids(), 1);
    drop(waiter.stdin.take()); // read returns at end of file
    waiter.wait().unwrap();
    let events = collect(&mut t, Duration::from_millis(100));
    let forks: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::Fork)
        .collect();
    assert_eq!(forks.len(), 1, "{events:?}");
    assert_eq!(forks[0].ppid, waiter.id());
    assert!(events.iter().all(|e| e.owner == 7));
    let exit = events
        .iter()
        .find(|e| e.kind == EventKind::Exit && e.pid == waiter.id())
        .unwrap();
    assert_eq!(exit.exit_status, Some(4 << 8));
    assert_eq!(t.tracked_pids(), 0);
}

#[test]
fn clone_into_cgroup_reports_the_very_first_fork() {
    let Some(_one) = require("clone_into_cgroup_reports_the_very_first_fork") else {
        return;
    };
    let mut t = load();
    let cg = TestCgroup::new("clone3");
    t.tag_cgroup(cg.id(), OWNER).unwrap();
    let cgroup = std::fs::File::open(&cg.dir).unwrap();
    let pid = clone3::spawn_into_cgroup(&cgroup, c"/bin/true").expect("clone3");
    let status = clone3::wait(pid);
    assert_eq!(status, 0);
    let events = collect(&mut t, Duration::from_millis(100));
    let k: Vec<_> = events.iter().map(|e| (e.kind, e.pid)).collect();
    assert_eq!(
        k,
        [
            (EventKind::Fork, pid),
            (EventKind::Exec, pid),
            (EventKind::Exit, pid)
        ],
        "{events:?}"
    );
    assert_eq!(events[0].ppid, std::process::id(), "forked by this test");
    assert_eq!(events[1].filename.as_deref(), Some("/bin/true"));
    assert_eq!(t.tracked_pids(), 0);
}

/// clone3(CLONE_INTO_CGROUP), the way the supervisor starts a run's first
/// process: the child is in the tagged cgroup from its first instruction.
/// No safe wrapper exists, hence the raw syscall.
#[allow(unsafe_code)]
mod clone3 {
    use std::ffi::CStr;
    use std::os::fd::AsRawFd;

    #[repr(C)]
    #[derive(Default)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
        set_tid: u64,
        set_tid_size: u64,
        cgroup: u64,
    }

    const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

    pub fn spawn_into_cgroup(cgroup: &std::fs::File, program: &CStr) -> std::io::Result<u32> {
        let args = CloneArgs {
            flags: CLONE_INTO_CGROUP,
            exit_signal: libc::SIGCHLD as u64,
            cgroup: cgroup.as_raw_fd() as u64,
            ..CloneArgs::default()
        };
        let argv = [program.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null()];
        // SAFETY: `args` is a valid clone_args of the size passed. Without
        // CLONE_VM the child gets a copy of this address space; it only
        // calls execve and _exit (async-signal-safe) with pointers built
        // before the clone, so the other threads' state does not matter.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &args as *const CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        match ret {
            -1 => Err(std::io::Error::last_os_error()),
            0 => {
                // SAFETY: see above; execve only returns on failure.
                unsafe {
                    libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr());
                    libc::_exit(127)
                }
            }
            pid => Ok(pid as u32),
        }
    }

    /// The exit code of `pid` (our child).
    pub fn wait(pid: u32) -> i32 {
        let mut status = 0;
        // SAFETY: `status` is a valid out pointer; `pid` is our child.
        let r = unsafe { libc::waitpid(pid as i32, &mut status, 0) };
        assert_eq!(
            r,
            pid as i32,
            "waitpid: {}",
            std::io::Error::last_os_error()
        );
        libc::WEXITSTATUS(status)
    }
}

/// 20,000 forks while draining every 10 ms: whatever was not received is
/// counted as lost, to the event. Prints the in-kernel cost per program
/// run, for processes not owned and for owned ones, for the README.
#[test]
fn a_fork_storm_is_received_or_counted_lost() {
    let Some(_one) = require("a_fork_storm_is_received_or_counted_lost") else {
        return;
    };
    let stats = enable_stats().expect("BPF_ENABLE_STATS");
    let mut t = load();

    let before = t.prog_stats();
    let (received, lost, forks, elapsed) =
        storm(&mut t, "untracked", None, 5_000, Duration::from_millis(10));
    assert_eq!((received, lost), (0, 0), "nothing is owned");
    print_cost("untracked", forks, elapsed, &before, &t.prog_stats());

    let before = t.prog_stats();
    let (received, lost, forks, elapsed) = storm(
        &mut t,
        "storm",
        Some(OWNER),
        20_000,
        Duration::from_millis(10),
    );
    let after = t.prog_stats();
    drop(stats);
    eprintln!(
        "storm: {forks} forks in {elapsed:?}, {received} events received, {lost} lost, {} still tracked",
        t.tracked_pids()
    );
    print_cost("storm", forks, elapsed, &before, &after);
    for (a, b) in before.iter().zip(&after) {
        assert!(
            b.run_count > a.run_count,
            "{} never ran (statistics off?)",
            b.name
        );
    }
    assert_eq!(received + lost, 2 * forks + 2);
    assert_eq!(t.tracked_pids(), 0);
}

fn print_cost(
    what: &str,
    forks: u64,
    elapsed: Duration,
    before: &[ProgStats],
    after: &[ProgStats],
) {
    for (a, b) in before.iter().zip(after) {
        let runs = b.run_count - a.run_count;
        let ns = b.run_time_ns - a.run_time_ns;
        eprintln!(
            "{what}: {forks} forks in {elapsed:?}; {} ran {runs} times, {} ns per run",
            b.name,
            ns / runs.max(1)
        );
    }
}

/// The same with a 16 KiB ring buffer read only at the end: most events
/// are lost, and the counter says exactly how many.
#[test]
fn a_full_ring_buffer_counts_what_it_drops() {
    let Some(_one) = require("a_full_ring_buffer_counts_what_it_drops") else {
        return;
    };
    let mut t = Tracker::load_with_ring_bytes(16 << 10).unwrap();
    let (received, lost, forks, _) = storm(
        &mut t,
        "tiny",
        Some(OWNER),
        3_000,
        Duration::from_secs(3600),
    );
    eprintln!(
        "tiny ring: {received} received, {lost} lost of {}",
        2 * forks + 2
    );
    assert!(
        lost > 0,
        "a 16 KiB ring cannot hold {} events",
        2 * forks + 2
    );
    assert!(received > 0);
    assert_eq!(received + lost, 2 * forks + 2);
    assert_eq!(
        t.tracked_pids(),
        0,
        "lost events do not leave processes in PIDS"
    );
}

/// Runs `forks` fork+exit pairs of a python loop in a cgroup tagged with
/// `owner`, draining every `every`; returns (received, lost, forks,
/// elapsed). The owned events are the exec of python, each fork and child
/// exit, and python's exit.
fn storm(
    t: &mut Tracker,
    name: &str,
    owner: Option<u64>,
    forks: u64,
    every: Duration,
) -> (u64, u64, u64, Duration) {
    let py = python3().unwrap();
    let cg = TestCgroup::new(name);
    if let Some(owner) = owner {
        t.tag_cgroup(cg.id(), owner).unwrap();
    }
    let program = format!(
        "import os\n\
         for i in range({forks}):\n    pid = os.fork()\n    if pid == 0: os._exit(0)\n    os.waitpid(pid, 0)\n"
    );
    let started = Instant::now();
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$1" -c "$2""#)
        .arg(&cg.dir)
        .arg(py)
        .arg(&program)
        .spawn()
        .unwrap();
    let mut received = 0u64;
    let mut last_drain = Instant::now();
    loop {
        if last_drain.elapsed() >= every {
            received += t.drain(|_| {}) as u64;
            last_drain = Instant::now();
        }
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status:?}");
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let elapsed = started.elapsed();
    std::thread::sleep(Duration::from_millis(50));
    received += collect(t, Duration::from_millis(100)).len() as u64;
    (received, t.lost(), forks, elapsed)
}

/// Load and attach time, median of five, for the README. The first load
/// in a process also probes the kernel's features (aya does it once).
#[test]
fn load_and_attach_time() {
    let Some(_one) = require("load_and_attach_time") else {
        return;
    };
    let times: Vec<Duration> = (0..5)
        .map(|_| {
            let t0 = Instant::now();
            let t = load();
            let d = t0.elapsed();
            drop(t);
            d
        })
        .collect();
    let mut sorted = times.clone();
    sorted.sort();
    eprintln!(
        "load+attach: median {:?}, first {:?}, all {times:?}",
        sorted[2], times[0]
    );
    assert!(sorted[2] < Duration::from_secs(10));
}
