//! The Btrfs workspace store: agents, sessions, checkpoints and rollback,
//! every multi-step change journaled and recoverable, with its index,
//! journal, audit log and the Btrfs calls under them. It knows nothing of
//! processes, sandboxes or the control server.
//!
//! Each operation takes the store lock, checks its inputs against the index,
//! commits its journal Begin durably, changes the disk in steps that leave
//! evidence recovery can read, commits its index changes with the journal
//! End, and leaves slow removals to the reaper. If a step fails, the same
//! code that recovery runs at start-up undoes it at once
//! ([`recovery::resolve`]). See [`crate::journal`] for the protocol.

pub mod archive;
pub mod audit;
pub mod btrfs;
pub mod clock;
pub mod failpoint;
pub mod index;
pub mod journal;
pub mod kept_file;
pub mod layout;
pub mod private;
pub mod rate;
pub mod records;
pub mod reserve;
pub mod rows;
pub mod tree;

mod agent;
mod apply;
mod check;
mod checkpoint;
pub mod diff;
pub mod error;
mod leave_out;
mod network;
mod quota;
mod reaper;
pub mod recovery;
mod rollback;
mod sendstream;
mod session;
mod transfer;
mod turn;

pub use error::{Result, StoreError};
pub use quota::{parse_size, StoreOptions, SESSION_CHECKPOINTS, TURNS_KEPT};
pub use session::NewSession;
pub use transfer::{Exported, Import, Imported, NetworkCheck};
pub use turn::check_keep_last;

use crate::audit::Audit;
use crate::failpoint::Failpoints;
use crate::index::{AgentRecord, CheckpointRecord, Index, SessionRecord};
use crate::journal::{Entry, Op, Stage};
use crate::layout::Layout;
use allox_protocol::{validate_id, AgentInfo, CheckpointInfo, SessionInfo};
use reaper::Reaper;
use rustix::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Longest checkpoint label in bytes.
pub const MAX_LABEL: usize = 256;

/// Free space below which `agent.create` and `session.create` are
/// refused: a new tree on a full filesystem could not be used anyway.
/// (The index and the audit log keep their own room: [`crate::reserve`].)
pub const RESERVE_MIB: u64 = 32;

pub struct Store {
    layout: Layout,
    index: Arc<Index>,
    audit: Audit,
    lock: Mutex<()>,
    /// Serialises turn.begin and turn.end (taken before `lock`).
    turn_lock: Mutex<()>,
    reaper: Reaper,
    fp: Failpoints,
    last_op: AtomicU64,
    /// Set when a failed operation could not be undone: no more changes.
    fenced: std::sync::atomic::AtomicBool,
    /// Why the store opened read-only (its index, audit log or recovery
    /// failed at start): no changes until a restart finds it whole.
    degraded: Option<String>,
    opts: StoreOptions,
    /// Whether the filesystem's quota groups are on (see [`quota`]).
    quotas_on: bool,
    /// Bytes each state file keeps allocated for a full filesystem.
    room: u64,
    /// Set while the state files' room could not be topped up.
    room_short: std::sync::atomic::AtomicBool,
    /// Interrupted operations recovery finished or undid at the open.
    replayed: u64,
    /// The scratch trees of exports and imports going on (not out of
    /// place for `store.check`; left by a crash, removed at the next open).
    in_flight: Arc<Mutex<std::collections::HashSet<std::path::PathBuf>>>,
    /// What snapshots of a session's `current/` leave out
    /// ([`Store::leave_out_of_snapshots`]).
    left_out: std::sync::OnceLock<leave_out::LeftOut>,
    _root_lock: OwnedFd,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("root", &self.layout.root())
            .finish_non_exhaustive()
    }
}

/// What a journaled operation leaves for later.
enum After {
    /// Nothing: the operation is finished.
    Nothing,
    /// A tree to delete in the background; the op closes when it is gone.
    Remove(PathBuf),
}

impl Drop for Store {
    fn drop(&mut self) {
        self.reaper.stop();
    }
}

impl Store {
    /// Opens the store at `root` (a directory on Btrfs), recovering from
    /// whatever an earlier crash left. Any failure is an error.
    pub fn open(root: &Path, fp: Failpoints) -> Result<Store> {
        Self::open_with(root, fp, StoreOptions::default())
    }

    /// [`Store::open`] with options (a session quota).
    pub fn open_with(root: &Path, fp: Failpoints, opts: StoreOptions) -> Result<Store> {
        let st = Self::open_inner(root, fp, opts, false)?;
        match &st.degraded {
            Some(why) => Err(StoreError::ReadOnly(why.clone())),
            None => Ok(st),
        }
    }

    /// Like [`Store::open`], but a store whose index or audit log cannot be
    /// opened, or whose recovery fails, still opens: read-only, refusing
    /// every change with the reason ([`Store::read_only_reason`]), so that
    /// a supervisor under PID 1 serves and says what is wrong instead of
    /// failing again at every restart. Only an unusable root (missing, not
    /// Btrfs, held by another supervisor) is an error.
    pub fn open_or_read_only(root: &Path, fp: Failpoints, opts: StoreOptions) -> Result<Store> {
        Self::open_inner(root, fp, opts, true)
    }

    fn open_inner(root: &Path, fp: Failpoints, opts: StoreOptions, degrade: bool) -> Result<Store> {
        let root_err = |why: String| StoreError::Root {
            path: root.display().to_string(),
            why,
        };
        // A missing root is made, in a directory that exists (on the
        // Btrfs mount, which is checked next).
        if !root.exists() {
            match root.parent() {
                Some(p) if p.is_dir() => private::mkdir(root)
                    .map_err(|e| root_err(format!("it does not exist and cannot be made: {e}")))?,
                _ => {
                    return Err(root_err(
                        "neither it nor the directory above it exists".into(),
                    ))
                }
            }
        }
        if !root.is_dir() {
            return Err(root_err("not a directory".into()));
        }
        btrfs::check_btrfs(root).map_err(|e| root_err(e.to_string()))?;
        if let Some((path, mode)) = private::open_to_others(root) {
            tracing::warn!(
                root = %path.display(),
                mode = format!("{mode:04o}"),
                "the store root is open to other users of this host: the store's own directories below it are private, but make the root 0700 (or put it where they cannot enter) so they cannot list it"
            );
        }
        let layout = Layout::new(root);
        for d in [layout.agents_dir(), layout.state_dir()] {
            match private::mkdir(&d) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(StoreError::io("create", &d, e)),
            }
        }
        // Before anything in it is opened; what recovery makes below is
        // private by where it is, and fixed at the next start.
        private::keep_private(&layout);
        let lock_path = layout.state_dir().join("lock");
        let root_lock = lock_root(&lock_path)?;
        let mut degraded: Option<String> = None;
        let fail = |degraded: &mut Option<String>, what: &str, e: StoreError| -> Result<()> {
            if !degrade {
                return Err(e);
            }
            let why = format!("{what}: {}", e.chain());
            tracing::error!(
                reason = %why,
                "the store is READ-ONLY: every change is refused until this is fixed and the supervisor restarts"
            );
            degraded.get_or_insert(why);
            Ok(())
        };
        let index_path = layout.state_dir().join("index.redb");
        let audit_path = layout.state_dir().join("audit.log");
        let room = crate::reserve::room_for(&layout.state_dir());
        for p in [&index_path, &audit_path] {
            crate::reserve::prepare(p, room);
        }
        crate::reserve::prepare(
            &layout.state_dir().join(crate::reserve::SPARE_ROOM_FILE),
            crate::reserve::SPARE_ROOM_BYTES,
        );
        let quotas_on = match quota::start(&layout, &opts) {
            Ok(on) => on,
            Err(e) => {
                fail(&mut degraded, "the session quota cannot be set up", e)?;
                false
            }
        };
        let index = match Index::open(&index_path) {
            Ok(i) => i,
            Err(e) => {
                fail(&mut degraded, "the index cannot be opened", e.into())?;
                Index::closed(&index_path)
            }
        };
        let index = Arc::new(index);
        let audit = match Audit::open(&audit_path) {
            Ok(a) => a,
            Err(e) => {
                fail(&mut degraded, "the audit log cannot be opened", e.into())?;
                Audit::unavailable(&audit_path)
            }
        };
        let reaper = Reaper::start(
            index.clone(),
            quotas_on.then(|| layout.root().to_path_buf()),
            fp.clone(),
        );
        let mut store = Store {
            layout,
            index,
            audit,
            lock: Mutex::new(()),
            turn_lock: Mutex::new(()),
            reaper,
            fp,
            last_op: AtomicU64::new(0),
            fenced: std::sync::atomic::AtomicBool::new(false),
            degraded: None,
            opts,
            quotas_on,
            room,
            room_short: std::sync::atomic::AtomicBool::new(false),
            replayed: 0,
            in_flight: Default::default(),
            left_out: std::sync::OnceLock::new(),
            _root_lock: root_lock,
        };
        if degraded.is_none() {
            match recovery::recover(&store) {
                Ok(n) => store.replayed = n,
                Err(e) => {
                    store.heal(&e);
                    fail(&mut degraded, "recovery failed", e)?;
                }
            }
        }
        if degraded.is_none() {
            if let Err(e) = store.limit_all_sessions() {
                fail(&mut degraded, "the session quota cannot be set", e)?;
            }
        }
        store.degraded = degraded;
        Ok(store)
    }

    /// How many interrupted operations the journal held at the open
    /// (recovery finished or undid each).
    pub fn journal_replays(&self) -> u64 {
        self.replayed
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

    /// Makes everything durable: index and journal, and the audit log.
    pub fn sync(&self) -> Result<()> {
        self.reaper.wait_idle();
        self.index.write(|_| Ok(()))?;
        self.audit.sync()?;
        Ok(())
    }

    /// Tops up the room the state files keep for a full filesystem
    /// ([`crate::reserve`]); the daemon calls it every second. A failure
    /// (the filesystem is full) is logged once, and again once it passes.
    pub fn keep_room(&self) {
        let state = self.layout.state_dir();
        let mut short = None;
        // The plugins' audit files keep the same room as the daemon's
        // own (those of plugins not enabled are not there).
        let files = [
            ("index.redb", self.room),
            ("audit.log", self.room),
            ("events.redb", self.room),
            ("share-audit.log", self.room),
            ("network-audit.log", self.room),
            (
                crate::reserve::SPARE_ROOM_FILE,
                crate::reserve::SPARE_ROOM_BYTES,
            ),
        ];
        for (name, room) in files {
            let p = state.join(name);
            match crate::reserve::top_up(&p, room) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => short = Some((p, e)),
            }
        }
        let was = self.room_short.swap(short.is_some(), Ordering::SeqCst);
        match (was, short) {
            (false, Some((p, e))) => tracing::warn!(
                error = %e, path = %p.display(),
                "cannot top up the room kept for the state files; they use what is left of it"
            ),
            (true, None) => tracing::info!("the room kept for the state files is whole again"),
            _ => {}
        }
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

    /// A delete: its index change and a journal entry that has only the
    /// tree's removal left ([`Stage::Committed`]) are one durable commit,
    /// made before the disk is touched, so the delete holds from the moment
    /// it can be answered, at the cost of one index sync and no filesystem
    /// commit. The tree is then renamed into `trash_dir` (freeing its name) and
    /// removed in the background. A rename lost to a crash or a power cut
    /// is redone by recovery, which finds the entry committed and the tree
    /// still at home ([`recovery::resolve`]).
    fn delete_committed(
        &self,
        op: Op,
        home: &Path,
        trash_dir: &Path,
        points: [&str; 2],
    ) -> Result<()> {
        self.check_fence()?;
        let op_id = self.new_op_id();
        let trash = Layout::trash(trash_dir, op_id);
        self.index
            .write(|w| {
                apply::apply(w, &op)?;
                w.journal_put(
                    op_id,
                    &Entry {
                        op: op.clone(),
                        stage: Stage::Committed,
                    },
                )
            })
            .map_err(|e| {
                let e = StoreError::from(e);
                self.heal(&e);
                e
            })?;
        self.crash_point(points[0]);
        match rename(home, &trash) {
            Ok(()) => {
                self.crash_point(points[1]);
                self.reaper.remove(trash, op_id);
            }
            // The delete holds; the entry stays for recovery, which moves
            // and removes the tree at the next start.
            Err(e) => tracing::error!(
                error = %e.chain(), op_id,
                "deleted, but the tree could not be moved aside; the next start removes it"
            ),
        }
        Ok(())
    }

    /// Runs an operation under the journal: Begin (durable), then `body`,
    /// which does the disk steps and calls [`Store::end`]; on error, undoes
    /// whatever the body did.
    fn journaled<T>(
        &self,
        build: impl FnOnce(&mut crate::index::Writer<'_>) -> Result<Op, crate::index::IndexError>,
        body: impl FnOnce(u64, &Op) -> Result<(T, After)>,
    ) -> Result<T> {
        self.check_fence()?;
        let op_id = self.new_op_id();
        let op = self.index.begin(op_id, build).map_err(|e| {
            let e = StoreError::from(e);
            self.heal(&e);
            e
        })?;
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(op_id, &op)));
        let out = match out {
            Ok(out) => out,
            Err(panic) => {
                self.unwound(op_id, op);
                std::panic::resume_unwind(panic);
            }
        };
        match out {
            Ok((v, After::Nothing)) => Ok(v),
            Ok((v, After::Remove(path))) => {
                self.reaper.remove(path, op_id);
                Ok(v)
            }
            Err(e) => {
                self.heal(&e);
                self.abort(op_id, op);
                Err(e)
            }
        }
    }

    /// Settles the journal entry of an operation whose body panicked, as
    /// if it had returned: undone if its End never committed, its leftover
    /// tree removed if it did. Left alone, the entry would wait for a
    /// restart, and recovery would then read later operations' changes to
    /// the same tree as its own.
    fn unwound(&self, op_id: u64, op: Op) {
        tracing::error!(
            op_id,
            ?op,
            "an operation panicked; settling its journal entry"
        );
        let stage = self.index.pending().map(|p| {
            p.into_iter()
                .find(|(id, _)| *id == op_id)
                .map(|(_, e)| e.stage)
        });
        match stage {
            Ok(None) => {}
            Ok(Some(Stage::Committed)) => {
                let entry = Entry {
                    op,
                    stage: Stage::Committed,
                };
                let done = recovery::resolve(self, op_id, &entry, recovery::Mode::Recover)
                    .and_then(|_| self.close_entries(&[op_id]));
                if let Err(e) = done {
                    // Only a trashed tree is left: start-up removes it.
                    tracing::error!(error = %e.chain(), op_id, "cannot remove a finished operation's old tree");
                }
            }
            Ok(Some(_)) => self.abort(op_id, op),
            Err(e) => {
                let e = StoreError::from(e);
                tracing::error!(error = %e.chain(), op_id, "cannot read the journal after a panic; refusing changes until restart");
                self.fenced.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Closes the journal entries `ops` once what resolving them did on
    /// disk (a tree moved aside or removed, an exchange done again, a
    /// half-made tree taken away) is committed, and durably. Closed first,
    /// a power cut could undo on disk what the index no longer has an entry
    /// for: a deleted session's tree back under its name, which the next
    /// start would adopt as found on disk.
    fn close_entries(&self, ops: &[u64]) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        btrfs::commit(self.layout.root())?;
        self.index.write(|w| {
            for op_id in ops {
                w.journal_remove(*op_id)?;
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Undoes a failed operation. The entry is first marked `Aborting`
    /// durably, so that a crash in the middle of the undo makes start-up
    /// finish the undo rather than the operation. If the journal cannot be
    /// brought back in line, the store refuses all further changes until it
    /// is restarted, so that no later operation builds on top of an entry
    /// that start-up would still act on.
    fn abort(&self, op_id: u64, op: Op) {
        let entry = Entry {
            op,
            stage: Stage::Aborting,
        };
        let result = self
            .index
            .write(|w| w.journal_put(op_id, &entry))
            .map_err(StoreError::from)
            .and_then(|_| recovery::resolve(self, op_id, &entry, recovery::Mode::Abort))
            .and_then(|_| self.close_entries(&[op_id]));
        if let Err(e) = result {
            self.heal(&e);
            tracing::error!(
                error = %e.chain(), op_id, op = ?entry.op,
                "cannot undo a failed operation; refusing changes until restart"
            );
            self.fenced.store(true, Ordering::SeqCst);
        }
    }

    /// A failpoint of the supervisor's ([`failpoint::FILES`]), armed by
    /// the same `ALLOX_FAILPOINTS` as the store's.
    pub fn failpoint(&self, name: &str) {
        self.crash_point(name);
    }

    /// A failpoint, honouring `name=sync`.
    fn crash_point(&self, name: &str) {
        if self.fp.sync_first(name) {
            let _ = self.index.write(|_| Ok(()));
        }
        self.fp.hit(name);
    }

    /// Why the store refuses changes, if it does.
    pub fn read_only_reason(&self) -> Option<String> {
        if let Some(why) = &self.degraded {
            return Some(StoreError::ReadOnly(why.clone()).to_string());
        }
        self.fenced
            .load(Ordering::SeqCst)
            .then(|| StoreError::Fenced.to_string())
    }

    /// Fails once the store has been fenced by an undo that did not finish,
    /// or when it opened read-only.
    fn check_fence(&self) -> Result<()> {
        if let Some(why) = &self.degraded {
            return Err(StoreError::ReadOnly(why.clone()));
        }
        if self.fenced.load(Ordering::SeqCst) {
            return Err(StoreError::Fenced);
        }
        Ok(())
    }

    /// After an I/O error (a full disk) the index database refuses all work
    /// until it is reopened.
    fn heal(&self, e: &StoreError) {
        if let StoreError::Index(ie) = e {
            if ie.needs_reopen() {
                tracing::warn!(error = %e.chain(), "reopening the index after an I/O error");
                if let Err(e2) = self.index.reopen() {
                    tracing::error!(error = %e2, "cannot reopen the index");
                }
            }
        }
    }

    /// Refuses to make new trees when the filesystem is nearly full.
    fn check_space(&self) -> Result<()> {
        let st = rustix::fs::statvfs(self.layout.root())
            .map_err(|e| StoreError::io("statvfs", self.layout.root(), e.into()))?;
        let free_mib = st.f_bavail.saturating_mul(st.f_frsize) >> 20;
        if free_mib < RESERVE_MIB {
            return Err(StoreError::NoSpace {
                free_mib,
                need_mib: RESERVE_MIB,
            });
        }
        Ok(())
    }

    /// Journal End: the operation's index changes, and its journal entry
    /// closed (or marked committed while `after` still has a tree to
    /// remove), in one quick commit.
    fn end(&self, op_id: u64, op: &Op, after: &After) -> Result<()> {
        self.index.write_quick(|w| {
            apply::apply(w, op)?;
            match after {
                After::Nothing => w.journal_remove(op_id),
                After::Remove(_) => w.journal_put(
                    op_id,
                    &Entry {
                        op: op.clone(),
                        stage: Stage::Committed,
                    },
                ),
            }
        })?;
        Ok(())
    }

    // --- lookups shared by the operations ---------------------------------

    fn need_agent(&self, a: &str) -> Result<AgentRecord> {
        validate_id("agent_id", a)?;
        self.index
            .agent(a)?
            .ok_or_else(|| StoreError::NotFound(format!("agent {a}")))
    }

    /// The index key of agent `a`'s (`s` = `None`) or session `a/s`'s
    /// settings (policies, network), which must exist.
    fn level_key(&self, a: &str, s: Option<&str>) -> Result<String> {
        match s {
            Some(s) => {
                self.need_session(a, s)?;
                Ok(crate::index::session_key(a, s))
            }
            None => {
                self.need_agent(a)?;
                Ok(a.to_string())
            }
        }
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
        let clock = self.index.clock(a, s)?;
        Ok(SessionInfo {
            agent_id: a.to_string(),
            session_id: s.to_string(),
            created_ms: r.created_ms,
            head: r.head.clone(),
            checkpoints: self.index.checkpoints(a, s)?.len() as u32,
            current: self.layout.current(a, s).display().to_string(),
            paused: None,
            idle_timeout_ms: clock.as_ref().and_then(|c| c.idle_timeout_ms),
            expires_ms: clock.as_ref().and_then(|c| c.expires_ms()),
            expired_ms: clock.and_then(|c| c.expired_ms),
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
        turn_id: r.turn_id.clone(),
        forked_from: None,
    }
}

/// `info` with the fork point of its session when it is that session's
/// fork baseline.
fn with_fork(mut info: CheckpointInfo, fork: Option<&crate::rows::ForkRecord>) -> CheckpointInfo {
    if let Some(f) = fork.filter(|f| f.baseline == info.checkpoint_id) {
        info.forked_from = Some(Box::new(allox_protocol::ForkPoint {
            agent_id: f.agent.clone(),
            session_id: f.session.clone(),
            checkpoint_id: f.checkpoint.clone(),
            forked_ms: f.forked_ms,
        }));
    }
    info
}

/// Makes one of the store's own directories (0700: [`private`]).
fn mkdir(p: &Path) -> Result<()> {
    private::mkdir(p).map_err(|e| StoreError::io("create", p, e))
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
    // Asked again for a moment: a lock let go just now can still be held
    // by a child some thread of the process that held it forked, until
    // that child's exec closes its copy of the descriptor (a store
    // opened again at once, under load, was refused so).
    let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(fd),
            Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR)
                if std::time::Instant::now() < until =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(_) => {
                return Err(StoreError::Root {
                    path: path.display().to_string(),
                    why: "another supervisor is using this store (its lock file is held)".into(),
                })
            }
        }
    }
}
