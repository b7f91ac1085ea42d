//! Deletes trashed trees off the critical path, then closes their journal
//! entry; with quota groups on, removes the groups of subvolumes the
//! kernel has finished dropping.

use crate::btrfs;
use crate::index::Index;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub struct Reaper {
    tx: Option<Sender<(PathBuf, u64)>>,
    pending: Arc<(Mutex<Vec<PathBuf>>, Condvar)>,
    /// Trees whose removal failed, tried again later.
    retrying: Arc<Mutex<Vec<PathBuf>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The first wait before a removal that failed is tried again, and the
/// longest.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// A removal to try again: the tree, its journal entry, when, and the
/// wait after that.
struct Retry {
    path: PathBuf,
    op_id: u64,
    at: Instant,
    wait: Duration,
}

impl Reaper {
    /// `quota_root`: where to remove stale quota groups from after each
    /// removal (`None` while quota groups are off).
    pub fn start(
        index: Arc<Index>,
        quota_root: Option<PathBuf>,
        fp: crate::failpoint::Failpoints,
    ) -> Reaper {
        let (tx, rx) = channel::<(PathBuf, u64)>();
        let pending = Arc::new((Mutex::new(Vec::<PathBuf>::new()), Condvar::new()));
        let retrying = Arc::new(Mutex::new(Vec::<PathBuf>::new()));
        let (p2, r2) = (pending.clone(), retrying.clone());
        let thread = std::thread::Builder::new()
            .name("allox-reaper".into())
            .spawn(move || {
                // Removals that failed (the kernel refuses to delete a
                // subvolume while a `btrfs send` reads it: a checkpoint
                // deleted during an export), tried again with a growing
                // wait; until then the next start-up would remove them.
                let mut later: Vec<Retry> = Vec::new();
                loop {
                    let next = later.iter().map(|r| r.at).min();
                    let got = match next {
                        None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                        Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
                    };
                    let (path, op_id, wait) = match got {
                        Ok((path, op_id)) => (path, op_id, RETRY_FIRST),
                        Err(RecvTimeoutError::Timeout) => {
                            let now = Instant::now();
                            let Some(i) = later.iter().position(|r| r.at <= now) else {
                                continue;
                            };
                            let r = later.swap_remove(i);
                            (r.path, r.op_id, (r.wait * 2).min(RETRY_MAX))
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    };
                    fp.hit("reaper.before_remove");
                    if !remove(&index, &path, op_id, quota_root.as_deref()) {
                        r2.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(path.clone());
                        later.push(Retry {
                            path: path.clone(),
                            op_id,
                            at: Instant::now() + wait,
                            wait,
                        });
                    } else {
                        r2.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .retain(|x| *x != path);
                    }
                    let (m, cv) = &*p2;
                    let mut v = m.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(i) = v.iter().position(|x| *x == path) {
                        v.swap_remove(i);
                    }
                    cv.notify_all();
                }
            })
            .map_err(|e| tracing::error!(error = %e, "cannot start reaper thread"))
            .ok();
        Reaper {
            tx: Some(tx),
            pending,
            retrying,
            thread,
        }
    }

    /// Trees whose removal failed and is being tried again (a checkpoint
    /// deleted while an export sent it).
    pub fn retrying(&self) -> Vec<PathBuf> {
        self.retrying
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Trees queued for removal or being removed now.
    pub fn queued(&self) -> Vec<PathBuf> {
        self.pending
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Finishes the queue and ends the thread.
    pub fn stop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Queues `path` for removal; `op_id` is closed when it is gone.
    pub fn remove(&self, path: PathBuf, op_id: u64) {
        let (m, _) = &*self.pending;
        m.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(path.clone());
        let sent = match &self.tx {
            Some(tx) => tx.send((path.clone(), op_id)).is_ok(),
            None => false,
        };
        if !sent {
            tracing::warn!(?path, "reaper gone; removing inline");
            let _ = btrfs::remove_tree(&path);
            m.lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|x| *x != path);
        }
    }

    /// Waits until everything queued so far is removed.
    pub fn wait_idle(&self) {
        self.wait_under(std::path::Path::new("/"));
    }

    /// Waits until nothing queued lies under `prefix`.
    pub fn wait_under(&self, prefix: &std::path::Path) {
        let (m, cv) = &*self.pending;
        let mut v = m.lock().unwrap_or_else(|p| p.into_inner());
        while v.iter().any(|p| p.starts_with(prefix)) {
            v = cv.wait(v).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Removes the trashed tree `path` and closes journal entry `op_id`;
/// whether it is gone.
fn remove(index: &Index, path: &Path, op_id: u64, quota_root: Option<&Path>) -> bool {
    // The journal entry closes only once the removal (and so the rename
    // that put the tree here) is on disk: until then recovery can still
    // redo the rename.
    let parent = path.parent().unwrap_or(Path::new("/"));
    let durable = btrfs::remove_tree(path).and_then(|()| {
        // A commit started now (not waited for) has Btrfs drop the deleted
        // subvolumes soon after: left to its periodic commit, each slows
        // every later snapshot of the trees it shared blocks with.
        if let Err(e) = btrfs::start_commit(parent) {
            tracing::debug!(error = %e, "cannot start a commit");
        }
        btrfs::sync_dir(parent)
    });
    let gone = match durable {
        Ok(()) => {
            if let Err(e) = index.write_quick(|w| w.journal_remove(op_id)) {
                tracing::warn!(error = %e, op_id, "cannot close journal entry");
            }
            true
        }
        // The operation stays open in the journal, tried again later (and
        // by the next start-up).
        Err(e) => {
            tracing::warn!(
                error = %crate::StoreError::from(e).chain(), ?path,
                "cannot remove trashed tree yet; trying again later"
            );
            false
        }
    };
    // The kernel drops deleted subvolumes in the background: this removes
    // the groups of those dropped since the last time (Linux 6.1 keeps
    // them forever otherwise).
    if let Some(root) = quota_root {
        if let Err(e) = btrfs::quota::remove_stale(root) {
            tracing::debug!(error = %e, "cannot remove stale quota groups");
        }
    }
    gone
}
