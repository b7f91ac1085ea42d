use super::*;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// A source tree and a session directory.
fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("tmp");
    let session = t.path().join("session");
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&session).unwrap();
    (t, src, session)
}

fn run(src: &Path, session: &Path, budget: Budget) -> Synced {
    sync(&c(src), &c(session), c".allox-tmp", budget).unwrap()
}

fn mkfifo(p: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
}

#[test]
fn regular_files_are_kept_and_the_rest_left_out() {
    let (_t, src, session) = dirs();
    std::fs::write(src.join("a"), "one").unwrap();
    std::fs::create_dir_all(src.join("d/e")).unwrap();
    std::fs::write(src.join("d/e/b"), "two").unwrap();
    mkfifo(&src.join("fifo"));
    std::os::unix::fs::symlink("/etc/passwd", src.join("link")).unwrap();
    std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap();
    let out = run(&src, &session, Budget::with_bytes(1 << 20));
    assert_eq!((out.files, out.bytes, out.truncated), (2, 6, false));
    let kept = session.join(".allox-tmp");
    assert_eq!(std::fs::read_to_string(kept.join("a")).unwrap(), "one");
    assert_eq!(std::fs::read_to_string(kept.join("d/e/b")).unwrap(), "two");
    for gone in ["fifo", "link", "sock"] {
        assert!(
            std::fs::symlink_metadata(kept.join(gone)).is_err(),
            "{gone}"
        );
    }
}

#[test]
fn nothing_to_copy_makes_no_directory() {
    let (_t, src, session) = dirs();
    mkfifo(&src.join("fifo"));
    std::fs::create_dir_all(src.join("empty/deeper")).unwrap();
    run(&src, &session, Budget::with_bytes(1 << 20));
    assert!(!session.join(".allox-tmp").exists());
}

#[test]
fn a_deep_tree_stops_at_the_depth_budget_with_few_descriptors() {
    let (_t, src, session) = dirs();
    // 1,000 levels, walked without recursion and without paths.
    let mut fd = rustix::fs::open(&src, DIR_FLAGS, Mode::empty()).unwrap();
    for level in 1..=1000 {
        rustix::fs::mkdirat(&fd, c"d", Mode::from_raw_mode(0o755)).unwrap();
        fd = rustix::fs::openat(&fd, c"d", DIR_FLAGS, Mode::empty()).unwrap();
        if level == 10 || level == 1000 {
            let f = rustix::fs::openat(
                &fd,
                c"f",
                OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
            .unwrap();
            rustix::io::write(&f, b"x").unwrap();
        }
    }
    drop(fd);
    let budget = Budget {
        depth: 64,
        ..Budget::with_bytes(1 << 20)
    };
    let out = run(&src, &session, budget);
    assert_eq!(out.peak_open_dirs, 65, "{out:?}");
    assert_eq!(out.files, 1, "{out:?}");
    assert!(out.truncated);
    let ten = (0..10).fold(session.join(".allox-tmp"), |p, _| p.join("d"));
    assert_eq!(std::fs::read(ten.join("f")).unwrap(), b"x");
}

#[test]
fn budgets_of_bytes_files_and_entries_hold() {
    let (_t, src, session) = dirs();
    // A sparse 1 TiB file is skipped without being read.
    let big = std::fs::File::create(src.join("sparse")).unwrap();
    big.set_len(1 << 40).unwrap();
    for i in 0..20 {
        std::fs::write(src.join(format!("f{i:02}")), [b'x'; 100]).unwrap();
    }
    let out = run(&src, &session, Budget::with_bytes(1000));
    assert_eq!(out.files, 10, "{out:?}");
    assert_eq!(out.bytes, 1000);
    assert!(out.skipped >= 11);
    assert!(std::fs::symlink_metadata(session.join(".allox-tmp/sparse")).is_err());

    let (_t, src, session) = dirs();
    for i in 0..20 {
        std::fs::write(src.join(format!("f{i:02}")), "x").unwrap();
    }
    let files = Budget {
        files: 5,
        ..Budget::with_bytes(1 << 20)
    };
    let out = run(&src, &session, files);
    assert_eq!((out.files, out.truncated), (5, true));
    let entries = Budget {
        entries: 7,
        ..Budget::with_bytes(1 << 20)
    };
    let out = run(&src, &session, entries);
    assert_eq!((out.files, out.truncated), (7, true));
}

/// The walk saw a regular file; by the time it opens the name, something
/// else is there.
fn swapped(replace: impl FnOnce(&Path)) -> (Option<u64>, tempfile::TempDir, PathBuf) {
    let (t, src, session) = dirs();
    std::fs::write(src.join("f"), "walked").unwrap();
    std::fs::write(src.join("other"), "secret").unwrap();
    let root = Rc::new(Node {
        fd: rustix::fs::open(&src, DIR_FLAGS, Mode::empty()).unwrap(),
        name: c".allox-tmp".to_owned(),
        parent: None,
        dest: RefCell::new(Dest::Unmade),
        _counted: Counted::new(&Rc::default()),
    });
    let walked = rustix::fs::statat(&root.fd, c"f", AtFlags::SYMLINK_NOFOLLOW).unwrap();
    replace(&src.join("f"));
    let dest = rustix::fs::open(&session, DIR_FLAGS, Mode::empty()).unwrap();
    let copied = copy_file(&root, c"f", &walked, 1 << 20, &dest);
    (copied, t, session)
}

#[test]
fn a_file_swapped_for_a_fifo_does_not_block() {
    let (copied, _t, session) = swapped(|p| {
        std::fs::remove_file(p).unwrap();
        mkfifo(p);
    });
    assert_eq!(copied, None);
    let kept = session.join(".allox-tmp/f");
    assert!(!std::fs::symlink_metadata(&kept).is_ok_and(|m| m.file_type().is_fifo()));
}

#[test]
fn a_file_swapped_for_a_symlink_or_another_file_is_not_copied() {
    let (copied, _t, _s) = swapped(|p| {
        std::fs::remove_file(p).unwrap();
        std::os::unix::fs::symlink(p.with_file_name("other"), p).unwrap();
    });
    assert_eq!(copied, None);
    let (copied, _t, _s) = swapped(|p| {
        std::fs::rename(p.with_file_name("other"), p).unwrap();
    });
    assert_eq!(copied, None);
}

#[test]
fn a_growing_file_is_copied_up_to_the_size_walked() {
    let (copied, _t, session) = swapped(|p| {
        let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
        f.write_all(&[b'y'; 100_000]).unwrap();
    });
    assert_eq!(copied, Some(6));
    let kept = session.join(".allox-tmp/f");
    assert_eq!(std::fs::read(&kept).unwrap(), b"walked");
    assert_eq!(std::fs::metadata(&kept).unwrap().size(), 6);
}

#[test]
fn planted_symlinks_in_the_destination_are_not_followed() {
    let (t, src, session) = dirs();
    let elsewhere = t.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/f"), "x").unwrap();
    std::fs::write(src.join("top"), "y").unwrap();
    std::fs::write(elsewhere.join("theirs"), "z").unwrap();
    // `.allox-tmp/d` points elsewhere: the copy is made anew beside it,
    // and the earlier one removed without following the link.
    let kept = session.join(".allox-tmp");
    std::fs::create_dir(&kept).unwrap();
    std::os::unix::fs::symlink(&elsewhere, kept.join("d")).unwrap();
    let out = run(&src, &session, Budget::with_bytes(1 << 20));
    let there: Vec<_> = std::fs::read_dir(&elsewhere)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(there, ["theirs"]);
    assert_eq!((out.files, out.skipped), (2, 0), "{out:?}");
    assert_eq!(std::fs::read_to_string(kept.join("top")).unwrap(), "y");
    assert_eq!(std::fs::read_to_string(kept.join("d/f")).unwrap(), "x");
    assert!(!std::fs::symlink_metadata(kept.join("d"))
        .unwrap()
        .is_symlink());
    // `.allox-tmp` itself a symlink: replaced by a real directory.
    std::fs::remove_dir_all(&kept).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &kept).unwrap();
    let out = run(&src, &session, Budget::with_bytes(1 << 20));
    assert!(std::fs::symlink_metadata(&kept).unwrap().is_dir());
    assert_eq!(out.files, 2, "{out:?}");
    // Nothing written through it, nothing removed through it.
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 1);
}

/// A copy replaces the earlier one whole: the earlier run's files are
/// not mixed in, and nothing is left beside it.
#[test]
fn a_copy_replaces_the_earlier_one_whole() {
    let (_t, src, session) = dirs();
    std::fs::write(src.join("one"), "1").unwrap();
    std::fs::write(src.join("both"), "first").unwrap();
    run(&src, &session, Budget::with_bytes(1 << 20));
    std::fs::remove_file(src.join("one")).unwrap();
    std::fs::write(src.join("both"), "second").unwrap();
    std::fs::write(src.join("two"), "2").unwrap();
    run(&src, &session, Budget::with_bytes(1 << 20));
    let kept = session.join(".allox-tmp");
    let mut names: Vec<_> = std::fs::read_dir(&kept)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["both", "two"]);
    assert_eq!(
        std::fs::read_to_string(kept.join("both")).unwrap(),
        "second"
    );
    let beside: Vec<_> = std::fs::read_dir(&session)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(beside, [".allox-tmp"]);
}

/// A half-made copy (its run killed during the copy) is removed by the
/// next one; one being made (locked) is left alone.
#[test]
fn a_half_made_copy_is_swept_and_one_being_made_is_not() {
    let (_t, src, session) = dirs();
    std::fs::write(src.join("f"), "x").unwrap();
    let stale = session.join(".allox-tmp.partial-0000dead");
    std::fs::create_dir_all(stale.join("sub")).unwrap();
    std::fs::write(stale.join("sub/half"), "h").unwrap();
    let busy = session.join(".allox-tmp.partial-0000beef");
    std::fs::create_dir(&busy).unwrap();
    let held = std::fs::File::open(&busy).unwrap();
    rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();
    run(&src, &session, Budget::with_bytes(1 << 20));
    assert!(!stale.exists(), "the half-made copy is still there");
    assert!(busy.exists(), "a copy being made was removed");
    assert_eq!(
        std::fs::read_to_string(session.join(".allox-tmp/f")).unwrap(),
        "x"
    );
}
