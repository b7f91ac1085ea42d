//! Sandboxed runs through the real daemon: real namespaces, cgroups and
//! Btrfs, as an agent framework drives them.

use allox_integration::{call, make_sessions, process_start as start, require, ProcDaemon};
use allox_protocol::*;
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn setup(name: &str) -> Option<ProcDaemon> {
    setup_with_env(name, &[])
}

/// [`setup`] with extra environment for the daemon.
fn setup_with_env(name: &str, env: &[(&str, &str)]) -> Option<ProcDaemon> {
    setup_with(name, env, &[])
}

/// [`setup`] with extra environment and flags for the daemon.
fn setup_with(name: &str, env: &[(&str, &str)], flags: &[&str]) -> Option<ProcDaemon> {
    if !require(&format!("process::{name}")) {
        return None;
    }
    if allox_integration::cgroup2_mount().is_none() {
        panic!("process::{name} needs a cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified)");
    }
    let d = ProcDaemon::start_with_env(name, env, flags);
    make_sessions(&d, &[("a", "s"), ("a", "t"), ("b", "s")]);
    Some(d)
}

/// Runs `sh -c script` in a/s and waits.
fn sh(d: &ProcDaemon, a: &str, s: &str, script: &str) -> RunResult {
    match call(
        d,
        Request::ProcessStart(start(a, s, &["/bin/sh", "-c", script])),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{script}: {other:?}"),
    }
}

fn bg(d: &ProcDaemon, a: &str, s: &str, script: &str) -> String {
    let mut p = start(a, s, &["/bin/sh", "-c", script]);
    p.wait = false;
    match call(d, Request::ProcessStart(p)) {
        Ok(Response::Started(r)) => r.run_id,
        other => panic!("{script}: {other:?}"),
    }
}

fn current(d: &ProcDaemon, a: &str, s: &str) -> PathBuf {
    d.daemon
        .root
        .join(format!("agents/{a}/workspace/sessions/{s}/current"))
}

fn list(d: &ProcDaemon, a: &str, s: &str) -> Vec<ProcessInfo> {
    listing(d, a, s).processes
}

/// Whether a process of a/s runs `argv`.
fn running(d: &ProcDaemon, argv: &[&str]) -> bool {
    list(d, "a", "s").iter().any(|p| p.argv == argv)
}

fn listing(d: &ProcDaemon, a: &str, s: &str) -> ProcessListing {
    match call(
        d,
        Request::ProcessList(SessionRef {
            agent_id: a.into(),
            session_id: s.into(),
        }),
    ) {
        Ok(Response::Processes(l)) => l,
        other => panic!("{other:?}"),
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every process of `before` is still in `now`.
fn assert_survived(now: &[ProcessInfo], before: &[ProcessInfo], what: &str) {
    for p in before {
        assert!(
            now.iter().any(|q| q.pid == p.pid),
            "{what}: {} is gone",
            p.pid
        );
    }
}

fn kill_session(d: &ProcDaemon, a: &str, s: &str) -> u32 {
    match call(
        d,
        Request::ProcessKill(ProcessKill {
            agent_id: a.into(),
            session_id: s.into(),
            run_id: None,
            signal: None,
        }),
    ) {
        Ok(Response::Killed(k)) => k.killed,
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_sandbox_holds_no_privilege() {
    let Some(d) = setup("the_sandbox_holds_no_privilege") else {
        return;
    };
    // The descriptors the program got are read from a child forked before
    // any pipe or redirection: the shell itself holds a pipe's read end
    // while it starts a pipeline, and saves fds to 10 around redirections.
    // While `sleep` starts, its dynamic loader holds the libraries it maps
    // open for a moment (fd 3), so the listing is read again until it is
    // `0 1 2` or 10 s have passed: a descriptor the program inherited stays
    // open for as long as it runs, and fails the check.
    let r = sh(
        &d,
        "a",
        "s",
        "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs)' /proc/self/status; id -u; id -g; \
         sleep 30 & p=$!; i=0; \
         while fds=$(ls /proc/$p/fd | tr '\\n' ' '); [ \"$fds\" != '0 1 2 ' ] && [ $i -lt 100 ]; \
         do i=$((i+1)); sleep 0.1; done; echo \"$fds\"; kill $p; \
         ls /proc | grep -E '^[0-9]+$' | wc -l",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            r.stdout.contains(&format!("{cap}:\t0000000000000000")),
            "{cap} not empty: {}",
            r.stdout
        );
    }
    assert!(r.stdout.contains("NoNewPrivs:\t1"), "{}", r.stdout);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[6], "10000");
    assert_eq!(lines[7], "10000");
    assert_eq!(lines[8].trim(), "0 1 2", "descriptors above 2 leaked");
    // The init, sh, ls, grep, wc: nothing of the host.
    let visible: u32 = lines[9].trim().parse().unwrap();
    assert!(visible <= 6, "{visible} processes visible: {}", r.stdout);
}

#[test]
fn other_workspaces_and_the_host_are_out_of_reach() {
    let Some(d) = setup("other_workspaces_and_the_host_are_out_of_reach") else {
        return;
    };
    std::fs::write(current(&d, "a", "t").join("secret"), "t's data").unwrap();
    std::fs::write(current(&d, "b", "s").join("secret"), "b's data").unwrap();
    // A symlink planted in the workspace pointing at another session's tree.
    std::os::unix::fs::symlink(current(&d, "a", "t"), current(&d, "a", "s").join("planted"))
        .unwrap();
    let other = current(&d, "a", "t").join("secret");
    let store = d.daemon.root.display().to_string();
    let script = format!(
        "cat planted/secret; cat {o}; cat /allox/session/../../{o}; cat /proc/1/root/{o}; \
         ls {store}; ls /allox; ls /sys/fs/cgroup; \
         touch /usr/x /etc/x /proc/sys/kernel/x; echo x > /proc/sys/vm/drop_caches; \
         echo done",
        o = other.display()
    );
    let r = sh(&d, "a", "s", &script);
    assert!(r.stdout.contains("done"), "{r:?}");
    assert!(
        !r.stdout.contains("t's data") && !r.stdout.contains("b's data"),
        "{r:?}"
    );
    assert!(
        r.stdout.contains("session") && r.stdout.contains("shared"),
        "{r:?}"
    );
    assert!(
        !r.stdout.contains("store") && !r.stdout.contains("state"),
        "{r:?}"
    );
    for f in ["/usr/x", "/etc/x", "/proc/sys/kernel/x"] {
        assert!(
            !std::path::Path::new(f).exists(),
            "{f} was created on the host"
        );
        assert!(r.stderr.contains(f), "no error for {f}: {}", r.stderr);
    }
    assert!(!std::path::Path::new("/usr/x").exists());
}

/// Every refused system call, with arguments that make the kernel itself
/// answer something other than EPERM (a never-mapped address, a bad
/// descriptor, invalid flags), as bubblewrap's tests do: so an EPERM can
/// only come from the filter. Prints `name result errno` per call.
const REFUSED_PROBE: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    print(name, r, ctypes.get_errno(), flush=True)
B = 1  # an address that is never mapped
me = os.getpid()
call("mount", 165, B, B, B, 0, B)
call("umount2", 166, B, 0)
call("pivot_root", 155, B, B)
call("fsopen", 430, B, 0)
call("fsconfig", 431, -1, 0, 0, 0, 0)
call("fsmount", 432, -1, 0, 0)
call("fspick", 433, -1, B, 0)
call("open_tree", 428, -1, B, 0)
call("open_tree_attr", 467, -1, B, 0, B, 0)
call("move_mount", 429, -1, B, -1, B, 0)
call("mount_setattr", 442, -1, B, 0, B, 0)
call("bpf", 321, 1, B, 8)
call("perf_event_open", 298, B, 0, -1, -1, 0)
call("keyctl", 250, 0xffff, 0, 0, 0, 0)
call("add_key", 248, B, B, B, 0, 0)
call("request_key", 249, B, B, B, 0)
call("kexec_load", 246, 0, 1000, B, 0x12340000)
call("kexec_file_load", 320, -1, -1, 0, B, -1)
call("init_module", 175, B, 0, B)
call("finit_module", 313, -1, B, 0)
call("delete_module", 176, B, 0)
call("open_by_handle_at", 304, -1, B, 0)
call("setns", 308, -1, 0)
call("reboot", 169, 0, 0, 0, B)
call("swapon", 167, B, 0)
call("swapoff", 168, B)
call("syslog", 103, 3, B, -1)
call("io_uring_setup", 425, 1, B)
call("io_uring_enter", 426, -1, 0, 0, 0, 0, 0)
call("io_uring_register", 427, -1, 0, 0, 0)
call("userfaultfd", 323, 0x11)
call("kcmp", 312, me, me, 99, 0, 0)
call("process_vm_readv", 310, me, B, 1, B, 1, 0)
call("process_vm_writev", 311, me, B, 1, B, 1, 0)
call("socket_vsock", 41, 40, 0x1000001, 0)
call("unshare_newuser", 272, 0x10000000 | 0x8000)
call("clone_newuser", 56, 0x10000000 | 0x200, 0, 0, 0, 0)
call("personality_read_implies_exec", 135, 0x400000)
call("personality_uname26", 135, 0x20000)
call("personality_high_bits", 135, (1 << 32) | 0x400000)
libc.syscall(ctypes.c_long(135), ctypes.c_long(0))
call("ioctl_tiocsti", 16, -1, 0x5412, B)
call("ioctl_tiocsti_high_bits", 16, -1, 0x100005412, B)
call("ioctl_tioclinux", 16, -1, 0x541C, B)
for n, c in [("snap_create", 0x50009401), ("subvol_create", 0x5000940E),
             ("snap_destroy", 0x5000940F), ("snap_create_v2", 0x50009417),
             ("subvol_create_v2", 0x50009418), ("subvol_setflags", 0x4008941A),
             ("default_subvol", 0x40089413), ("snap_destroy_v2", 0x5000943F)]:
    call("ioctl_btrfs_" + n, 16, -1, c, B)
"#;

/// Calls for which the kernel checks the caller's privilege before it
/// reads any argument, so without the filter an unprivileged caller gets
/// EPERM too (syslog: with `kernel.dmesg_restrict = 1`). The filter's own
/// answer for them is shown by the seccomp unit tests, which make the deny
/// list answer an errno no kernel path gives.
const PRIVILEGE_CHECKED_FIRST: &[&str] = &[
    "pivot_root",
    "fsopen",
    "fsmount",
    "fspick",
    "move_mount",
    "reboot",
    "swapon",
    "swapoff",
    "syslog",
];

fn probe_lines(stdout: &str) -> BTreeMap<String, (i64, i32)> {
    stdout
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 3, "{l}");
            (
                f[0].to_string(),
                (f[1].parse().unwrap(), f[2].parse().unwrap()),
            )
        })
        .collect()
}

#[test]
fn refused_syscalls_fail_with_eperm() {
    let Some(d) = setup("refused_syscalls_fail_with_eperm") else {
        return;
    };
    if allox_integration::which("python3").is_none() {
        panic!("process::refused_syscalls_fail_with_eperm needs python3");
    }
    std::fs::write(current(&d, "a", "s").join("sc.py"), REFUSED_PROBE).unwrap();
    let r = match call(
        &d,
        Request::ProcessStart(start("a", "s", &["python3", "sc.py"])),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let sandboxed = probe_lines(&r.stdout);
    assert_eq!(sandboxed.len(), 51, "{}", r.stdout);
    for (name, got) in &sandboxed {
        assert_eq!(*got, (-1, libc::EPERM), "{name} not refused with EPERM");
    }
    // The same calls outside the sandbox, as the same unprivileged user
    // without the filter: the kernel answers something else.
    let host = std::process::Command::new("/usr/bin/python3")
        .arg("-")
        .uid(10_000)
        .gid(10_000)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .unwrap()
                .write_all(REFUSED_PROBE.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    let unfiltered = probe_lines(&String::from_utf8_lossy(&host.stdout));
    assert_eq!(unfiltered.len(), sandboxed.len());
    for (name, got) in &unfiltered {
        if !PRIVILEGE_CHECKED_FIRST.contains(&name.as_str()) {
            assert_ne!(
                got.1,
                libc::EPERM,
                "{name}: the kernel says EPERM without the filter too, so the probe proves nothing"
            );
        }
    }
}

/// What ordinary programs do: threads, subprocesses, multiprocessing
/// (fork and spawn, POSIX semaphores), asyncio with loopback sockets and
/// child processes, memfd, eventfd, mmap, the personality query and
/// ADDR_NO_RANDOMIZE that debuggers ask for; git, gcc, gdb and strace.
const ORDINARY: &str = r#"
import asyncio, ctypes, mmap, multiprocessing, os, socket, subprocess, sys, threading

def square(x):
    return x * x

async def echo(reader, writer):
    writer.write(await reader.readline())
    await writer.drain()
    writer.close()

async def aio():
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", "echo async", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert out == b"async\n", out
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"ping\n")
    assert await r.readline() == b"ping\n"
    w.close()
    server.close()
    await server.wait_closed()
    await asyncio.gather(*(asyncio.sleep(0.01) for _ in range(50)))

if __name__ == "__main__":
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(square(i))) for i in range(16)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert sorted(results) == [i * i for i in range(16)]
    out = subprocess.run(["sh", "-c", "echo hi | tr a-z A-Z"], capture_output=True, text=True)
    assert out.stdout == "HI\n", out
    for method in ("fork", "spawn", "forkserver"):
        with multiprocessing.get_context(method).Pool(2) as pool:
            assert pool.map(square, range(20)) == [x * x for x in range(20)], method
    lock = multiprocessing.Semaphore(1)
    with lock:
        pass
    asyncio.run(aio())
    a, b = socket.socketpair()
    a.sendall(b"x"); assert b.recv(1) == b"x"
    fd = os.memfd_create("m"); os.write(fd, b"abc"); os.close(fd)
    efd = os.eventfd(0); os.eventfd_write(efd, 3); assert os.eventfd_read(efd) == 3
    m = mmap.mmap(-1, 1 << 20); m[:3] = b"abc"; assert m[:3] == b"abc"
    assert os.access("/tmp", os.W_OK, follow_symlinks=False)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.personality.restype = ctypes.c_int
    assert libc.personality(0xffffffff) == 0
    assert libc.personality(0x40000) == 0  # ADDR_NO_RANDOMIZE, for debuggers
    assert libc.personality(0) == 0x40000
    print("ok")
"#;

#[test]
fn ordinary_programs_still_work() {
    let Some(d) = setup("ordinary_programs_still_work") else {
        return;
    };
    std::fs::write(current(&d, "a", "s").join("ordinary.py"), ORDINARY).unwrap();
    let r = match call(
        &d,
        Request::ProcessStart(start("a", "s", &["python3", "ordinary.py"])),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!((r.exit_code, r.stdout.as_str()), (Some(0), "ok\n"), "{r:?}");
    let r = sh(
        &d,
        "a",
        "s",
        "set -e; git init -q repo; cd repo; git config user.email a@b; git config user.name a; \
         seq 1 1000 > f; git add f; git commit -qm one; git checkout -qb side; echo x >> f; \
         git commit -qam two; git checkout -q -; git merge -q side; git gc -q; \
         git log --oneline | wc -l; tar cf - . | wc -c >/dev/null; find . -type f | wc -l >/dev/null; \
         echo done",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(r.stdout, "2\ndone\n", "{r:?}");
    // A C program with threads, built, traced and debugged in the sandbox.
    let tools = ["gcc", "strace", "gdb"];
    if let Some(t) = tools.iter().find(|t| allox_integration::which(t).is_none()) {
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!("SKIPPED process::ordinary_programs_still_work (C tools): no {t}\n").as_bytes(),
        );
        return;
    }
    let c = "#include <pthread.h>\n#include <stdio.h>\n\
             static void *f(void *a) { return a; }\n\
             int main(void) { pthread_t t; pthread_create(&t, 0, f, 0); \
             pthread_join(t, 0); puts(\"c ok\"); return 0; }\n";
    std::fs::write(current(&d, "a", "s").join("t.c"), c).unwrap();
    let r = sh(
        &d,
        "a",
        "s",
        "set -e; gcc -O2 -pthread t.c -o t; ./t; strace -f -o /dev/null ./t; \
         gdb -batch -ex run ./t 2>&1",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(r.stdout.matches("c ok").count(), 3, "{r:?}");
    assert!(r.stdout.contains("exited normally"), "{r:?}");
    assert!(
        !r.stdout
            .contains("Error disabling address space randomization"),
        "{r:?}"
    );
}

#[test]
fn setuid_binaries_do_not_elevate() {
    let Some(d) = setup("setuid_binaries_do_not_elevate") else {
        return;
    };
    let id = current(&d, "a", "s").join("myid");
    std::fs::copy("/usr/bin/id", &id).unwrap();
    std::os::unix::fs::chown(&id, Some(0), Some(0)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let r = sh(&d, "a", "s", "./myid -u");
    assert_eq!(r.stdout.trim(), "10000", "{r:?}");
}

#[test]
fn private_tmp_regular_files_are_kept() {
    let Some(d) = setup("private_tmp_regular_files_are_kept") else {
        return;
    };
    let r = sh(
        &d,
        "a",
        "s",
        "echo one > /tmp/a; mkdir -p /tmp/d/e; echo two > /tmp/d/e/b; mkfifo /tmp/fifo; \
         python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.bind('/tmp/sock')\"; \
         ln -s /etc/passwd /tmp/link; echo ok",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let kept = current(&d, "a", "s").join(".allox-tmp");
    assert_eq!(std::fs::read_to_string(kept.join("a")).unwrap(), "one\n");
    assert_eq!(
        std::fs::read_to_string(kept.join("d/e/b")).unwrap(),
        "two\n"
    );
    for gone in ["fifo", "sock", "link"] {
        assert!(
            std::fs::symlink_metadata(kept.join(gone)).is_err(),
            "{gone} was copied"
        );
    }
    // /tmp is private to the run: the next run starts with it empty.
    let r = sh(&d, "a", "s", "ls -A /tmp | wc -l");
    assert_eq!(r.stdout.trim(), "0");
}

/// A run answered as started has its program's process: the very next
/// `process.list` shows it (the sandbox's PID 1 is never listed), every
/// time: the answer waits for the program's process, not only for the
/// PID 1.
#[test]
fn a_started_run_is_listed_at_once() {
    let Some(d) = setup("a_started_run_is_listed_at_once") else {
        return;
    };
    for i in 0..20 {
        let mut p = start("a", "s", &["/bin/sleep", "30"]);
        p.wait = false;
        let run = match call(&d, Request::ProcessStart(p)) {
            Ok(Response::Started(r)) => r.run_id,
            other => panic!("{other:?}"),
        };
        // Its argv may still be empty: the answer comes as the program's
        // exec begins, and the kernel shows a new image's command line
        // only once the exec has laid it out.
        let l = list(&d, "a", "s");
        assert!(
            l.iter().any(|p| p.run_id.as_deref() == Some(run.as_str())),
            "start {i}: run {run} not listed right after its start: {l:?}"
        );
    }
    kill_session(&d, "a", "s");
    // An exec that fails is still answered as started, and ends 127.
    let mut p = start(
        "a",
        "s",
        &[
            "/bin/sh",
            "-c",
            "printf '#!/nonexistent\\n' > bad.sh; chmod 755 bad.sh",
        ],
    );
    p.wait = true;
    call(&d, Request::ProcessStart(p)).unwrap();
    let r = match call(&d, Request::ProcessStart(start("a", "s", &["./bad.sh"]))) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(r.exit_code, Some(127), "{r:?}");
    assert!(r.stderr.contains("cannot execute the program"), "{r:?}");
}

#[test]
fn output_streams_and_exit_status() {
    let Some(d) = setup("output_streams_and_exit_status") else {
        return;
    };
    let r = sh(&d, "a", "s", "echo out; echo err >&2; exit 3");
    assert_eq!((r.exit_code, r.signal), (Some(3), None));
    assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("out\n", "err\n"));
    assert!(!r.output_lossy);
    // Bytes that are not UTF-8 are replaced in the waited answer, and the
    // answer says so (binary output was changed without a word); the logs
    // keep them.
    let r = sh(&d, "a", "s", "printf '\\377\\376A'");
    assert_eq!(r.stdout, "\u{FFFD}\u{FFFD}A");
    assert!(r.output_lossy, "{r:?}");
    let r = sh(&d, "a", "s", "kill -TERM $$");
    assert_eq!((r.exit_code, r.signal), (None, Some(15)));
    // Streamed: the first chunk arrives before the program ends.
    let mut c = d.daemon.client();
    let mut p = start(
        "a",
        "s",
        &["/bin/sh", "-c", "echo first; sleep 1; echo second"],
    );
    p.stream = true;
    let t0 = Instant::now();
    let mut chunks = Vec::new();
    let ans = c
        .call_with_events(Request::ProcessStart(p), |e| {
            if let Event::Output(o) = e {
                chunks.push((t0.elapsed(), String::from_utf8_lossy(&o.data).into_owned()));
            }
        })
        .unwrap()
        .unwrap();
    assert!(
        matches!(ans, Response::Exited(ref r) if r.exit_code == Some(0)),
        "{ans:?}"
    );
    let end = t0.elapsed();
    assert_eq!(
        chunks.first().map(|c| c.1.as_str()),
        Some("first\n"),
        "{chunks:?}"
    );
    assert!(
        chunks[0].0 + Duration::from_millis(500) < end,
        "output was not streamed: {chunks:?}"
    );
    // stdin written later and closed.
    let mut p = start("a", "s", &["cat"]);
    p.wait = false;
    p.stdin = None;
    let Ok(Response::Started(run)) = call(&d, Request::ProcessStart(p)) else {
        panic!()
    };
    call(
        &d,
        Request::ProcessStdin(ProcessStdin {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run.run_id.clone(),
            data: "hello via stdin".into(),
            close: true,
        }),
    )
    .unwrap();
    let answer = call(
        &d,
        Request::ProcessWait(ProcessWait {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run.run_id.clone(),
            timeout_ms: Some(30_000),
        }),
    );
    let Ok(Response::Exited(r)) = answer else {
        panic!("the run did not end: {answer:?}")
    };
    assert_eq!(r.stdout, "hello via stdin");
    // Written to once it ended (its input closed, or still open): it is
    // said to have ended, with how.
    let mut p = start("a", "s", &["/bin/sh", "-c", "exit 3"]);
    p.stdin = None;
    let Ok(Response::Exited(open)) = call(&d, Request::ProcessStart(p)) else {
        panic!()
    };
    for (id, how) in [(&run.run_id, "exit code 0"), (&open.run_id, "exit code 3")] {
        let e = call(
            &d,
            Request::ProcessStdin(ProcessStdin {
                agent_id: "a".into(),
                session_id: "s".into(),
                run_id: id.clone(),
                data: "late".into(),
                close: false,
            }),
        )
        .unwrap_err();
        assert!(
            e.code == ErrorCode::Conflict
                && e.message.contains(&format!("run {id} has ended ({how})")),
            "{e:?}"
        );
    }
}

#[test]
fn bad_requests_are_refused_at_once() {
    let Some(d) = setup("bad_requests_are_refused_at_once") else {
        return;
    };
    let t0 = Instant::now();
    let e = call(
        &d,
        Request::ProcessStart(start("a", "s", &["no-such-program"])),
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest);
    assert!(e.message.contains("no-such-program"), "{}", e.message);
    assert!(t0.elapsed() < Duration::from_secs(2));
    // A kill on disconnect that no connection could ask for (the run is
    // not followed: no wait, or no stream) is refused, not ignored.
    for (wait, stream) in [(false, false), (true, false), (false, true)] {
        let mut p = start("a", "s", &["ls"]);
        (p.wait, p.stream, p.on_disconnect) = (wait, stream, OnDisconnect::Kill);
        let e = call(&d, Request::ProcessStart(p)).unwrap_err();
        assert!(
            e.code == ErrorCode::InvalidRequest && e.message.contains("needs wait and stream"),
            "{e:?}"
        );
    }
    let mut p = start("a", "s", &["ls"]);
    p.cwd = Some("../../..".into());
    assert_eq!(
        call(&d, Request::ProcessStart(p)).unwrap_err().code,
        ErrorCode::InvalidRequest
    );
    let p = start("a", "s", &["ls", "a\0b"]);
    assert_eq!(
        call(&d, Request::ProcessStart(p)).unwrap_err().code,
        ErrorCode::InvalidRequest
    );
    let big = "x".repeat(600 * 1024);
    let p = start("a", "s", &["ls", &big]);
    assert_eq!(
        call(&d, Request::ProcessStart(p)).unwrap_err().code,
        ErrorCode::InvalidRequest
    );
    let mut p = start("a", "s", &["ls"]);
    p.env.insert("A=B".into(), "x".into());
    assert_eq!(
        call(&d, Request::ProcessStart(p)).unwrap_err().code,
        ErrorCode::InvalidRequest
    );
    let p = start("a", "nope", &["ls"]);
    assert_eq!(
        call(&d, Request::ProcessStart(p)).unwrap_err().code,
        ErrorCode::NotFound
    );
}

#[test]
fn timeouts_and_background_output_do_not_hang() {
    let Some(d) = setup("timeouts_and_background_output_do_not_hang") else {
        return;
    };
    let mut p = start("a", "s", &["sleep", "30"]);
    p.timeout_ms = Some(300);
    let t0 = Instant::now();
    let Ok(Response::Exited(r)) = call(&d, Request::ProcessStart(p)) else {
        panic!()
    };
    assert!(r.timed_out && r.signal == Some(9), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    // A background process keeps stdout open; the answer still comes once
    // the main program has exited.
    let t0 = Instant::now();
    let r = sh(&d, "a", "s", "sleep 60 & echo main done");
    assert_eq!(r.stdout, "main done\n");
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "wait hung: {:?}",
        t0.elapsed()
    );
    assert_eq!(list(&d, "a", "s").len(), 1, "the background sleep lives on");
    kill_session(&d, "a", "s");
}

#[test]
fn session_kill_gets_every_kind_of_process_and_nothing_else() {
    let Some(d) = setup("session_kill_gets_every_kind_of_process") else {
        return;
    };
    let keep = bg(&d, "a", "t", "sleep 1000");
    wait_until("the other session's run", || !list(&d, "a", "t").is_empty());
    let before = list(&d, "a", "t");
    bg(&d, "a", "s", "setsid sleep 1000 & (sleep 1000 &) ; nohup sleep 1000 >/dev/null 2>&1 & sleep 1000 & kill -STOP $!; wait");
    // A frozen run too.
    let frozen = bg(&d, "a", "s", "sleep 1000");
    wait_until("the runs' processes", || list(&d, "a", "s").len() >= 6);
    let run_cg = d.cgroup.join(format!("allox/a/s/run-{frozen}"));
    std::fs::write(run_cg.join("cgroup.freeze"), "1").unwrap();
    let n = kill_session(&d, "a", "s");
    assert!(n >= 6, "killed {n}");
    assert!(list(&d, "a", "s").is_empty(), "{:?}", list(&d, "a", "s"));
    let others = list(&d, "a", "t");
    assert_survived(&others, &before, "another session's process was touched");
    assert!(others
        .iter()
        .all(|p| p.run_id.as_deref() == Some(keep.as_str())));
}

#[test]
fn process_bombs_are_killed_completely_every_time() {
    let Some(d) = setup("process_bombs_are_killed_completely") else {
        return;
    };
    // The development host offers no pids controller, so the bomb is
    // bounded by itself (about 200 processes), and killed mid-growth.
    for round in 0..20 {
        bg(
            &d,
            "a",
            "s",
            "b() { sleep 100 & sleep 100 & }; for i in $(seq 100); do b; done; wait",
        );
        wait_until("the bomb to grow", || list(&d, "a", "s").len() > 20);
        kill_session(&d, "a", "s");
        let left = list(&d, "a", "s");
        assert!(left.is_empty(), "round {round}: {} left", left.len());
    }
}

#[test]
fn orphans_are_reaped_and_floods_are_bounded() {
    let Some(d) = setup("orphans_are_reaped_and_floods_are_bounded") else {
        return;
    };
    let r = sh(
        &d,
        "a",
        "s",
        "for i in $(seq 100); do (sleep 0.2 &) ; done; echo spawned",
    );
    assert_eq!(r.stdout, "spawned\n");
    wait_until("the orphans to end", || list(&d, "a", "s").is_empty());
    let zombies = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter(|s| {
                let rest = &s[s.rfind(')').unwrap_or(0) + 2..];
                let f: Vec<&str> = rest.split_whitespace().collect();
                f.first() == Some(&"Z")
                    && f.get(1) == Some(&d.daemon.child.id().to_string().as_str())
            })
            .count()
    };
    // A child of the supervisor that has just exited (the run's init) is
    // a zombie until the supervisor's reaper gets to it: none may stay.
    wait_until("the supervisor to reap its children (zombies left)", || {
        zombies() == 0
    });
    // 2 GiB of output, not streamed: captured up to the limit, the rest
    // dropped; the supervisor's memory stays small.
    let r = sh(&d, "a", "s", "head -c 2147483648 /dev/zero");
    assert!(
        r.truncated && r.stdout.len() <= 256 << 10,
        "len {}",
        r.stdout.len()
    );
    let rss_kb: u64 = std::fs::read_to_string(format!("/proc/{}/status", d.daemon.child.id()))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap();
    assert!(rss_kb < 200 * 1024, "supervisor RSS {rss_kb} kB");
}

#[test]
fn rollback_and_delete_with_live_processes() {
    let Some(d) = setup("rollback_and_delete_with_live_processes") else {
        return;
    };
    let ck = |id: &str| {
        call(
            &d,
            Request::CheckpointCreate(CheckpointCreate {
                agent_id: "a".into(),
                session_id: "s".into(),
                checkpoint_id: id.into(),
                pinned: false,
                label: None,
            }),
        )
        .unwrap();
    };
    let rb = |kill: Option<bool>| {
        call(
            &d,
            Request::SessionRollback(SessionRollback {
                agent_id: "a".into(),
                session_id: "s".into(),
                checkpoint_id: "c1".into(),
                kill_processes: kill,
            }),
        )
    };
    ck("c1");
    bg(&d, "a", "s", "echo changed > work.txt; sleep 1000");
    let other = bg(&d, "a", "t", "sleep 1000");
    wait_until("the background run", || {
        current(&d, "a", "s").join("work.txt").exists()
    });
    wait_until("the other run", || !list(&d, "a", "t").is_empty());
    let others = list(&d, "a", "t");
    let e = rb(None).unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict, "{e:?}");
    assert!(
        current(&d, "a", "s").join("work.txt").exists(),
        "a refused rollback changed files"
    );
    // A rollback that cannot happen touches no process, whatever it asks
    // (a misnamed checkpoint with kill_processes killed the session's
    // runs, then answered not_found).
    let before = list(&d, "a", "s");
    for kill in [Some(true), None] {
        let e = call(
            &d,
            Request::SessionRollback(SessionRollback {
                agent_id: "a".into(),
                session_id: "s".into(),
                checkpoint_id: "c-typo".into(),
                kill_processes: kill,
            }),
        )
        .unwrap_err();
        assert!(
            e.code == ErrorCode::NotFound && e.message.contains("checkpoint a/s/c-typo"),
            "{kill:?}: {e:?}"
        );
        assert_survived(&list(&d, "a", "s"), &before, "a refused rollback");
    }
    let Ok(Response::RolledBack(r)) = rb(Some(true)) else {
        panic!()
    };
    assert!(r.killed_processes >= 1, "{r:?}");
    assert!(list(&d, "a", "s").is_empty());
    assert!(!current(&d, "a", "s").join("work.txt").exists());
    assert_survived(
        &list(&d, "a", "t"),
        &others,
        "rollback touched another session",
    );
    // Delete kills first.
    call(
        &d,
        Request::SessionDelete(SessionDelete {
            agent_id: "a".into(),
            session_id: "t".into(),
            force: true,
        }),
    )
    .unwrap();
    assert!(!d.cgroup.join("allox/a/t").exists());
    let finished = sh(&d, "b", "s", "echo the old session").run_id;
    bg(&d, "b", "s", "sleep 1000");
    call(
        &d,
        Request::AgentDelete(AgentDelete {
            agent_id: "b".into(),
            force: true,
        }),
    )
    .unwrap();
    assert!(
        !d.cgroup.join("allox/b").exists(),
        "agent cgroup left with processes"
    );
    // A session made again under a deleted one's name (of a deleted agent
    // too) has none of its runs: the one the delete killed and the one
    // that had finished are not found.
    make_sessions(&d, &[("a", "t"), ("b", "s")]);
    for (a, s, run) in [("a", "t", &other), ("b", "s", &finished)] {
        let wait = Request::ProcessWait(ProcessWait {
            agent_id: a.into(),
            session_id: s.into(),
            run_id: run.clone(),
            timeout_ms: Some(0),
        });
        match call(&d, wait) {
            Err(e) if e.code == ErrorCode::NotFound => {}
            other => panic!("{a}/{s} made again answers the deleted one's run {run}: {other:?}"),
        }
    }
}

#[test]
fn a_restarted_supervisor_adopts_running_sessions() {
    let Some(mut d) = setup("a_restarted_supervisor_adopts_running_sessions") else {
        return;
    };
    let run = bg(&d, "a", "s", "sleep 1000");
    bg(&d, "a", "t", "sleep 1000");
    wait_until("the runs", || {
        !list(&d, "a", "s").is_empty() && !list(&d, "a", "t").is_empty()
    });
    let before = list(&d, "a", "s");
    d.restart(&[]);
    let l = list(&d, "a", "s");
    assert_survived(&l, &before, "the run did not survive the restart");
    assert!(l.iter().all(|p| p.run_id.as_deref() == Some(run.as_str())));
    // Kill one run by id, then roll back another session with kill.
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
    assert!(list(&d, "a", "s").is_empty());
    call(
        &d,
        Request::CheckpointCreate(CheckpointCreate {
            agent_id: "a".into(),
            session_id: "t".into(),
            checkpoint_id: "c".into(),
            pinned: false,
            label: None,
        }),
    )
    .unwrap();
    let Ok(Response::RolledBack(r)) = call(
        &d,
        Request::SessionRollback(SessionRollback {
            agent_id: "a".into(),
            session_id: "t".into(),
            checkpoint_id: "c".into(),
            kill_processes: Some(true),
        }),
    ) else {
        panic!()
    };
    assert!(r.killed_processes >= 1);
    assert!(list(&d, "a", "t").is_empty());
}

/// A supervisor started on the store with another `--cgroup-root` while
/// the store's runs live under the earlier one refuses to start, naming
/// both (it started, saw no run, and the programs went on unseen and
/// beyond every kill and delete); once they have ended it starts. A
/// `--cgroup-root` outside a cgroup2 filesystem is refused at start (it
/// was taken, and every run failed `internal`).
#[test]
fn a_supervisor_does_not_lose_the_store_s_runs_to_another_cgroup_root() {
    let name = "a_supervisor_does_not_lose_the_store_s_runs_to_another_cgroup_root";
    let Some(mut d) = setup(name) else {
        return;
    };
    bg(&d, "a", "s", "sleep 1000");
    wait_until("the run", || !list(&d, "a", "s").is_empty());
    d.daemon.terminate();
    let other = allox_integration::cgroup2_mount()
        .unwrap()
        .join(format!("allox-test-{}-other", std::process::id()));
    let plain = d.fs.scratch().join("not-a-cgroup");
    let (store, socket, stage) = (
        d.daemon.root.clone(),
        d.daemon.socket.clone(),
        d.fs.scratch().join("stage"),
    );
    let start = |root: &std::path::Path| {
        allox_integration::supervise_command(
            &allox_integration::workspace_bin("allox-init"),
            &store,
            &socket,
            Some(root),
        )
        .arg("--sandbox-stage")
        .arg(&stage)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
    };
    let refused = |root: &std::path::Path| {
        let mut child = start(root);
        let t0 = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("started under {}", root.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = refused(&other);
    let old = d.cgroup.display().to_string();
    assert!(
        code == Some(1)
            && err.contains(&format!("runs of this store are still in {old}/allox"))
            && err.contains(&format!("start it with --cgroup-root {old}")),
        "{code:?}: {err}"
    );
    let (code, err) = refused(&plain);
    assert!(
        code == Some(1) && err.contains("not in a cgroup2 filesystem"),
        "{code:?}: {err}"
    );
    assert!(!plain.exists(), "made a plain directory for cgroups");
    assert!(!other.exists(), "the refused start made cgroups");
    // Under its own root again the run is there; once it has ended, the
    // other root is taken.
    d.restart(&[]);
    assert!(!list(&d, "a", "s").is_empty(), "the run is gone");
    kill_session(&d, "a", "s");
    wait_until("the run's end", || list(&d, "a", "s").is_empty());
    d.daemon.terminate();
    let mut moved = start(&other);
    wait_until("the daemon under the other root", || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });
    assert!(moved.try_wait().unwrap().is_none(), "it stopped");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(moved.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    moved.wait().unwrap();
    // A root that cannot be kept (the disk full) is not taken: after a
    // crash its runs would go on unseen by a successor started under the
    // one kept (it started, with a warning, before).
    let current = d.daemon.root.join("agents/a/workspace/sessions/s/current");
    let mut filled = allox_integration::fill_disk(&current);
    // And the spare room the store keeps for such files spent (given up
    // for another, its blocks taken by an agent's writer): with it the
    // root is kept, and the start goes on.
    std::fs::OpenOptions::new()
        .write(true)
        .open(d.daemon.root.join("state/.spare-room"))
        .unwrap()
        .set_len(0)
        .unwrap();
    let _ = std::process::Command::new("sync").status();
    std::fs::create_dir(current.join("more")).unwrap();
    filled.extend(allox_integration::fill_disk(&current.join("more")));
    let third = other.with_file_name(format!("allox-test-{}-third", std::process::id()));
    let (code, err) = refused(&third);
    assert!(
        code == Some(1) && err.contains("cannot keep this daemon's cgroup root"),
        "{code:?}: {err}"
    );
    // Nothing of the refused start is left in the cgroup tree.
    assert!(
        !third.exists(),
        "the refused start left {}",
        third.display()
    );
    for f in filled {
        let _ = std::fs::remove_file(f);
    }
    let _ = std::process::Command::new("sync").status();
    allox_integration::remove_cgroup_tree(&third);
    allox_integration::remove_cgroup_tree(&other);
    d.restart(&[]);
}

/// Deletes racing pauses, creates and forks leave no cgroup of what they
/// deleted (a pause made a deleted session's cgroup again, frozen; a
/// create or a fork between an agent's delete and its cgroups' removal
/// made them again), and every answer is one some order of the requests
/// gives.
#[test]
fn deletes_racing_pauses_creates_and_forks_leave_no_cgroup_behind() {
    let Some(d) = setup("deletes_racing_pauses_creates_and_forks_leave_no_cgroup_behind") else {
        return;
    };
    let ok_or = |what: &str, r: Result<Response, ErrorBody>, allowed: &[ErrorCode]| {
        if let Err(e) = r {
            assert!(allowed.contains(&e.code), "{what}: {e:?}");
        }
    };
    for round in 0..12 {
        call(&d, Request::AgentCreate(AgentCreate::new("g"))).unwrap();
        make_sessions(&d, &[("g", "x")]);
        bg(&d, "g", "x", "sleep 1000");
        std::thread::scope(|sc| {
            let d = &d;
            let delete = || {
                Request::AgentDelete(AgentDelete {
                    agent_id: "g".into(),
                    force: true,
                })
            };
            // Two deletes at once too (they answered `internal`, naming
            // cgroup files the other had removed).
            let racers: Vec<(&str, Request)> = vec![
                ("delete", delete()),
                ("another delete", delete()),
                (
                    "pause",
                    Request::SessionPause(SessionPause {
                        agent_id: "g".into(),
                        session_id: "x".into(),
                        hold: true,
                    }),
                ),
                (
                    "create",
                    Request::SessionCreate(SessionCreate::new("g", "n")),
                ),
                (
                    "fork",
                    Request::SessionFork(SessionFork {
                        agent_id: "a".into(),
                        session_id: "s".into(),
                        from: "current".into(),
                        new_agent_id: Some("g".into()),
                        new_session_id: "f".into(),
                        label: None,
                    }),
                ),
            ];
            let handles: Vec<_> = racers
                .into_iter()
                .map(|(what, r)| sc.spawn(move || (what, call(d, r))))
                .collect();
            for h in handles {
                let (what, r) = h.join().unwrap();
                // Refused: the agent (or session) gone, or being deleted.
                ok_or(what, r, &[ErrorCode::NotFound, ErrorCode::Conflict]);
            }
        });
        // What the store holds of g, the cgroups hold, and no more.
        let sessions: Vec<String> = match call(
            &d,
            Request::SessionList(AgentRef {
                agent_id: "g".into(),
            }),
        ) {
            Ok(Response::Sessions(l)) => l.sessions.into_iter().map(|s| s.session_id).collect(),
            Err(e) if e.code == ErrorCode::NotFound => Vec::new(),
            other => panic!("{other:?}"),
        };
        let dir = d.cgroup.join("allox/g");
        let mut cgroups: Vec<String> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        cgroups.sort();
        for c in &cgroups {
            assert!(
                sessions.contains(c),
                "round {round}: cgroup g/{c} of no session (sessions: {sessions:?})"
            );
        }
        let agents = match call(&d, Request::AgentList(AgentList {})) {
            Ok(Response::Agents(l)) => l.agents,
            other => panic!("{other:?}"),
        };
        if !agents.iter().any(|a| a.agent_id == "g") {
            assert!(
                !dir.exists(),
                "round {round}: the deleted agent's cgroup is left"
            );
        }
        let _ = call(
            &d,
            Request::AgentDelete(AgentDelete {
                agent_id: "g".into(),
                force: true,
            }),
        );
        assert!(
            !dir.exists(),
            "round {round}: the agent's cgroup outlived its delete"
        );
    }
}

#[test]
fn limits_are_applied_or_refused_as_unsupported() {
    let Some(d) = setup("limits_are_applied_or_refused_as_unsupported") else {
        return;
    };
    let offered =
        std::fs::read_to_string(d.cgroup.join("allox/cgroup.controllers")).unwrap_or_default();
    let mut req = SessionCreate::new("a", "limited");
    req.pids_max = Some(64);
    let out = call(&d, Request::SessionCreate(req));
    if !offered.split_whitespace().any(|c| c == "pids") {
        let e = out.unwrap_err();
        assert_eq!(e.code, ErrorCode::Unsupported, "{e:?}");
        assert!(e.message.contains("pids"), "{}", e.message);
        // Nothing was created.
        let Ok(Response::Sessions(l)) = call(
            &d,
            Request::SessionList(AgentRef {
                agent_id: "a".into(),
            }),
        ) else {
            panic!()
        };
        assert!(l.sessions.iter().all(|s| s.session_id != "limited"));
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"SKIPPED process::fork bomb under pids.max: this host's cgroup2 offers no pids controller\n",
        );
        return;
    }
    out.unwrap();
    assert_eq!(
        std::fs::read_to_string(d.cgroup.join("allox/a/limited/pids.max"))
            .unwrap()
            .trim(),
        "64"
    );
    for round in 0..100 {
        bg(&d, "a", "limited", "b() { b | b & }; b");
        wait_until("the bomb to hit pids.max", || {
            list(&d, "a", "limited").len() >= 30
        });
        kill_session(&d, "a", "limited");
        assert!(list(&d, "a", "limited").is_empty(), "round {round}");
    }
}

#[test]
fn hostile_run_ids_signals_and_abis_are_refused() {
    let Some(d) = setup("hostile_run_ids_signals_and_abis_are_refused") else {
        return;
    };
    let keep = bg(&d, "b", "s", "sleep 1000");
    wait_until("b's run", || !list(&d, "b", "s").is_empty());
    let run = bg(&d, "a", "s", "sleep 1000");
    for id in [format!("{run}/../../../b/s"), "../..".into(), "a/b".into()] {
        let e = call(
            &d,
            Request::ProcessKill(ProcessKill {
                agent_id: "a".into(),
                session_id: "s".into(),
                run_id: Some(id.clone()),
                signal: None,
            }),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest, "{id}: {e:?}");
        let e = call(
            &d,
            Request::ProcessWait(ProcessWait {
                agent_id: "a".into(),
                session_id: "s".into(),
                run_id: id.clone(),
                timeout_ms: Some(10),
            }),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest, "{id}: {e:?}");
    }
    assert!(list(&d, "b", "s")
        .iter()
        .all(|p| p.run_id.as_deref() == Some(keep.as_str())));
    assert!(
        !list(&d, "b", "s").is_empty(),
        "another agent's run was killed"
    );
    let e = call(
        &d,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: Some(run),
            signal: Some(19),
        }),
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::Unsupported);
    // x32 system calls (bit 30 set) answer ENOSYS instead of slipping past
    // the x86-64 rules.
    let script = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n\
                  r = libc.syscall(ctypes.c_long(0x40000000 | 272), ctypes.c_long(0x10000000))\n\
                  print(r, ctypes.get_errno())\n";
    std::fs::write(current(&d, "a", "s").join("x32.py"), script).unwrap();
    let Ok(Response::Exited(r)) = call(
        &d,
        Request::ProcessStart(start("a", "s", &["python3", "x32.py"])),
    ) else {
        panic!()
    };
    assert_eq!(r.stdout.trim(), "-1 38", "{r:?}");
}

#[test]
fn a_streamed_run_ends_even_if_a_background_child_keeps_its_output() {
    let Some(d) = setup("a_streamed_run_ends_even_if_a_background_child_keeps_its_output") else {
        return;
    };
    let mut c = d.daemon.client();
    let mut p = start("a", "s", &["/bin/sh", "-c", "sleep 1000 & echo main"]);
    p.stream = true;
    let t0 = Instant::now();
    let mut out = Vec::new();
    let ans = c
        .call_with_events(Request::ProcessStart(p), |e| {
            if let Event::Output(o) = e {
                out.extend(o.data.0);
            }
        })
        .unwrap()
        .unwrap();
    assert!(
        matches!(ans, Response::Exited(ref r) if r.exit_code == Some(0)),
        "{ans:?}"
    );
    assert_eq!(out, b"main\n");
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "answer held back: {:?}",
        t0.elapsed()
    );
    kill_session(&d, "a", "s");
}

#[test]
fn isolated_network_has_only_loopback() {
    if !require("process::isolated_network_has_only_loopback") {
        return;
    }
    let d = ProcDaemon::start("isolated_network", &["--sandbox-network", "isolated"]);
    let mut c = d.daemon.client();
    c.call(Request::AgentCreate(AgentCreate::new("a")))
        .unwrap()
        .unwrap();
    c.call(Request::SessionCreate(SessionCreate::new("a", "s")))
        .unwrap()
        .unwrap();
    // A service on the host's loopback, like an unauthenticated gateway.
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    let script = format!(
        "import socket\n\
         try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('host reachable')\n\
         except OSError as e: print('host unreachable', e.errno)\n\
         s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n\
         c = socket.create_connection(s.getsockname(), timeout=2); print('loopback ok')\n\
         print(sorted(n for _, n in socket.if_nameindex()))\n"
    );
    std::fs::write(current(&d, "a", "s").join("net.py"), script).unwrap();
    let Ok(Response::Exited(r)) = call(
        &d,
        Request::ProcessStart(start("a", "s", &["python3", "net.py"])),
    ) else {
        panic!()
    };
    assert!(r.stdout.contains("host unreachable"), "{r:?}");
    assert!(r.stdout.contains("loopback ok"), "{r:?}");
    assert!(r.stdout.contains("['lo']"), "{r:?}");
    drop(host);
}

#[test]
fn alloxctl_exec_streams_and_exits_with_the_status() {
    let Some(d) = setup("alloxctl_exec_streams_and_exits_with_the_status") else {
        return;
    };
    let ctl = allox_integration::workspace_bin("alloxctl");
    let run = |args: &[&str]| {
        std::process::Command::new(&ctl)
            .arg("--socket")
            .arg(&d.daemon.socket)
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&[
        "exec",
        "a",
        "s",
        "--",
        "sh",
        "-c",
        "echo to-out; echo to-err >&2; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "to-out\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("to-err"));
    // With --json the output is kept for the result printed at the end
    // (the daemon refused every such exec: `on_disconnect` kill without a
    // stream).
    let out = run(&[
        "--json",
        "exec",
        "a",
        "s",
        "--",
        "sh",
        "-c",
        "echo to-out; echo to-err >&2; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&v["exit_code"], &v["stdout"], &v["stderr"]),
        (
            &serde_json::json!(7),
            &serde_json::json!("to-out\n"),
            &serde_json::json!("to-err\n")
        )
    );
    let out = run(&["exec", "a", "s", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(out.status.code(), Some(128 + 9));
    let out = run(&["exec", "--timeout-ms", "200", "a", "s", "--", "sleep", "30"]);
    assert_eq!(out.status.code(), Some(124));
    // A program that is not there: 127, as a shell says it.
    let out = run(&["exec", "a", "s", "--", "no-such-program"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid_request"));
    // Output arrives while the program runs: read the first line from the
    // pipe before the program can have finished.
    let mut child = std::process::Command::new(&ctl)
        .arg("--socket")
        .arg(&d.daemon.socket)
        .args([
            "exec",
            "a",
            "s",
            "--",
            "sh",
            "-c",
            "echo early; sleep 2; echo late",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut first,
    )
    .unwrap();
    assert_eq!(first, "early\n");
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "not streamed: {:?}",
        t0.elapsed()
    );
    assert_eq!(child.wait().unwrap().code(), Some(0));
    // A signal to alloxctl before its signal thread exists (made only for
    // a run still going after a grace, here 2 s) waits for it, and then
    // reaches the run: SIGTERM ends `sleep`, alloxctl exits as it did.
    // alloxctl starts with its standard output closed: what the run writes
    // goes nowhere, not into the daemon's socket (which would take
    // descriptor 1, and garble the kill that follows).
    let mut child = std::process::Command::new("bash")
        .args(["-c", r#"exec "$@" >&-"#, "bash"])
        .arg(&ctl)
        .arg("--socket")
        .arg(&d.daemon.socket)
        .args(["exec", "a", "s", "--", "sh", "-c", "echo hi; exec sleep 31"])
        .env("ALLOX_EXEC_SIGNAL_GRACE_MS", "2000")
        .spawn()
        .unwrap();
    let sleeping = || running(&d, &["sleep", "31"]);
    wait_until("the run's sleep", sleeping);
    let t0 = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = allox_integration::wait_for_exit(&mut child, Duration::from_secs(20))
        .expect("alloxctl ends after its grace");
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
    assert!(t0.elapsed() < Duration::from_secs(20));
    assert!(!sleeping(), "the run got the signal");
    // With a closed pipe for its output, alloxctl is not killed by SIGPIPE
    // but exits as the run did.
    let out = std::process::Command::new("bash")
        .args([
            "-c",
            r#""$@" | true; echo "status=${PIPESTATUS[0]}""#,
            "bash",
        ])
        .arg(&ctl)
        .arg("--socket")
        .arg(&d.daemon.socket)
        .args(["exec", "a", "s", "--", "seq", "200000"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "status=0\n",
        "{out:?}"
    );
}

/// `alloxctl exec a s -- /bin/sh -c SCRIPT`, its output piped to the test.
fn exec_piped(d: &ProcDaemon, script: &str) -> std::process::Child {
    std::process::Command::new(allox_integration::workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(&d.daemon.socket)
        .args(["exec", "a", "s", "--", "/bin/sh", "-c", script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn alloxctl_exec_whose_output_is_not_read_still_passes_its_signals_on() {
    let Some(d) = setup("alloxctl_exec_whose_output_is_not_read_still_passes_its_signals_on")
    else {
        return;
    };
    // A reader that never drains alloxctl's output (a stalled pager, a log
    // shipper): the run's first output fills the pipe before alloxctl
    // ever waits on the daemon.
    let mut child = exec_piped(&d, "trap '' INT; exec yes stalled");
    let yes = || running(&d, &["yes", "stalled"]);
    wait_until("the run's yes", yes);
    let stuck =
        |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
    wait_until("alloxctl blocked writing its output", || {
        stuck(child.id()).contains("pipe_write")
    });
    let interrupt = || {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .unwrap()
    };
    // The run ignores the first Ctrl-C; the second kills it, though
    // alloxctl's output is still full (the first was passed on, and the
    // thread that did it then waited for an answer behind the output).
    interrupt();
    std::thread::sleep(Duration::from_millis(500));
    assert!(yes(), "the run did not ignore SIGINT");
    interrupt();
    wait_until("the run to end of the second Ctrl-C", || !yes());
    drop(child.stdout.take());
    let status = allox_integration::wait_for_exit(&mut child, Duration::from_secs(20))
        .expect("alloxctl ends once its reader goes");
    assert!(!status.success(), "{status:?}");
}

/// `alloxctl exec` stopped (Ctrl-Z) for longer than the daemon's write
/// limit while its run prints: the run is slowed, not killed, and on
/// `fg` its output goes on where it stopped (the daemon dropped the
/// client after 10 s and killed the run as gone).
#[test]
fn alloxctl_exec_stopped_for_a_while_slows_its_run_and_goes_on() {
    use std::io::BufRead;
    let Some(d) = setup("alloxctl_exec_stopped_for_a_while_slows_its_run_and_goes_on") else {
        return;
    };
    let mut child = exec_piped(
        &d,
        "i=0; while [ $i -lt 2000000 ]; do i=$((i+1)); echo line $i; done",
    );
    // Killed however the test ends: a stopped alloxctl left behind holds
    // the test's output open, and whatever reads it waits for ever.
    struct KillAtEnd(i32);
    impl Drop for KillAtEnd {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let reap = KillAtEnd(child.id() as i32);
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = 1u64;
    let mut expect = |lines: &mut dyn Iterator<Item = std::io::Result<String>>, n: u64| {
        for _ in 0..n {
            let l = lines.next().expect("more output").unwrap();
            assert_eq!(l, format!("line {next}"), "output lost or out of order");
            next += 1;
        }
    };
    expect(&mut lines, 1000);
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // Past the daemon's 10 s limit on a write.
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(
        list(&d, "a", "s").len(),
        1,
        "the run of a stopped client is gone"
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    expect(&mut lines, 200_000);
    let run = list(&d, "a", "s")
        .first()
        .and_then(|p| p.run_id.clone())
        .expect("the run ended early");
    // Stopped again, its run killed: the run's end is known at once, not
    // once its output's readers gave up waiting for the client (10 s,
    // which held a shutdown as long).
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    kill_session(&d, "a", "s");
    let ended = call(
        &d,
        Request::ProcessWait(ProcessWait {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run,
            timeout_ms: Some(5_000),
        }),
    );
    assert!(matches!(ended, Ok(Response::Exited(_))), "{ended:?}");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    drop(lines);
    let status = allox_integration::wait_for_exit(&mut child, Duration::from_secs(20))
        .expect("alloxctl ends with its run");
    // Reaped: its pid is no longer its own to kill.
    std::mem::forget(reap);
    assert!(!status.success(), "{status:?}");
}

/// The sandbox init of a run: the process of the run's cgroup whose parent
/// is outside it.
fn sandbox_init(d: &ProcDaemon, a: &str, s: &str, run: &str) -> i32 {
    let procs = d
        .cgroup
        .join(format!("allox/{a}/{s}/run-{run}/cgroup.procs"));
    let mut found = None;
    wait_until("the run's processes", || {
        let pids: Vec<i32> = std::fs::read_to_string(&procs)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect();
        found = pids.iter().copied().find(|p| {
            let st = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            // Field 4 (after the parenthesised name) is the parent.
            let ppid = st
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(1))
                .and_then(|x| x.parse::<i32>().ok());
            ppid.is_some_and(|pp| !pids.contains(&pp))
        });
        // The init and the program it started.
        pids.len() >= 2 && found.is_some()
    });
    found.unwrap()
}

#[test]
fn the_sandbox_init_cannot_be_read_without_cap_sys_ptrace() {
    let Some(d) = setup("the_sandbox_init_cannot_be_read_without_cap_sys_ptrace") else {
        return;
    };
    let run = bg(&d, "a", "s", "sleep 1000");
    let init = sandbox_init(&d, "a", "s", &run);
    // An address mapped in the init (its first mapping), read with full
    // capabilities.
    let maps = std::fs::read_to_string(format!("/proc/{init}/maps")).unwrap();
    let start = usize::from_str_radix(maps.split('-').next().unwrap(), 16).unwrap();
    let read = move || {
        let mut buf = [0u8; 8];
        nix::sys::uio::process_vm_readv(
            nix::unistd::Pid::from_raw(init),
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &[nix::sys::uio::RemoteIoVec {
                base: start,
                len: 8,
            }],
        )
    };
    // With CAP_SYS_PTRACE: readable, so the pid and address are right.
    assert_eq!(read(), Ok(8));
    // Root, same uid as the init, CAP_SYS_PTRACE still permitted (so the
    // capability subset check between caller and target passes) but not
    // effective: only the init being not dumpable refuses. Capabilities
    // belong to a thread: only this one drops it.
    let without = std::thread::spawn(move || {
        caps::drop(
            None,
            caps::CapSet::Effective,
            caps::Capability::CAP_SYS_PTRACE,
        )
        .unwrap();
        read()
    })
    .join()
    .unwrap();
    assert_eq!(
        without,
        Err(nix::errno::Errno::EPERM),
        "the init's memory was read"
    );
    kill_session(&d, "a", "s");
}

#[test]
fn shared_is_writable_by_every_session_of_the_agent() {
    let Some(d) = setup("shared_is_writable_by_every_session_of_the_agent") else {
        return;
    };
    let shared = d.daemon.root.join("agents/a/workspace/shared");
    use std::os::unix::fs::MetadataExt;
    // Handed over when the agent is made.
    assert_eq!(std::fs::metadata(&shared).unwrap().uid(), 10_000);
    let r = sh(&d, "a", "s", "echo from-s > \"$ALLOX_AGENT_SHARED/note\"");
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let r = sh(&d, "a", "t", "cat \"$ALLOX_AGENT_SHARED/note\"");
    assert_eq!(r.stdout, "from-s\n", "{r:?}");
    // Another agent does not see it.
    let r = sh(&d, "b", "s", "ls -A \"$ALLOX_AGENT_SHARED\" | wc -l");
    assert_eq!(r.stdout.trim(), "0", "{r:?}");
    // An agent made by an earlier supervisor (or adopted by recovery) with
    // a root-owned shared/: its next run gets it.
    std::os::unix::fs::chown(&shared, Some(0), Some(0)).unwrap();
    let r = sh(&d, "a", "t", "echo from-t > \"$ALLOX_AGENT_SHARED/new\"");
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(shared.join("new")).unwrap(),
        "from-t\n"
    );
}

#[test]
fn a_root_sandbox_identity_is_refused_at_start() {
    if !require("process::a_root_sandbox_identity_is_refused_at_start") {
        return;
    }
    let fs = allox_integration::BtrfsFs::new(256).expect("make btrfs");
    let root = fs.path().join("store");
    std::fs::create_dir(&root).unwrap();
    let cgroup = allox_integration::cgroup2_mount().expect("cgroup2 mount");
    let sock = fs.scratch().join("ctl.sock");
    for (flag, value) in [
        ("--sandbox-uid", "0"),
        ("--sandbox-gid", "0"),
        ("--sandbox-uid", "4294967295"),
    ] {
        let exe = allox_integration::workspace_bin("allox-init");
        let mut out = allox_integration::supervise_command(&exe, &root, &sock, Some(&cgroup))
            .arg("--sandbox-stage")
            .arg(fs.scratch().join("stage"))
            .args([flag, value])
            .env("ALLOX_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while out.try_wait().unwrap().is_none() {
            let serving = std::os::unix::net::UnixStream::connect(&sock).is_ok();
            if serving || t0.elapsed() > Duration::from_secs(30) {
                let _ = out.kill();
                let _ = out.wait();
                panic!("{flag} {value}: the daemon started");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = out.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value}: started");
        assert!(
            stderr.contains(&format!("{flag} {value}:")),
            "{flag} {value}: {stderr}"
        );
    }
}

/// A /tmp built to hold up or flood the copy of its files: a directory
/// 10,000 levels deep, a FIFO, files swapped for FIFOs (and back) by a
/// background process while the init copies them, a sparse 1 TiB file.
const HOSTILE_TMP: &str = r#"
import ctypes, os, subprocess, sys, time
os.makedirs("/tmp/keep/sub")
open("/tmp/keep/a", "w").write("one")
open("/tmp/keep/sub/b", "w").write("two")
os.mkfifo("/tmp/fifo")
with open("/tmp/sparse", "w") as f:
    f.truncate(1 << 40)
os.chdir("/tmp")
for level in range(10000):
    os.mkdir("d")
    os.chdir("d")
    if level == 5:
        open("shallow", "w").write("kept")
    if level == 100:
        open("deep", "w").write("beyond the depth budget")
os.chdir("/tmp")
os.mkdir("/tmp/race")
racer = r'''
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
os.chdir("/tmp/race")
names = [b"r%03d" % i for i in range(100)]
for n in names:
    open(n, "w").write("x")
    os.mkfifo(n + b".alt")
open("/tmp/race/ready", "w").close()
end = time.time() + 8
while time.time() < end:
    for n in names:
        # RENAME_EXCHANGE: each name is a file, then a FIFO, then a file...
        libc.renameat2(-100, n, -100, n + b".alt", 2)
'''
subprocess.Popen([sys.executable, "-c", racer], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while not os.path.exists("/tmp/race/ready"):
    time.sleep(0.01)
time.sleep(0.2)
print("set")
"#;

#[test]
fn a_hostile_tmp_does_not_hold_up_the_run() {
    let Some(d) = setup("a_hostile_tmp_does_not_hold_up_the_run") else {
        return;
    };
    std::fs::write(current(&d, "a", "s").join("hostile.py"), HOSTILE_TMP).unwrap();
    let mut p = start("a", "s", &["python3", "hostile.py"]);
    // Liveness bound only: a blocked copy would never end by itself.
    p.timeout_ms = Some(120_000);
    let mut client = d.daemon.client();
    let run = std::thread::spawn(move || client.call(Request::ProcessStart(p)));
    // The supervisor answers others meanwhile.
    while !run.is_finished() {
        match call(&d, Request::AgentList(AgentList {})) {
            Ok(Response::Agents(l)) => assert_eq!(l.agents.len(), 2),
            other => panic!("{other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = match run.join().unwrap().expect("transport") {
        Ok(Response::Exited(r)) => r,
        other => panic!("{other:?}"),
    };
    assert!(!r.timed_out, "the copy of /tmp held the run up: {r:?}");
    assert_eq!(
        (r.exit_code, r.stdout.as_str()),
        (Some(0), "set\n"),
        "{r:?}"
    );
    let kept = current(&d, "a", "s").join(".allox-tmp");
    assert_eq!(std::fs::read_to_string(kept.join("keep/a")).unwrap(), "one");
    assert_eq!(
        std::fs::read_to_string(kept.join("keep/sub/b")).unwrap(),
        "two"
    );
    let shallow = (0..6)
        .fold(kept.clone(), |p, _| p.join("d"))
        .join("shallow");
    assert_eq!(std::fs::read_to_string(shallow).unwrap(), "kept");
    for gone in ["fifo", "sparse"] {
        assert!(
            std::fs::symlink_metadata(kept.join(gone)).is_err(),
            "{gone} was copied"
        );
    }
    // Whatever of the race was copied is a regular file.
    for e in std::fs::read_dir(kept.join("race")).into_iter().flatten() {
        let e = e.unwrap();
        assert!(e.file_type().unwrap().is_file(), "{:?}", e.path());
    }
    // The deep tree was cut at the depth budget.
    let deep = (0..101).fold(kept.clone(), |p, _| p.join("d")).join("deep");
    assert!(!deep.exists());
    kill_session(&d, "a", "s");
}

/// The supervisor's resident memory now and at its peak, in KiB (VmRSS,
/// VmHWM).
fn supervisor_memory_kib(d: &ProcDaemon) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.daemon.child.id())).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// `process.wait` for a run, as the daemon answers it.
fn try_wait_run(d: &ProcDaemon, a: &str, s: &str, run_id: &str) -> Result<Response, ErrorBody> {
    call(
        d,
        Request::ProcessWait(ProcessWait {
            agent_id: a.into(),
            session_id: s.into(),
            run_id: run_id.into(),
            timeout_ms: Some(10_000),
        }),
    )
}

fn wait_run(d: &ProcDaemon, a: &str, s: &str, run_id: &str) -> RunResult {
    match try_wait_run(d, a, s, run_id) {
        Ok(Response::Exited(r)) => r,
        other => panic!("wait {run_id}: {other:?}"),
    }
}

#[test]
fn thousands_of_finished_runs_keep_the_supervisor_small() {
    // The daemon's bounds lowered, so that a few thousand runs go as far
    // past them as ten thousand go past the defaults (64 MiB of output,
    // 10,000 runs; the same code keeps both).
    const BUDGET: usize = 16 << 20;
    const KEPT: usize = 2_000;
    let Some(d) = setup_with(
        "thousands_of_finished_runs",
        &[],
        &[
            &format!("--finished-output-budget={BUDGET}"),
            &format!("--finished-runs-max={KEPT}"),
        ],
    ) else {
        return;
    };
    // 2,500 runs of 48 KiB output each: 117 MiB if every run's output
    // were kept, 7.3 times the budget (470 MiB and 64 MiB by default).
    const RUNS: usize = 2_500;
    const OUTPUT: usize = 48 << 10;
    const CLIENTS: usize = 8;
    // Peak resident memory allowed: the budget, plus the daemon itself,
    // runs in flight, and allocator slack.
    const BOUND_KIB: u64 = (BUDGET as u64 >> 10) + (64 << 10);
    // Growth allowed from the 1,250th run to the 2,500th.
    const GROWTH_KIB: u64 = 8 << 10;
    // Each run's id and the output its answer carried.
    let ids: Vec<std::sync::Mutex<(String, usize)>> =
        (0..RUNS).map(|_| Default::default()).collect();
    let short = std::sync::atomic::AtomicUsize::new(0);
    let run_batch = |range: std::ops::Range<usize>| {
        let next = std::sync::atomic::AtomicUsize::new(range.start);
        std::thread::scope(|scope| {
            for _ in 0..CLIENTS {
                scope.spawn(|| {
                    let mut c = d.daemon.client();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= range.end {
                            return;
                        }
                        let p = start("a", "s", &["head", "-c", &OUTPUT.to_string(), "/dev/zero"]);
                        match c.call(Request::ProcessStart(p)).expect("transport") {
                            Ok(Response::Exited(r)) => {
                                assert_eq!(r.exit_code, Some(0), "run {i}: {r:?}");
                                assert!(!r.output_dropped, "run {i}");
                                if r.stdout.len() != OUTPUT {
                                    eprintln!("run {i}: {} bytes of output", r.stdout.len());
                                    short.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                }
                                *ids[i].lock().unwrap() = (r.run_id, r.stdout.len());
                            }
                            other => panic!("run {i}: {other:?}"),
                        }
                    }
                });
            }
        });
    };
    let t0 = Instant::now();
    run_batch(0..RUNS / 2);
    let (rss_half, hwm_half) = supervisor_memory_kib(&d);
    run_batch(RUNS / 2..RUNS);
    let (rss_end, hwm_end) = supervisor_memory_kib(&d);
    let short = short.into_inner();
    eprintln!(
        "{RUNS} runs ({short} answered with less output than written) in {:?}; supervisor VmRSS/VmHWM after {}: {rss_half}/{hwm_half} KiB, after {RUNS}: {rss_end}/{hwm_end} KiB",
        t0.elapsed(),
        RUNS / 2
    );
    // What a program wrote before it ended is in its answer, however busy
    // the supervisor was.
    assert_eq!(short, 0, "runs answered without all their output");
    assert!(
        hwm_end <= BOUND_KIB,
        "supervisor peak RSS {hwm_end} KiB is over {BOUND_KIB} KiB"
    );
    assert!(
        rss_end <= rss_half + GROWTH_KIB,
        "supervisor RSS grew from {rss_half} KiB to {rss_end} KiB between run {} and run {RUNS}",
        RUNS / 2
    );
    // The newest runs still answer with their output.
    for (i, run) in ids.iter().enumerate().skip(RUNS - 100) {
        let (id, len) = run.lock().unwrap().clone();
        let r = wait_run(&d, "a", "s", &id);
        assert_eq!(r.exit_code, Some(0));
        assert!(!r.output_dropped, "run {i}");
        assert_eq!(r.stdout.len(), len, "run {i}");
    }
    // The oldest kept answers with its status, its output marked
    // dropped; the ones before it are forgotten.
    let (id, _) = ids[RUNS - KEPT + 50].lock().unwrap().clone();
    let r = wait_run(&d, "a", "s", &id);
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert!(r.output_dropped, "{r:?}");
    assert!(r.stdout.is_empty() && r.stderr.is_empty());
    let (id, _) = ids[0].lock().unwrap().clone();
    let forgotten = try_wait_run(&d, "a", "s", &id);
    assert_eq!(
        forgotten.as_ref().map_err(|e| e.code),
        Err(ErrorCode::NotFound),
        "the first of {RUNS} runs, past the {KEPT} kept: {forgotten:?}"
    );
}

/// PIDs in a session's cgroups, read from the kernel (not through the
/// supervisor).
fn session_pids(d: &ProcDaemon, a: &str, s: &str) -> Vec<i32> {
    let mut out = Vec::new();
    let mut stack = vec![d.cgroup.join(format!("allox/{a}/{s}"))];
    while let Some(dir) = stack.pop() {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        out.extend(procs.lines().filter_map(|l| l.parse::<i32>().ok()));
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    out
}

fn wait_long(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn process_list_cuts_long_command_lines_to_fit_one_answer() {
    let Some(d) = setup("process_list_cuts_long_command_lines") else {
        return;
    };
    // 400 shells with an 8 KiB argument each: 3 MiB of command lines.
    bg(
        &d,
        "a",
        "s",
        "L=$(head -c 8192 /dev/zero | tr '\\0' a); \
         for i in $(seq 400); do sh -c 'sleep 1000; :' x \"$L\" & done; wait",
    );
    // Every shell and its sleep, the run's shell and the sandbox init.
    wait_long("the shells and their sleeps", || {
        session_pids(&d, "a", "s").len() >= 802
    });
    let l = listing(&d, "a", "s");
    assert!(l.truncated, "{} listed", l.processes.len());
    assert!(
        l.processes.windows(2).all(|w| w[0].pid < w[1].pid),
        "not sorted by pid"
    );
    let long: Vec<&ProcessInfo> = l
        .processes
        .iter()
        .filter(|p| p.argv.len() == 5 && p.argv[0] == "sh")
        .collect();
    assert!(long.len() > 100, "{} long command lines listed", long.len());
    for p in &l.processes {
        let bytes: usize = p.argv.iter().map(|a| a.len() + 1).sum();
        assert!(
            bytes <= ProcessInfo::ARGV_MAX,
            "pid {}: {bytes} bytes of argv",
            p.pid
        );
    }
    for p in &long {
        assert!(p.argv_truncated, "pid {} not marked cut", p.pid);
        assert!(p.argv[4].bytes().all(|b| b == b'a') && p.argv[4].len() < 8192);
    }
    assert!(l
        .processes
        .iter()
        .any(|p| !p.argv_truncated && p.argv[0] == "sleep"));
    let frame = allox_protocol::encode(&ServerFrame::Response(ResponseEnvelope {
        conversation: 1,
        request_id: u64::MAX,
        outcome: Outcome::Ok(Response::Processes(l)),
    }))
    .unwrap();
    assert!(frame.len() <= MAX_FRAME);
    kill_session(&d, "a", "s");
}

#[test]
fn process_list_of_thousands_of_processes_is_capped() {
    let Some(d) = setup("process_list_of_thousands_of_processes") else {
        return;
    };
    const SLEEPS: usize = 4500;
    bg(
        &d,
        "a",
        "s",
        &format!("for i in $(seq {SLEEPS}); do sleep 1000 & done; wait"),
    );
    wait_long("the sleeps", || {
        session_pids(&d, "a", "s").len() >= SLEEPS + 2
    });
    let l = listing(&d, "a", "s");
    assert!(l.truncated);
    assert_eq!(l.processes.len(), ProcessListing::MAX_ENTRIES);
    assert!(
        l.processes.windows(2).all(|w| w[0].pid < w[1].pid),
        "not sorted by pid"
    );
    // The lowest PIDs are the ones listed.
    let mut pids = session_pids(&d, "a", "s");
    pids.sort_unstable();
    let last = l.processes.last().unwrap().pid;
    let left_out = pids.iter().filter(|&&p| p > last).count();
    assert!(left_out >= SLEEPS + 1 - ProcessListing::MAX_ENTRIES);
    kill_session(&d, "a", "s");
}

#[test]
fn a_panic_in_a_rollback_fails_it_and_leaves_the_session_usable() {
    let Some(mut d) = setup_with_env(
        "a_panic_in_a_rollback",
        &[("ALLOX_FAILPOINTS", "rollback.after_snapshot=panic")],
    ) else {
        return;
    };
    let ck = |d: &ProcDaemon, id: &str| {
        call(
            d,
            Request::CheckpointCreate(CheckpointCreate {
                agent_id: "a".into(),
                session_id: "s".into(),
                checkpoint_id: id.into(),
                pinned: false,
                label: None,
            }),
        )
        .unwrap();
    };
    let rb = |d: &ProcDaemon, to: &str| {
        call(
            d,
            Request::SessionRollback(SessionRollback {
                agent_id: "a".into(),
                session_id: "s".into(),
                checkpoint_id: to.into(),
                kill_processes: Some(true),
            }),
        )
    };
    let check = |d: &ProcDaemon| match call(d, Request::StoreCheck(StoreCheckRequest {})) {
        Ok(Response::StoreCheck(r)) => {
            assert!(r.is_consistent() && r.read_only.is_none(), "{r:?}");
        }
        other => panic!("{other:?}"),
    };
    let head = |d: &ProcDaemon| match call(
        d,
        Request::SessionList(AgentRef {
            agent_id: "a".into(),
        }),
    ) {
        Ok(Response::Sessions(l)) => l
            .sessions
            .into_iter()
            .find(|s| s.session_id == "s")
            .and_then(|s| s.head),
        other => panic!("{other:?}"),
    };
    ck(&d, "c1");
    assert_eq!(sh(&d, "a", "s", "echo v2 > work.txt").exit_code, Some(0));
    ck(&d, "c2");
    // The first rollback panics half-way (its snapshot made, not swapped
    // in): the request fails, naming the failure; nothing changed.
    let e = rb(&d, "c1").unwrap_err();
    assert_eq!(e.code, ErrorCode::Internal, "{e:?}");
    assert!(
        e.message.contains("session.rollback")
            && e.message.contains("failpoint rollback.after_snapshot"),
        "{e:?}"
    );
    assert_eq!(head(&d).as_deref(), Some("c2"));
    // The half-done rollback's journal entry and snapshot are gone.
    check(&d);
    // The session is not left fenced: runs start, and rollbacks work.
    let r = sh(&d, "a", "s", "cat work.txt");
    assert_eq!((r.exit_code, r.stdout.as_str()), (Some(0), "v2\n"), "{r:?}");
    let Ok(Response::RolledBack(_)) = rb(&d, "c1") else {
        panic!("the second rollback failed");
    };
    assert!(!current(&d, "a", "s").join("work.txt").exists());
    let Ok(Response::RolledBack(_)) = rb(&d, "c2") else {
        panic!("the third rollback failed");
    };
    check(&d);
    // A restart finds nothing left to finish or undo.
    d.restart(&[]);
    check(&d);
    assert_eq!(head(&d).as_deref(), Some("c2"));
    assert_eq!(
        std::fs::read_to_string(current(&d, "a", "s").join("work.txt")).unwrap(),
        "v2\n"
    );
}

#[test]
fn a_run_that_ended_before_anyone_waited_is_answered_by_wait() {
    let Some(d) = setup("a_run_that_ended_before_anyone_waited") else {
        return;
    };
    let id = bg(&d, "a", "s", "echo done");
    wait_until("the run's cgroup to go", || {
        !d.cgroup.join(format!("allox/a/s/run-{id}")).exists()
    });
    // Its result is published by now (no timing is asserted: a wait that
    // came first would pass either way).
    std::thread::sleep(Duration::from_millis(500));
    let r = wait_run(&d, "a", "s", &id);
    assert_eq!((r.exit_code, r.stdout.as_str()), (Some(0), "done\n"));
}

/// Two daemons on one host, each on its own store: a second daemon given
/// the first's cgroup subtree refuses to start and names the first; with a
/// subtree of its own, its runs, checkpoints and shutdown never touch the
/// first's run, and the first's never touch its.
#[test]
fn two_daemons_on_one_host_never_touch_each_others_runs() {
    let Some(a) = setup("two_daemons_a") else {
        return;
    };
    let b = ProcDaemon::start("two_daemons_b", &[]);
    make_sessions(&b, &[("a", "s")]);
    let pid_in = |d: &ProcDaemon, run: &str| -> i32 {
        let l = list(d, "a", "s");
        l.iter()
            .find(|p| {
                p.run_id.as_deref() == Some(run)
                    && p.argv.first().map(String::as_str) == Some("sleep")
            })
            .unwrap_or_else(|| panic!("no sleep of run {run} in {l:?}"))
            .pid
    };
    let ra = bg(&a, "a", "s", "exec sleep 600");
    let rb = bg(&b, "a", "s", "exec sleep 600");
    wait_until("both sleeps", || {
        list(&a, "a", "s")
            .iter()
            .any(|p| p.argv.first().map(String::as_str) == Some("sleep"))
            && list(&b, "a", "s")
                .iter()
                .any(|p| p.argv.first().map(String::as_str) == Some("sleep"))
    });
    let sleep_a = pid_in(&a, &ra);
    pid_in(&b, &rb);

    // A third daemon on A's subtree: refused before it serves, naming A.
    let fs = allox_integration::BtrfsFs::new(256).expect("make btrfs");
    std::fs::create_dir(fs.path().join("store")).unwrap();
    let out = std::process::Command::new(allox_integration::workspace_bin("allox-init"))
        .arg("supervise")
        .arg("--root")
        .arg(fs.path().join("store"))
        .arg("--listen")
        .arg(format!("unix:{}", fs.scratch().join("ctl.sock").display()))
        .arg("--cgroup-root")
        .arg(&a.cgroup)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a second owner of one subtree started: {err}"
    );
    let first = format!("pid {}", a.daemon.child.id());
    assert!(
        err.contains("belongs to another daemon") && err.contains(&first),
        "the refusal names the first daemon: {err}"
    );
    assert!(!fs.scratch().join("ctl.sock").exists());

    // Checkpoints on both; B shuts down (killing its own sessions).
    for d in [&a, &b] {
        let (code, _, e) = allox_integration::alloxctl(
            &d.daemon.socket,
            &["checkpoint", "create", "a", "s", "c1"],
        );
        assert_eq!(code, 0, "{e}");
    }
    let (code, out, e) = allox_integration::alloxctl(&b.daemon.socket, &["shutdown"]);
    assert_eq!(code, 0, "{e}");
    assert!(String::from_utf8_lossy(&out).contains("stopped"), "{e}");
    // alloxctl shutdown returned once the daemon had exited.
    let mut b = b;
    let st = b.daemon.child.try_wait().unwrap();
    assert!(st.is_some_and(|st| st.success()), "daemon B: {st:?}");
    assert!(
        std::path::Path::new(&format!("/proc/{sleep_a}")).exists(),
        "daemon B's shutdown killed daemon A's run"
    );
    assert!(
        procs_below(&b.cgroup).is_empty(),
        "daemon B's shutdown left its own run"
    );
    // A goes on: its run is listed, it checkpoints and runs again.
    assert_eq!(pid_in(&a, &ra), sleep_a);
    let (code, _, e) =
        allox_integration::alloxctl(&a.daemon.socket, &["checkpoint", "create", "a", "s", "c2"]);
    assert_eq!(code, 0, "{e}");
    assert_eq!(sh(&a, "a", "s", "echo still").exit_code, Some(0));
}

/// Every process in the cgroup `dir` and below.
fn procs_below(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(t) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(t.lines().map(String::from));
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            out.extend(procs_below(&e.path()));
        }
    }
    out
}

/// `alloxctl kill --signal TERM` reaches every process of the run — the
/// shell and the child it forked — and says how many; another run of the
/// session, and other sessions, are not signalled unless asked.
#[test]
fn a_signal_reaches_every_process_of_the_run() {
    let Some(d) = setup("a_signal_reaches_every_process_of_the_run") else {
        return;
    };
    let run = bg(&d, "a", "s", "sleep 600 & sleep 601 & wait");
    let other = bg(&d, "a", "t", "exec sleep 602");
    let keep = bg(&d, "a", "s", "trap '' TERM; exec sleep 603");
    wait_until("three sleeps", || {
        list(&d, "a", "s")
            .iter()
            .filter(|p| p.argv.first().map(String::as_str) == Some("sleep"))
            .count()
            == 3
            && !list(&d, "a", "t").is_empty()
    });
    let sock = &d.daemon.socket;
    let (code, out, e) =
        allox_integration::alloxctl(sock, &["kill", "a", "s", &run, "--signal", "TERM"]);
    assert_eq!(code, 0, "{e}");
    assert_eq!(String::from_utf8_lossy(&out), "signalled 3 processes\n");
    let r = wait_run(&d, "a", "s", &run);
    assert_eq!(r.signal, Some(libc::SIGTERM), "{r:?}");
    wait_until("the run's sleeps to go", || {
        !list(&d, "a", "s")
            .iter()
            .any(|p| p.run_id.as_deref() == Some(run.as_str()))
    });
    // The run that ignores TERM, and the other session, go on.
    assert!(list(&d, "a", "s")
        .iter()
        .any(|p| p.run_id.as_deref() == Some(keep.as_str())));
    assert!(list(&d, "a", "t")
        .iter()
        .any(|p| p.run_id.as_deref() == Some(other.as_str())));
    // The whole session: the one left ignores TERM, and is still signalled.
    let (code, out, e) = allox_integration::alloxctl(sock, &["kill", "a", "s", "--signal", "TERM"]);
    assert_eq!(code, 0, "{e}");
    assert_eq!(String::from_utf8_lossy(&out), "signalled 1 process\n");
    assert!(list(&d, "a", "s")
        .iter()
        .any(|p| p.run_id.as_deref() == Some(keep.as_str())));
    // A frozen moment does not stop the session: it still runs.
    assert_eq!(sh(&d, "a", "s", "echo after").stdout, "after\n");
}

/// What `alloxctl` prints and returns speaks the command line's words:
/// a refusal names the flag (not the JSON field), and `exec` of a
/// program that is not there exits 127, as a shell does.
#[test]
fn the_cli_speaks_in_its_own_words() {
    let Some(d) = setup("the_cli_speaks_in_its_own_words") else {
        return;
    };
    let sock = &d.daemon.socket;
    let ctl = |args: &[&str]| allox_integration::alloxctl(sock, args);
    assert_eq!(ctl(&["checkpoint", "create", "a", "s", "c"]).0, 0);
    bg(&d, "a", "s", "exec sleep 600");
    wait_until("the sleep", || !list(&d, "a", "s").is_empty());
    let (code, _, e) = ctl(&["rollback", "a", "s", "c"]);
    assert_eq!(code, 1);
    assert!(
        e.contains("pass --kill-processes") && !e.contains("kill_processes"),
        "{e}"
    );
    // The JSON form keeps the field's name.
    let (_, out, _) = ctl(&[
        "rpc",
        r#"{"action":"session.rollback","params":{"agent_id":"a","session_id":"s","checkpoint_id":"c"}}"#,
    ]);
    assert!(String::from_utf8_lossy(&out).contains("kill_processes"));
    let (code, _, e) = ctl(&["rollback", "a", "s", "c", "--kill-processes"]);
    assert_eq!(code, 0, "{e}");
    let (code, _, e) = ctl(&["exec", "a", "s", "--", "no-such-program-here"]);
    assert_eq!(code, 127, "{e}");
    assert!(e.contains("no-such-program-here"), "{e}");
    // exec -i passes stdin on as it comes, and its end (docker exec -i);
    // without -i the program reads an empty stdin.
    let piped = |flags: &[&str]| {
        use std::io::Write;
        let mut c = std::process::Command::new(allox_integration::workspace_bin("alloxctl"))
            .arg("--socket")
            .arg(sock)
            .arg("exec")
            .args(flags)
            .args(["a", "s", "--", "sh", "-c", "cat; echo end"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = c.stdin.take().unwrap();
        input.write_all(b"line one\n").unwrap();
        input.write_all(b"line two\n").unwrap();
        drop(input);
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{flags:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(piped(&["-i"]), "line one\nline two\nend\n");
    assert_eq!(piped(&[]), "end\n");
}

/// A start that loses a race with a session's delete (the delete begins
/// after the start's check, and takes the run's cgroup and the session's
/// tree while the start makes the sandbox) is refused `conflict`, as a
/// start during the delete is: never `internal`. The start is held 1.5 s
/// once its cgroup is made, so the delete surely comes in between.
#[test]
fn a_start_racing_a_session_delete_is_a_conflict_not_a_fault() {
    let name = "a_start_racing_a_session_delete_is_a_conflict_not_a_fault";
    let Some(d) = setup_with_env(
        name,
        &[("ALLOX_FAILPOINTS", "run_start.after_cgroup=delay:1500")],
    ) else {
        return;
    };
    let socket = d.daemon.socket.clone();
    let starting = std::thread::spawn(move || {
        let mut c = allox_ctl::client::Client::connect(&socket).unwrap();
        c.call(Request::ProcessStart(start("a", "s", &["/bin/true"])))
            .expect("transport")
    });
    // The start is past its check once its run's cgroup is there.
    let session_cg = d.cgroup.join("allox/a/s");
    wait_until("the run's cgroup", || {
        std::fs::read_dir(&session_cg).is_ok_and(|mut r| {
            r.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("run-")))
        })
    });
    call(
        &d,
        Request::SessionDelete(SessionDelete {
            agent_id: "a".into(),
            session_id: "s".into(),
            force: true,
        }),
    )
    .expect("the delete");
    match starting.join().unwrap() {
        Err(e) => {
            assert_eq!(e.code, ErrorCode::Conflict, "{e:?}");
            assert!(e.message.contains("being rolled back or deleted"), "{e:?}");
        }
        Ok(other) => panic!("a run started in a deleted session: {other:?}"),
    }
    // Nothing of it is left, and the other sessions work.
    assert!(!session_cg.exists(), "{} is left", session_cg.display());
    assert_eq!(sh(&d, "a", "t", "echo ok").stdout, "ok\n");
}

/// The check of a run's program and cwd before it starts reads the
/// session's links as the sandbox will, never following one on the host:
/// a link the agent planted to a root-only host file says "not there" (as
/// the sandbox would find it) whether or not the host has it, rather than
/// answering for the host. A link to what the sandbox does have works.
#[test]
fn a_program_or_cwd_linked_out_of_the_session_is_not_looked_up_on_the_host() {
    let name = "a_program_or_cwd_linked_out_of_the_session_is_not_looked_up_on_the_host";
    let Some(d) = setup(name) else {
        return;
    };
    let private = tempfile::tempdir_in("/var/tmp").unwrap();
    let tool = private.path().join("tool");
    std::fs::write(&tool, "#!/bin/sh\necho host\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let r = sh(
        &d,
        "a",
        "s",
        &format!(
            "ln -s {} there && ln -s {}/none missing && ln -s {} dir && ln -s /bin/sh mysh",
            tool.display(),
            private.path().display(),
            private.path().display()
        ),
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    for prog in ["./there", "./missing"] {
        let e = call(&d, Request::ProcessStart(start("a", "s", &[prog])))
            .expect_err("nothing of the host's is run or looked up");
        assert_eq!(e.code, ErrorCode::InvalidRequest, "{prog}: {e:?}");
        assert!(
            e.message.contains("does not exist in the sandbox"),
            "{prog}: {e:?}"
        );
    }
    let mut p = start("a", "s", &["pwd"]);
    p.cwd = Some("dir".into());
    let e = call(&d, Request::ProcessStart(p)).expect_err("a cwd linked out");
    assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
    assert!(e.message.contains("not a directory"), "{e:?}");
    // Control: a link to what the sandbox has is followed.
    match call(
        &d,
        Request::ProcessStart(start("a", "s", &["./mysh", "-c", "echo inside"])),
    ) {
        Ok(Response::Exited(r)) => assert_eq!(r.stdout, "inside\n", "{r:?}"),
        other => panic!("./mysh: {other:?}"),
    }
}

/// A restarted supervisor follows the runs an earlier one started as its
/// own: a run that writes output goes on writing (its next `echo` did not
/// meet a pipe without a reader and die of SIGPIPE), its output after the
/// restart is in `process.logs`, its end is known (exit status and what it
/// printed last), and a terminal run keeps its terminal (it was hung up).
#[test]
fn a_restarted_supervisor_follows_its_runs_output_and_end() {
    let name = "a_restarted_supervisor_follows_its_runs_output_and_end";
    let Some(mut d) = setup(name) else {
        return;
    };
    let talker = bg(
        &d,
        "a",
        "s",
        "i=0; while [ ! -e stop ]; do i=$((i+1)); echo line$i; sleep 0.1; done; echo finished; exit 7",
    );
    let mut p = start(
        "a",
        "t",
        &[
            "/bin/sh",
            "-c",
            "echo tty-up; while [ ! -e stop ]; do sleep 0.1; done; read x; read y; echo tty-done-$x$y; exit 3",
        ],
    );
    p.wait = false;
    p.pty = Some(PtySize {
        rows: 24,
        cols: 80,
        term: None,
    });
    let Ok(Response::Started(tty)) = call(&d, Request::ProcessStart(p)) else {
        panic!("no terminal run")
    };
    let logs = |d: &ProcDaemon, s: &str, run: &str| {
        let (code, out, err) =
            allox_integration::alloxctl(&d.daemon.socket, &["logs", "a", s, run]);
        assert_eq!(code, 0, "logs {s} {run}: {err}");
        String::from_utf8_lossy(&out).into_owned()
    };
    wait_until("the talker's first line", || {
        logs(&d, "s", &talker).contains("line1")
    });
    wait_until("the terminal run", || {
        logs(&d, "t", &tty.run_id).contains("tty-up")
    });
    d.restart(&[]);
    // Lines written after the restart: read by the new supervisor.
    wait_until("a line after the restart", || {
        logs(&d, "s", &talker).contains("line")
    });
    for s in ["s", "t"] {
        std::fs::write(current(&d, "a", s).join("stop"), b"").unwrap();
    }
    // The terminal run is typed into after the restart (every key was
    // refused "standard input of run R is closed").
    wait_until("the terminal run taken up, and typed into", || {
        match call(
            &d,
            Request::ProcessStdin(ProcessStdin {
                agent_id: "a".into(),
                session_id: "t".into(),
                run_id: tty.run_id.clone(),
                // Twice: a line may also be ended by what the restart left.
                data: Bytes(b"typed\ntyped\n".to_vec()),
                close: false,
            }),
        ) {
            Ok(_) => true,
            Err(e) if e.code == ErrorCode::NotFound => false,
            Err(e) => panic!("typing into the terminal run: {e:?}"),
        }
    });
    let waited = |s: &str, run: &str| match call(
        &d,
        Request::ProcessWait(ProcessWait {
            agent_id: "a".into(),
            session_id: s.into(),
            run_id: run.into(),
            timeout_ms: Some(20_000),
        }),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("wait {s}/{run}: {other:?}"),
    };
    let r = waited("s", &talker);
    assert_eq!(
        (r.exit_code, r.signal),
        (Some(7), None),
        "the talker did not end as it does: {r:?}"
    );
    assert!(r.stdout.contains("finished"), "{r:?}");
    let r = waited("t", &tty.run_id);
    assert_eq!(
        (r.exit_code, r.signal),
        (Some(3), None),
        "the terminal run: {r:?}"
    );
    let l = logs(&d, "t", &tty.run_id);
    assert!(l.contains("tty-done-typed"), "{l:?}");
}

/// A run's program is looked up in the `PATH` the run's own environment
/// names, as `execvp` would there: a program on it is found, and a name on
/// it comes before the system's (the daemon looked in its own PATH
/// whatever the run's said, and ran /usr/bin/ls for a run whose PATH put
/// its own `ls` first).
#[test]
fn the_run_s_own_path_finds_its_program() {
    let Some(d) = setup("the_run_s_own_path_finds_its_program") else {
        return;
    };
    let r = sh(
        &d,
        "a",
        "s",
        "mkdir -p bin && printf '#!/bin/sh\\necho mine\\n' > bin/mytool && printf '#!/bin/sh\\necho my-ls\\n' > bin/ls && chmod +x bin/mytool bin/ls",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let with_path = |prog: &str| {
        let mut p = start("a", "s", &[prog]);
        p.env
            .insert("PATH".into(), "/allox/session/bin:/usr/bin:/bin".into());
        call(&d, Request::ProcessStart(p))
    };
    for (prog, want) in [("mytool", "mine\n"), ("ls", "my-ls\n")] {
        match with_path(prog) {
            Ok(Response::Exited(r)) => assert_eq!(r.stdout, want, "{prog}: {r:?}"),
            other => panic!("{prog}: {other:?}"),
        }
    }
    // Not on it: refused, naming the PATH looked in.
    let e = with_path("no-such-tool").expect_err("not on the run's PATH");
    assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
    assert!(
        e.message
            .contains("the run's PATH (/allox/session/bin:/usr/bin:/bin)"),
        "{e:?}"
    );
    // Without a PATH of its own, the sandbox's: the system's ls.
    match call(&d, Request::ProcessStart(start("a", "s", &["ls", "bin"]))) {
        Ok(Response::Exited(r)) => assert!(r.stdout.contains("mytool"), "{r:?}"),
        other => panic!("ls: {other:?}"),
    }
}

/// A run killed while its /tmp is copied leaves the earlier copy whole
/// (it left a mix of two runs' files, the one being copied lost), and
/// the half-made copy goes with the next run.
#[test]
fn a_run_killed_during_the_copy_of_its_tmp_leaves_the_earlier_copy_whole() {
    let Some(d) = setup("a_run_killed_during_the_copy_of_its_tmp") else {
        return;
    };
    let make = |tag: &str, big_mb: u32| {
        format!(
            "cd /tmp; i=0; while [ $i -lt 2000 ]; do echo {tag} > f$i; i=$((i+1)); done; \
             head -c {big_mb}M /dev/urandom > big; echo made"
        )
    };
    let r = sh(&d, "a", "s", &make("gen1", 1));
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let cur = current(&d, "a", "s");
    let kept = cur.join(".allox-tmp");
    assert_eq!(std::fs::metadata(kept.join("big")).unwrap().len(), 1 << 20);
    // The second run's copy is caught under way and the run killed.
    let copying = || {
        std::fs::read_dir(&cur)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(".allox-tmp.partial-")
            })
            || std::fs::metadata(kept.join("big")).is_ok_and(|m| m.len() != 1 << 20)
            || std::fs::read_to_string(kept.join("f0")).is_ok_and(|t| t.contains("gen2"))
    };
    bg(&d, "a", "s", &make("gen2", 200));
    wait_until("the copy of the second run's /tmp", copying);
    kill_session(&d, "a", "s");
    // Each kept file is the first run's, and all of them are there.
    assert_eq!(std::fs::metadata(kept.join("big")).unwrap().len(), 1 << 20);
    for i in 0..2000 {
        let f = std::fs::read_to_string(kept.join(format!("f{i}"))).unwrap_or_default();
        assert_eq!(f, "gen1\n", "f{i}");
    }
    // The next run removes what the killed copy made.
    sh(&d, "a", "s", "true");
    let beside: Vec<_> = std::fs::read_dir(&cur)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".allox-tmp"))
        .collect();
    assert_eq!(beside, [".allox-tmp"]);
}

/// A run whose /tmp cannot be kept (its session at its quota) says so on
/// its stderr's last line, and how much was left out; one whose /tmp is
/// kept says nothing. (Before, nothing was kept and nothing said.)
#[test]
fn a_tmp_that_cannot_be_kept_is_said_on_the_run_s_stderr() {
    let Some(d) = setup_with(
        "a_tmp_that_cannot_be_kept",
        &[],
        &["--session-quota", "16M"],
    ) else {
        return;
    };
    let r = sh(&d, "a", "s", "echo important > /tmp/keep.txt");
    assert_eq!((r.exit_code, r.stderr.as_str()), (Some(0), ""), "{r:?}");
    let kept = current(&d, "a", "s").join(".allox-tmp");
    assert_eq!(
        std::fs::read_to_string(kept.join("keep.txt")).unwrap(),
        "important\n"
    );
    let r = sh(
        &d,
        "a",
        "t",
        "dd if=/dev/zero of=fill bs=1M count=32 2>/dev/null; \
         echo important > /tmp/keep.txt; echo done",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert!(
        r.stderr
            .ends_with("the session's quota or the disk is full)\n")
            && r.stderr
                .contains("/tmp was not kept whole in .allox-tmp/: 0 file(s) kept, 1 left out"),
        "{r:?}"
    );
    assert!(!current(&d, "a", "t").join(".allox-tmp/keep.txt").exists());
    // `alloxctl --json exec`, which streams: the program's output, then
    // the note (the output was dropped for the note before).
    let json_exec = |script: &str| -> serde_json::Value {
        let (code, out, err) = allox_integration::alloxctl(
            &d.daemon.socket,
            &["--json", "exec", "a", "t", "--", "sh", "-c", script],
        );
        assert_eq!(code, 0, "{err}");
        serde_json::from_slice(&out).unwrap()
    };
    let v = json_exec("echo out; echo err >&2; echo again > /tmp/keep2.txt");
    assert_eq!(v["stdout"], "out\n", "{v}");
    let stderr = v["stderr"].as_str().unwrap();
    assert!(
        stderr.starts_with("err\nallox: /tmp was not kept whole"),
        "{v}"
    );
    // A last line the program left unfinished: the note is on a line of
    // its own (it was glued on, `errallox: /tmp …`).
    let v = json_exec("printf err >&2; echo again > /tmp/keep3.txt");
    assert!(
        v["stderr"]
            .as_str()
            .unwrap()
            .starts_with("err\nallox: /tmp was not kept whole"),
        "{v}"
    );
}

/// Under `--session-quota`, a session cannot bring bytes into its
/// `current/` past its quota by reflinking them from its unlimited
/// `shared/` (Btrfs does not hold a clone to the quota: a 16 MiB quota
/// took 48 MiB this way before): `cp --reflink=always` is refused, and a
/// plain `cp` or `mv` copies the bytes, which the quota stops. Without a
/// quota reflinks work (the control).
#[test]
fn a_session_quota_is_not_escaped_by_reflinks_from_shared() {
    let script = "dd if=/dev/zero of=/allox/shared/t bs=1M count=24 2>/dev/null || exit 9; \
                  cp --reflink=always /allox/shared/t ./r && echo reflinked; \
                  cp /allox/shared/t ./c 2>/dev/null && echo copied; \
                  mv /allox/shared/t ./m 2>/dev/null && echo moved; \
                  rm -f /allox/shared/t; du -sm --apparent-size . | cut -f1";
    let Some(d) = setup_with(
        "a_session_quota_is_not_escaped",
        &[],
        &["--session-quota", "16M"],
    ) else {
        return;
    };
    let r = sh(&d, "a", "s", script);
    assert!(!r.stdout.contains("reflinked"), "{r:?}");
    assert!(
        !r.stdout.contains("copied") && !r.stdout.contains("moved"),
        "{r:?}"
    );
    let used: u64 = r.stdout.lines().last().unwrap().trim().parse().unwrap();
    assert!(
        used <= 16,
        "current/ holds {used} MiB under a 16 MiB quota: {r:?}"
    );
    // Nor by the daemon's own copy of a file `alloxctl cp` passes it from
    // the same Btrfs (it reflinked it: 200 MiB into a 50 MiB session).
    let outside = d.fs.path().join("outside.bin");
    std::fs::write(&outside, vec![7u8; 24 << 20]).unwrap();
    let (code, _, err) = allox_integration::alloxctl(
        &d.daemon.socket,
        &["cp", outside.to_str().unwrap(), "a/t:big.bin"],
    );
    assert_ne!(code, 0, "24 MiB copied into a 16 MiB session: {err}");
    assert!(err.contains("no room left"), "{err}");
    assert!(!current(&d, "a", "t").join("big.bin").exists());
    drop(d);
    let Some(d) = setup_with("a_session_quota_is_not_escaped_control", &[], &[]) else {
        return;
    };
    let r = sh(&d, "a", "s", script);
    assert!(r.stdout.contains("reflinked\ncopied\nmoved\n"), "{r:?}");
}

/// `alloxctl exec` killed outright at any moment of its run's start
/// takes the run with it: the start is let finish until its run is known,
/// then the run is killed (cut in its first milliseconds, about one run in
/// fifty went on with no client; the start cut half-way also broke the
/// session's context for the next run).
#[test]
fn an_exec_killed_outright_at_any_moment_of_its_start_takes_its_run() {
    let Some(d) = setup("an_exec_killed_outright_at_any_moment_of_its_start_takes_its_run") else {
        return;
    };
    let bin = allox_integration::workspace_bin("alloxctl");
    for i in 0..400u64 {
        let mut c = std::process::Command::new(&bin)
            .arg("--socket")
            .arg(&d.daemon.socket)
            .args(["exec", "a", "t", "--", "sleep", "300"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Spread over the start: from before the request is sent to
        // after the run runs.
        std::thread::sleep(Duration::from_micros(2_000 + (i * 7919) % 40_000));
        let _ = c.kill();
        let _ = c.wait();
    }
    wait_until("every run of a killed exec to end", || {
        list(&d, "a", "t").is_empty()
    });
    // The session's context is whole: a run starts and answers.
    let r = sh(&d, "a", "t", "echo after");
    assert_eq!(r.stdout, "after\n", "{r:?}");
}

/// A sandbox that makes calls that change state as fast as it can does
/// not grow the daemon's log at its pace: its lines are held to 100 at
/// once, then 10 a second, saying how many were left out (each call was
/// a line, ~640 a second; on a full disk three).
#[test]
fn a_sandbox_s_calls_grow_the_daemon_s_log_at_a_bounded_pace() {
    if !require("process::a_sandbox_s_calls_grow_the_daemon_s_log_at_a_bounded_pace") {
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let log = dir.path().join("daemon.log");
    let d = ProcDaemon::start_logged(
        "a_sandbox_s_calls_grow_the_daemon_s_log",
        &[("ALLOX_LOG", "info")],
        &[],
        &log,
    );
    make_sessions(&d, &[("a", "s")]);
    let t0 = Instant::now();
    let r = sh(
        &d,
        "a",
        "s",
        "end=$(( $(date +%s) + 4 )); n=0; \
         while [ $(date +%s) -lt $end ]; do allox turn begin >/dev/null 2>&1; n=$((n+1)); done; echo $n",
    );
    let secs = t0.elapsed().as_secs_f64();
    let calls: u64 = r.stdout.trim().parse().unwrap_or_else(|_| panic!("{r:?}"));
    let text = std::fs::read_to_string(&log).unwrap();
    let lines = text
        .lines()
        .filter(|l| l.contains("request answered") && l.contains("guest "))
        .count() as f64;
    assert!(calls > 300, "the sandbox made only {calls} calls");
    assert!(
        lines <= 100.0 + 10.0 * (secs + 1.0),
        "{lines} lines for {calls} calls in {secs:.1} s"
    );
    assert!(
        text.contains("held_back="),
        "no line says what was left out"
    );
}

/// A run's time limit holds across a restart of its supervisor: kept on
/// the run's cgroup, the next supervisor goes on counting it (the run ran
/// on for ever, its end `timed_out: false`).
/// The command lines of every process in the cgroups below `dir`.
fn commands_in(dir: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    for pid in std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
    {
        if let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let words: Vec<String> = c
                .split(|&b| b == 0)
                .filter(|w| !w.is_empty())
                .map(|w| String::from_utf8_lossy(w).into_owned())
                .collect();
            found.push(words.join(" "));
        }
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(commands_in(&e.path()));
        }
    }
    found
}

#[test]
fn a_run_that_dies_with_its_client_dies_when_its_supervisor_restarts() {
    let Some(mut d) = setup("a_run_that_dies_with_its_client_dies_when_its_supervisor_restarts")
    else {
        return;
    };
    // The daemon stopped by a signal (its stop ends the run), then killed
    // outright (its successor does).
    for crash in [false, true] {
        // Two runs followed by `alloxctl exec`: one asks to die with its
        // client (the default), the other to go on (`--detach-on-exit`).
        let follow = |extra: &[&str], word: &str, secs: u32| {
            let script = format!("echo {word}; exec sleep {secs}");
            let mut args = vec!["exec"];
            args.extend_from_slice(extra);
            args.extend_from_slice(&["a", "s", "--", "/bin/sh", "-c", &script]);
            let (child, mut lines) = allox_integration::alloxctl_following(&d.daemon.socket, &args);
            let line = lines.next().map(|l| l.unwrap_or_default());
            assert_eq!(line.as_deref(), Some(word), "alloxctl exec {extra:?}");
            child
        };
        let mut dies = follow(&[], "dies", 300);
        let mut stays = follow(&["--detach-on-exit"], "stays", 301);
        // And an exec answered long before, which left a daemon: no
        // client's to end any more (a successor killed it).
        let (code, _, err) = allox_integration::alloxctl(
            &d.daemon.socket,
            &[
                "exec",
                "a",
                "s",
                "--",
                "/bin/sh",
                "-c",
                "setsid sleep 309 </dev/null >/dev/null 2>&1 &",
            ],
        );
        assert_eq!(code, 0, "{err}");
        wait_until("the runs' sleeps", || {
            ["300", "301", "309"]
                .iter()
                .all(|n| running(&d, &["sleep", n]))
        });
        if crash {
            d.restart_after_crash(&[]);
        } else {
            // Ended by the stop itself, before any successor.
            d.daemon.terminate();
            let left = commands_in(&d.cgroup);
            assert!(
                !left.contains(&"sleep 300".to_string())
                    && left.contains(&"sleep 301".to_string())
                    && left.contains(&"sleep 309".to_string()),
                "after the stop: {left:?}"
            );
            d.restart_after_crash(&[]);
        }
        for c in [&mut dies, &mut stays] {
            let st = c.wait().expect("alloxctl ends with its daemon");
            assert!(
                !st.success(),
                "alloxctl exec succeeded although its daemon went: {st:?}"
            );
        }
        wait_until("the run that asked to die with its client to end", || {
            !running(&d, &["sleep", "300"])
        });
        // The detached run and the answered exec's daemon still go on a
        // moment later, and are killed only when asked.
        std::thread::sleep(Duration::from_millis(500));
        for n in ["301", "309"] {
            assert!(
                running(&d, &["sleep", n]),
                "crash {crash}: sleep {n} is gone"
            );
        }
        kill_session(&d, "a", "s");
        assert!(list(&d, "a", "s").is_empty());
    }
}

#[test]
fn a_start_whose_client_went_away_has_its_outcome_in_the_audit_log() {
    let Some(d) = setup("a_start_whose_client_went_away_has_its_outcome_in_the_audit_log") else {
        return;
    };
    let records = || match call(
        &d,
        Request::AuditList(AuditList {
            after_seq: None,
            limit: Some(10_000),
            before_seq: None,
        }),
    ) {
        Ok(Response::Audit(l)) => l.records,
        other => panic!("{other:?}"),
    };
    // Two execs killed outright once their runs have started: one whose
    // run dies with it, one whose run goes on.
    for (extra, secs) in [(&[][..], 302), (&["--detach-on-exit"][..], 303)] {
        let script = format!("echo up; exec sleep {secs}");
        let mut args = vec!["exec"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["a", "s", "--", "/bin/sh", "-c", &script]);
        let (mut child, mut lines) = allox_integration::alloxctl_following(&d.daemon.socket, &args);
        assert_eq!(
            lines.next().map(|l| l.unwrap_or_default()).as_deref(),
            Some("up")
        );
        // Its shell may not have become `sleep` yet.
        let secs = secs.to_string();
        wait_until("the run's sleep", || running(&d, &["sleep", &secs]));
        let run = list(&d, "a", "s")
            .into_iter()
            .find(|p| p.argv == ["sleep", secs.as_str()])
            .and_then(|p| p.run_id)
            .expect("the run is listed");
        let peer = format!("pid={}", child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        wait_until("the start's outcome", || {
            records().iter().any(|r| {
                r.action == "process.start" && r.peer.ends_with(&peer) && r.outcome != "begun"
            })
        });
        let mine: Vec<AuditRecord> = records()
            .into_iter()
            .filter(|r| r.action == "process.start" && r.peer.ends_with(&peer))
            .collect();
        assert_eq!(mine.len(), 2, "{mine:?}");
        assert_eq!(mine[1].outcome, "cancelled", "{mine:?}");
        let said = mine[1].message.clone().unwrap_or_default();
        assert!(
            said.contains(&run),
            "the outcome does not name run {run}: {said}"
        );
    }
    // The first run was killed as asked, the second goes on.
    wait_until("the first run's end", || !running(&d, &["sleep", "302"]));
    assert!(running(&d, &["sleep", "303"]));
    kill_session(&d, "a", "s");
}

#[test]
fn a_run_that_ended_before_a_restart_is_said_so() {
    let Some(mut d) = setup("a_run_that_ended_before_a_restart_is_said_so") else {
        return;
    };
    let wait = |d: &ProcDaemon, run: &str| try_wait_run(d, "a", "s", run);
    let run = bg(&d, "a", "s", "true");
    assert!(matches!(wait(&d, &run), Ok(Response::Exited(_))));
    d.restart(&[]);
    let e = wait(&d, &run).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e:?}");
    assert!(
        e.message
            .contains("if it ran, it ended before this daemon started"),
        "{}",
        e.message
    );
    // A run this daemon never had is still said to be past the bounds.
    let e = wait(&d, "ffffffffffff0001").unwrap_err();
    assert!(
        e.message.contains("finished runs are kept"),
        "{}",
        e.message
    );
}

#[test]
fn a_run_s_time_limit_reaches_what_its_program_left() {
    let Some(d) = setup("a_run_s_time_limit_reaches_what_its_program_left") else {
        return;
    };
    let mut p = start(
        "a",
        "s",
        &[
            "/bin/sh",
            "-c",
            "(setsid sleep 104 >/dev/null 2>&1 &); echo done",
        ],
    );
    p.timeout_ms = Some(2000);
    let t0 = Instant::now();
    let r = match call(&d, Request::ProcessStart(p)) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{other:?}"),
    };
    // Answered when the program ended, in time.
    assert_eq!((r.exit_code, r.timed_out), (Some(0), false), "{r:?}");
    let left = || running(&d, &["sleep", "104"]);
    // Its subshell may not have become `sleep` yet.
    wait_until("the daemon it left", left);
    // At the limit, what it left goes with it.
    wait_until("what the run left to be killed at its time limit", || {
        !left()
    });
    assert!(
        t0.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        t0.elapsed()
    );
    // A run without a limit leaves its daemon going.
    sh(
        &d,
        "a",
        "s",
        "(setsid sleep 105 >/dev/null 2>&1 &); echo done",
    );
    std::thread::sleep(Duration::from_millis(2500));
    assert!(running(&d, &["sleep", "105"]));
    kill_session(&d, "a", "s");
}

#[test]
fn a_run_s_time_limit_holds_across_a_supervisor_restart() {
    let Some(mut d) = setup("a_run_s_time_limit_holds_across_a_supervisor_restart") else {
        return;
    };
    let mut p = start("a", "s", &["sleep", "120"]);
    p.wait = false;
    p.timeout_ms = Some(4000);
    let t0 = Instant::now();
    let Ok(Response::Started(run)) = call(&d, Request::ProcessStart(p)) else {
        panic!("not started")
    };
    d.restart(&[]);
    let r = match call(
        &d,
        Request::ProcessWait(ProcessWait {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run.run_id.clone(),
            timeout_ms: Some(60_000),
        }),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{other:?}"),
    };
    assert!(r.timed_out && r.signal.is_some(), "{r:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "ended after {:?}",
        t0.elapsed()
    );
}
