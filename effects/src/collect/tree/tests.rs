use super::*;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};

fn limits() -> TreeLimits {
    TreeLimits {
        threads: 2,
        ..TreeLimits::default()
    }
}

fn sha(b: &[u8]) -> String {
    format!("{:x}", Sha256::digest(b))
}

fn fixture() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    std::fs::write(p.join("a.txt"), b"hello").unwrap();
    std::fs::create_dir_all(p.join("d/e/f")).unwrap();
    std::fs::write(p.join("d/e/f/deep"), b"deep").unwrap();
    std::fs::write(p.join("d/x"), b"").unwrap();
    symlink("../a.txt", p.join("d/link")).unwrap();
    symlink("/etc/passwd", p.join("out")).unwrap();
    std::fs::set_permissions(p.join("a.txt"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::set_permissions(p.join("d/x"), std::fs::Permissions::from_mode(0o4604)).unwrap();
    t
}

#[test]
fn files_links_and_nested_directories_are_captured_with_their_values() {
    let t = fixture();
    let c = capture(t.path(), &limits());
    assert!(c.is_complete(), "{:?}", c.gaps);
    let uid = format!(
        "{}:{}",
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw()
    );
    let keys: Vec<_> = c.items.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            ".",
            "a.txt",
            "d",
            "d/e",
            "d/e/f",
            "d/e/f/deep",
            "d/link",
            "d/x",
            "out"
        ]
    );
    assert_eq!(
        c.items["a.txt"],
        format!("file 640 {uid} 5 {}", sha(b"hello"))
    );
    assert_eq!(c.items["d/x"], format!("file 4604 {uid} 0 {}", sha(b"")));
    assert_eq!(c.items["d/link"], "link -> ../a.txt");
    // A link out of the tree is recorded, never followed.
    assert_eq!(c.items["out"], "link -> /etc/passwd");
    assert!(c.items["d/e"].starts_with("dir "), "{}", c.items["d/e"]);
    assert!(c.items["."].starts_with("dir "));
    // Deterministic whatever the threads.
    let one = capture(
        t.path(),
        &TreeLimits {
            threads: 1,
            ..limits()
        },
    );
    assert_eq!(one, c);
    assert_eq!(digest(&one), digest(&c));
}

#[test]
fn a_file_changed_in_place_with_the_same_size_has_another_value_and_digest() {
    let t = fixture();
    let a = capture(t.path(), &limits());
    std::fs::write(t.path().join("a.txt"), b"jello").unwrap();
    let b = capture(t.path(), &limits());
    let d = crate::collect::compare(&a, &b);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].key, "a.txt");
    assert_ne!(digest(&a), digest(&b));
    // A mode change alone is a change too.
    std::fs::set_permissions(
        t.path().join("a.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let c = capture(t.path(), &limits());
    assert_eq!(crate::collect::compare(&b, &c).len(), 1);
}

#[test]
fn odd_names_are_escaped_so_no_key_holds_a_tab_or_a_newline() {
    let t = tempfile::tempdir().unwrap();
    let name = std::ffi::OsStr::from_bytes(b"a\tb\nc\\d\xff");
    std::fs::write(t.path().join(name), b"x").unwrap();
    let c = capture(t.path(), &limits());
    assert!(
        c.items.contains_key("a\\x09b\\x0ac\\\\d\\xff"),
        "{:?}",
        c.items.keys()
    );
}

#[test]
fn the_entries_limit_stops_the_walk_with_a_gap_naming_it() {
    let t = tempfile::tempdir().unwrap();
    for i in 0..50 {
        std::fs::write(t.path().join(format!("f{i}")), b"x").unwrap();
    }
    let c = capture(
        t.path(),
        &TreeLimits {
            entries: 10,
            ..limits()
        },
    );
    assert!(c.items.len() <= 10, "{}", c.items.len());
    assert!(
        c.gaps.iter().any(|g| g.contains("entries limit")),
        "{:?}",
        c.gaps
    );
    let full = capture(
        t.path(),
        &TreeLimits {
            entries: 51,
            ..limits()
        },
    );
    assert!(full.is_complete(), "{:?}", full.gaps);
    assert_eq!(full.items.len(), 51);
}

#[test]
fn the_bytes_limit_leaves_files_unhashed_with_a_gap_naming_it() {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("big"), vec![7u8; 4096]).unwrap();
    let c = capture(
        t.path(),
        &TreeLimits {
            bytes: 1000,
            ..limits()
        },
    );
    assert!(c.items["big"].ends_with(" 4096 -"), "{}", c.items["big"]);
    assert!(
        c.gaps.iter().any(|g| g.contains("bytes limit")),
        "{:?}",
        c.gaps
    );
    let ok = capture(
        t.path(),
        &TreeLimits {
            bytes: 4096,
            ..limits()
        },
    );
    assert!(ok.is_complete());
    assert!(ok.items["big"].ends_with(&sha(&[7u8; 4096])));
}

#[test]
fn fifos_are_listed_and_never_opened() {
    let t = tempfile::tempdir().unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        t.path().join("p"),
        FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let c = capture(t.path(), &limits());
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    assert_eq!(c.items["p"], format!("fifo 600 {uid}:{gid}"));
}

#[test]
fn a_change_of_group_or_of_extended_attributes_is_a_change() {
    // A file capability, an ACL or a `user.` attribute set on a file or a
    // directory, or its group changed: each a change (they were not
    // captured, so such a change came out CONSISTENT).
    let t = fixture();
    let p = t.path();
    let mut before = capture(p, &limits());
    type Step<'a> = (&'a str, Box<dyn Fn() + 'a>);
    let changes: [Step; 5] = [
        (
            "a.txt",
            Box::new(|| {
                rustix::fs::setxattr(
                    p.join("a.txt"),
                    "user.note",
                    b"1",
                    rustix::fs::XattrFlags::empty(),
                )
                .unwrap_or_else(|e| {
                    panic!(
                        "user xattrs on {}: {e} (the test needs a filesystem with user xattrs)",
                        p.display()
                    )
                })
            }),
        ),
        (
            "a.txt",
            Box::new(|| {
                rustix::fs::setxattr(
                    p.join("a.txt"),
                    "user.note",
                    b"2",
                    rustix::fs::XattrFlags::empty(),
                )
                .unwrap()
            }),
        ),
        (
            "d/e",
            Box::new(|| {
                rustix::fs::setxattr(
                    p.join("d/e"),
                    "user.dir",
                    b"x",
                    rustix::fs::XattrFlags::empty(),
                )
                .unwrap()
            }),
        ),
        (
            "a.txt",
            Box::new(|| rustix::fs::removexattr(p.join("a.txt"), "user.note").unwrap()),
        ),
        (
            "d/x",
            Box::new(|| {
                // Another group: one of ours if we have two, else root's
                // (which root may give).
                let gid = rustix::process::getegid().as_raw();
                let other = if gid == 0 { 4321 } else { 0 };
                rustix::fs::chown(p.join("d/x"), None, Some(rustix::fs::Gid::from_raw(other)))
                    .unwrap_or_else(|e| panic!("chgrp {other}: {e} (the test runs as root)"));
            }),
        ),
    ];
    for (key, change) in &changes {
        change();
        let after = capture(p, &limits());
        let d = crate::collect::compare(&before, &after);
        assert_eq!(
            d.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(),
            [*key],
            "{d:?}"
        );
        before = after;
    }
    assert!(
        before.items["d/e"].contains(" xattrs "),
        "{}",
        before.items["d/e"]
    );
    assert!(
        !before.items["a.txt"].contains(" xattrs "),
        "{}",
        before.items["a.txt"]
    );
}

#[test]
fn a_missing_root_is_a_gap() {
    let c = capture(Path::new("/nonexistent/allox-effects"), &limits());
    assert!(c.items.is_empty());
    assert_eq!(c.gaps.len(), 1);
}

#[test]
fn a_root_that_is_a_symlink_is_not_followed() {
    let t = fixture();
    let l = t.path().join("d/rootlink");
    symlink(t.path().join("d/e"), &l).unwrap();
    let c = capture(&l, &limits());
    assert!(c.items.is_empty() && !c.gaps.is_empty(), "{c:?}");
}

#[test]
fn the_digest_covers_gaps() {
    let mut a = Capture::new();
    a.insert("k", "v");
    let mut b = a.clone();
    b.gap("vanished: k");
    assert_ne!(digest(&a), digest(&b));
}

/// Timing for the record, run by hand (`--ignored --nocapture`); the
/// benchmark proper is tests/tests/effects_files.rs's on Btrfs.
#[test]
#[ignore]
fn time_ten_thousand_files() {
    let t = tempfile::tempdir_in("/var/tmp").unwrap();
    for d in 0..100 {
        let sub = t.path().join(format!("d{d}"));
        std::fs::create_dir(&sub).unwrap();
        for f in 0..100 {
            std::fs::write(
                sub.join(format!("f{f}")),
                format!("file {d} {f}\n").repeat(10),
            )
            .unwrap();
        }
    }
    for threads in [1, 2, 4] {
        let l = TreeLimits {
            threads,
            ..limits()
        };
        let mut v: Vec<_> = (0..5)
            .map(|_| {
                let s = std::time::Instant::now();
                assert_eq!(capture(t.path(), &l).items.len(), 10_101);
                s.elapsed()
            })
            .collect();
        v.sort();
        eprintln!("{threads} thread(s): median {:?} min {:?}", v[2], v[0]);
    }
}
