//! The process tracker (`--process-tracker ebpf`): eBPF programs on the
//! scheduler's fork, exec and exit tracepoints attribute every process a
//! run starts — double-forked, setsid'ed, long gone — to its agent, session
//! and run, in the kernel. Here: tagging runs, draining the ring buffer on a
//! short timer, and the event store in `state/events.redb` (outside every
//! rollback), capped, oldest first out, the eviction itself recorded.
//!
//! A run is tagged by its cgroup before its first process exists: the run's
//! cgroup is created, its id written into the kernel's map, and only then is
//! the sandbox cloned straight into it (`CLONE_INTO_CGROUP`), so the first
//! instruction of the first process already counts, and no fork escapes.

pub use crate::plugins::defaults::process_tree::DEFAULT_MAX_EVENTS;
use allox_ebpf_probes::{EventKind, RawEvent, Tracker};
use allox_protocol::{
    ErrorBody, ErrorCode, ProcessEvent, ProcessEventKind, ProcessEventListing, ProcessEvents,
    ProcessNode, ProcessTreeListing,
};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use thiserror::Error;

const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
const OWNERS: TableDefinition<u64, &[u8]> = TableDefinition::new("owners");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The event store is reopened after an I/O error at most this often.
const REOPEN_EVERY: Duration = Duration::from_secs(2);

/// How often the ring buffer is drained.
pub const DRAIN_EVERY: Duration = Duration::from_millis(50);

/// Whose a process is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Owner {
    pub agent: String,
    pub session: String,
    pub run: String,
}

/// Why the tracker could not start, store or answer.
#[derive(Debug, Error)]
pub enum TrackerError {
    #[error("the process tracker is off; start the supervisor with --process-tracker ebpf")]
    Off,
    /// Each load error names the cause a person has to fix.
    #[error(transparent)]
    Load(#[from] allox_ebpf_probes::LoadError),
    #[error("cannot start the tracker thread")]
    Thread(#[source] std::io::Error),
    #[error("process event store")]
    Store(#[source] redb::Error),
    #[error("process event store: cannot encode a record")]
    Encode(#[source] postcard::Error),
    #[error("cannot read the run's cgroup id")]
    CgroupId(#[source] rustix::io::Errno),
    #[error("cannot tag the run's cgroup")]
    Tag(#[source] allox_ebpf_probes::TrackerError),
}

impl TrackerError {
    pub fn code(&self) -> ErrorCode {
        match self {
            TrackerError::Off | TrackerError::Load(_) => ErrorCode::Unsupported,
            TrackerError::Thread(_)
            | TrackerError::Store(_)
            | TrackerError::Encode(_)
            | TrackerError::CgroupId(_)
            | TrackerError::Tag(_) => ErrorCode::Internal,
        }
    }

    /// The error as the client sees it.
    pub fn to_body(&self) -> ErrorBody {
        ErrorBody::new(self.code(), allox_protocol::error_chain(self))
    }
}

impl From<TrackerError> for crate::plugin_api::PluginError {
    fn from(e: TrackerError) -> Self {
        crate::plugin_api::PluginError::Answered(e.to_body())
    }
}

impl From<TrackerError> for ErrorBody {
    fn from(e: TrackerError) -> ErrorBody {
        e.to_body()
    }
}

/// An error of the event store's database.
fn db_err(e: impl Into<redb::Error>) -> TrackerError {
    TrackerError::Store(e.into())
}

/// The events, in `state/events.redb`.
pub struct EventStore {
    path: std::path::PathBuf,
    /// `None` while it is being reopened, or could not be: redb refuses
    /// all work after an I/O error (a disk an agent filled) until then.
    db: std::sync::RwLock<Option<Database>>,
    /// The next owner id, kept in memory: a run's start never waits on a
    /// write that a full disk can refuse.
    next_owner: std::sync::atomic::AtomicU64,
    /// When the database was last reopened: at most once in
    /// [`REOPEN_EVERY`] (a reopen after a crash-like close scans the file).
    reopened: Mutex<Option<std::time::Instant>>,
    cap: u64,
    owners: Mutex<HashMap<u64, Owner>>,
    /// The newest sequence number, for followers to wait on.
    newest: tokio::sync::watch::Sender<u64>,
}

impl EventStore {
    pub fn open(path: &Path, cap: u64) -> Result<EventStore, TrackerError> {
        // Never made shorter: the room the store keeps past its end for a
        // full disk stays ([`allox_store::kept_file`]).
        let db = allox_store::kept_file::create(path).map_err(db_err)?;
        let w = db.begin_write().map_err(db_err)?;
        let mut owners = HashMap::new();
        let newest;
        let next_owner;
        {
            w.open_table(EVENTS).map_err(db_err)?;
            let o = w.open_table(OWNERS).map_err(db_err)?;
            for row in o.iter().map_err(db_err)? {
                let (k, v) = row.map_err(db_err)?;
                if let Ok(owner) = postcard::from_bytes::<Owner>(v.value()) {
                    owners.insert(k.value(), owner);
                }
            }
            let m = w.open_table(META).map_err(db_err)?;
            next_owner = m
                .get("next_owner")
                .map_err(db_err)?
                .map(|v| v.value())
                .unwrap_or(1)
                .max(owners.keys().max().map_or(1, |k| k + 1));
            newest = m
                .get("next_seq")
                .map_err(db_err)?
                .map(|v| v.value())
                .unwrap_or(1)
                - 1;
        }
        w.commit().map_err(db_err)?;
        Ok(EventStore {
            path: path.to_path_buf(),
            db: std::sync::RwLock::new(Some(db)),
            next_owner: next_owner.into(),
            reopened: Mutex::new(None),
            cap: cap.max(10),
            owners: Mutex::new(owners),
            newest: tokio::sync::watch::channel(newest).0,
        })
    }

    /// A new owner id for a run, recorded before the run starts (made
    /// durable with the next flush, within a second: a flush per run would
    /// cost more than the run's spawn).
    pub fn add_owner(&self, owner: Owner) -> Result<u64, TrackerError> {
        let id = self
            .next_owner
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, owner.clone());
        // Kept for a successor (the run's events named after a restart);
        // a store that cannot take it (a full disk) does not keep the run
        // from starting: its events are named from memory meanwhile.
        let kept = self.with_db(|db| {
            let mut w = db.begin_write().map_err(db_err)?;
            let _ = w.set_durability(redb::Durability::None);
            {
                let mut m = w.open_table(META).map_err(db_err)?;
                m.insert("next_owner", id + 1).map_err(db_err)?;
                let bytes = postcard::to_stdvec(&owner).map_err(TrackerError::Encode)?;
                w.open_table(OWNERS)
                    .map_err(db_err)?
                    .insert(id, bytes.as_slice())
                    .map_err(db_err)?;
            }
            w.commit().map_err(db_err)
        });
        if let Err(e) = kept {
            tracing::warn!(error = %allox_protocol::error_chain(&e), run = %owner.run, "cannot keep a run's owner in the process event store; the run goes on, named from memory");
        }
        Ok(id)
    }

    /// Runs `f` on the database; after an I/O error (a full disk), which
    /// redb answers for ever after, it is reopened for the next call.
    fn with_db<T>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, TrackerError>,
    ) -> Result<T, TrackerError> {
        let out = {
            let g = self.db.read().unwrap_or_else(|p| p.into_inner());
            match g.as_ref() {
                Some(db) => f(db),
                None => Err(TrackerError::Store(redb::Error::PreviousIo)),
            }
        };
        if let Err(TrackerError::Store(redb::Error::Io(_) | redb::Error::PreviousIo)) = &out {
            self.reopen();
        }
        out
    }

    /// Closes the database and opens it again (what redb asks after an
    /// I/O error); one that cannot be opened is tried at the next call.
    fn reopen(&self) {
        {
            let mut last = self.reopened.lock().unwrap_or_else(|p| p.into_inner());
            let now = std::time::Instant::now();
            if last.is_some_and(|t| now.duration_since(t) < REOPEN_EVERY) {
                return;
            }
            *last = Some(now);
        }
        let mut g = self.db.write().unwrap_or_else(|p| p.into_inner());
        drop(g.take());
        match allox_store::kept_file::create(&self.path) {
            Ok(db) => {
                tracing::warn!(path = %self.path.display(), "process event store reopened after an I/O error");
                *g = Some(db);
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "cannot reopen the process event store; tried again at its next use")
            }
        }
    }

    fn owner(&self, id: u64) -> Option<Owner> {
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    /// Stores events (their `seq` is assigned here), evicting the oldest
    /// beyond the cap and recording how many went.
    pub fn append(&self, mut evs: Vec<ProcessEvent>) -> Result<(), TrackerError> {
        if evs.is_empty() {
            return Ok(());
        }
        self.with_db(|db| self.append_to(db, &mut evs))
    }

    fn append_to(&self, db: &Database, evs: &mut [ProcessEvent]) -> Result<(), TrackerError> {
        let mut w = db.begin_write().map_err(db_err)?;
        // Losing the newest events in a power cut is acceptable; a flush per
        // batch would cost more than the events are worth.
        let _ = w.set_durability(redb::Durability::None);
        let last;
        {
            let mut m = w.open_table(META).map_err(db_err)?;
            let mut seq = m
                .get("next_seq")
                .map_err(db_err)?
                .map(|v| v.value())
                .unwrap_or(1);
            let mut t = w.open_table(EVENTS).map_err(db_err)?;
            for e in evs.iter_mut() {
                e.seq = seq;
                seq += 1;
                let bytes = postcard::to_stdvec(&*e).map_err(TrackerError::Encode)?;
                t.insert(e.seq, bytes.as_slice()).map_err(db_err)?;
            }
            let count = t.len().map_err(db_err)?;
            if count > self.cap {
                // Down to 90% of the cap, oldest first, and say so.
                let drop_n = count - self.cap * 9 / 10;
                let mut dropped = 0;
                while dropped < drop_n {
                    if t.pop_first().map_err(db_err)?.is_none() {
                        break;
                    }
                    dropped += 1;
                }
                let total = m
                    .get("evicted")
                    .map_err(db_err)?
                    .map(|v| v.value())
                    .unwrap_or(0)
                    + dropped;
                m.insert("evicted", total).map_err(db_err)?;
                let note = ProcessEvent {
                    seq,
                    time_ms: allox_store::clock::now_ms(),
                    kind: ProcessEventKind::Evicted,
                    agent_id: String::new(),
                    session_id: String::new(),
                    run_id: String::new(),
                    pid: 0,
                    ppid: 0,
                    host_pid: 0,
                    host_ppid: 0,
                    comm: String::new(),
                    filename: None,
                    exit_code: None,
                    signal: None,
                    evicted: Some(dropped),
                };
                let bytes = postcard::to_stdvec(&note).map_err(TrackerError::Encode)?;
                t.insert(seq, bytes.as_slice()).map_err(db_err)?;
                tracing::warn!(
                    dropped,
                    cap = self.cap,
                    "process event store at its cap: oldest events dropped"
                );
                seq += 1;
            }
            m.insert("next_seq", seq).map_err(db_err)?;
            last = seq - 1;
        }
        w.commit().map_err(db_err)?;
        self.newest.send_replace(last);
        Ok(())
    }

    /// Makes everything appended so far durable.
    pub fn flush(&self) -> Result<(), TrackerError> {
        self.with_db(|db| db.begin_write().map_err(db_err)?.commit().map_err(db_err))
    }

    pub fn evicted(&self) -> u64 {
        self.meta("evicted")
    }

    fn meta(&self, key: &str) -> u64 {
        (|| -> Option<u64> {
            let g = self.db.read().unwrap_or_else(|p| p.into_inner());
            let r = g.as_ref()?.begin_read().ok()?;
            let m = r.open_table(META).ok()?;
            Some(m.get(key).ok()??.value())
        })()
        .unwrap_or(0)
    }

    /// Events after `cursor` matching the filter, oldest first.
    pub fn query(&self, q: &ProcessEvents, lost: u64) -> Result<ProcessEventListing, TrackerError> {
        let limit = q.limit.unwrap_or(1000).clamp(1, 10_000) as usize;
        let from = q.cursor.map(|c| c.saturating_add(1)).unwrap_or(0);
        let r = self.with_db(|db| db.begin_read().map_err(db_err))?;
        let t = r.open_table(EVENTS).map_err(db_err)?;
        let mut events = Vec::new();
        let mut next = q.cursor.unwrap_or(0);
        for row in t.range(from..).map_err(db_err)? {
            let (k, v) = row.map_err(db_err)?;
            next = k.value();
            let Ok(e) = postcard::from_bytes::<ProcessEvent>(v.value()) else {
                continue;
            };
            if matches(q, &e) {
                events.push(e);
                if events.len() == limit {
                    break;
                }
            }
        }
        Ok(ProcessEventListing {
            events,
            next_cursor: next,
            lost,
            evicted: self.evicted(),
        })
    }

    /// Waits until an event newer than `seq` is stored, or `timeout`.
    pub async fn wait_newer(&self, seq: u64, timeout: Duration) {
        let mut rx = self.newest.subscribe();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|&n| n > seq)).await;
    }

    /// The lineage of a session's (or one run's) processes.
    pub fn tree(
        &self,
        agent: &str,
        session: &str,
        run: Option<&str>,
    ) -> Result<ProcessTreeListing, TrackerError> {
        let q = ProcessEvents {
            agent_id: Some(agent.into()),
            session_id: Some(session.into()),
            run_id: run.map(str::to_string),
            limit: Some(10_000),
            ..Default::default()
        };
        let mut events = Vec::new();
        let mut cursor = None;
        loop {
            let page = self.query(
                &ProcessEvents {
                    cursor,
                    ..q.clone()
                },
                0,
            )?;
            let done = page.events.len() < 10_000;
            cursor = Some(page.next_cursor);
            events.extend(page.events);
            if done {
                break;
            }
        }
        Ok(ProcessTreeListing {
            roots: build_tree(&events),
        })
    }
}

fn matches(q: &ProcessEvents, e: &ProcessEvent) -> bool {
    if e.kind == ProcessEventKind::Evicted {
        return true;
    }
    q.agent_id.as_ref().is_none_or(|a| *a == e.agent_id)
        && q.session_id.as_ref().is_none_or(|s| *s == e.session_id)
        && q.run_id.as_ref().is_none_or(|r| *r == e.run_id)
}

/// A process as its first event shows it.
fn node_of(e: &ProcessEvent) -> ProcessNode {
    ProcessNode {
        pid: e.pid,
        host_pid: e.host_pid,
        run_id: e.run_id.clone(),
        comm: e.comm.clone(),
        execs: Vec::new(),
        started_ms: e.time_ms,
        ended_ms: None,
        exit_code: None,
        signal: None,
        children: Vec::new(),
    }
}

/// Builds the lineage from events in order: a fork makes a node under its
/// parent (or a root when the parent is not the session's), an exec adds a
/// program, an exit ends the node. A reused host pid starts a new node.
pub fn build_tree(events: &[ProcessEvent]) -> Vec<ProcessNode> {
    struct Slot {
        node: ProcessNode,
        parent: Option<usize>,
        kids: Vec<usize>,
    }
    let mut slots: Vec<Slot> = Vec::new();
    let mut live: HashMap<u32, usize> = HashMap::new();
    for e in events {
        match e.kind {
            ProcessEventKind::Fork => {
                let parent = live.get(&e.host_ppid).copied();
                let i = slots.len();
                slots.push(Slot {
                    node: node_of(e),
                    parent,
                    kids: Vec::new(),
                });
                if let Some(p) = parent {
                    slots[p].kids.push(i);
                }
                live.insert(e.host_pid, i);
            }
            ProcessEventKind::Exec | ProcessEventKind::Exit => {
                // A process seen first here (its fork predates the tracker)
                // becomes a root of its own.
                let i = *live.entry(e.host_pid).or_insert_with(|| {
                    slots.push(Slot {
                        node: node_of(e),
                        parent: None,
                        kids: Vec::new(),
                    });
                    slots.len() - 1
                });
                let n = &mut slots[i].node;
                n.comm = e.comm.clone();
                if e.kind == ProcessEventKind::Exec {
                    n.execs.extend(e.filename.clone());
                } else {
                    n.ended_ms = Some(e.time_ms);
                    n.exit_code = e.exit_code;
                    n.signal = e.signal;
                    live.remove(&e.host_pid);
                }
            }
            ProcessEventKind::Evicted => {}
        }
    }
    fn take(slots: &mut Vec<Slot>, i: usize) -> ProcessNode {
        let kids = std::mem::take(&mut slots[i].kids);
        let mut node = slots[i].node.clone();
        node.children = kids.into_iter().map(|k| take(slots, k)).collect();
        node
    }
    let roots: Vec<usize> = (0..slots.len())
        .filter(|&i| slots[i].parent.is_none())
        .collect();
    roots.into_iter().map(|i| take(&mut slots, i)).collect()
}

/// The loaded programs, the store, and the thread that drains the one into
/// the other.
pub struct ProcessTracker {
    tracker: Mutex<Tracker>,
    pub store: EventStore,
    /// Events drained from the kernel since the start.
    received: std::sync::atomic::AtomicU64,
    /// Events the store could not take (a full disk): counted as lost.
    unstored: std::sync::atomic::AtomicU64,
    /// When a failure to store them was last logged (once in 10 s).
    said: Mutex<Option<std::time::Instant>>,
}

impl std::fmt::Debug for ProcessTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProcessTracker")
    }
}

/// Milliseconds between the boot clock (the events' time) and the wall.
fn boot_to_wall_ms() -> i128 {
    allox_store::clock::now_ms() as i128 - allox_store::clock::since_boot().as_millis() as i128
}

impl ProcessTracker {
    /// Loads and attaches the programs (the error says exactly why not),
    /// opens the store and starts draining.
    pub fn start(state_dir: &Path, cap: u64) -> Result<Arc<ProcessTracker>, TrackerError> {
        let t0 = std::time::Instant::now();
        let tracker = Tracker::load()?;
        tracing::info!(
            ms = t0.elapsed().as_millis() as u64,
            "process tracker loaded and attached"
        );
        let path = state_dir.join("events.redb");
        allox_store::reserve::prepare(&path, allox_store::reserve::room_for(state_dir));
        let store = EventStore::open(&path, cap)?;
        let me = Arc::new(ProcessTracker {
            tracker: Mutex::new(tracker),
            store,
            received: std::sync::atomic::AtomicU64::new(0),
            unstored: std::sync::atomic::AtomicU64::new(0),
            said: Mutex::new(None),
        });
        let weak = Arc::downgrade(&me);
        std::thread::Builder::new()
            .name("allox-tracker".into())
            .spawn(move || {
                let mut since_flush = std::time::Instant::now();
                while let Some(me) = weak.upgrade() {
                    me.drain_once();
                    if since_flush.elapsed() > Duration::from_secs(1) {
                        let _ = me.store.flush();
                        since_flush = std::time::Instant::now();
                    }
                    drop(me);
                    std::thread::sleep(DRAIN_EVERY);
                }
            })
            .map_err(TrackerError::Thread)?;
        Ok(me)
    }

    /// Moves what the kernel has handed over into the store; returns how
    /// many events.
    pub fn drain_once(&self) -> usize {
        let mut raw = Vec::new();
        self.tracker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(|e| raw.push(e));
        let offset = boot_to_wall_ms();
        let evs: Vec<ProcessEvent> = raw
            .into_iter()
            .filter_map(|e| self.event(e, offset))
            .collect();
        let n = evs.len();
        self.received
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = self.store.append(evs) {
            let lost = self
                .unstored
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed)
                + n as u64;
            let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
            let now = std::time::Instant::now();
            if said.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(10)) {
                *said = Some(now);
                tracing::error!(
                    error = %allox_protocol::error_chain(&e), lost,
                    "cannot store process events; they are counted lost"
                );
            }
        }
        n
    }

    fn event(&self, e: RawEvent, offset: i128) -> Option<ProcessEvent> {
        let owner = self.store.owner(e.owner)?;
        let (exit_code, signal) = match e.exit_status {
            Some(w) if w & 0x7f == 0 => (Some((w >> 8) & 0xff), None),
            Some(w) => (None, Some(w & 0x7f)),
            None => (None, None),
        };
        Some(ProcessEvent {
            seq: 0,
            time_ms: (e.ts_ns as i128 / 1_000_000 + offset).max(0) as u64,
            kind: match e.kind {
                EventKind::Fork => ProcessEventKind::Fork,
                EventKind::Exec => ProcessEventKind::Exec,
                EventKind::Exit => ProcessEventKind::Exit,
            },
            agent_id: owner.agent,
            session_id: owner.session,
            run_id: owner.run,
            pid: e.ns_pid,
            ppid: e.ns_ppid,
            host_pid: e.pid,
            host_ppid: e.ppid,
            comm: e.comm,
            filename: e.filename,
            exit_code,
            signal,
            evicted: None,
        })
    }

    /// Tags a run's cgroup before its first process is created in it.
    pub fn tag_run(
        &self,
        agent: &str,
        session: &str,
        run: &str,
        cgroup_id: u64,
    ) -> Result<(), TrackerError> {
        let owner = self.store.add_owner(Owner {
            agent: agent.into(),
            session: session.into(),
            run: run.into(),
        })?;
        self.tracker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .tag_cgroup(cgroup_id, owner)
            .map_err(TrackerError::Tag)
    }

    /// Tags a run by its cgroup's directory, before its first process is
    /// created in it.
    pub fn tag_run_cgroup(
        &self,
        agent: &str,
        session: &str,
        run: &str,
        cgroup: impl rustix::fd::AsFd,
    ) -> Result<(), TrackerError> {
        // The cgroup's id is its directory's inode number.
        let st = rustix::fs::fstat(cgroup).map_err(TrackerError::CgroupId)?;
        self.tag_run(agent, session, run, st.st_ino)
    }

    /// Forgets a run's cgroup (it was removed).
    pub fn untag_cgroup(&self, cgroup_id: u64) {
        let _ = self
            .tracker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .untag_cgroup(cgroup_id);
    }

    /// Run count and in-kernel time of each program.
    pub fn prog_stats(&self) -> Vec<allox_ebpf_probes::ProgStats> {
        self.tracker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .prog_stats()
    }

    /// Events drained from the kernel (and attributed to a run) since the
    /// start.
    pub fn received(&self) -> u64 {
        self.received.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Events the kernel could not hand over, in all.
    /// Events lost: those the kernel's ring could not hold, and those the
    /// store could not take.
    pub fn lost(&self) -> u64 {
        self.tracker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lost()
            + self.unstored.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: ProcessEventKind, pid: u32, ppid: u32, file: Option<&str>) -> ProcessEvent {
        ProcessEvent {
            seq: 0,
            time_ms: 1,
            kind,
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: "r".into(),
            pid,
            ppid,
            host_pid: pid + 1000,
            host_ppid: ppid + 1000,
            comm: "sh".into(),
            filename: file.map(str::to_string),
            exit_code: (kind == ProcessEventKind::Exit).then_some(0),
            signal: None,
            evicted: None,
        }
    }

    #[test]
    fn the_tree_follows_forks_and_survives_pid_reuse() {
        use ProcessEventKind::*;
        let evs = vec![
            ev(Fork, 1, 0, None),
            ev(Exec, 1, 0, Some("/bin/sh")),
            ev(Fork, 2, 1, None),
            ev(Exec, 2, 1, Some("/bin/cat")),
            ev(Exit, 2, 1, None),
            ev(Fork, 2, 1, None), // pid 2 reused
            ev(Fork, 3, 2, None),
        ];
        let roots = build_tree(&evs);
        assert_eq!(roots.len(), 1);
        let r = &roots[0];
        assert_eq!(r.execs, ["/bin/sh"]);
        assert_eq!(r.children.len(), 2);
        assert_eq!(r.children[0].execs, ["/bin/cat"]);
        assert!(r.children[0].ended_ms.is_some());
        assert!(r.children[1].ended_ms.is_none());
        assert_eq!(r.children[1].children[0].pid, 3);
    }

    #[test]
    fn the_store_caps_oldest_first_and_says_so() {
        let d = tempfile::tempdir().unwrap();
        let st = EventStore::open(&d.path().join("e.redb"), 100).unwrap();
        for i in 0..25 {
            st.append(
                (0..10)
                    .map(|k| ev(ProcessEventKind::Fork, i * 10 + k, 1, None))
                    .collect(),
            )
            .unwrap();
        }
        let all = st
            .query(
                &ProcessEvents {
                    limit: Some(10_000),
                    ..Default::default()
                },
                0,
            )
            .unwrap();
        assert!(all.events.len() <= 101, "{}", all.events.len());
        assert!(all.evicted > 0);
        let notes: u64 = all.events.iter().filter_map(|e| e.evicted).sum();
        assert!(notes > 0, "the eviction is recorded");
        // Oldest first: the survivors are the newest.
        let last = all
            .events
            .iter()
            .rev()
            .find(|e| e.kind == ProcessEventKind::Fork)
            .unwrap();
        assert_eq!(last.pid, 249);
        // A cursor continues where the last answer ended.
        let page = st
            .query(
                &ProcessEvents {
                    limit: Some(5),
                    ..Default::default()
                },
                0,
            )
            .unwrap();
        let next = st
            .query(
                &ProcessEvents {
                    limit: Some(5),
                    cursor: Some(page.next_cursor),
                    ..Default::default()
                },
                0,
            )
            .unwrap();
        assert!(next.events[0].seq > page.events[4].seq);
    }
}
