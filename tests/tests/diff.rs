//! `checkpoint.diff` against a brute-force comparison of the two trees.

use allox_integration::{populate, require, BtrfsFs};
use allox_protocol::*;
use allox_store::failpoint::Failpoints;
use allox_store::Store;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn setup(name: &str) -> Option<(BtrfsFs, Store)> {
    if !require(name) {
        return None;
    }
    std::fs::create_dir_all("/var/tmp").ok();
    let fs = BtrfsFs::new(2048).expect("make btrfs");
    std::fs::create_dir(fs.path().join("store")).unwrap();
    let st = Store::open(&fs.path().join("store"), Failpoints::default()).unwrap();
    st.agent_create("a").unwrap();
    st.session_create("a", "s").unwrap();
    Some((fs, st))
}

fn ck(st: &Store, c: &str) {
    st.checkpoint_create(&CheckpointCreate {
        agent_id: "a".into(),
        session_id: "s".into(),
        checkpoint_id: c.into(),
        pinned: false,
        label: None,
    })
    .unwrap();
}

fn diff(st: &Store, from: &str, to: &str) -> DiffListing {
    st.checkpoint_diff(&CheckpointDiff {
        agent_id: "a".into(),
        session_id: "s".into(),
        from: from.into(),
        to: to.into(),
        patch: false,
    })
    .unwrap()
}

/// Everything a tree holds, read the slow way (never following symlinks).
fn snapshot(root: &Path) -> BTreeMap<String, (char, u32, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (char, u32, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let mode = md.permissions().mode() & 0o7777;
            if md.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(rel, ('l', 0, t.as_os_str().as_encoded_bytes().to_vec()));
            } else if md.is_dir() {
                out.insert(rel, ('d', mode, Vec::new()));
                walk(root, &p, out);
            } else {
                out.insert(rel, ('f', mode, std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn brute(a: &Path, b: &Path) -> BTreeSet<(String, ChangeKind)> {
    let (sa, sb) = (snapshot(a), snapshot(b));
    let mut out = BTreeSet::new();
    for (p, x) in &sa {
        match sb.get(p) {
            None => {
                out.insert((p.clone(), ChangeKind::Deleted));
            }
            Some(y) if x.0 != y.0 => {
                out.insert((p.clone(), ChangeKind::TypeChanged));
            }
            Some(y) if x != y => {
                out.insert((p.clone(), ChangeKind::Modified));
            }
            _ => {}
        }
    }
    for p in sb.keys() {
        if !sa.contains_key(p) {
            out.insert((p.clone(), ChangeKind::Added));
        }
    }
    out
}

fn got(d: &DiffListing) -> BTreeSet<(String, ChangeKind)> {
    assert!(!d.truncated);
    d.changes.iter().map(|c| (c.path.clone(), c.kind)).collect()
}

#[test]
fn diff_matches_a_brute_force_comparison_on_hostile_trees() {
    let Some((_fs, st)) = setup("diff::diff_matches_a_brute_force_comparison") else {
        return;
    };
    let cur = st.layout().current("a", "s");
    let w = |p: &str, data: &str| {
        let p = cur.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    };
    populate(&cur, 2000).unwrap();
    for p in [
        "keep",
        "edit-same-size",
        "edit-grow",
        "touched",
        "chmod",
        "renamed",
        "to-dir",
        "hard",
    ] {
        w(p, &format!("content of {p}\n"));
    }
    std::fs::create_dir_all(cur.join("dir-to-file/sub")).unwrap();
    w("dir-to-file/sub/x", "x");
    std::fs::create_dir_all(cur.join("gone/deep/deeper")).unwrap();
    w("gone/deep/deeper/f", "f");
    std::os::unix::fs::symlink("keep", cur.join("link")).unwrap();
    std::os::unix::fs::symlink("/etc", cur.join("out-link")).unwrap();
    ck(&st, "a");
    // Mutations of every kind.
    w("edit-same-size", "CONTENT OF edit-same-size\n");
    w("edit-grow", "a longer content than before\n");
    let t = std::fs::File::options()
        .write(true)
        .open(cur.join("touched"))
        .unwrap();
    t.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    std::fs::set_permissions(cur.join("chmod"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(cur.join("renamed"), cur.join("renamed-new")).unwrap();
    std::fs::remove_file(cur.join("to-dir")).unwrap();
    w("to-dir/inside", "now a dir");
    std::fs::remove_dir_all(cur.join("dir-to-file")).unwrap();
    w("dir-to-file", "now a file");
    std::fs::remove_dir_all(cur.join("gone")).unwrap();
    std::fs::hard_link(cur.join("hard"), cur.join("hard-2")).unwrap();
    std::fs::remove_file(cur.join("link")).unwrap();
    std::os::unix::fs::symlink("edit-grow", cur.join("link")).unwrap();
    std::os::unix::fs::symlink("../../../../../..", cur.join("escape")).unwrap();
    let mut deep = String::new();
    for i in 0..40 {
        deep.push_str(&format!("d{i}/"));
    }
    w(&format!("{deep}bottom"), "deep");
    w("d001/f1500", "changed inside a big dir");
    std::fs::remove_file(cur.join("d000/f7")).unwrap();
    ck(&st, "b");
    let l = st.layout().clone();
    let want = brute(&l.checkpoint("a", "s", "a"), &l.checkpoint("a", "s", "b"));
    let d = diff(&st, "a", "b");
    assert_eq!(got(&d), want);
    assert!(
        !want.iter().any(|(p, _)| p == "touched"),
        "a touch is not a change"
    );
    assert!(want.contains(&("chmod".into(), ChangeKind::Modified)));
    assert!(want.contains(&("to-dir".into(), ChangeKind::TypeChanged)));
    assert!(want.contains(&("escape".into(), ChangeKind::Added)));
    // The other direction, and against current/.
    assert_eq!(
        got(&diff(&st, "b", "a")),
        brute(&l.checkpoint("a", "s", "b"), &l.checkpoint("a", "s", "a"))
    );
    w("after-b", "x");
    assert_eq!(
        got(&diff(&st, "b", "current")),
        brute(&l.checkpoint("a", "s", "b"), &cur)
    );
    assert!(got(&diff(&st, "b", "b")).is_empty());
    // Bad names.
    let e = st
        .checkpoint_diff(&CheckpointDiff {
            agent_id: "a".into(),
            session_id: "s".into(),
            from: "../b".into(),
            to: "b".into(),
            patch: false,
        })
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidRequest);
    let e = st
        .checkpoint_diff(&CheckpointDiff {
            agent_id: "a".into(),
            session_id: "s".into(),
            from: "nope".into(),
            to: "b".into(),
            patch: false,
        })
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound);
}

#[test]
fn ten_changes_in_a_hundred_thousand_files() {
    let Some((_fs, st)) = setup("diff::ten_changes_in_a_hundred_thousand_files") else {
        return;
    };
    let cur = st.layout().current("a", "s");
    populate(&cur, 100_000).unwrap();
    ck(&st, "a");
    for i in 0..10 {
        std::fs::write(
            cur.join(format!("d{:03}/f{}", i * 7, i * 7000 + 3)),
            "changed",
        )
        .unwrap();
    }
    ck(&st, "b");
    let d = diff(&st, "a", "b");
    assert_eq!(
        (d.modified, d.added, d.deleted, d.type_changed),
        (10, 0, 0, 0),
        "{d:?}"
    );
}

/// A small deterministic generator, so a failure can be replayed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn mutate(rng: &mut Rng, cur: &Path) {
    let dir = cur.join(format!("d{:03}", rng.below(3)));
    let f = dir.join(format!("f{}", rng.below(1500)));
    match rng.below(9) {
        0 => {
            std::fs::write(&f, format!("rewritten {}\n", rng.next())).ok();
        }
        1 => {
            std::fs::remove_file(&f).ok();
        }
        2 => {
            let to = cur
                .join(format!("d{:03}", rng.below(3)))
                .join(format!("r{}", rng.below(50)));
            std::fs::rename(&f, to).ok();
        }
        3 => {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).ok();
        }
        4 => {
            // A hard link in another directory, then the shared inode edited.
            let to = cur.join("links").join(format!("h{}", rng.below(20)));
            std::fs::create_dir_all(to.parent().unwrap()).ok();
            if std::fs::hard_link(&f, &to).is_ok() {
                std::fs::write(&to, format!("through a link {}\n", rng.next())).ok();
            }
        }
        5 => {
            let d = cur.join(format!("new{}/x/y", rng.below(5)));
            std::fs::create_dir_all(&d).ok();
            std::fs::write(d.join("z"), "z").ok();
        }
        6 => {
            std::fs::remove_dir_all(cur.join(format!("new{}", rng.below(5)))).ok();
        }
        7 => {
            std::os::unix::fs::symlink(
                format!("t{}", rng.next()),
                dir.join(format!("l{}", rng.below(10))),
            )
            .ok();
        }
        _ => {
            // Same size, same inode: only the bytes tell.
            if let Ok(old) = std::fs::read(&f) {
                let mut new = old.clone();
                if let Some(b) = new.first_mut() {
                    *b ^= 1;
                }
                std::fs::write(&f, new).ok();
            }
        }
    }
}

#[test]
fn pruned_diff_matches_the_full_walk_across_rollbacks() {
    use allox_store::diff::{diff_trees, DiffMethod};
    let Some((_fs, st)) = setup("diff::pruned_diff_matches_the_full_walk_across_rollbacks") else {
        return;
    };
    let l = st.layout().clone();
    let cur = l.current("a", "s");
    populate(&cur, 1500).unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut cks: Vec<String> = Vec::new();
    let (mut compared, mut through_departed) = (0, 0);
    for step in 0..20 {
        for _ in 0..rng.below(12) {
            mutate(&mut rng, &cur);
        }
        match rng.below(4) {
            0 if !cks.is_empty() => {
                let to = cks[rng.below(cks.len() as u64) as usize].clone();
                st.rollback(&SessionRollback {
                    agent_id: "a".into(),
                    session_id: "s".into(),
                    checkpoint_id: to,
                    kill_processes: Some(false),
                })
                .unwrap();
            }
            1 if cks.len() > 3 => {
                // Deleting a checkpoint leaves its descendants with a parent
                // known by uuid only.
                let i = rng.below(cks.len() as u64) as usize;
                st.checkpoint_delete("a", "s", &cks.remove(i)).unwrap();
            }
            _ => {
                let c = format!("c{step}");
                ck(&st, &c);
                cks.push(c);
            }
        }
        let mut trees: Vec<std::path::PathBuf> =
            cks.iter().map(|c| l.checkpoint("a", "s", c)).collect();
        trees.push(cur.clone());
        // The pruned diff as `checkpoint.diff` makes it: knowing the
        // lineage of the trees the rollbacks and deletes left behind.
        let departed = st.departed("a", "s").unwrap();
        for x in &trees {
            for y in &trees {
                let fast = allox_store::diff::compare_knowing(
                    x,
                    y,
                    DiffMethod::Btrfs,
                    &departed,
                    &allox_store::diff::Limits::default(),
                    false,
                )
                .map(|d| (d.changes, d.truncated, d.counts))
                .unwrap();
                let slow = diff_trees(x, y, DiffMethod::Walk).unwrap();
                assert_eq!(
                    fast,
                    slow,
                    "step {step}: {} -> {}",
                    x.display(),
                    y.display()
                );
                compared += 1;
                let read = |d: &[allox_store::btrfs::RootInfo]| {
                    allox_store::diff::Hints::read_paths(x, y, d)
                        .unwrap()
                        .is_some()
                };
                if read(&departed) && !read(&[]) {
                    through_departed += 1;
                }
            }
        }
    }
    // The pruning looked at less than everything (or it proves nothing).
    // Read before the slow way below reads every file of current/: on a
    // store mounted without `noatime` a read moves the file's atime, and
    // the write-back the diff of current/ starts with records it.
    let last = l.checkpoint("a", "s", cks.last().unwrap());
    let h =
        allox_store::diff::Hints::read_paths(&last, &cur, &st.departed("a", "s").unwrap()).unwrap();
    let h = h.unwrap_or_else(|| panic!("no common history found for {}", last.display()));
    assert!(
        h.changed_inodes() < 1500,
        "{} inodes singled out of about 1,500",
        h.changed_inodes()
    );
    // The walk itself against the slow way, once at the end.
    let (changes, _, _) = diff_trees(&last, &cur, DiffMethod::Walk).unwrap();
    let walked: BTreeSet<(String, ChangeKind)> =
        changes.iter().map(|c| (c.path.clone(), c.kind)).collect();
    assert_eq!(walked, brute(&last, &cur));
    assert!(compared > 100, "only {compared} pairs compared");
    // Some pairs met only through a tree that was gone.
    assert!(
        through_departed > 0,
        "no pair of {compared} needed the lineage of a deleted tree"
    );
}

fn rollback(st: &Store, to: &str) {
    st.rollback(&SessionRollback {
        agent_id: "a".into(),
        session_id: "s".into(),
        checkpoint_id: to.into(),
        kill_processes: Some(false),
    })
    .unwrap();
}

/// A diff of `current/` while rollbacks replace it (the old tree deleted
/// in the background as the walk reads it) answers the tree it began
/// with, whole, or `conflict` naming what was replaced: never a part of a
/// tree going away, never an internal error. (Before, one round in five
/// or so answered a count that was neither tree's, or failed `internal`.)
#[test]
fn a_diff_of_current_racing_rollbacks_answers_a_whole_tree_or_conflict() {
    let Some((_fs, st)) =
        setup("diff::a_diff_of_current_racing_rollbacks_answers_a_whole_tree_or_conflict")
    else {
        return;
    };
    ck(&st, "e");
    let cur = st.layout().current("a", "s");
    populate(&cur, 12_000).unwrap();
    ck(&st, "full");
    let full = diff(&st, "e", "full");
    assert_eq!((full.modified, full.deleted), (0, 0));
    assert!(full.added >= 12_000, "{full:?}");
    let (mut whole, mut conflicts) = (0, 0);
    for round in 0..40 {
        let target = if round % 2 == 0 { "e" } else { "full" };
        let answer = std::thread::scope(|s| {
            let walk = s.spawn(|| {
                st.checkpoint_diff(&CheckpointDiff {
                    agent_id: "a".into(),
                    session_id: "s".into(),
                    from: "e".into(),
                    to: "current".into(),
                    patch: false,
                })
            });
            rollback(&st, target);
            walk.join().unwrap()
        });
        match answer {
            Ok(d) => {
                let empty = (d.added, d.modified, d.deleted, d.type_changed) == (0, 0, 0, 0);
                let all = (d.added, d.modified, d.deleted, d.type_changed) == (full.added, 0, 0, 0);
                assert!(
                    empty || all,
                    "round {round}: neither tree's answer: {} added, {} modified, {} deleted",
                    d.added,
                    d.modified,
                    d.deleted
                );
                whole += 1;
            }
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::Conflict, "round {round}: {e}");
                assert!(e.to_string().contains("current/"), "round {round}: {e}");
                conflicts += 1;
            }
        }
    }
    eprintln!("{whole} whole answers, {conflicts} conflicts in 40 rounds");
}

/// After two rollbacks, a checkpoint made between them descends from a
/// tree that is gone (the `current/` the first rollback made, replaced by
/// the second), and after its checkpoint is deleted, so does `current/`:
/// the store keeps the lineage of the trees it deletes, so the diff still
/// finds where the trees parted and reads only what was written since,
/// and lists what the slow way lists. The same hints without that lineage
/// find no common history (and the diff would walk both trees whole); a
/// deleted session leaves none of it behind.
#[test]
fn a_diff_across_rollbacks_and_deleted_checkpoints_still_reads_only_what_was_written() {
    use allox_store::diff::Hints;
    let Some((_fs, st)) = setup(
        "diff::a_diff_across_rollbacks_and_deleted_checkpoints_still_reads_only_what_was_written",
    ) else {
        return;
    };
    let l = st.layout().clone();
    let cur = l.current("a", "s");
    populate(&cur, 1500).unwrap();
    ck(&st, "c1");
    std::fs::write(cur.join("d000/f1"), "after c1\n").unwrap();
    ck(&st, "c2");
    rollback(&st, "c1");
    std::fs::write(cur.join("d001/f1002"), "after the first rollback\n").unwrap();
    ck(&st, "c3");
    rollback(&st, "c2");
    std::fs::write(cur.join("d000/f3"), "after the second rollback\n").unwrap();
    let c3 = l.checkpoint("a", "s", "c3");
    let hints = |from: &Path, departed: &[allox_store::btrfs::RootInfo]| {
        Hints::read_paths(from, &cur, departed).unwrap()
    };
    for step in ["two rollbacks", "c2 deleted"] {
        let departed = st.departed("a", "s").unwrap();
        let h = hints(&c3, &departed)
            .unwrap_or_else(|| panic!("{step}: no common history with the kept lineage"));
        assert!(
            h.changed_inodes() < 50,
            "{step}: {} inodes singled out of about 1,500",
            h.changed_inodes()
        );
        // Control: without the lineage the lines of descent do not meet,
        // once the trees the rollbacks replaced are removed (in the
        // background: until then they are living subvolumes the lines
        // meet through).
        st.wait_idle();
        assert!(hints(&c3, &[]).is_none(), "{step}: met without the lineage");
        let want = brute(&c3, &cur);
        assert_eq!(want.len(), 3, "{step}: {want:?}");
        assert_eq!(got(&diff(&st, "c3", "current")), want, "{step}");
        assert_eq!(got(&diff(&st, "current", "c3")), brute(&cur, &c3), "{step}");
        if step == "two rollbacks" {
            // current/ now descends from c2 alone.
            st.checkpoint_delete("a", "s", "c2").unwrap();
        }
    }
    assert_eq!(
        st.departed("a", "s").unwrap().len(),
        3,
        "two trees replaced, one deleted"
    );
    // A third rollback replaces the tree made from c2, from which nothing
    // else descends: it and c2 (only it descended from c2) are forgotten;
    // the trees c1 and c3 descend from are kept, and c1 against current/
    // (now made from c3) still meets through them.
    rollback(&st, "c3");
    let departed = st.departed("a", "s").unwrap();
    assert_eq!(departed.len(), 2, "kept: {departed:?}");
    let c1 = l.checkpoint("a", "s", "c1");
    let h = hints(&c1, &departed).expect("c1 and current/ meet through what is kept");
    assert!(h.changed_inodes() < 50, "{}", h.changed_inodes());
    assert_eq!(got(&diff(&st, "c1", "current")), brute(&c1, &cur));
    // Rolled back to c3 again and again: no record more.
    for _ in 0..3 {
        rollback(&st, "c3");
    }
    assert_eq!(st.departed("a", "s").unwrap().len(), 2);
    st.session_delete("a", "s").unwrap();
    assert!(
        st.departed("a", "s").unwrap().is_empty(),
        "kept past the session"
    );
}

/// A deleted subvolume is not listed among the living from the moment it
/// is deleted, though the kernel drops it later (`btrfs subvolume list -d`
/// still shows it): the lines of descent the diff follows do not depend on
/// how far the cleaner has come. Tried until one deletion is caught before
/// it is dropped (almost always the first: nothing commits in between).
#[test]
fn a_deleted_subvolume_is_not_listed_while_the_kernel_drops_it() {
    use allox_store::btrfs;
    let Some((fs, _st)) =
        setup("diff::a_deleted_subvolume_is_not_listed_while_the_kernel_drops_it")
    else {
        return;
    };
    let base = fs.path().join("base");
    btrfs::create_subvolume(&base).unwrap();
    let listed = || {
        let fd = std::fs::File::open(fs.path()).unwrap();
        btrfs::subvolumes(&fd).unwrap()
    };
    let mut caught = 0;
    for i in 0..20 {
        let snap = fs.path().join(format!("snap-{i}"));
        btrfs::snapshot(&base, &snap, true).unwrap();
        let info = btrfs::root_info(&snap).unwrap();
        assert!(
            listed().iter().any(|r| r.uuid == info.uuid),
            "a living snapshot is not listed"
        );
        btrfs::delete_subvolume(&snap).unwrap();
        let now = listed();
        let pending = allox_integration::deleted_subvolumes(fs.path());
        assert!(
            now.iter().all(|r| r.uuid != info.uuid && r.id != info.id),
            "try {i}: the deleted snapshot (tree {}) is listed among the living \
             ({pending} deleted, not dropped yet)",
            info.id
        );
        if pending > 0 {
            caught += 1;
            if caught == 3 {
                break;
            }
        }
    }
    assert!(
        caught > 0,
        "no deletion was caught before the kernel dropped it: nothing was shown"
    );
}

/// Two copies of a file changed within one tick of the clock that stamps
/// the times (bytes of the same length written over each in place, or an
/// extended attribute set on each, one right after the other) keep the
/// same inode, size, mtime and ctime: the diff still lists the file, from
/// the items Btrfs wrote for it. The copies are two writable snapshots of
/// one tree, changed back to back, so that no commit stands between the
/// two changes; tried until the times came out the same a few times for
/// each kind of change (almost every try).
#[test]
fn a_change_within_one_clock_tick_is_still_listed() {
    use allox_store::diff::{diff_trees, DiffMethod};
    use std::os::unix::fs::{FileExt, MetadataExt};
    let Some((fs, st)) = setup("diff::a_change_within_one_clock_tick_is_still_listed") else {
        return;
    };
    let cur = st.layout().current("a", "s");
    std::fs::create_dir(cur.join("d")).unwrap();
    std::fs::write(cur.join("d/f"), "original content\n").unwrap();
    let mut same_times = [0u32; 2];
    for i in 0..50 {
        for (k, how) in ["bytes", "xattr"].into_iter().enumerate() {
            let (x, y) = (
                fs.path().join(format!("{how}-{i}-x")),
                fs.path().join(format!("{how}-{i}-y")),
            );
            allox_store::btrfs::snapshot(&cur, &x, false).unwrap();
            allox_store::btrfs::snapshot(&cur, &y, false).unwrap();
            let (fx, fy) = (x.join("d/f"), y.join("d/f"));
            if k == 0 {
                let (wx, wy) = (
                    std::fs::OpenOptions::new().write(true).open(&fx).unwrap(),
                    std::fs::OpenOptions::new().write(true).open(&fy).unwrap(),
                );
                wx.write_all_at(b"ORIGINAL", 0).unwrap();
                wy.write_all_at(b"original", 0).unwrap();
            } else {
                let set = |f: &Path, v: &[u8]| {
                    rustix::fs::setxattr(f, "user.note", v, rustix::fs::XattrFlags::empty())
                        .unwrap()
                };
                set(&fx, b"agent");
                set(&fy, b"other");
            }
            let (mx, my) = (
                std::fs::metadata(&fx).unwrap(),
                std::fs::metadata(&fy).unwrap(),
            );
            let times = |m: &std::fs::Metadata| {
                (
                    m.ino(),
                    m.size(),
                    m.mtime(),
                    m.mtime_nsec(),
                    m.ctime(),
                    m.ctime_nsec(),
                )
            };
            if times(&mx) == times(&my) {
                same_times[k] += 1;
            }
            let (changes, _, counts) = diff_trees(&x, &y, DiffMethod::Btrfs).unwrap();
            let listed: Vec<(&str, ChangeKind)> =
                changes.iter().map(|c| (c.path.as_str(), c.kind)).collect();
            assert_eq!(
                listed,
                [("d/f", ChangeKind::Modified)],
                "{how}, try {i}: {counts:?}"
            );
            for t in [&x, &y] {
                allox_store::btrfs::delete_subvolume(t).unwrap();
            }
        }
        if same_times.iter().all(|&n| n >= 3) {
            break;
        }
    }
    // Else the case this test is for was never made.
    assert!(
        same_times.iter().all(|&n| n >= 1),
        "the times never came out the same (bytes, xattr): {same_times:?}"
    );
}

/// Checkpoints `c1` and `c2` of session a/s: `c1 -> c2` lists `expected`
/// (the brute-force comparison and `checkpoint.diff` alike), the
/// Btrfs-pruned diff is the full walk's between each of `pairs` (both
/// ways), and the hints single out at most `most` inodes of `c1 -> c2`.
fn lists_only_what_changed(
    st: &Store,
    expected: &BTreeSet<(String, ChangeKind)>,
    pairs: &[(&Path, &Path)],
    most: usize,
) {
    use allox_store::diff::{diff_trees, DiffMethod, Hints};
    let l = st.layout();
    let (c1, c2) = (l.checkpoint("a", "s", "c1"), l.checkpoint("a", "s", "c2"));
    assert_eq!(&brute(&c1, &c2), expected);
    assert_eq!(&got(&diff(st, "c1", "c2")), expected);
    for &(x, y) in pairs.iter().chain([(c1.as_path(), c2.as_path())].iter()) {
        for (x, y) in [(x, y), (y, x)] {
            let fast = diff_trees(x, y, DiffMethod::Btrfs).unwrap();
            let slow = diff_trees(x, y, DiffMethod::Walk).unwrap();
            assert_eq!(fast, slow, "{} -> {}", x.display(), y.display());
        }
    }
    let h = Hints::read_paths(&c1, &c2, &[])
        .unwrap()
        .expect("one history");
    assert!(
        h.changed_inodes() <= most,
        "{} inodes singled out for {} changes (at most {most} expected)",
        h.changed_inodes(),
        expected.len()
    );
}

/// Reads every file [`populate`] made of `n` under `cur`, and checks that
/// reading moved a file's access time: the store is mounted `relatime`
/// (the default), where a first read since a file was written writes its
/// inode item again.
fn read_all(cur: &Path, n: usize) {
    use std::os::unix::fs::MetadataExt;
    let atime = |p: &str| {
        let m = std::fs::metadata(cur.join(p)).unwrap();
        (m.atime(), m.atime_nsec())
    };
    let before = atime("d000/f0");
    for i in 0..n {
        std::fs::read(cur.join(format!("d{:03}/f{i}", i / 1000))).unwrap();
    }
    assert_ne!(
        atime("d000/f0"),
        before,
        "reading did not move the access time"
    );
}

/// A tree read in full after it was written (every file's access time
/// moves, and with it the file's inode item) and a few changes beside
/// files left alone (a new entry at the top next to the first directory's
/// inode, a file made and one deleted among a thousand): the diff lists
/// the changes, as the full walk and a brute-force comparison do, and
/// what the Btrfs trees single out is the changed files and their
/// directories, not every file whose inode item was written again or
/// shares a block with a change.
#[test]
fn reads_and_the_neighbours_of_a_change_are_not_singled_out() {
    use std::os::unix::fs::MetadataExt;
    let Some((_fs, st)) = setup("diff::reads_and_the_neighbours_of_a_change_are_not_singled_out")
    else {
        return;
    };
    let l = st.layout().clone();
    let cur = l.current("a", "s");
    populate(&cur, 3000).unwrap();
    // Written back (the session's tree was made in the transaction the
    // files are written in: the checkpoint's is a later one), and older
    // than the checkpoint by more than the second of slack a ctime is
    // given: the clock is waited past it.
    rustix::fs::sync();
    let made = std::fs::metadata(cur.join("d002/f2999")).unwrap().ctime();
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    while now() <= made + 2 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    ck(&st, "c1");
    read_all(&cur, 3000);
    std::fs::write(cur.join("d001/f1234"), "changed\n").unwrap();
    std::fs::remove_file(cur.join("d002/f2500")).unwrap();
    std::fs::write(cur.join("d002/g1"), "new\n").unwrap();
    std::fs::set_permissions(cur.join("d000/f10"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(cur.join("d000/f20"), cur.join("d000/g20")).unwrap();
    std::fs::create_dir_all(cur.join("new/x")).unwrap();
    std::fs::write(cur.join("new/x/y"), "y\n").unwrap();
    ck(&st, "c2");
    let c1 = l.checkpoint("a", "s", "c1");
    let expected: BTreeSet<(String, ChangeKind)> = [
        ("d001/f1234", ChangeKind::Modified),
        ("d002/f2500", ChangeKind::Deleted),
        ("d002/g1", ChangeKind::Added),
        ("d000/f10", ChangeKind::Modified),
        ("d000/f20", ChangeKind::Deleted),
        ("d000/g20", ChangeKind::Added),
        ("new", ChangeKind::Added),
        ("new/x", ChangeKind::Added),
        ("new/x/y", ChangeKind::Added),
    ]
    .into_iter()
    .map(|(p, k)| (p.to_string(), k))
    .collect();
    // The five files changed, made or renamed, the new tree's three
    // inodes, and the directories whose entries changed: not the 3,000
    // files whose access times moved (3,007 singled out before).
    lists_only_what_changed(&st, &expected, &[(&c1, &cur)], 12);
}

/// Files written just before a checkpoint (their ctimes within the
/// second of slack of its time) and one file made after it, numbered next
/// to them: the files the new one shares a tree block with are not
/// singled out (their inode items were last written before the
/// checkpoint), so neither is their directory listed for them.
#[test]
fn files_written_just_before_a_checkpoint_beside_a_new_one_are_not_singled_out() {
    let Some((_fs, st)) =
        setup("diff::files_written_just_before_a_checkpoint_beside_a_new_one_are_not_singled_out")
    else {
        return;
    };
    let l = st.layout().clone();
    let cur = l.current("a", "s");
    populate(&cur, 3000).unwrap();
    ck(&st, "c1");
    std::fs::write(cur.join("d000/new"), "new\n").unwrap();
    ck(&st, "c2");
    let expected: BTreeSet<(String, ChangeKind)> =
        [("d000/new".to_string(), ChangeKind::Added)].into();
    // The new file and its directory: not the files beside the new one
    // in the tree (the last ones of d002).
    lists_only_what_changed(&st, &expected, &[], 3);
}

/// Files written just before a checkpoint (their ctimes within the
/// second of slack) and read after it: each read moves a file's access
/// time, writing its inode item again; their items in the two trees say
/// nothing else moved, so they are not singled out. A file made after the
/// checkpoint, and one of them written over with bytes of the same
/// length, are listed.
#[test]
fn files_written_just_before_a_checkpoint_and_read_after_it_are_not_singled_out() {
    use std::os::unix::fs::FileExt;
    let Some((_fs, st)) =
        setup("diff::files_written_just_before_a_checkpoint_and_read_after_it_are_not_singled_out")
    else {
        return;
    };
    let cur = st.layout().current("a", "s");
    populate(&cur, 3000).unwrap();
    ck(&st, "c1");
    read_all(&cur, 3000);
    std::fs::write(cur.join("d001/new"), "new\n").unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(cur.join("d002/f2222"))
        .unwrap();
    f.write_all_at(b"FILE", 0).unwrap();
    drop(f);
    ck(&st, "c2");
    let expected: BTreeSet<(String, ChangeKind)> = [
        ("d001/new".to_string(), ChangeKind::Added),
        ("d002/f2222".to_string(), ChangeKind::Modified),
    ]
    .into();
    // The two files and their directories (3,000 and more singled out
    // without the items compared).
    lists_only_what_changed(&st, &expected, &[], 6);
}

/// Trees that nothing changed in since they were one (two checkpoints of
/// a session left alone, or either and `current`) are compared from the
/// Btrfs trees alone, without listing a directory; a nested subvolume in
/// one of them (a tree of its own, which those searches do not read) is
/// still compared by the walk: the pruned diff stays the full walk's.
#[test]
fn unchanged_trees_answer_at_once_and_a_nested_subvolume_is_still_walked() {
    use allox_store::diff::{diff_trees, DiffMethod, Hints};
    let Some((_fs, st)) =
        setup("diff::unchanged_trees_answer_at_once_and_a_nested_subvolume_is_still_walked")
    else {
        return;
    };
    let l = st.layout().clone();
    let cur = l.current("a", "s");
    // One wide directory: a walk would list all of it.
    std::fs::create_dir(cur.join("wide")).unwrap();
    for i in 0..2000 {
        std::fs::write(cur.join(format!("wide/f{i}")), i.to_string()).unwrap();
    }
    ck(&st, "c1");
    ck(&st, "c2");
    let (c1, c2) = (l.checkpoint("a", "s", "c1"), l.checkpoint("a", "s", "c2"));
    let h = Hints::read_paths(&c1, &c2, &[])
        .unwrap()
        .expect("one history");
    assert_eq!(
        h.changed_inodes(),
        0,
        "two checkpoints of a tree left alone"
    );
    for (x, y) in [(&c1, &c2), (&c2, &c1), (&c1, &cur), (&cur, &c2)] {
        let fast = diff_trees(x, y, DiffMethod::Btrfs).unwrap();
        assert_eq!(
            fast,
            (Vec::new(), false, [0; 4]),
            "{} -> {}",
            x.display(),
            y.display()
        );
        assert_eq!(fast, diff_trees(x, y, DiffMethod::Walk).unwrap());
    }
    // A nested subvolume in current/: a checkpoint shows it as an empty
    // directory. Its files change after the checkpoint, current/'s own
    // tree does not.
    let nested = cur.join("nested");
    allox_store::btrfs::create_subvolume(&nested).unwrap();
    std::fs::write(nested.join("f"), b"x").unwrap();
    ck(&st, "c3");
    std::fs::write(nested.join("g"), b"y").unwrap();
    let c3 = l.checkpoint("a", "s", "c3");
    let fast = diff_trees(&c3, &cur, DiffMethod::Btrfs).unwrap();
    assert_eq!(fast, diff_trees(&c3, &cur, DiffMethod::Walk).unwrap());
    let paths: Vec<&str> = fast.0.iter().map(|c| c.path.as_str()).collect();
    assert!(paths.contains(&"nested/g"), "{paths:?}");
    let back = diff_trees(&cur, &c3, DiffMethod::Btrfs).unwrap();
    assert_eq!(back, diff_trees(&cur, &c3, DiffMethod::Walk).unwrap());
    assert!(!back.0.is_empty());
}

/// Thousands of changes past what is listed, new inodes above every old
/// one, an inode with more links than one search of its references
/// holds, one of them moved: the pruned diff lists and counts what the
/// full walk does, and its counts are the brute-force comparison's.
#[test]
fn changes_past_the_listing_are_counted_as_the_full_walk_counts_them() {
    use allox_store::diff::{diff_trees_with, DiffMethod, Limits};
    let Some((_fs, st)) =
        setup("diff::changes_past_the_listing_are_counted_as_the_full_walk_counts_them")
    else {
        return;
    };
    let l = st.layout().clone();
    let cur = l.current("a", "s");
    populate(&cur, 1500).unwrap();
    let many = cur.join("many");
    std::fs::create_dir(&many).unwrap();
    std::fs::write(many.join("old"), "old").unwrap();
    ck(&st, "c0");
    for i in 0..3000 {
        std::fs::write(many.join(format!("n{i:04}")), "").unwrap();
    }
    std::fs::create_dir_all(cur.join("deep/er")).unwrap();
    for i in 0..200 {
        std::fs::write(cur.join(format!("deep/er/x{i}")), "x").unwrap();
    }
    for i in 0..300 {
        std::fs::remove_file(cur.join(format!("d000/f{}", i * 3))).unwrap();
    }
    // Twelve links of one old file, in twelve directories (a reference
    // item each); one moved.
    for i in 0..12 {
        let dir = cur.join(format!("links{i}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::hard_link(cur.join("d001/f1001"), dir.join("h")).unwrap();
    }
    std::fs::rename(cur.join("links2/h"), cur.join("d000/moved")).unwrap();
    std::fs::write(cur.join("d001/f1001"), "through its links\n").unwrap();
    ck(&st, "c1");
    let (a, b) = (l.checkpoint("a", "s", "c0"), l.checkpoint("a", "s", "c1"));
    let expect = brute(&a, &b);
    let by_kind = |k: ChangeKind| expect.iter().filter(|(_, x)| *x == k).count() as u64;
    for (from, to) in [(&a, &b), (&b, &a), (&a, &cur)] {
        for listed in [10usize, 150, 5000] {
            let limits = Limits {
                changes: listed,
                ..Limits::default()
            };
            let fast = diff_trees_with(from, to, DiffMethod::Btrfs, &limits).unwrap();
            let slow = diff_trees_with(from, to, DiffMethod::Walk, &limits).unwrap();
            assert_eq!(
                fast,
                slow,
                "{} -> {}, {listed} listed",
                from.display(),
                to.display()
            );
            let (changes, truncated, counts) = fast;
            assert_eq!(changes.len(), listed.min(expect.len()));
            assert_eq!(truncated, listed < expect.len());
            // What is listed still carries its sizes.
            for c in changes.iter().filter(|c| c.path.starts_with("many/n")) {
                let size = if c.kind == ChangeKind::Added {
                    c.size_after
                } else {
                    c.size_before
                };
                assert_eq!(size, Some(0), "{c:?}");
            }
            if from == &a {
                for k in [ChangeKind::Added, ChangeKind::Deleted, ChangeKind::Modified] {
                    assert_eq!(counts[k as usize], by_kind(k), "{k:?}, {listed} listed");
                }
            }
        }
    }
    assert!(by_kind(ChangeKind::Added) > 3200, "{expect:?}");
}

/// Limits small enough that a test tree meets every one of them.
fn tight() -> allox_store::diff::Limits {
    allox_store::diff::Limits {
        depth: 4096,
        // A few hundred names per part: the wide directory takes many.
        dir_bytes: 8 << 10,
        held_bytes: 1 << 20,
        parts: 1024,
        read_bytes: 64 << 20,
        changes: 10_000,
        listed_bytes: 4 << 20,
        hint_inodes: 1 << 18,
        ..allox_store::diff::Limits::default()
    }
}

#[test]
fn tight_limits_change_nothing_on_deep_and_wide_trees() {
    use allox_store::diff::{diff_trees_with, DiffMethod, Limits};
    use std::io::{Seek, SeekFrom, Write};
    let Some((_fs, st)) = setup("diff::tight_limits_change_nothing_on_deep_and_wide_trees") else {
        return;
    };
    let l = st.layout().clone();
    let cur = l.current("a", "s");
    // A chain deeper than the levels a walk keeps open, with files along
    // it, and a wide directory.
    let mut deep = cur.clone();
    for i in 0..150 {
        deep = deep.join(format!("l{i}"));
        std::fs::create_dir(&deep).unwrap();
        std::fs::write(deep.join("f"), format!("{i}")).unwrap();
    }
    std::fs::create_dir(cur.join("wide")).unwrap();
    for i in 0..3000 {
        std::fs::write(cur.join(format!("wide/n{i}")), format!("{i}")).unwrap();
    }
    // Sparse files: a hole on one side where the other has zeros written
    // is the same contents.
    for (name, at) in [("sparse-same", 64u64 << 20), ("sparse-diff", 64 << 20)] {
        let mut f = std::fs::File::create(cur.join(name)).unwrap();
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(b"end").unwrap();
    }
    ck(&st, "a");
    let mut p = cur.clone();
    for i in 0..150 {
        p = p.join(format!("l{i}"));
        if i % 7 == 0 {
            std::fs::write(p.join("f"), format!("{}", i + 1000)).unwrap();
        }
        if i % 11 == 0 {
            std::fs::write(p.join("new"), "new").unwrap();
        }
    }
    // The chain's bottom goes, from level 100 on.
    let cut: Vec<String> = (0..=100).map(|i| format!("l{i}")).collect();
    std::fs::remove_dir_all(cur.join(cut.join("/"))).unwrap();
    for i in (0..3000).step_by(97) {
        std::fs::remove_file(cur.join(format!("wide/n{i}"))).unwrap();
        std::fs::write(cur.join(format!("wide/m{i}")), "m").unwrap();
    }
    std::fs::write(cur.join("wide/n5"), "55").unwrap();
    {
        // Zeros written over part of the hole, then the same tail again.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(cur.join("sparse-same"))
            .unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.write_all(&vec![0u8; 1 << 20]).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(cur.join("sparse-diff"))
            .unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.write_all(&[0, 0, 1, 0]).unwrap();
    }
    ck(&st, "b");
    let (a, b) = (l.checkpoint("a", "s", "a"), l.checkpoint("a", "s", "b"));
    let want = brute(&a, &b);
    assert!(want.contains(&("sparse-diff".into(), ChangeKind::Modified)));
    assert!(!want.iter().any(|(p, _)| p == "sparse-same"));
    for limits in [Limits::default(), tight()] {
        for method in [DiffMethod::Walk, DiffMethod::Btrfs] {
            let (changes, truncated, counts) = diff_trees_with(&a, &b, method, &limits).unwrap();
            assert!(!truncated);
            let set: BTreeSet<(String, ChangeKind)> =
                changes.iter().map(|c| (c.path.clone(), c.kind)).collect();
            assert_eq!(set, want, "{method:?} {limits:?}");
            assert_eq!(counts.iter().sum::<u64>() as usize, want.len());
            let (back, _, _) = diff_trees_with(&b, &a, method, &limits).unwrap();
            assert_eq!(back.len(), want.len());
        }
    }
    // Fewer listed than found: the first ones in path order, all counted.
    let few = Limits {
        changes: 10,
        ..tight()
    };
    let (changes, truncated, counts) = diff_trees_with(&a, &b, DiffMethod::Walk, &few).unwrap();
    assert!(truncated);
    assert_eq!(counts.iter().sum::<u64>() as usize, want.len());
    let first: Vec<String> = want.iter().take(10).map(|(p, _)| p.clone()).collect();
    let mut listed: Vec<String> = changes.iter().map(|c| c.path.clone()).collect();
    listed.sort();
    let mut first_sorted = first.clone();
    first_sorted.sort();
    assert_eq!(listed, first_sorted);
    // Past the read budget a file whose metadata differs is reported
    // modified without being read.
    let unread = Limits {
        read_bytes: 0,
        ..tight()
    };
    let (changes, _, _) = diff_trees_with(&a, &b, DiffMethod::Walk, &unread).unwrap();
    assert!(changes
        .iter()
        .any(|c| c.path == "sparse-same" && c.kind == ChangeKind::Modified));
    // Limits that cannot be met stop the diff with an error naming them.
    let shallow = Limits {
        depth: 40,
        ..tight()
    };
    let e = diff_trees_with(&a, &b, DiffMethod::Walk, &shallow).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
    assert!(e.to_string().contains("directory depth"), "{e}");
    let small = Limits {
        parts: 2,
        ..tight()
    };
    let e = diff_trees_with(&a, &b, DiffMethod::Walk, &small).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
    assert!(e.to_string().contains("names held"), "{e}");
}

/// What `diff -rq` says of two trees: the paths (relative) it names as
/// differing or present on one side only.
fn diff_rq(a: &Path, b: &Path) -> BTreeSet<String> {
    let out = std::process::Command::new("diff")
        .arg("-rq")
        .arg("--no-dereference")
        .arg(a)
        .arg(b)
        .output()
        .expect("run diff -rq");
    let text = String::from_utf8_lossy(&out.stdout);
    let rel = |p: &str| -> String {
        let p = Path::new(p.trim());
        p.strip_prefix(a)
            .or_else(|_| p.strip_prefix(b))
            .unwrap()
            .to_string_lossy()
            .into_owned()
    };
    text.lines()
        .filter_map(|l| {
            if let Some(rest) = l.strip_prefix("Files ") {
                let (x, _) = rest.split_once(" and ")?;
                Some(rel(x))
            } else if let Some(rest) = l.strip_prefix("Only in ") {
                let (dir, name) = rest.split_once(": ")?;
                Some(rel(&format!("{dir}/{name}")))
            } else {
                None
            }
        })
        .collect()
}

/// A change made to `current/` a moment before the diff — in place, by an
/// append, a truncation, through `mmap`, by a rename over, a hard link,
/// an extended attribute, a mode — is in the diff, whatever the
/// filesystem has written back yet. Each is checked against `diff -rq`
/// (and the brute-force comparison, which sees modes too).
#[test]
fn changes_to_current_are_seen_the_moment_they_are_made() {
    let Some((_fs, st)) = setup("diff::changes_to_current_are_seen_the_moment_they_are_made")
    else {
        return;
    };
    let cur = st.layout().current("a", "s");
    populate(&cur, 300).unwrap();
    type Change = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Change, &[&str])> = vec![
        (
            "in-place",
            Box::new(|f: &Path| {
                use std::os::unix::fs::FileExt;
                let h = std::fs::File::options().write(true).open(f).unwrap();
                h.write_all_at(b"XY", 3).unwrap();
            }),
            &["f"],
        ),
        (
            "append",
            Box::new(|f: &Path| {
                use std::io::Write;
                let mut h = std::fs::File::options().append(true).open(f).unwrap();
                h.write_all(b"z\n").unwrap();
            }),
            &["f"],
        ),
        (
            "truncate",
            Box::new(|f: &Path| {
                std::fs::File::options()
                    .write(true)
                    .open(f)
                    .unwrap()
                    .set_len(2)
                    .unwrap();
            }),
            &["f"],
        ),
        (
            "mmap",
            Box::new(|f: &Path| {
                let ok = std::process::Command::new("python3")
                    .arg("-c")
                    .arg("import mmap,sys\nf=open(sys.argv[1],'r+b')\nm=mmap.mmap(f.fileno(),0)\nm[0:2]=b'MM'\nm.close()")
                    .arg(f)
                    .status()
                    .unwrap();
                assert!(ok.success());
            }),
            &["f"],
        ),
        (
            "rename-over",
            Box::new(|f: &Path| {
                let t = f.with_file_name("f.new");
                std::fs::write(&t, "replaced content\n").unwrap();
                std::fs::rename(&t, f).unwrap();
            }),
            &["f"],
        ),
        (
            "hard-link",
            Box::new(|f: &Path| std::fs::hard_link(f, f.with_file_name("f2")).unwrap()),
            &["f2"],
        ),
        (
            "xattr",
            Box::new(|f: &Path| {
                rustix::fs::setxattr(f, "user.note", b"agent", rustix::fs::XattrFlags::empty())
                    .unwrap()
            }),
            &["f"],
        ),
        (
            "mode",
            Box::new(|f: &Path| {
                std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o751)).unwrap()
            }),
            &["f"],
        ),
    ];
    let l = st.layout().clone();
    for (i, (name, change, want)) in cases.iter().enumerate() {
        let dir = cur.join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("f"), "original content\n").unwrap();
        let base = format!("before-{i}");
        ck(&st, &base);
        change(&dir.join("f"));
        let d = diff(&st, &base, "current");
        let want: BTreeSet<String> = want.iter().map(|w| format!("{name}/{w}")).collect();
        let listed: BTreeSet<String> = got(&d).into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            listed, want,
            "{name}: the diff of current right after the change"
        );
        let ckpt = l.checkpoint("a", "s", &base);
        let brute_paths: BTreeSet<String> =
            brute(&ckpt, &cur).into_iter().map(|(p, _)| p).collect();
        let rq = diff_rq(&ckpt, &cur);
        match *name {
            // Only metadata changed: diff -rq sees no difference.
            "xattr" | "mode" => assert!(rq.is_empty(), "{name}: {rq:?}"),
            _ => assert_eq!(rq, want, "{name}: diff -rq"),
        }
        if *name != "xattr" {
            assert_eq!(brute_paths, want, "{name}: brute force");
        }
    }
}

#[test]
fn a_directory_s_attributes_and_owner_are_compared_as_a_file_s() {
    let Some((_fs, st)) =
        setup("diff::a_directory_s_attributes_and_owner_are_compared_as_a_file_s")
    else {
        return;
    };
    let cur = st.layout().current("a", "s");
    for d in ["xattr", "removed", "owner", "untouched", "withfile"] {
        std::fs::create_dir(cur.join(d)).unwrap();
    }
    let set = |d: &str, name: &str, v: &[u8]| {
        rustix::fs::setxattr(cur.join(d), name, v, rustix::fs::XattrFlags::empty()).unwrap()
    };
    set("removed", "user.note", b"x");
    ck(&st, "c0");
    // An attribute set, one removed, an owner changed; a file made in a
    // directory (its ctime moves, nothing of its own changes).
    set("xattr", "user.note", b"1");
    rustix::fs::removexattr(cur.join("removed"), "user.note").unwrap();
    std::os::unix::fs::chown(cur.join("owner"), Some(12345), Some(12345)).unwrap();
    std::fs::write(cur.join("withfile/new"), b"n").unwrap();
    let want: BTreeSet<(String, ChangeKind)> = [
        ("xattr", ChangeKind::Modified),
        ("removed", ChangeKind::Modified),
        ("owner", ChangeKind::Modified),
        ("withfile/new", ChangeKind::Added),
    ]
    .into_iter()
    .map(|(p, k)| (p.to_string(), k))
    .collect();
    assert_eq!(got(&diff(&st, "c0", "current")), want);
    ck(&st, "c1");
    assert_eq!(got(&diff(&st, "c0", "c1")), want);
    // The same attribute set again, its value changed.
    set("xattr", "user.note", b"2");
    assert_eq!(
        got(&diff(&st, "c1", "current")),
        [("xattr".to_string(), ChangeKind::Modified)].into()
    );
}

#[test]
fn a_change_of_the_workspace_s_root_itself_is_listed_as_dot() {
    let Some((_fs, st)) = setup("diff::a_change_of_the_workspace_s_root_itself_is_listed_as_dot")
    else {
        return;
    };
    let cur = st.layout().current("a", "s");
    std::fs::write(cur.join("f"), b"1").unwrap();
    ck(&st, "c0");
    // A file added at the top (the root's times move): only the file.
    std::fs::write(cur.join("g"), b"2").unwrap();
    assert_eq!(
        got(&diff(&st, "c0", "current")),
        [("g".to_string(), ChangeKind::Added)].into()
    );
    ck(&st, "c1");
    // The root's mode, then an attribute of it.
    let mode = std::fs::metadata(&cur).unwrap().permissions().mode();
    std::fs::set_permissions(&cur, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_eq!(
        got(&diff(&st, "c1", "current")),
        [(".".to_string(), ChangeKind::Modified)].into()
    );
    std::fs::set_permissions(&cur, std::fs::Permissions::from_mode(mode)).unwrap();
    assert!(got(&diff(&st, "c1", "current")).is_empty());
    rustix::fs::setxattr(&cur, "user.note", b"x", rustix::fs::XattrFlags::empty()).unwrap();
    ck(&st, "c2");
    assert_eq!(
        got(&diff(&st, "c1", "c2")),
        [(".".to_string(), ChangeKind::Modified)].into()
    );
}

#[test]
fn a_file_listed_past_the_read_budget_says_it_was_not_read() {
    if !require("diff::a_file_listed_past_the_read_budget_says_it_was_not_read") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for d in [&a, &b] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("touched"), vec![7u8; 1 << 20]).unwrap();
    }
    std::fs::write(a.join("grown"), b"1").unwrap();
    std::fs::write(b.join("grown"), b"12").unwrap();
    // The same bytes, another modification time: only reading tells.
    let t = std::fs::File::options()
        .write(true)
        .open(b.join("touched"))
        .unwrap();
    t.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000))
        .unwrap();
    let listed = |read_bytes: u64| -> Vec<(String, bool)> {
        let limits = allox_store::diff::Limits {
            read_bytes,
            ..Default::default()
        };
        allox_store::diff::compare(&a, &b, allox_store::diff::DiffMethod::Walk, &limits, false)
            .unwrap()
            .changes
            .iter()
            .map(|c| (c.path.clone(), c.unread))
            .collect()
    };
    // Within the budget: the touched file is read, and is the same.
    assert_eq!(listed(64 << 20), [("grown".to_string(), false)]);
    // Past it: listed, and said not to have been read.
    assert_eq!(
        listed(0),
        [("grown".to_string(), false), ("touched".to_string(), true)]
    );
}
