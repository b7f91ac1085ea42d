//! Turns and automatic checkpoints on a real Btrfs store.

use allox_integration::{require, BtrfsFs};
use allox_protocol::*;
use allox_store::failpoint::Failpoints;
use allox_store::Store;

fn setup(name: &str) -> Option<(BtrfsFs, Store)> {
    if !require(name) {
        return None;
    }
    std::fs::create_dir_all("/var/tmp").ok();
    let fs = BtrfsFs::new(512).expect("make btrfs");
    std::fs::create_dir(fs.path().join("store")).unwrap();
    let st = Store::open(&fs.path().join("store"), Failpoints::default()).unwrap();
    st.agent_create("a").unwrap();
    Some((fs, st))
}

fn policy(st: &Store, s: Option<&str>, on: Option<bool>, keep: Option<u32>) {
    st.policy_set(&PolicySet {
        agent_id: "a".into(),
        session_id: s.map(String::from),
        auto_checkpoint: on,
        keep_last: keep,
    })
    .unwrap();
}

fn session(st: &Store, s: &str) {
    st.session_create("a", s).unwrap();
    st.baseline_if_on("a", s).unwrap();
}

fn turn(st: &Store, s: &str, status: TurnStatus) -> TurnInfo {
    let t = st
        .turn_begin(&TurnBegin {
            agent_id: "a".into(),
            session_id: s.into(),
            turn_id: None,
        })
        .unwrap();
    std::fs::write(st.layout().current("a", s).join("n"), t.number.to_string()).unwrap();
    st.turn_end(&TurnEnd {
        agent_id: "a".into(),
        session_id: s.into(),
        turn_id: t.turn_id,
        status,
        label: None,
    })
    .unwrap()
}

/// Ends turn `id` of a/s `ok`.
fn end_ok(st: &Store, id: &str) -> Result<TurnInfo, allox_store::StoreError> {
    st.turn_end(&TurnEnd {
        agent_id: "a".into(),
        session_id: "s".into(),
        turn_id: id.into(),
        status: TurnStatus::Ok,
        label: None,
    })
}

fn tree(st: &Store, s: &str) -> Vec<(String, Option<String>, Origin)> {
    st.checkpoint_list("a", s)
        .unwrap()
        .checkpoints
        .into_iter()
        .map(|c| (c.checkpoint_id, c.parent, c.origin))
        .collect()
}

#[test]
fn policy_off_creates_nothing() {
    let Some((_fs, st)) = setup("turns::policy_off_creates_nothing") else {
        return;
    };
    session(&st, "s");
    let t = turn(&st, "s", TurnStatus::Ok);
    assert_eq!(t.checkpoint_id, None);
    assert!(tree(&st, "s").is_empty());
}

#[test]
fn agent_policy_session_override_and_turn_outcomes() {
    let Some((_fs, st)) = setup("turns::agent_policy_session_override") else {
        return;
    };
    policy(&st, None, Some(true), None);
    session(&st, "on");
    // As session.create with "auto_checkpoint": false does: the override
    // is set before the baseline would be taken.
    st.session_create("a", "off").unwrap();
    policy(&st, Some("off"), Some(false), None);
    assert_eq!(st.baseline_if_on("a", "off").unwrap(), None);
    assert_eq!(
        tree(&st, "on"),
        [("baseline".into(), None, Origin::Baseline)]
    );
    let t1 = turn(&st, "on", TurnStatus::Ok);
    assert_eq!(t1.checkpoint_id.as_deref(), Some("turn-1"));
    assert_eq!(turn(&st, "on", TurnStatus::Failed).checkpoint_id, None);
    assert_eq!(turn(&st, "on", TurnStatus::Cancelled).checkpoint_id, None);
    let t4 = turn(&st, "on", TurnStatus::Ok);
    assert_eq!(t4.checkpoint_id.as_deref(), Some("turn-4"));
    let l = st.checkpoint_list("a", "on").unwrap();
    let c = l
        .checkpoints
        .iter()
        .find(|c| c.checkpoint_id == "turn-4")
        .unwrap();
    assert_eq!(c.parent.as_deref(), Some("turn-1"));
    assert_eq!(c.label.as_deref(), Some("turn 4"));
    assert_eq!(c.turn_id.as_deref(), Some("turn-4"));
    // The session that turned it off: no baseline, no turn checkpoints.
    assert!(tree(&st, "off").is_empty());
    turn(&st, "off", TurnStatus::Ok);
    assert!(tree(&st, "off").is_empty());
}

#[test]
fn rollback_in_the_middle_branches_the_tree() {
    let Some((_fs, st)) = setup("turns::rollback_in_the_middle_branches") else {
        return;
    };
    policy(&st, None, Some(true), None);
    session(&st, "s");
    turn(&st, "s", TurnStatus::Ok);
    turn(&st, "s", TurnStatus::Ok);
    st.rollback(&SessionRollback {
        agent_id: "a".into(),
        session_id: "s".into(),
        checkpoint_id: "turn-1".into(),
        kill_processes: None,
    })
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(st.layout().current("a", "s").join("n")).unwrap(),
        "1"
    );
    turn(&st, "s", TurnStatus::Ok);
    assert_eq!(
        tree(&st, "s"),
        [
            ("baseline".into(), None, Origin::Baseline),
            ("turn-1".into(), Some("baseline".into()), Origin::Turn),
            ("turn-2".into(), Some("turn-1".into()), Origin::Turn),
            ("turn-3".into(), Some("turn-1".into()), Origin::Turn),
        ]
    );
}

#[test]
fn retention_keeps_the_last_n_and_never_pinned_or_manual() {
    let Some((_fs, st)) = setup("turns::retention") else {
        return;
    };
    policy(&st, None, Some(true), Some(2));
    session(&st, "s");
    turn(&st, "s", TurnStatus::Ok);
    st.checkpoint_pin("a", "s", "turn-1", true).unwrap();
    st.checkpoint_create(&CheckpointCreate {
        agent_id: "a".into(),
        session_id: "s".into(),
        checkpoint_id: "manual".into(),
        pinned: false,
        label: None,
    })
    .unwrap();
    for _ in 0..5 {
        turn(&st, "s", TurnStatus::Ok);
    }
    st.wait_idle();
    let names: Vec<String> = tree(&st, "s").into_iter().map(|c| c.0).collect();
    assert_eq!(names, ["baseline", "turn-1", "manual", "turn-5", "turn-6"]);
    // The DAG stays connected through the collected ones.
    let l = st.checkpoint_list("a", "s").unwrap();
    let t5 = l
        .checkpoints
        .iter()
        .find(|c| c.checkpoint_id == "turn-5")
        .unwrap();
    assert_eq!(t5.parent.as_deref(), Some("manual"));
    for c in ["turn-2", "turn-3", "turn-4"] {
        assert!(
            !st.layout().checkpoint("a", "s", c).exists(),
            "{c} left on disk"
        );
    }
}

#[test]
fn turn_errors() {
    let Some((_fs, st)) = setup("turns::turn_errors") else {
        return;
    };
    session(&st, "s");
    session(&st, "t");
    let b = |s: &str, id: Option<&str>| {
        st.turn_begin(&TurnBegin {
            agent_id: "a".into(),
            session_id: s.into(),
            turn_id: id.map(String::from),
        })
    };
    let e = |s: &str, id: &str| {
        st.turn_end(&TurnEnd {
            agent_id: "a".into(),
            session_id: s.into(),
            turn_id: id.into(),
            status: TurnStatus::Ok,
            label: None,
        })
    };
    b("s", Some("x")).unwrap();
    assert_eq!(
        b("s", None).unwrap_err().code(),
        ErrorCode::Conflict,
        "second open turn"
    );
    assert_eq!(
        e("t", "x").unwrap_err().code(),
        ErrorCode::NotFound,
        "turn of another session"
    );
    assert_eq!(e("s", "nope").unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(
        e("s", "../x").unwrap_err().code(),
        ErrorCode::InvalidRequest
    );
    e("s", "x").unwrap();
    assert_eq!(
        e("s", "x").unwrap_err().code(),
        ErrorCode::Conflict,
        "ended twice"
    );
    assert_eq!(
        b("s", Some("x")).unwrap_err().code(),
        ErrorCode::Conflict,
        "id reused"
    );
}

#[test]
fn a_default_turn_id_taken_by_hand_is_passed_over() {
    let Some((_fs, st)) = setup("turns::a_default_turn_id_taken_by_hand_is_passed_over") else {
        return;
    };
    session(&st, "s");
    let b = |id: Option<&str>| {
        st.turn_begin(&TurnBegin {
            agent_id: "a".into(),
            session_id: "s".into(),
            turn_id: id.map(String::from),
        })
    };
    let e = |id: &str| end_ok(&st, id);
    // Turn 1 named `turn-2` by hand: turn 2's default id is taken.
    let one = b(Some("turn-2")).unwrap();
    assert_eq!(one.number, 1);
    e("turn-2").unwrap();
    let two = b(None).unwrap();
    assert_eq!((two.number, two.turn_id.as_str()), (2, "turn-2-2"));
    e(&two.turn_id).unwrap();
    let three = b(None).unwrap();
    assert_eq!((three.number, three.turn_id.as_str()), (3, "turn-3"));
    e(&three.turn_id).unwrap();
}

/// A session keeps its newest `turns_kept` turn records: as a turn begins
/// past it, the oldest ended ones go (an agent looping `allox turn
/// begin/end` grew the index, and slowed every turn, without bound); the
/// numbers and default ids go on.
#[test]
fn a_session_keeps_its_newest_turns_only() {
    let name = "turns::a_session_keeps_its_newest_turns_only";
    if !require(name) {
        return;
    }
    let fs = BtrfsFs::new(512).expect("make btrfs");
    std::fs::create_dir(fs.path().join("store")).unwrap();
    let st = Store::open_with(
        &fs.path().join("store"),
        Failpoints::default(),
        allox_store::StoreOptions {
            turns_kept: 3,
            ..Default::default()
        },
    )
    .unwrap();
    st.agent_create("a").unwrap();
    session(&st, "s");
    let mut ids = Vec::new();
    for n in 1..=5u64 {
        let t = turn(&st, "s", TurnStatus::Failed);
        assert_eq!((t.number, t.turn_id.clone()), (n, format!("turn-{n}")));
        ids.push(t.turn_id);
    }
    let end = |id: &str| end_ok(&st, id);
    // turn-1 and turn-2 are gone; turn-3 to turn-5 are kept, ended.
    for gone in &ids[..2] {
        let e = end(gone).unwrap_err();
        assert!(
            matches!(e, allox_store::StoreError::NotFound(_)),
            "{gone}: {e:?}"
        );
    }
    for kept in &ids[2..] {
        let e = end(kept).unwrap_err();
        assert!(
            matches!(e, allox_store::StoreError::TurnEnded { .. }),
            "{kept}: {e:?}"
        );
    }
    // An open turn is never among those that go.
    let open = st
        .turn_begin(&TurnBegin {
            agent_id: "a".into(),
            session_id: "s".into(),
            turn_id: None,
        })
        .unwrap();
    assert_eq!(open.number, 6);
    assert_eq!(st.open_turn("a", "s").unwrap().as_deref(), Some("turn-6"));
}

#[test]
fn agent_create_takes_the_policy() {
    if !require("turns::agent_create_takes_the_policy") {
        return;
    }
    let d_fs = BtrfsFs::new(512).expect("make btrfs");
    let root = d_fs.path().join("store");
    std::fs::create_dir(&root).unwrap();
    let d = allox_integration::Daemon::start(
        &root,
        &d_fs.scratch().join("s.sock"),
        &[],
        &["--no-processes"],
    );
    let mut c = d.client();
    let mut a = AgentCreate::new("a");
    a.auto_checkpoint = Some(true);
    c.call(Request::AgentCreate(a)).unwrap().unwrap();
    c.call(Request::SessionCreate(SessionCreate::new("a", "s")))
        .unwrap()
        .unwrap();
    let mut off = SessionCreate::new("a", "quiet");
    off.auto_checkpoint = Some(false);
    c.call(Request::SessionCreate(off)).unwrap().unwrap();
    let list = |s: &str| match c_list(&d, s) {
        Response::Checkpoints(l) => l.checkpoints.len(),
        other => panic!("{other:?}"),
    };
    assert_eq!(list("s"), 1, "baseline from the agent's policy");
    assert_eq!(list("quiet"), 0, "the session turned it off at creation");
    // A policy refused makes nothing: the agent is not made (before, it
    // was, and a retry was refused as already there).
    let mut bad = AgentCreate::new("b");
    bad.auto_checkpoint = Some(true);
    bad.keep_last = Some(0);
    let e = c.call(Request::AgentCreate(bad)).unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
    assert!(e.message.contains("keep_last"), "{e:?}");
    match c.call(Request::AgentList(AgentList {})).unwrap().unwrap() {
        Response::Agents(l) => {
            assert!(l.agents.iter().all(|a| a.agent_id != "b"), "{:?}", l.agents)
        }
        other => panic!("{other:?}"),
    }
    let mut good = AgentCreate::new("b");
    good.keep_last = Some(2);
    c.call(Request::AgentCreate(good)).unwrap().unwrap();
    // `current` names the live tree wherever a checkpoint is asked for:
    // no checkpoint may take it.
    let e = c
        .call(Request::CheckpointCreate(CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "current".into(),
            pinned: false,
            label: None,
        }))
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
    assert!(e.message.contains("reserved"), "{e:?}");
    assert_eq!(list("s"), 1);
}

fn c_list(d: &allox_integration::Daemon, s: &str) -> Response {
    d.client()
        .call(Request::CheckpointList(SessionRef {
            agent_id: "a".into(),
            session_id: s.into(),
        }))
        .unwrap()
        .unwrap()
}

/// A turn begun while its session is deleted (and made again) is refused,
/// and writes nothing: a run the delete killed had its `allox turn begin`
/// answered after the delete, and the next session of the name started
/// with that open turn.
#[test]
fn a_turn_begun_while_its_session_is_deleted_touches_no_session() {
    let name = "turns::a_turn_begun_while_its_session_is_deleted_touches_no_session";
    if !require(name) {
        return;
    }
    let fs = BtrfsFs::new(512).expect("make btrfs");
    std::fs::create_dir(fs.path().join("store")).unwrap();
    let fp = Failpoints::parse("turn_begin.before_lock=delay:400");
    let st = std::sync::Arc::new(
        Store::open_with(&fs.path().join("store"), fp.clone(), Default::default()).unwrap(),
    );
    st.agent_create("a").unwrap();
    session(&st, "s");
    for made_again in [false, true] {
        let begin = {
            let st = st.clone();
            std::thread::spawn(move || {
                st.turn_begin(&TurnBegin {
                    agent_id: "a".into(),
                    session_id: "s".into(),
                    turn_id: None,
                })
            })
        };
        // The begin has found the session, and waits at the failpoint.
        let seen = fp.reached("turn_begin.before_lock");
        let t0 = std::time::Instant::now();
        while fp.reached("turn_begin.before_lock") == seen {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(20),
                "no begin"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        st.session_delete("a", "s").unwrap();
        if made_again {
            session(&st, "s");
        }
        let e = begin.join().unwrap().unwrap_err();
        assert!(
            matches!(e, allox_store::StoreError::NotFound(_)),
            "made again: {made_again}: {e:?}"
        );
        if !made_again {
            session(&st, "s");
        }
        // The session of the name has no turn, and begins its first.
        assert!(st.index().turns("a", "s").unwrap().is_empty());
        let t = turn(&st, "s", TurnStatus::Ok);
        assert_eq!(t.number, 1, "made again: {made_again}");
    }
}
