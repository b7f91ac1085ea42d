//! Deletes trashed trees off the critical path, then closes their journal
//! operation.

use crate::btrfs;
use crate::journal::Journal;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};

#[derive(Clone)]
pub struct Reaper {
    tx: Sender<(PathBuf, u64)>,
    pending: Arc<(Mutex<usize>, Condvar)>,
}

impl Reaper {
    pub fn start(journal: Arc<Journal>) -> Reaper {
        let (tx, rx) = channel::<(PathBuf, u64)>();
        let pending = Arc::new((Mutex::new(0usize), Condvar::new()));
        let p2 = pending.clone();
        std::thread::Builder::new()
            .name("allox-reaper".into())
            .spawn(move || {
                for (path, op_id) in rx {
                    match btrfs::remove_tree(&path) {
                        Ok(()) => {
                            if let Err(e) = journal.done(op_id) {
                                tracing::warn!(error = %e, op_id, "cannot close journal operation");
                            }
                        }
                        // The operation stays open in the journal: the next
                        // start-up removes the tree.
                        Err(e) => tracing::warn!(
                            error = %crate::store::StoreError::from(e).chain(), ?path,
                            "cannot remove trashed tree"
                        ),
                    }
                    let (m, cv) = &*p2;
                    let mut n = m.lock().unwrap_or_else(|p| p.into_inner());
                    *n = n.saturating_sub(1);
                    cv.notify_all();
                }
            })
            .map(|_| ())
            .unwrap_or_else(|e| tracing::error!(error = %e, "cannot start reaper thread"));
        Reaper { tx, pending }
    }

    /// Queues `path` for removal; `op_id` is closed when it is gone.
    pub fn remove(&self, path: PathBuf, op_id: u64) {
        let (m, _) = &*self.pending;
        *m.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        if self.tx.send((path.clone(), op_id)).is_err() {
            tracing::warn!(?path, "reaper gone; removing inline");
            let _ = btrfs::remove_tree(&path);
            *m.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        }
    }

    /// Waits until everything queued so far is removed.
    pub fn wait_idle(&self) {
        let (m, cv) = &*self.pending;
        let mut n = m.lock().unwrap_or_else(|p| p.into_inner());
        while *n > 0 {
            n = cv.wait(n).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub fn busy(&self) -> bool {
        let (m, _) = &*self.pending;
        *m.lock().unwrap_or_else(|p| p.into_inner()) > 0
    }
}
