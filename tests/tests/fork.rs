//! `session.fork` on a real Btrfs filesystem: through the store library
//! (the trees, the histories, deletes, forks at once, a live source) and
//! through a daemon (what is copied, what is refused, `alloxctl`).

use allox_integration::{populate, require, BtrfsFs, Daemon};
use allox_protocol::{
    CheckpointCreate, ErrorCode, Origin, Request, Response, SessionCreate, SessionFork,
    SessionRollback, FORK_BASELINE,
};
use allox_store::diff::{compare, DiffMethod, Limits};
use allox_store::failpoint::Failpoints;
use allox_store::Store;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

fn setup(name: &str, mib: u64) -> Option<(BtrfsFs, Store)> {
    if !require(name) {
        return None;
    }
    std::fs::create_dir_all("/var/tmp").ok();
    let fs = BtrfsFs::new(mib).expect("make btrfs");
    std::fs::create_dir(fs.path().join("store")).unwrap();
    let st = Store::open(&fs.path().join("store"), Failpoints::default()).expect("open store");
    Some((fs, st))
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

fn fork(a: &str, s: &str, from: &str, na: Option<&str>, ns: &str) -> SessionFork {
    SessionFork {
        agent_id: a.into(),
        session_id: s.into(),
        from: from.into(),
        new_agent_id: na.map(Into::into),
        new_session_id: ns.into(),
        label: None,
    }
}

/// How many paths differ between two trees.
/// Counted by the full walk, which reads every entry of both trees (not
/// the Btrfs hints a fork itself may rely on).
fn differences(a: &Path, b: &Path) -> u64 {
    let d = compare(a, b, DiffMethod::Walk, &Limits::default(), false).expect("diff");
    d.counts.iter().sum()
}

#[test]
fn a_fork_is_its_source_s_tree_then_a_session_of_its_own() {
    let Some((_fs, st)) = setup(
        "fork::a_fork_is_its_source_s_tree_then_a_session_of_its_own",
        1024,
    ) else {
        return;
    };
    let l = st.layout().clone();
    st.agent_create("a").unwrap();
    st.agent_create("b").unwrap();
    st.session_create("a", "s").unwrap();
    populate(&l.current("a", "s"), 10_000).unwrap();
    st.checkpoint_create(&ck("a", "s", "c1")).unwrap();
    std::fs::write(l.current("a", "s").join("after-c1"), "x").unwrap();

    // From a checkpoint, and from current/ as it is now.
    let (f1, base1) = st
        .session_fork(&SessionFork {
            label: Some("approach one".into()),
            ..fork("a", "s", "c1", None, "f1")
        })
        .unwrap();
    let (f2, _) = st
        .session_fork(&fork("a", "s", "current", None, "f2"))
        .unwrap();
    let c1 = l.checkpoint("a", "s", "c1");
    assert_eq!(differences(&c1, Path::new(&f1.current)), 0);
    assert_eq!(differences(&l.current("a", "s"), Path::new(&f2.current)), 0);
    // Control: the same check between trees that differ by one file.
    assert_eq!(differences(&c1, Path::new(&f2.current)), 1);

    // Each starts its own history at a baseline that names where it came
    // from.
    assert_eq!(f1.head.as_deref(), Some(FORK_BASELINE));
    assert_eq!(base1.origin, Origin::Fork);
    assert_eq!(base1.label.as_deref(), Some("approach one"));
    for (s, from) in [("f1", Some("c1")), ("f2", None)] {
        let list = st.checkpoint_list("a", s).unwrap();
        assert_eq!(list.checkpoints.len(), 1, "{list:?}");
        let b = &list.checkpoints[0];
        assert_eq!(b.checkpoint_id, FORK_BASELINE);
        let p = b.forked_from.as_ref().expect("the fork point");
        assert_eq!(
            (
                p.agent_id.as_str(),
                p.session_id.as_str(),
                p.checkpoint_id.as_deref()
            ),
            ("a", "s", from)
        );
    }
    // The source's history is its own: no fork point there.
    assert!(st
        .checkpoint_list("a", "s")
        .unwrap()
        .checkpoints
        .iter()
        .all(|c| c.forked_from.is_none()));

    // Changes in each are invisible to the other.
    std::fs::write(Path::new(&f1.current).join("only-f1"), "1").unwrap();
    std::fs::write(l.current("a", "s").join("only-s"), "s").unwrap();
    assert!(!l.current("a", "s").join("only-f1").exists());
    assert!(!Path::new(&f1.current).join("only-s").exists());
    assert!(!Path::new(&f2.current).join("only-f1").exists());

    // Rollbacks are independent.
    st.checkpoint_create(&ck("a", "f1", "f1-a")).unwrap();
    std::fs::write(Path::new(&f1.current).join("after-f1-a"), "1").unwrap();
    st.rollback(&SessionRollback {
        agent_id: "a".into(),
        session_id: "f1".into(),
        checkpoint_id: FORK_BASELINE.into(),
        kill_processes: None,
    })
    .unwrap();
    assert!(!l.current("a", "f1").join("only-f1").exists());
    assert!(l.current("a", "s").join("only-s").exists());
    st.rollback(&SessionRollback {
        agent_id: "a".into(),
        session_id: "s".into(),
        checkpoint_id: "c1".into(),
        kill_processes: None,
    })
    .unwrap();
    assert_eq!(differences(&c1, &l.current("a", "f1")), 0);
    assert!(!l.current("a", "s").join("only-s").exists());

    // Another agent's session, when the host asks.
    let (x, _) = st
        .session_fork(&fork("a", "s", "c1", Some("b"), "x"))
        .unwrap();
    assert_eq!(differences(&c1, Path::new(&x.current)), 0);

    // Deleting the source leaves the forks whole, and the reverse.
    let before = allox_integration::tree_digest(&l.current("a", "f1"));
    st.session_delete("a", "s").unwrap();
    assert_eq!(
        allox_integration::tree_digest(&l.current("a", "f1")),
        before
    );
    assert_eq!(st.checkpoint_list("a", "f1").unwrap().checkpoints.len(), 2);
    let (g, _) = st
        .session_fork(&fork("a", "f1", "f1-a", None, "g"))
        .unwrap();
    st.session_delete("a", "f1").unwrap();
    assert!(Path::new(&g.current).join("only-f1").exists());
    st.session_delete("a", "g").unwrap();
    assert_eq!(
        allox_integration::tree_digest(&l.current("a", "f2")).len(),
        allox_integration::tree_digest(&l.current("b", "x")).len() + 1
    );
    let report = st.check().unwrap();
    assert!(report.is_consistent(), "{report:?}");
}

#[test]
fn eight_forks_of_one_checkpoint_at_once() {
    let Some((_fs, st)) = setup("fork::eight_forks_of_one_checkpoint_at_once", 512) else {
        return;
    };
    let l = st.layout().clone();
    st.agent_create("a").unwrap();
    st.session_create("a", "s").unwrap();
    populate(&l.current("a", "s"), 2_000).unwrap();
    st.checkpoint_create(&ck("a", "s", "c")).unwrap();
    let names: Vec<String> = (0..8).map(|i| format!("try{i}")).collect();
    std::thread::scope(|t| {
        let hs: Vec<_> = names
            .iter()
            .map(|n| {
                let st = &st;
                t.spawn(move || st.session_fork(&fork("a", "s", "c", None, n)))
            })
            .collect();
        for h in hs {
            h.join().unwrap().unwrap();
        }
    });
    let c = l.checkpoint("a", "s", "c");
    for n in &names {
        assert_eq!(differences(&c, &l.current("a", n)), 0, "{n}");
        std::fs::write(l.current("a", n).join("mine"), n).unwrap();
    }
    // Each writes its own.
    for n in &names {
        assert_eq!(
            std::fs::read_to_string(l.current("a", n).join("mine")).unwrap(),
            *n
        );
    }
    assert_eq!(st.session_list("a").unwrap().len(), 9);
    assert!(st.check().unwrap().is_consistent());
}

#[test]
fn a_bad_fork_names_what_is_wrong_and_makes_nothing() {
    let Some((_fs, st)) = setup(
        "fork::a_bad_fork_names_what_is_wrong_and_makes_nothing",
        512,
    ) else {
        return;
    };
    st.agent_create("a").unwrap();
    st.session_create("a", "s").unwrap();
    st.session_create("a", "taken").unwrap();
    st.checkpoint_create(&ck("a", "s", "c")).unwrap();
    let cases = [
        (
            fork("a", "s", "c", None, "taken"),
            ErrorCode::Conflict,
            "a/taken",
        ),
        (
            fork("a", "s", "nope", None, "n"),
            ErrorCode::NotFound,
            "nope",
        ),
        (
            fork("a", "nope", "c", None, "n"),
            ErrorCode::NotFound,
            "a/nope",
        ),
        (
            fork("a", "s", "c", Some("ghost"), "n"),
            ErrorCode::NotFound,
            "ghost",
        ),
        (
            fork("a", "s", "c", None, "../x"),
            ErrorCode::InvalidRequest,
            "new_session_id",
        ),
        (
            fork("a", "s", "../c", None, "n"),
            ErrorCode::InvalidRequest,
            "from",
        ),
        (
            SessionFork {
                label: Some("x".repeat(300)),
                ..fork("a", "s", "c", None, "n")
            },
            ErrorCode::InvalidRequest,
            "label",
        ),
    ];
    for (p, code, names) in cases {
        let e = st.session_fork(&p).unwrap_err();
        assert_eq!(e.code(), code, "{p:?}: {e}");
        assert!(e.to_string().contains(names), "{p:?}: {e}");
    }
    let sessions: Vec<String> = st
        .session_list("a")
        .unwrap()
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    assert_eq!(sessions, ["s", "taken"]);
    assert!(!st.layout().session_dir("a", "n").exists());
    assert!(st.check().unwrap().is_consistent());
}

/// A fork of `current/` while a program writes there holds what a power
/// cut at that instant would have left: the files the program made, a
/// prefix of them in order; those it synced before the fork whole; the
/// others whole or empty (their data may not have reached the tree yet).
#[test]
fn a_fork_of_current_while_it_is_written_holds_a_prefix_of_the_writes() {
    let Some((_fs, st)) = setup(
        "fork::a_fork_of_current_while_it_is_written_holds_a_prefix_of_the_writes",
        512,
    ) else {
        return;
    };
    let l = st.layout().clone();
    st.agent_create("a").unwrap();
    st.session_create("a", "s").unwrap();
    let cur = l.current("a", "s");
    let (stop, written) = (AtomicBool::new(false), AtomicUsize::new(0));
    let forked = std::thread::scope(|t| {
        t.spawn(|| {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let p = cur.join(format!("w{i:06}"));
                std::fs::write(&p, format!("{i}\n")).unwrap();
                if i % 50 == 0 {
                    std::fs::File::open(&p).unwrap().sync_all().unwrap();
                }
                i += 1;
                written.store(i, Ordering::Relaxed);
            }
        });
        while written.load(Ordering::Relaxed) < 200 {
            std::thread::yield_now();
        }
        let r = st.session_fork(&fork("a", "s", "current", None, "live"));
        // The writer goes on after the fork before it is stopped.
        let at = written.load(Ordering::Relaxed);
        while written.load(Ordering::Relaxed) < at + 50 {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        r
    })
    .unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&forked.0.current)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // Its baseline holds the same tree as its current/.
    let base = l.checkpoint("a", "live", FORK_BASELINE);
    assert_eq!(differences(&base, Path::new(&forked.0.current)), 0);
    let total = std::fs::read_dir(&cur).unwrap().count();
    assert!(names.len() >= 200, "{} files in the fork", names.len());
    assert!(names.len() < total, "the fork has all {total} files");
    for (i, n) in names.iter().enumerate() {
        assert_eq!(n, &format!("w{i:06}"), "a gap in the fork's files");
    }
    for n in &names {
        let i: usize = n[1..].parse().unwrap();
        let text = std::fs::read_to_string(Path::new(&forked.0.current).join(n)).unwrap();
        let whole = format!("{i}\n");
        if i % 50 == 0 && i < 200 {
            assert_eq!(text, whole, "{n} was synced before the fork");
        } else {
            assert!(text == whole || text.is_empty(), "{n}: {text:?}");
        }
    }
}

fn call(d: &Daemon, r: Request) -> Result<Response, allox_protocol::ErrorBody> {
    d.client().call(r).expect("transport")
}

/// Through a daemon: the source's network mode, egress rules and policy
/// are the fork's; a refusal names what is wrong; `alloxctl session fork`
/// and `alloxctl log` show the fork point.
#[test]
fn the_daemon_forks_with_the_source_s_settings_and_alloxctl_shows_where_from() {
    let name = "fork::the_daemon_forks_with_the_source_s_settings_and_alloxctl_shows_where_from";
    if !require(name) {
        return;
    }
    std::fs::create_dir_all("/var/tmp").ok();
    let fs = BtrfsFs::new(512).expect("make btrfs");
    let root = fs.path().join("store");
    let sock = fs.scratch().join("d.sock");
    std::fs::create_dir(&root).unwrap();
    let d = Daemon::start(&root, &sock, &[], &[]);
    call(
        &d,
        Request::AgentCreate(allox_protocol::AgentCreate::new("a")),
    )
    .unwrap();
    call(
        &d,
        Request::AgentCreate(allox_protocol::AgentCreate::new("b")),
    )
    .unwrap();
    let egress = allox_protocol::Egress {
        allow: Some(vec!["pypi.test".into()]),
        deny: vec!["evil.test".into()],
    };
    call(
        &d,
        Request::SessionCreate(SessionCreate {
            auto_checkpoint: Some(true),
            keep_last: Some(7),
            egress: Some(egress.clone()),
            ..SessionCreate::new("a", "s")
        }),
    )
    .unwrap();
    std::fs::write(
        Layout::new(&root).current("a", "s").join("f"),
        "in the source",
    )
    .unwrap();
    let ctl = |args: &[&str]| {
        std::process::Command::new(allox_integration::workspace_bin("alloxctl"))
            .arg("--socket")
            .arg(&sock)
            .args(args)
            .output()
            .unwrap()
    };
    let out = ctl(&["session", "fork", "a", "s", "b/t", "--label", "second try"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(Layout::new(&root).current("b", "t").join("f")).unwrap(),
        "in the source"
    );
    let log = ctl(&["log", "b", "t"]);
    let text = String::from_utf8_lossy(&log.stdout);
    assert!(
        text.contains("fork")
            && text.contains("(forked from a/s@current)")
            && text.contains("second try"),
        "{text}"
    );
    // Its policy is the source's (agent b has none of its own).
    let Response::Policy(p) = call(
        &d,
        Request::PolicySet(allox_protocol::PolicySet {
            agent_id: "b".into(),
            session_id: Some("t".into()),
            auto_checkpoint: None,
            keep_last: None,
        }),
    )
    .unwrap() else {
        panic!()
    };
    assert_eq!((p.auto_checkpoint, p.keep_last), (true, Some(7)), "{p:?}");
    // Refusals name what is wrong; nothing is made.
    let e = call(
        &d,
        Request::SessionFork(SessionFork {
            from: "missing".into(),
            ..fork("a", "s", "", None, "u")
        }),
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    assert!(
        e.message.contains("checkpoint a/s/missing"),
        "{}",
        e.message
    );
    let e = call(
        &d,
        Request::SessionFork(fork("a", "s", "current", Some("b"), "t")),
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict, "{}", e.message);
    assert!(e.message.contains("b/t"), "{}", e.message);
    let Response::Sessions(ss) = call(
        &d,
        Request::SessionList(allox_protocol::AgentRef {
            agent_id: "a".into(),
        }),
    )
    .unwrap() else {
        panic!()
    };
    assert_eq!(ss.sessions.len(), 1);
    d.stop();
    // Its network (mode and egress rules) is the source's.
    let st = Store::open(&root, Failpoints::default()).unwrap();
    let (src, copy) = (
        st.network_of("a", Some("s")).unwrap(),
        st.network_of("b", Some("t")).unwrap(),
    );
    assert_eq!(copy.egress.as_ref(), Some(&egress));
    assert_eq!(copy, src);
    assert!(st.network_of("b", None).unwrap().egress.is_none());
}

use allox_store::layout::Layout;
