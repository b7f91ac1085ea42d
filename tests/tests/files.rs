//! The file API through the real daemon on a real Btrfs store: files copied
//! in and out with `alloxctl cp` and with curl through the gateway, read
//! from a checkpoint, never outside their scope whatever a program in the
//! sandbox plants or swaps, uploads cut short, and writes racing
//! rollbacks.

use allox_integration::{call, process_start as start, require, workspace_bin, ProcDaemon};
use allox_protocol::*;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn ctl(d: &ProcDaemon, args: &[&str]) -> (i32, Vec<u8>, String) {
    allox_integration::alloxctl(&d.daemon.socket, args)
}

fn ctl_ok(d: &ProcDaemon, args: &[&str]) -> Vec<u8> {
    let (code, out, err) = ctl(d, args);
    assert_eq!(code, 0, "alloxctl {args:?}: {err}");
    out
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

fn setup(name: &str, extra: &[&str], size_mb: u64) -> Option<ProcDaemon> {
    if !require(&format!("files::{name}")) {
        return None;
    }
    let d = ProcDaemon::start_on(name, extra, size_mb);
    ctl_ok(&d, &["agent", "create", "a"]);
    ctl_ok(&d, &["session", "create", "a", "s"]);
    Some(d)
}

fn current(d: &ProcDaemon) -> PathBuf {
    d.daemon.root.join("agents/a/workspace/sessions/s/current")
}

fn read(d: &ProcDaemon, path: &str) -> Result<Vec<u8>, ErrorBody> {
    call(
        d,
        Request::FsRead(FsRead {
            agent_id: "a".into(),
            session_id: "s".into(),
            scope: FsScope::Session,
            checkpoint_id: None,
            path: path.into(),
            offset: None,
            length: None,
        }),
    )
    .map(|r| match r {
        Response::FsData(x) => x.data.0,
        other => panic!("{other:?}"),
    })
}

fn sha256(p: &Path) -> String {
    let out = Command::new("sha256sum").arg(p).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn files_go_in_and_out_byte_for_byte_and_as_they_were_at_a_checkpoint() {
    let Some(d) = setup("files_in_and_out", &[], 4096) else {
        return;
    };
    // A project with every byte value, nested directories and an empty
    // file, copied in.
    let src = tempfile::tempdir().unwrap();
    let all: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    std::fs::create_dir_all(src.path().join("proj/src/deep")).unwrap();
    std::fs::write(src.path().join("proj/bytes.bin"), &all).unwrap();
    std::fs::write(src.path().join("proj/src/main.py"), "print('hi')\n").unwrap();
    std::fs::write(src.path().join("proj/src/deep/empty"), "").unwrap();
    let out = ctl_ok(
        &d,
        &["cp", src.path().join("proj").to_str().unwrap(), "a/s:proj"],
    );
    assert_eq!(String::from_utf8_lossy(&out), "3 files, 300012 bytes\n");
    // As the sandbox sees it, and owned by its user.
    let r = sh(
        &d,
        "cat proj/src/main.py; id -u; stat -c %u proj/bytes.bin proj/src/deep",
    );
    assert_eq!(r.stdout, "print('hi')\n10000\n10000\n10000\n", "{r:?}");
    assert_eq!(ctl_ok(&d, &["fs", "cat", "a", "s", "proj/bytes.bin"]), all);
    let ls = String::from_utf8_lossy(&ctl_ok(&d, &["fs", "ls", "a", "s", "proj", "--depth", "3"]))
        .into_owned();
    for p in ["proj/bytes.bin", "proj/src/main.py", "proj/src/deep/empty"] {
        assert!(ls.contains(p), "{p} missing: {ls}");
    }
    // And back out.
    let back = tempfile::tempdir().unwrap();
    ctl_ok(
        &d,
        &["cp", "a/s:proj", back.path().join("p").to_str().unwrap()],
    );
    assert_eq!(std::fs::read(back.path().join("p/bytes.bin")).unwrap(), all);
    assert_eq!(
        std::fs::read(back.path().join("p/src/deep/empty")).unwrap(),
        b""
    );

    // A file as it was at a checkpoint, after the live one changed.
    ctl_ok(&d, &["checkpoint", "create", "a", "s", "c1"]);
    sh(&d, "echo changed > proj/src/main.py; rm proj/bytes.bin");
    assert_eq!(read(&d, "proj/src/main.py").unwrap(), b"changed\n");
    assert_eq!(
        ctl_ok(
            &d,
            &[
                "fs",
                "cat",
                "a",
                "s",
                "proj/src/main.py",
                "--checkpoint",
                "c1"
            ]
        ),
        b"print('hi')\n"
    );
    let old = tempfile::tempdir().unwrap();
    ctl_ok(
        &d,
        &[
            "cp",
            "--checkpoint",
            "c1",
            "a/s:proj/bytes.bin",
            old.path().join("b").to_str().unwrap(),
        ],
    );
    assert_eq!(std::fs::read(old.path().join("b")).unwrap(), all);
    // A checkpoint that is not there, and one cannot be written into.
    let (code, _, err) = ctl(&d, &["fs", "cat", "a", "s", "x", "--checkpoint", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("not_found") && err.contains("nope"), "{err}");

    // The agent's shared/.
    ctl_ok(
        &d,
        &["fs", "mkdir", "a", "s", "--shared", "-p", "notes/today"],
    );
    let w = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(w.path(), "shared note\n").unwrap();
    ctl_ok(
        &d,
        &[
            "cp",
            "--shared",
            w.path().to_str().unwrap(),
            "a/s:notes/today/n.txt",
        ],
    );
    let r = sh(&d, "cat /allox/shared/notes/today/n.txt");
    assert_eq!(r.stdout, "shared note\n", "{r:?}");

    // Moves and removals.
    ctl_ok(&d, &["fs", "mv", "a", "s", "proj/src", "src2"]);
    ctl_ok(&d, &["fs", "rm", "a", "s", "-r", "src2"]);
    call(
        &d,
        Request::FsWrite(FsWrite::whole("a", "s", "proj/keep", "k")),
    )
    .unwrap();
    let (code, _, err) = ctl(&d, &["fs", "rm", "a", "s", "proj"]);
    assert_eq!(code, 1, "a directory with files went without -r");
    assert!(err.contains("conflict"), "{err}");
    assert!(!current(&d).join("src2").exists());

    // A 1 GiB file round-trips with the same sha256.
    let big = tempfile::tempdir_in("/var/tmp").unwrap();
    let f = big.path().join("big");
    let st = Command::new("dd")
        .args(["if=/dev/urandom", "bs=1M", "count=1024", "status=none"])
        .arg(format!("of={}", f.display()))
        .status()
        .unwrap();
    assert!(st.success());
    let t = Instant::now();
    ctl_ok(&d, &["cp", f.to_str().unwrap(), "a/s:big"]);
    let up = t.elapsed();
    let t = Instant::now();
    ctl_ok(
        &d,
        &["cp", "a/s:big", big.path().join("back").to_str().unwrap()],
    );
    eprintln!("1 GiB up {up:?}, down {:?}", t.elapsed());
    assert_eq!(sha256(&f), sha256(&current(&d).join("big")));
    assert_eq!(sha256(&f), sha256(&big.path().join("back")));
}

/// A request the file system cannot do is the client's mistake, said as
/// such and naming what is in the way: a directory moved into itself, a
/// file moved onto a directory, a directory that is not empty, a name too
/// long, a write past the largest file. (Before: `internal`, "exists",
/// or the wrong path named.)
#[test]
fn file_api_refusals_name_what_is_in_the_way() {
    let Some(d) = setup("refusals_name_what_is_in_the_way", &[], 512) else {
        return;
    };
    let r = sh(
        &d,
        "mkdir -p d2/sub e2 full && echo x > file && echo y > full/y",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let mv = |from: &str, to: &str| {
        call(
            &d,
            Request::FsMove(FsMove {
                agent_id: "a".into(),
                session_id: "s".into(),
                scope: FsScope::Session,
                path: from.into(),
                to: to.into(),
            }),
        )
        .expect_err("refused")
    };
    let want = |e: ErrorBody, code: ErrorCode, says: &[&str]| {
        assert_eq!(e.code, code, "{e:?}");
        for w in says {
            assert!(e.message.contains(w), "{w:?} not in {e:?}");
        }
    };
    want(
        mv("d2", "d2/sub/inner"),
        ErrorCode::InvalidRequest,
        &["\"d2\"", "cannot be moved"],
    );
    want(
        mv("file", "e2"),
        ErrorCode::InvalidRequest,
        &["\"e2\"", "directory"],
    );
    want(
        mv("d2", "full"),
        ErrorCode::Conflict,
        &["\"full\"", "not empty"],
    );
    let rm = call(
        &d,
        Request::FsRemove(FsRemove {
            agent_id: "a".into(),
            session_id: "s".into(),
            scope: FsScope::Session,
            path: "full".into(),
            recursive: false,
        }),
    )
    .expect_err("not empty");
    want(
        rm,
        ErrorCode::Conflict,
        &["\"full\"", "not empty", "recursive"],
    );
    let long = "n".repeat(256);
    let mk = call(
        &d,
        Request::FsMkdir(FsMkdir {
            agent_id: "a".into(),
            session_id: "s".into(),
            scope: FsScope::Session,
            path: long.clone(),
            parents: true,
        }),
    )
    .expect_err("too long");
    want(mk, ErrorCode::InvalidRequest, &["longer than"]);
    let far = call(
        &d,
        Request::FsWrite(FsWrite {
            offset: Some(i64::MAX as u64),
            ..FsWrite::whole("a", "s", "file", "z")
        }),
    )
    .expect_err("past the largest file");
    want(far, ErrorCode::InvalidRequest, &["\"file\"", "offset"]);
    // Nothing moved or removed.
    let cur = current(&d);
    for p in ["d2/sub", "e2", "file", "full/y"] {
        assert!(cur.join(p).exists(), "{p}");
    }
}

/// `alloxctl cp` of trees that met the protocol's bounds badly before:
/// out of a session, a tree deeper than one listing's 64 levels comes out
/// whole (its deepest file was dropped, and cp said it was done), and so
/// does a file whose name has 255 bytes; into
/// one, a tree holding names that are not UTF-8 is refused before
/// anything is copied (two such names became one in the session, the
/// last file over the others).
#[test]
fn cp_copies_deep_trees_whole_and_refuses_names_a_session_cannot_hold() {
    let Some(d) = setup("cp_deep_and_unnameable", &[], 1024) else {
        return;
    };
    let cur = current(&d);
    let deep: PathBuf = std::iter::repeat_n("d", 80).collect();
    std::fs::create_dir_all(cur.join("top").join(&deep)).unwrap();
    std::fs::write(cur.join("top").join(&deep).join("leaf"), b"leaf\n").unwrap();
    std::fs::write(cur.join("top/shallow"), b"shallow\n").unwrap();
    // A name of the 255 bytes a name may have (its partial file's name
    // was too long before, and the copy failed on it).
    let long = "n".repeat(255);
    std::fs::write(cur.join("top").join(&long), b"long\n").unwrap();
    let out = tempfile::tempdir_in("/var/tmp").unwrap();
    for (args, at) in [
        (vec!["cp", "a/s:top"], "live"),
        (vec!["cp", "--checkpoint", "c1", "a/s:top"], "checkpoint"),
        // The same tree named another way: each file once.
        (vec!["cp", "a/s:./top/"], "named-otherwise"),
    ] {
        if at == "checkpoint" {
            ctl_ok(&d, &["checkpoint", "create", "a", "s", "c1"]);
        }
        let dst = out.path().join(at);
        let mut args = args;
        let dst_s = dst.display().to_string();
        args.push(&dst_s);
        let said = String::from_utf8_lossy(&ctl_ok(&d, &args)).into_owned();
        assert_eq!(
            std::fs::read(dst.join(&deep).join("leaf")).unwrap_or_default(),
            b"leaf\n",
            "{at}: the deepest file did not come out ({said})"
        );
        assert_eq!(std::fs::read(dst.join("shallow")).unwrap(), b"shallow\n");
        assert_eq!(std::fs::read(dst.join(&long)).unwrap(), b"long\n");
        assert!(said.contains("3 files"), "{at}: {said}");
    }
    // Names that are not UTF-8: refused, nothing made in the session.
    use std::os::unix::ffi::OsStrExt;
    let local = out.path().join("odd");
    std::fs::create_dir_all(local.join("fine")).unwrap();
    std::fs::write(local.join("fine/ok"), b"ok").unwrap();
    for (name, body) in [(&b"n\x80"[..], "first"), (&b"n\x81"[..], "second")] {
        std::fs::write(
            local.join("fine").join(std::ffi::OsStr::from_bytes(name)),
            body,
        )
        .unwrap();
    }
    let (code, _, err) = ctl(&d, &["cp", local.to_str().unwrap(), "a/s:odd"]);
    assert_ne!(code, 0, "copied: {err}");
    assert!(
        err.contains("not UTF-8") && err.contains("nothing was copied"),
        "{err}"
    );
    assert!(!cur.join("odd").exists(), "something was copied");
    // Control: the same tree without them is copied whole.
    for name in [&b"n\x80"[..], &b"n\x81"[..]] {
        std::fs::remove_file(local.join("fine").join(std::ffi::OsStr::from_bytes(name))).unwrap();
    }
    ctl_ok(&d, &["cp", local.to_str().unwrap(), "a/s:odd"]);
    assert_eq!(std::fs::read(cur.join("odd/fine/ok")).unwrap(), b"ok");
}

/// A sparse file of 1 GiB holding 11 bytes: what `path` must be after a
/// copy, its holes included.
fn sparse(path: &Path) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::create(path).unwrap();
    f.set_len(1 << 30).unwrap();
    f.write_all_at(b"head", 0).unwrap();
    f.write_all_at(b"middle", 500_000_000).unwrap();
}

/// Whether `path` is [`sparse`]'s file: its size, its bytes where they
/// were written (and zeros beside them), and no more than 1 MiB of disk.
fn is_sparse_copy(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let m = f.metadata().unwrap();
    let at = |off: u64, n: usize| {
        let mut b = vec![0xffu8; n];
        f.read_exact_at(&mut b, off).map(|()| b).unwrap_or_default()
    };
    let (head, mid, last) = (at(0, 8), at(499_999_998, 10), at((1 << 30) - 4, 4));
    if m.len() != 1 << 30 || head != b"head\0\0\0\0" || mid != b"\0\0middle\0\0" || last != [0; 4] {
        return Err(format!(
            "{}: size {}, {head:?} {mid:?} {last:?}",
            path.display(),
            m.len()
        ));
    }
    let disk = m.blocks() * 512;
    if disk > 1 << 20 {
        return Err(format!(
            "{}: its holes were filled: {disk} bytes on disk",
            path.display()
        ));
    }
    Ok(())
}

/// `alloxctl cp` keeps a sparse file sparse both ways (an agent's 1 GiB
/// file of a few bytes is not a gigabyte on the host, nor one on the
/// store), whatever the filesystem on the other side.
#[test]
fn cp_keeps_a_sparse_file_sparse_both_ways() {
    let Some(d) = setup("cp_sparse", &[], 1024) else {
        return;
    };
    let cur = current(&d);
    sparse(&cur.join("sparse"));
    is_sparse_copy(&cur.join("sparse")).expect("the test's own file");
    let out = tempfile::tempdir_in("/var/tmp").unwrap();
    for (i, from) in ["a/s:sparse", "--checkpoint"].into_iter().enumerate() {
        let dst = out.path().join(format!("out-{i}"));
        let dst_s = dst.display().to_string();
        let args: Vec<&str> = if from == "--checkpoint" {
            ctl_ok(&d, &["checkpoint", "create", "a", "s", "c1"]);
            vec!["cp", "--checkpoint", "c1", "a/s:sparse", &dst_s]
        } else {
            vec!["cp", from, &dst_s]
        };
        ctl_ok(&d, &args);
        if let Err(e) = is_sparse_copy(&dst) {
            panic!("out of the session ({from}): {e}");
        }
    }
    // Into the session: from the host's filesystem, and onto a file that
    // was there.
    let local = out.path().join("local");
    sparse(&local);
    for to in ["back", "sparse"] {
        ctl_ok(&d, &["cp", local.to_str().unwrap(), &format!("a/s:{to}")]);
        if let Err(e) = is_sparse_copy(&cur.join(to)) {
            panic!("into the session ({to}): {e}");
        }
    }
    // A file that is all hole stays all hole.
    std::fs::File::create(cur.join("holes"))
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let holes = out.path().join("holes");
    ctl_ok(&d, &["cp", "a/s:holes", holes.to_str().unwrap()]);
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&holes).unwrap();
        assert!(m.len() == 1 << 30 && m.blocks() == 0, "{m:?}");
    }
    // A local file that is not there: said once.
    let (code, _, err) = ctl(&d, &["cp", "/nonexistent-allox-file", "a/s:x"]);
    assert_ne!(code, 0);
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    // A file that is all data is copied whole (one extent).
    std::fs::write(&local, vec![7u8; 3 << 20]).unwrap();
    ctl_ok(&d, &["cp", local.to_str().unwrap(), "a/s:dense"]);
    assert_eq!(
        std::fs::read(cur.join("dense")).unwrap(),
        vec![7u8; 3 << 20]
    );
    let dense = out.path().join("dense");
    ctl_ok(&d, &["cp", "a/s:dense", dense.to_str().unwrap()]);
    assert_eq!(std::fs::read(&dense).unwrap(), vec![7u8; 3 << 20]);
}

#[test]
fn paths_never_leave_their_scope_whatever_the_sandbox_plants_or_swaps() {
    let Some(d) = setup("files_scope", &[], 1024) else {
        return;
    };
    // Something outside the session's files, beside them.
    let outside = d.daemon.root.join("agents/a/workspace/sessions/s/secret");
    std::fs::write(&outside, "SECRET").unwrap();
    std::fs::create_dir_all(current(&d).join("in")).unwrap();
    std::fs::write(current(&d).join("in/f"), "inside").unwrap();
    let r = sh(
        &d,
        "ln -s /etc abs; ln -s ../secret up; ln -s ../../../../../../.. far; \
         ln -s /proc/self/root magic; ln -s in/f ok",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    for (p, why) in [
        ("abs/passwd", "leads outside"),
        ("up", "leads outside"),
        ("far/etc/passwd", "leads outside"),
        ("magic/etc/passwd", "leads outside"),
        ("../secret", "`..`"),
        ("/etc/passwd", "absolute"),
        ("in/../../secret", "`..`"),
    ] {
        let e = read(&d, p).unwrap_err();
        assert!(e.message.contains(why), "{p}: {e:?}");
        assert_eq!(e.code, ErrorCode::InvalidRequest, "{p}: {e:?}");
    }
    // A link that stays inside is followed; stat shows a link as a link.
    assert_eq!(read(&d, "ok").unwrap(), b"inside");
    let st = String::from_utf8_lossy(&ctl_ok(&d, &["fs", "stat", "a", "s", "up"])).into_owned();
    assert!(
        st.starts_with('l') && st.contains("up -> ../secret"),
        "{st}"
    );
    // Writes through a planted link do not land outside either: the last
    // name is replaced, never followed.
    let w = call(
        &d,
        Request::FsWrite(FsWrite::whole("a", "s", "up", "replaced")),
    );
    assert!(w.is_ok(), "{w:?}");
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "SECRET");
    let e = call(
        &d,
        Request::FsWrite(FsWrite::whole("a", "s", "abs/passwd", "x")),
    )
    .unwrap_err();
    assert!(e.message.contains("leads outside"), "{e:?}");

    // A run swaps a directory for a link out of the scope, in a loop,
    // while the host lists and reads through it: never the secret.
    let swapper = ProcessStart {
        wait: false,
        ..start(
            "a",
            "s",
            &[
                "/bin/sh",
                "-c",
                "mkdir -p real && echo inside > real/f; \
                 while true; do mv real d 2>/dev/null; mv d real 2>/dev/null; \
                 ln -sfn ../ d 2>/dev/null; rm -f d; done",
            ],
        )
    };
    let run = match call(&d, Request::ProcessStart(swapper)) {
        Ok(Response::Started(s)) => s.run_id,
        other => panic!("{other:?}"),
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let (mut reads, mut lists) = (0, 0);
    while Instant::now() < deadline {
        if let Ok(b) = read(&d, "d/f") {
            assert_ne!(b, b"SECRET", "read outside the scope");
            reads += 1;
        }
        if let Ok(Response::FsListing(l)) = call(
            &d,
            Request::FsList(FsList {
                agent_id: "a".into(),
                session_id: "s".into(),
                scope: FsScope::Session,
                checkpoint_id: None,
                path: "d".into(),
                depth: Some(2),
            }),
        ) {
            assert!(
                l.entries.iter().all(|e| !e.path.contains("secret")),
                "listed outside the scope: {l:?}"
            );
            lists += 1;
        }
    }
    eprintln!("{reads} reads and {lists} listings while the run swapped");
    assert!(reads + lists > 0, "nothing was ever read");
    let _ = call(
        &d,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: Some(run),
            signal: None,
        }),
    );
}

#[test]
fn an_upload_cut_short_leaves_the_old_content_and_no_debris_after_a_restart() {
    let Some(mut d) = setup("files_cut_short", &[], 2048) else {
        return;
    };
    std::fs::write(current(&d).join("target"), "old content\n").unwrap();
    let big = tempfile::tempdir_in("/var/tmp").unwrap();
    let f = big.path().join("big");
    let st = Command::new("dd")
        .args(["if=/dev/urandom", "bs=1M", "count=512", "status=none"])
        .arg(format!("of={}", f.display()))
        .status()
        .unwrap();
    assert!(st.success());
    let mut cp = Command::new(workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(&d.daemon.socket)
        .args(["cp", "--framed", f.to_str().unwrap(), "a/s:target"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once the upload has begun (its partial file is there).
    let cur = current(&d);
    let partial = || {
        std::fs::read_dir(&cur).unwrap().flatten().any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".allox-upload-")
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !partial() {
        assert!(Instant::now() < deadline, "the upload never began");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    cp.kill().unwrap();
    let status = cp.wait().unwrap();
    assert!(!status.success(), "the copy finished before it was killed");
    assert_eq!(
        std::fs::read_to_string(cur.join("target")).unwrap(),
        "old content\n"
    );
    // An upload with a chunk missing is refused at its commit, and the
    // target keeps its content.
    let chunk = |offset: u64, data: &str, commit: bool| {
        Request::FsWrite(FsWrite {
            offset: Some(offset),
            upload: Some("gap".into()),
            commit,
            ..FsWrite::whole("a", "s", "target", data)
        })
    };
    call(&d, chunk(0, "aaaa", false)).unwrap();
    let e = call(&d, chunk(8, "cccc", true)).unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict, "{e:?}");
    assert!(
        e.message
            .contains("8 bytes came, but the upload ends at 12"),
        "{e:?}"
    );
    assert_eq!(read(&d, "target").unwrap(), b"old content\n");
    d.restart(&[]);
    assert!(!partial(), "the next start left the partial upload");
    assert_eq!(read(&d, "target").unwrap(), b"old content\n");
    let left: Vec<_> = std::fs::read_dir(d.daemon.root.join("state/uploads"))
        .map(|r| r.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "upload records left: {left:?}");
}

#[test]
fn a_write_and_a_rollback_never_interleave() {
    // Each write of the file API takes 1.5 s between its data and its
    // rename into place.
    let name = "a_write_and_a_rollback_never_interleave";
    if !require(&format!("files::{name}")) {
        return;
    }
    let d = ProcDaemon::start_with_env(
        name,
        &[("ALLOX_FAILPOINTS", "fs_write.before_commit=delay:1500")],
        &[],
    );
    ctl_ok(&d, &["agent", "create", "a"]);
    ctl_ok(&d, &["session", "create", "a", "s"]);
    ctl_ok(&d, &["checkpoint", "create", "a", "s", "empty"]);
    let socket = d.daemon.socket.clone();
    let t0 = Instant::now();
    let writer = std::thread::spawn(move || {
        let mut c = allox_ctl::client::Client::connect(&socket).unwrap();
        let sent = t0.elapsed();
        let r = c
            .call(Request::FsWrite(FsWrite::whole(
                "a", "s", "w.txt", "written",
            )))
            .unwrap();
        (r, sent)
    });
    // The rollback comes while the write is between its data and its
    // rename: it waits for the write, and a write that comes while it
    // works is refused.
    std::thread::sleep(Duration::from_millis(300));
    let socket = d.daemon.socket.clone();
    let rollback = std::thread::spawn(move || {
        let mut c = allox_ctl::client::Client::connect(&socket).unwrap();
        let r = c
            .call(Request::SessionRollback(SessionRollback {
                agent_id: "a".into(),
                session_id: "s".into(),
                checkpoint_id: "empty".into(),
                kill_processes: None,
            }))
            .unwrap();
        (r, t0.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    let late = call(
        &d,
        Request::FsWrite(FsWrite::whole("a", "s", "late.txt", "x")),
    );
    let (w, w_sent) = writer.join().unwrap();
    let (r, r_at) = rollback.join().unwrap();
    assert!(w.is_ok(), "{w:?}");
    assert!(r.is_ok(), "{r:?}");
    let e = late.unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict, "{e:?}");
    assert!(e.message.contains("rolled back or deleted"), "{e:?}");
    // The write was whole before the rollback began: the rollback ends
    // after it, and took it away with the rest (it came first). The
    // write cannot be whole before its delay has passed since it was
    // sent; a rollback that did not wait for it ends long before that.
    // (The two answers' arrival times are not compared: on a loaded
    // host the client thread that reads the write's answer may run
    // after the one that reads the rollback's.)
    let whole_at_least = w_sent + Duration::from_millis(1500);
    assert!(
        r_at >= whole_at_least,
        "the rollback ended at {r_at:?}, before the write (sent at {w_sent:?}) could be whole"
    );
    assert!(!current(&d).join("w.txt").exists());
    // Nothing half-made is left beside it.
    let debris: Vec<_> = std::fs::read_dir(current(&d))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(debris.is_empty(), "{debris:?}");
}

/// Watches are bounded, on a session and on the daemon, and refused
/// `unavailable` naming the flag: each takes one of root's few inotify
/// instances, which every root process of the machine shares (a client
/// opening 128 watches left systemd and `tail -f` without any, and the
/// next watch failed `internal` "Too many open files"). One that ends
/// gives its place back.
#[test]
fn watches_are_bounded_and_give_their_place_back() {
    let Some(d) = setup(
        "files_watch_budget",
        &["--watches", "3", "--watches-per-session", "2"],
        512,
    ) else {
        return;
    };
    ctl_ok(&d, &["session", "create", "a", "t"]);
    ctl_ok(&d, &["session", "create", "a", "u"]);
    let open = |s: &str| {
        let (w, mut lines) = allox_integration::alloxctl_following(
            &d.daemon.socket,
            &["--json", "fs", "watch", "a", s],
        );
        let l = lines.next().expect("the watch ended").unwrap();
        assert!(l.contains("\"ready\""), "{l}");
        (w, lines)
    };
    let refused = |s: &str| {
        let (code, _, err) = ctl(&d, &["fs", "watch", "a", s]);
        assert_ne!(code, 0);
        err
    };
    let try_open = |s: &str| {
        let out = Command::new(allox_integration::workspace_bin("alloxctl"))
            .arg("--socket")
            .arg(&d.daemon.socket)
            .args(["--json", "fs", "watch", "a", s])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        out
    };
    let mut held = vec![open("s"), open("s")];
    let err = refused("s");
    assert!(
        err.contains("unavailable")
            && err.contains("2 watches are open on session a/s")
            && err.contains("--watches-per-session 2"),
        "{err}"
    );
    held.push(open("t"));
    let err = refused("u");
    assert!(
        err.contains("unavailable") && err.contains("--watches 3"),
        "{err}"
    );
    // One ends: its place comes back at once (within a second or two, not
    // once its connection's answers have had their ten seconds).
    let (mut w, _) = held.remove(0);
    w.kill().unwrap();
    w.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let mut c = try_open("u");
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(c.stdout.take().unwrap()));
        match lines.next() {
            Some(Ok(l)) if l.contains("\"ready\"") => {
                let _ = c.kill();
                break;
            }
            _ => {
                let _ = c.wait();
                assert!(
                    Instant::now() < deadline,
                    "the ended watch's place never came back"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    for (mut w, _) in held {
        let _ = w.kill();
    }
}

type Lines = std::io::Lines<std::io::BufReader<std::process::ChildStdout>>;

/// A recursive `alloxctl --json fs watch a s` once it is in place: the
/// process and its lines.
fn watching(d: &ProcDaemon) -> (std::process::Child, Lines) {
    let (w, mut lines) = allox_integration::alloxctl_following(
        &d.daemon.socket,
        &["--json", "fs", "watch", "a", "s", "-r"],
    );
    assert_eq!(next_event(&mut lines)["change"], "ready");
    (w, lines)
}

/// A watch's next event.
fn next_event(lines: &mut Lines) -> serde_json::Value {
    let l = lines.next().expect("the watch ended").unwrap();
    serde_json::from_str(&l).unwrap()
}

/// A recursive watch past the directories it may cover (10,000) says so,
/// once, naming the first one left out (it went silently blind: writes in
/// later directories were never reported, the stream looking whole).
#[test]
fn a_watch_past_the_directories_it_may_cover_says_so() {
    let Some(d) = setup("files_watch_capped", &[], 1024) else {
        return;
    };
    let (mut w, mut lines) = watching(&d);
    let mut next = || next_event(&mut lines);
    let r = sh(
        &d,
        "mkdir deep && cd deep && python3 -c 'import os\nfor i in range(10050): os.mkdir(\"e%05d\" % i)'",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let t0 = Instant::now();
    let said = loop {
        let e = next();
        if e["change"] == "incomplete" {
            break e;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no incomplete event"
        );
    };
    assert!(
        said["path"].as_str().unwrap().starts_with("deep/e"),
        "{said}"
    );
    let _ = w.kill();
}

#[test]
fn a_watch_reports_a_run_s_changes_and_a_rollback() {
    let Some(d) = setup("files_watch", &[], 1024) else {
        return;
    };
    ctl_ok(&d, &["checkpoint", "create", "a", "s", "empty"]);
    let (mut w, mut lines) = watching(&d);
    let mut next = || next_event(&mut lines);
    // A run makes a directory, a file in it, renames and removes it. (A
    // new directory is watched once the supervisor sees it: what happens in
    // it before that and is gone by then cannot be seen; the pause gives
    // it that instant.)
    let r = sh(
        &d,
        "mkdir d && sleep 0.3 && echo x > d/f && mv d/f d/g && rm d/g",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let e = next();
        let s = format!(
            "{} {}{}",
            e["change"].as_str().unwrap(),
            e["path"].as_str().unwrap(),
            e["to"]
                .as_str()
                .map(|t| format!(" {t}"))
                .unwrap_or_default()
        );
        if !seen.contains(&s) {
            seen.push(s);
        }
    }
    assert_eq!(
        seen,
        [
            "created d",
            "created d/f",
            "modified d/f",
            "moved d/f d/g",
            "removed d/g"
        ]
    );
    // What a new directory already holds when it is first watched is
    // reported as created: nothing made at once with it is missed.
    let r = sh(&d, "mkdir -p e/sub && echo 1 > e/sub/a && echo 2 > e/b");
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let mut created = std::collections::BTreeSet::new();
    while created.len() < 4 {
        let e = next();
        if e["change"] == "created" {
            created.insert(e["path"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(
        created.into_iter().collect::<Vec<_>>(),
        ["e", "e/b", "e/sub", "e/sub/a"]
    );
    // A name that is not UTF-8 is written escaped, and said so (it was
    // written lossily, as another name could be, and a directory of such a
    // name was never watched: what was made in it went unreported).
    let r = sh(
        &d,
        "mkdir \"n$(printf '\\377')\" && sleep 0.3 && mkdir \"n$(printf '\\377')/in\" \"x$(printf '\\357\\277\\275')\" && sleep 0.3 && mv \"x$(printf '\\357\\277\\275')\" \"y$(printf '\\376')\"",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let mut odd = Vec::new();
    while odd.len() < 4 {
        let e = next();
        if e["path"].as_str().unwrap().starts_with("e/") {
            continue;
        }
        let s = format!(
            "{} {}{} {}",
            e["change"].as_str().unwrap(),
            e["path"].as_str().unwrap(),
            e["to"]
                .as_str()
                .map(|t| format!(" {t}"))
                .unwrap_or_default(),
            e["escaped"].as_bool().unwrap()
        );
        if !odd.contains(&s) {
            odd.push(s);
        }
    }
    odd.sort();
    assert_eq!(
        odd,
        [
            "created n\\xff true",
            "created n\\xff/in true",
            "created x\u{fffd} false",
            "moved x\u{fffd} y\\xfe true",
        ]
    );
    // A rollback is one event, and the new tree is watched.
    ctl_ok(&d, &["rollback", "a", "s", "empty"]);
    // (After what is left of the writes to e/.)
    loop {
        let e = next();
        if e["change"] == "rolled_back" {
            break;
        }
        assert!(
            e["path"].as_str().unwrap().starts_with("e/"),
            "{e} before rolled_back"
        );
    }
    sh(&d, "echo y > after");
    let e = next();
    assert_eq!(
        (e["change"].as_str(), e["path"].as_str()),
        (Some("created"), Some("after"))
    );
    // A write the moment `rolled_back` is read is reported: the new tree is
    // watched before it is said (writes right after it were missed).
    let mut c = d.daemon.client();
    for i in 0..8 {
        ctl_ok(&d, &["rollback", "a", "s", "empty"]);
        while next()["change"] != "rolled_back" {}
        let name = format!("right-after-{i}");
        c.call(Request::FsWrite(FsWrite::whole("a", "s", &name, "x")))
            .unwrap()
            .unwrap();
        loop {
            let e = next();
            assert_ne!(e["change"], "rolled_back", "round {i}: {name} not reported");
            // (A whole-file write is made beside and renamed over.)
            if e["path"] == name.as_str() || e["to"] == name.as_str() {
                break;
            }
        }
    }
    // The session deleted: the watch ends, saying so (it stayed open
    // about nothing, for ever).
    ctl_ok(&d, &["session", "delete", "a", "s", "--force"]);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = w.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "the watch of a deleted session did not end with an error: {status:?} {rest:?}"
    );
    assert!(
        !rest.iter().any(|l| l.contains("rolled_back")),
        "a delete is no rollback: {rest:?}"
    );
}

/// curl against the gateway: `args`, then the URL. Returns the status
/// code and the body (kept in `out` if one is given).
fn curl(args: &[&str], url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "120", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    let code = code.trim().parse().unwrap_or_else(|_| {
        panic!(
            "curl {args:?} {url}: no status: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, body.to_string())
}

fn random_file(path: &Path, mib: u64) {
    let st = Command::new("dd")
        .args(["if=/dev/urandom", "bs=1M", "status=none"])
        .arg(format!("count={mib}"))
        .arg(format!("of={}", path.display()))
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn files_go_in_and_out_through_the_gateway_with_curl() {
    let no_curl = allox_integration::which("curl")
        .is_none()
        .then(|| "curl".to_string());
    if !allox_integration::needs("files::files_gateway", no_curl) {
        return;
    }
    let Some(d) = setup("files_gateway", &[], 2048) else {
        return;
    };
    // The framed path, as to a daemon on another machine (the spooled one
    // is the next test's).
    let gw = allox_integration::Gateway::start(&d.daemon.socket, &["--files-framed"]);
    let auth = format!(
        "Authorization: Bearer {}",
        allox_integration::gateway_token(&d.daemon.socket)
    );
    let base = format!("http://{}/v1/files/a/s", gw.addr);
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    let big = tmp.path().join("big");
    random_file(&big, 64);
    let big_arg = big.to_str().unwrap();

    // Up with -T (a Content-Length body), a percent-encoded name.
    let (code, body) = curl(
        &["-H", &auth, "-T", big_arg],
        &format!("{base}/big%20one.bin"),
    );
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["path"], "big one.bin", "{v}");
    assert_eq!(v["size"], 64 << 20, "{v}");
    assert_eq!(sha256(&big), sha256(&current(&d).join("big one.bin")));
    // And down, with its size as Content-Length.
    let back = tmp.path().join("back");
    let head = tmp.path().join("head");
    let (code, _) = curl(
        &[
            "-H",
            &auth,
            "-o",
            back.to_str().unwrap(),
            "-D",
            head.to_str().unwrap(),
        ],
        &format!("{base}/big%20one.bin"),
    );
    assert_eq!(code, 200);
    assert_eq!(sha256(&big), sha256(&back));
    let head = std::fs::read_to_string(&head).unwrap().to_ascii_lowercase();
    assert!(head.contains("content-length: 67108864"), "{head}");
    assert!(
        head.contains("content-type: application/octet-stream"),
        "{head}"
    );

    // A chunked body (from a pipe) comes whole too.
    let piped = tmp.path().join("piped");
    random_file(&piped, 3);
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "120",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .args(["-H", &auth, "-T", "-"])
        .arg(format!("{base}/piped"))
        .stdin(std::fs::File::open(&piped).unwrap())
        .output()
        .unwrap();
    let (code, body) = (
        String::from_utf8_lossy(&out.stdout)
            .parse::<u16>()
            .unwrap_or(0),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(sha256(&piped), sha256(&current(&d).join("piped")));

    // The old content at a checkpoint, after it is overwritten.
    ctl_ok(&d, &["checkpoint", "create", "a", "s", "c1"]);
    let small = tmp.path().join("small");
    std::fs::write(&small, "new content\n").unwrap();
    let (code, body) = curl(
        &["-H", &auth, "-T", small.to_str().unwrap()],
        &format!("{base}/big%20one.bin"),
    );
    assert_eq!((code, body.contains(r#""size":12"#)), (200, true), "{body}");
    let (code, now) = curl(&["-H", &auth], &format!("{base}/big%20one.bin"));
    assert_eq!((code, now.as_str()), (200, "new content\n"));
    let old = tmp.path().join("old");
    let (code, _) = curl(
        &["-H", &auth, "-o", old.to_str().unwrap()],
        &format!("{base}/big%20one.bin?checkpoint=c1"),
    );
    assert_eq!(code, 200);
    assert_eq!(sha256(&big), sha256(&old));
    // A checkpoint cannot be written.
    let (code, _) = curl(
        &["-H", &auth, "-T", small.to_str().unwrap()],
        &format!("{base}/x?checkpoint=c1"),
    );
    assert_eq!(code, 400);

    // The agent's shared files.
    let (code, body) = curl(
        &["-H", &auth, "-T", small.to_str().unwrap()],
        &format!("{base}/note.txt?scope=shared"),
    );
    assert_eq!(code, 200, "{body}");
    let r = sh(&d, "cat /allox/shared/note.txt");
    assert_eq!(r.stdout, "new content\n", "{r:?}");
    let (code, got) = curl(&["-H", &auth], &format!("{base}/note.txt?scope=shared"));
    assert_eq!((code, got.as_str()), (200, "new content\n"));
    let (code, _) = curl(&["-H", &auth], &format!("{base}/note.txt"));
    assert_eq!(code, 404, "not in the session's own files");

    // No token: 401, for GET and PUT alike, and nothing written.
    let (code, body) = curl(&[], &format!("{base}/big%20one.bin"));
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("unauthorized"), "{body}");
    let (code, _) = curl(&["-T", big_arg], &format!("{base}/big%20one.bin"));
    assert_eq!(code, 401);
    assert_eq!(
        std::fs::read(current(&d).join("big one.bin")).unwrap(),
        b"new content\n"
    );

    // What the daemon refuses comes back with its status: `..`, plain
    // or encoded (curl would resolve a plain one itself without
    // --path-as-is), an absolute path, a directory, nothing, no file.
    std::fs::create_dir_all(current(&d).join("dir")).unwrap();
    for (method, path, status, what) in [
        ("GET", "/../secret", 400, "`..`"),
        ("GET", "/%2E%2E/secret", 400, "`..`"),
        ("PUT", "/dir/%2e%2e/%2e%2e/escaped", 400, "`..`"),
        ("GET", "/%2Fetc%2Fpasswd", 400, "absolute"),
        ("GET", "/dir", 400, ""),
        ("GET", "/", 400, ""),
        ("GET", "/missing", 404, ""),
    ] {
        let mut args = vec!["-H", auth.as_str(), "--path-as-is"];
        if method == "PUT" {
            args.extend(["-T", small.to_str().unwrap()]);
        }
        let (code, body) = curl(&args, &format!("{base}{path}"));
        assert_eq!(code, status, "{method} {path}: {body}");
        let v: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{method} {path}: {e}: {body}"));
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(what), "{method} {path}: {body}");
    }
    assert!(!current(&d).join("../escaped").exists());
    // Other methods: 405, naming the two.
    let (code, _) = curl(
        &["-H", &auth, "-X", "DELETE", "-D", "-"],
        &format!("{base}/piped"),
    );
    assert_eq!(code, 405);

    // An upload cut short (curl killed half-way) leaves the old content,
    // with a Content-Length body and with a chunked one.
    for chunked in [false, true] {
        std::fs::write(current(&d).join("target"), "old content\n").unwrap();
        let mut up = slow_put(&auth, &big, chunked, "4M", &format!("{base}/target"));
        // Killed once the upload has begun (its partial file is there)
        // and has a few chunks in it.
        let cur = current(&d);
        let partial = || {
            std::fs::read_dir(&cur).unwrap().flatten().find_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with(".allox-upload-")
                    .then(|| e.metadata().map(|m| m.len()).unwrap_or(0))
            })
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while partial().unwrap_or(0) < 2 << 20 {
            assert!(Instant::now() < deadline, "the upload never began");
            std::thread::sleep(Duration::from_millis(20));
        }
        up.kill().unwrap();
        let _ = up.wait();
        // The gateway sees the end of the body at once and drops the
        // upload: its partial file and record go (they held one of the
        // session's few uploads under way for five idle minutes).
        let records = d.daemon.root.join("state/uploads");
        let recorded = || std::fs::read_dir(&records).map(|r| r.count()).unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while partial().is_some() || recorded() > 0 {
            assert!(
                Instant::now() < deadline,
                "chunked: {chunked}: the cut upload is still under way ({} records)",
                recorded()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            std::fs::read_to_string(cur.join("target")).unwrap(),
            "old content\n",
            "chunked: {chunked}"
        );
        let (code, got) = curl(&["-H", &auth], &format!("{base}/target"));
        assert_eq!(
            (code, got.as_str()),
            (200, "old content\n"),
            "chunked: {chunked}"
        );
    }
    // The same, cut where a client killed half-way may cut it: inside a
    // chunk, after a chunk's header promised more, and short of the
    // Content-Length.
    let chunk = vec![b'x'; 600 << 10];
    for (framing, head) in [
        (
            "chunked",
            format!("Transfer-Encoding: chunked\r\n\r\n{:x}\r\n", 1 << 20),
        ),
        ("length", format!("Content-Length: {}\r\n\r\n", 1 << 20)),
    ] {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(gw.addr).unwrap();
        write!(
            s,
            "PUT /v1/files/a/s/target HTTP/1.1\r\nHost: {}\r\n{auth}\r\n{head}",
            gw.addr
        )
        .unwrap();
        s.write_all(&chunk).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        // The gateway answers (or just closes); either way it is done.
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        assert!(!reply.starts_with("HTTP/1.1 200"), "{framing}: {reply}");
        let (code, got) = curl(&["-H", &auth], &format!("{base}/target"));
        assert_eq!((code, got.as_str()), (200, "old content\n"), "{framing}");
    }
}

/// `alloxctl cp -v`'s word for how the files moved.
fn cp_v(d: &ProcDaemon, args: &[&str]) -> String {
    let mut all = vec!["cp", "-v"];
    all.extend_from_slice(args);
    let (code, _, err) = ctl(d, &all);
    assert_eq!(code, 0, "alloxctl {all:?}: {err}");
    err
}

fn local_upload(path: &str) -> Request {
    Request::FsUploadLocal(FsUploadLocal::whole("a", "s", FsScope::Session, path))
}

fn local_download(path: &str) -> Request {
    Request::FsDownloadLocal(FsDownloadLocal {
        agent_id: "a".into(),
        session_id: "s".into(),
        scope: FsScope::Session,
        checkpoint_id: None,
        path: path.into(),
    })
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn local_copies_move_the_bytes_in_the_daemon_under_the_same_rules() {
    let Some(d) = setup("local_copies", &[], 2048) else {
        return;
    };
    // From another filesystem: the kernel copies (copy_file_range, or
    // sendfile where it does not copy between the two).
    let other = tempfile::tempdir_in("/var/tmp").unwrap();
    let f = other.path().join("f");
    random_file(&f, 64);
    sh(&d, "mkdir up");
    let said = cp_v(&d, &[f.to_str().unwrap(), "a/s:up/f"]);
    assert!(
        said.contains("1 by copy_file_range") || said.contains("1 by sendfile"),
        "{said}"
    );
    assert_eq!(sha256(&f), sha256(&current(&d).join("up/f")));
    let r = sh(&d, "stat -c '%u %a' up/f");
    assert_eq!(r.stdout, "10000 644\n", "{r:?}");
    // From the store's own filesystem: a reflink, and back the same way.
    let same = d.fs.path().join("outside");
    std::fs::create_dir(&same).unwrap();
    std::fs::copy(&f, same.join("g")).unwrap();
    let said = cp_v(&d, &[same.join("g").to_str().unwrap(), "a/s:up/g"]);
    assert!(said.contains("1 by reflink"), "{said}");
    let said = cp_v(&d, &["a/s:up/g", same.join("back").to_str().unwrap()]);
    assert!(said.contains("1 by reflink"), "{said}");
    assert_eq!(sha256(&f), sha256(&same.join("back")));
    // Out to another filesystem, a directory of them; an old file there
    // is replaced whole.
    std::fs::write(other.path().join("old"), vec![b'x'; 100 << 20]).unwrap();
    sh(
        &d,
        "mkdir -p tree/sub && echo one > tree/a && : > tree/sub/empty",
    );
    let said = cp_v(
        &d,
        &["a/s:up/f", other.path().join("old").to_str().unwrap()],
    );
    assert!(!said.contains("frames"), "{said}");
    assert_eq!(sha256(&f), sha256(&other.path().join("old")));
    let said = cp_v(
        &d,
        &["a/s:tree", other.path().join("tree").to_str().unwrap()],
    );
    assert!(!said.contains("frames") && said.contains("2 by"), "{said}");
    assert_eq!(
        std::fs::read(other.path().join("tree/a")).unwrap(),
        b"one\n"
    );
    assert_eq!(
        std::fs::read(other.path().join("tree/sub/empty")).unwrap(),
        b""
    );
    // --framed takes the path of the gateway and the VM's port.
    let said = cp_v(&d, &["--framed", f.to_str().unwrap(), "a/s:up/h"]);
    assert!(said.contains("1 in frames"), "{said}");
    assert_eq!(sha256(&f), sha256(&current(&d).join("up/h")));

    // A link the sandbox plants out of the scope is not followed.
    sh(&d, "ln -s /etc/shadow up/out");
    let mut c = d.daemon.client();
    let dst = tempfile::NamedTempFile::new().unwrap();
    let e = c
        .call_with_fd(local_download("up/out"), dst.as_file().as_fd())
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
    assert!(e.message.contains("outside"), "{e:?}");
    assert_eq!(std::fs::read(dst.path()).unwrap(), b"");

    // Each descriptor is used only as it was opened, and only a regular
    // file.
    let wronly = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    let rdonly = std::fs::File::open(&f).unwrap();
    let append = std::fs::OpenOptions::new()
        .append(true)
        .open(dst.path())
        .unwrap();
    let dir = std::fs::File::open(other.path()).unwrap();
    let opath = rustix::fs::open(&f, rustix::fs::OFlags::PATH, rustix::fs::Mode::empty()).unwrap();
    for (q, fd, says) in [
        (
            local_upload("up/x"),
            wronly.as_fd(),
            "open for writing only",
        ),
        (
            local_download("up/f"),
            rdonly.as_fd(),
            "open for reading only",
        ),
        (local_download("up/f"), append.as_fd(), "open to append"),
        (local_upload("up/x"), dir.as_fd(), "not a regular file"),
        (local_upload("up/x"), opath.as_fd(), "O_PATH"),
    ] {
        let e = c.call_with_fd(q, fd).unwrap().unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest, "{says}: {e:?}");
        assert!(e.message.contains(says), "{says}: {e:?}");
    }
    assert!(!current(&d).join("up/x").exists());
    // Without a descriptor: unsupported, naming the way there is.
    let e = c.call(local_upload("up/x")).unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::Unsupported, "{e:?}");
    assert!(
        e.message.contains("SCM_RIGHTS") && e.message.contains("fs.write"),
        "{e:?}"
    );

    // A client that passes a descriptor with every request holds at most
    // a few open in the daemon.
    let pid = d.daemon.child.id();
    let before = open_fds(pid);
    for _ in 0..1000 {
        c.call_with_fd(Request::Ping(Ping {}), rdonly.as_fd())
            .unwrap()
            .unwrap();
    }
    let after = open_fds(pid);
    assert!(
        after <= before + 4,
        "{before} descriptors before, {after} after"
    );
    drop(c);
    // Once its connection is gone, they are closed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_fds(pid) > before {
        assert!(Instant::now() < deadline, "passed descriptors stayed open");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_local_upload_whose_client_is_killed_leaves_the_old_file() {
    let Some(mut d) = setup("local_killed", &[], 2048) else {
        return;
    };
    let cur = current(&d);
    std::fs::write(cur.join("target"), "old content\n").unwrap();
    let big = tempfile::tempdir_in("/var/tmp").unwrap();
    let f = big.path().join("big");
    random_file(&f, 1024);
    let mut cp = Command::new(workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(&d.daemon.socket)
        .args(["cp", f.to_str().unwrap(), "a/s:target"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed while the daemon copies: its new file, not named until it
    // is whole, is open in the daemon.
    let pid = d.daemon.child.id();
    let copying = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|r| {
                r.flatten().any(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| l.to_string_lossy().contains("current/#"))
                })
            })
            .unwrap_or(false)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !copying() {
        assert!(Instant::now() < deadline, "the copy never began");
        if let Ok(Some(s)) = cp.try_wait() {
            panic!("the copy ended before it was killed: {s:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    cp.kill().unwrap();
    cp.wait().unwrap();
    // The daemon notices, drops the copy, and keeps the old file.
    let deadline = Instant::now() + Duration::from_secs(60);
    while copying() {
        assert!(Instant::now() < deadline, "the dropped copy stayed open");
        std::thread::sleep(Duration::from_millis(20));
    }
    let aside = || {
        std::fs::read_dir(&cur)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(".allox-write-"))
    };
    assert!(!aside(), "the dropped copy left its file");
    assert_eq!(read(&d, "target").unwrap(), b"old content\n");
    d.restart(&[]);
    assert!(!aside());
    assert_eq!(read(&d, "target").unwrap(), b"old content\n");
}

/// curl putting `file` to `url` at `rate` (with its length, or chunked
/// from a pipe), running: for a test to kill half-way.
fn slow_put(auth: &str, file: &Path, chunked: bool, rate: &str, url: &str) -> std::process::Child {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--limit-rate", rate, "-H", auth, "-o", "/dev/null"]);
    if chunked {
        cmd.args(["-T", "-"])
            .stdin(std::fs::File::open(file).unwrap());
    } else {
        cmd.arg("-T").arg(file);
    }
    cmd.arg(url).stderr(Stdio::null()).spawn().unwrap()
}

/// curl against the gateway: `args`, then the URL. Returns the status
/// code, how the bytes moved (`Allox-Copied-By`) and the body.
fn curl_by(args: &[&str], url: &str) -> (u16, String, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "120"])
        .args(["-w", "\n%{http_code} %header{allox-copied-by}"])
        .args(args)
        .arg(url)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, tail) = text.rsplit_once('\n').unwrap_or(("", &text));
    let (code, by) = tail.split_once(' ').unwrap_or((tail, ""));
    let code = code.trim().parse().unwrap_or(0);
    assert_ne!(
        code,
        0,
        "curl {args:?} {url}: no status: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code, by.trim().to_string(), body.to_string())
}

/// The largest file open in process `pid` below `dir` that has no name
/// (a spooled body), if any.
fn spooled_in(pid: u32, dir: &Path) -> Option<u64> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    fds.flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|l| l.starts_with(dir) && l.to_string_lossy().ends_with("(deleted)"))
        })
        .filter_map(|e| std::fs::metadata(e.path()).ok().map(|m| m.len()))
        .max()
}

/// Waits until `f` holds, at most `secs`.
fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn files_through_the_gateway_are_spooled_and_passed_to_the_daemon_where_they_can() {
    let no_curl = allox_integration::which("curl")
        .is_none()
        .then(|| "curl".to_string());
    if !allox_integration::needs("files::gateway_spooled", no_curl) {
        return;
    }
    let Some(d) = setup("gateway_spooled", &[], 2048) else {
        return;
    };
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    let spool = tmp.path().join("spool");
    std::fs::create_dir(&spool).unwrap();
    let spool_arg = spool.to_str().unwrap();

    // A spool that is not a writable directory is refused at start,
    // naming it.
    for bad in [tmp.path().join("missing"), d.daemon.socket.clone()] {
        let out = Command::new(workspace_bin("alloxctl"))
            .arg("--socket")
            .arg(&d.daemon.socket)
            .args(["gateway", "--listen", "127.0.0.1:0", "--spool-dir"])
            .arg(&bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad:?}: {err}");
        assert!(
            err.contains(&*bad.to_string_lossy()) && err.contains("--spool-dir"),
            "{err}"
        );
    }

    let mut gw = allox_integration::Gateway::start(&d.daemon.socket, &["--spool-dir", spool_arg]);
    let auth = format!(
        "Authorization: Bearer {}",
        allox_integration::gateway_token(&d.daemon.socket)
    );
    let base = format!("http://{}/v1/files/a/s", gw.addr);
    let big = tmp.path().join("big");
    random_file(&big, 64);
    let big_arg = big.to_str().unwrap();
    let cur = current(&d);
    let passed = ["copy_file_range", "sendfile"];

    // A large file both ways goes by the daemon's own copy, byte for byte.
    let (code, by, body) = curl_by(&["-H", &auth, "-T", big_arg], &format!("{base}/big.bin"));
    assert_eq!(code, 200, "{body}");
    assert!(passed.contains(&by.as_str()), "PUT copied by {by:?}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["path"].as_str(), v["size"].as_u64()),
        (Some("big.bin"), Some(64 << 20))
    );
    assert_eq!(sha256(&big), sha256(&cur.join("big.bin")));
    let back = tmp.path().join("back");
    let (code, by, _) = curl_by(
        &["-H", &auth, "-o", back.to_str().unwrap()],
        &format!("{base}/big.bin"),
    );
    assert_eq!(code, 200);
    assert!(passed.contains(&by.as_str()), "GET copied by {by:?}");
    assert_eq!(sha256(&big), sha256(&back));
    // The bytes the daemon moved count in its metrics, both ways, once
    // (a first chunk read and thrown away was counted out on top).
    let metrics = String::from_utf8(ctl_ok(&d, &["metrics"])).unwrap();
    for way in ["in", "out"] {
        let key = format!("allox_file_bytes_total{{direction=\"{way}\"}} ");
        let n: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {metrics}"));
        assert_eq!(n, (64u64 << 20) as f64, "{key}{n}");
    }
    // A checkpoint's file too, as it was.
    ctl_ok(&d, &["checkpoint", "create", "a", "s", "c1"]);
    std::fs::write(cur.join("big.bin"), "now small\n").unwrap();
    let (code, by, _) = curl_by(
        &["-H", &auth, "-o", back.to_str().unwrap()],
        &format!("{base}/big.bin?checkpoint=c1"),
    );
    assert_eq!(code, 200);
    assert!(passed.contains(&by.as_str()), "GET at a checkpoint: {by:?}");
    assert_eq!(sha256(&big), sha256(&back));
    // A chunked body (from a pipe) is spooled as well.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "120", "-o", "/dev/null"])
        .args([
            "-w",
            "%{http_code} %header{allox-copied-by}",
            "-H",
            &auth,
            "-T",
            "-",
        ])
        .arg(format!("{base}/piped"))
        .stdin(std::fs::File::open(&big).unwrap())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.starts_with("200 ") && passed.iter().any(|p| said.ends_with(p)),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sha256(&big), sha256(&cur.join("piped")));
    // A chunk or less goes in frames, both ways.
    let small = tmp.path().join("small");
    std::fs::write(&small, "new content\n").unwrap();
    let (code, by, _) = curl_by(
        &["-H", &auth, "-T", small.to_str().unwrap()],
        &format!("{base}/small"),
    );
    assert_eq!((code, by.as_str()), (200, "frames"));
    let (code, by, got) = curl_by(&["-H", &auth], &format!("{base}/small"));
    assert_eq!(
        (code, by.as_str(), got.as_str()),
        (200, "frames", "new content\n")
    );
    // What the daemon refuses is said as in frames: no such file, a
    // directory as the target.
    std::fs::create_dir_all(cur.join("dir")).unwrap();
    let (code, _, body) = curl_by(&["-H", &auth, "-T", big_arg], &format!("{base}/dir"));
    assert_eq!(code, 400, "{body}");
    let (code, _, body) = curl_by(
        &["-H", &auth, "-T", big_arg],
        &format!("{base}/no/such/dir/f"),
    );
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("\"error\""), "{body}");
    // Nothing is left in the spool.
    assert_eq!(std::fs::read_dir(&spool).unwrap().count(), 0);

    // A body cut short while it is spooled (curl killed) never reaches
    // the session, whatever its framing.
    let pid = gw.child.id();
    let partial = || {
        std::fs::read_dir(&cur).unwrap().flatten().find_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(".allox-upload-")
                .then(|| e.metadata().map(|m| m.len()).unwrap_or(0))
        })
    };
    // Cut before a part of it was passed, and after the first parts were
    // (the daemon holds them in an upload never committed).
    for (chunked, cut_at) in [(false, 2u64 << 20), (true, 2 << 20), (false, 40 << 20)] {
        std::fs::write(cur.join("target"), "old content\n").unwrap();
        let mut up = slow_put(&auth, &big, chunked, "16M", &format!("{base}/target"));
        wait_until("a spooled body", 30, || {
            spooled_in(pid, &spool).unwrap_or(0) >= cut_at
        });
        if cut_at > 32 << 20 {
            wait_until("the first parts passed", 30, || {
                partial().unwrap_or(0) >= 32 << 20
            });
        }
        up.kill().unwrap();
        let _ = up.wait();
        // The gateway drops the spooled file as it sees the body end.
        wait_until("the spooled file closed", 30, || {
            spooled_in(pid, &spool).is_none()
        });
        let (code, got) = curl(&["-H", &auth], &format!("{base}/target"));
        let case = format!("chunked: {chunked}, cut at {cut_at}");
        assert_eq!((code, got.as_str()), (200, "old content\n"), "{case}");
        // What was passed is dropped on the daemon at once: no partial
        // file, no upload holding the session's budget (it held it for
        // --upload-idle-s).
        let records = d.daemon.root.join("state/uploads");
        let recorded = || std::fs::read_dir(&records).map(|r| r.count()).unwrap_or(0);
        wait_until("the cut upload dropped", 10, || {
            partial().is_none() && recorded() == 0
        });
    }
    // The gateway itself killed while it spools: the same, and the spool
    // is empty (its files never had a name).
    let mut up = Command::new("curl")
        .args([
            "-sS",
            "--limit-rate",
            "16M",
            "-H",
            &auth,
            "-o",
            "/dev/null",
            "-T",
            big_arg,
        ])
        .arg(format!("{base}/target"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("a spooled body of 2 MiB", 30, || {
        spooled_in(pid, &spool).unwrap_or(0) >= 2 << 20
    });
    gw.child.kill().unwrap();
    let _ = gw.child.wait();
    let _ = up.wait();
    assert_eq!(std::fs::read_dir(&spool).unwrap().count(), 0);
    assert_eq!(read(&d, "target").unwrap(), b"old content\n");

    // A gateway spooling in `dir`: a 64 MiB file put as `name` and got
    // back whole; how each way moved.
    let both_ways = |dir: &Path, name: &str| {
        let gw = allox_integration::Gateway::start(
            &d.daemon.socket,
            &["--spool-dir", dir.to_str().unwrap()],
        );
        let url = format!("http://{}/v1/files/a/s/{name}", gw.addr);
        let (code, up, body) = curl_by(&["-H", &auth, "-T", big_arg], &url);
        assert_eq!(code, 200, "{body}");
        assert_eq!(sha256(&big), sha256(&cur.join(name)));
        let (code, down, _) = curl_by(&["-H", &auth, "-o", back.to_str().unwrap()], &url);
        assert_eq!(code, 200);
        assert_eq!(sha256(&big), sha256(&back));
        (up, down)
    };
    // A spool on the store's own Btrfs: the kernel copies (or shares)
    // the parts of a PUT within the filesystem, and a GET is a reflink.
    let on_store = d.fs.path().join("spool");
    std::fs::create_dir(&on_store).unwrap();
    let (up, down) = both_ways(&on_store, "reflinked");
    assert_eq!((up.as_str(), down.as_str()), ("copy_file_range", "reflink"));

    // A spool of 200 MiB (a tmpfs), which keeps 64 MiB free.
    let small_fs = tmp.path().join("spool-200m");
    std::fs::create_dir(&small_fs).unwrap();
    let _small = allox_integration::Tmpfs::mount(&small_fs, 200, "the spool");
    // A file that fits is spooled.
    let (up, down) = both_ways(&small_fs, "fits");
    assert!(
        passed.contains(&up.as_str()) && passed.contains(&down.as_str()),
        "{up} {down}"
    );
    // One that does not: the body is spooled up to the reserve, then goes
    // in frames from its start, and comes whole; the GET is read in
    // frames.
    let huge = tmp.path().join("huge");
    random_file(&huge, 160);
    let gw = allox_integration::Gateway::start(
        &d.daemon.socket,
        &["--spool-dir", small_fs.to_str().unwrap()],
    );
    let url = format!("http://{}/v1/files/a/s/huge", gw.addr);
    let mut up = slow_put(&auth, &huge, false, "64M", &url);
    let mut most = 0;
    while up.try_wait().unwrap().is_none() {
        most = most.max(spooled_in(gw.child.id(), &small_fs).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(most > 0 && most <= 140 << 20, "spooled {most} bytes");
    assert_eq!(sha256(&huge), sha256(&cur.join("huge")));
    let (code, by, _) = curl_by(&["-H", &auth, "-o", back.to_str().unwrap()], &url);
    assert_eq!((code, by.as_str()), (200, "frames"));
    assert_eq!(sha256(&huge), sha256(&back));
    // Something else fills the spool while a body is spooled: it goes in
    // frames from its start, whole.
    let mut up = Command::new("curl")
        .args(["-sS", "--limit-rate", "16M", "-H", &auth, "-o", "/dev/null"])
        .args(["-w", "%{http_code} %header{allox-copied-by}", "-T", big_arg])
        .arg(format!("http://{}/v1/files/a/s/crowded", gw.addr))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("a spooled body", 30, || {
        spooled_in(gw.child.id(), &small_fs).unwrap_or(0) >= 2 << 20
    });
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "status=none"])
        .arg(format!("of={}", small_fs.join("ballast").display()))
        .status();
    let mut said = String::new();
    std::io::Read::read_to_string(&mut up.stdout.take().unwrap(), &mut said).unwrap();
    assert!(up.wait().unwrap().success());
    assert_eq!(said, "200 frames");
    assert_eq!(sha256(&big), sha256(&cur.join("crowded")));
    drop(gw);
}

/// `fs.upload_local` with `upload`: one part of the passed file at a time.
fn local_chunk(path: &str, id: &str, offset: u64, length: Option<u64>, commit: bool) -> Request {
    Request::FsUploadLocal(FsUploadLocal {
        upload: Some(id.into()),
        offset: Some(offset),
        length,
        commit,
        ..FsUploadLocal::whole("a", "s", FsScope::Session, path)
    })
}

#[test]
fn an_upload_s_chunks_may_be_passed_as_open_files_and_mixed_with_frames() {
    let Some(d) = setup("local_chunks", &[], 2048) else {
        return;
    };
    let cur = current(&d);
    std::fs::write(cur.join("t"), "old content\n").unwrap();
    let other = tempfile::tempdir_in("/var/tmp").unwrap();
    let f = other.path().join("f");
    random_file(&f, 8);
    let src = std::fs::File::open(&f).unwrap();
    let all = std::fs::read(&f).unwrap();
    let mut c = d.daemon.client();
    let mut pass = |q: Request| c.call_with_fd(q, src.as_fd()).unwrap();
    // Two parts passed, a chunk between them in frames; the target keeps its
    // old content until the commit.
    let m = 3u64 << 20;
    let got = pass(local_chunk("t", "u1", 0, Some(m), false)).unwrap();
    let Response::FsCopied(x) = got else {
        panic!("{got:?}")
    };
    assert_eq!(x.size, m);
    assert!(
        matches!(x.by, CopiedBy::CopyFileRange | CopiedBy::Sendfile),
        "{x:?}"
    );
    assert_eq!(std::fs::read(cur.join("t")).unwrap(), b"old content\n");
    let k = m + FS_CHUNK;
    let framed = Request::FsWrite(FsWrite {
        offset: Some(m),
        upload: Some("u1".into()),
        ..FsWrite::whole("a", "s", "t", all[m as usize..k as usize].to_vec())
    });
    call(&d, framed).unwrap();
    assert_eq!(std::fs::read(cur.join("t")).unwrap(), b"old content\n");
    let got = pass(local_chunk("t", "u1", k, None, true)).unwrap();
    let Response::FsCopied(x) = got else {
        panic!("{got:?}")
    };
    assert_eq!(x.size, 8 << 20);
    assert_eq!(sha256(&f), sha256(&cur.join("t")));
    let r = sh(&d, "stat -c '%u %a' t");
    assert_eq!(r.stdout, "10000 644\n", "{r:?}");

    // A commit with a part missing is refused and the target kept.
    std::fs::write(cur.join("t"), "old content\n").unwrap();
    pass(local_chunk("t", "u2", 0, Some(m), false)).unwrap();
    let e = pass(local_chunk("t", "u2", 2 * m, None, true)).unwrap_err();
    assert!(e.message.contains("came"), "{e:?}");
    assert_eq!(std::fs::read(cur.join("t")).unwrap(), b"old content\n");
    // A part past the passed file's end is refused, naming both ends.
    pass(local_chunk("t", "u3", 0, Some(m), false)).unwrap();
    let e = pass(local_chunk("t", "u3", m, Some(8 << 20), true)).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
    assert!(e.message.contains("short of"), "{e:?}");
    assert_eq!(std::fs::read(cur.join("t")).unwrap(), b"old content\n");
    // A part that is no upload's is not taken for one.
    let e = pass(Request::FsUploadLocal(FsUploadLocal {
        offset: Some(5),
        ..FsUploadLocal::whole("a", "s", FsScope::Session, "t")
    }))
    .unwrap_err();
    assert!(e.message.contains("give upload"), "{e:?}");
    // A later part of an upload never begun is refused.
    let e = pass(local_chunk("t", "never", m, None, true)).unwrap_err();
    assert!(e.message.contains("nothing is under way"), "{e:?}");
    assert_eq!(std::fs::read(cur.join("t")).unwrap(), b"old content\n");
}

#[test]
fn a_file_replaced_while_it_is_copied_out_is_never_a_mix_of_two() {
    let Some(d) = setup(
        "a_file_replaced_while_it_is_copied_out_is_never_a_mix_of_two",
        &[],
        1024,
    ) else {
        return;
    };
    // Two 32 MiB files, then a program that keeps replacing `f` with
    // one and the other (a copy beside it renamed over it).
    let r = sh(
        &d,
        "head -c 33554432 /dev/zero | tr '\\0' a > A && head -c 33554432 /dev/zero | tr '\\0' b > B && cp A f",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let mut p = start(
        "a",
        "s",
        &[
            "/bin/sh",
            "-c",
            "while :; do cp --reflink=auto A .t && mv .t f; cp --reflink=auto B .t && mv .t f; done",
        ],
    );
    p.wait = false;
    let Ok(Response::Started(swapper)) = call(&d, Request::ProcessStart(p)) else {
        panic!("the swapping program did not start")
    };
    let out = tempfile::tempdir().unwrap();
    let (mut whole, mut replaced) = (0, 0);
    for i in 0..6 {
        let to = out.path().join(format!("f{i}"));
        let (code, _, err) = ctl(&d, &["cp", "--framed", "a/s:f", to.to_str().unwrap()]);
        if code == 0 {
            let got = std::fs::read(&to).unwrap();
            assert_eq!(got.len(), 32 << 20, "copy {i}");
            assert!(
                got.iter().all(|&b| b == got[0]),
                "copy {i} mixes two files: {} bytes of {:?} then others",
                got.iter().take_while(|&&b| b == got[0]).count(),
                got[0] as char
            );
            whole += 1;
        } else {
            assert!(
                err.contains("was replaced while it was read"),
                "copy {i}: {err}"
            );
            replaced += 1;
        }
    }
    call(
        &d,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: Some(swapper.run_id),
            signal: None,
        }),
    )
    .unwrap();
    // The race was run: some copy met a replacement.
    assert!(replaced > 0, "no copy met a replacement ({whole} whole)");
}

#[test]
fn names_that_are_not_utf8_are_never_shown_as_another_name() {
    let Some(d) = setup(
        "names_that_are_not_utf8_are_never_shown_as_another_name",
        &[],
        512,
    ) else {
        return;
    };
    // `x\377` is not UTF-8; `x\u{fffd}` is, and is what a lossy
    // conversion makes of the first.
    let r = sh(
        &d,
        "mkdir d && printf SECRET > \"d/x$(printf '\\377')\" && printf DECOY > \"d/x$(printf '\\357\\277\\275')\" && printf ok > d/y",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    ctl_ok(&d, &["checkpoint", "create", "a", "s", "c1"]);
    let listed = ctl_ok(&d, &["--json", "fs", "ls", "a", "s", "d"]);
    let listed: serde_json::Value = serde_json::from_slice(&listed).unwrap();
    let mut names: Vec<(String, bool)> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_string(),
                e["escaped"].as_bool().unwrap(),
            )
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ("d/x\\xff".to_string(), true),
            ("d/x\u{fffd}".to_string(), false),
            ("d/y".to_string(), false)
        ]
    );
    // A copy out of the directory is refused before anything is copied,
    // from current/ and from the checkpoint (it copied the decoy twice
    // and said nothing).
    let out = tempfile::tempdir().unwrap();
    for extra in [&[][..], &["--checkpoint", "c1"]] {
        let to = out.path().join(format!("o{}", extra.len()));
        let mut args = vec!["cp"];
        args.extend_from_slice(extra);
        args.extend(["a/s:d", to.to_str().unwrap()]);
        let (code, _, err) = ctl(&d, &args);
        assert!(
            code != 0 && err.contains("not UTF-8") && err.contains("nothing was copied"),
            "{args:?}: {code} {err}"
        );
        assert!(!to.exists(), "{args:?} made {}", to.display());
    }
    // The diff names each of three files apart: one added, one
    // modified, one deleted.
    let r = sh(
        &d,
        "rm \"d/x$(printf '\\377')\" && printf c > \"d/x$(printf '\\375')\" && printf DECOY2 > \"d/x$(printf '\\357\\277\\275')\"",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let diff = ctl_ok(&d, &["--json", "diff", "a", "s", "c1", "current"]);
    let diff: serde_json::Value = serde_json::from_slice(&diff).unwrap();
    let mut changes: Vec<(String, String, bool)> = diff["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_string(),
                c["kind"].as_str().unwrap().to_string(),
                c["escaped"].as_bool().unwrap(),
            )
        })
        .collect();
    changes.sort();
    assert_eq!(
        changes,
        [
            ("d/x\\xfd".to_string(), "added".to_string(), true),
            ("d/x\\xff".to_string(), "deleted".to_string(), true),
            ("d/x\u{fffd}".to_string(), "modified".to_string(), false),
        ]
    );
}

/// `alloxctl cp` out of a tree of more than one listing's 10,000 entries:
/// whole, as long as no one directory holds more (a project of 20
/// directories of 500 files was refused before, "copy its subdirectories
/// one by one"); a single directory of more is refused before anything is
/// copied, saying what can be done.
#[test]
fn cp_copies_a_tree_of_more_than_one_listing_out_whole() {
    let Some(d) = setup("cp_more_than_one_listing", &[], 1024) else {
        return;
    };
    let cur = current(&d);
    for i in 0..20 {
        let dir = cur.join(format!("proj/d{i:02}"));
        std::fs::create_dir_all(&dir).unwrap();
        for j in 0..500 {
            std::fs::write(dir.join(format!("f{j:03}")), format!("{i}/{j}")).unwrap();
        }
    }
    let out = tempfile::tempdir_in("/var/tmp").unwrap();
    let dst = out.path().join("proj");
    let said = String::from_utf8_lossy(&ctl_ok(&d, &["cp", "a/s:proj", dst.to_str().unwrap()]))
        .into_owned();
    assert!(said.contains("10000 files"), "{said}");
    assert_eq!(
        std::fs::read_to_string(dst.join("d19/f499")).unwrap(),
        "19/499"
    );
    let count = walkdir_count(&dst);
    assert_eq!(count, 10_000);
    // One directory of 10,001 files: refused, nothing made.
    let flat = cur.join("flat");
    std::fs::create_dir(&flat).unwrap();
    for j in 0..10_001 {
        std::fs::write(flat.join(format!("f{j:05}")), "x").unwrap();
    }
    let dst = out.path().join("flat");
    let (code, _, err) = ctl(&d, &["cp", "a/s:flat", dst.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(
        err.contains("one directory of more than 10000 entries")
            && err.contains("nothing was copied"),
        "{err}"
    );
    assert!(!dst.exists());
}

/// How many files are under `dir`.
fn walkdir_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                walkdir_count(&e.path())
            } else {
                1
            }
        })
        .sum()
}

/// A daemon asked to stop while `alloxctl cp` copies a large file in:
/// the copy is answered as it ended, or not made — never "the daemon
/// closed the connection" for a file that is then there, whole.
#[test]
fn a_copy_cut_by_a_shutdown_is_answered_as_it_ended() {
    let Some(mut d) = setup(
        "a_copy_cut_by_a_shutdown_is_answered_as_it_ended",
        &[],
        2048,
    ) else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let big = dir.path().join("big.bin");
    // 300 MiB that no filesystem shrinks.
    random_file(&big, 300);
    let size = std::fs::metadata(&big).unwrap().len();
    for (i, delay_ms) in [50u64, 100, 150, 250].into_iter().enumerate() {
        let target = format!("a/s:big{i}.bin");
        let cp = Command::new(workspace_bin("alloxctl"))
            .arg("--socket")
            .arg(&d.daemon.socket)
            .args(["cp", big.to_str().unwrap(), &target])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = ctl(&d, &["shutdown"]);
        let out = cp.wait_with_output().unwrap();
        d.restart(&[]);
        let made = std::fs::metadata(current(&d).join(format!("big{i}.bin")))
            .map(|m| m.len())
            .ok();
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            assert_eq!(
                made,
                Some(size),
                "answered ok after {delay_ms} ms, not made whole"
            );
        } else {
            assert!(
                made.is_none(),
                "answered failed after {delay_ms} ms ({err}), yet made: {made:?} bytes"
            );
        }
    }
}

/// An `alloxctl cp` out of a session killed outright half-way leaves
/// nothing beside its target (a `.NAME.XXXXXX.partial` was left for ever),
/// and the daemon stops copying into the file of a client that is gone
/// (it wrote the whole file).
#[test]
fn a_copy_out_killed_half_way_leaves_nothing_and_the_daemon_stops() {
    let Some(d) = setup(
        "a_copy_out_killed_half_way_leaves_nothing_and_the_daemon_stops",
        &[],
        2048,
    ) else {
        return;
    };
    // 768 MiB that no filesystem shrinks, in the session.
    let size: u64 = 768 << 20;
    random_file(&current(&d).join("big.bin"), size >> 20);
    // Out to another filesystem: copied, not shared.
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let target = dir.path().join("out.bin");
    let mut cp = Command::new(workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(&d.daemon.socket)
        .args(["cp", "a/s:big.bin", target.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The file the daemon writes into: the one it holds in `dir`.
    let daemon_fds = format!("/proc/{}/fd", d.daemon.child.id());
    let held = || {
        std::fs::read_dir(&daemon_fds)
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.starts_with(dir.path())))
            .map(|e| e.path())
    };
    let t0 = Instant::now();
    let (fd, at_kill) = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the daemon never wrote"
        );
        if let Some(fd) = held() {
            let n = std::fs::metadata(&fd).map(|m| m.len()).unwrap_or(0);
            if n > 0 {
                break (fd, n);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    cp.kill().unwrap();
    cp.wait().unwrap();
    let mut largest = at_kill;
    // Followed until the daemon lets the file go.
    while let Ok(m) = std::fs::metadata(&fd) {
        largest = largest.max(m.len());
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the daemon holds the file"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        largest < size / 2,
        "the daemon copied on for a client that was gone: {largest} of {size} bytes ({at_kill} when it was killed)"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left beside the target: {left:?}");
    // The same copy, let be, is whole.
    ctl_ok(&d, &["cp", "a/s:big.bin", target.to_str().unwrap()]);
    assert_eq!(std::fs::metadata(&target).unwrap().len(), size);
}

/// A checkpoint, a fork or an export taken while an upload is under way
/// leaves its partial file out (a fork, or the session rolled back once
/// the upload was gone, kept a hidden half file with no record, for
/// ever), and the upload goes on and commits.
#[test]
fn snapshots_taken_during_an_upload_leave_its_partial_file_out() {
    let Some(d) = setup(
        "snapshots_taken_during_an_upload_leave_its_partial_file_out",
        &[],
        1024,
    ) else {
        return;
    };
    ctl_ok(
        &d,
        &[
            "exec",
            "a",
            "s",
            "--",
            "sh",
            "-c",
            "mkdir -p dir && echo kept > dir/kept",
        ],
    );
    let chunk = |offset: u64, data: &[u8], commit: bool| {
        call(
            &d,
            Request::FsWrite(FsWrite {
                offset: Some(offset),
                upload: Some("u1".into()),
                commit,
                ..FsWrite::whole("a", "s", "dir/big.bin", data.to_vec())
            }),
        )
    };
    chunk(0, &[7u8; 300_000], false).unwrap();
    let partials = |tree: &Path| -> Vec<String> {
        std::fs::read_dir(tree.join("dir"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".allox-upload-"))
            .collect()
    };
    let sessions = d.daemon.root.join("agents/a/workspace/sessions");
    assert_eq!(partials(&current(&d)).len(), 1, "the upload's partial file");
    ctl_ok(&d, &["checkpoint", "create", "a", "s", "c1"]);
    ctl_ok(&d, &["session", "fork", "a", "s", "f1", "--from", "c1"]);
    ctl_ok(&d, &["session", "fork", "a", "s", "f2"]);
    let export = d.fs.scratch().join("s.allox");
    ctl_ok(
        &d,
        &[
            "session",
            "export",
            "a",
            "s",
            "-o",
            export.to_str().unwrap(),
        ],
    );
    ctl_ok(
        &d,
        &[
            "session",
            "import",
            "a",
            "imported",
            "-i",
            export.to_str().unwrap(),
        ],
    );
    for tree in [
        sessions.join("s/checkpoints/c1"),
        sessions.join("f1/current"),
        sessions.join("f2/current"),
        sessions.join("f2/checkpoints").join(FORK_BASELINE),
        sessions.join("imported/current"),
        sessions.join("imported/checkpoints/c1"),
    ] {
        assert!(
            tree.join("dir/kept").exists(),
            "{} lost a file",
            tree.display()
        );
        assert!(
            partials(&tree).is_empty(),
            "{} kept {:?}",
            tree.display(),
            partials(&tree)
        );
    }
    // The fork's baseline and current/ are the same tree.
    let (code, out, err) = ctl(&d, &["diff", "a", "f2", FORK_BASELINE, "current"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        !String::from_utf8_lossy(&out).contains("allox-upload"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    // The upload goes on, and commits.
    chunk(300_000, &[8u8; 100], true).unwrap();
    assert_eq!(
        std::fs::metadata(current(&d).join("dir/big.bin"))
            .unwrap()
            .len(),
        300_100
    );
    assert!(partials(&current(&d)).is_empty());
    // Rolled back to the checkpoint: no half file comes back.
    ctl_ok(&d, &["rollback", "a", "s", "c1"]);
    assert!(partials(&current(&d)).is_empty());
    assert!(!current(&d).join("dir/big.bin").exists());
}
