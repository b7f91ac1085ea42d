//! The `sysctl` domain: every readable file under `/proc/sys`, as `sysctl`
//! names it (`net.ipv4.ip_forward`, a dot inside a path component written
//! as `/`: `net.ipv4.conf.eth0/100.forwarding`), its text trimmed.
//!
//! With a network namespace, only `net.*` as that namespace sees it: a
//! scoped thread joins the namespace (`setns`) and walks `/proc/sys/net`,
//! which the kernel resolves against the reading task's network namespace.
//!
//! Skipped, never a gap: files that are write-only by mode
//! (`vm.drop_caches`, `net.ipv4.route.flush`), and the keys in `volatile`
//! ([`VOLATILE`]: values that change on their own). A readable file whose
//! read fails with `EIO` or `ENODATA` (`stable_secret` while unset) is an
//! observation, `!EIO`; any other failure is a gap. Secrets
//! (`*.stable_secret`) are kept as their SHA-256, never as text.

use super::Capture;
use sha2::{Digest, Sha256};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Keys whose values change on their own, skipped by both captures. An
/// entry ending in `*` is a prefix. Found by capturing twice, seconds
/// apart, on an idle machine and during a workspace build: the ones that
/// moved are the first five; the rest are counters of the same kind
/// (current counts, not settings).
pub const VOLATILE: &[&str] = &[
    "fs.dentry-state",
    "fs.inode-nr",
    "fs.inode-state",
    "kernel.ns_last_pid",
    "kernel.random.*",
    "fs.file-nr",
    "fs.aio-nr",
    "fs.quota.*",
    "fs.fanotify.*_used",
    "kernel.pty.nr",
    "kernel.keys.*_used",
    "net.netfilter.nf_conntrack_count",
    "net.netfilter.nf_conntrack_expect_count",
    "user.*_used",
];

/// Root of the tree read; a seam for tests.
const PROC_SYS: &str = "/proc/sys";

/// Captures `/proc/sys` (all of it, or `net.*` of the network namespace
/// `netns`), skipping the keys `volatile` matches.
pub fn capture(netns: Option<BorrowedFd>, volatile: &[&str]) -> Capture {
    match netns {
        None => capture_under(Path::new(PROC_SYS), "", volatile),
        Some(fd) => super::ns::in_netns(fd, "sysctl", || {
            capture_under(&Path::new(PROC_SYS).join("net"), "net", volatile)
        }),
    }
}

/// Walks `root`, naming each file `prefix.a.b`.
pub fn capture_under(root: &Path, prefix: &str, volatile: &[&str]) -> Capture {
    let mut c = Capture::new();
    walk(root, prefix, volatile, &mut c);
    c
}

fn walk(dir: &Path, key: &str, volatile: &[&str], c: &mut Capture) {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => return c.gap(format!("sysctl: {}: cannot list: {e}", dir.display())),
    };
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                c.gap(format!("sysctl: {}: cannot list: {e}", dir.display()));
                continue;
            }
        };
        let name = entry.file_name().to_string_lossy().replace('.', "/");
        let k = if key.is_empty() {
            name
        } else {
            format!("{key}.{name}")
        };
        if is_volatile(&k, volatile) {
            continue;
        }
        let path = entry.path();
        let meta = match entry.metadata() {
            Ok(m) => m,
            Err(e) => {
                c.gap(format!("sysctl: {k}: {e}"));
                continue;
            }
        };
        if meta.is_dir() {
            walk(&path, &k, volatile, c);
            continue;
        }
        if meta.permissions().mode() & 0o444 == 0 {
            continue; // write-only: nothing to read
        }
        match std::fs::read(&path) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                c.insert(k.clone(), value_of(&k, &text));
            }
            Err(e) => match e.raw_os_error() {
                Some(libc::EIO) => c.insert(k, "!EIO"),
                Some(libc::ENODATA) => c.insert(k, "!ENODATA"),
                // Vanished between listing and reading (a device went).
                Some(libc::ENOENT) => {}
                _ => c.gap(format!("sysctl: {k}: cannot read: {e}")),
            },
        }
    }
}

/// The value kept for `key` read as `text`: trimmed, a secret hashed.
pub fn value_of(key: &str, text: &str) -> String {
    let v = text.trim();
    if key.ends_with(".stable_secret") {
        let h = Sha256::digest(v.as_bytes());
        let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
        return format!("sha256:{hex}");
    }
    // Multi-line values (`kernel.printk`-like tables) on one line.
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `key` matches an entry of `volatile` (exact, or `prefix*`
/// where `*` stands for any rest).
pub fn is_volatile(key: &str, volatile: &[&str]) -> bool {
    volatile.iter().any(|v| match v.split_once('*') {
        Some((pre, suf)) => {
            key.len() >= pre.len() + suf.len() && key.starts_with(pre) && key.ends_with(suf)
        }
        None => key == *v,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn volatile_entries_match_exactly_or_by_pattern() {
        assert!(is_volatile("kernel.random.uuid", VOLATILE));
        assert!(is_volatile("fs.dentry-state", VOLATILE));
        assert!(is_volatile(
            "user.max_user_namespaces_used",
            &["user.*_used"]
        ));
        assert!(!is_volatile("kernel.randomize_va_space", VOLATILE));
        assert!(!is_volatile("fs.dentry-state2", VOLATILE));
        assert!(!is_volatile("net.ipv4.ip_forward", VOLATILE));
    }

    #[test]
    fn tree_is_named_as_sysctl_names_it_and_write_only_files_are_skipped() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fs::create_dir_all(r.join("net/ipv4/conf/eth0.100")).unwrap();
        fs::create_dir_all(r.join("kernel/random")).unwrap();
        fs::write(r.join("net/ipv4/ip_forward"), "1\n").unwrap();
        fs::write(r.join("net/ipv4/conf/eth0.100/forwarding"), "0\n").unwrap();
        fs::write(r.join("kernel/printk"), "4\t4\t1\t7\n").unwrap();
        fs::write(r.join("kernel/random/uuid"), "x\n").unwrap();
        fs::write(r.join("vm_drop"), "").unwrap();
        fs::set_permissions(r.join("vm_drop"), fs::Permissions::from_mode(0o200)).unwrap();
        let c = capture_under(r, "", VOLATILE);
        let got: Vec<_> = c
            .items
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("kernel.printk", "4 4 1 7"),
                ("net.ipv4.conf.eth0/100.forwarding", "0"),
                ("net.ipv4.ip_forward", "1"),
            ]
        );
        assert!(c.is_complete(), "{:?}", c.gaps);
    }

    #[test]
    fn a_missing_tree_is_a_gap() {
        let c = capture_under(Path::new("/nonexistent/allox"), "", &[]);
        assert_eq!(c.gaps.len(), 1, "{:?}", c.gaps);
    }

    #[test]
    fn secrets_are_hashed() {
        let v = value_of("net.ipv6.conf.all.stable_secret", "fe80::1\n");
        assert!(v.starts_with("sha256:") && !v.contains("fe80"), "{v}");
        assert_eq!(value_of("net.ipv4.ip_forward", " 1\n"), "1");
    }
}
