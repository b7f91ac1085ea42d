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
/// (current counts, not settings), and `vm.stat_refresh`, a trigger that
/// reads empty (reading it has every CPU fold its counters: a tenth of a
/// millisecond, the slowest file here).
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
    "vm.stat_refresh",
];

/// Root of the tree read; a seam for tests.
const PROC_SYS: &str = "/proc/sys";

/// Captures `/proc/sys` (all of it, or `net.*` of the network namespace
/// `netns`), skipping the keys `volatile` matches. The files' and
/// directories' descriptors are kept for the next capture of the same
/// namespace ([`KEPT`]).
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
    let mut files = space.map(|s| take_kept(s, volatile)).unwrap_or_default();
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
        put_kept(space, volatile, files);
    }
    c
}

/// A namespace's kept descriptors, by the key of the directory they are
/// in (`""` for the root, `net.ipv4` for `/proc/sys/net/ipv4`).
type Files = HashMap<String, KeptDir>;

/// One directory as the last capture listed it: its own descriptor
/// (listed again from its start) and its entries other than directories,
/// in the order listed (the kernel lists a sysctl directory in the same
/// order each time, so the next listing finds each entry where it was).
#[derive(Default)]
struct KeptDir {
    dir: Option<(OwnedFd, rustix::fs::Dir)>,
    entries: Vec<Entry>,
}

/// A file of a kept directory: read through `fd`, or skipped (`None`:
/// volatile, or write-only by mode) without its key being made again.
struct Entry {
    name: Box<[u8]>,
    fd: Option<OwnedFd>,
}

/// The descriptors of `/proc/sys` kept between captures, for the
/// [`KEPT_SPACES`] namespaces captured last (a network namespace by its
/// device and inode), with the `volatile` list their skipped entries were
/// decided by: opening a file there costs more than reading it, so a
/// capture rereads each kept file from its start and opens only the new
/// ones. A file or directory whose table went (a device removed) answers
/// `ENOENT` and is opened again by its name; the directories are listed
/// every time, so a file added or removed is seen.
#[allow(clippy::type_complexity)]
static KEPT: Mutex<Vec<((u64, u64), Vec<String>, Files)>> = Mutex::new(Vec::new());

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

/// The descriptors kept for `space`, if its entries were skipped by the
/// same `volatile` list (else none: every entry is decided again).
fn take_kept(space: (u64, u64), volatile: &[&str]) -> Files {
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    match kept.iter().position(|(s, _, _)| *s == space) {
        Some(i) => {
            let (_, with, files) = kept.remove(i);
            if with.iter().map(String::as_str).eq(volatile.iter().copied()) {
                files
            } else {
                Files::default()
            }
        }
        None => Files::default(),
    }
}

fn put_kept(space: (u64, u64), volatile: &[&str], files: Files) {
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    let with = volatile.iter().map(|v| v.to_string()).collect();
    kept.push((space, with, files));
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
/// thread inside a network namespace is inside it too. Each directory is
/// listed through its descriptor in `files` (opened by its path the first
/// time), its files read through theirs (opened relative to the directory
/// the first time, their kind taken from the directory entry); `files`
/// is left holding every directory listed and file read (moved to
/// [`KEPT_FD_BASE`] and above when `high`).
fn capture_kept(
    root: &Path,
    prefix: &str,
    volatile: &[&str],
    files: &mut Files,
    high: bool,
) -> Capture {
    let mut c = Capture::new();
    // The last capture's directories, each taken out by its walk; those
    // left (directories gone) are closed at the end.
    let pool = Mutex::new(std::mem::take(files));
    let mut first = Vec::new();
    let walker = || Walker {
        volatile,
        pool: &pool,
        kept: Files::new(),
        buf: vec![0u8; FIRST_READ],
        high,
    };
    let mut top = walker();
    top.walk(
        &root.display().to_string(),
        prefix,
        &mut c,
        Some(&mut first),
    );
    let mut kept = std::mem::take(&mut top.kept);
    // (path, key, whether only its files are read here and its
    // subdirectories queued)
    type Unit = (String, String, bool);
    // What a thread read, and the directories it kept.
    type Done = (Capture, Files);
    // The directories to walk, and how many are being split (whose
    // subdirectories are still to come): a thread ends when there is
    // nothing to take and nothing is coming.
    let queue: Mutex<(Vec<Unit>, usize)> = Mutex::new((
        first
            .into_iter()
            .rev()
            .map(|(path, key)| (path, key, true))
            .collect(),
        0,
    ));
    let more = Condvar::new();
    let take = || {
        let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(u) = q.0.pop() {
                if u.2 {
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
                    let mut part = Capture::new();
                    let mut w = walker();
                    while let Some((path, key, split)) = take() {
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
                            w.walk(&path, &key, &mut part, Some(&mut below));
                            queue
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .0
                                .extend(below.into_iter().rev().map(|(p, k)| (p, k, false)));
                        } else {
                            w.walk(&path, &key, &mut part, None);
                        }
                    }
                    (part, w.kept)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    let mut g = Capture::new();
                    g.gap(format!("sysctl: {}: a walk panicked", root.display()));
                    (g, Files::new())
                })
            })
            .collect()
    });
    for (mut p, new) in parts {
        // Merged in one pass (inserted one by one, each key would be
        // compared with a dozen others).
        c.items.append(&mut p.items);
        c.gaps.extend(p.gaps);
        kept.extend(new);
    }
    // Directories that are gone take their descriptors with them.
    drop(pool);
    *files = kept;
    c
}

/// The first read's size: most values are a few bytes (one of the 1,315
/// files of a 6.18 kernel holds more than 128: `net.core.netdev_rss_key`,
/// 156), and the kernel allocates and clears a buffer of the size asked
/// for each read (1,315 reads of 256 bytes: 2.34 ms, of 1,024: 2.66 ms).
const FIRST_READ: usize = 256;

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

/// One thread's walk: the last capture's directories (`pool`, shared),
/// those this one keeps (`kept`).
struct Walker<'a> {
    volatile: &'a [&'a str],
    pool: &'a Mutex<Files>,
    kept: Files,
    buf: Vec<u8>,
    /// Whether a newly opened descriptor moves to [`KEPT_FD_BASE`].
    high: bool,
}

impl Walker<'_> {
    /// `fd` moved to [`KEPT_FD_BASE`] and above when asked.
    fn keepable(&self, fd: OwnedFd) -> rustix::io::Result<OwnedFd> {
        if self.high {
            rustix::io::fcntl_dupfd_cloexec(&fd, KEPT_FD_BASE)
        } else {
            Ok(fd)
        }
    }

    /// The directory at `path` opened for listing: its descriptor (the
    /// files are opened relative to it) and a stream over a copy of it.
    fn open_listed(&self, path: &str) -> rustix::io::Result<(OwnedFd, rustix::fs::Dir)> {
        let fd = self.keepable(open_dir(rustix::fs::CWD, path)?)?;
        let base = if self.high { KEPT_FD_BASE } else { 0 };
        let listed = rustix::io::fcntl_dupfd_cloexec(&fd, base)?;
        Ok((fd, rustix::fs::Dir::new(listed)?))
    }

    /// Reads the directory at `path`, naming its entries `key.name`;
    /// subdirectories are walked here, or handed to `defer` when given.
    fn walk(
        &mut self,
        path: &str,
        key: &str,
        c: &mut Capture,
        mut defer: Option<&mut Vec<(String, String)>>,
    ) {
        use rustix::fs::FileType;
        let last = self
            .pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
            .unwrap_or_default();
        // Listed from its start through the kept descriptor; opened (again)
        // when there is none, or its table went: a directory lists `.`
        // first, and one whose table went lists nothing (`ENOENT`, which
        // ends a listing), and its name may name a new one.
        let mut first = None;
        let kept = last.dir.and_then(|(fd, mut d)| {
            d.rewind();
            match d.read() {
                Some(Ok(entry)) => {
                    first = Some(Ok(entry));
                    Some((fd, d))
                }
                _ => None,
            }
        });
        let (dir_fd, mut dir) = match kept.map_or_else(|| self.open_listed(path), Ok) {
            Ok(d) => d,
            Err(e) => return c.gap(format!("sysctl: {path}: cannot list: {e}")),
        };
        let mut old = last.entries;
        let mut at = 0;
        let mut entries = Vec::with_capacity(old.len());
        let mut first = first.map(Some);
        // The first entry may have been read above.
        while let Some(entry) = first.take().unwrap_or_else(|| dir.read()) {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    c.gap(format!("sysctl: {path}: cannot list: {e}"));
                    break;
                }
            };
            let raw = entry.file_name();
            let name = raw.to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let mut kind = entry.file_type();
            if kind == FileType::Unknown {
                kind = match rustix::fs::statat(&dir_fd, raw, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                {
                    Ok(st) => FileType::from_raw_mode(st.st_mode),
                    Err(e) => {
                        c.gap(format!("sysctl: {}: {e}", key_of(key, name)));
                        continue;
                    }
                };
            }
            if kind == FileType::Directory {
                let k = key_of(key, name);
                if is_volatile(&k, self.volatile) {
                    continue;
                }
                let sub_path = format!("{path}/{}", raw.to_string_lossy());
                match defer.as_deref_mut() {
                    Some(d) => d.push((sub_path, k)),
                    None => self.walk(&sub_path, &k, c, None),
                }
                continue;
            }
            // The entry where the last listing had it (or further on:
            // those passed over are gone).
            let found = old[at..].iter().position(|e| *e.name == *name);
            let was = found.map(|i| {
                let e = std::mem::replace(
                    &mut old[at + i],
                    Entry {
                        name: Box::default(),
                        fd: None,
                    },
                );
                at += i + 1;
                e
            });
            match was {
                Some(Entry { name, fd: None }) => entries.push(Entry { name, fd: None }),
                Some(Entry { name, fd: Some(fd) }) => {
                    let k = key_of(key, &name);
                    match self.read(&k, &fd, c) {
                        Ok(()) => entries.push(Entry { name, fd: Some(fd) }),
                        // Its table went (and may be back under the same
                        // name): opened again.
                        Err(()) => self.open(&dir_fd, raw, k, c, &mut entries),
                    }
                }
                None => {
                    let k = key_of(key, name);
                    if is_volatile(&k, self.volatile) {
                        entries.push(Entry {
                            name: name.into(),
                            fd: None,
                        });
                        continue;
                    }
                    self.open(&dir_fd, raw, k, c, &mut entries);
                }
            }
        }
        self.kept.insert(
            key.to_string(),
            KeptDir {
                dir: Some((dir_fd, dir)),
                entries,
            },
        );
    }

    /// Opens and reads the file `raw` in `dir` as `k`, kept in `entries`
    /// (skipped when write-only by mode).
    fn open(
        &mut self,
        dir: &OwnedFd,
        raw: &std::ffi::CStr,
        k: String,
        c: &mut Capture,
        entries: &mut Vec<Entry>,
    ) {
        use rustix::fs::{Mode, OFlags};
        let skip = |entries: &mut Vec<Entry>| {
            entries.push(Entry {
                name: raw.to_bytes().into(),
                fd: None,
            })
        };
        let fd = match rustix::fs::openat(dir, raw, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        {
            Ok(fd) => fd,
            Err(rustix::io::Errno::ACCESS) if write_only(dir, raw) => return skip(entries),
            Err(rustix::io::Errno::NOENT) => return, // vanished (a device went)
            Err(e) => return c.gap(format!("sysctl: {k}: cannot read: {e}")),
        };
        match rustix::fs::fstat(&fd) {
            Ok(st) if st.st_mode & 0o444 == 0 => return skip(entries), // nothing to read
            Ok(_) => {}
            Err(e) => return c.gap(format!("sysctl: {k}: {e}")),
        }
        let fd = match self.keepable(fd) {
            Ok(fd) => fd,
            Err(e) => return c.gap(format!("sysctl: {k}: cannot keep: {e}")),
        };
        match self.read(&k, &fd, c) {
            Ok(()) => entries.push(Entry {
                name: raw.to_bytes().into(),
                fd: Some(fd),
            }),
            Err(()) => c.gap(format!(
                "sysctl: {k}: cannot read: {}",
                rustix::io::Errno::NOENT
            )),
        }
    }

    /// Reads `fd` from its start as `k`'s value; `Err` when its table went
    /// (`ENOENT`), nothing recorded.
    fn read(&mut self, k: &str, fd: &OwnedFd, c: &mut Capture) -> Result<(), ()> {
        match read_all(fd, &mut self.buf) {
            Ok(n) => {
                let v = value_of(k, &String::from_utf8_lossy(&self.buf[..n]));
                c.insert(k, v);
            }
            Err(rustix::io::Errno::NOENT) => return Err(()),
            Err(rustix::io::Errno::IO) => c.insert(k, "!EIO"),
            Err(rustix::io::Errno::NODATA) => c.insert(k, "!ENODATA"),
            Err(e) => c.gap(format!("sysctl: {k}: cannot read: {e}")),
        }
        Ok(())
    }
}

/// `key.name` as `sysctl` names it: a dot inside `name` written as `/`.
fn key_of(key: &str, name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    let mut k = String::with_capacity(key.len() + 1 + name.len());
    k.push_str(key);
    if !key.is_empty() {
        k.push('.');
    }
    k.extend(name.chars().map(|ch| if ch == '.' { '/' } else { ch }));
    k
}

/// Whether `name` in `dir` is write-only by mode (root is refused reading
/// those in `/proc/sys`).
fn write_only(dir: &OwnedFd, name: &std::ffi::CStr) -> bool {
    rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| st.st_mode & 0o444 == 0)
}

/// Reads `fd` from its start into `buf` (grown as needed); the length
/// read. A sysctl's handler writes all it has into a read's buffer when
/// it fits, and a number's handler gives nothing to a read that does not
/// start at 0: a read that leaves room is the end (one call a file), one
/// that fills the buffer is made again from the start with a larger one.
/// Each file's first read asks for [`FIRST_READ`] bytes, however large
/// `buf` grew for a file before it.
fn read_all(fd: &OwnedFd, buf: &mut Vec<u8>) -> rustix::io::Result<usize> {
    let mut len = FIRST_READ;
    loop {
        if buf.len() < len {
            buf.resize(len, 0);
        }
        match rustix::io::pread(fd, &mut buf[..len], 0) {
            Ok(k) if k < len => return Ok(k),
            Ok(_) if len >= MAX_READ => return Ok(len),
            Ok(_) => len *= 4,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
}

/// The most read of one file (a value longer is cut there).
const MAX_READ: usize = 1 << 20;

/// The value kept for `key` read as `text`: trimmed, a secret hashed.
pub fn value_of(key: &str, text: &str) -> String {
    let v = text.trim();
    if key.ends_with(".stable_secret") {
        let h = Sha256::digest(v.as_bytes());
        let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
        return format!("sha256:{hex}");
    }
    // Multi-line values (`kernel.printk`-like tables) on one line.
    // (Most are one word, or words between single spaces: kept as read.)
    let mut gap = false;
    let single = v.chars().all(|ch| {
        let ok = !ch.is_whitespace() || (ch == ' ' && !gap);
        gap = ch.is_whitespace();
        ok
    });
    if single {
        return v.to_string();
    }
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
        let kept: Vec<i32> = kept_fds(&files);
        // Two files, four directories (the root, net, net/ipv4, vm: each a
        // descriptor and its copy being listed).
        assert_eq!(kept.len(), 2 + 4 * 2, "{kept:?}");
        assert!(kept.iter().all(|&fd| fd >= KEPT_FD_BASE), "{kept:?}");
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
        let kept = kept_fds(&files);
        assert_eq!(
            kept.len(),
            2 + 4 * 2,
            "the removed file's descriptor went: {kept:?}"
        );
    }

    /// The descriptors `files` keeps.
    fn kept_fds(files: &Files) -> Vec<i32> {
        let mut fds = Vec::new();
        for d in files.values() {
            if let Some((fd, listed)) = &d.dir {
                fds.push(fd.as_raw_fd());
                fds.push(listed.fd().unwrap().as_raw_fd());
            }
            fds.extend(
                d.entries
                    .iter()
                    .filter_map(|e| e.fd.as_ref())
                    .map(|f| f.as_raw_fd()),
            );
        }
        fds
    }

    #[test]
    fn a_directory_made_again_under_its_name_and_a_long_value_are_read_whole() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fs::create_dir_all(r.join("vm")).unwrap();
        fs::create_dir_all(r.join("net/ipv4/conf/a")).unwrap();
        for n in ["a", "c", "e"] {
            fs::write(r.join(format!("vm/{n}")), format!("{n}\n")).unwrap();
        }
        fs::write(r.join("net/ipv4/conf/a/forwarding"), "0\n").unwrap();
        let mut files = Files::default();
        let a = capture_kept(r, "", &[], &mut files, false);
        assert!(a.is_complete(), "{:?}", a.gaps);
        assert_eq!(a.items.len(), 4, "{:?}", a.items);
        // A directory gone and made again (a device removed and added):
        // its kept descriptor lists nothing (ENOENT), its name is opened
        // again. Entries added before, between and after the kept ones,
        // one kept gone: each found.
        fs::remove_dir_all(r.join("net/ipv4/conf/a")).unwrap();
        fs::create_dir_all(r.join("net/ipv4/conf/a")).unwrap();
        fs::write(r.join("net/ipv4/conf/a/mtu"), "1500\n").unwrap();
        fs::remove_file(r.join("vm/c")).unwrap();
        let long = "1 ".repeat(3000);
        for n in ["0", "b", "d", "f"] {
            fs::write(r.join(format!("vm/{n}")), &long).unwrap();
        }
        let b = capture_kept(r, "", &[], &mut files, false);
        assert!(b.is_complete(), "{:?}", b.gaps);
        let got: Vec<&str> = b.items.keys().map(String::as_str).collect();
        assert_eq!(
            got,
            vec![
                "net.ipv4.conf.a.mtu",
                "vm.0",
                "vm.a",
                "vm.b",
                "vm.d",
                "vm.e",
                "vm.f"
            ]
        );
        // 6,000 bytes, past the first read's 256: read again from the
        // start, whole.
        assert_eq!(b.items["vm.b"], long.trim(), "cut short");
        assert_eq!(b.items["vm.e"], "e");
        // Read a third time: the same, through the descriptors kept.
        let c = capture_kept(r, "", &[], &mut files, false);
        assert_eq!(c.items, b.items);
    }

    #[test]
    fn values_about_the_first_reads_size_are_read_whole_after_a_long_one() {
        let d = tempfile::tempdir().unwrap();
        let mut buf = vec![0u8; FIRST_READ];
        for n in [
            6000,
            2,
            FIRST_READ - 1,
            FIRST_READ,
            FIRST_READ + 1,
            4 * FIRST_READ,
            0,
        ] {
            let p = d.path().join(format!("v{n}"));
            let text: String = (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
            fs::write(&p, &text).unwrap();
            let fd: OwnedFd = fs::File::open(&p).unwrap().into();
            let k = read_all(&fd, &mut buf).unwrap();
            assert_eq!(&buf[..k], text.as_bytes(), "a value of {n} bytes");
        }
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
        assert_eq!(value_of("kernel.printk", "4\t4  1\n7\n"), "4 4 1 7");
        assert_eq!(
            value_of("net.ipv4.ip_local_port_range", "32768 60999"),
            "32768 60999"
        );
    }
}
