//! The session context: namespaces a session's runs share (its network
//! namespace), kept across rollback, gone with the session; and what a run
//! sees, which must stay what it was before runs were forked from a
//! per-session process.

use allox_integration::{require, ProcDaemon};
use allox_protocol::*;
use std::collections::BTreeMap;

fn setup(name: &str, extra: &[&str]) -> Option<ProcDaemon> {
    if !require(&format!("context::{name}")) {
        return None;
    }
    if allox_integration::cgroup2_mount().is_none() {
        panic!("context::{name} needs a cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified)");
    }
    let d = ProcDaemon::start(name, extra);
    let mut c = d.daemon.client();
    for (a, s) in [("a", "s"), ("a", "t")] {
        let _ = c.call(Request::AgentCreate(AgentCreate::new(a)));
        c.call(Request::SessionCreate(SessionCreate::new(a, s)))
            .unwrap()
            .unwrap();
    }
    Some(d)
}

fn start(a: &str, s: &str, argv: &[&str]) -> ProcessStart {
    ProcessStart {
        agent_id: a.into(),
        session_id: s.into(),
        argv: argv.iter().map(|x| x.to_string()).collect(),
        env: BTreeMap::new(),
        cwd: None,
        stdin: Some(String::new()),
        timeout_ms: None,
        wait: true,
        stream: false,
    }
}

fn call(d: &ProcDaemon, r: Request) -> Result<Response, ErrorBody> {
    d.daemon.client().call(r).expect("transport")
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
            out.push(format!("status {}", l.split_whitespace().collect::<Vec<_>>().join(" ")));
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
/// change of what every sandboxed program sees: it needs a reason.
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
mount /tmp rw,nosuid,nodev tmpfs rw,size=524288k
mount /usr ro,nosuid,nodev
env ALLOX_AGENT_ID=a
env ALLOX_AGENT_SHARED=/allox/shared
env ALLOX_AGENT_WORKSPACE=/allox
env ALLOX_RUN_ID=<run>
env ALLOX_SESSION_ID=s
env HOME=/allox/session
env LANG=C.UTF-8
env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
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
status Seccomp_filters: 3
hostname allox
ls / . .. allox bin dev etc lib lib32 lib64 opt proc sbin tmp usr
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
