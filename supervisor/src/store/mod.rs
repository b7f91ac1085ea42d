//! The Btrfs workspace store: agents, sessions, checkpoints and rollback,
//! every multi-step change journaled and recoverable.
//!
//! Each operation takes the store lock, checks its inputs against the index,
//! writes its journal `Begin` (durable), changes the disk under names that
//! recovery can find, commits the index (its point of no return, marking
//! its op id in the same transaction), and leaves slow removals to the
//! [`reaper`]. If a step fails, the same code that recovery runs at start-up
//! finishes or undoes it at once ([`recovery::resolve`]).

mod agent;
mod checkpoint;
pub mod error;
mod reaper;
pub mod recovery;
mod rollback;
mod session;

pub use error::{Result, StoreError};

use crate::audit::Audit;
use crate::btrfs;
use crate::failpoint::Failpoints;
use crate::index::{AgentRecord, CheckpointRecord, Index, SessionRecord};
use crate::journal::{Journal, Op};
use crate::layout::Layout;
use allox_protocol::{validate_id, AgentInfo, CheckpointInfo, SessionInfo};
use reaper::Reaper;
use rustix::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Longest checkpoint label in bytes.
pub const MAX_LABEL: usize = 256;

pub struct Store {
    layout: Layout,
    index: Index,
    journal: Arc<Journal>,
    audit: Audit,
    lock: Mutex<()>,
    reaper: Reaper,
    fp: Failpoints,
    last_op: AtomicU64,
    _root_lock: OwnedFd,
}

/// What a journaled operation leaves for later.
enum After {
    /// Nothing: the operation is finished.
    Nothing,
    /// A tree to delete in the background; the op closes when it is gone.
    Remove(PathBuf),
}

impl Store {
    /// Opens the store at `root` (a directory on Btrfs), recovering from
    /// whatever an earlier crash left.
    pub fn open(root: &Path, fp: Failpoints) -> Result<Store> {
        let root_err = |why: String| StoreError::Root {
            path: root.display().to_string(),
            why,
        };
        if !root.is_dir() {
            return Err(root_err("not a directory".into()));
        }
        btrfs::check_btrfs(root).map_err(|e| root_err(e.to_string()))?;
        let layout = Layout::new(root);
        for d in [layout.agents_dir(), layout.state_dir()] {
            std::fs::create_dir_all(&d).map_err(|e| StoreError::io("create", &d, e))?;
        }
        let lock_path = layout.state_dir().join("lock");
        let root_lock = lock_root(&lock_path)?;
        let (journal, pending) = Journal::open(&layout.state_dir().join("journal"))?;
        let journal = Arc::new(journal);
        let index = Index::open(&layout.state_dir().join("index.redb"))?;
        let audit = Audit::open(&layout.state_dir().join("audit.log"))?;
        let reaper = Reaper::start(journal.clone());
        let store = Store {
            layout,
            index,
            journal,
            audit,
            lock: Mutex::new(()),
            reaper,
            fp,
            last_op: AtomicU64::new(0),
            _root_lock: root_lock,
        };
        recovery::recover(&store, pending)?;
        Ok(store)
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn audit(&self) -> &Audit {
        &self.audit
    }
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Waits for background removals (tests, benchmarks, shutdown).
    pub fn wait_idle(&self) {
        self.reaper.wait_idle();
    }

    /// Flushes journal and audit to disk.
    pub fn sync(&self) -> Result<()> {
        self.reaper.wait_idle();
        self.journal.sync()?;
        self.audit.sync()?;
        Ok(())
    }

    fn guard(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn new_op_id(&self) -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        let mut prev = self.last_op.load(Ordering::Relaxed);
        loop {
            let next = now.max(prev + 1);
            match self
                .last_op
                .compare_exchange(prev, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(p) => prev = p,
            }
        }
    }

    /// Runs `body` as a journaled operation (see the module docs).
    fn journaled<T>(&self, op: Op, body: impl FnOnce(u64) -> Result<(T, After)>) -> Result<T> {
        let op_id = self.new_op_id();
        self.journal.begin(op_id, &op)?;
        match body(op_id) {
            Ok((v, after)) => {
                match after {
                    After::Nothing => {
                        if let Err(e) = self.journal.done(op_id) {
                            tracing::warn!(error = %e, op_id, "cannot close journal operation");
                        }
                    }
                    After::Remove(path) => self.reaper.remove(path, op_id),
                }
                self.maybe_compact_journal();
                Ok(v)
            }
            Err(e) => {
                match recovery::resolve(self, op_id, &op) {
                    Ok(()) => {
                        let _ = self.journal.done(op_id);
                    }
                    Err(e2) => tracing::error!(
                        error = %e2.chain(), op_id, ?op,
                        "cannot clean up a failed operation; the next start-up will"
                    ),
                }
                Err(e)
            }
        }
    }

    /// Empties the journal when it has grown and nothing is in flight (the
    /// caller holds the store lock, so no operation is between steps).
    fn maybe_compact_journal(&self) {
        if self.journal.len() < 1 << 20 || self.reaper.busy() {
            return;
        }
        // Journal first: stale marks are harmless, a mark missing for a
        // journaled operation is not.
        if let Err(e) = self.journal.reset() {
            tracing::warn!(error = %e, "cannot compact journal");
            return;
        }
        if let Err(e) = self.index.write(|w| w.clear_ops()) {
            tracing::warn!(error = %e, "cannot clear committed-op marks");
        }
    }

    // --- lookups shared by the operations ---------------------------------

    fn need_agent(&self, a: &str) -> Result<AgentRecord> {
        validate_id("agent_id", a)?;
        self.index
            .agent(a)?
            .ok_or_else(|| StoreError::NotFound(format!("agent {a}")))
    }

    fn need_session(&self, a: &str, s: &str) -> Result<SessionRecord> {
        self.need_agent(a)?;
        validate_id("session_id", s)?;
        self.index
            .session(a, s)?
            .ok_or_else(|| StoreError::NotFound(format!("session {a}/{s}")))
    }

    fn need_checkpoint(&self, a: &str, s: &str, c: &str) -> Result<CheckpointRecord> {
        self.need_session(a, s)?;
        validate_id("checkpoint_id", c)?;
        self.index
            .checkpoint(a, s, c)?
            .ok_or_else(|| StoreError::NotFound(format!("checkpoint {a}/{s}/{c}")))
    }

    fn agent_info(&self, a: &str, r: &AgentRecord) -> Result<AgentInfo> {
        Ok(AgentInfo {
            agent_id: a.to_string(),
            created_ms: r.created_ms,
            sessions: self.index.sessions(a)?.len() as u32,
            workspace: self.layout.workspace(a).display().to_string(),
        })
    }

    fn session_info(&self, a: &str, s: &str, r: &SessionRecord) -> Result<SessionInfo> {
        Ok(SessionInfo {
            agent_id: a.to_string(),
            session_id: s.to_string(),
            created_ms: r.created_ms,
            head: r.head.clone(),
            checkpoints: self.index.checkpoints(a, s)?.len() as u32,
            current: self.layout.current(a, s).display().to_string(),
        })
    }
}

fn checkpoint_info(a: &str, s: &str, c: &str, r: &CheckpointRecord) -> CheckpointInfo {
    CheckpointInfo {
        agent_id: a.to_string(),
        session_id: s.to_string(),
        checkpoint_id: c.to_string(),
        parent: r.parent.clone(),
        created_ms: r.created_ms,
        origin: r.origin,
        pinned: r.pinned,
        label: r.label.clone(),
    }
}

fn mkdir(p: &Path) -> Result<()> {
    std::fs::create_dir(p).map_err(|e| StoreError::io("create", p, e))
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|e| StoreError::io("rename", from, e))
}

/// Only one supervisor may own a store root.
fn lock_root(path: &Path) -> Result<OwnedFd> {
    use rustix::fs::{flock, open, FlockOperation, Mode, OFlags};
    let fd = open(
        path,
        OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| StoreError::io("open", path, e.into()))?;
    flock(&fd, FlockOperation::NonBlockingLockExclusive).map_err(|_| StoreError::Root {
        path: path.display().to_string(),
        why: "another supervisor is using this store (its lock file is held)".into(),
    })?;
    Ok(fd)
}
