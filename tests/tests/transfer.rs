//! Sessions that move: `session.export` writes a session with its whole
//! checkpoint history as an archive of Btrfs send streams, and
//! `session.import` on another store (another Btrfs filesystem) makes the
//! same session appear in one step — or, for an archive that does not
//! check, nothing at all.

use allox_integration::{require, tree_digest, BtrfsFs};
use allox_protocol::*;
use allox_store::Store;
use std::sync::Arc;

fn store(fs: &BtrfsFs) -> Arc<Store> {
    let root = fs.path().join("store");
    std::fs::create_dir_all(&root).unwrap();
    Arc::new(Store::open(&root, Default::default()).unwrap())
}

fn checkpoint(st: &Store, c: &str, pinned: bool, label: Option<&str>) {
    st.checkpoint_create(&CheckpointCreate {
        agent_id: "a".into(),
        session_id: "s".into(),
        checkpoint_id: c.into(),
        pinned,
        label: label.map(str::to_string),
    })
    .unwrap();
}

/// A session a/s with `files` files, checkpoints c0..c{n}, a branch (a
/// rollback to c1 and two checkpoints on it), a pinned and a labelled one,
/// and a turn that ended with its own checkpoint.
fn history(st: &Store, files: usize, n: usize) {
    st.agent_create("a").unwrap();
    let info = st.session_create("a", "s").unwrap();
    let cur = std::path::PathBuf::from(&info.current);
    allox_integration::populate(&cur, files).unwrap();
    for i in 0..n {
        std::fs::write(cur.join(format!("step{i}")), format!("step {i}\n")).unwrap();
        // A file changed in place, one removed.
        std::fs::write(cur.join("d000/f1"), format!("changed at {i}\n")).unwrap();
        let _ = std::fs::remove_file(cur.join(format!("d000/f{}", i + 2)));
        checkpoint(
            st,
            &format!("c{i}"),
            i == 3,
            (i == 4).then_some("the fifth"),
        );
    }
    st.rollback(&SessionRollback {
        agent_id: "a".into(),
        session_id: "s".into(),
        checkpoint_id: "c1".into(),
        kill_processes: None,
    })
    .unwrap();
    std::fs::write(cur.join("branch"), "on the branch\n").unwrap();
    checkpoint(st, "b0", false, None);
    // The session's own policy travels; its turn ends with a checkpoint.
    st.policy_set(&PolicySet {
        agent_id: "a".into(),
        session_id: Some("s".into()),
        auto_checkpoint: Some(true),
        keep_last: Some(50),
    })
    .unwrap();
    st.turn_begin(&TurnBegin {
        agent_id: "a".into(),
        session_id: "s".into(),
        turn_id: Some("t1".into()),
    })
    .unwrap();
    std::fs::write(cur.join("turn"), "in the turn\n").unwrap();
    st.turn_end(&TurnEnd {
        agent_id: "a".into(),
        session_id: "s".into(),
        turn_id: "t1".into(),
        status: TurnStatus::Ok,
        label: None,
    })
    .unwrap();
    // Not checkpointed: travels as current/.
    std::fs::write(cur.join("uncommitted"), "only in current\n").unwrap();
}

fn export(st: &Store, since: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    st.session_export("a", "s", since, &Default::default(), &mut out)
        .unwrap();
    out
}

fn import(st: &Arc<Store>, bytes: &[u8], step: usize) -> Result<allox_store::Imported, String> {
    let mut i = st.import_begin("a", None).map_err(|e| e.chain())?;
    for piece in bytes.chunks(step) {
        i.push(piece).map_err(|e| e.chain())?;
    }
    i.commit().map_err(|e| e.chain())
}

/// What a session looks like from outside: its listing (without the
/// times' order numbers, which are each store's own), its turns, and
/// every tree.
fn view(st: &Store) -> (CheckpointListing, Vec<String>, Vec<Vec<String>>) {
    let l = st.checkpoint_list("a", "s").unwrap();
    let turns = st
        .index()
        .turns("a", "s")
        .unwrap()
        .iter()
        .map(|t| format!("{t:?}"))
        .collect();
    let layout = st.layout();
    let mut trees = vec![tree_digest(&layout.current("a", "s"))];
    for c in &l.checkpoints {
        trees.push(tree_digest(&layout.checkpoint("a", "s", &c.checkpoint_id)));
    }
    (l, turns, trees)
}

/// Subvolumes and directories of the store's agents (to show nothing was
/// left by a refused import).
fn on_disk(st: &Store) -> Vec<String> {
    let mut out = Vec::new();
    let sessions = st.layout().sessions_dir("a");
    for e in std::fs::read_dir(&sessions).unwrap().flatten() {
        out.push(e.file_name().to_string_lossy().into_owned());
    }
    out.sort();
    out
}

#[test]
fn a_session_with_its_history_moves_to_another_filesystem_whole() {
    if !require("transfer::a_session_moves_whole") {
        return;
    }
    let (fa, fb) = (BtrfsFs::new(512).unwrap(), BtrfsFs::new(512).unwrap());
    let (src, dst) = (store(&fa), store(&fb));
    history(&src, 2000, 8);
    let bytes = export(&src, None);
    dst.agent_create("a").unwrap();
    // Pushed in odd pieces, as a connection delivers them.
    let done = import(&dst, &bytes, 100_003).unwrap();
    assert_eq!(done.checkpoints, 10);
    assert_eq!(done.bytes, bytes.len() as u64);
    let (l1, t1, trees1) = view(&src);
    assert!(
        l1.checkpoints
            .iter()
            .any(|c| c.turn_id.as_deref() == Some("t1")),
        "{l1:?}"
    );
    let policy = |st: &Store| st.effective_policy("a", Some("s")).unwrap();
    assert_eq!(policy(&src), policy(&dst));
    assert_eq!(policy(&dst), (true, Some(50)));
    let (l2, t2, trees2) = view(&dst);
    assert_eq!(l1, l2);
    assert_eq!(t1, t2);
    assert_eq!(trees1.len(), 11);
    assert_eq!(trees1, trees2);
    assert!(trees2[0].iter().any(|l| l.starts_with("f uncommitted ")));
    // The diff between two imported checkpoints is the original's.
    let diff = |st: &Store| {
        let d = st
            .checkpoint_diff(&CheckpointDiff {
                agent_id: "a".into(),
                session_id: "s".into(),
                from: "c0".into(),
                to: "b0".into(),
                patch: true,
            })
            .unwrap();
        format!("{d:?}")
    };
    assert_eq!(diff(&src), diff(&dst));
    // Rollback to any imported checkpoint works there.
    for c in ["c0", "c7", "b0"] {
        dst.rollback(&SessionRollback {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: c.into(),
            kill_processes: None,
        })
        .unwrap();
        assert_eq!(
            tree_digest(&dst.layout().current("a", "s")),
            tree_digest(&src.layout().checkpoint("a", "s", c))
        );
    }
    // Incremental: ten files changed, two checkpoints, then only what came
    // after the last checkpoint both have.
    let common = src.checkpoint_list("a", "s").unwrap().head.unwrap();
    let cur = src.layout().current("a", "s");
    let changed = 10 * 65536;
    for i in 0..10 {
        std::fs::write(
            cur.join(format!("d001/f{}", 1000 + i)),
            vec![b'a' + i as u8; 65536],
        )
        .unwrap();
    }
    checkpoint(&src, "i0", false, None);
    std::fs::write(cur.join("after-i0"), "x\n").unwrap();
    checkpoint(&src, "i1", false, Some("incremental"));
    let inc = export(&src, Some(&common));
    assert!(
        inc.len() < 2 * changed + 64 * 1024,
        "{} bytes for {changed} changed",
        inc.len()
    );
    let added = import(&dst, &inc, 65536).unwrap();
    assert_eq!(added.checkpoints, 2);
    let (l1, t1, trees1) = view(&src);
    let (l2, t2, trees2) = view(&dst);
    assert_eq!((l1, t1), (l2, t2));
    assert_eq!(trees1, trees2);
    // Again: its checkpoints are there now.
    let again = import(&dst, &inc, 65536).unwrap_err();
    assert!(
        again.contains("checkpoint a/s/i0 already exists"),
        "{again}"
    );
    // Into a session that does not exist, or whose checkpoint of the
    // base's name is another tree: refused.
    let mut other = dst.import_begin("a", Some("fresh")).unwrap();
    let e = other.push(&inc).unwrap_err().chain();
    assert!(e.contains("session a/fresh does not exist"), "{e}");
    drop(other);
    dst.session_create("a", "other").unwrap();
    dst.checkpoint_create(&CheckpointCreate {
        agent_id: "a".into(),
        session_id: "other".into(),
        checkpoint_id: common.clone(),
        pinned: false,
        label: None,
    })
    .unwrap();
    let mut other = dst.import_begin("a", Some("other")).unwrap();
    let e = other.push(&inc).unwrap_err().chain();
    assert!(
        e.contains("this session's checkpoint of that name is another tree"),
        "{e}"
    );
    drop(other);
    dst.session_delete("a", "other").unwrap();
    dst.wait_idle();
    // The same archive again: the session exists, nothing is touched.
    let again = import(&dst, &bytes, 1 << 20).unwrap_err();
    assert!(again.contains("session a/s already exists"), "{again}");
    assert_eq!(on_disk(&dst), ["s"]);
    // Under another id, beside it.
    let mut i = dst.import_begin("a", Some("moved")).unwrap();
    i.push(&bytes).unwrap();
    i.commit().unwrap();
    assert_eq!(on_disk(&dst), ["moved", "s"]);
    let mut inside: Vec<_> = std::fs::read_dir(dst.layout().session_dir("a", "moved"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    inside.sort();
    assert_eq!(inside, ["checkpoints", "current"]);
    assert!(dst.check().unwrap().is_consistent());
}

#[test]
fn archives_that_do_not_check_leave_nothing() {
    if !require("transfer::archives_that_do_not_check_leave_nothing") {
        return;
    }
    let (fa, fb) = (BtrfsFs::new(256).unwrap(), BtrfsFs::new(256).unwrap());
    let (src, dst) = (store(&fa), store(&fb));
    history(&src, 200, 3);
    let bytes = export(&src, None);
    dst.agent_create("a").unwrap();
    let refused = |b: &[u8], want: &str| {
        let e = import(&dst, b, 65536).unwrap_err();
        assert!(e.contains(want), "{e}");
        // Why, once (the chain said it twice).
        let parts: Vec<&str> = e.split(": ").collect();
        assert!(
            !parts.windows(2).any(|w| w[0] == w[1])
                && parts
                    .iter()
                    .filter(|p| p.starts_with("the archive ends early"))
                    .count()
                    <= 1,
            "said twice: {e}"
        );
        assert!(on_disk(&dst).is_empty(), "left: {:?}", on_disk(&dst));
        assert!(dst.session_list("a").unwrap().is_empty());
    };
    // Cut short, at several places.
    for cut in [10, bytes.len() / 3, bytes.len() / 2, bytes.len() - 1] {
        refused(&bytes[..cut], "the session archive is refused");
    }
    // A byte flipped inside a send stream (past the manifest).
    let mut flipped = bytes.clone();
    let at = bytes.len() * 2 / 3;
    flipped[at] ^= 0x01;
    refused(&flipped, "the session archive is refused");
    // A huge claimed frame.
    let mut huge = bytes[..12].to_vec();
    huge.extend([1u8]);
    huge.extend(u32::MAX.to_le_bytes());
    refused(&huge, "claims 4294967295 bytes");
    // A manifest naming a path, not an id.
    let mut m = None;
    allox_store::archive::Reader::default()
        .push::<()>(&bytes, &mut |i| {
            if let allox_store::archive::Item::Manifest(x) = i {
                m = Some(*x);
            }
            Ok(())
        })
        .unwrap();
    let mut m = m.unwrap();
    m.checkpoints[0].id = "../../escape".into();
    let w = allox_store::archive::Writer::new(Vec::new(), &m).unwrap();
    let (_, evil) = w.finish().unwrap();
    refused(&evil, "a checkpoint id");
    // A stream relative to another session's checkpoint of the receiving
    // filesystem (its UUID learned somehow): it would copy that session's
    // files into this one.
    victim(&dst);
    let layout = dst.layout();
    let victim = layout.checkpoint("victim", "v", "c0");
    let theirs = std::process::Command::new("btrfs")
        .args(["send", "-q", "-p"])
        .arg(&victim)
        .arg(&victim)
        .output()
        .unwrap();
    assert!(theirs.status.success(), "{theirs:?}");
    let mut m1 = m.clone();
    m1.checkpoints[0].id = "c0".into();
    let mut w = allox_store::archive::Writer::new(Vec::new(), &m1).unwrap();
    w.data(&theirs.stdout).unwrap();
    w.end_stream().unwrap();
    let (_, stolen) = w.finish().unwrap();
    let before = on_disk(&dst);
    let e = import(&dst, &stolen, 65536).unwrap_err();
    assert!(
        e.contains("the send stream of checkpoint c0: it is relative to a subvolume the archive does not bring"),
        "{e}"
    );
    assert_eq!(on_disk(&dst), before);
    // Nothing of it is in the store's check either.
    assert!(dst.check().unwrap().is_consistent());
}

/// The streams of archive `bytes` with every 16 bytes equal to `from` in
/// a UUID attribute (the subvolume's own, a parent's or a clone source's)
/// made `to`, each changed command's checksum made anew: what a hostile
/// sender who learned another tree's UUID would write.
fn with_uuid(bytes: &[u8], from: [u8; 16], to: [u8; 16]) -> Vec<u8> {
    fn sum(cmd: &[u8]) -> u32 {
        let mut c = crc32c::crc32c_append(!0, &cmd[..6]);
        c = crc32c::crc32c_append(c, &[0; 4]);
        !crc32c::crc32c_append(c, &cmd[10..])
    }
    let mut manifest = None;
    let mut streams: Vec<Vec<u8>> = Vec::new();
    allox_store::archive::Reader::default()
        .push::<()>(bytes, &mut |i| {
            match i {
                allox_store::archive::Item::Manifest(m) => manifest = Some(*m),
                allox_store::archive::Item::Data { index, bytes } => {
                    streams.resize(streams.len().max(index + 1), Vec::new());
                    streams[index].extend_from_slice(bytes);
                }
                _ => {}
            }
            Ok(())
        })
        .unwrap();
    let mut w = allox_store::archive::Writer::new(Vec::new(), &manifest.unwrap()).unwrap();
    for mut s in streams {
        let mut at = 17;
        while at < s.len() {
            let len = u32::from_le_bytes(s[at..at + 4].try_into().unwrap()) as usize;
            let end = at + 10 + len;
            let mut a = at + 10;
            let mut changed = false;
            while a < end {
                let t = u16::from_le_bytes([s[a], s[a + 1]]);
                let l = u16::from_le_bytes([s[a + 2], s[a + 3]]) as usize;
                // UUID (1) and clone UUID (20).
                if (t == 1 || t == 20) && s[a + 4..a + 4 + l] == from {
                    s[a + 4..a + 4 + l].copy_from_slice(&to);
                    changed = true;
                }
                a += 4 + l;
            }
            if changed {
                s[at + 6..at + 10].copy_from_slice(&[0; 4]);
                let c = sum(&s[at..end]);
                s[at + 6..at + 10].copy_from_slice(&c.to_le_bytes());
            }
            at = end;
        }
        w.data(&s).unwrap();
        w.end_stream().unwrap();
    }
    w.finish().unwrap().1
}

/// `btrfs receive` finds a stream's parent and clone sources by UUID on
/// the whole filesystem, the received UUID first, and takes the first it
/// finds: the same archive imported twice made the second session's
/// checkpoints snapshots of the first's, and a sender who knew a UUID
/// another session's tree was received with could have its files copied
/// into its own. Each reference is now made to the importing archive's
/// own tree here, by that tree's own UUID, and what receive made is
/// checked to come from it.
#[test]
fn an_archive_s_trees_are_made_from_its_own_trees_never_another_session_s() {
    if !require("transfer::an_archive_s_trees_are_made_from_its_own_trees_never_another_session_s")
    {
        return;
    }
    let fs_a = BtrfsFs::new(256).unwrap();
    let fs_b = BtrfsFs::new(256).unwrap();
    let (src, dst) = (store(&fs_a), store(&fs_b));
    // On the sender: a/s with c0 and c1, and victim/v with a secret.
    src.agent_create("a").unwrap();
    let s = src.session_create("a", "s").unwrap();
    let cur = std::path::PathBuf::from(&s.current);
    std::fs::write(cur.join("mine"), "a's file\n").unwrap();
    checkpoint(&src, "c0", false, None);
    std::fs::write(cur.join("later"), "a's later file\n").unwrap();
    checkpoint(&src, "c1", false, None);
    let ours = export(&src, None);
    victim(&src);
    let mut theirs = Vec::new();
    src.session_export("victim", "v", None, &Default::default(), &mut theirs)
        .unwrap();
    let uuid = |st: &Store, a: &str, s: &str, c: &str| {
        allox_store::btrfs::root_info(&st.layout().checkpoint(a, s, c)).unwrap()
    };
    // On the receiver: the victim's session moved in, and the same
    // archive of a/s imported by two agents.
    dst.agent_create("victim").unwrap();
    let mut i = dst.import_begin("victim", None).unwrap();
    i.push(&theirs).unwrap();
    i.commit().unwrap();
    dst.agent_create("a").unwrap();
    import(&dst, &ours, 65536).unwrap();
    dst.agent_create("b").unwrap();
    let mut i = dst.import_begin("b", None).unwrap();
    i.push(&ours).unwrap();
    i.commit().unwrap();
    for agent in ["a", "b"] {
        let (c0, c1) = (uuid(&dst, agent, "s", "c0"), uuid(&dst, agent, "s", "c1"));
        assert_eq!(
            c1.parent_uuid, c0.uuid,
            "{agent}/s/c1 is not a snapshot of {agent}/s/c0"
        );
        assert_eq!(c1.received_uuid, uuid(&src, "a", "s", "c1").uuid);
    }
    // An archive of a/s whose c0 claims the UUID the victim's c0 was
    // received with: its c1, relative to that c0, is made from the
    // archive's own c0, not from the victim's.
    let stolen = with_uuid(
        &ours,
        uuid(&src, "a", "s", "c0").uuid,
        uuid(&dst, "victim", "v", "c0").received_uuid,
    );
    let mut i = dst.import_begin("b", Some("stolen")).unwrap();
    i.push(&stolen).unwrap();
    i.commit().unwrap();
    let layout = dst.layout();
    for tree in [
        layout.checkpoint("b", "stolen", "c1"),
        layout.current("b", "stolen"),
    ] {
        assert!(
            !tree.join("secret").exists(),
            "{tree:?} holds the victim's file"
        );
        assert!(
            tree.join("mine").exists() && tree.join("later").exists(),
            "{tree:?}"
        );
    }
    assert_eq!(
        uuid(&dst, "b", "stolen", "c1").parent_uuid,
        uuid(&dst, "b", "stolen", "c0").uuid
    );
    assert!(dst.check().unwrap().is_consistent());
}

/// Agent `victim` with session `v`, whose checkpoint `c0` holds a file
/// `secret`: what another agent's archive must never reach.
fn victim(st: &Store) {
    st.agent_create("victim").unwrap();
    let v = st.session_create("victim", "v").unwrap();
    std::fs::write(
        std::path::Path::new(&v.current).join("secret"),
        "not yours\n",
    )
    .unwrap();
    st.checkpoint_create(&CheckpointCreate {
        agent_id: "victim".into(),
        session_id: "v".into(),
        checkpoint_id: "c0".into(),
        pinned: false,
        label: None,
    })
    .unwrap();
}

/// Runs `alloxctl` against `d`; its stdout, after checking it succeeded.
fn ctl(d: &allox_integration::ProcDaemon, args: &[&str]) -> String {
    let (code, out, err) = allox_integration::alloxctl(&d.daemon.socket, args);
    assert_eq!(code, 0, "alloxctl {args:?}: {err}");
    String::from_utf8(out).unwrap()
}

fn request(d: &allox_integration::ProcDaemon, r: Request) -> Response {
    allox_integration::call(d, r).unwrap_or_else(|e| panic!("{e:?}"))
}

/// The session: 10,000 files, 20 checkpoints with a branch, a pin,
/// a label and a turn, and a change not checkpointed.
fn daemon_history(d: &allox_integration::ProcDaemon) -> std::path::PathBuf {
    allox_integration::make_sessions(d, &[("a", "s")]);
    let cur = d.daemon.root.join("agents/a/workspace/sessions/s/current");
    allox_integration::populate(&cur, 10_000).unwrap();
    let cp = |c: &str, pinned: bool, label: Option<&str>| {
        request(
            d,
            Request::CheckpointCreate(CheckpointCreate {
                agent_id: "a".into(),
                session_id: "s".into(),
                checkpoint_id: c.into(),
                pinned,
                label: label.map(str::to_string),
            }),
        );
    };
    for i in 0..16 {
        std::fs::write(
            cur.join(format!("d001/f{}", 1000 + i)),
            format!("edit {i}\n"),
        )
        .unwrap();
        std::fs::write(cur.join(format!("new{i}")), vec![b'x'; 4096 * i]).unwrap();
        cp(&format!("c{i}"), i == 3, (i == 4).then_some("the fifth"));
    }
    request(
        d,
        Request::SessionRollback(SessionRollback {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c5".into(),
            kill_processes: None,
        }),
    );
    for i in 0..3 {
        std::fs::write(cur.join(format!("branch{i}")), "on the branch\n").unwrap();
        cp(&format!("b{i}"), false, None);
    }
    ctl(d, &["policy", "a", "s", "--auto-checkpoint", "on"]);
    ctl(d, &["turn", "begin", "a", "s", "--turn-id", "t1"]);
    std::fs::write(cur.join("turn"), "in the turn\n").unwrap();
    ctl(d, &["turn", "end", "a", "s", "t1"]);
    std::fs::write(cur.join("uncommitted"), "only in current\n").unwrap();
    cur
}

#[test]
fn alloxctl_moves_a_session_between_daemons_by_file_and_by_pipe() {
    if !require("transfer::alloxctl_moves_a_session_between_daemons") {
        return;
    }
    let a = allox_integration::ProcDaemon::start("move-a", &[]);
    let b = allox_integration::ProcDaemon::start("move-b", &[]);
    daemon_history(&a);
    let file = a.fs.scratch().join("s.allox");
    let f = file.to_str().unwrap();
    // The summary goes to standard error; the archive is the file's.
    ctl(&a, &["session", "export", "a", "s", "-o", f]);
    ctl(&b, &["agent", "create", "a"]);
    let said = ctl(&b, &["session", "import", "a", "-i", f]);
    assert!(said.starts_with("imported a/s: 20 checkpoints, "), "{said}");
    // Everything a user reads of it is the same there.
    for args in [
        &["log", "a", "s"][..],
        &["--json", "checkpoint", "list", "a", "s"],
        &["diff", "a", "s", "c0", "b2"],
        &["diff", "a", "s", "c15", "current"],
        &["--json", "session", "info", "a", "s"],
    ] {
        let (x, y) = (ctl(&a, args), ctl(&b, args));
        // The session's own path differs, and nothing else may.
        let norm = |t: String, d: &allox_integration::ProcDaemon| {
            t.replace(d.daemon.root.to_str().unwrap(), "ROOT")
        };
        assert_eq!(norm(x, &a), norm(y, &b), "alloxctl {args:?}");
    }
    let l = ctl(&b, &["--json", "checkpoint", "list", "a", "s"]);
    let l: serde_json::Value = serde_json::from_str(&l).unwrap();
    let ids: Vec<String> = l["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["checkpoint_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 20);
    let tree = |d: &allox_integration::ProcDaemon, c: &str| {
        let s = d.daemon.root.join("agents/a/workspace/sessions/s");
        tree_digest(&if c == "current" {
            s.join("current")
        } else {
            s.join("checkpoints").join(c)
        })
    };
    for c in ids.iter().map(String::as_str).chain(["current"]) {
        assert_eq!(tree(&a, c), tree(&b, c), "{c}");
    }
    // A run there sees the files, and a rollback works.
    let out = ctl(
        &b,
        &["exec", "a", "s", "--", "cat", "uncommitted", "d001/f1003"],
    );
    assert_eq!(out, "only in current\nedit 3\n");
    ctl(&b, &["rollback", "a", "s", "c0"]);
    assert_eq!(tree(&b, "current"), tree(&a, "c0"));
    // The same archive again: refused, nothing touched.
    let (code, _, err) =
        allox_integration::alloxctl(&b.daemon.socket, &["session", "import", "a", "-i", f]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("session a/s already exists"), "{err}");
    // Straight from one daemon to the other, under another id; the agent
    // is made there.
    let said = ctl(
        &a,
        &[
            "session",
            "move",
            "a",
            "s",
            "--to",
            b.daemon.socket.to_str().unwrap(),
            "--as",
            "s2",
        ],
    );
    assert!(said.starts_with("imported a/s2: 20 checkpoints"), "{said}");
    let s2 = b.daemon.root.join("agents/a/workspace/sessions/s2/current");
    assert_eq!(tree_digest(&s2), tree(&a, "current"));
    // Then only what came after: ten files changed, one checkpoint.
    let head = l["head"].as_str().unwrap().to_string();
    let cur = a.daemon.root.join("agents/a/workspace/sessions/s/current");
    for i in 0..10 {
        std::fs::write(
            cur.join(format!("d002/f{}", 2000 + i)),
            format!("later {i}\n"),
        )
        .unwrap();
    }
    ctl(&a, &["checkpoint", "create", "a", "s", "later"]);
    let sock_b = b.daemon.socket.to_str().unwrap();
    let said = ctl(
        &a,
        &[
            "session", "move", "a", "s", "--to", sock_b, "--as", "s2", "--since", &head,
        ],
    );
    assert!(said.starts_with("imported a/s2: 1 checkpoint, "), "{said}");
    assert_eq!(tree_digest(&s2), tree(&a, "current"));
    assert_eq!(
        ctl(&b, &["diff", "a", "s2", &head, "later"]),
        ctl(&a, &["diff", "a", "s", &head, "later"])
    );
    // The agent makes a directory setgid and a file setuid and setgid in
    // its session: the session still moves, without those bits (no file
    // of a session keeps one), and alloxctl says so.
    ctl(
        &a,
        &[
            "exec",
            "a",
            "s",
            "--",
            "/bin/sh",
            "-c",
            "mkdir sg && chmod g+s sg && echo x > tool && chmod 6755 tool",
        ],
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(
        (mode(&cur.join("sg")) & 0o2000, mode(&cur.join("tool"))),
        (0o2000, 0o6755),
        "the agent's chmod"
    );
    // What only a privileged process sets, planted on the exporting side
    // (root there: a guest's): a file capability (CAP_SETUID, effective)
    // and a trusted attribute; an agent's own attribute is kept.
    let caps: Vec<u8> = [0x0200_0001u32, 1 << 7, 0, 0, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    for (name, value) in [
        ("security.capability", &caps[..]),
        ("trusted.planted", b"y"),
        ("user.note", b"kept"),
    ] {
        rustix::fs::setxattr(
            cur.join("tool"),
            name,
            value,
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap_or_else(|e| panic!("setxattr {name}: {e}"));
    }
    ctl(&a, &["checkpoint", "create", "a", "s", "setid"]);
    let said = ctl(
        &a,
        &[
            "session", "move", "a", "s", "--to", sock_b, "--as", "s2", "--since", "later",
        ],
    );
    assert!(
        said.starts_with("imported a/s2: 1 checkpoint, ") && said.contains("4 privileges dropped"),
        "{said}"
    );
    assert_eq!(
        (mode(&s2.join("sg")), mode(&s2.join("tool"))),
        (mode(&cur.join("sg")) & !0o6000, 0o755)
    );
    assert_eq!(std::fs::read_to_string(s2.join("tool")).unwrap(), "x\n");
    let xattr = |name: &str| {
        let mut buf = [0u8; 64];
        rustix::fs::getxattr(s2.join("tool"), name, &mut buf).map(|n| buf[..n].to_vec())
    };
    assert_eq!(xattr("security.capability"), Err(rustix::io::Errno::NODATA));
    assert_eq!(xattr("trusted.planted"), Err(rustix::io::Errno::NODATA));
    assert_eq!(xattr("user.note"), Ok(b"kept".to_vec()));
    // Standard input and output too.
    let (code, archive, err) =
        allox_integration::alloxctl(&a.daemon.socket, &["session", "export", "a", "s"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(&archive[..8], b"ALLOXSES");
    assert_eq!(
        archive[8..12],
        allox_store::archive::VERSION.to_le_bytes(),
        "the version"
    );
    let mut imp = std::process::Command::new(allox_integration::workspace_bin("alloxctl"))
        .args([
            "--socket",
            b.daemon.socket.to_str().unwrap(),
            "session",
            "import",
            "a",
            "s3",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    imp.stdin.take().unwrap().write_all(&archive).unwrap();
    let out = imp.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(ctl(&b, &["check"]).contains("consistent"), "store check");
}

/// The daemon's staging trees of imports under way.
fn staging(d: &allox_integration::ProcDaemon) -> Vec<String> {
    let dir = d.daemon.root.join("agents/a/workspace/sessions");
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".import"))
        .collect()
}

/// Waits until an import has begun in `d` (its staging tree is there).
fn wait_for_an_import(d: &allox_integration::ProcDaemon, what: &str) {
    let t0 = std::time::Instant::now();
    while staging(d).is_empty() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "{what}: no import began"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Waits (at most `secs`) until no import is under way in `d`.
fn no_import_left(d: &allox_integration::ProcDaemon, secs: u64, what: &str) {
    let t0 = std::time::Instant::now();
    while !staging(d).is_empty() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(secs),
            "{what}'s staging is left: {:?}",
            staging(d)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `alloxctl session import a SESSION` into `d`, sent the first half of
/// `archive`, its input left open: an import under way.
fn half_an_import(
    d: &allox_integration::ProcDaemon,
    archive: &[u8],
    session: &str,
) -> (std::process::Child, std::process::ChildStdin) {
    use std::io::Write;
    let mut import = std::process::Command::new(allox_integration::workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(&d.daemon.socket)
        .args(["session", "import", "a", session])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = import.stdin.take().unwrap();
    input.write_all(&archive[..archive.len() / 2]).unwrap();
    input.flush().unwrap();
    (import, input)
}

/// Ctrl-C to `pid` (an `alloxctl` importing into `d`) once its import has
/// begun there.
fn interrupt_once_importing(d: &allox_integration::ProcDaemon, pid: u32, what: &str) {
    wait_for_an_import(d, what);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::INT,
    )
    .unwrap();
}

/// `alloxctl session import` interrupted (Ctrl-C) drops its import on the
/// daemon and exits 130: nothing of it is left to hold one of the
/// daemon's few import slots for five idle minutes (four interrupted
/// imports refused every import on the daemon meanwhile).
#[test]
fn an_interrupted_import_is_dropped_on_the_daemon() {
    if !require("transfer::an_interrupted_import_is_dropped_on_the_daemon") {
        return;
    }
    let a = allox_integration::ProcDaemon::start("interrupted-a", &[]);
    let b = allox_integration::ProcDaemon::start("interrupted-b", &[]);
    daemon_history(&a);
    let file = a.fs.scratch().join("s.allox");
    ctl(
        &a,
        &["session", "export", "a", "s", "-o", file.to_str().unwrap()],
    );
    let archive = std::fs::read(&file).unwrap();
    ctl(&b, &["agent", "create", "a"]);
    // Half the archive, the pipe left open: the import is under way.
    let (mut import, input) = half_an_import(&b, &archive, "s2");
    interrupt_once_importing(&b, import.id(), "the import");
    let status = import.wait().unwrap();
    drop(input);
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut import.stderr.take().unwrap(), &mut err);
    assert_eq!(status.code(), Some(130), "{status:?}: {err}");
    assert!(
        err.contains("the import was dropped on the daemon"),
        "{err}"
    );
    no_import_left(&b, 20, "the interrupted import");
    // Killed outright, it cannot drop its import: the daemon drops it
    // once its client has gone and no piece came for 10 s (it held one
    // of the few import slots for five idle minutes).
    let (mut import, input) = half_an_import(&b, &archive, "s3");
    wait_for_an_import(&b, "the import to be killed");
    import.kill().unwrap();
    import.wait().unwrap();
    drop(input);
    no_import_left(&b, 40, "the killed import");
    // Nothing was made, and the archive imports whole afterwards.
    let said = ctl(
        &b,
        &["session", "import", "a", "-i", file.to_str().unwrap()],
    );
    assert!(said.starts_with("imported a/s: "), "{said}");
    // A move interrupted while its pieces flow: 130 every time (it was 1,
    // "no import … is under way", when a piece was refused after the
    // drop), and the agent it made on the target is gone (it was left).
    ctl(&b, &["agent", "delete", "a", "--force"]);
    for round in 0..3 {
        let mv = std::process::Command::new(allox_integration::workspace_bin("alloxctl"))
            .arg("--socket")
            .arg(&a.daemon.socket)
            .args(["session", "move", "a", "s", "--to"])
            .arg(&b.daemon.socket)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        interrupt_once_importing(&b, mv.id(), &format!("round {round}'s move"));
        let out = mv.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "round {round}: {err}");
        assert!(
            err.contains("the import was dropped on the daemon"),
            "round {round}: {err}"
        );
        let agents = ctl(&b, &["agent", "list"]);
        assert!(
            !agents
                .lines()
                .any(|l| l.split_whitespace().next() == Some("a")),
            "round {round}: the interrupted move left its agent on the target: {agents}"
        );
    }
}

/// `-o FILE` (and a copy out of a session) writes the file named, as a
/// user means it: a device node is written to, not replaced (an export to
/// `/dev/null` as root made the host's `/dev/null` a regular file); a
/// file beside it is never touched (`x.allox` was written as `x.partial`,
/// overwriting and then removing a file of that name, even when the
/// export failed); a symbolic link is written through.
#[test]
fn alloxctl_writes_the_file_named_and_nothing_else() {
    if !require("transfer::alloxctl_writes_the_file_named_and_nothing_else") {
        return;
    }
    let d = allox_integration::ProcDaemon::start("written-as-named", &[]);
    ctl(&d, &["agent", "create", "a"]);
    ctl(&d, &["session", "create", "a", "s"]);
    std::fs::write(
        d.daemon
            .root
            .join("agents/a/workspace/sessions/s/current/f"),
        "data\n",
    )
    .unwrap();
    let dir = tempfile::tempdir_in(d.fs.scratch()).unwrap();
    let p = |n: &str| dir.path().join(n);
    let s = |n: &str| p(n).to_str().unwrap().to_string();
    let is_null = |n: &str| {
        use std::os::unix::fs::FileTypeExt;
        std::fs::symlink_metadata(p(n)).is_ok_and(|m| m.file_type().is_char_device())
    };
    for n in ["null", "null2"] {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            p(n),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o666),
            rustix::fs::makedev(1, 3),
        )
        .unwrap();
    }
    std::fs::write(p("x.partial"), "mine\n").unwrap();
    std::fs::write(p("y.partial"), "mine too\n").unwrap();
    std::fs::write(p("real"), "").unwrap();
    std::os::unix::fs::symlink(p("real"), p("link")).unwrap();
    ctl(&d, &["session", "export", "a", "s", "-o", &s("null")]);
    ctl(&d, &["session", "export", "a", "s", "-o", &s("x.allox")]);
    ctl(&d, &["session", "export", "a", "s", "-o", &s("link")]);
    ctl(&d, &["cp", "a/s:f", &s("null2")]);
    let (code, _, err) = allox_integration::alloxctl(
        &d.daemon.socket,
        &["session", "export", "a", "nosuch", "-o", &s("y.txt")],
    );
    assert!(code != 0 && err.contains("nosuch"), "{err}");
    assert!(
        is_null("null") && is_null("null2"),
        "a device node was replaced"
    );
    assert_eq!(std::fs::read_to_string(p("x.partial")).unwrap(), "mine\n");
    assert_eq!(
        std::fs::read_to_string(p("y.partial")).unwrap(),
        "mine too\n"
    );
    assert!(std::fs::metadata(p("x.allox")).unwrap().len() > 0);
    assert!(std::fs::symlink_metadata(p("link"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(
        std::fs::metadata(p("real")).unwrap().len() > 0,
        "the link's file was not written"
    );
    // Nothing else is left in the directory: no aside file of the failed
    // export or of the others.
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "link",
            "null",
            "null2",
            "real",
            "x.allox",
            "x.partial",
            "y.partial"
        ]
    );
}

/// An archive that adds to a session (`move --since`, an import that does
/// not name the session) is a change of it: refused while it is expired,
/// as any change is (the session the request names was the agent only, so
/// the expiry was never looked at, and checkpoints and a new current/
/// went in); and into a session with live processes it says what to do
/// (it named a flag neither command has).
#[test]
fn an_archive_that_adds_to_an_expired_or_busy_session_is_refused_saying_why() {
    if !require(
        "transfer::an_archive_that_adds_to_an_expired_or_busy_session_is_refused_saying_why",
    ) {
        return;
    }
    let a = allox_integration::ProcDaemon::start("adds-a", &[]);
    let b = allox_integration::ProcDaemon::start("adds-b", &[]);
    let sock_b = b.daemon.socket.to_str().unwrap().to_string();
    for d in [&a, &b] {
        ctl(d, &["agent", "create", "a"]);
    }
    ctl(&a, &["session", "create", "a", "s"]);
    ctl(&a, &["exec", "a", "s", "--", "sh", "-c", "echo 1 > f"]);
    ctl(&a, &["checkpoint", "create", "a", "s", "c1"]);
    ctl(&a, &["session", "move", "a", "s", "--to", &sock_b]);
    ctl(&a, &["exec", "a", "s", "--", "sh", "-c", "echo 2 > f"]);
    ctl(&a, &["checkpoint", "create", "a", "s", "c2"]);
    // Expired on b.
    ctl(&b, &["limit", "a", "s", "--max-lifetime-ms", "1"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !ctl(&b, &["session", "info", "a", "s"]).contains("expired at") {
        assert!(
            std::time::Instant::now() < deadline,
            "the session did not expire"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let log_before = ctl(&b, &["log", "a", "s"]);
    let (code, _, err) = allox_integration::alloxctl(
        &a.daemon.socket,
        &[
            "session", "move", "a", "s", "--to", &sock_b, "--since", "c1",
        ],
    );
    assert!(code != 0 && err.contains("a/s expired"), "{code} {err}");
    assert_eq!(ctl(&b, &["log", "a", "s"]), log_before);
    let f = b
        .daemon
        .root
        .join("agents/a/workspace/sessions/s/current/f");
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "1\n");
    // More time, and a run going on there: refused, saying what to do.
    ctl(&b, &["limit", "a", "s", "--max-lifetime-ms", "0"]);
    ctl(&b, &["start", "a", "s", "--", "sleep", "600"]);
    let (code, _, err) = allox_integration::alloxctl(
        &a.daemon.socket,
        &[
            "session", "move", "a", "s", "--to", &sock_b, "--since", "c1",
        ],
    );
    assert!(
        code != 0 && err.contains("alloxctl kill a s") && !err.contains("--kill-processes"),
        "{code} {err}"
    );
    // Stopped: it goes in.
    ctl(&b, &["kill", "a", "s"]);
    ctl(
        &a,
        &[
            "session", "move", "a", "s", "--to", &sock_b, "--since", "c1",
        ],
    );
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "2\n");
    // A turn begun there since: the sender's turns would be put over it
    // (two open turns, two of one number, an ended one re-opened).
    ctl(&b, &["turn", "begin", "a", "s"]);
    ctl(&a, &["turn", "begin", "a", "s", "--turn-id", "x"]);
    ctl(&a, &["checkpoint", "create", "a", "s", "c3"]);
    let log_before = ctl(&b, &["log", "a", "s"]);
    let (code, _, err) = allox_integration::alloxctl(
        &a.daemon.socket,
        &[
            "session", "move", "a", "s", "--to", &sock_b, "--since", "c2",
        ],
    );
    assert!(
        code != 0 && err.contains("conflict") && err.contains("was made here"),
        "{code} {err}"
    );
    assert_eq!(ctl(&b, &["log", "a", "s"]), log_before);
    // Its turn ended there, it stays as it ended; the other way it goes.
    let (code, _, err) =
        allox_integration::alloxctl(&b.daemon.socket, &["turn", "begin", "a", "s"]);
    assert!(code != 0 && err.contains("has not ended"), "{err}");
}

/// A writer that, once `after` bytes went through it, says so and waits to
/// be let go (an export's slow reader).
struct Held {
    seen: usize,
    after: usize,
    started: Option<std::sync::mpsc::Sender<()>>,
    go: std::sync::mpsc::Receiver<()>,
}

impl std::io::Write for Held {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.seen += b.len();
        if self.seen > self.after {
            if let Some(tx) = self.started.take() {
                let _ = tx.send(());
                let _ = self.go.recv();
            }
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An export of a/s by a reader held 4 MiB into it (the export waits
/// there, mid-stream): the way to let it go on, and its end.
#[allow(clippy::type_complexity)]
fn held_export(
    st: &Arc<Store>,
) -> (
    std::sync::mpsc::Sender<()>,
    std::thread::JoinHandle<Result<(), (ErrorCode, String)>>,
) {
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    let exporting = {
        let st = st.clone();
        std::thread::spawn(move || {
            let mut w = Held {
                seen: 0,
                after: 4 << 20,
                started: Some(started_tx),
                go: go_rx,
            };
            st.session_export("a", "s", None, &Default::default(), &mut w)
                .map(drop)
                .map_err(|e| (e.code(), e.chain()))
        })
    };
    started
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the export did not begin");
    (go, exporting)
}

/// An export and an import going on are not out of place for the store's
/// check (it called them leftovers, exit 1); a checkpoint deleted while an
/// export sends it ends the export saying so (`conflict`, not `internal`
/// with a `btrfs` path), and its tree, which the kernel will not delete
/// while it is sent, is removed once it can be (it stayed until the
/// daemon's next start).
#[test]
fn transfers_going_on_are_not_out_of_place_and_a_tree_deleted_under_an_export_goes_after_it() {
    if !require("transfer::transfers_going_on_are_not_out_of_place") {
        return;
    }
    let fs = BtrfsFs::new(512).unwrap();
    let st = store(&fs);
    st.agent_create("a").unwrap();
    let info = st.session_create("a", "s").unwrap();
    let cur = std::path::PathBuf::from(&info.current);
    let mut noise = vec![0u8; 32 << 20];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in noise.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(cur.join("big"), &noise).unwrap();
    checkpoint(&st, "c1", false, None);
    std::fs::write(cur.join("more"), "x\n").unwrap();
    checkpoint(&st, "c2", false, None);
    // An export held by its reader in the middle of c1's stream.
    let (go, exporting) = held_export(&st);
    let r = st.check().unwrap();
    assert!(
        r.is_consistent() && r.in_progress.iter().any(|p| p.contains(".export-")),
        "{r:?}"
    );
    // Its first checkpoint deleted meanwhile.
    st.checkpoint_delete("a", "s", "c1").unwrap();
    go.send(()).unwrap();
    let (code, why) = exporting.join().unwrap().unwrap_err();
    assert!(
        code == ErrorCode::Conflict && why.contains("was deleted"),
        "{code:?} {why}"
    );
    // Its tree goes once the export let go of it: the check is whole.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let r = st.check().unwrap();
        if r.is_consistent() && r.in_progress.is_empty() && r.removing == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{r:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let left: Vec<String> = std::fs::read_dir(st.layout().checkpoints_dir("a", "s"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["c2"]);
    // A checkpoint not sent yet, deleted and made again under its name
    // while the export runs: not sent as the one the manifest records
    // (the new tree went out under the old record, export answered ok).
    std::fs::write(cur.join("later"), "y\n").unwrap();
    checkpoint(&st, "c3", false, Some("the first c3"));
    let (go, exporting) = held_export(&st);
    st.checkpoint_delete("a", "s", "c3").unwrap();
    std::fs::write(cur.join("injected"), "z\n").unwrap();
    checkpoint(&st, "c3", false, Some("another c3"));
    go.send(()).unwrap();
    let (code, why) = exporting.join().unwrap().unwrap_err();
    assert!(
        code == ErrorCode::Conflict && why.contains("made again under its name"),
        "{code:?} {why}"
    );
    // An import going on: in progress, not out of place; dropped, gone.
    let mut whole = Vec::new();
    st.session_export("a", "s", None, &Default::default(), &mut whole)
        .unwrap();
    st.agent_create("b").unwrap();
    let mut i = st.import_begin("b", None).unwrap();
    i.push(&whole[..whole.len() / 2]).unwrap();
    let r = st.check().unwrap();
    assert!(
        r.is_consistent() && r.in_progress.iter().any(|p| p.contains(".import-")),
        "{r:?}"
    );
    drop(i);
    let r = st.check().unwrap();
    assert!(r.is_consistent() && r.in_progress.is_empty(), "{r:?}");
    // Its agent deleted while it goes on: said so, not blamed on the
    // archive (it was "the session archive is refused: btrfs receive …").
    let mut i = st.import_begin("b", None).unwrap();
    i.push(&whole[..whole.len() / 2]).unwrap();
    st.agent_delete_guarded("b", true).unwrap();
    let e = match i.push(&whole[whole.len() / 2..]) {
        Err(e) => e,
        Ok(()) => i.commit().map(drop).unwrap_err(),
    };
    assert!(
        e.code() == ErrorCode::Conflict
            && e.chain().contains("agent b was deleted during the import"),
        "{:?} {}",
        e.code(),
        e.chain()
    );
    // The same when it goes while a stream received is checked (the read
    // of the import's scratch directory failed `internal`).
    let fs2 = BtrfsFs::new(512).unwrap();
    let root = fs2.path().join("store");
    std::fs::create_dir_all(&root).unwrap();
    let fp = allox_store::failpoint::Failpoints::parse("session_import.before_check=delay:300");
    let st2 = Arc::new(Store::open_with(&root, fp.clone(), Default::default()).unwrap());
    st2.agent_create("b").unwrap();
    let mut i = st2.import_begin("b", None).unwrap();
    let pushing = std::thread::spawn(move || match i.push(&whole) {
        Err(e) => e,
        Ok(()) => i.commit().map(drop).unwrap_err(),
    });
    let t0 = std::time::Instant::now();
    while fp.reached("session_import.before_check") == 0 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "no stream received"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    st2.agent_delete_guarded("b", true).unwrap();
    let e = pushing.join().unwrap();
    assert!(
        e.code() == ErrorCode::Conflict
            && e.chain().contains("agent b was deleted during the import"),
        "deleted while a stream is checked: {:?} {}",
        e.code(),
        e.chain()
    );
    // The whole session deleted while it is exported: said as such (it
    // named a checkpoint and said to export again, which cannot work).
    let (go, exporting) = held_export(&st);
    st.session_delete("a", "s").unwrap();
    go.send(()).unwrap();
    let (code, why) = exporting.join().unwrap().unwrap_err();
    assert!(
        code == ErrorCode::Conflict && why.contains("the session was deleted"),
        "{code:?} {why}"
    );
}

/// A session moved with a turn open, the turn ended where it went, moves
/// back: the receiver's open turn is the sender's history going on, not
/// a turn of its own (it was refused as one that "went on here").
#[test]
fn a_turn_moved_open_and_ended_on_the_other_side_moves_back() {
    if !require("transfer::a_turn_moved_open_and_ended_on_the_other_side_moves_back") {
        return;
    }
    let a = allox_integration::ProcDaemon::start("turn-back-a", &[]);
    let b = allox_integration::ProcDaemon::start("turn-back-b", &[]);
    let (sock_a, sock_b) = (
        a.daemon.socket.to_str().unwrap().to_string(),
        b.daemon.socket.to_str().unwrap().to_string(),
    );
    for d in [&a, &b] {
        ctl(d, &["agent", "create", "a"]);
    }
    // A move that fails leaves nothing on the target (it left the agent
    // it had made there).
    ctl(&a, &["agent", "create", "lonely"]);
    let (code, _, err) = allox_integration::alloxctl(
        &a.daemon.socket,
        &["session", "move", "lonely", "nosuch", "--to", &sock_b],
    );
    assert!(code != 0 && err.contains("nosuch"), "{err}");
    // Each failure names the daemon it failed on (it named neither).
    assert!(
        err.contains(&format!("the source daemon ({sock_a})")),
        "{err}"
    );
    assert!(!ctl(&b, &["agent", "list"]).contains("lonely"));
    for d in [&a, &b] {
        ctl(d, &["session", "create", "a", "dup"]);
    }
    let (code, _, err) = allox_integration::alloxctl(
        &a.daemon.socket,
        &["session", "move", "a", "dup", "--to", &sock_b],
    );
    assert!(
        code != 0 && err.contains(&format!("the target daemon ({sock_b})")),
        "{err}"
    );
    ctl(&a, &["session", "create", "a", "s"]);
    ctl(&a, &["policy", "a", "s", "--auto-checkpoint", "on"]);
    ctl(&a, &["turn", "begin", "a", "s"]);
    ctl(&a, &["turn", "end", "a", "s", "turn-1", "--status", "ok"]);
    ctl(&a, &["session", "move", "a", "s", "--to", &sock_b]);
    // On b: a turn begun, the session moved back with it open.
    ctl(&b, &["turn", "begin", "a", "s"]);
    ctl(&b, &["exec", "a", "s", "--", "sh", "-c", "echo b > f"]);
    ctl(
        &b,
        &[
            "session", "move", "a", "s", "--to", &sock_a, "--since", "turn-1",
        ],
    );
    // Ended on a, and back to b, where it is still open as it left.
    ctl(&a, &["turn", "end", "a", "s", "turn-2", "--status", "ok"]);
    ctl(
        &a,
        &[
            "session", "move", "a", "s", "--to", &sock_b, "--since", "turn-1",
        ],
    );
    let log = ctl(&b, &["log", "a", "s"]);
    assert!(log.contains("turn-2"), "{log}");
    let (code, _, err) =
        allox_integration::alloxctl(&b.daemon.socket, &["turn", "end", "a", "s", "turn-2"]);
    assert!(code != 0 && err.contains("already ended"), "{err}");
}

/// A session holds at most the checkpoints the daemon allows
/// (`--session-checkpoints`): a checkpoint, a turn's checkpoint or an
/// import past it is refused, saying so, and nothing is made (a session
/// with a few thousand checkpoints could no longer be listed: its listing
/// was larger than a frame, and an agent could make that many by ending
/// turns in a loop).
#[test]
fn a_session_holds_at_most_the_checkpoints_the_daemon_allows() {
    let name = "transfer::a_session_holds_at_most_the_checkpoints_the_daemon_allows";
    if !require(name) {
        return;
    }
    let (fs1, fs2) = (BtrfsFs::new(512).unwrap(), BtrfsFs::new(512).unwrap());
    let root = fs2.path().join("store");
    std::fs::create_dir_all(&root).unwrap();
    let st = Arc::new(
        Store::open_with(
            &root,
            allox_store::failpoint::Failpoints::default(),
            allox_store::StoreOptions {
                session_checkpoints: 3,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    st.agent_create("a").unwrap();
    st.session_create("a", "s").unwrap();
    for c in ["c0", "c1", "c2"] {
        checkpoint(&st, c, false, None);
    }
    let refused = |e: allox_store::StoreError, what: &str| {
        let msg = e.chain();
        assert_eq!(e.code(), ErrorCode::Unavailable, "{what}: {msg}");
        assert!(
            msg.contains("a/s holds 3 checkpoints and may hold at most 3")
                && msg.contains("1 more is refused")
                && msg.contains("--session-checkpoints"),
            "{what}: {msg}"
        );
    };
    let fourth = CheckpointCreate {
        agent_id: "a".into(),
        session_id: "s".into(),
        checkpoint_id: "c3".into(),
        pinned: false,
        label: None,
    };
    refused(
        st.checkpoint_create(&fourth).unwrap_err(),
        "a fourth checkpoint",
    );
    assert!(!st.layout().checkpoint("a", "s", "c3").exists());
    // A turn ends, its checkpoint refused and said so.
    st.policy_set(&PolicySet {
        agent_id: "a".into(),
        session_id: Some("s".into()),
        auto_checkpoint: Some(true),
        keep_last: None,
    })
    .unwrap();
    st.turn_begin(&TurnBegin {
        agent_id: "a".into(),
        session_id: "s".into(),
        turn_id: Some("t1".into()),
    })
    .unwrap();
    let t = st
        .turn_end(&TurnEnd {
            agent_id: "a".into(),
            session_id: "s".into(),
            turn_id: "t1".into(),
            status: TurnStatus::Ok,
            label: None,
        })
        .unwrap();
    assert!(t.ended_ms.is_some() && t.checkpoint_id.is_none(), "{t:?}");
    let why = t.checkpoint_error.unwrap_or_default();
    assert!(
        why.contains("may hold at most 3"),
        "turn's checkpoint: {why}"
    );
    assert_eq!(st.checkpoint_list("a", "s").unwrap().checkpoints.len(), 3);
    // Room made, a checkpoint goes in again.
    st.checkpoint_delete("a", "s", "c0").unwrap();
    st.checkpoint_create(&fourth).unwrap();

    // An archive with more checkpoints than a session may hold is refused
    // before anything is made.
    let src = store(&fs1);
    history(&src, 10, 4);
    let bytes = export(&src, None);
    st.agent_create("b").unwrap();
    let mut i = st.import_begin("b", None).unwrap();
    let e = i
        .push(&bytes)
        .and_then(|()| i.commit().map(|_| ()))
        .unwrap_err();
    let msg = e.chain();
    assert!(
        msg.contains("b/s would hold 6 checkpoints, and a session may hold at most 3")
            && msg.contains("the archive brings too many"),
        "import: {msg}"
    );
    assert!(st.session_info_of("b", "s").is_err());
    let left: Vec<_> = std::fs::read_dir(st.layout().sessions_dir("b"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left by the refused import: {left:?}");
}

/// A session in `proxy` mode is refused by a daemon without the network
/// plugin before anything is received, as making one there is (it moved,
/// and then every run in it was refused); an archive in another mode goes
/// in.
#[test]
fn a_proxy_session_is_refused_where_the_network_plugin_is_off() {
    let name = "transfer::a_proxy_session_is_refused_where_the_network_plugin_is_off";
    if !require(name) {
        return;
    }
    let fs = BtrfsFs::new(512).unwrap();
    let src = store(&fs);
    src.agent_create("a").unwrap();
    for (s, mode) in [("p", NetworkMode::Proxy), ("n", NetworkMode::Isolated)] {
        let new = allox_store::NewSession {
            network: allox_store::index::NetworkRecord {
                mode: Some(mode),
                egress: None,
            },
            clock: None,
            policy: None,
        };
        src.session_create_with("a", s, &new).unwrap();
    }
    let d = allox_integration::ProcDaemon::start("transfer-proxy", &[]);
    ctl(&d, &["agent", "create", "a"]);
    let file = fs.scratch().join("s.allox");
    let f = file.to_str().unwrap();
    let write = |s: &str| {
        let mut out = Vec::new();
        src.session_export("a", s, None, &Default::default(), &mut out)
            .unwrap();
        std::fs::write(&file, out).unwrap();
    };
    write("p");
    let (code, _, err) =
        allox_integration::alloxctl(&d.daemon.socket, &["session", "import", "a", "-i", f]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("unsupported")
            && err.contains("a/p is in network mode proxy, which needs the network plugin"),
        "{err}"
    );
    let (code, _, err) =
        allox_integration::alloxctl(&d.daemon.socket, &["session", "info", "a", "p"]);
    assert!(
        code != 0 && err.contains("not_found"),
        "made by the refused import: {err}"
    );
    let sessions = d.daemon.root.join("agents/a/workspace/sessions");
    let left: Vec<_> = std::fs::read_dir(&sessions)
        .map(|r| r.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left on disk: {left:?}");
    write("n");
    let said = ctl(&d, &["session", "import", "a", "-i", f]);
    assert!(said.starts_with("imported a/n"), "{said}");
}

/// A session imported without limits over time takes its agent's, else the
/// daemon's, as one made there does (it took none, whatever the daemon
/// was told); one that has its own keeps them, a missing one filled in.
#[test]
fn an_imported_session_takes_the_daemon_s_limits_over_time_where_it_has_none() {
    let name =
        "transfer::an_imported_session_takes_the_daemon_s_limits_over_time_where_it_has_none";
    if !require(name) {
        return;
    }
    let fs = BtrfsFs::new(512).unwrap();
    let src = store(&fs);
    src.agent_create("a").unwrap();
    let own_life = allox_store::index::ClockRecord {
        max_lifetime_ms: Some(3_600_000),
        ..Default::default()
    };
    for (s, clock) in [("plain", None), ("lived", Some(own_life))] {
        let new = allox_store::NewSession {
            network: Default::default(),
            clock,
            policy: None,
        };
        src.session_create_with("a", s, &new).unwrap();
    }
    let d =
        allox_integration::ProcDaemon::start("transfer-clock", &["--idle-timeout-ms", "600000"]);
    ctl(&d, &["agent", "create", "a"]);
    let file = fs.scratch().join("s.allox");
    let f = file.to_str().unwrap();
    for s in ["plain", "lived"] {
        let mut out = Vec::new();
        src.session_export("a", s, None, &Default::default(), &mut out)
            .unwrap();
        std::fs::write(&file, out).unwrap();
        ctl(&d, &["session", "import", "a", "-i", f]);
        let info: serde_json::Value =
            serde_json::from_str(&ctl(&d, &["--json", "session", "info", "a", s])).unwrap();
        assert_eq!(info["idle_timeout_ms"], 600000, "{s}: {info}");
        if s == "lived" {
            let (made, expires) = (
                info["created_ms"].as_u64().unwrap(),
                info["expires_ms"].as_u64().unwrap_or(0),
            );
            assert!(expires >= made + 3_500_000, "{s}: its own lifetime: {info}");
        }
    }
}

/// 24 MiB at `path` that no filesystem shrinks; returns its first MiB's
/// block (each MiB differs from it in its first byte).
fn big_data(path: &std::path::Path) -> Vec<u8> {
    let block: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 + i / 251) as u8).collect();
    let mut f = std::fs::File::create(path).unwrap();
    for i in 0..24u8 {
        let mut b = block.clone();
        b[0] = i;
        std::io::Write::write_all(&mut f, &b).unwrap();
    }
    block
}

#[test]
fn an_archive_holding_more_than_the_session_quota_is_refused_and_nothing_made() {
    let name = "transfer::an_archive_holding_more_than_the_session_quota_is_refused";
    if !require(name) {
        return;
    }
    let (fa, fb) = (BtrfsFs::new(512).unwrap(), BtrfsFs::new(512).unwrap());
    let src = store(&fa);
    src.agent_create("a").unwrap();
    let cur = std::path::PathBuf::from(&src.session_create("a", "s").unwrap().current);
    // 24 MiB that no filesystem shrinks, checkpointed.
    let block = big_data(&cur.join("data"));
    checkpoint(&src, "c0", false, None);
    let big = export(&src, None);
    // The same session, 1 MiB of it (a new file: a cut one would still
    // hold the whole extents it was written in).
    std::fs::remove_file(cur.join("data")).unwrap();
    std::fs::write(cur.join("data"), &block).unwrap();
    checkpoint(&src, "c1", false, None);
    // Its current/ small, one checkpoint over the quota (a rollback to it
    // left a session that could not take an empty file).
    let mixed = export(&src, None);
    src.checkpoint_delete("a", "s", "c0").unwrap();
    let small = export(&src, None);
    let root = fb.path().join("store");
    std::fs::create_dir_all(&root).unwrap();
    let dst = Arc::new(
        Store::open_with(
            &root,
            allox_store::failpoint::Failpoints::default(),
            allox_store::StoreOptions {
                session_quota: Some(16 << 20),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    dst.agent_create("a").unwrap();
    // Made, it could not take an empty file: refused, naming both sizes.
    let mut i = dst.import_begin("a", None).unwrap();
    for piece in big.chunks(1 << 20) {
        i.push(piece).unwrap();
    }
    let e = i.commit().unwrap_err();
    let msg = e.chain();
    assert_eq!(e.code(), ErrorCode::InvalidRequest, "{msg}");
    assert!(
        msg.contains("the archive's current/ holds 25 MiB")
            && msg.contains("--session-quota 16 MiB")
            && msg.contains("nothing was made"),
        "{msg}"
    );
    assert!(on_disk(&dst).is_empty(), "left: {:?}", on_disk(&dst));
    assert!(dst.session_list("a").unwrap().is_empty());
    assert!(dst.check().unwrap().is_consistent());
    let mut i = dst.import_begin("a", None).unwrap();
    for piece in mixed.chunks(1 << 20) {
        i.push(piece).unwrap();
    }
    let e = i.commit().unwrap_err();
    let msg = e.chain();
    assert_eq!(e.code(), ErrorCode::InvalidRequest, "{msg}");
    assert!(
        msg.contains("the archive's checkpoint c0 holds 25 MiB")
            && msg.contains("nothing was made"),
        "{msg}"
    );
    assert!(on_disk(&dst).is_empty(), "left: {:?}", on_disk(&dst));
    assert!(dst.session_list("a").unwrap().is_empty());
    // One within it is made, under the quota.
    import(&dst, &small, 1 << 20).unwrap();
    let u = dst.session_usage("a", "s").unwrap().unwrap();
    assert_eq!(u.max_referenced, Some(16 << 20));
    assert!(u.referenced < 16 << 20, "{u:?}");
}

/// A checkpoint taken under a larger quota (or none) than the daemon's
/// now is refused as a rollback's or a fork's source, naming it and the
/// quota: the session it made could not take an empty file.
#[test]
fn a_checkpoint_over_the_session_quota_is_neither_rolled_back_to_nor_forked() {
    if !require(
        "transfer::a_checkpoint_over_the_session_quota_is_neither_rolled_back_to_nor_forked",
    ) {
        return;
    }
    let fs = BtrfsFs::new(512).unwrap();
    let root = fs.path().join("store");
    std::fs::create_dir_all(&root).unwrap();
    let cur = {
        let st = Store::open(&root, Default::default()).unwrap();
        st.agent_create("a").unwrap();
        let cur = std::path::PathBuf::from(&st.session_create("a", "s").unwrap().current);
        big_data(&cur.join("data"));
        checkpoint(&st, "c0", false, None);
        std::fs::remove_file(cur.join("data")).unwrap();
        std::fs::write(cur.join("small"), b"small").unwrap();
        checkpoint(&st, "c1", false, None);
        cur
    };
    // The daemon again, with a quota the first checkpoint is over.
    let st = Store::open_with(
        &root,
        allox_store::failpoint::Failpoints::default(),
        allox_store::StoreOptions {
            session_quota: Some(16 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    let rollback = |c: &str| {
        st.rollback(&SessionRollback {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: c.into(),
            kill_processes: None,
        })
    };
    let e = rollback("c0").unwrap_err();
    let msg = e.chain();
    assert_eq!(e.code(), ErrorCode::InvalidRequest, "{msg}");
    assert!(
        msg.contains("checkpoint c0 holds 25 MiB")
            && msg.contains("--session-quota 16 MiB")
            && msg.contains("nothing was changed"),
        "{msg}"
    );
    let fork = |c: &str, to: &str| {
        st.session_fork(&SessionFork {
            agent_id: "a".into(),
            session_id: "s".into(),
            from: c.into(),
            new_agent_id: None,
            new_session_id: to.into(),
            label: None,
        })
    };
    let e = fork("c0", "f0").unwrap_err();
    assert!(
        e.chain().contains("checkpoint c0 holds 25 MiB"),
        "{}",
        e.chain()
    );
    assert!(st
        .session_list("a")
        .unwrap()
        .iter()
        .all(|s| s.session_id != "f0"));
    // The session is as it was, and writes; one within the quota is
    // rolled back to and forked.
    assert_eq!(std::fs::read(cur.join("small")).unwrap(), b"small");
    std::fs::write(cur.join("more"), b"x").unwrap();
    rollback("c1").unwrap();
    fork("c1", "f1").unwrap();
    assert!(st.check().unwrap().is_consistent());
}
