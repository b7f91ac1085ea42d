//! Deletes trashed trees off the critical path, then closes their journal
//! entry; with quota groups on, removes the groups of subvolumes the
//! kernel has finished dropping.

use crate::btrfs;
use crate::index::Index;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};

pub struct Reaper {
    tx: Option<Sender<(PathBuf, u64)>>,
    pending: Arc<(Mutex<Vec<PathBuf>>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reaper {
    /// `quota_root`: where to remove stale quota groups from after each
    /// removal (`None` while quota groups are off).
    pub fn start(index: Arc<Index>, quota_root: Option<PathBuf>) -> Reaper {
        let (tx, rx) = channel::<(PathBuf, u64)>();
        let pending = Arc::new((Mutex::new(Vec::<PathBuf>::new()), Condvar::new()));
        let p2 = pending.clone();
        let thread = std::thread::Builder::new()
            .name("allox-reaper".into())
            .spawn(move || {
                for (path, op_id) in rx {
                    // The journal entry closes only once the removal (and so
                    // the rename that put the tree here) is on disk: until
                    // then recovery can still redo the rename.
                    let parent = path.parent().unwrap_or(std::path::Path::new("/"));
                    let durable = btrfs::remove_tree(&path).and_then(|()| {
                        // A commit started now (not waited for) has Btrfs
                        // drop the deleted subvolumes soon after: left to
                        // its periodic commit, each slows every later
                        // snapshot of the trees it shared blocks with.
                        if let Err(e) = btrfs::start_commit(parent) {
                            tracing::debug!(error = %e, "cannot start a commit");
                        }
                        btrfs::sync_dir(parent)
                    });
                    match durable {
                        Ok(()) => {
                            if let Err(e) = index.write_quick(|w| w.journal_remove(op_id)) {
                                tracing::warn!(error = %e, op_id, "cannot close journal entry");
                            }
                        }
                        // The operation stays open in the journal: the next
                        // start-up removes the tree.
                        Err(e) => tracing::warn!(
                            error = %crate::StoreError::from(e).chain(), ?path,
                            "cannot remove trashed tree"
                        ),
                    }
                    // The kernel drops deleted subvolumes in the background:
                    // this removes the groups of those dropped since the
                    // last time (Linux 6.1 keeps them forever otherwise).
                    if let Some(root) = &quota_root {
                        if let Err(e) = btrfs::quota::remove_stale(root) {
                            tracing::debug!(error = %e, "cannot remove stale quota groups");
                        }
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
            thread,
        }
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
