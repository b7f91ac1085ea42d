//! Filling the disk: a session that writes until it is refused does not
//! stop checkpoints, rollbacks, the journal or the audit log, for itself or
//! for any other session — with a session quota (Btrfs quota groups) and
//! without one (the state files' own room).

use allox_integration::{require, BtrfsFs, Daemon};
use allox_protocol::*;
use allox_store::btrfs::quota;
use allox_store::failpoint::Failpoints;
use allox_store::{Store, StoreOptions};
use std::io;
use std::path::Path;
use std::process::Command;

const QUOTA: u64 = 64 << 20;
const SANDBOX_UID: u32 = 10_000;

fn open(fs: &BtrfsFs, quota: Option<u64>) -> Store {
    Store::open_with(
        &fs.path().join("store"),
        Failpoints::default(),
        StoreOptions {
            session_quota: quota,
            ..Default::default()
        },
    )
    .expect("open store")
}

fn ck(a: &str, s: &str, c: &str) -> CheckpointCreate {
    CheckpointCreate {
        agent_id: a.into(),
        session_id: s.into(),
        checkpoint_id: c.into(),
        pinned: false,
        label: None,
    }
}

fn rb(a: &str, s: &str, c: &str) -> SessionRollback {
    SessionRollback {
        agent_id: a.into(),
        session_id: s.into(),
        checkpoint_id: c.into(),
        kill_processes: None,
    }
}

/// Writes 8 MiB files, then 4 KiB ones, into `dir` until a write fails;
/// returns the last failure. Panics if `limit` bytes went in first.
fn fill(dir: &Path, limit: u64) -> io::Error {
    let big = vec![7u8; 8 << 20];
    let mut written = 0u64;
    let mut i = 0;
    let err = loop {
        match std::fs::write(dir.join(format!("fill{i}")), &big) {
            Ok(()) => written += big.len() as u64,
            Err(e) => break e,
        }
        i += 1;
        assert!(
            written < limit,
            "{} took {written} bytes without refusing",
            dir.display()
        );
    };
    for j in 0..100_000 {
        if let Err(e) = std::fs::write(dir.join(format!("small{j}")), [1u8; 4096]) {
            return e;
        }
    }
    err
}

/// Free bytes of the filesystem `p` is on.
fn free(p: &Path) -> u64 {
    let st = rustix::fs::statvfs(p).unwrap();
    st.f_bavail * st.f_frsize
}

/// Fills `dir` as the sandbox's user; returns what the refused write said.
fn fill_as_sandbox_user(dir: &Path) -> String {
    std::os::unix::fs::chown(dir, Some(SANDBOX_UID), Some(SANDBOX_UID)).unwrap();
    // Entered as root (the store's directories above it are 0700, as a
    // sandbox never walks them: it sees its bind mount), then the
    // sandbox's user writes there.
    let id = SANDBOX_UID.to_string();
    let out = Command::new("setpriv")
        .args(["--reuid", &id, "--regid", &id, "--clear-groups", "sh", "-c"])
        .arg(
            "i=0; while dd if=/dev/zero of=u$i bs=1M count=8 status=none; do \
             i=$((i+1)); [ $i -gt 100 ] && exit 3; done; exit 1",
        )
        .current_dir(dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "never refused: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn audit_entry(action: &str) -> allox_store::audit::Entry {
    allox_store::audit::Entry {
        request_id: 1,
        peer: "test".into(),
        action: action.into(),
        target: String::new(),
        outcome: "ok".into(),
        message: None,
    }
}

fn setup(name: &str) -> Option<BtrfsFs> {
    if !require(name) {
        return None;
    }
    std::fs::create_dir_all("/var/tmp").ok();
    let fs = BtrfsFs::new(512).expect("make btrfs");
    std::fs::create_dir(fs.path().join("store")).unwrap();
    Some(fs)
}

#[test]
fn a_session_at_its_quota_is_refused_and_every_session_keeps_working() {
    let Some(fs) = setup("disk::a_session_at_its_quota_is_refused") else {
        return;
    };
    let st = open(&fs, Some(QUOTA));
    assert!(st.quotas_on());
    st.agent_create("a").unwrap();
    st.agent_create("b").unwrap();
    let s1 = st.session_create("a", "s1").unwrap();
    st.session_create("a", "s2").unwrap();
    st.session_create("b", "t").unwrap();
    let cur = Path::new(&s1.current).to_path_buf();
    std::fs::write(cur.join("base"), "base").unwrap();
    st.checkpoint_create(&ck("a", "s1", "base")).unwrap();

    // Root writing in current/ is refused at the quota, far from a full
    // filesystem.
    let e = fill(&cur, 256 << 20);
    assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{e}");
    let u = st.session_usage("a", "s1").unwrap().expect("usage");
    assert_eq!(u.max_referenced, Some(QUOTA));
    assert!(u.referenced <= QUOTA, "{u:?}");
    assert!(free(fs.path()) > 200 << 20, "the filesystem filled up");
    // Removing files is always allowed at the limit.
    std::fs::remove_file(cur.join("fill0")).unwrap();

    // The session itself: checkpoint its full tree, roll back, and the
    // quota follows it to the new tree, for the sandbox's user too.
    st.checkpoint_create(&ck("a", "s1", "full")).unwrap();
    st.rollback(&rb("a", "s1", "base")).unwrap();
    assert_eq!(std::fs::read_to_string(cur.join("base")).unwrap(), "base");
    let u = st.session_usage("a", "s1").unwrap().unwrap();
    assert_eq!(
        u.max_referenced,
        Some(QUOTA),
        "the limit did not follow the rollback"
    );
    let said = fill_as_sandbox_user(&cur);
    assert!(said.contains("quota exceeded"), "{said}");
    st.rollback(&rb("a", "s1", "full")).unwrap();
    let e = fill(&cur, 16 << 20);
    assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{e}");

    // Every other session, of the same agent and of another, writes,
    // checkpoints and rolls back as usual.
    for (a, s) in [("a", "s2"), ("b", "t")] {
        let c = st.layout().current(a, s);
        std::fs::write(c.join("data"), vec![3u8; 32 << 20]).unwrap();
        st.checkpoint_create(&ck(a, s, "one")).unwrap();
        std::fs::write(c.join("data"), "changed").unwrap();
        st.rollback(&rb(a, s, "one")).unwrap();
        assert_eq!(std::fs::metadata(c.join("data")).unwrap().len(), 32 << 20);
    }
    st.audit().append(audit_entry("disk.test")).unwrap();
    // The numbers the limits rest on are still exact (nothing the store
    // did, such as removing the groups of deleted trees, spoiled them).
    st.wait_idle();
    let q = quota::status(fs.path()).unwrap().unwrap();
    assert!(!q.inconsistent, "{q:?}");
    let listings: Vec<_> = [("a", "s1"), ("a", "s2"), ("b", "t")]
        .iter()
        .map(|(a, s)| st.checkpoint_list(a, s).unwrap())
        .collect();
    let r = st.check().unwrap();
    assert!(r.is_consistent() && r.read_only.is_none(), "{r:?}");
    drop(st);

    // After a restart: the index, the journal and the audit log are whole,
    // and every session has the limit the store is opened with.
    let st = open(&fs, Some(QUOTA));
    let r = st.check().unwrap();
    assert!(r.is_consistent() && r.read_only.is_none(), "{r:?}");
    for ((a, s), l) in [("a", "s1"), ("a", "s2"), ("b", "t")].iter().zip(&listings) {
        assert_eq!(&st.checkpoint_list(a, s).unwrap(), l);
        let u = st.session_usage(a, s).unwrap().unwrap();
        assert_eq!(u.max_referenced, Some(QUOTA), "{a}/{s}");
    }
    let log = st.audit().read(Some(0), None, 10_000).unwrap();
    assert_eq!(log.corrupt, 0);
    assert!(log.records.iter().any(|r| r.action == "disk.test"));
    drop(st);
    // Opened without a quota, the store lifts the limits.
    let st = open(&fs, None);
    let u = st.session_usage("a", "s1").unwrap().unwrap();
    assert_eq!(u.max_referenced, None);
}

#[test]
fn a_store_made_without_quotas_gets_them_at_its_next_open() {
    let Some(fs) = setup("disk::a_store_made_without_quotas") else {
        return;
    };
    let st = open(&fs, None);
    assert!(!st.quotas_on());
    st.agent_create("a").unwrap();
    let s = st.session_create("a", "s").unwrap();
    let cur = Path::new(&s.current).to_path_buf();
    std::fs::write(cur.join("data"), vec![1u8; 40 << 20]).unwrap();
    st.checkpoint_create(&ck("a", "s", "c")).unwrap();
    assert_eq!(st.session_usage("a", "s").unwrap(), None);
    drop(st);

    let st = open(&fs, Some(QUOTA));
    assert!(st.quotas_on());
    // The rescan counted what was there before quotas were on.
    let u = st.session_usage("a", "s").unwrap().unwrap();
    assert_eq!(u.max_referenced, Some(QUOTA));
    assert!(u.referenced >= 40 << 20, "{u:?}");
    let e = fill(&cur, 64 << 20);
    assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{e}");
    st.rollback(&rb("a", "s", "c")).unwrap();
    let u = st.session_usage("a", "s").unwrap().unwrap();
    assert_eq!(u.max_referenced, Some(QUOTA));
    let r = st.check().unwrap();
    assert!(r.is_consistent(), "{r:?}");
}

fn call(d: &Daemon, r: Request) -> Result<Response, ErrorBody> {
    d.client().call(r).expect("transport")
}

fn ok(d: &Daemon, r: Request) -> Response {
    call(d, r.clone()).unwrap_or_else(|e| panic!("{r:?}: {e}"))
}

fn audit(d: &Daemon) -> AuditListing {
    let Response::Audit(l) = ok(
        d,
        Request::AuditList(AuditList {
            after_seq: None,
            limit: Some(10_000),
            before_seq: None,
        }),
    ) else {
        panic!("audit.list")
    };
    l
}

fn check(d: &Daemon) -> StoreCheckReport {
    let Response::StoreCheck(r) = ok(d, Request::StoreCheck(StoreCheckRequest {})) else {
        panic!("store.check")
    };
    r
}

#[test]
fn a_full_filesystem_leaves_checkpoints_rollbacks_and_the_audit_working() {
    // No quota: a session fills the whole filesystem.
    let Some((_fs, d)) =
        Daemon::on_new_store("disk::a_full_filesystem_leaves", &["--no-processes"])
    else {
        return;
    };
    let sessions = [("a", "s1"), ("a", "s2"), ("b", "t")];
    for a in ["a", "b"] {
        ok(&d, Request::AgentCreate(AgentCreate::new(a)));
    }
    for (a, s) in sessions {
        ok(&d, Request::SessionCreate(SessionCreate::new(a, s)));
        let cur = d
            .root
            .join(format!("agents/{a}/workspace/sessions/{s}/current"));
        std::fs::write(cur.join("v"), "1").unwrap();
        if s == "s2" {
            // What an import below brings back: more than will be free.
            std::fs::write(cur.join("big"), vec![3u8; 96 << 20]).unwrap();
        }
        ok(&d, Request::CheckpointCreate(ck(a, s, "base")));
    }
    let out = tempfile::tempdir_in("/var/tmp").unwrap();
    let archive = out.path().join("s2.allox");
    let archive = archive.to_str().unwrap();
    let ctl = |args: &[&str]| {
        let (code, stdout, stderr) = allox_integration::alloxctl(&d.socket, args);
        (code, String::from_utf8_lossy(&stdout).into_owned(), stderr)
    };
    let (code, _, err) = ctl(&["session", "export", "a", "s2", "-o", archive]);
    assert_eq!(code, 0, "{err}");
    // Room taken outside the store, given back below.
    let spacer = d.root.parent().unwrap().join("spacer");
    std::fs::write(&spacer, vec![5u8; 48 << 20]).unwrap();
    let cur = d.root.join("agents/a/workspace/sessions/s1/current");
    let e = fill(&cur, 1 << 30);
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    let audit_before = audit(&d).records.len();

    // The session that filled the disk and every other one checkpoint and
    // roll back; each change is audited (begun, then ok).
    for (a, s) in sessions {
        let c = d
            .root
            .join(format!("agents/{a}/workspace/sessions/{s}/current"));
        let _ = std::fs::write(c.join("v"), "2");
        ok(&d, Request::CheckpointCreate(ck(a, s, "on-full")));
        ok(&d, Request::SessionRollback(rb(a, s, "base")));
        assert_eq!(std::fs::read_to_string(c.join("v")).unwrap(), "1");
    }
    // A chunked upload on the full disk is refused as the full disk it
    // meets (`unavailable`, no room left: before, `internal` naming the
    // daemon's record of it when that could not be written), and leaves
    // no record behind.
    let e = call(
        &d,
        Request::FsWrite(FsWrite {
            offset: Some(0),
            upload: Some("u1".into()),
            ..FsWrite::whole("b", "t", "up.bin", vec![1u8; 512 << 10])
        }),
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
    assert!(e.message.contains("no room left"), "{e:?}");
    let records = std::fs::read_dir(d.root.join("state/uploads"))
        .map(|r| r.count())
        .unwrap_or(0);
    assert_eq!(records, 0);
    // A new session is refused: it could not be written to anyway.
    let e = call(&d, Request::SessionCreate(SessionCreate::new("b", "new"))).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
    assert!(e.message.contains("out of space"), "{e:?}");
    let l = audit(&d);
    assert_eq!(l.corrupt, 0);
    let outcomes: Vec<&str> = l.records[audit_before..]
        .iter()
        .filter(|r| r.action == "checkpoint.create" || r.action == "session.rollback")
        .map(|r| r.outcome.as_str())
        .collect();
    assert_eq!(
        outcomes,
        ["begun", "ok"].repeat(6),
        "{:?}",
        &l.records[audit_before..]
    );
    let r = check(&d);
    assert!(r.is_consistent() && r.read_only.is_none(), "{r:?}");

    // Restarted while the disk is full: the index keeps its room (redb
    // trims its file at close, which on Btrfs freed the room kept past its
    // end, before), and every session checkpoints and rolls back again,
    // each change in the index as answered.
    let index = d.root.join("state/index.redb");
    let (root, sock) = (d.root.clone(), d.socket.clone());
    assert!(d.stop().success());
    let room = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (std::os::unix::fs::MetadataExt::blocks(&m) * 512).saturating_sub(m.len())
    };
    let kept = room(&index);
    let d = Daemon::start(&root, &sock, &[], &["--no-processes"]);
    assert!(
        room(&index) >= 512 << 10 && room(&index) >= kept / 2,
        "the index's room after a restart on a full disk: {} bytes (before: {kept})",
        room(&index)
    );
    for (a, s) in sessions {
        for n in 0..3 {
            let c = format!("restarted{n}");
            ok(&d, Request::CheckpointCreate(ck(a, s, &c)));
            ok(&d, Request::SessionRollback(rb(a, s, "base")));
        }
    }
    for (a, s) in sessions {
        let Response::Checkpoints(l) = ok(
            &d,
            Request::CheckpointList(SessionRef {
                agent_id: a.into(),
                session_id: s.into(),
            }),
        ) else {
            panic!("checkpoint.list")
        };
        let ids: Vec<&str> = l
            .checkpoints
            .iter()
            .map(|c| c.checkpoint_id.as_str())
            .collect();
        assert_eq!(
            ids,
            ["base", "on-full", "restarted0", "restarted1", "restarted2"],
            "{a}/{s}"
        );
        assert_eq!(l.head.as_deref(), Some("base"), "{a}/{s}");
    }
    let r = check(&d);
    assert!(r.is_consistent() && r.read_only.is_none(), "{r:?}");

    // An import on the full disk is refused as the full disk it meets
    // (`unavailable`, free space and retry), not blamed on the archive:
    // at its start, and, with a little room free, when its receive runs
    // out of it. Nothing of it is left.
    let ctl = |args: &[&str]| {
        let (code, stdout, stderr) = allox_integration::alloxctl(&d.socket, args);
        (code, String::from_utf8_lossy(&stdout).into_owned(), stderr)
    };
    let imported = |name: &str| {
        let (code, _, err) = ctl(&["session", "import", "b", name, "-i", archive]);
        assert_ne!(code, 0, "imported on a full disk");
        assert!(
            err.contains("unavailable") && err.contains("out of space"),
            "{err}"
        );
        let left: Vec<_> = std::fs::read_dir(d.root.join("agents/b/workspace/sessions"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "t")
            .collect();
        assert!(left.is_empty(), "{left:?}");
    };
    imported("at-start");
    std::fs::remove_file(&spacer).unwrap();
    let _ = Command::new("btrfs")
        .args(["filesystem", "sync"])
        .arg(&d.root)
        .status();
    assert!(
        free(&d.root) > 32 << 20 && free(&d.root) < 90 << 20,
        "{}",
        free(&d.root)
    );
    imported("in-receive");
    let r = check(&d);
    assert!(r.is_consistent() && r.read_only.is_none(), "{r:?}");
    let l = audit(&d);

    // Deleting the session that filled the disk frees it, and a restart
    // finds the index, the journal and the audit log whole.
    ok(
        &d,
        Request::SessionDelete(SessionDelete {
            agent_id: "a".into(),
            session_id: "s1".into(),
            force: true,
        }),
    );
    let t0 = std::time::Instant::now();
    while free(&d.root) < 256 << 20 {
        assert!(
            t0.elapsed().as_secs() < 120,
            "the deleted session's space never came back"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (root, sock) = (d.root.clone(), d.socket.clone());
    assert!(d.stop().success());
    let d = Daemon::start(&root, &sock, &[], &["--no-processes"]);
    let r = check(&d);
    assert!(r.is_consistent() && r.read_only.is_none(), "{r:?}");
    ok(&d, Request::SessionCreate(SessionCreate::new("b", "new")));
    let l2 = audit(&d);
    assert_eq!(l2.corrupt, 0);
    assert!(l2.records.len() > l.records.len());
    assert_eq!(l2.records[..l.records.len()], l.records[..]);
}

fn nocow(p: &Path) -> bool {
    let f = std::fs::File::open(p).unwrap();
    rustix::fs::ioctl_getflags(&f)
        .unwrap()
        .contains(rustix::fs::IFlags::NOCOW)
}

#[test]
fn state_files_of_an_older_store_are_rewritten_without_copy_on_write() {
    let Some(fs) = setup("disk::state_files_of_an_older_store") else {
        return;
    };
    let st = open(&fs, None);
    st.agent_create("a").unwrap();
    st.audit().append(audit_entry("before")).unwrap();
    st.sync().unwrap();
    let state = st.layout().state_dir();
    drop(st);
    // As a store made before the room was kept: plain copy-on-write files.
    for name in ["index.redb", "audit.log"] {
        let p = state.join(name);
        assert!(nocow(&p), "{name}");
        let bytes = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, bytes).unwrap();
        assert!(!nocow(&p), "{name}");
    }
    let st = open(&fs, None);
    for name in ["index.redb", "audit.log"] {
        let p = state.join(name);
        assert!(nocow(&p), "{name} was not rewritten");
        let m = std::fs::metadata(&p).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert!(
            m.blocks() * 512 > m.len() + (512 << 10),
            "{name}: no room kept"
        );
    }
    let agents: Vec<String> = st
        .agent_list()
        .unwrap()
        .into_iter()
        .map(|a| a.agent_id)
        .collect();
    assert_eq!(agents, ["a"]);
    let log = st.audit().read(Some(0), None, 100).unwrap();
    assert_eq!(log.corrupt, 0);
    assert!(log.records.iter().any(|r| r.action == "before"));
}

#[test]
fn the_daemon_limits_sessions_with_its_session_quota_flag() {
    let Some((fs, d)) = Daemon::on_new_store(
        "disk::the_daemon_limits_sessions",
        &["--no-processes", "--session-quota", "64M"],
    ) else {
        return;
    };
    ok(&d, Request::AgentCreate(AgentCreate::new("a")));
    let Response::Session(s) = ok(&d, Request::SessionCreate(SessionCreate::new("a", "s"))) else {
        panic!("session.create")
    };
    let e = fill(Path::new(&s.current), 256 << 20);
    assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{e}");
    ok(&d, Request::CheckpointCreate(ck("a", "s", "full")));
    assert!(free(fs.path()) > 200 << 20);
}

/// The audit log rotated on a full disk: the new file gets its room
/// before the old one is set aside, or the log is not rotated (a new file
/// with no room refused every record, and so every change of the host's).
#[test]
fn the_audit_log_rotated_on_a_full_disk_keeps_taking_the_host_s_records() {
    let Some(fs) = setup("disk::the_audit_log_rotated_on_a_full_disk") else {
        return;
    };
    let st = open(&fs, None);
    st.audit().bound(allox_store::audit::AuditBounds {
        file_bytes: 64 << 10,
        lines_per_s: 0,
    });
    st.agent_create("a").unwrap();
    let s = st.session_create("a", "s").unwrap();
    allox_integration::fill_disk(Path::new(&s.current));
    // Many times the bound, each record the host's: every one taken,
    // whether the log rotates into a file with its room or grows on.
    for i in 0..2000 {
        let mut e = audit_entry("checkpoint.create");
        e.message = Some(format!("record {i} {}", "m".repeat(200)));
        st.audit()
            .append(e)
            .unwrap_or_else(|e| panic!("record {i} refused on a full disk: {e}"));
    }
    let log = fs.path().join("store/state/audit.log");
    let m = std::fs::metadata(&log).unwrap();
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&m) * 512 > m.len(),
        "the audit log has no room left: {} bytes, {} allocated",
        m.len(),
        std::os::unix::fs::MetadataExt::blocks(&m) * 512
    );
    let l = st.audit().read(None, None, 10).unwrap();
    assert_eq!(
        l.records
            .last()
            .unwrap()
            .message
            .as_deref()
            .map(|m| &m[..11]),
        Some("record 1999")
    );
}
