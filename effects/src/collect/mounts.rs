//! The `mount` domain: `/proc/<pid>/mountinfo` of each mount namespace
//! involved, each given a label (`host`, `session`), the same namespace
//! read once (by the inode of `/proc/<pid>/ns/mnt`, under the first label
//! that names it).
//!
//! Key `LABEL MOUNTPOINT#N` (N counts the mounts stacked on one point, in
//! the namespace's order, from 1); value the filesystem type, source, root
//! inside the filesystem, mount options, superblock options and propagation
//! (`shared:N`, `master:N`, `unbindable`). Mount ids, parent ids and device
//! numbers are left out: they are not stable across an unmount and an
//! identical mount, and say nothing the rest does not.

use super::Capture;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;

/// Captures the mount tables of the namespaces of `pids` (`(label, pid)`).
pub fn capture(pids: &[(&str, i32)]) -> Capture {
    capture_from("/proc", pids)
}

/// As [`capture`], with `/proc` at `proc_root` (a seam for tests).
pub fn capture_from(proc_root: &str, pids: &[(&str, i32)]) -> Capture {
    let mut c = Capture::new();
    let mut seen = BTreeSet::new();
    for (label, pid) in pids {
        let ns = format!("{proc_root}/{pid}/ns/mnt");
        match std::fs::metadata(&ns) {
            Ok(m) => {
                if !seen.insert((m.dev(), m.ino())) {
                    continue;
                }
            }
            Err(e) => {
                c.gap(format!("mount: {label}: {ns}: {e}"));
                continue;
            }
        }
        let path = format!("{proc_root}/{pid}/mountinfo");
        match std::fs::read_to_string(&path) {
            Ok(text) => parse_mountinfo(label, &text, &mut c),
            Err(e) => c.gap(format!("mount: {label}: {path}: {e}")),
        }
    }
    c
}

/// Adds the mounts of one `mountinfo` text, under `label`, to `c`. A line
/// that does not parse is a gap.
pub fn parse_mountinfo(label: &str, text: &str, c: &mut Capture) {
    let mut stacked: BTreeMap<&str, usize> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Some(m) = parse_line(line) else {
            c.gap(format!(
                "mount: {label}: a mountinfo line does not parse: {line:?}"
            ));
            continue;
        };
        let n = stacked.entry(m.mountpoint).or_insert(0);
        *n += 1;
        let prop = if m.optional.is_empty() {
            "private".to_string()
        } else {
            m.optional.join(" ")
        };
        c.insert(
            format!("{label} {}#{n}", m.mountpoint),
            format!(
                "{} {} root={} opts={} super={} prop={prop}",
                m.fstype, m.source, m.root, m.options, m.super_options
            ),
        );
    }
}

struct Line<'a> {
    root: &'a str,
    mountpoint: &'a str,
    options: &'a str,
    optional: Vec<&'a str>,
    fstype: &'a str,
    source: &'a str,
    super_options: &'a str,
}

/// `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER`
fn parse_line(line: &str) -> Option<Line<'_>> {
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let _id = l.next()?;
    let _parent = l.next()?;
    let _dev = l.next()?;
    let root = l.next()?;
    let mountpoint = l.next()?;
    let options = l.next()?;
    let optional = l.collect();
    let mut r = right.split(' ');
    let fstype = r.next()?;
    let source = r.next()?;
    let super_options = r.next().unwrap_or("");
    Some(Line {
        root,
        mountpoint,
        options,
        optional,
        fstype,
        source,
        super_options,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw
25 1 0:23 / /tmp rw,nosuid,nodev shared:7 - tmpfs tmpfs rw,size=1024k
40 25 0:23 /a /tmp/b rw,nosuid,nodev shared:7 - tmpfs tmpfs rw,size=1024k
41 25 0:30 / /tmp rw,relatime - tmpfs none rw
42 1 0:31 / /with\\040space ro master:3 unbindable - ext4 /dev/vda rw
";

    #[test]
    fn mounts_are_keyed_by_point_and_stack_without_ids() {
        let mut c = Capture::new();
        parse_mountinfo("host", HOST, &mut c);
        assert!(c.is_complete(), "{:?}", c.gaps);
        let got: Vec<_> = c
            .items
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "host /proc#1",
                    "proc proc root=/ opts=rw,nosuid,nodev,noexec,relatime super=rw prop=shared:5"
                ),
                (
                    "host /tmp#1",
                    "tmpfs tmpfs root=/ opts=rw,nosuid,nodev super=rw,size=1024k prop=shared:7"
                ),
                (
                    "host /tmp#2",
                    "tmpfs none root=/ opts=rw,relatime super=rw prop=private"
                ),
                (
                    "host /tmp/b#1",
                    "tmpfs tmpfs root=/a opts=rw,nosuid,nodev super=rw,size=1024k prop=shared:7"
                ),
                (
                    "host /with\\040space#1",
                    "ext4 /dev/vda root=/ opts=ro super=rw prop=master:3 unbindable"
                ),
            ]
        );
    }

    #[test]
    fn the_same_mounts_under_new_ids_are_the_same_capture() {
        let renumbered = HOST
            .replace("40 25 0:23", "90 75 0:99")
            .replace("22 1", "72 51");
        let (mut a, mut b) = (Capture::new(), Capture::new());
        parse_mountinfo("host", HOST, &mut a);
        parse_mountinfo("host", &renumbered, &mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn a_broken_line_is_a_gap() {
        let mut c = Capture::new();
        parse_mountinfo("host", "22 1 0:21 / /proc rw\n", &mut c);
        assert_eq!(c.gaps.len(), 1);
        assert!(c.items.is_empty());
    }

    #[test]
    fn one_namespace_is_read_once_and_a_missing_pid_is_a_gap() {
        let me = std::process::id() as i32;
        let c = capture(&[("host", me), ("again", me), ("gone", i32::MAX)]);
        assert!(c.items.keys().any(|k| k.starts_with("host /")));
        assert!(!c.items.keys().any(|k| k.starts_with("again ")));
        assert_eq!(c.gaps.len(), 1, "{:?}", c.gaps);
    }
}
