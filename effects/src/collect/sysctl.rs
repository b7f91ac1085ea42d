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
use rustix::fd::OwnedFd;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::{Condvar, Mutex};

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
/// `netns`), skipping the keys `volatile` matches. The files' descriptors
/// are kept for the next capture of the same namespace ([`KEPT`]).
pub fn capture(netns: Option<BorrowedFd>, volatile: &[&str]) -> Capture {
    let space = match netns {
        None => std::fs::metadata("/proc/self/ns/net")
            .map(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino())
            })
            .ok(),
        Some(fd) => rustix::fs::fstat(fd).map(|st| (st.st_dev, st.st_ino)).ok(),
    };
    // Kept only where the descriptors fit well within the process's limit.
    let space = space.filter(|_| {
        rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .is_some_and(|n| n >= KEEP_WITH_NOFILE)
    });
    let keep = space.is_some();
    let mut files = space.map(take_kept).unwrap_or_default();
    let c = match netns {
        None => capture_kept(Path::new(PROC_SYS), "", volatile, &mut files, keep),
        Some(fd) => super::ns::in_netns(fd, "sysctl", || {
            capture_kept(
                &Path::new(PROC_SYS).join("net"),
                "net",
                volatile,
                &mut files,
                keep,
            )
        }),
    };
    if let Some(space) = space {
        put_kept(space, files);
    }
    c
}

/// A namespace's kept descriptors: by the top-level directory they are
/// under (each walked on a thread of its own), then by key.
type Files = HashMap<String, HashMap<String, OwnedFd>>;

/// The descriptors of `/proc/sys` files kept between captures, for the
/// [`KEPT_SPACES`] namespaces captured last (a network namespace by its
/// device and inode): opening a file there costs more than reading it, so
/// a capture rereads each kept file from its start and opens only the new
/// ones. A file whose table went (a device removed) answers `ENOENT` and
/// is opened again by its name; the directories are listed every time, so
/// a file added or removed is seen.
static KEPT: Mutex<Vec<((u64, u64), Files)>> = Mutex::new(Vec::new());

/// Most namespaces whose descriptors are kept (the machine's and a few
/// sessions'; each about a thousand descriptors).
pub const KEPT_SPACES: usize = 4;

/// The open-files limit (`RLIMIT_NOFILE`) from which descriptors are kept:
/// [`KEPT_SPACES`] namespaces' files take a third of it at most.
pub const KEEP_WITH_NOFILE: u64 = 16384;

/// Kept descriptors are moved to this number and above, out of the way of
/// the process's other descriptors: whoever lists a process's BPF
/// descriptors (the bpf domain, [`crate::observer`]) stops below it rather
/// than reading a thousand `/proc/sys` files' `fdinfo`.
pub const KEPT_FD_BASE: i32 = 8192;

fn take_kept(space: (u64, u64)) -> Files {
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    match kept.iter().position(|(s, _)| *s == space) {
        Some(i) => kept.remove(i).1,
        None => Files::default(),
    }
}

fn put_kept(space: (u64, u64), files: Files) {
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    kept.push((space, files));
    while kept.len() > KEPT_SPACES {
        kept.remove(0);
    }
}

/// Walks `root`, naming each file `prefix.a.b`, without keeping
/// descriptors.
pub fn capture_under(root: &Path, prefix: &str, volatile: &[&str]) -> Capture {
    capture_kept(root, prefix, volatile, &mut Files::default(), false)
}

/// Walks `root`, naming each file `prefix.a.b`, on a few threads that
/// take directories from one queue: the root's own files are read here;
/// a directory directly under the root is read for its files and its
/// subdirectories are queued (`/proc/sys/net` alone holds four files in
/// five, most of them below `net.ipv4` and `net.ipv6`); a directory below
/// that is walked whole by the thread that took it. A thread made by a
/// thread inside a network namespace is inside it too. The files are
/// opened relative to their directory's descriptor, their kind taken from
/// the directory entry, or reread through the descriptors in `files`,
/// which are left holding every file read (by the directory they were
/// read under; moved to [`KEPT_FD_BASE`] and above when `high`).
fn capture_kept(
    root: &Path,
    prefix: &str,
    volatile: &[&str],
    files: &mut Files,
    high: bool,
) -> Capture {
    let mut c = Capture::new();
    let dir = match open_dir(rustix::fs::CWD, root) {
        Ok(d) => d,
        Err(e) => {
            c.gap(format!("sysctl: {}: cannot list: {e}", root.display()));
            return c;
        }
    };
    // The descriptors kept by the last capture, by directory, each taken
    // out by the walk of its directory; those left (directories gone) are
    // closed at the end.
    let pool = Mutex::new(std::mem::take(files));
    let kept_under = |key: &str| {
        pool.lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
            .unwrap_or_default()
    };
    let mut first = Vec::new();
    let mut top = Walker {
        volatile,
        old: kept_under(""),
        new: HashMap::new(),
        buf: vec![0u8; 4096],
        high,
    };
    top.walk(
        &dir,
        &root.display().to_string(),
        prefix,
        &mut c,
        Some(&mut first),
    );
    let mut kept = Files::new();
    kept.insert(String::new(), top.new);
    // (directory, path, key, whether only its files are read here and its
    // subdirectories queued, the descriptors kept under it)
    type Unit = (OwnedFd, String, String, bool, HashMap<String, OwnedFd>);
    // What a thread read: per directory, its items and the descriptors
    // kept under it.
    type Done = Vec<(Capture, String, HashMap<String, OwnedFd>)>;
    // The directories to walk, and how many are being split (whose
    // subdirectories are still to come): a thread ends when there is
    // nothing to take and nothing is coming.
    let queue: Mutex<(Vec<Unit>, usize)> = Mutex::new((
        first
            .into_iter()
            .rev()
            .map(|(fd, path, key)| {
                let old = kept_under(&key);
                (fd, path, key, true, old)
            })
            .collect(),
        0,
    ));
    let more = Condvar::new();
    let take = || {
        let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(u) = q.0.pop() {
                if u.3 {
                    q.1 += 1;
                }
                return Some(u);
            }
            if q.1 == 0 {
                return None;
            }
            q = more.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    };
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4));
    let parts: Vec<Done> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    let mut buf = vec![0u8; 4096];
                    while let Some((fd, path, key, split, old)) = take() {
                        let mut part = Capture::new();
                        let mut w = Walker {
                            volatile,
                            old,
                            new: HashMap::new(),
                            buf: std::mem::take(&mut buf),
                            high,
                        };
                        if split {
                            // Counted out even if the walk panics, so that
                            // the others do not wait for it forever.
                            struct Splitting<'q>(&'q Mutex<(Vec<Unit>, usize)>, &'q Condvar);
                            impl Drop for Splitting<'_> {
                                fn drop(&mut self) {
                                    self.0.lock().unwrap_or_else(|e| e.into_inner()).1 -= 1;
                                    self.1.notify_all();
                                }
                            }
                            let _counted = Splitting(&queue, &more);
                            let mut below = Vec::new();
                            w.walk(&fd, &path, &key, &mut part, Some(&mut below));
                            let below: Vec<Unit> = below
                                .into_iter()
                                .rev()
                                .map(|(fd, path, k)| {
                                    let old = kept_under(&k);
                                    (fd, path, k, false, old)
                                })
                                .collect();
                            queue
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .0
                                .extend(below);
                        } else {
                            w.walk(&fd, &path, &key, &mut part, None);
                        }
                        buf = std::mem::take(&mut w.buf);
                        done.push((part, key, w.new));
                    }
                    done
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    let mut g = Capture::new();
                    g.gap(format!("sysctl: {}: a walk panicked", root.display()));
                    vec![(g, String::new(), HashMap::new())]
                })
            })
            .collect()
    });
    for (p, key, new) in parts.into_iter().flatten() {
        c.items.extend(p.items);
        c.gaps.extend(p.gaps);
        kept.entry(key).or_default().extend(new);
    }
    // Directories that are gone take their descriptors with them.
    drop(pool);
    *files = kept;
    c
}

fn open_dir(
    at: impl rustix::fd::AsFd,
    path: impl rustix::path::Arg,
) -> rustix::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::openat(
        at,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
}

/// One thread's walk: the descriptors it was given (`old`), those it
/// keeps (`new`).
struct Walker<'a> {
    volatile: &'a [&'a str],
    old: HashMap<String, OwnedFd>,
    new: HashMap<String, OwnedFd>,
    buf: Vec<u8>,
    /// Whether a newly opened file's descriptor moves to [`KEPT_FD_BASE`].
    high: bool,
}

impl Walker<'_> {
    /// Reads the directory `dir` (`path`, for messages), naming its entries
    /// `key.name`; subdirectories are walked here, or handed to `defer`
    /// when given.
    fn walk(
        &mut self,
        dir: &OwnedFd,
        path: &str,
        key: &str,
        c: &mut Capture,
        mut defer: Option<&mut Vec<(OwnedFd, String, String)>>,
    ) {
        use rustix::fs::FileType;
        let entries = match rustix::fs::Dir::read_from(dir) {
            Ok(e) => e,
            Err(e) => return c.gap(format!("sysctl: {path}: cannot list: {e}")),
        };
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    c.gap(format!("sysctl: {path}: cannot list: {e}"));
                    break;
                }
            };
            let raw = entry.file_name();
            if raw.to_bytes() == b"." || raw.to_bytes() == b".." {
                continue;
            }
            let name = raw.to_string_lossy().replace('.', "/");
            let k = if key.is_empty() {
                name
            } else {
                format!("{key}.{name}")
            };
            if is_volatile(&k, self.volatile) {
                continue;
            }
            let mut kind = entry.file_type();
            if kind == FileType::Unknown {
                kind = match rustix::fs::statat(dir, raw, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => FileType::from_raw_mode(st.st_mode),
                    Err(e) => {
                        c.gap(format!("sysctl: {k}: {e}"));
                        continue;
                    }
                };
            }
            if kind == FileType::Directory {
                let sub_path = format!("{path}/{}", raw.to_string_lossy());
                match open_dir(dir, raw) {
                    Ok(sub) => match defer.as_deref_mut() {
                        Some(d) => d.push((sub, sub_path, k)),
                        None => self.walk(&sub, &sub_path, &k, c, None),
                    },
                    Err(e) => c.gap(format!("sysctl: {sub_path}: cannot list: {e}")),
                }
                continue;
            }
            self.file(dir, raw, k, c);
        }
    }

    /// Reads one file: through its kept descriptor from the start, or
    /// opened by name (and kept).
    fn file(&mut self, dir: &OwnedFd, raw: &std::ffi::CStr, k: String, c: &mut Capture) {
        use rustix::fs::{Mode, OFlags};
        let k = match self.old.remove(&k) {
            Some(fd) => match self.read(k, fd, c) {
                Ok(()) => return,
                // Its table went (and may be back under the same name):
                // opened again below.
                Err(k) => k,
            },
            None => k,
        };
        let fd = match rustix::fs::openat(dir, raw, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        {
            Ok(fd) => fd,
            Err(rustix::io::Errno::ACCESS) if write_only(dir, raw) => return,
            Err(rustix::io::Errno::NOENT) => return, // vanished (a device went)
            Err(e) => return c.gap(format!("sysctl: {k}: cannot read: {e}")),
        };
        match rustix::fs::fstat(&fd) {
            Ok(st) if st.st_mode & 0o444 == 0 => return, // write-only: nothing to read
            Ok(_) => {}
            Err(e) => return c.gap(format!("sysctl: {k}: {e}")),
        }
        let fd = if self.high {
            match rustix::io::fcntl_dupfd_cloexec(&fd, KEPT_FD_BASE) {
                Ok(high) => high,
                Err(e) => return c.gap(format!("sysctl: {k}: cannot keep: {e}")),
            }
        } else {
            fd
        };
        if let Err(k) = self.read(k, fd, c) {
            c.gap(format!(
                "sysctl: {k}: cannot read: {}",
                rustix::io::Errno::NOENT
            ));
        }
    }

    /// Reads `fd` from its start as `k`'s value and keeps it; `Err(k)` when
    /// its table went (`ENOENT`), nothing recorded.
    fn read(&mut self, k: String, fd: OwnedFd, c: &mut Capture) -> Result<(), String> {
        match read_all(&fd, &mut self.buf) {
            Ok(n) => {
                let v = value_of(&k, &String::from_utf8_lossy(&self.buf[..n]));
                c.insert(k.clone(), v);
                self.new.insert(k, fd);
            }
            Err(rustix::io::Errno::NOENT) => return Err(k),
            Err(rustix::io::Errno::IO) => c.insert(k, "!EIO"),
            Err(rustix::io::Errno::NODATA) => c.insert(k, "!ENODATA"),
            Err(e) => c.gap(format!("sysctl: {k}: cannot read: {e}")),
        }
        Ok(())
    }
}

/// Whether `name` in `dir` is write-only by mode (root is refused reading
/// those in `/proc/sys`).
fn write_only(dir: &OwnedFd, name: &std::ffi::CStr) -> bool {
    rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| st.st_mode & 0o444 == 0)
}

/// Reads `fd` from its start to its end into `buf` (grown as needed); the
/// length read. A sysctl's handler writes all it has into a read's buffer
/// when it fits, so a read that leaves room is the end: one call a file,
/// not two.
fn read_all(fd: &OwnedFd, buf: &mut Vec<u8>) -> rustix::io::Result<usize> {
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        let room = buf.len() - n;
        match rustix::io::pread(fd, &mut buf[n..], n as u64) {
            Ok(0) => return Ok(n),
            Ok(k) if k < room => return Ok(n + k),
            Ok(k) => n += k,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
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
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::PermissionsExt;

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
    fn kept_descriptors_read_what_the_files_hold_now_and_follow_the_listing() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fs::create_dir_all(r.join("net/ipv4")).unwrap();
        fs::create_dir_all(r.join("vm")).unwrap();
        fs::write(r.join("net/ipv4/ip_forward"), "0\n").unwrap();
        fs::write(r.join("vm/swappiness"), "60\n").unwrap();
        // Kept descriptors move up to KEPT_FD_BASE, within the limit the
        // observer raises to.
        let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        if lim.current.is_none_or(|c| c < KEEP_WITH_NOFILE) {
            rustix::process::setrlimit(
                rustix::process::Resource::Nofile,
                rustix::process::Rlimit {
                    current: Some(KEEP_WITH_NOFILE),
                    maximum: lim.maximum.map(|m| m.max(KEEP_WITH_NOFILE)),
                },
            )
            .expect("an open-files limit of 16384 (run as root or raise the hard limit)");
        }
        let mut files = Files::default();
        let a = capture_kept(r, "", &[], &mut files, true);
        assert_eq!(a.items["net.ipv4.ip_forward"], "0");
        assert!(a.is_complete(), "{:?}", a.gaps);
        let kept: usize = files.values().map(HashMap::len).sum();
        assert_eq!(kept, 2, "{files:?}");
        assert!(
            files
                .values()
                .flat_map(HashMap::values)
                .all(|fd| fd.as_raw_fd() >= KEPT_FD_BASE),
            "{files:?}"
        );
        // Written in place (a sysctl's file is never replaced), one gone,
        // one new: read through the kept descriptor, the listing followed.
        let mut f = fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(r.join("net/ipv4/ip_forward"))
            .unwrap();
        std::io::Write::write_all(&mut f, b"1\n").unwrap();
        fs::remove_file(r.join("vm/swappiness")).unwrap();
        fs::write(r.join("vm/overcommit_memory"), "2\n").unwrap();
        let b = capture_kept(r, "", &[], &mut files, true);
        let got: Vec<_> = b
            .items
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![("net.ipv4.ip_forward", "1"), ("vm.overcommit_memory", "2")]
        );
        assert!(b.is_complete(), "{:?}", b.gaps);
        let kept: usize = files.values().map(HashMap::len).sum();
        assert_eq!(kept, 2, "the removed file's descriptor went: {files:?}");
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
