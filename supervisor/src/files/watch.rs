//! `fs.watch`: inotify on a directory of the session's files (and, with
//! `recursive`, its subdirectories, those made later included), reported
//! as stream events until the subscriber goes. Directories are reached
//! below the scope's root without following links, and watched through
//! their open handles (`/proc/self/fd/N`), so a link planted in the tree
//! never makes the daemon watch anything outside it. A rollback of the
//! session replaces the tree: it is reported once (`rolled_back`), and the
//! new tree is watched. A delete of the session (or its agent) ends the
//! watch with `not_found`, naming it.

use super::path::Rel;
use super::Files;
use super::{scoped, FilesError, MAX_DEPTH};
use crate::runs::EventSink;
use allox_protocol::{path_from_bytes, Event, FsChange, FsEvent, FsScope, FsWatch, Response};
use rustix::fd::{AsFd, AsRawFd, OwnedFd};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::{Mode, OFlags};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use tokio::io::unix::AsyncFd;

/// Most directories one watch covers.
const MAX_WATCHED: usize = 10_000;

/// How many watches may be open: each takes an inotify instance of the
/// daemon's user, root, whose few (`fs.inotify.max_user_instances`, 128
/// by default) every root process of the machine shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchLimits {
    /// `--watches`: on the whole daemon.
    pub most: usize,
    /// `--watches-per-session`: on one session (or one agent's `shared/`).
    pub per_session: usize,
}

impl Default for WatchLimits {
    fn default() -> Self {
        WatchLimits {
            most: 32,
            per_session: 8,
        }
    }
}

/// The watches open, by `agent/session/`.
#[derive(Debug, Default)]
pub struct Watches {
    limits: WatchLimits,
    open: std::sync::Mutex<HashMap<String, usize>>,
}

/// A watch's place in the budget, given back when it is dropped.
pub struct WatchSlot<'a> {
    watches: &'a Watches,
    key: String,
}

impl Watches {
    pub fn new(limits: WatchLimits) -> Watches {
        Watches {
            limits,
            open: Default::default(),
        }
    }

    /// Watches open on the daemon.
    pub fn len(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A place for a watch of session `a/s`, or `unavailable` naming the
    /// budget that is full.
    fn take(&self, a: &str, s: &str) -> Result<WatchSlot<'_>, FilesError> {
        let key = format!("{a}/{s}/");
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let all: usize = open.values().sum();
        let here = open.get(&key).copied().unwrap_or(0);
        let full = |n: usize, of: String, flag: &str, most: usize| {
            FilesError::WatchBudget {
            why: format!(
                "{n} watches are open {of}, its budget ({flag} {most}): end one (each takes one of the few inotify instances every root process of the machine shares)"
            ),
        }
        };
        if all >= self.limits.most {
            return Err(full(
                all,
                "on this daemon".into(),
                "--watches",
                self.limits.most,
            ));
        }
        if here >= self.limits.per_session {
            return Err(full(
                here,
                format!("on session {a}/{s}"),
                "--watches-per-session",
                self.limits.per_session,
            ));
        }
        *open.entry(key.clone()).or_insert(0) += 1;
        Ok(WatchSlot { watches: self, key })
    }
}

impl Drop for WatchSlot<'_> {
    fn drop(&mut self) {
        let mut open = self.watches.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// The inotify instance of one watch, and what each of its watches is.
struct Watcher {
    fd: AsyncFd<OwnedFd>,
    /// Watch descriptor → the directory's path (relative to the scope's
    /// root, empty for the root itself; the bytes of its names, which need
    /// not be UTF-8) and its depth below the watched one.
    dirs: HashMap<i32, (Vec<u8>, u32)>,
    recursive: bool,
    /// The first directory left unwatched at [`MAX_WATCHED`], until said.
    capped: Option<Vec<u8>>,
    /// Whether the cap was said (once a watch).
    told: bool,
}

fn mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MODIFY
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        // (Not DONT_FOLLOW: the path given is /proc/self/fd/N, a link to
        // exactly the directory opened.)
        | WatchFlags::ONLYDIR
        | WatchFlags::EXCL_UNLINK
}

impl Watcher {
    fn new(recursive: bool) -> Result<Watcher, FilesError> {
        let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC)
            .map_err(|e| FilesError::from_errno("watch", ".", e))?;
        // The descriptor is an OwnedFd moved in, so the I/O-safety concern
        // behind the deprecation does not apply.
        #[allow(deprecated)]
        let fd = AsyncFd::with_interest(fd, tokio::io::Interest::READABLE);
        Ok(Watcher {
            fd: fd.map_err(|source| FilesError::Io {
                op: "watch",
                path: ".".into(),
                source,
            })?,
            dirs: HashMap::new(),
            recursive,
            capped: None,
            told: false,
        })
    }

    /// Watches the directory open as `dir` (at `path`), and below it;
    /// with `found`, also reports everything below it as created.
    fn add(
        &mut self,
        dir: &OwnedFd,
        path: &[u8],
        depth: u32,
        mut found: Option<&mut Vec<FsEvent>>,
    ) -> Result<(), FilesError> {
        if self.dirs.len() >= MAX_WATCHED {
            // Said once (it went silently blind: later writes in new
            // directories were never reported, the stream looking whole).
            if !self.told && self.capped.is_none() {
                self.capped = Some(path.to_vec());
            }
            return Ok(());
        }
        let proc = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let wd = inotify::add_watch(self.fd.get_ref(), proc.as_str(), mask())
            .map_err(|e| FilesError::from_errno("watch", &path_from_bytes(path).0, e))?;
        self.dirs.insert(wd, (path.to_vec(), depth));
        if !self.recursive || depth >= MAX_DEPTH {
            return Ok(());
        }
        let Ok(it) = rustix::fs::Dir::read_from(dir) else {
            return Ok(());
        };
        for e in it.flatten() {
            let name = e.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let is_dir = e.file_type() == rustix::fs::FileType::Directory;
            let sub_path = join(path, name);
            if let Some(out) = found.as_deref_mut() {
                out.push(event(FsChange::Created, &sub_path, None, is_dir));
            }
            if !is_dir {
                continue;
            }
            if let Ok(sub) = rustix::fs::openat(
                dir,
                e.file_name(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                self.add(&sub, &sub_path, depth + 1, found.as_deref_mut())?;
            }
        }
        Ok(())
    }

    /// The event that says the watch covers no more directories, once.
    fn cap_said(&mut self) -> Option<FsEvent> {
        let path = self.capped.take()?;
        self.told = true;
        Some(event(FsChange::Incomplete, &path, None, true))
    }

    /// The events waiting, as changes; new directories are watched too.
    fn drain(&mut self, root: &OwnedFd) -> Vec<FsEvent> {
        let mut buf = [MaybeUninit::<u8>::uninit(); 16 * 1024];
        let mut raw: Vec<(i32, ReadFlags, u32, Vec<u8>)> = Vec::new();
        {
            let mut r = inotify::Reader::new(self.fd.get_ref().as_fd(), &mut buf);
            while let Ok(ev) = r.next() {
                let name = ev
                    .file_name()
                    .map(|n| n.to_bytes().to_vec())
                    .unwrap_or_default();
                raw.push((ev.wd(), ev.events(), ev.cookie(), name));
            }
        }
        let mut out: Vec<FsEvent> = Vec::new();
        let mut moved_from: HashMap<u32, (Vec<u8>, bool)> = HashMap::new();
        for (wd, flags, cookie, name) in raw {
            if flags.contains(ReadFlags::IGNORED) {
                self.dirs.remove(&wd);
                continue;
            }
            let Some((dir, depth)) = self.dirs.get(&wd).cloned() else {
                continue;
            };
            if name.is_empty() {
                continue;
            }
            let path = join(&dir, &name);
            let is_dir = flags.contains(ReadFlags::ISDIR);
            let ev = |change| event(change, &path, None, is_dir);
            if flags.contains(ReadFlags::CREATE) {
                out.push(ev(FsChange::Created));
                if is_dir && self.recursive && depth < MAX_DEPTH {
                    let found = self.watch_new(root, &path, depth + 1);
                    out.extend(found);
                }
            } else if flags.intersects(ReadFlags::MODIFY | ReadFlags::CLOSE_WRITE) {
                // One report per file per batch.
                let this = ev(FsChange::Modified);
                if !out.contains(&this) {
                    out.push(this);
                }
            } else if flags.contains(ReadFlags::DELETE) {
                out.push(ev(FsChange::Removed));
            } else if flags.contains(ReadFlags::MOVED_FROM) {
                moved_from.insert(cookie, (path, is_dir));
            } else if flags.contains(ReadFlags::MOVED_TO) {
                let inside = match moved_from.remove(&cookie) {
                    Some((from, _)) => {
                        out.push(event(FsChange::Moved, &from, Some(&path), is_dir));
                        true
                    }
                    // Moved in from outside the watched tree.
                    None => {
                        out.push(ev(FsChange::Created));
                        false
                    }
                };
                if is_dir && self.recursive && depth < MAX_DEPTH {
                    let found = self.watch_new(root, &path, depth + 1);
                    // What it holds is new here only if it came from
                    // outside.
                    if !inside {
                        out.extend(found);
                    }
                }
            }
        }
        // Moved out of the watched tree.
        for (_, (path, dir)) in moved_from {
            out.push(event(FsChange::Removed, &path, None, dir));
        }
        out
    }

    /// A directory made (or moved in) after the watch began: watched from
    /// now on, and what is in it already — made before its watch was in
    /// place, which inotify cannot tell — reported as created (something
    /// made in the instant between the two may be reported twice; nothing
    /// is missed).
    fn watch_new(&mut self, root: &OwnedFd, path: &[u8], depth: u32) -> Vec<FsEvent> {
        let mut found = Vec::new();
        // Names as inotify gave them: never `.`, `..` or holding `/`.
        if let Ok(dir) = super::path::open_beneath(
            root,
            OsStr::from_bytes(path),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            &path_from_bytes(path).0,
        ) {
            let _ = self.add(&dir, path, depth, Some(&mut found));
        }
        found
    }
}

/// A change at `path` (and `to`), the names written as `fs.list` writes
/// them: where one is not UTF-8, both escaped (a `\\` doubled in the
/// other too), and said so.
fn event(change: FsChange, path: &[u8], to: Option<&[u8]>, dir: bool) -> FsEvent {
    let plain =
        std::str::from_utf8(path).is_ok() && to.is_none_or(|t| std::str::from_utf8(t).is_ok());
    let write = |b: &[u8]| match std::str::from_utf8(b) {
        Ok(s) if plain => s.to_owned(),
        Ok(s) => s.replace('\\', "\\\\"),
        Err(_) => path_from_bytes(b).0,
    };
    FsEvent {
        change,
        path: write(path),
        to: to.map(write),
        dir,
        escaped: !plain,
    }
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() || dir == b"." {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

impl Files<'_> {
    /// `fs.watch`: reports changes as stream events until the subscriber
    /// goes (it never answers otherwise).
    pub async fn watch(
        &self,
        r: &FsWatch,
        events: Option<EventSink>,
    ) -> Result<Response, FilesError> {
        let Some(sink) = events else {
            return Err(FilesError::FollowNeedsStream);
        };
        let rel = Rel::parse(&r.path)?;
        let root_of = || {
            self.fs_root(
                &r.agent_id,
                &r.session_id,
                r.scope,
                None,
                &super::ResolvedBelow::ScopeRoot,
            )
        };
        root_of()?;
        // Held until the watch ends, whichever way.
        let _slot = self.watches.take(&r.agent_id, &r.session_id)?;
        let mut rollbacks = self.rollbacks.subscribe();
        let mut first = true;
        // A rollback seen: said once the new tree is watched, so that every
        // change after `rolled_back` is reported (writes right after it
        // came before the new tree was watched, and were missed).
        let mut rolled_back = false;
        loop {
            let root = root_of()?;
            let dir = root.open(&rel, OFlags::RDONLY | OFlags::DIRECTORY)?;
            let mut w = Watcher::new(r.recursive)?;
            let base = if rel.is_root() {
                String::new()
            } else {
                rel.joined()
            };
            w.add(&dir, base.as_bytes(), 0, None)
                .map_err(|e| scoped(e, root.scope))?;
            drop(dir);
            if first {
                first = false;
                let ready = FsEvent {
                    change: FsChange::Ready,
                    path: rel.joined(),
                    to: None,
                    dir: true,
                    escaped: false,
                };
                if sink.send(Event::Fs(ready)).await.is_err() {
                    return Err(FilesError::SubscriberGone);
                }
            }
            if std::mem::take(&mut rolled_back) {
                let ev = FsEvent {
                    change: FsChange::RolledBack,
                    path: ".".into(),
                    to: None,
                    dir: true,
                    escaped: false,
                };
                if sink.send(Event::Fs(ev)).await.is_err() {
                    return Err(FilesError::SubscriberGone);
                }
            }
            if let Some(ev) = w.cap_said() {
                if sink.send(Event::Fs(ev)).await.is_err() {
                    return Err(FilesError::SubscriberGone);
                }
            }
            loop {
                tokio::select! {
                    ready = w.fd.readable() => {
                        let Ok(mut guard) = ready else {
                            return Err(FilesError::SubscriberGone);
                        };
                        guard.clear_ready();
                        let mut events = w.drain(&root.fd);
                        events.extend(w.cap_said());
                        for ev in events {
                            if sink.send(Event::Fs(ev)).await.is_err() {
                                return Err(FilesError::SubscriberGone);
                            }
                        }
                    }
                    rb = rollbacks.recv() => {
                        // A tree replaced (`session`), or every tree of
                        // an agent deleted (`""`).
                        let ours = match &rb {
                            Ok((a, s)) => *a == r.agent_id && (*s == r.session_id || s.is_empty()),
                            // Missed some: one of them may be ours.
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => true,
                            Err(_) => return Err(FilesError::SubscriberGone),
                        };
                        if ours {
                            // Deleted: the watch ends, saying so.
                            root_of()?;
                        }
                        if ours && r.scope == FsScope::Session {
                            // The new tree, then `rolled_back`.
                            rolled_back = true;
                            break;
                        }
                    }
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {
                        if sink.is_closed() {
                            return Err(FilesError::SubscriberGone);
                        }
                    }
                }
            }
        }
    }
}
