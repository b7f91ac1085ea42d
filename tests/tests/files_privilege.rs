//! Files the file API makes in a session are never privileged, even for an
//! instant, whatever a program in the sandbox (uid 10000) does meanwhile;
//! uploads begun and abandoned are bounded and swept without a restart;
//! the store's mount is checked for `nosuid,nodev` at start. Real daemon,
//! real sandbox, real Btrfs on a loop device mounted without `nosuid`.

use allox_integration::{call, process_start as start, require, workspace_bin, ProcDaemon};
use allox_protocol::*;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SANDBOX_UID: u32 = 10000;

fn setup(name: &str, extra: &[&str]) -> Option<ProcDaemon> {
    if !require(&format!("files_privilege::{name}")) {
        return None;
    }
    let d = ProcDaemon::start_on(name, extra, 1024);
    let (code, _, err) = allox_integration::alloxctl(&d.daemon.socket, &["agent", "create", "a"]);
    assert_eq!(code, 0, "{err}");
    for s in ["s", "s2"] {
        let (code, _, err) =
            allox_integration::alloxctl(&d.daemon.socket, &["session", "create", "a", s]);
        assert_eq!(code, 0, "{err}");
    }
    Some(d)
}

fn current(d: &ProcDaemon) -> PathBuf {
    d.daemon.root.join("agents/a/workspace/sessions/s/current")
}

fn sh(d: &ProcDaemon, script: &str) -> RunResult {
    match call(
        d,
        Request::ProcessStart(start("a", "s", &["/bin/sh", "-c", script])),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{script}: {other:?}"),
    }
}

fn owner_and_mode(p: &Path) -> (u32, u32) {
    let md = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (md.uid(), md.mode() & 0o7777)
}

fn chunk(s: &str, path: &str, id: &str, offset: u64, data: &str, commit: bool) -> Request {
    Request::FsWrite(FsWrite {
        offset: Some(offset),
        upload: Some(id.into()),
        commit,
        ..FsWrite::whole("a", s, path, data)
    })
}

#[test]
fn a_write_over_a_setuid_file_gives_the_sandbox_user_s_file_without_setuid() {
    let Some(d) = setup("write_over_setuid", &[]) else {
        return;
    };
    let r = sh(
        &d,
        "echo old > tool && chmod 4755 tool && echo old > up && chmod 6755 up",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let cur = current(&d);
    assert_eq!(owner_and_mode(&cur.join("tool")), (SANDBOX_UID, 0o4755));
    // Whole file: the permission bits kept, setuid cleared.
    call(
        &d,
        Request::FsWrite(FsWrite::whole("a", "s", "tool", "new\n")),
    )
    .unwrap();
    assert_eq!(owner_and_mode(&cur.join("tool")), (SANDBOX_UID, 0o755));
    assert_eq!(std::fs::read(cur.join("tool")).unwrap(), b"new\n");
    // An upload over a setuid+setgid file: the same.
    call(&d, chunk("s", "up", "u1", 0, "abc", false)).unwrap();
    let partial = cur.join(".allox-upload-u1-up");
    assert_eq!(owner_and_mode(&partial), (SANDBOX_UID, 0o600));
    call(&d, chunk("s", "up", "u1", 3, "def", true)).unwrap();
    assert_eq!(owner_and_mode(&cur.join("up")), (SANDBOX_UID, 0o755));
    assert_eq!(std::fs::read(cur.join("up")).unwrap(), b"abcdef");
    // A new file written in place, and a new directory: the sandbox user's.
    call(
        &d,
        Request::FsWrite(FsWrite {
            offset: Some(0),
            ..FsWrite::whole("a", "s", "fresh", "x")
        }),
    )
    .unwrap();
    assert_eq!(owner_and_mode(&cur.join("fresh")), (SANDBOX_UID, 0o644));
}

/// A symlink's own permission bits are 0777: a file written over one (a
/// whole file, an upload, `alloxctl cp`'s descriptor path) gets a new
/// file's mode, never the link's, and what the link pointed at is left
/// as it was.
#[test]
fn a_file_written_over_a_symlink_gets_a_new_file_s_mode_not_the_link_s() {
    let Some(d) = setup("write_over_symlink", &[]) else {
        return;
    };
    let r = sh(
        &d,
        "echo kept > keep && ln -s keep l1 && ln -s nowhere l2 && ln -s /etc/passwd l3 && ln -s keep l4 && mkfifo p1",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let cur = current(&d);
    let passwd = std::fs::read("/etc/passwd").unwrap();
    // Whole file over a link to a file, and over a dangling one.
    for l in ["l1", "l2"] {
        call(&d, Request::FsWrite(FsWrite::whole("a", "s", l, "new\n"))).unwrap();
    }
    // An upload over a link leading out of the session.
    call(&d, chunk("s", "l3", "u1", 0, "abc", false)).unwrap();
    call(&d, chunk("s", "l3", "u1", 3, "def", true)).unwrap();
    // alloxctl cp, which hands the daemon the local file's descriptor.
    let local = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(local.path(), b"from the host\n").unwrap();
    let (code, _, err) = allox_integration::alloxctl(
        &d.daemon.socket,
        &["cp", local.path().to_str().unwrap(), "a/s:l4"],
    );
    assert_eq!(code, 0, "{err}");
    // Whole file over a FIFO.
    call(
        &d,
        Request::FsWrite(FsWrite::whole("a", "s", "p1", "fifo\n")),
    )
    .unwrap();
    for l in ["l1", "l2", "l3", "l4", "p1"] {
        let p = cur.join(l);
        assert!(
            std::fs::symlink_metadata(&p).unwrap().file_type().is_file(),
            "{l} is not a file now"
        );
        assert_eq!(owner_and_mode(&p), (SANDBOX_UID, 0o644), "{l}");
    }
    assert_eq!(std::fs::read(cur.join("l3")).unwrap(), b"abcdef");
    assert_eq!(std::fs::read(cur.join("keep")).unwrap(), b"kept\n");
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd);
    // Control: a file written over a regular 0600 file keeps 0600.
    assert_eq!(sh(&d, "echo x > priv && chmod 600 priv").exit_code, Some(0));
    call(&d, Request::FsWrite(FsWrite::whole("a", "s", "priv", "y"))).unwrap();
    assert_eq!(owner_and_mode(&cur.join("priv")), (SANDBOX_UID, 0o600));
}

/// Renames every `.allox-*` name that appears in the session's root
/// (inotify through ctypes) to `taken-N`, and keeps `tool` at 4755.
const GRABBER: &str = r#"
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
assert fd >= 0
assert libc.inotify_add_watch(fd, b".", 0x100 | 0x80) >= 0  # IN_CREATE | IN_MOVED_TO
open("ready", "w").close()
n = 0
while True:
    buf = os.read(fd, 65536)
    i = 0
    while i < len(buf):
        _wd, _mask, _cookie, ln = struct.unpack_from("iIII", buf, i)
        name = buf[i + 16:i + 16 + ln].rstrip(b"\0")
        i += 16 + ln
        if name.startswith(b".allox-"):
            try:
                os.rename(name, b"taken-%d" % n)
                n += 1
            except OSError:
                pass
    try:
        os.chmod("tool", 0o4755)
    except OSError:
        pass
"#;

#[test]
fn a_program_renaming_the_daemon_s_new_files_as_they_appear_never_gets_a_privileged_one() {
    let Some(d) = setup("rename_race", &[]) else {
        return;
    };
    let cur = current(&d);
    call(
        &d,
        Request::FsWrite(FsWrite::whole("a", "s", "grab.py", GRABBER)),
    )
    .unwrap();
    let r = sh(&d, "echo old > tool && chmod 4755 tool");
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let run = match call(
        &d,
        Request::ProcessStart(ProcessStart {
            wait: false,
            ..start("a", "s", &["/usr/bin/python3", "grab.py"])
        }),
    ) {
        Ok(Response::Started(s)) => s.run_id,
        other => panic!("{other:?}"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cur.join("ready").exists() {
        assert!(Instant::now() < deadline, "the grabber never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut done, mut refused) = (0, 0);
    for i in 0..150 {
        // Big enough that writing it takes a while: a daemon that wrote
        // into a file with a name would be caught with it half-made.
        let data = format!("#!/bin/sh\necho {i}\n#{}\n", "x".repeat(384 << 10));
        match call(
            &d,
            Request::FsWrite(FsWrite::whole("a", "s", "tool", data.as_str())),
        ) {
            Ok(Response::FsWritten(w)) => {
                assert_eq!(w.size, data.len() as u64);
                // Its bytes, the sandbox user's (the grabber touches only
                // the mode of `tool`).
                assert_eq!(std::fs::read(cur.join("tool")).unwrap(), data.as_bytes());
                assert_eq!(owner_and_mode(&cur.join("tool")).0, SANDBOX_UID);
                done += 1;
            }
            Ok(other) => panic!("{other:?}"),
            Err(e) => {
                // Failed cleanly: its new file was taken before it replaced
                // the target, and said so.
                assert_eq!(e.code, ErrorCode::Conflict, "{e:?}");
                assert!(e.message.contains("moved away"), "{e:?}");
                refused += 1;
            }
        }
    }
    let _ = call(
        &d,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: Some(run),
            signal: None,
        }),
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut taken = 0;
    let mut bad = Vec::new();
    for e in walk(&cur) {
        let (uid, mode) = owner_and_mode(&e);
        let name = e.file_name().unwrap().to_string_lossy().into_owned();
        if uid == 0 {
            bad.push(format!("{name}: root's, mode {mode:o}"));
        }
        // What the daemon made (all but the grabber's own `tool` chmod and
        // what the sandbox wrote): never setuid or setgid.
        if name.starts_with("taken-") || name.starts_with(".allox-") {
            taken += 1;
            if mode & 0o6000 != 0 || uid != SANDBOX_UID {
                bad.push(format!("{name}: uid {uid}, mode {mode:o}"));
            }
        }
    }
    eprintln!("{done} writes done, {refused} refused, {taken} new files taken by the sandbox");
    assert!(bad.is_empty(), "privileged files in the session: {bad:?}");
    assert_eq!(done + refused, 150);
    assert!(done > 0, "no write ever got through");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[test]
fn uploads_in_flight_are_bounded_per_session_and_abandoned_when_idle() {
    let Some(d) = setup(
        "uploads_bounded",
        &["--uploads-per-session", "3", "--upload-idle-s", "2"],
    ) else {
        return;
    };
    let cur = current(&d);
    let records = d.daemon.root.join("state/uploads");
    let count = |dir: &Path, prefix: &str| {
        std::fs::read_dir(dir)
            .map(|r| {
                r.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                    .count()
            })
            .unwrap_or(0)
    };
    for i in 0..3 {
        call(
            &d,
            chunk("s", &format!("f{i}"), &format!("u{i}"), 0, "part", false),
        )
        .unwrap();
    }
    let e = call(&d, chunk("s", "f3", "u3", 0, "part", false)).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
    assert!(
        e.message.contains("3 uploads under way") && e.message.contains("--uploads-per-session 3"),
        "{e:?}"
    );
    // One that ends in the request that begins it is never under way: it
    // goes in at the budget (a write of a few bytes was refused).
    call(&d, chunk("s", "one", "w0", 0, "in one", true)).unwrap();
    assert_eq!(std::fs::read(cur.join("one")).unwrap(), b"in one");
    // Another session has its own budget.
    call(&d, chunk("s2", "g", "v0", 0, "part", true)).unwrap();
    // The partial files: the sandbox user's, 0600, not under the target's
    // name.
    assert_eq!(count(&cur, ".allox-upload-"), 3);
    for i in 0..3 {
        assert_eq!(
            owner_and_mode(&cur.join(format!(".allox-upload-u{i}-f{i}"))),
            (SANDBOX_UID, 0o600)
        );
        assert!(!cur.join(format!("f{i}")).exists());
    }
    assert_eq!(count(&records, ""), 3);
    // The records' directory is the root's alone (it was the umask's).
    assert_eq!(
        std::fs::metadata(&records).unwrap().mode() & 0o777,
        0o700,
        "state/uploads"
    );
    // Left without a chunk for 2 s: gone, without a restart.
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(&cur, ".allox-upload-") + count(&records, "") > 0 {
        assert!(
            Instant::now() < deadline,
            "abandoned uploads still there after 10 s: {} partial files, {} records",
            count(&cur, ".allox-upload-"),
            count(&records, "")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let e = call(&d, chunk("s", "f0", "u0", 4, "more", true)).unwrap_err();
    assert!(e.message.contains("start again at offset 0"), "{e:?}");
    // And the budget has room again.
    call(&d, chunk("s", "f3", "u3", 0, "whole", true)).unwrap();
    assert_eq!(std::fs::read(cur.join("f3")).unwrap(), b"whole");
    assert_eq!(owner_and_mode(&cur.join("f3")), (SANDBOX_UID, 0o644));

    // An upload dropped by its client (`abort`) no longer counts: its
    // partial file and record go at once.
    let fill = |ids: &[&str]| {
        for id in ids {
            call(&d, chunk("s", &format!("t-{id}"), id, 0, "part", false)).unwrap();
        }
    };
    fill(&["x0", "x1", "x2"]);
    let abort = Request::FsWrite(FsWrite {
        upload: Some("x0".into()),
        abort: true,
        ..FsWrite::whole("a", "s", "t-x0", "")
    });
    call(&d, abort.clone()).unwrap();
    call(&d, abort).unwrap();
    assert!(!cur.join(".allox-upload-x0-t-x0").exists());
    assert_eq!(count(&records, "a~s~"), 2);
    fill(&["x3"]);
    // An upload is of one file: a begin, a chunk or an abort under its id
    // that names another is refused (a begin or abort with another path
    // left the first's partial file with no record, for ever).
    let e = call(&d, chunk("s", "elsewhere", "x1", 0, "part", false)).unwrap_err();
    assert!(e.message.contains("under way for another file"), "{e:?}");
    let e = call(
        &d,
        Request::FsWrite(FsWrite {
            upload: Some("x1".into()),
            abort: true,
            ..FsWrite::whole("a", "s", "elsewhere", "")
        }),
    )
    .unwrap_err();
    assert!(e.message.contains("under way for another file"), "{e:?}");
    assert!(cur.join(".allox-upload-x1-t-x1").exists());
    for id in ["x1", "x2", "x3"] {
        call(
            &d,
            Request::FsWrite(FsWrite {
                upload: Some(id.into()),
                abort: true,
                ..FsWrite::whole("a", "s", &format!("t-{id}"), "")
            }),
        )
        .unwrap();
    }
    assert_eq!(count(&cur, ".allox-upload-"), 0);
    // Two sessions' uploads into the agent's shared/ under one id and one
    // path are each its own (they shared one partial file, and a commit
    // installed a mix of both).
    let shared = |s: &str, offset: u64, data: &str, commit: bool| {
        call(
            &d,
            Request::FsWrite(FsWrite {
                scope: FsScope::Shared,
                offset: Some(offset),
                upload: Some("same".into()),
                commit,
                ..FsWrite::whole("a", s, "both.txt", data)
            }),
        )
    };
    shared("s2", 0, "from s2 ", false).unwrap();
    shared("s", 0, "from s ", false).unwrap();
    shared("s2", 8, "whole", true).unwrap();
    let both = d.daemon.root.join("agents/a/workspace/shared/both.txt");
    assert_eq!(std::fs::read(&both).unwrap(), b"from s2 whole");
    shared("s", 7, "whole", true).unwrap();
    assert_eq!(std::fs::read(&both).unwrap(), b"from s whole");
    // A rollback takes the uploads into the old tree, and a delete every
    // upload of its session: they no longer hold the budget (they did
    // until idle, though no chunk could come), nor carry over to a new
    // session of the name.
    call(
        &d,
        Request::CheckpointCreate(CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "k".into(),
            pinned: false,
            label: None,
        }),
    )
    .unwrap();
    call(
        &d,
        Request::SessionRollback(SessionRollback {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "k".into(),
            kill_processes: None,
        }),
    )
    .unwrap();
    assert_eq!(count(&records, "a~s~"), 0);
    fill(&["y0", "y1", "y2"]);
    call(&d, chunk("s2", "g", "z0", 0, "part", false)).unwrap();
    call(
        &d,
        Request::SessionDelete(SessionDelete {
            force: true,
            ..SessionDelete::new("a", "s2")
        }),
    )
    .unwrap();
    assert_eq!(count(&records, "a~s2~"), 0);
}

/// Starts the daemon (store only) on `root`, stops it, and returns what it
/// logged.
fn start_and_log(root: &Path, socket: &Path) -> String {
    let child = Command::new(workspace_bin("allox-init"))
        .arg("supervise")
        .arg("--root")
        .arg(root)
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .arg("--no-processes")
        .env("ALLOX_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(Instant::now() < deadline, "the daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_store_mounted_without_nosuid_and_nodev_is_warned_about_at_start() {
    if !require("files_privilege::mount_check") {
        return;
    }
    let fs = allox_integration::BtrfsFs::new(256).unwrap();
    let root = fs.path().join("store");
    std::fs::create_dir(&root).unwrap();
    let socket = fs.scratch().join("ctl.sock");
    let log = start_and_log(&root, &socket);
    assert!(
        log.contains("lacks nosuid or nodev") && log.contains("nosuid,nodev"),
        "{log}"
    );
    let st = Command::new("mount")
        .args(["-o", "remount,nosuid,nodev"])
        .arg(fs.path())
        .status()
        .unwrap();
    assert!(st.success());
    let log = start_and_log(&root, &socket);
    assert!(!log.contains("lacks nosuid"), "{log}");
}
