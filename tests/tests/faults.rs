//! Faults the supervisor must survive without doing anything unaudited or
//! throwing anything away: an audit log it cannot write, an index it cannot
//! open, a tree it cannot look at during recovery.

use allox_integration::{require, BtrfsFs, Daemon};
use allox_protocol::*;
use std::path::Path;
use std::process::Command;

fn setup(name: &str) -> Option<(BtrfsFs, Daemon)> {
    if !require(name) {
        return None;
    }
    std::fs::create_dir_all("/var/tmp").ok();
    let fs = BtrfsFs::new(512).expect("make btrfs");
    let root = fs.path().join("store");
    std::fs::create_dir(&root).unwrap();
    let sock = fs.scratch().join("ctl.sock");
    let d = Daemon::start(&root, &sock, &[], &["--no-processes"]);
    Some((fs, d))
}

fn call(d: &Daemon, r: Request) -> Result<Response, ErrorBody> {
    d.client().call(r).expect("transport")
}

fn agents(d: &Daemon) -> Vec<String> {
    match call(d, Request::AgentList(AgentList {})) {
        Ok(Response::Agents(l)) => l.agents.into_iter().map(|a| a.agent_id).collect(),
        other => panic!("{other:?}"),
    }
}

fn prlimit_fsize(pid: u32, limit: &str) {
    let st = Command::new("prlimit")
        .arg("--pid")
        .arg(pid.to_string())
        .arg(format!("--fsize={limit}"))
        .status()
        .unwrap();
    assert!(st.success(), "prlimit failed");
}

#[test]
fn a_change_whose_audit_record_cannot_be_written_is_refused() {
    let Some((_fs, d)) = setup("faults::a_change_whose_audit_record_cannot_be_written") else {
        return;
    };
    call(&d, Request::AgentCreate(AgentCreate::new("a"))).unwrap();
    // From now on no file of the supervisor may grow past the audit log's
    // size: its next record fails with EFBIG.
    let audit = d.root.join("state/audit.log");
    let size = std::fs::metadata(&audit).unwrap().len();
    prlimit_fsize(d.child.id(), &format!("{size}:"));
    let e = call(&d, Request::AgentCreate(AgentCreate::new("b"))).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
    assert!(
        e.message.contains("audit record cannot be written"),
        "{}",
        e.message
    );
    // Nothing was done: reads still work and show no agent b.
    assert_eq!(agents(&d), ["a"]);
    assert!(!d.root.join("agents/b").exists());
    // Once the log can grow again, changes are accepted.
    prlimit_fsize(d.child.id(), "unlimited:");
    call(&d, Request::AgentCreate(AgentCreate::new("b"))).unwrap();
    assert_eq!(agents(&d), ["a", "b"]);
    // The attempt that went ahead is recorded twice: begun, then ok.
    let Ok(Response::Audit(l)) = call(
        &d,
        Request::AuditList(AuditList {
            after_seq: None,
            limit: Some(100),
            before_seq: None,
        }),
    ) else {
        panic!("audit.list")
    };
    let b: Vec<&str> = l
        .records
        .iter()
        .filter(|r| r.target == "b")
        .map(|r| r.outcome.as_str())
        .collect();
    assert_eq!(b, ["begun", "ok"], "{:?}", l.records);
}

fn stop(d: Daemon) -> (std::path::PathBuf, std::path::PathBuf) {
    let (root, sock) = (d.root.clone(), d.socket.clone());
    assert!(d.stop().success());
    (root, sock)
}

#[test]
fn a_damaged_index_opens_read_only_and_says_why() {
    let Some((_fs, d)) = setup("faults::a_damaged_index_opens_read_only") else {
        return;
    };
    call(&d, Request::AgentCreate(AgentCreate::new("a"))).unwrap();
    let (root, sock) = stop(d);
    let index = root.join("state/index.redb");
    let good = std::fs::read(&index).unwrap();
    std::fs::write(&index, vec![0x5a; good.len()]).unwrap();
    // The daemon starts (a supervisor under PID 1 would otherwise fail at
    // every restart) and refuses every change, saying why.
    let d = Daemon::start(&root, &sock, &[], &["--no-processes"]);
    let e = call(&d, Request::AgentCreate(AgentCreate::new("b"))).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
    assert!(
        e.message.contains("read-only") && e.message.contains("index"),
        "{}",
        e.message
    );
    let Ok(Response::StoreCheck(r)) = call(&d, Request::StoreCheck(StoreCheckRequest {})) else {
        // The check itself needs the index: it may only fail as unavailable.
        let e = call(&d, Request::StoreCheck(StoreCheckRequest {})).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
        let (root, sock) = stop(d);
        restore_and_check(&root, &sock, &index, &good);
        return;
    };
    assert!(r.read_only.is_some(), "{r:?}");
    let (root, sock) = stop(d);
    restore_and_check(&root, &sock, &index, &good);
}

fn restore_and_check(root: &Path, sock: &Path, index: &Path, good: &[u8]) {
    std::fs::write(index, good).unwrap();
    let d = Daemon::start(root, sock, &[], &["--no-processes"]);
    assert_eq!(agents(&d), ["a"]);
    call(&d, Request::AgentCreate(AgentCreate::new("b"))).unwrap();
}

#[test]
fn recovery_that_cannot_look_at_a_tree_keeps_its_records() {
    let Some((_fs, d)) = setup("faults::recovery_that_cannot_look_at_a_tree") else {
        return;
    };
    call(&d, Request::AgentCreate(AgentCreate::new("a"))).unwrap();
    call(&d, Request::SessionCreate(SessionCreate::new("a", "s"))).unwrap();
    call(
        &d,
        Request::CheckpointCreate(CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c".into(),
            pinned: false,
            label: Some("keep me".into()),
        }),
    )
    .unwrap();
    let (root, sock) = stop(d);
    // agents/a becomes a symlink to itself: looking below it fails with
    // ELOOP, which says nothing about whether the workspace is there.
    let a = root.join("agents/a");
    let real = root.join("agents/.a-real");
    std::fs::rename(&a, &real).unwrap();
    std::os::unix::fs::symlink("a", &a).unwrap();
    let d = Daemon::start(&root, &sock, &[], &["--no-processes"]);
    let e = call(&d, Request::AgentCreate(AgentCreate::new("b"))).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
    assert!(e.message.contains("recovery failed"), "{}", e.message);
    let (root, sock) = stop(d);
    std::fs::remove_file(&a).unwrap();
    std::fs::rename(&real, &a).unwrap();
    // The records were kept as they were, not dropped and adopted again.
    let d = Daemon::start(&root, &sock, &[], &["--no-processes"]);
    let Ok(Response::Checkpoints(l)) = call(
        &d,
        Request::CheckpointList(SessionRef {
            agent_id: "a".into(),
            session_id: "s".into(),
        }),
    ) else {
        panic!("checkpoint.list")
    };
    assert_eq!(l.checkpoints.len(), 1);
    let c = &l.checkpoints[0];
    assert_eq!(
        (c.origin, c.label.as_deref()),
        (Origin::Manual, Some("keep me")),
        "the checkpoint's record was lost: {c:?}"
    );
    let Ok(Response::StoreCheck(r)) = call(&d, Request::StoreCheck(StoreCheckRequest {})) else {
        panic!("store.check")
    };
    assert!(r.is_consistent() && r.read_only.is_none(), "{r:?}");
}
