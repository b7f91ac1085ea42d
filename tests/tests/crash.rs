//! kill -9 at every step: the daemon is started with one failpoint armed,
//! dies by SIGKILL inside an operation, and is restarted. Every session must
//! then be exactly as before the operation or exactly as after it, the index
//! must match the subvolumes on disk, and nothing half-made may remain.

use allox_integration::{require, BtrfsFs, Daemon};
use allox_protocol::*;
use allox_store::btrfs;
use allox_store::failpoint;
use allox_store::layout::Layout;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

fn call(d: &Daemon, r: Request) -> Result<Response, ErrorBody> {
    d.client().call(r).expect("transport")
}

fn ok(d: &Daemon, r: Request) -> Response {
    call(d, r.clone()).unwrap_or_else(|e| panic!("{r:?}: {e}"))
}

fn agent(a: &str) -> AgentRef {
    AgentRef { agent_id: a.into() }
}
fn session(a: &str, s: &str) -> SessionRef {
    SessionRef {
        agent_id: a.into(),
        session_id: s.into(),
    }
}

/// Builds the same starting state in a fresh store (with `whole`, an
/// archive of a/s, imported as b/imported).
fn prepare(root: &Path, sock: &Path, whole: &[u8]) {
    std::fs::create_dir_all(root).unwrap();
    let d = Daemon::start(root, sock, &[], &[]);
    ok(&d, Request::AgentCreate(AgentCreate::new("a")));
    ok(&d, Request::AgentCreate(AgentCreate::new("b")));
    ok(&d, Request::SessionCreate(SessionCreate::new("a", "s")));
    ok(&d, Request::SessionCreate(SessionCreate::new("b", "t")));
    let l = Layout::new(root);
    std::fs::write(l.current("a", "s").join("v"), "1").unwrap();
    std::fs::write(l.current("b", "t").join("v"), "b").unwrap();
    ok(
        &d,
        Request::CheckpointCreate(CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c1".into(),
            pinned: false,
            label: None,
        }),
    );
    std::fs::write(l.current("a", "s").join("v"), "2").unwrap();
    if !whole.is_empty() {
        ok(&d, import("b", "imported", whole));
    }
    d.stop();
}

/// The archive of a/s of a prepared store (`session.export`), whole or
/// `since` a checkpoint.
fn archive_of(d: &Daemon, since: Option<&str>) -> Vec<u8> {
    let mut bytes = Vec::new();
    let r = d
        .client()
        .call_with_events(
            Request::SessionExport(allox_protocol::SessionExport {
                agent_id: "a".into(),
                session_id: "s".into(),
                since: since.map(str::to_string),
            }),
            |e| {
                if let allox_protocol::Event::Archive(c) = e {
                    bytes.extend_from_slice(&c.data.0);
                }
            },
        )
        .expect("transport");
    assert!(matches!(r, Ok(Response::SessionExported(_))), "{r:?}");
    bytes
}

/// The archives the import operations bring: a/s of the source whole, and
/// what the source then added to it (`since` c1).
#[derive(Default)]
struct Archives {
    whole: Vec<u8>,
    since: Vec<u8>,
}

/// A prepared source store's archives; every store of the test holds the
/// whole one as b/imported (see `prepare`).
fn archives(root: &Path, sock: &Path) -> Archives {
    prepare(root, sock, &[]);
    let d = Daemon::start(root, sock, &[], &[]);
    let whole = archive_of(&d, None);
    std::fs::write(Layout::new(root).current("a", "s").join("v"), "3").unwrap();
    ok(
        &d,
        Request::CheckpointCreate(CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c2".into(),
            pinned: false,
            label: None,
        }),
    );
    let since = archive_of(&d, Some("c1"));
    d.stop();
    Archives { whole, since }
}

fn import(agent: &str, session: &str, archive: &[u8]) -> Request {
    Request::SessionImport(allox_protocol::SessionImport {
        agent_id: agent.into(),
        session_id: Some(session.into()),
        import_id: "crash".into(),
        offset: 0,
        data: allox_protocol::Bytes(archive.to_vec()),
        commit: true,
        abort: false,
    })
}

/// The operation that passes through the failpoint's step.
fn operation(fp: &str, archives: &Archives) -> Request {
    match fp.split('.').next().unwrap() {
        "agent_create" => Request::AgentCreate(AgentCreate::new("new")),
        "agent_delete" => Request::AgentDelete(AgentDelete {
            force: true,
            ..AgentDelete::new("b")
        }),
        // With a lifetime: a session is never made without it.
        "session_create" => Request::SessionCreate(SessionCreate {
            max_lifetime_ms: Some(3_600_000),
            ..SessionCreate::new("a", "s2")
        }),
        "session_delete" => Request::SessionDelete(SessionDelete {
            force: true,
            ..SessionDelete::new("a", "s")
        }),
        "checkpoint_create" => Request::CheckpointCreate(CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c2".into(),
            pinned: false,
            label: None,
        }),
        "checkpoint_delete" => Request::CheckpointDelete(CheckpointRef {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c1".into(),
        }),
        "rollback" => Request::SessionRollback(SessionRollback {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c1".into(),
            kill_processes: None,
        }),
        // Into another agent: the source's and the fork's trees both seen.
        "session_fork" => Request::SessionFork(allox_protocol::SessionFork {
            agent_id: "a".into(),
            session_id: "s".into(),
            from: "c1".into(),
            new_agent_id: Some("b".into()),
            new_session_id: "f".into(),
            label: None,
        }),
        // As another agent's session, in one piece.
        "session_import" => import("b", "copy", &archives.whole),
        // What the source added, to the copy every store holds.
        "session_import_since" => import("b", "imported", &archives.since),
        other => panic!("no operation for failpoint family {other}"),
    }
}

/// Everything a person could observe of the store, without timestamps, and
/// a check that the index and the disk agree.
fn model(d: &Daemon) -> Vec<String> {
    let l = Layout::new(&d.root);
    let mut m = Vec::new();
    let Response::Agents(agents) = ok(d, Request::AgentList(AgentList {})) else {
        panic!()
    };
    let mut disk_agents = names(&l.agents_dir());
    for a in &agents.agents {
        assert!(
            btrfs::is_subvolume(&l.workspace(&a.agent_id)),
            "index has agent {} but no workspace",
            a.agent_id
        );
        disk_agents.retain(|x| x != &a.agent_id);
        m.push(format!("agent {}", a.agent_id));
        let Response::Sessions(ss) = ok(d, Request::SessionList(agent(&a.agent_id))) else {
            panic!()
        };
        let mut disk_sessions = names(&l.sessions_dir(&a.agent_id));
        for s in &ss.sessions {
            let (ai, si) = (&a.agent_id, &s.session_id);
            let cur = l.current(ai, si);
            assert!(
                btrfs::is_subvolume(&cur),
                "index has session {ai}/{si} but no current/"
            );
            disk_sessions.retain(|x| x != si);
            let v = std::fs::read_to_string(cur.join("v")).unwrap_or_else(|_| "-".into());
            let extra = names(&l.session_dir(ai, si));
            assert_eq!(
                extra,
                ["checkpoints", "current"],
                "stray entries in {ai}/{si}"
            );
            m.push(format!(
                "session {ai}/{si} head={:?} v={v} lifetime={}",
                s.head,
                s.expires_ms.is_some()
            ));
            let Response::Checkpoints(cs) = ok(d, Request::CheckpointList(session(ai, si))) else {
                panic!()
            };
            let mut disk_cks = names(&l.checkpoints_dir(ai, si));
            for c in &cs.checkpoints {
                let p = l.checkpoint(ai, si, &c.checkpoint_id);
                assert!(
                    btrfs::is_subvolume(&p),
                    "index has checkpoint {} but no snapshot",
                    c.checkpoint_id
                );
                disk_cks.retain(|x| x != &c.checkpoint_id);
                let v = std::fs::read_to_string(p.join("v")).unwrap_or_else(|_| "-".into());
                m.push(format!(
                    "checkpoint {ai}/{si}/{} parent={:?} v={v}",
                    c.checkpoint_id, c.parent
                ));
            }
            assert!(
                disk_cks.is_empty(),
                "checkpoints on disk but not in the index: {disk_cks:?}"
            );
        }
        assert!(
            disk_sessions.is_empty(),
            "sessions on disk but not in the index: {disk_sessions:?}"
        );
    }
    assert!(
        disk_agents.is_empty(),
        "agents on disk but not in the index: {disk_agents:?}"
    );
    m
}

/// Entries of a directory, without the store's in-flight names.
fn names(dir: &Path) -> Vec<String> {
    let mut v = all_names(dir);
    v.retain(|n| !n.starts_with('.'));
    v
}

fn all_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn kill_9_at_every_failpoint_leaves_before_or_after() {
    if !require("crash::kill_9_at_every_failpoint_leaves_before_or_after") {
        return;
    }
    std::fs::create_dir_all("/var/tmp").ok();
    let fs = BtrfsFs::new(1024).expect("make btrfs");
    let archives = archives(&fs.path().join("source"), &fs.scratch().join("source.sock"));
    let mut outcomes = Vec::new();
    for (i, fp) in failpoint::ALL.iter().enumerate() {
        let op = operation(fp, &archives);
        // Twin store: the state after the operation completes normally.
        let twin = fs.path().join(format!("twin{i}"));
        let sock_t = fs.scratch().join(format!("t{i}.sock"));
        prepare(&twin, &sock_t, &archives.whole);
        let d = Daemon::start(&twin, &sock_t, &[], &[]);
        let before = model(&d);
        ok(&d, op.clone());
        let after = model(&d);
        d.stop();
        assert_ne!(before, after, "{fp}: operation changed nothing");

        // The store under test.
        let root = fs.path().join(format!("crash{i}"));
        let sock = fs.scratch().join(format!("c{i}.sock"));
        prepare(&root, &sock, &archives.whole);
        let d = Daemon::start(&root, &sock, &[("ALLOX_FAILPOINTS", fp)], &[]);
        assert_eq!(model(&d), before);
        let r = d.client().call(op.clone());
        assert!(
            r.is_err(),
            "{fp}: the daemon answered instead of dying: {r:?}"
        );
        let st = d.wait_killed();
        assert_eq!(
            st.signal(),
            Some(9),
            "{fp}: daemon did not die by SIGKILL: {st}"
        );

        let d = Daemon::start(&root, &sock, &[], &[]);
        let now = model(&d);
        let which = if now == before {
            "before"
        } else if now == after {
            "after"
        } else {
            panic!("{fp}: state is neither before nor after\nbefore: {before:#?}\nafter: {after:#?}\nnow: {now:#?}");
        };
        // No in-flight names left anywhere.
        let l = Layout::new(&root);
        for dir in [
            l.agents_dir(),
            l.sessions_dir("a"),
            l.session_dir("a", "s"),
            l.checkpoints_dir("a", "s"),
        ] {
            let dots: Vec<String> = all_names(&dir)
                .into_iter()
                .filter(|n| n.starts_with('.'))
                .collect();
            assert!(
                dots.is_empty(),
                "{fp}: leftovers in {}: {dots:?}",
                dir.display()
            );
        }
        // The store is fully usable: repeating the operation ends in `after`.
        if which == "before" {
            ok(&d, op.clone());
            assert_eq!(
                model(&d),
                after,
                "{fp}: retry did not reach the after state"
            );
        }
        let rec = ok(
            &d,
            Request::AuditList(AuditList {
                after_seq: None,
                limit: Some(10_000),
                before_seq: None,
            }),
        );
        let Response::Audit(a) = rec else { panic!() };
        assert_eq!(a.corrupt, 0);
        d.stop();
        outcomes.push(format!("{fp}: {which}"));
    }
    eprintln!("{}", outcomes.join("\n"));
}

/// A power cut can lose a rename that the (already durable) End commit
/// records. Simulate it: kill right after the End commit, undo the rename
/// on disk, restart. Recovery must redo it and reach the after state.
#[test]
fn lost_rename_after_end_commit_is_redone() {
    if !require("crash::lost_rename_after_end_commit_is_redone") {
        return;
    }
    std::fs::create_dir_all("/var/tmp").ok();
    let fs = BtrfsFs::new(1024).expect("make btrfs");
    for (i, fp) in [
        "agent_delete.after_rename",
        "session_delete.after_rename",
        "checkpoint_delete.after_rename",
        "rollback.after_commit",
    ]
    .iter()
    .enumerate()
    {
        let op = operation(fp, &Archives::default());
        let twin = fs.path().join(format!("twin{i}"));
        let sock_t = fs.scratch().join(format!("t{i}.sock"));
        prepare(&twin, &sock_t, &[]);
        let d = Daemon::start(&twin, &sock_t, &[], &[]);
        ok(&d, op.clone());
        let after = model(&d);
        d.stop();

        let root = fs.path().join(format!("lost{i}"));
        let sock = fs.scratch().join(format!("l{i}.sock"));
        prepare(&root, &sock, &[]);
        let armed = format!("{fp}=sync");
        let d = Daemon::start(&root, &sock, &[("ALLOX_FAILPOINTS", &armed)], &[]);
        assert!(d.client().call(op.clone()).is_err());
        d.wait_killed();
        // Undo the rename as if it had never reached the disk.
        let l = Layout::new(&root);
        let (dir, home) = match *fp {
            "agent_delete.after_rename" => (l.agents_dir(), l.agent_dir("b")),
            "session_delete.after_rename" => (l.sessions_dir("a"), l.session_dir("a", "s")),
            "checkpoint_delete.after_rename" => {
                (l.checkpoints_dir("a", "s"), l.checkpoint("a", "s", "c1"))
            }
            _ => (l.session_dir("a", "s"), l.current("a", "s")),
        };
        let moved: Vec<String> = all_names(&dir)
            .into_iter()
            .filter(|n| n.starts_with(".trash-") || n.starts_with(".rollback-"))
            .collect();
        assert_eq!(
            moved.len(),
            1,
            "{fp}: expected one moved tree in {}",
            dir.display()
        );
        let moved = dir.join(&moved[0]);
        if fp.starts_with("rollback") {
            btrfs::exchange(&moved, &home).unwrap();
        } else {
            std::fs::rename(&moved, &home).unwrap();
        }
        let d = Daemon::start(&root, &sock, &[], &[]);
        assert_eq!(model(&d), after, "{fp}: a lost rename was not redone");
        d.stop();
    }
}

/// A rollback is answered once its snapshot is whole; the exchange after it
/// is not synced. If a power cut takes the exchange (and the End commit),
/// recovery must finish the rollback, not undo an answered change.
#[test]
fn a_rollback_whose_exchange_was_lost_is_finished() {
    if !require("crash::a_rollback_whose_exchange_was_lost_is_finished") {
        return;
    }
    std::fs::create_dir_all("/var/tmp").ok();
    let fs = BtrfsFs::new(1024).expect("make btrfs");
    let op = operation("rollback", &Archives::default());
    let twin = fs.path().join("twin");
    let sock_t = fs.scratch().join("t.sock");
    prepare(&twin, &sock_t, &[]);
    let d = Daemon::start(&twin, &sock_t, &[], &[]);
    ok(&d, op.clone());
    let after = model(&d);
    d.stop();

    let root = fs.path().join("lost");
    let sock = fs.scratch().join("l.sock");
    prepare(&root, &sock, &[]);
    let d = Daemon::start(
        &root,
        &sock,
        &[("ALLOX_FAILPOINTS", "rollback.after_exchange")],
        &[],
    );
    assert!(d.client().call(op).is_err());
    d.wait_killed();
    // The exchange never reached the disk: only the whole snapshot did.
    let l = Layout::new(&root);
    let dir = l.session_dir("a", "s");
    let fresh: Vec<String> = all_names(&dir)
        .into_iter()
        .filter(|n| n.starts_with(".rollback-"))
        .collect();
    assert_eq!(fresh.len(), 1, "{fresh:?}");
    btrfs::exchange(&dir.join(&fresh[0]), &l.current("a", "s")).unwrap();
    let d = Daemon::start(&root, &sock, &[], &[]);
    assert_eq!(
        model(&d),
        after,
        "a rollback whose snapshot was whole was undone"
    );
    let Response::StoreCheck(r) = ok(&d, Request::StoreCheck(StoreCheckRequest {})) else {
        panic!("store.check")
    };
    assert!(r.is_consistent(), "{r:?}");
    d.stop();
}

/// `kill -9` of a daemon in the middle of an import's stream: after the
/// restart the store is as before (the staging tree swept), and the same
/// import then goes through.
#[test]
fn an_import_cut_by_kill_9_mid_stream_leaves_nothing() {
    if !require("crash::an_import_cut_by_kill_9_mid_stream_leaves_nothing") {
        return;
    }
    std::fs::create_dir_all("/var/tmp").ok();
    let fs = BtrfsFs::new(512).expect("make btrfs");
    let archives = archives(&fs.path().join("source"), &fs.scratch().join("s.sock"));
    let archive = &archives.whole;
    let (root, sock) = (fs.path().join("cut"), fs.scratch().join("cut.sock"));
    prepare(&root, &sock, &[]);
    let mut d = Daemon::start(&root, &sock, &[], &[]);
    let before = model(&d);
    let Request::SessionImport(mut piece) = operation("session_import", &archives) else {
        unreachable!()
    };
    piece.commit = false;
    piece.data.0.truncate(archive.len() * 2 / 3);
    let Response::SessionImported(got) = ok(&d, Request::SessionImport(piece.clone())) else {
        panic!()
    };
    assert_eq!(got.received, piece.data.0.len() as u64);
    let l = Layout::new(&root);
    assert!(
        all_names(&l.sessions_dir("b"))
            .iter()
            .any(|n| n.starts_with(".import-")),
        "no staging tree while the import is under way"
    );
    d.child.kill().unwrap();
    assert_eq!(d.wait_killed().signal(), Some(9));
    let d = Daemon::start(&root, &sock, &[], &[]);
    assert_eq!(model(&d), before);
    assert_eq!(all_names(&l.sessions_dir("b")), ["t"]);
    let Response::StoreCheck(c) = ok(&d, Request::StoreCheck(StoreCheckRequest {})) else {
        panic!()
    };
    assert!(c.is_consistent(), "{c:?}");
    // The piece again from the start, then the rest: the session appears.
    ok(&d, Request::SessionImport(piece.clone()));
    let rest = allox_protocol::SessionImport {
        offset: piece.data.0.len() as u64,
        data: allox_protocol::Bytes(archive[piece.data.0.len()..].to_vec()),
        commit: true,
        ..piece
    };
    let Response::SessionImported(done) = ok(&d, Request::SessionImport(rest)) else {
        panic!()
    };
    assert_eq!(done.session.map(|s| s.session_id), Some("copy".into()));
    d.stop();
}
