//! The filesystem watcher (the `filesystem` domain, and who wrote what in
//! `shared/`): fanotify with a filesystem mark.
//!
//! [`Watch::start`] makes one fanotify group (`FAN_CLASS_NOTIF |
//! FAN_REPORT_DFID_NAME`: each event names its directory by a file handle
//! and the entry by its name, and carries no open file) and marks the
//! filesystem of each path given with `FAN_MARK_FILESYSTEM` for
//! `FAN_CREATE | FAN_DELETE | FAN_MODIFY | FAN_CLOSE_WRITE |
//! FAN_MOVED_FROM | FAN_MOVED_TO | FAN_ATTRIB | FAN_ONDIR`: every change
//! anywhere on that filesystem, whoever makes it and through whatever
//! mount. (On Btrfs a filesystem mark is refused on a nested subvolume,
//! whose fsid is not the filesystem's, so such a path is marked through
//! its mount point, found in `/proc/self/mountinfo`.)
//!
//! A thread drains the group as events come. For each it reads, at once,
//! the writer's cgroup (`/proc/PID/cgroup`, the unified hierarchy's
//! `0::` line), since a short-lived writer may be gone a moment later (a
//! writer already reaped is counted in [`Observed::cgroup_missed`]); and
//! it rebuilds the path: the directory's handle is opened with
//! `open_by_handle_at` against a directory of the marked filesystem, the
//! path read back from `/proc/self/fd/N`, and the entry's name joined to
//! it. A directory removed before its event is read has no path any more
//! ([`FsEvent::dir`] is `None`, counted in [`Observed::unresolved`]).
//! Paths are cached by handle; any directory rename or removal empties the
//! cache.
//!
//! The kernel's queue holds 16,384 events; when a reader falls behind it
//! drops events and queues `FAN_Q_OVERFLOW`, which sets
//! [`Observed::overflowed`]: the domain is then `INCOMPLETE`. The watcher
//! keeps at most [`WatchOptions::max_events`] events (default 100,000);
//! past it, it counts ([`Observed::dropped`]) without keeping.
//!
//! [`who`] and [`CgroupMap`] map a cgroup path to the agent, session and
//! run it belongs to (`sandbox/src/cgroup.rs`'s layout).

#![allow(unsafe_code)]

use rustix::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use rustix::fs::{Mode, OFlags};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use thiserror::Error;

/// Default of [`WatchOptions::max_events`].
pub const DEFAULT_MAX_EVENTS: usize = 100_000;

/// The events asked for.
pub const MASK: u64 = libc::FAN_CREATE
    | libc::FAN_DELETE
    | libc::FAN_MODIFY
    | libc::FAN_CLOSE_WRITE
    | libc::FAN_MOVED_FROM
    | libc::FAN_MOVED_TO
    | libc::FAN_ATTRIB
    | libc::FAN_ONDIR;

#[derive(Debug, Error)]
pub enum WatchError {
    #[error(
        "fanotify_init: {0} (needs CAP_SYS_ADMIN and Linux 5.9 or later for FAN_REPORT_DFID_NAME)"
    )]
    Init(std::io::Error),
    #[error("fanotify_mark FAN_MARK_FILESYSTEM on {path}: {source}")]
    Mark {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("open {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the watcher's thread: {0}")]
    Thread(std::io::Error),
}

/// One change seen on a watched filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsEvent {
    /// The process that made it (its thread group).
    pub pid: u32,
    /// `FAN_*` bits.
    pub mask: u64,
    /// The directory of the entry, or `None` when it could not be found
    /// again (removed before the event was read).
    pub dir: Option<PathBuf>,
    /// The entry's name in it (`.` for the directory itself).
    pub name: Vec<u8>,
    /// The writer's cgroup (the `0::` line of `/proc/PID/cgroup`) when the
    /// event was read; `None` if the process was already gone.
    pub cgroup: Option<String>,
}

impl FsEvent {
    /// The entry's path, when its directory was found.
    pub fn path(&self) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        if self.name.is_empty() || self.name == b"." {
            return Some(dir.clone());
        }
        Some(dir.join(OsStr::from_bytes(&self.name)))
    }
}

/// What a watch saw, from its start to its stop.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// The events kept, in the order read.
    pub events: Vec<FsEvent>,
    /// The kernel dropped events (`FAN_Q_OVERFLOW`), or the watcher could
    /// not read some: what it saw is not all that happened.
    pub overflowed: bool,
    /// Events read but not kept (past [`WatchOptions::max_events`]).
    pub dropped: u64,
    /// Events read (kept or not; the overflow marker not counted).
    pub received: u64,
    /// Events whose directory could not be found again.
    pub unresolved: u64,
    /// Events whose writer was gone before its cgroup was read.
    pub cgroup_missed: u64,
    /// Records the parser could not read (each also sets `overflowed`).
    pub malformed: u64,
    /// Events in a Btrfs subvolume outside [`WatchOptions::subvolumes`]:
    /// counted, not kept.
    pub elsewhere: u64,
}

impl Observed {
    /// Whether every change on the filesystems was seen and kept.
    pub fn is_complete(&self) -> bool {
        !self.overflowed && self.dropped == 0
    }
}

/// How a watch behaves.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// Most events kept; more are counted in [`Observed::dropped`].
    pub max_events: usize,
    /// For a watch of Btrfs filesystems only: the subvolumes whose events
    /// are kept. An event whose directory's handle names another
    /// subvolume is counted in [`Observed::elsewhere`] and passed over
    /// before anything is read for it (its writer's cgroup, its path):
    /// a session writing thousands of files in its own workspace costs
    /// the watcher a few bytes of parsing each.
    pub subvolumes: Option<HashSet<u64>>,
}

impl Default for WatchOptions {
    fn default() -> WatchOptions {
        WatchOptions {
            max_events: DEFAULT_MAX_EVENTS,
            subvolumes: None,
        }
    }
}

/// The Btrfs subvolume a Btrfs file handle names: `struct btrfs_fid`
/// (`fs/btrfs/export.h`) starts with the inode's objectid and its
/// subvolume's (`root_objectid`), in the CPU's byte order, for each of the
/// three handle types Btrfs makes (`FILEID_BTRFS_WITHOUT_PARENT`, `_WITH_PARENT`,
/// `_WITH_PARENT_ROOT`); `None` for any other handle.
pub fn btrfs_subvolume(f: &Fid<'_>) -> Option<u64> {
    const WITHOUT_PARENT: i32 = 0x4d;
    const WITH_PARENT_ROOT: i32 = 0x4f;
    if !(WITHOUT_PARENT..=WITH_PARENT_ROOT).contains(&f.handle_type) {
        return None;
    }
    Some(u64::from_ne_bytes(f.handle.get(8..16)?.try_into().ok()?))
}

/// A running watch (see the module's documentation).
pub struct Watch {
    thread: Option<JoinHandle<Observed>>,
    stop: OwnedFd,
    held: Arc<AtomicBool>,
}

/// A filesystem marked: a directory of it (for `open_by_handle_at`) and
/// its fsid.
struct Marked {
    fd: OwnedFd,
    fsid: [i32; 2],
}

impl Watch {
    /// Watches the filesystems of `paths` with the default options.
    pub fn start(paths: &[PathBuf]) -> Result<Watch, WatchError> {
        Watch::start_with(paths, WatchOptions::default())
    }

    pub fn start_with(paths: &[PathBuf], opts: WatchOptions) -> Result<Watch, WatchError> {
        // SAFETY: plain system call with constant flags.
        let raw = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_NOTIF
                    | libc::FAN_CLOEXEC
                    | libc::FAN_NONBLOCK
                    | libc::FAN_REPORT_DFID_NAME,
                (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_LARGEFILE) as libc::c_uint,
            )
        };
        if raw < 0 {
            return Err(WatchError::Init(std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fan = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut marked: Vec<Marked> = Vec::new();
        for p in paths {
            let fd = rustix::fs::open(
                p,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| WatchError::Open {
                path: p.clone(),
                source: e.into(),
            })?;
            if let Err(e) = mark(&fan, &fd) {
                if e.raw_os_error() != Some(libc::EXDEV) {
                    return Err(WatchError::Mark {
                        path: p.clone(),
                        source: e,
                    });
                }
                // A Btrfs subvolume other than the mount's: mark through the
                // mount point.
                let mp = mount_point_of(p).ok_or_else(|| WatchError::Mark {
                    path: p.clone(),
                    source: std::io::Error::from_raw_os_error(libc::EXDEV),
                })?;
                let mfd = rustix::fs::open(
                    &mp,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| WatchError::Open {
                    path: mp.clone(),
                    source: e.into(),
                })?;
                mark(&fan, &mfd).map_err(|source| WatchError::Mark { path: mp, source })?;
            }
            let fsid = fsid_of(&fd);
            marked.push(Marked { fd, fsid });
        }
        let (stop_r, stop_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| WatchError::Thread(e.into()))?;
        let held = Arc::new(AtomicBool::new(false));
        let h2 = held.clone();
        let thread = std::thread::Builder::new()
            .name("allox-fanotify".into())
            .spawn(move || drain(fan, stop_r, marked, opts, h2))
            .map_err(WatchError::Thread)?;
        Ok(Watch {
            thread: Some(thread),
            stop: stop_w,
            held,
        })
    }

    /// For tests: while held, the watcher reads nothing, so the kernel's
    /// queue fills as it would behind a slow reader.
    #[doc(hidden)]
    pub fn hold(&self, held: bool) {
        self.held.store(held, Ordering::SeqCst);
    }

    /// Reads what is queued, stops, and says what was seen.
    pub fn stop(mut self) -> Observed {
        self.finish()
    }

    fn finish(&mut self) -> Observed {
        self.held.store(false, Ordering::SeqCst);
        let _ = rustix::io::write(&self.stop, b"x");
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(o)) => o,
            _ => Observed {
                overflowed: true,
                ..Observed::default()
            },
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.finish();
        }
    }
}

fn mark(fan: &OwnedFd, dir: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: both descriptors are open; a NULL path marks `dir` itself.
    let r = unsafe {
        libc::fanotify_mark(
            fan.as_raw_fd(),
            libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM,
            MASK,
            dir.as_raw_fd(),
            std::ptr::null(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn fsid_of(fd: &OwnedFd) -> [i32; 2] {
    // SAFETY: `statfs` is plain data, zero is a valid value of it, and the
    // kernel fills it for an open descriptor.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `s` outlives the call.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut s) } != 0 {
        return [0, 0];
    }
    // SAFETY: `fsid_t` is two plain `int`s (`__kernel_fsid_t`).
    unsafe { std::mem::transmute::<libc::fsid_t, [i32; 2]>(s.f_fsid) }
}

/// The mount point under which `p` lies (the longest in
/// `/proc/self/mountinfo`).
fn mount_point_of(p: &Path) -> Option<PathBuf> {
    let p = std::fs::canonicalize(p).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mountinfo(m)))
        .filter(|m| p.starts_with(m))
        .max_by_key(|m| m.as_os_str().len())
}

fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn drain(
    fan: OwnedFd,
    stop: OwnedFd,
    marked: Vec<Marked>,
    opts: WatchOptions,
    held: Arc<AtomicBool>,
) -> Observed {
    let out = drain_until_stopped(&fan, stop, marked, opts, held);
    // Closing a group with filesystem marks waits for the kernel to let go
    // of them (milliseconds): done aside, not on the way to the answer.
    let _ = std::thread::Builder::new()
        .name("allox-fanotify-close".into())
        .spawn(move || drop(fan));
    out
}

fn drain_until_stopped(
    fan: &OwnedFd,
    stop: OwnedFd,
    marked: Vec<Marked>,
    opts: WatchOptions,
    held: Arc<AtomicBool>,
) -> Observed {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut out = Observed::default();
    let mut buf = vec![0u8; 256 << 10];
    let mut dirs = DirCache::new(marked);
    let mut stopping = false;
    let mut last_read: Option<std::time::Instant> = None;
    loop {
        if !stopping && last_read.is_some_and(|t| t.elapsed() < PACE) {
            // Just read: what follows gathers for a moment (a stop still
            // ends the pause). A reader waiting in `poll` is woken by each
            // event as the kernel queues it, and under a stream of events
            // that wake-up costs the writer more than queuing the event.
            let mut fds = [PollFd::new(&stop, PollFlags::IN)];
            let t = Timespec {
                tv_sec: 0,
                tv_nsec: PACE.as_nanos() as i64,
            };
            let _ = poll(&mut fds, Some(&t));
        }
        if held.load(Ordering::SeqCst) && !stopping {
            let mut fds = [PollFd::new(&stop, PollFlags::IN)];
            let t = Timespec {
                tv_sec: 0,
                tv_nsec: 20_000_000,
            };
            let _ = poll(&mut fds, Some(&t));
            continue;
        }
        if !stopping {
            let mut fds = [
                PollFd::new(fan, PollFlags::IN),
                PollFd::new(&stop, PollFlags::IN),
            ];
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => {
                    out.overflowed = true;
                    return out;
                }
            }
            if !fds[1].revents().is_empty() {
                // Whatever is queued now was made before the stop: read it
                // all, then end.
                stopping = true;
            }
        }
        let n = match rustix::io::read(fan, &mut buf[..]) {
            Ok(n) => n,
            Err(rustix::io::Errno::AGAIN) => {
                if stopping {
                    return out;
                }
                continue;
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => {
                out.overflowed = true;
                return out;
            }
        };
        if n == 0 {
            return out;
        }
        last_read = Some(std::time::Instant::now());
        let mut cgroups: HashMap<i32, Option<String>> = HashMap::new();
        for ev in parse(&buf[..n]) {
            let ev = match ev {
                Ok(ev) => ev,
                Err(_) => {
                    out.malformed += 1;
                    out.overflowed = true;
                    break;
                }
            };
            if ev.fd >= 0 {
                // Not asked for; closed all the same.
                // SAFETY: the kernel gave this descriptor to us.
                drop(unsafe { OwnedFd::from_raw_fd(ev.fd) });
            }
            if ev.mask & libc::FAN_Q_OVERFLOW != 0 {
                out.overflowed = true;
                continue;
            }
            out.received += 1;
            if ev.mask & libc::FAN_ONDIR != 0
                && ev.mask & (libc::FAN_MOVED_FROM | libc::FAN_MOVED_TO | libc::FAN_DELETE) != 0
            {
                dirs.clear();
            }
            if let (Some(keep), Some(dir)) = (&opts.subvolumes, ev.dir.as_ref()) {
                if btrfs_subvolume(dir).is_some_and(|v| !keep.contains(&v)) {
                    out.elsewhere += 1;
                    continue;
                }
            }
            if out.events.len() >= opts.max_events {
                out.dropped += 1;
                continue;
            }
            let cgroup = cgroups
                .entry(ev.pid)
                .or_insert_with(|| read_cgroup(ev.pid))
                .clone();
            if cgroup.is_none() {
                out.cgroup_missed += 1;
            }
            let dir = ev.dir.as_ref().and_then(|f| dirs.resolve(f));
            if dir.is_none() {
                out.unresolved += 1;
            }
            out.events.push(FsEvent {
                pid: ev.pid.max(0) as u32,
                mask: ev.mask,
                dir,
                name: ev.name.unwrap_or(b".").to_vec(),
                cgroup,
            });
        }
    }
}

/// The `0::` line of `/proc/PID/cgroup` (the unified hierarchy), or
/// `None` when the process is gone.
pub fn read_cgroup(pid: i32) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end().to_string())
}

/// Directory handles to paths, cached.
struct DirCache {
    marked: Vec<Marked>,
    /// Which marked filesystem answered an fsid.
    by_fsid: HashMap<[i32; 2], usize>,
    paths: HashMap<(i32, Vec<u8>), Option<PathBuf>>,
}

/// The pause between two reads while events keep coming: the first
/// event after a quiet moment is read at once, the ones that follow in
/// batches (the kernel's queue holds 16,384). A writer gone within it
/// has its cgroup missed ([`Observed::cgroup_missed`]).
const PACE: std::time::Duration = std::time::Duration::from_millis(1);

/// Most handles cached before the cache is emptied.
const DIR_CACHE: usize = 1 << 16;

impl DirCache {
    fn new(marked: Vec<Marked>) -> DirCache {
        DirCache {
            marked,
            by_fsid: HashMap::new(),
            paths: HashMap::new(),
        }
    }

    fn clear(&mut self) {
        self.paths.clear();
    }

    fn resolve(&mut self, f: &Fid<'_>) -> Option<PathBuf> {
        let key = (f.handle_type, f.handle.to_vec());
        if let Some(p) = self.paths.get(&key) {
            return p.clone();
        }
        let p = self.open(f);
        if self.paths.len() >= DIR_CACHE {
            self.paths.clear();
        }
        if p.is_some() {
            self.paths.insert(key, p.clone());
        }
        p
    }

    fn open(&mut self, f: &Fid<'_>) -> Option<PathBuf> {
        if let Some(&i) = self.by_fsid.get(&f.fsid) {
            return open_handle(self.marked[i].fd.as_fd(), f);
        }
        let first = self.marked.iter().position(|m| m.fsid == f.fsid);
        let order = first.into_iter().chain(0..self.marked.len());
        for i in order {
            if let Some(p) = open_handle(self.marked[i].fd.as_fd(), f) {
                self.by_fsid.insert(f.fsid, i);
                return Some(p);
            }
        }
        None
    }
}

fn open_handle(mount: BorrowedFd<'_>, f: &Fid<'_>) -> Option<PathBuf> {
    let max = libc::MAX_HANDLE_SZ as usize;
    if f.handle.len() > max {
        return None;
    }
    // `struct file_handle` with room for the largest handle, aligned.
    let mut raw = [0u64; (8 + libc::MAX_HANDLE_SZ as usize) / 8];
    let bytes: &mut [u8] = bytemuck_u64(&mut raw);
    bytes[0..4].copy_from_slice(&(f.handle.len() as u32).to_ne_bytes());
    bytes[4..8].copy_from_slice(&f.handle_type.to_ne_bytes());
    bytes[8..8 + f.handle.len()].copy_from_slice(f.handle);
    // SAFETY: `raw` is a `struct file_handle` whose `handle_bytes` says how
    // much of the room after the header is the handle; it outlives the call.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            raw.as_mut_ptr().cast::<libc::file_handle>(),
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    Some(link)
}

fn bytemuck_u64(raw: &mut [u64]) -> &mut [u8] {
    let len = std::mem::size_of_val(raw);
    // SAFETY: any bytes are valid `u8`s; the slice covers exactly `raw`,
    // borrowed mutably for as long as the result.
    unsafe { std::slice::from_raw_parts_mut(raw.as_mut_ptr().cast::<u8>(), len) }
}

/// A file handle in an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fid<'a> {
    pub fsid: [i32; 2],
    pub handle_type: i32,
    pub handle: &'a [u8],
}

/// One event as the kernel wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent<'a> {
    pub mask: u64,
    pub fd: i32,
    pub pid: i32,
    /// The directory's handle (a `DFID_NAME` or `DFID` record).
    pub dir: Option<Fid<'a>>,
    /// The object's own handle (a `FID` record).
    pub object: Option<Fid<'a>>,
    /// The entry's name (a `DFID_NAME` record).
    pub name: Option<&'a [u8]>,
}

/// Why a buffer could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("malformed fanotify event at byte {at}: {why}")]
pub struct Malformed {
    pub at: usize,
    pub why: &'static str,
}

/// The events of one `read` of a fanotify group. After a malformed record
/// the iterator yields its error and ends.
pub fn parse(buf: &[u8]) -> Events<'_> {
    Events {
        buf,
        at: 0,
        done: false,
    }
}

pub struct Events<'a> {
    buf: &'a [u8],
    at: usize,
    done: bool,
}

const META_LEN: usize = std::mem::size_of::<libc::fanotify_event_metadata>();
const INFO_HDR: usize = std::mem::size_of::<libc::fanotify_event_info_header>();

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn i32_at(b: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl<'a> Iterator for Events<'a> {
    type Item = Result<RawEvent<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.at >= self.buf.len() {
            return None;
        }
        let r = self.one();
        match &r {
            Ok((_, len)) => self.at += len,
            Err(_) => self.done = true,
        }
        Some(r.map(|(e, _)| e))
    }
}

impl<'a> Events<'a> {
    fn one(&self) -> Result<(RawEvent<'a>, usize), Malformed> {
        let at = self.at;
        let bad = |why| Malformed { at, why };
        let b = &self.buf[at..];
        if b.len() < META_LEN {
            return Err(bad("shorter than an event's header"));
        }
        let event_len = u32_at(b, 0).ok_or(bad("header"))? as usize;
        let vers = b[4];
        let meta_len = u16_at(b, 6).ok_or(bad("header"))? as usize;
        if vers != libc::FANOTIFY_METADATA_VERSION {
            return Err(bad("unknown metadata version"));
        }
        if meta_len < META_LEN || event_len < meta_len || event_len > b.len() {
            return Err(bad("lengths out of bounds"));
        }
        let mut ev = RawEvent {
            mask: u64_at(b, 8).ok_or(bad("header"))?,
            fd: i32_at(b, 16).ok_or(bad("header"))?,
            pid: i32_at(b, 20).ok_or(bad("header"))?,
            dir: None,
            object: None,
            name: None,
        };
        let mut i = meta_len;
        while i < event_len {
            let rec = &b[i..event_len];
            if rec.len() < INFO_HDR {
                return Err(bad("an info record shorter than its header"));
            }
            let info_type = rec[0];
            let len = u16_at(rec, 2).ok_or(bad("info header"))? as usize;
            if len < INFO_HDR || len > rec.len() {
                return Err(bad("an info record's length out of bounds"));
            }
            let rec = &rec[..len];
            match info_type {
                libc::FAN_EVENT_INFO_TYPE_FID
                | libc::FAN_EVENT_INFO_TYPE_DFID
                | libc::FAN_EVENT_INFO_TYPE_DFID_NAME
                | libc::FAN_EVENT_INFO_TYPE_OLD_DFID_NAME
                | libc::FAN_EVENT_INFO_TYPE_NEW_DFID_NAME => {
                    let (fid, rest) =
                        fid_record(rec).ok_or(bad("a file handle record out of bounds"))?;
                    let named = matches!(
                        info_type,
                        libc::FAN_EVENT_INFO_TYPE_DFID_NAME
                            | libc::FAN_EVENT_INFO_TYPE_OLD_DFID_NAME
                            | libc::FAN_EVENT_INFO_TYPE_NEW_DFID_NAME
                    );
                    if info_type == libc::FAN_EVENT_INFO_TYPE_FID {
                        ev.object = Some(fid);
                    } else if ev.dir.is_none() || info_type == libc::FAN_EVENT_INFO_TYPE_DFID_NAME {
                        ev.dir = Some(fid);
                        if named {
                            let end = rest
                                .iter()
                                .position(|&c| c == 0)
                                .ok_or(bad("a name without its NUL"))?;
                            ev.name = Some(&rest[..end]);
                        }
                    }
                }
                // PIDFD, ERROR, RANGE and newer records: not needed here.
                _ => {}
            }
            i += len;
        }
        Ok((ev, event_len))
    }
}

/// A `fanotify_event_info_fid` record's fsid and handle, and the bytes
/// after the handle.
fn fid_record(rec: &[u8]) -> Option<(Fid<'_>, &[u8])> {
    // header (4), fsid (8), handle_bytes (4), handle_type (4), handle.
    let fsid = [i32_at(rec, 4)?, i32_at(rec, 8)?];
    let hb = u32_at(rec, 12)? as usize;
    let handle_type = i32_at(rec, 16)?;
    if hb > libc::MAX_HANDLE_SZ as usize {
        return None;
    }
    let handle = rec.get(20..20 + hb)?;
    Some((
        Fid {
            fsid,
            handle_type,
            handle,
        },
        &rec[20 + hb..],
    ))
}

/// Who a cgroup belongs to, in a daemon's layout
/// (`ROOT/allox/AGENT/SESSION/run-RUN`, a session's context process in
/// `ROOT/allox/AGENT/.context-SESSION`). All `None`: nobody known.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Owner {
    pub agent: Option<String>,
    pub session: Option<String>,
    pub run: Option<String>,
}

impl Owner {
    pub fn is_known(&self) -> bool {
        self.agent.is_some()
    }
}

/// Maps cgroup paths (as `/proc/PID/cgroup` shows them) to their
/// [`Owner`] for a daemon whose `--cgroup-root` is `root`.
#[derive(Debug, Clone)]
pub struct CgroupMap {
    /// `ROOT/allox`.
    base: PathBuf,
    /// Each cgroup2 mount: the cgroup it shows (mountinfo's root field)
    /// and where.
    mounts: Vec<(PathBuf, PathBuf)>,
}

impl CgroupMap {
    /// Reads the cgroup2 mounts of this mount namespace.
    pub fn new(cgroup_root: &Path) -> CgroupMap {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut mounts = Vec::new();
        for l in info.lines() {
            let Some((a, b)) = l.split_once(" - ") else {
                continue;
            };
            if b.split(' ').next() != Some("cgroup2") {
                continue;
            }
            let f: Vec<&str> = a.split(' ').collect();
            if f.len() >= 5 {
                mounts.push((
                    PathBuf::from(unescape_mountinfo(f[3])),
                    PathBuf::from(unescape_mountinfo(f[4])),
                ));
            }
        }
        CgroupMap::with_mounts(cgroup_root, mounts)
    }

    /// With the mounts given as (cgroup shown, mount point).
    pub fn with_mounts(cgroup_root: &Path, mounts: Vec<(PathBuf, PathBuf)>) -> CgroupMap {
        let root = std::fs::canonicalize(cgroup_root).unwrap_or_else(|_| cgroup_root.to_path_buf());
        CgroupMap {
            base: root.join("allox"),
            mounts,
        }
    }

    /// Who the cgroup `cg` (`/a/b/c`, as the `0::` line says) belongs to.
    pub fn owner(&self, cg: &str) -> Owner {
        let cg = Path::new(cg);
        for (shown, at) in &self.mounts {
            let Ok(rest) = cg.strip_prefix(shown) else {
                continue;
            };
            let full = at.join(rest);
            let Ok(below) = full.strip_prefix(&self.base) else {
                continue;
            };
            let parts: Vec<&str> = below
                .components()
                .map_while(|c| match c {
                    Component::Normal(s) => s.to_str(),
                    _ => None,
                })
                .collect();
            let mut o = Owner::default();
            let Some(agent) = parts.first() else { return o };
            o.agent = Some(agent.to_string());
            match parts.get(1) {
                Some(s) if s.starts_with(".context-") => {
                    o.session = Some(s[".context-".len()..].to_string());
                }
                Some(s) => {
                    o.session = Some(s.to_string());
                    if let Some(r) = parts.get(2).and_then(|r| r.strip_prefix("run-")) {
                        o.run = Some(r.to_string());
                    }
                }
                None => {}
            }
            return o;
        }
        Owner::default()
    }
}

/// Who process `pid` belongs to, for a daemon whose `--cgroup-root` is
/// `cgroup_root`: nobody known when it is gone or outside the daemon's
/// subtree.
pub fn who(pid: u32, cgroup_root: &Path) -> Owner {
    match read_cgroup(pid as i32) {
        Some(cg) => CgroupMap::new(cgroup_root).owner(&cg),
        None => Owner::default(),
    }
}

#[cfg(test)]
mod tests;
