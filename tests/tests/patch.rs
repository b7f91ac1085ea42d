//! `checkpoint.diff {patch: true}` and `alloxctl diff --patch` through the
//! daemon: each text file's hunks against `diff -u` of the two trees'
//! copies, the binary note, symlinks, and the answer's bounds.

use allox_integration::{alloxctl, Daemon};
use allox_protocol::*;
use allox_store::layout::Layout;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::process::Command;

fn ok(d: &Daemon, r: Request) -> Response {
    d.client()
        .call(r)
        .expect("transport")
        .unwrap_or_else(|e| panic!("{e:?}"))
}

fn checkpoint(d: &Daemon, c: &str) {
    ok(
        d,
        Request::CheckpointCreate(CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: c.into(),
            pinned: false,
            label: None,
        }),
    );
}

fn diff(d: &Daemon, from: &str, to: &str) -> DiffListing {
    match ok(
        d,
        Request::CheckpointDiff(CheckpointDiff {
            agent_id: "a".into(),
            session_id: "s".into(),
            from: from.into(),
            to: to.into(),
            patch: true,
        }),
    ) {
        Response::Diff(l) => l,
        other => panic!("{other:?}"),
    }
}

fn write(root: &Path, p: &str, data: impl AsRef<[u8]>) {
    let p = root.join(p);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

fn numbered(n: usize, word: &str) -> String {
    (1..=n).map(|i| format!("{word} {i}\n")).collect()
}

/// The hunks of a unified diff: everything from its first `@@` line.
fn hunks(patch: &str) -> &str {
    if patch.starts_with("@@ ") {
        return patch;
    }
    patch.find("\n@@ ").map_or("", |i| &patch[i + 1..])
}

/// `diff -u` of two files, `None` standing for `/dev/null`.
fn diff_u(a: Option<&Path>, b: Option<&Path>) -> String {
    let null = Path::new("/dev/null");
    let out = Command::new("diff")
        .arg("-u")
        .arg(a.unwrap_or(null))
        .arg(b.unwrap_or(null))
        .output()
        .expect("run diff");
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "diff -u: {out:?}"
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn patches_match_diff_u_and_stay_within_the_answer() {
    let Some((_fs, d)) = Daemon::on_new_store("patch::patches_match_diff_u", &[]) else {
        return;
    };
    ok(&d, Request::AgentCreate(AgentCreate::new("a")));
    ok(&d, Request::SessionCreate(SessionCreate::new("a", "s")));
    let l = Layout::new(&d.root);
    let cur = l.current("a", "s");
    // Before.
    write(&cur, "src/main.py", numbered(60, "print"));
    write(&cur, "src/lib.py", numbered(10, "def"));
    write(&cur, "notes.txt", "no newline at the end");
    write(&cur, "gone/old.txt", numbered(5, "old"));
    write(&cur, "data.bin", b"\x00\x01\x02 binary");
    write(&cur, "run.sh", "#!/bin/sh\necho hi\n");
    write(&cur, "big-edit.txt", numbered(100_000, "row"));
    write(&cur, "too-big.txt", numbered(600_000, "row"));
    symlink("src/lib.py", cur.join("link")).unwrap();
    checkpoint(&d, "before");
    // Text edits in several places (hunks apart and merged), additions,
    // deletions, a binary change, a new link target, a mode change.
    let main = numbered(60, "print")
        .replace("print 3\n", "print three\n")
        .replace("print 9\n", "")
        .replace("print 40\n", "print 40\nprint 40.5\n")
        .replace("print 60\n", "print sixty");
    write(&cur, "src/main.py", main);
    write(
        &cur,
        "src/lib.py",
        numbered(10, "def").replace("def 5\n", "def five\n"),
    );
    write(&cur, "notes.txt", "no newline at the end, still\n");
    std::fs::remove_dir_all(cur.join("gone")).unwrap();
    write(&cur, "new/module.py", numbered(4, "added"));
    write(&cur, "new/empty", "");
    write(&cur, "data.bin", b"\x00\x01\x03 binary");
    write(&cur, "new/blob", b"\xff\xfe\x00");
    std::fs::set_permissions(cur.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::remove_file(cur.join("link")).unwrap();
    symlink("src/main.py", cur.join("link")).unwrap();
    write(
        &cur,
        "big-edit.txt",
        numbered(100_000, "row").replace("row 77777\n", "row 77777 changed\n"),
    );
    write(
        &cur,
        "too-big.txt",
        numbered(600_000, "row").replace("row 5\n", "row five\n"),
    );
    // Added files of 200 KiB each, last in path order: each patch is cut
    // at 64 KiB, and together they are more than the answer holds.
    for i in 0..12 {
        write(
            &cur,
            &format!("z-huge/{i:02}.txt"),
            numbered(20_000, "line"),
        );
    }
    checkpoint(&d, "after");
    let (before, after) = (
        l.checkpoint("a", "s", "before"),
        l.checkpoint("a", "s", "after"),
    );

    let listing = diff(&d, "before", "after");
    let change = |p: &str| {
        listing
            .changes
            .iter()
            .find(|c| c.path == p)
            .unwrap_or_else(|| panic!("{p} not in {:?}", listing.changes))
    };
    // Every text file's hunks are those of `diff -u` of its two copies.
    for (p, old, new) in [
        ("src/main.py", true, true),
        ("src/lib.py", true, true),
        ("notes.txt", true, true),
        ("big-edit.txt", true, true),
        ("gone/old.txt", true, false),
        ("new/module.py", false, true),
    ] {
        let c = change(p);
        let patch = c
            .patch
            .as_deref()
            .unwrap_or_else(|| panic!("{p}: no patch"));
        assert!(!c.patch_truncated, "{p}");
        let want = diff_u(
            old.then(|| before.join(p)).as_deref(),
            new.then(|| after.join(p)).as_deref(),
        );
        assert!(!hunks(&want).is_empty(), "{p}");
        assert_eq!(hunks(patch), hunks(&want), "{p}");
        let (a, b) = (
            if old {
                format!("a/{p}")
            } else {
                "/dev/null".into()
            },
            if new {
                format!("b/{p}")
            } else {
                "/dev/null".into()
            },
        );
        assert!(
            patch.starts_with(&format!("diff --git a/{p} b/{p}\n"))
                && patch.contains(&format!("\n--- {a}\n+++ {b}\n@@ ")),
            "{p}: {patch}"
        );
    }
    assert_eq!(
        change("src/main.py")
            .patch
            .as_ref()
            .unwrap()
            .matches("\n@@ ")
            .count(),
        3
    );
    assert!(change("new/module.py")
        .patch
        .as_ref()
        .unwrap()
        .contains("\nnew file mode 100644\n"));
    assert!(change("gone/old.txt")
        .patch
        .as_ref()
        .unwrap()
        .contains("\ndeleted file mode 100644\n"));
    // Binary files: the note.
    assert_eq!(
        change("data.bin").patch.as_deref(),
        Some("diff --git a/data.bin b/data.bin\nBinary files a/data.bin and b/data.bin differ\n")
    );
    assert_eq!(
        change("new/blob").patch.as_deref(),
        Some(
            "diff --git a/new/blob b/new/blob\nnew file mode 100644\n\
             Binary files /dev/null and b/new/blob differ\n"
        )
    );
    // A mode change, an empty file, a symlink's target, directories.
    assert_eq!(
        change("run.sh").patch.as_deref(),
        Some("diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n")
    );
    assert_eq!(
        change("new/empty").patch.as_deref(),
        Some("diff --git a/new/empty b/new/empty\nnew file mode 100644\n")
    );
    assert_eq!(
        change("link").patch.as_deref(),
        Some(
            "diff --git a/link b/link\n--- a/link\n+++ b/link\n@@ -1 +1 @@\n-src/lib.py\n\
             \\ No newline at end of file\n+src/main.py\n\\ No newline at end of file\n"
        )
    );
    assert_eq!(change("new").patch, None);
    assert_eq!(change("gone").patch, None);
    // Too large to compare line by line: its header, cut.
    let too_big = change("too-big.txt");
    assert_eq!(
        (too_big.patch.as_deref(), too_big.patch_truncated),
        (Some("diff --git a/too-big.txt b/too-big.txt\n"), true)
    );
    // The huge additions: in path order, each cut at 64 KiB to whole
    // lines of `diff -u`'s first hunk, until the answer's 512 KiB of
    // patches are spent; the rest left out; all of it said.
    assert!(listing.patch_truncated);
    let huge: Vec<&Change> = listing
        .changes
        .iter()
        .filter(|c| c.path.starts_with("z-huge/") && c.size_after.is_some())
        .collect();
    assert_eq!(huge.len(), 12);
    assert!(huge.iter().all(|c| c.patch_truncated));
    let shown: Vec<&str> = huge.iter().filter_map(|c| c.patch.as_deref()).collect();
    assert!((5..12).contains(&shown.len()), "{}", shown.len());
    assert!(huge[shown.len()..].iter().all(|c| c.patch.is_none()));
    let whole = diff_u(None, Some(&after.join("z-huge/00.txt")));
    for p in &shown {
        assert!(p.len() <= 64 << 10, "{}", p.len());
        let h = hunks(p);
        let (head, body) = h.split_once('\n').unwrap();
        assert_eq!(head, format!("@@ -0,0 +1,{} @@", body.lines().count()));
        assert!(hunks(&whole).split_once('\n').unwrap().1.starts_with(body));
    }
    let total: usize = listing
        .changes
        .iter()
        .filter_map(|c| c.patch.as_ref())
        .map(String::len)
        .sum();
    assert!(total <= 512 << 10 && total > 400 << 10, "{total}");
    // It came in one frame; encoded again, it still fits one.
    let frame = encode(&ServerFrame::Response(ResponseEnvelope {
        conversation: 1,
        request_id: 1,
        outcome: Outcome::Ok(Response::Diff(listing.clone())),
    }))
    .expect("fits one frame");
    assert!(frame.len() <= MAX_FRAME);

    // alloxctl: the summary, then the patches as the API gives them.
    let (code, out, err) = alloxctl(&d.socket, &["diff", "a", "s", "before", "after", "--patch"]);
    assert_eq!(code, 0, "{err}");
    let out = String::from_utf8(out).unwrap();
    let summary = out.find(" before -> after: ").expect("summary");
    for p in [
        "src/main.py",
        "src/lib.py",
        "new/module.py",
        "data.bin",
        "link",
    ] {
        let patch = change(p).patch.as_deref().unwrap();
        let at = out
            .find(patch)
            .unwrap_or_else(|| panic!("{p} not in {out}"));
        assert!(at > summary, "{p}");
    }
    assert!(out.contains("... (the patch of too-big.txt is cut here to fit the answer)\n"));
    assert!(out.contains("... (the patch of z-huge/00.txt is cut here to fit the answer)\n"));
    assert!(out.contains(&format!(
        "... (no patch for {} more changed files: an answer holds at most 512 KiB of patches)",
        12 - shown.len()
    )));
    // Without --patch, the summary alone.
    let (_, plain, _) = alloxctl(&d.socket, &["diff", "a", "s", "before", "after"]);
    let plain = String::from_utf8(plain).unwrap();
    assert!(!plain.contains("diff --git") && plain.contains(" M src/main.py"));
    // --json carries them.
    let (code, json, err) = alloxctl(
        &d.socket,
        &["--json", "diff", "a", "s", "before", "after", "--patch"],
    );
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let from_json: DiffListing = serde_json::from_value(json).unwrap();
    assert_eq!(from_json, listing);

    // Against current/, changed the moment before.
    write(&cur, "src/lib.py", "rewritten\n");
    let live = diff(&d, "after", "current");
    let c = live
        .changes
        .iter()
        .find(|c| c.path == "src/lib.py")
        .unwrap();
    assert_eq!(
        hunks(c.patch.as_deref().unwrap()),
        hunks(&diff_u(
            Some(&after.join("src/lib.py")),
            Some(&cur.join("src/lib.py"))
        ))
    );
}
