//! The session context: namespaces a session's runs share (its network
//! namespace), kept across rollback, gone with the session; and what a run
//! sees, which must stay what it was before runs were forked from a
//! per-session process.

use allox_integration::{call, make_sessions, process_start as start, require, ProcDaemon};
use allox_protocol::*;

fn setup(name: &str, extra: &[&str]) -> Option<ProcDaemon> {
    if !require(&format!("context::{name}")) {
        return None;
    }
    if allox_integration::cgroup2_mount().is_none() {
        panic!("context::{name} needs a cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified)");
    }
    let d = ProcDaemon::start(name, extra);
    make_sessions(&d, &[("a", "s"), ("a", "t")]);
    Some(d)
}

/// Runs `argv` in a/s, waits, and returns its standard output (it must
/// exit 0).
fn run(d: &ProcDaemon, a: &str, s: &str, argv: &[&str]) -> String {
    match call(d, Request::ProcessStart(start(a, s, argv))) {
        Ok(Response::Exited(r)) if r.exit_code == Some(0) => r.stdout,
        other => panic!("{argv:?}: {other:?}"),
    }
}

const SYSTEM_DIRS: [&str; 8] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc", "/opt",
];

/// What a run sees, in a form that does not depend on the host: mount
/// points with their flags, file system type and (for the sandbox's own
/// file systems) super-block options, sorted by mount point (the order of
/// lines in mountinfo follows the order of mounting, which is not part of
/// the view); host system directories by their flags only (what lies below
/// them is the host's); the environment with the run's id blanked; the
/// credential, capability and seccomp lines of /proc/self/status; the
/// hostname; the names in /, /dev and /allox.
fn view(d: &ProcDaemon, a: &str, s: &str) -> String {
    let mut out = Vec::new();
    let mut mounts = Vec::new();
    for line in run(d, a, s, &["/bin/cat", "/proc/self/mountinfo"]).lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let dash = f.iter().position(|x| *x == "-").expect("mountinfo line");
        let (point, opts, optional) = (f[4], f[5], &f[6..dash]);
        let (fstype, sup) = (f[dash + 1], f[dash + 3]);
        if SYSTEM_DIRS
            .iter()
            .any(|d| point.starts_with(&format!("{d}/")))
        {
            continue;
        }
        let flags: Vec<&str> = opts
            .split(',')
            .filter(|o| ["rw", "ro", "nosuid", "nodev", "noexec"].contains(o))
            .collect();
        let mut rec = format!("mount {point} {}", flags.join(","));
        if !optional.is_empty() {
            rec.push_str(&format!(" [{}]", optional.join(" ")));
        }
        if !SYSTEM_DIRS.contains(&point) {
            rec.push_str(&format!(" {fstype}"));
            if ["tmpfs", "proc", "devpts"].contains(&fstype) {
                rec.push_str(&format!(" {sup}"));
            }
        }
        mounts.push(rec);
    }
    mounts.sort();
    out.extend(mounts);
    let mut env: Vec<String> = run(d, a, s, &["/usr/bin/env"])
        .lines()
        .map(|l| match l.split_once('=') {
            Some(("ALLOX_RUN_ID", _)) => "env ALLOX_RUN_ID=<run>".to_string(),
            _ => format!("env {l}"),
        })
        .collect();
    env.sort();
    out.extend(env);
    for l in run(d, a, s, &["/bin/cat", "/proc/self/status"]).lines() {
        let keep = [
            "Uid:",
            "Gid:",
            "Groups:",
            "CapInh:",
            "CapPrm:",
            "CapEff:",
            "CapBnd:",
            "CapAmb:",
            "NoNewPrivs:",
            "Seccomp:",
            "Seccomp_filters:",
        ];
        if keep.iter().any(|k| l.starts_with(k)) {
            out.push(format!(
                "status {}",
                l.split_whitespace().collect::<Vec<_>>().join(" ")
            ));
        }
    }
    let host = run(d, a, s, &["/bin/cat", "/proc/sys/kernel/hostname"]);
    out.push(format!("hostname {}", host.trim()));
    for dir in ["/", "/dev", "/allox"] {
        let mut names: Vec<String> = run(d, a, s, &["/bin/ls", "-1a", dir])
            .lines()
            .map(String::from)
            .collect();
        names.sort();
        out.push(format!("ls {dir} {}", names.join(" ")));
    }
    out.join("\n")
}

/// Recorded from the code before the session context existed (every run
/// built its own root after an exec of the sandbox init), on the
/// development host, with the daemon's default flags. A change here is a
/// change of what every sandboxed program sees: it needs a reason. Changed
/// since, on purpose: the in-sandbox interface (`/run/allox`, its client
/// directory last on `PATH`, the run's directory at `/run/allox/guest`
/// with `/run/allox/guest.sock` a link into it); one seccomp filter
/// instead of three (the same answers, as one program).
const EXPECTED_VIEW: &str = "\
mount / ro,nosuid,nodev tmpfs ro,size=8192k,mode=755
mount /allox/session rw,nosuid,nodev btrfs
mount /allox/shared rw,nosuid,nodev btrfs
mount /dev ro,nosuid,noexec tmpfs ro,size=64k,mode=755
mount /dev/full rw devtmpfs
mount /dev/null rw devtmpfs
mount /dev/pts rw,nosuid,noexec devpts rw,mode=620,ptmxmode=666
mount /dev/random rw devtmpfs
mount /dev/shm rw,nosuid,nodev tmpfs rw,size=65536k
mount /dev/tty rw devtmpfs
mount /dev/urandom rw devtmpfs
mount /dev/zero rw devtmpfs
mount /etc ro,nosuid,nodev
mount /opt ro,nosuid,nodev
mount /proc rw,nosuid,nodev,noexec proc rw
mount /run/allox/bin/allox ro,nosuid,nodev ext4
mount /run/allox/guest ro,nosuid,nodev ext4
mount /run/allox/turn.py ro,nosuid,nodev ext4
mount /run/allox/whoami.py ro,nosuid,nodev ext4
mount /tmp rw,nosuid,nodev tmpfs rw,size=524288k
mount /usr ro,nosuid,nodev
env ALLOX_AGENT_ID=a
env ALLOX_AGENT_SHARED=/allox/shared
env ALLOX_AGENT_WORKSPACE=/allox
env ALLOX_RUN_ID=<run>
env ALLOX_SESSION_ID=s
env HOME=/allox/session
env LANG=C.UTF-8
env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/run/allox/bin
env TMPDIR=/tmp
status Uid: 10000 10000 10000 10000
status Gid: 10000 10000 10000 10000
status Groups:
status CapInh: 0000000000000000
status CapPrm: 0000000000000000
status CapEff: 0000000000000000
status CapBnd: 0000000000000000
status CapAmb: 0000000000000000
status NoNewPrivs: 1
status Seccomp: 2
status Seccomp_filters: 1
hostname allox
ls / . .. allox bin dev etc lib lib32 lib64 opt proc run sbin tmp usr
ls /dev . .. fd full null ptmx pts random shm stderr stdin stdout tty urandom zero
ls /allox . .. session shared
";

#[test]
fn a_run_sees_what_it_saw_before_the_context() {
    let Some(d) = setup("a_run_sees_what_it_saw_before_the_context", &[]) else {
        return;
    };
    let seen = view(&d, "a", "s");
    if std::env::var_os("ALLOX_PRINT_VIEW").is_some() {
        println!("{seen}");
    }
    assert_eq!(seen, EXPECTED_VIEW.trim_end(), "the view of a run changed");
    // The second run of the session (forked from the same context) sees
    // the same.
    assert_eq!(view(&d, "a", "s"), seen);
}

/// The host's user database and how it is read, with what identifies the
/// file written (inode, size, modification time).
fn host_users() -> Vec<(String, Vec<u8>, String)> {
    use std::os::unix::fs::MetadataExt;
    ["/etc/passwd", "/etc/group", "/etc/nsswitch.conf"]
        .iter()
        .map(|p| {
            let md = std::fs::metadata(p).ok();
            let id = md.map(|m| format!("{} {} {}", m.ino(), m.size(), m.mtime_nsec()));
            (
                p.to_string(),
                std::fs::read(p).unwrap_or_default(),
                id.unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn the_sandbox_user_has_a_name_and_the_session_as_home() {
    let name = "the_sandbox_user_has_a_name_and_the_session_as_home";
    let before = host_users();
    // Ids the host's /etc/passwd does not have.
    let Some(d) = setup(name, &["--sandbox-uid", "23456", "--sandbox-gid", "23457"]) else {
        return;
    };
    for p in ["ssh", "getent"] {
        if allox_integration::which(p).is_none() {
            panic!("context::{name} needs {p}");
        }
    }
    let out = run(
        &d,
        "a",
        "s",
        &[
            "/bin/sh",
            "-c",
            "id -un; id -gn; whoami; id; cd && pwd; getent passwd $(id -u); getent group $(id -g); \
             getent passwd 0 65534 | cut -d: -f1,3; stat -c '%U %G' /allox/session; \
             (echo x >> /etc/passwd) 2>/dev/null || echo read-only",
        ],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..3], ["agent", "agent", "agent"], "{out}");
    assert_eq!(
        lines[3], "uid=23456(agent) gid=23457(agent) groups=23457(agent)",
        "{out}"
    );
    // HOME in passwd is the session's current dir as the sandbox sees it.
    let home = lines[4];
    assert_eq!(home, "/allox/session", "{out}");
    assert_eq!(
        lines[5],
        format!("agent:x:23456:23457:agent:{home}:/bin/sh"),
        "{out}"
    );
    assert_eq!(lines[6], "agent:x:23457:", "{out}");
    assert_eq!(lines[7..9], ["root:0", "nobody:65534"], "{out}");
    assert_eq!(lines[9], "agent agent", "{out}");
    assert_eq!(lines[10], "read-only", "{out}");
    // The OpenSSH client runs: it gets as far as the connection (nothing
    // listens on port 1) instead of refusing for want of a user.
    let r = match call(
        &d,
        Request::ProcessStart(start(
            "a",
            "s",
            &[
                "/bin/sh",
                "-c",
                "ssh -V 2>&1; ssh -F /dev/null -o BatchMode=yes -o ConnectTimeout=5 \
                 -o StrictHostKeyChecking=no -p 1 127.0.0.1 true 2>&1; echo ssh=$?",
            ],
        )),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{other:?}"),
    };
    assert!(r.stdout.starts_with("OpenSSH_"), "{r:?}");
    assert!(
        !r.stdout.contains("No user exists") && r.stdout.contains("port 1: Connection refused"),
        "{r:?}"
    );
    assert!(r.stdout.ends_with("ssh=255\n"), "{r:?}");
    // The host's files are as they were, and nothing is mounted over them
    // here.
    assert_eq!(host_users(), before, "the host's user database changed");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.lines().any(|l| l
            .split(' ')
            .nth(4)
            .is_some_and(|p| before.iter().any(|(f, _, _)| f == p))),
        "{mounts}"
    );
}

fn bg(d: &ProcDaemon, a: &str, s: &str, argv: &[&str]) -> String {
    let mut p = start(a, s, argv);
    p.wait = false;
    match call(d, Request::ProcessStart(p)) {
        Ok(Response::Started(r)) => r.run_id,
        other => panic!("{argv:?}: {other:?}"),
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn current(d: &ProcDaemon, a: &str, s: &str) -> std::path::PathBuf {
    d.daemon
        .root
        .join(format!("agents/{a}/workspace/sessions/{s}/current"))
}

/// The network namespace a run of a/s is in (`net:[inode]`).
fn netns(d: &ProcDaemon, a: &str, s: &str) -> String {
    run(d, a, s, &["/bin/readlink", "/proc/self/ns/net"])
        .trim()
        .to_string()
}

/// The session's context process (in the daemon's PID namespace; the
/// next run's PID 1 made ahead waits beside it in the same cgroup, PID 1
/// of a namespace of its own: [`ahead_procs`]).
fn context_procs(d: &ProcDaemon, a: &str, s: &str) -> Vec<i32> {
    context_cgroup_procs(d, a, s)
        .into_iter()
        .filter(|p| pid_namespaces(*p) == 1)
        .collect()
}

/// The next run's PID 1, made ahead in the context's cgroup.
fn ahead_procs(d: &ProcDaemon, a: &str, s: &str) -> Vec<i32> {
    context_cgroup_procs(d, a, s)
        .into_iter()
        .filter(|p| pid_namespaces(*p) == 2)
        .collect()
}

fn context_cgroup_procs(d: &ProcDaemon, a: &str, s: &str) -> Vec<i32> {
    std::fs::read_to_string(
        d.cgroup
            .join(format!("allox/{a}/.context-{s}/cgroup.procs")),
    )
    .unwrap_or_default()
    .lines()
    .filter_map(|l| l.parse().ok())
    .collect()
}

/// How many PID namespaces process `pid` is in (its `NSpid` line), 0 if
/// it is gone.
fn pid_namespaces(pid: i32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|l| l.split_whitespace().count())
        .unwrap_or(0)
}

const SERVER: &str = r#"
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8765))
s.listen()
open("/allox/session/ready", "w").close()
while True:
    c, _ = s.accept()
    c.sendall(b"hello from the first run\n")
    c.close()
"#;

const CLIENT: &str = r#"
import socket
try:
    c = socket.create_connection(("127.0.0.1", 8765), timeout=5)
    print(c.recv(100).decode().strip())
except OSError as e:
    print("unreachable:", type(e).__name__)
"#;

#[test]
fn runs_of_a_session_share_loopback_and_other_sessions_cannot_reach_it() {
    let name = "runs_of_a_session_share_loopback_and_other_sessions_cannot_reach_it";
    let Some(d) = setup(name, &["--sandbox-network", "isolated"]) else {
        return;
    };
    if !std::path::Path::new("/usr/bin/python3").exists() {
        panic!("context::{name} needs /usr/bin/python3");
    }
    bg(&d, "a", "s", &["/usr/bin/python3", "-c", SERVER]);
    wait_until("the server", || {
        current(&d, "a", "s").join("ready").exists()
    });
    let same = run(&d, "a", "s", &["/usr/bin/python3", "-c", CLIENT]);
    assert_eq!(same.trim(), "hello from the first run");
    let other = run(&d, "a", "t", &["/usr/bin/python3", "-c", CLIENT]);
    assert_eq!(other.trim(), "unreachable: ConnectionRefusedError");
    // Nor does the host's loopback lead there.
    assert!(std::net::TcpStream::connect(("127.0.0.1", 8765))
        .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused));
}

#[test]
fn the_context_outlives_a_rollback_and_is_the_sessions_own() {
    let Some(d) = setup(
        "the_context_outlives_a_rollback_and_is_the_sessions_own",
        &["--sandbox-network", "isolated", "--prepared-runs", "always"],
    ) else {
        return;
    };
    call(
        &d,
        Request::CheckpointCreate(CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c1".into(),
            pinned: false,
            label: None,
        }),
    )
    .unwrap();
    let before = netns(&d, "a", "s");
    assert_eq!(netns(&d, "a", "s"), before, "two runs, two namespaces");
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert_ne!(before, host.display().to_string());
    assert_ne!(
        netns(&d, "a", "t"),
        before,
        "two sessions share a namespace"
    );
    bg(&d, "a", "s", &["/bin/sleep", "1000"]);
    let ctx = context_procs(&d, "a", "s");
    assert_eq!(ctx.len(), 1, "{ctx:?}");
    match call(
        &d,
        Request::SessionRollback(SessionRollback {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c1".into(),
            kill_processes: Some(true),
        }),
    ) {
        Ok(Response::RolledBack(r)) => assert!(r.killed_processes >= 1, "{r:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        context_procs(&d, "a", "s"),
        ctx,
        "the rollback killed the context"
    );
    assert_eq!(netns(&d, "a", "s"), before);
}

#[test]
fn a_killed_context_is_made_again_by_the_next_run() {
    let Some(d) = setup(
        "a_killed_context_is_made_again_by_the_next_run",
        &["--sandbox-network", "isolated", "--prepared-runs", "always"],
    ) else {
        return;
    };
    let before = netns(&d, "a", "s");
    let ctx = context_procs(&d, "a", "s");
    assert_eq!(ctx.len(), 1, "{ctx:?}");
    // Held open, the old namespace stays alive, so its number cannot be
    // given to the new one (the kernel reuses freed numbers).
    let held = std::fs::File::open(format!("/proc/{}/ns/net", ctx[0])).unwrap();
    let ahead = ahead_procs(&d, "a", "s");
    assert_eq!(ahead.len(), 1, "the next run's PID 1 made ahead: {ahead:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(ctx[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Dead (a zombie, not yet reaped) or gone.
    wait_until("the context's end", || {
        std::fs::read_to_string(format!("/proc/{}/stat", ctx[0]))
            .map(|st| {
                st.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
    });
    // The next run works, in a new context.
    let after = netns(&d, "a", "s");
    assert_ne!(after, before);
    drop(held);
    let now = context_procs(&d, "a", "s");
    assert!(now.len() == 1 && now != ctx, "{now:?}");
    // The dead one was reaped: no zombie left of it, nor of the PID 1 it
    // had made ahead (which waited for the supervisor to kill it).
    assert!(!std::path::Path::new(&format!("/proc/{}", ctx[0])).exists());
    assert!(!std::path::Path::new(&format!("/proc/{}", ahead[0])).exists());
}

/// Distinct network namespaces held by processes of this test's cgroups
/// (other tests run at once, with their own).
fn netns_in_use(d: &ProcDaemon) -> usize {
    let name = d.cgroup.file_name().unwrap().to_string_lossy().into_owned();
    let mut set = std::collections::BTreeSet::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let cg = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        if !cg.contains(&format!("/{name}/")) {
            continue;
        }
        if let Ok(l) = std::fs::read_link(e.path().join("ns/net")) {
            set.insert(l);
        }
    }
    set.len()
}

/// Cgroups below `dir`, as paths relative to it.
fn cgroups_below(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            out.push(e.file_name().to_string_lossy().into_owned());
            for sub in cgroups_below(&e.path()) {
                out.push(format!("{}/{sub}", e.file_name().to_string_lossy()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn sessions_made_and_deleted_a_thousand_times_leave_nothing() {
    // Every session in proxy mode: each context also has the proxy's
    // listener and its task in the daemon.
    let Some(d) = setup(
        "sessions_made_and_deleted_a_thousand_times_leave_nothing",
        &[
            "--plugin",
            "network",
            "--session-network",
            "proxy",
            "--prepared-runs",
            "always",
        ],
    ) else {
        return;
    };
    let cycles: usize = std::env::var("ALLOX_CONTEXT_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let daemon = d.daemon.child.id();
    // The daemon's mounts of this test's files (other tests mount and
    // unmount their own file systems meanwhile): the store and the stage.
    let mine = d.fs.scratch().display().to_string();
    let mountinfo = || {
        std::fs::read_to_string(format!("/proc/{daemon}/mountinfo"))
            .unwrap()
            .lines()
            .filter(|l| l.contains(&mine))
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let (mounts, nets) = (mountinfo(), netns_in_use(&d));
    let cgroups = cgroups_below(&d.cgroup);
    let mut c = d.daemon.client();
    // The daemon's descriptors (its listeners among them), once this
    // client is connected.
    let fds = || {
        let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{daemon}/fd"))
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|l| {
                let l = l.display().to_string();
                // Sockets by kind, not by inode.
                if l.starts_with("socket:") {
                    "socket".to_string()
                } else {
                    l
                }
            })
            .collect();
        v.sort();
        v
    };
    c.call(Request::Ping(Ping {})).unwrap().unwrap();
    let before = fds();
    for i in 0..cycles {
        c.call(Request::SessionCreate(SessionCreate::new("a", "cycle")))
            .unwrap()
            .unwrap();
        let r = c
            .call(Request::ProcessStart(start("a", "cycle", &["/bin/true"])))
            .unwrap();
        assert!(
            matches!(r, Ok(Response::Exited(ref x)) if x.exit_code == Some(0)),
            "cycle {i}: {r:?}"
        );
        assert_eq!(context_procs(&d, "a", "cycle").len(), 1, "cycle {i}");
        assert!(ahead_procs(&d, "a", "cycle").len() <= 1, "cycle {i}");
        if i == 0 {
            assert_eq!(netns_in_use(&d), nets + 1, "the context's namespace");
        }
        c.call(Request::SessionDelete(SessionDelete {
            agent_id: "a".into(),
            session_id: "cycle".into(),
            force: true,
        }))
        .unwrap()
        .unwrap();
    }
    assert_eq!(mountinfo(), mounts, "mounts left in the daemon's namespace");
    assert_eq!(cgroups_below(&d.cgroup), cgroups, "cgroups left");
    assert_eq!(netns_in_use(&d), nets, "network namespaces left");
    // What the daemon holds now that it did not hold before: a leak. (The
    // store's reaper may still hold a directory it is removing; and a
    // connection of `setup`'s, already dropped, may have been open still
    // when `before` was read, so fewer descriptors than before is not one.)
    let extra = |now: &[String]| {
        let mut left = before.clone();
        now.iter()
            .filter(|d| match left.iter().position(|b| b == *d) {
                Some(i) => {
                    left.remove(i);
                    false
                }
                None => true,
            })
            .cloned()
            .collect::<Vec<_>>()
    };
    let mut now = fds();
    for _ in 0..100 {
        if extra(&now).is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        now = fds();
    }
    assert_eq!(
        extra(&now),
        Vec::<String>::new(),
        "descriptors left in the daemon (it holds {now:?}, held {before:?})"
    );
    // Processes: the daemon has no child left (no context, no run's PID
    // 1, no zombie of either), whichever of its threads made it.
    let mut children = String::new();
    for t in std::fs::read_dir(format!("/proc/{daemon}/task"))
        .unwrap()
        .flatten()
    {
        children += &std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
    }
    assert_eq!(children.trim(), "", "processes left");
}

/// The session's context process starts whatever descriptor number the
/// supervisor's handle to its own binary has — 3 included, the number the
/// context's control socket is moved to before the exec. The test runs
/// itself again in a process of its own started with 3 closed, so that the
/// handle it opens first gets 3.
#[test]
fn the_context_starts_when_the_supervisor_s_binary_is_descriptor_3() {
    let name = "context::the_context_starts_when_the_binary_is_descriptor_3";
    if std::env::var_os("ALLOX_TEST_EXE_AT_3").is_some() {
        return context_with_exe_at_3();
    }
    if !require(name) {
        return;
    }
    let out = std::process::Command::new("sh")
        .args(["-c", "exec 3>&-; exec \"$0\" \"$@\""])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "the_context_starts_when_the_supervisor_s_binary_is_descriptor_3",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("ALLOX_TEST_EXE_AT_3", "1")
        .output()
        .expect("run the test binary again");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("context ready with its binary at 3"),
        "{text}"
    );
}

/// In the process of its own: the binary's handle at 3, a context started
/// from it in a cgroup of the test's own.
fn context_with_exe_at_3() {
    use rustix::fd::AsRawFd;
    use rustix::fs::{open, Mode, OFlags};
    let at3 = open(
        allox_integration::workspace_bin("allox-init"),
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    assert_eq!(at3.as_raw_fd(), 3, "descriptor 3 was not free");
    let cg = allox_integration::cgroup2_mount()
        .expect("a cgroup2 mount")
        .join(format!("allox-test-{}-exe3", std::process::id()));
    std::fs::create_dir_all(&cg).unwrap();
    let cg_fd = open(&cg, OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap();
    let stage = tempfile::tempdir().unwrap();
    let defaults = allox_supervisor::runs::RunsConfig::new(
        cg.clone(),
        allox_integration::workspace_bin("allox-init"),
        stage.path().join("unused"),
    );
    let spec = allox_sandbox::ContextSpec {
        stage: stage.path().to_path_buf(),
        system_dirs: defaults.system_dirs,
        hostname: "allox".into(),
        isolate_network: true,
        uid: 65534,
        gid: 65534,
        binds: vec![],
        links: vec![],
        prepare_ahead: true,
        no_reflinks: false,
    };
    let r = allox_sandbox::Context::start(&at3, &cg_fd, &spec);
    let alive = r.as_ref().is_ok_and(|c| c.is_alive());
    let shown = format!("{:?}", r.as_ref().map(|c| c.pid()));
    drop(r);
    allox_integration::remove_cgroup_tree(&cg);
    assert!(alive, "the context did not start: {shown}");
    println!("context ready with its binary at 3");
}

/// What a run reports of what it can see that an earlier run could have
/// left: files in /tmp, SysV objects, descriptors, variables, ignored
/// signals, processes.
const LEFTOVERS: &str = r#"
import json, os
r = {}
r["tmp"] = sorted(os.listdir("/tmp"))
r["shm"] = len(open("/proc/sysvipc/shm").read().splitlines()) - 1
r["msg"] = len(open("/proc/sysvipc/msg").read().splitlines()) - 1
r["fds"] = sorted(int(f) for f in os.listdir("/proc/self/fd"))
r["env"] = sorted(k for k in os.environ if k.startswith("LEFT"))
ign = [l.split()[1] for l in open("/proc/self/status") if l.startswith("SigIgn")][0]
# SIGHUP (1) and SIGUSR1 (10); Python itself ignores SIGPIPE.
r["ignored"] = [s for s in (1, 10) if int(ign, 16) & (1 << (s - 1))]
r["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print(json.dumps(r, sort_keys=True))
"#;

#[test]
fn nothing_of_one_run_reaches_the_next_made_ahead() {
    // (`always`: this host's cgroup2 mount may lack favordynmods, which
    // only makes the move slower.)
    let Some(d) = setup(
        "nothing_of_one_run_reaches_the_next_made_ahead",
        &["--prepared-runs", "always"],
    ) else {
        return;
    };
    std::fs::write(
        d.daemon
            .root
            .join("agents/a/workspace/sessions/s/current/leftovers.py"),
        LEFTOVERS,
    )
    .unwrap();
    // The first run leaves all it can, and stays: a file in its /tmp, a
    // SysV segment and queue, two signals ignored, a variable, a
    // descriptor, a process of its own session; it reports what it sees.
    bg(
        &d,
        "a",
        "s",
        &[
            "/bin/sh",
            "-c",
            "cd /allox/session; echo x > /tmp/left-behind; ipcmk -M 4096 >/dev/null; \
             ipcmk -Q >/dev/null; trap '' HUP USR1; export LEFT_BEHIND=1; exec 7<.; \
             setsid sleep 1000 </dev/null >/dev/null 2>&1 & \
             python3 leftovers.py > first.json; exec sleep 1000",
        ],
    );
    let first = d
        .daemon
        .root
        .join("agents/a/workspace/sessions/s/current/first.json");
    wait_until("the first run's report", || {
        std::fs::read_to_string(&first).is_ok_and(|s| s.ends_with('\n'))
    });
    let first: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&first).unwrap()).unwrap();
    // What the report sees where they are (it can fail).
    assert_eq!(first["tmp"], serde_json::json!(["left-behind"]), "{first}");
    assert_eq!(first["shm"], 1, "{first}");
    assert_eq!(first["msg"], 1, "{first}");
    assert_eq!(first["env"], serde_json::json!(["LEFT_BEHIND"]), "{first}");
    assert_eq!(first["ignored"], serde_json::json!([1, 10]), "{first}");
    assert!(
        first["fds"].as_array().unwrap().contains(&7.into()),
        "{first}"
    );
    assert!(first["pids"].as_array().unwrap().len() >= 4, "{first}");
    // The next run's PID 1, made ahead while the first went on.
    let ahead = ahead_procs(&d, "a", "s");
    assert_eq!(ahead.len(), 1, "{ahead:?}");
    let next: serde_json::Value = serde_json::from_str(&run(
        &d,
        "a",
        "s",
        &["/usr/bin/python3", "/allox/session/leftovers.py"],
    ))
    .unwrap();
    assert_eq!(
        next,
        serde_json::json!({
            "tmp": [], "shm": 0, "msg": 0, "fds": [0, 1, 2, 3], "env": [],
            "ignored": [], "pids": [1, 2],
        }),
        "the run made ahead sees what the first left"
    );
    // It was the one made ahead (used, and now ended), and another one
    // waits in its place.
    wait_until("the end of the PID 1 made ahead (it was not used)", || {
        !std::path::Path::new(&format!("/proc/{}", ahead[0])).exists()
    });
    let again = ahead_procs(&d, "a", "s");
    assert!(again.len() == 1 && again != ahead, "{again:?}");
}
