//! The workspace store on a real Btrfs filesystem, through the library.

use allox_integration::{
    deleted_subvolumes, deleted_subvolumes_dropped, populate, require, tree_digest, BtrfsFs,
};
use allox_protocol::{CheckpointCreate, ErrorCode, Origin, SessionRollback};
use allox_store::btrfs;
use allox_store::failpoint::Failpoints;
use allox_store::Store;
use std::path::Path;

fn open(fs: &BtrfsFs) -> Store {
    Store::open(&fs.path().join("store"), Failpoints::default()).expect("open store")
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

fn setup(name: &str) -> Option<(BtrfsFs, Store)> {
    if !require(name) {
        return None;
    }
    std::fs::create_dir_all("/var/tmp").ok();
    let fs = BtrfsFs::new(512).expect("make btrfs");
    std::fs::create_dir(fs.path().join("store")).unwrap();
    let st = open(&fs);
    Some((fs, st))
}

#[test]
fn action_matrix() {
    let Some((_fs, st)) = setup("store::action_matrix") else {
        return;
    };
    // agent
    let a = st.agent_create("agent-a").unwrap();
    assert!(btrfs::is_subvolume(Path::new(&a.workspace)));
    assert!(Path::new(&a.workspace).join("shared").is_dir());
    assert_eq!(
        st.agent_create("agent-a").unwrap_err().code(),
        ErrorCode::Conflict
    );
    assert_eq!(st.agent_list().unwrap().len(), 1);
    // session
    assert_eq!(
        st.session_create("nobody", "s").unwrap_err().code(),
        ErrorCode::NotFound
    );
    let s = st.session_create("agent-a", "s1").unwrap();
    assert!(btrfs::is_subvolume(Path::new(&s.current)));
    assert_eq!(
        st.session_create("agent-a", "s1").unwrap_err().code(),
        ErrorCode::Conflict
    );
    assert_eq!(st.session_list("agent-a").unwrap().len(), 1);
    assert_eq!(
        st.session_list("nobody").unwrap_err().code(),
        ErrorCode::NotFound
    );
    // checkpoint
    std::fs::write(Path::new(&s.current).join("f"), "one").unwrap();
    let c = st.checkpoint_create(&ck("agent-a", "s1", "c1")).unwrap();
    assert_eq!(c.parent, None);
    assert_eq!(c.origin, Origin::Manual);
    let cp = st.layout().checkpoint("agent-a", "s1", "c1");
    assert!(btrfs::is_subvolume(&cp));
    assert!(
        std::fs::write(cp.join("g"), "x").is_err(),
        "checkpoint must be read-only"
    );
    assert_eq!(
        st.checkpoint_create(&ck("agent-a", "s1", "c1"))
            .unwrap_err()
            .code(),
        ErrorCode::Conflict
    );
    assert_eq!(
        st.checkpoint_create(&ck("agent-a", "nos", "c1"))
            .unwrap_err()
            .code(),
        ErrorCode::NotFound
    );
    // change, rollback
    std::fs::write(Path::new(&s.current).join("f"), "two").unwrap();
    std::fs::write(Path::new(&s.current).join("new"), "x").unwrap();
    let r = st.rollback(&rb("agent-a", "s1", "c1")).unwrap();
    assert_eq!(r.previous_head.as_deref(), Some("c1"));
    assert_eq!(
        std::fs::read_to_string(Path::new(&s.current).join("f")).unwrap(),
        "one"
    );
    assert!(!Path::new(&s.current).join("new").exists());
    assert_eq!(
        st.rollback(&rb("agent-a", "s1", "nope"))
            .unwrap_err()
            .code(),
        ErrorCode::NotFound
    );
    // pinned checkpoints are not deleted
    let mut p = ck("agent-a", "s1", "keep");
    p.pinned = true;
    st.checkpoint_create(&p).unwrap();
    assert_eq!(
        st.checkpoint_delete("agent-a", "s1", "keep")
            .unwrap_err()
            .code(),
        ErrorCode::Conflict
    );
    st.checkpoint_pin("agent-a", "s1", "keep", false).unwrap();
    st.checkpoint_delete("agent-a", "s1", "keep").unwrap();
    st.checkpoint_delete("agent-a", "s1", "c1").unwrap();
    assert_eq!(
        st.checkpoint_delete("agent-a", "s1", "c1")
            .unwrap_err()
            .code(),
        ErrorCode::NotFound
    );
    st.wait_idle();
    assert!(!cp.exists());
    // session and agent delete
    st.session_delete("agent-a", "s1").unwrap();
    assert_eq!(st.session_list("agent-a").unwrap().len(), 0);
    st.session_create("agent-a", "s2").unwrap();
    st.checkpoint_create(&ck("agent-a", "s2", "c")).unwrap();
    st.agent_delete("agent-a").unwrap();
    st.wait_idle();
    assert!(st.agent_list().unwrap().is_empty());
    assert!(!st.layout().agent_dir("agent-a").exists());
    let leftovers: Vec<_> = std::fs::read_dir(st.layout().agents_dir())
        .unwrap()
        .flatten()
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(
        st.agent_delete("agent-a").unwrap_err().code(),
        ErrorCode::NotFound
    );
}

#[test]
fn hostile_ids_create_nothing() {
    let Some((fs, st)) = setup("store::hostile_ids_create_nothing") else {
        return;
    };
    st.agent_create("ok").unwrap();
    st.session_create("ok", "ok").unwrap();
    let before = tree_digest(fs.path());
    let long = "x".repeat(65);
    for bad in [
        "",
        ".",
        "..",
        "a/b",
        "a\0b",
        &long,
        "é",
        "-rf",
        "../../etc",
        ".trash-1",
    ] {
        assert_eq!(
            st.agent_create(bad).unwrap_err().code(),
            ErrorCode::InvalidRequest,
            "{bad:?}"
        );
        assert_eq!(
            st.session_create("ok", bad).unwrap_err().code(),
            ErrorCode::InvalidRequest,
            "{bad:?}"
        );
        assert_eq!(
            st.checkpoint_create(&ck("ok", "ok", bad))
                .unwrap_err()
                .code(),
            ErrorCode::InvalidRequest,
            "{bad:?}"
        );
        assert_eq!(
            st.rollback(&rb("ok", "ok", bad)).unwrap_err().code(),
            ErrorCode::InvalidRequest
        );
        assert_eq!(
            st.checkpoint_delete("ok", bad, "c").unwrap_err().code(),
            ErrorCode::InvalidRequest
        );
    }
    let mut p = ck("ok", "ok", "c");
    p.label = Some("x".repeat(300));
    assert_eq!(
        st.checkpoint_create(&p).unwrap_err().code(),
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        before,
        tree_digest(fs.path()),
        "a refused request changed the disk"
    );
}

#[test]
fn rollback_touches_only_its_session() {
    let Some((_fs, st)) = setup("store::rollback_touches_only_its_session") else {
        return;
    };
    for a in ["a1", "a2"] {
        st.agent_create(a).unwrap();
        std::fs::write(
            st.layout().shared(a).join("notes"),
            format!("shared of {a}"),
        )
        .unwrap();
        for s in ["s1", "s2"] {
            let info = st.session_create(a, s).unwrap();
            populate(Path::new(&info.current), 50).unwrap();
            st.checkpoint_create(&ck(a, s, "base")).unwrap();
            std::fs::write(Path::new(&info.current).join("after"), "later work").unwrap();
        }
    }
    let l = st.layout().clone();
    let others: Vec<_> = [("a1", "s2"), ("a2", "s1"), ("a2", "s2")]
        .iter()
        .map(|(a, s)| (l.current(a, s), tree_digest(&l.current(a, s))))
        .collect();
    let shared: Vec<_> = ["a1", "a2"]
        .iter()
        .map(|a| tree_digest(&l.shared(a)))
        .collect();
    let state_before = std::fs::read(l.state_dir().join("audit.log")).unwrap();
    let ck_before = tree_digest(&l.checkpoint("a1", "s1", "base"));

    st.rollback(&rb("a1", "s1", "base")).unwrap();
    st.wait_idle();

    assert!(!l.current("a1", "s1").join("after").exists());
    assert_eq!(tree_digest(&l.current("a1", "s1")), ck_before);
    for (p, d) in others {
        assert_eq!(tree_digest(&p), d, "{} changed", p.display());
        assert!(p.join("after").exists());
    }
    let shared_after: Vec<_> = ["a1", "a2"]
        .iter()
        .map(|a| tree_digest(&l.shared(a)))
        .collect();
    assert_eq!(shared, shared_after);
    // state/ is outside rollback scope: nothing in it went back.
    assert_eq!(
        std::fs::read(l.state_dir().join("audit.log")).unwrap(),
        state_before
    );
}

#[test]
fn dag_after_rollbacks() {
    let Some((_fs, st)) = setup("store::dag_after_rollbacks") else {
        return;
    };
    st.agent_create("a").unwrap();
    let cur = st.layout().current("a", "s");
    st.session_create("a", "s").unwrap();
    std::fs::write(cur.join("v"), "1").unwrap();
    st.checkpoint_create(&ck("a", "s", "c1")).unwrap();
    std::fs::write(cur.join("v"), "2").unwrap();
    let c2 = st.checkpoint_create(&ck("a", "s", "c2")).unwrap();
    assert_eq!(c2.parent.as_deref(), Some("c1"));
    st.rollback(&rb("a", "s", "c1")).unwrap();
    assert_eq!(std::fs::read_to_string(cur.join("v")).unwrap(), "1");
    std::fs::write(cur.join("v"), "3").unwrap();
    let c3 = st.checkpoint_create(&ck("a", "s", "c3")).unwrap();
    assert_eq!(
        c3.parent.as_deref(),
        Some("c1"),
        "after rollback to c1 the next parent is c1"
    );
    st.rollback(&rb("a", "s", "c2")).unwrap();
    assert_eq!(std::fs::read_to_string(cur.join("v")).unwrap(), "2");
    let c4 = st.checkpoint_create(&ck("a", "s", "c4")).unwrap();
    assert_eq!(c4.parent.as_deref(), Some("c2"));
    let l = st.checkpoint_list("a", "s").unwrap();
    assert_eq!(l.head.as_deref(), Some("c4"));
    let edges: Vec<(String, Option<String>)> = l
        .checkpoints
        .iter()
        .map(|c| (c.checkpoint_id.clone(), c.parent.clone()))
        .collect();
    assert_eq!(
        edges,
        vec![
            ("c1".into(), None),
            ("c2".into(), Some("c1".into())),
            ("c3".into(), Some("c1".into())),
            ("c4".into(), Some("c2".into())),
        ]
    );
    // Deleting an inner node re-links its children to its parent.
    st.checkpoint_delete("a", "s", "c2").unwrap();
    let l = st.checkpoint_list("a", "s").unwrap();
    let c4 = l
        .checkpoints
        .iter()
        .find(|c| c.checkpoint_id == "c4")
        .unwrap();
    assert_eq!(c4.parent.as_deref(), Some("c1"));
    // The contents of each checkpoint stayed what they were.
    for (c, v) in [("c1", "1"), ("c3", "3"), ("c4", "2")] {
        let p = st.layout().checkpoint("a", "s", c).join("v");
        assert_eq!(std::fs::read_to_string(p).unwrap(), v, "{c}");
    }
}

#[test]
fn state_survives_reopen_and_index_matches_disk() {
    let Some((fs, st)) = setup("store::state_survives_reopen") else {
        return;
    };
    st.agent_create("a").unwrap();
    st.session_create("a", "s").unwrap();
    st.checkpoint_create(&ck("a", "s", "c1")).unwrap();
    st.checkpoint_create(&ck("a", "s", "c2")).unwrap();
    let before = st.checkpoint_list("a", "s").unwrap();
    st.sync().unwrap();
    drop(st);
    let st = open(&fs);
    assert_eq!(st.checkpoint_list("a", "s").unwrap(), before);
    // A checkpoint removed behind the store's back is dropped from the
    // index; a subvolume that appears on disk is adopted, not thrown away.
    let l = st.layout().clone();
    drop(st);
    btrfs::remove_tree(&l.checkpoint("a", "s", "c2")).unwrap();
    btrfs::snapshot(&l.current("a", "s"), &l.checkpoint("a", "s", "found"), true).unwrap();
    let st = open(&fs);
    let names: Vec<String> = st
        .checkpoint_list("a", "s")
        .unwrap()
        .checkpoints
        .into_iter()
        .map(|c| c.checkpoint_id)
        .collect();
    assert_eq!(names, ["c1", "found"]);
    assert_eq!(
        st.checkpoint_list("a", "s").unwrap().head.as_deref(),
        Some("c1")
    );
    let audit = st.audit().read(Some(0), None, 1000).unwrap();
    assert!(audit.records.iter().any(|r| r
        .message
        .as_deref()
        .unwrap_or("")
        .contains("adopted checkpoint a/s/found")));
}

#[test]
fn second_store_on_same_root_is_refused() {
    let Some((fs, st)) = setup("store::second_store_on_same_root_is_refused") else {
        return;
    };
    let e = Store::open(&fs.path().join("store"), Failpoints::default())
        .err()
        .unwrap();
    assert!(e.chain().contains("another supervisor"), "{}", e.chain());
    drop(st);
}

#[test]
fn non_btrfs_root_is_refused_with_its_name() {
    if !require("store::non_btrfs_root_is_refused") {
        return;
    }
    let d = tempfile::tempdir_in("/dev/shm").unwrap();
    let e = Store::open(d.path(), Failpoints::default()).err().unwrap();
    assert!(e.chain().contains("not on a Btrfs"), "{}", e.chain());
}

#[test]
fn disk_full_gives_a_clean_error_and_keeps_journal_and_audit_usable() {
    let Some((fs, st)) = setup("store::disk_full") else {
        return;
    };
    st.agent_create("a").unwrap();
    let s = st.session_create("a", "s").unwrap();
    // Fill the filesystem from inside the session.
    let mut i = 0;
    loop {
        let r = std::fs::write(
            Path::new(&s.current).join(format!("fill{i}")),
            vec![7u8; 8 << 20],
        );
        if r.is_err() {
            break;
        }
        i += 1;
        assert!(i < 200, "filesystem never filled");
    }
    // Small writes until even those fail.
    for j in 0..10_000 {
        if std::fs::write(
            Path::new(&s.current).join(format!("small{j}")),
            vec![1u8; 4096],
        )
        .is_err()
        {
            break;
        }
    }
    let mut errors = Vec::new();
    for n in 0..20 {
        match st.checkpoint_create(&ck("a", "s", &format!("full{n}"))) {
            Ok(_) => {}
            Err(e) => errors.push(e),
        }
        match st.session_create("a", &format!("more{n}")) {
            Ok(_) => {}
            Err(e) => errors.push(e),
        }
    }
    assert!(!errors.is_empty(), "a full filesystem refused nothing");
    for e in &errors {
        assert!(
            matches!(e.code(), ErrorCode::Unavailable),
            "full disk gave {:?}: {}",
            e.code(),
            e.chain()
        );
        assert!(
            e.to_body().message.contains("out of space"),
            "{}",
            e.chain()
        );
    }
    // On the full disk, guests' records take the audit log's room only
    // down to what is kept for the host: then they are refused (and so
    // are the calls that would make them), and the host's records (a
    // kill, a delete: what ends the agent that filled the disk) still go
    // in. (Before, an agent's calls took it all, and every host change
    // was refused, even after a restart.)
    let entry = |peer: &str, n: u64, len: usize| allox_store::audit::Entry {
        request_id: n,
        peer: peer.into(),
        action: "plugin.call".into(),
        target: "a/s/r:share.status".into(),
        outcome: "ok".into(),
        message: Some("y".repeat(len)),
    };
    let mut guests = 0;
    let refused = loop {
        match st.audit().append(entry("guest a/s/r", guests, 1000)) {
            Ok(_) => guests += 1,
            Err(e) => break e,
        }
        assert!(guests < 100_000, "the guest's records were never refused");
    };
    assert!(
        matches!(refused, allox_store::audit::AuditError::KeptForHost { .. }),
        "after {guests}: {refused}"
    );
    assert!(st.audit().guest_may_record().is_err());
    for n in 0..1000 {
        st.audit()
            .append(entry("unix:uid=0", n, 100))
            .unwrap_or_else(|e| panic!("host record {n}: {e}"));
    }
    // Free space; everything works again and the index matches the disk.
    for k in 0..i {
        let _ = std::fs::remove_file(Path::new(&s.current).join(format!("fill{k}")));
    }
    let _ = std::process::Command::new("sync").status();
    st.checkpoint_create(&ck("a", "s", "after")).unwrap();
    st.audit()
        .append(allox_store::audit::Entry {
            request_id: 1,
            peer: "test".into(),
            action: "x".into(),
            target: String::new(),
            outcome: "ok".into(),
            message: None,
        })
        .unwrap();
    let listing = st.checkpoint_list("a", "s").unwrap();
    drop(st);
    let st = open(&fs);
    assert_eq!(st.checkpoint_list("a", "s").unwrap(), listing);
    for c in &listing.checkpoints {
        assert!(btrfs::is_subvolume(&st.layout().checkpoint(
            "a",
            "s",
            &c.checkpoint_id
        )));
    }
    assert!(st.audit().read(Some(0), None, 10).unwrap().corrupt == 0);
}

#[test]
fn removal_never_follows_symlinks_out_of_the_tree() {
    let Some((_fs, st)) = setup("store::removal_never_follows_symlinks") else {
        return;
    };
    st.agent_create("victim").unwrap();
    let v = st.session_create("victim", "s").unwrap();
    std::fs::write(Path::new(&v.current).join("precious"), "keep me").unwrap();
    st.checkpoint_create(&ck("victim", "s", "c")).unwrap();
    st.agent_create("a").unwrap();
    st.session_create("a", "s").unwrap();
    let shared = st.layout().shared("a");
    // Symlinks to the other agent's trees, and a nested subvolume beside
    // them so that removal has to walk the directories.
    std::os::unix::fs::symlink(&v.current, shared.join("to-current")).unwrap();
    std::os::unix::fs::symlink(
        st.layout().checkpoint("victim", "s", "c"),
        shared.join("to-ckpt"),
    )
    .unwrap();
    std::fs::create_dir(shared.join("deep")).unwrap();
    std::os::unix::fs::symlink(st.layout().agents_dir(), shared.join("deep/agents")).unwrap();
    btrfs::create_subvolume(&shared.join("deep/nested")).unwrap();
    st.agent_delete("a").unwrap();
    st.wait_idle();
    assert!(!st.layout().agent_dir("a").exists());
    assert_eq!(
        std::fs::read_to_string(Path::new(&v.current).join("precious")).unwrap(),
        "keep me"
    );
    assert!(btrfs::is_subvolume(
        &st.layout().checkpoint("victim", "s", "c")
    ));
    assert_eq!(
        st.checkpoint_list("victim", "s").unwrap().checkpoints.len(),
        1
    );
}

#[test]
fn reconcile_relinks_a_chain_of_missing_checkpoints() {
    let Some((fs, st)) = setup("store::reconcile_relinks_a_chain") else {
        return;
    };
    st.agent_create("a").unwrap();
    st.session_create("a", "s").unwrap();
    for c in ["c1", "c2", "c3"] {
        st.checkpoint_create(&ck("a", "s", c)).unwrap();
    }
    st.rollback(&rb("a", "s", "c2")).unwrap();
    let l = st.layout().clone();
    drop(st);
    btrfs::remove_tree(&l.checkpoint("a", "s", "c1")).unwrap();
    btrfs::remove_tree(&l.checkpoint("a", "s", "c2")).unwrap();
    let st = open(&fs);
    let list = st.checkpoint_list("a", "s").unwrap();
    assert_eq!(list.head, None, "head pointed at a checkpoint that is gone");
    assert_eq!(list.checkpoints.len(), 1);
    assert_eq!(list.checkpoints[0].checkpoint_id, "c3");
    assert_eq!(list.checkpoints[0].parent, None);
}

/// A chain of `levels` directories named `name` below `root`, made through
/// descriptors (its paths are far longer than the kernel takes), with a
/// file in every hundredth.
fn chain(root: &Path, levels: usize, name: &str) {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut fd = rustix::fs::open(root, flags, Mode::empty()).unwrap();
    for i in 0..levels {
        rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(0o755)).unwrap();
        fd = rustix::fs::openat(&fd, name, flags, Mode::empty()).unwrap();
        if i % 100 == 0 {
            let f = rustix::fs::openat(
                &fd,
                "f",
                OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
            .unwrap();
            drop(f);
        }
    }
}

#[test]
fn removal_is_iterative_on_deep_and_wide_trees() {
    let Some((fs, st)) = setup("store::removal_is_iterative_on_deep_and_wide_trees") else {
        return;
    };
    // A plain tree: a chain deeper than a recursive walk's stack or the
    // descriptor limit allow, a wide directory, a symlink out.
    let t = fs.path().join("t");
    std::fs::create_dir(&t).unwrap();
    chain(&t, 30_000, "d");
    std::fs::create_dir(t.join("wide")).unwrap();
    for i in 0..20_000 {
        std::fs::write(t.join(format!("wide/{i}")), "").unwrap();
    }
    std::os::unix::fs::symlink(st.layout().root(), t.join("wide/out")).unwrap();
    btrfs::remove_tree(&t).unwrap();
    assert!(!t.exists());
    assert!(st.layout().root().is_dir());
    // A subvolume holding a subvolume below a deep chain of its own: the
    // walk that finds nested subvolumes goes all the way down.
    let w = fs.path().join("w");
    btrfs::create_subvolume(&w).unwrap();
    chain(&w, 20_000, "e");
    let mut p = w.clone();
    for _ in 0..50 {
        p = p.join("e");
    }
    btrfs::create_subvolume(&p.join("nested")).unwrap();
    chain(&p.join("nested"), 20_000, "n");
    btrfs::remove_tree(&w).unwrap();
    assert!(!w.exists());
}

/// The start's privacy sweep of `state/` makes the store's own
/// directories private but passes over a subvolume there, an agent's tree
/// the system-effects plugin keeps as evidence: it keeps its modes (and a
/// read-only one is not written to, which failed with a warning).
#[test]
fn the_state_sweep_leaves_the_agents_trees_kept_as_evidence() {
    use std::os::unix::fs::PermissionsExt;
    let Some((fs, st)) = setup("store::the_state_sweep_leaves_the_agents_trees_kept_as_evidence")
    else {
        return;
    };
    drop(st);
    let state = fs.path().join("store/state");
    let run = state.join("effects/a/s/r1");
    std::fs::create_dir_all(&run).unwrap();
    let tree = run.join("b-workspace");
    btrfs::create_subvolume(&tree).unwrap();
    std::fs::write(tree.join("notes.txt"), "x").unwrap();
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
    let chmod = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    };
    for (p, m) in [
        (state.join("effects"), 0o755),
        (run.clone(), 0o755),
        (tree.clone(), 0o755),
        (tree.join("notes.txt"), 0o644),
    ] {
        chmod(&p, m);
    }
    let _st = open(&fs);
    assert_eq!(mode(&state.join("effects")), 0o700);
    assert_eq!(mode(&run), 0o700);
    assert_eq!(mode(&tree), 0o755, "the agent's tree keeps its mode");
    assert_eq!(mode(&tree.join("notes.txt")), 0o644);
}

/// A deleted snapshot stays on the filesystem until Btrfs's cleaner drops
/// it, which a commit of the transaction thread wakes (every 30 s by
/// default, or at once when `BTRFS_IOC_START_SYNC` starts one, as
/// `start_commit` and `commit` do), and meanwhile slows every new snapshot
/// of the tree it shared blocks with. A commit by `syncfs` leaves it; one
/// started after the deletion drops it within seconds.
#[test]
fn a_started_commit_drops_a_deleted_snapshot_and_a_plain_commit_does_not() {
    let name = "store::a_started_commit_drops_a_deleted_snapshot";
    if !require(name) {
        return;
    }
    let fs = BtrfsFs::new(512).expect("make btrfs");
    let ws = fs.path().join("ws");
    btrfs::create_subvolume(&ws).unwrap();
    for i in 0..2000 {
        std::fs::write(ws.join(format!("f{i}")), format!("{i}")).unwrap();
    }
    let snaps = [fs.path().join("one"), fs.path().join("two")];
    for s in &snaps {
        btrfs::snapshot(&ws, s, true).unwrap();
    }
    btrfs::commit(fs.path()).unwrap();
    assert_eq!(deleted_subvolumes(fs.path()), 0);
    // The control: deleted, and committed by `syncfs`, it is still there
    // (unless the transaction thread's own commit fell in between, once
    // in 30 s).
    btrfs::delete_subvolume(&snaps[0]).unwrap();
    let synced = std::process::Command::new("sync")
        .arg("-f")
        .arg(fs.path())
        .status()
        .unwrap();
    assert!(synced.success());
    assert_eq!(
        deleted_subvolumes(fs.path()),
        1,
        "a deleted snapshot was dropped without a commit of the transaction thread"
    );
    btrfs::delete_subvolume(&snaps[1]).unwrap();
    btrfs::start_commit(fs.path()).unwrap();
    assert!(
        deleted_subvolumes_dropped(fs.path(), std::time::Duration::from_secs(10)),
        "deleted snapshots are still on the filesystem 10 s after a started commit: {}",
        deleted_subvolumes(fs.path())
    );
}

/// What a rollback replaces and a deleted checkpoint leave is dropped
/// from the filesystem soon, not at Btrfs's periodic commit: left there,
/// each deleted subvolume slows every later snapshot of the session's
/// workspace (docs/benchmarks.md, "Rollback and checkpoint deletion:
/// deleted trees dropped at once").
/// The control is the test above: a deletion committed by `syncfs` alone
/// stays.
#[test]
fn what_a_rollback_and_a_checkpoint_deletion_leave_is_dropped_soon() {
    let Some((fs, st)) = setup("store::what_a_rollback_and_a_checkpoint_deletion_leave") else {
        return;
    };
    st.agent_create("a").unwrap();
    let info = st.session_create("a", "s").unwrap();
    populate(Path::new(&info.current), 500).unwrap();
    st.checkpoint_create(&ck("a", "s", "base")).unwrap();
    st.checkpoint_create(&ck("a", "s", "later")).unwrap();
    st.rollback(&rb("a", "s", "base")).unwrap();
    st.checkpoint_delete("a", "s", "later").unwrap();
    st.wait_idle();
    assert!(
        deleted_subvolumes_dropped(fs.path(), std::time::Duration::from_secs(10)),
        "deleted subvolumes still on the filesystem 10 s after a rollback and a checkpoint deletion: {}",
        deleted_subvolumes(fs.path())
    );
}

/// An expiry is written only over the record the clock judged: a
/// lifetime given meanwhile (`session.update`) stands. (The clock wrote
/// the record it had read, with its expiry, over the update's.)
#[test]
fn an_expiry_is_recorded_only_over_the_record_it_judged() {
    let Some((_fs, st)) = setup("store::an_expiry_is_recorded_only_over_the_record_it_judged")
    else {
        return;
    };
    st.agent_create("a").unwrap();
    st.session_create("a", "s").unwrap();
    let judged = allox_store::index::ClockRecord {
        max_lifetime_ms: Some(1_000),
        lifetime_from_ms: 5,
        last_active_ms: 5,
        ..Default::default()
    };
    st.set_clock("a", "s", &judged).unwrap();
    // More time given after the clock read the record: not expired.
    let given = allox_store::index::ClockRecord {
        max_lifetime_ms: Some(600_000),
        lifetime_from_ms: 2_000,
        ..judged.clone()
    };
    st.set_clock("a", "s", &given).unwrap();
    assert_eq!(st.expire_clock("a", "s", &judged, 3_000).unwrap(), None);
    let now: Vec<_> = st.clocks().unwrap();
    assert_eq!(now, [("a".to_string(), "s".to_string(), given.clone())]);
    // The record judged is the one there: expired, durably.
    let done = st.expire_clock("a", "s", &given, 700_000).unwrap().unwrap();
    assert_eq!(done.expired_ms, Some(700_000));
    assert_eq!(st.clocks().unwrap()[0].2, done);
    // Once expired, not again.
    assert_eq!(st.expire_clock("a", "s", &given, 800_000).unwrap(), None);
}

/// A check beside a delete does not call the delete's tree, still being
/// removed, out of place (a delete that came between the check's wait for
/// removals and its lock made `alloxctl check` exit 1 on a sound store).
#[test]
fn a_check_beside_a_delete_does_not_call_its_tree_out_of_place() {
    let name = "store::a_check_beside_a_delete_does_not_call_its_tree_out_of_place";
    if !allox_integration::require(name) {
        return;
    }
    let fs = BtrfsFs::new(512).expect("make btrfs");
    let root = fs.path().join("store");
    std::fs::create_dir(&root).unwrap();
    let fp = Failpoints::parse("check.after_wait=delay:300,reaper.before_remove=delay:1000");
    let st = std::sync::Arc::new(Store::open(&root, fp.clone()).unwrap());
    st.agent_create("a").unwrap();
    st.session_create("a", "s").unwrap();
    st.session_create("a", "t").unwrap();
    let checking = {
        let st = st.clone();
        std::thread::spawn(move || st.check().unwrap())
    };
    let t0 = std::time::Instant::now();
    while fp.reached("check.after_wait") == 0 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "no check"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    st.session_delete("a", "t").unwrap();
    let r = checking.join().unwrap();
    assert!(
        r.is_consistent() && r.missing_in_index.is_empty() && r.removing == 1,
        "{r:?}"
    );
}
