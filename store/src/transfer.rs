//! `session.export` and `session.import`: a session with its whole
//! checkpoint history as a [`crate::archive`] of Btrfs send streams, and
//! back.
//!
//! Export snapshots `current/` read-only (so runs may go on) and sends each
//! checkpoint relative to its parent when the parent travels first (shared
//! extents go once), then the snapshot of `current/` relative to the head.
//! Import receives every stream into a staging directory beside the
//! agent's sessions (the same subvolume, so its trees can be renamed into
//! place), checking each as it ends; only when the archive's end mark
//! checks does one journaled step make the session appear. Anything short
//! of that leaves the store as it was: the staging directory is removed,
//! and one a crash leaves is swept at the next start.

use super::{mkdir, After, Result, Store, StoreError, MAX_LABEL};
use crate::archive::{self, ArchivedCheckpoint, Item, Manifest, PushError, StreamInfo, Tree};
use crate::btrfs;
use crate::index::{session_key, CheckpointRecord};
use crate::journal::Op;
use crate::sendstream::Inspector;
use allox_protocol::{validate_id, SessionInfo};
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;

/// Where the read-only snapshot of `current/` is sent from, and the name
/// its stream gives the received tree (no checkpoint id begins with `.`).
const CURRENT: &str = ".current";

/// The pipes to and from `btrfs send` and `btrfs receive`.
const PIPE: usize = 1 << 20;

/// Most checkpoints and turns one archive may list.
const MAX_ITEMS: usize = 1_000_000;

/// What an export wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    pub bytes: u64,
    pub checkpoints: usize,
}

/// What an import made.
#[derive(Debug, Clone)]
pub struct Imported {
    pub session: SessionInfo,
    pub checkpoints: usize,
    pub bytes: u64,
    /// The limits the archive carries, for the caller to apply to a new
    /// session (the store knows no cgroups).
    pub limits: archive::Limits,
    /// Privileges of the archive's files dropped on the way in: setuid
    /// and setgid bits, privileged extended attributes (no file of a
    /// session holds one).
    pub privileges_dropped: u64,
}

/// Removes a directory of subvolumes when dropped.
struct Scratch(Option<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            if let Err(e) = btrfs::remove_tree(&p) {
                tracing::warn!(path = %p.display(), error = %StoreError::from(e).chain(), "cannot remove a transfer's scratch tree");
            }
        }
    }
}

/// A transfer's scratch directory known to the store while the transfer
/// goes on (so `store.check` does not call it out of place).
struct InFlight {
    set: Arc<std::sync::Mutex<HashSet<PathBuf>>>,
    path: PathBuf,
}

impl InFlight {
    fn new(st: &Store, path: &Path) -> InFlight {
        let set = st.in_flight.clone();
        set.lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(path.to_path_buf());
        InFlight {
            set,
            path: path.to_path_buf(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.path);
    }
}

impl Store {
    /// The scratch trees of the transfers going on.
    pub(crate) fn transfers_in_flight(&self) -> HashSet<PathBuf> {
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn btrfs_cli() -> Command {
    let mut c = Command::new("btrfs");
    c.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    c
}

impl Store {
    /// Writes session `a/s` to `out` as an archive: with `since`, only the
    /// checkpoints made after it, and `current/` relative to it.
    pub fn session_export(
        &self,
        a: &str,
        s: &str,
        since: Option<&str>,
        limits: &archive::Limits,
        out: &mut dyn Write,
    ) -> Result<Exported> {
        validate_id("agent_id", a)?;
        validate_id("session_id", s)?;
        if let Some(c) = since {
            validate_id("since", c)?;
        }
        let l = &self.layout;
        let _in_flight;
        let scratch;
        // Each checkpoint's own UUID as the manifest records it: a tree is
        // sent by its path, after the store's lock is let go, so one deleted
        // and made again under its name meanwhile must not be sent as it.
        let mut trees: HashMap<String, [u8; 16]> = HashMap::new();
        let manifest = {
            let _g = self.guard();
            let rec = self.need_session(a, s)?;
            let mut cps = self.index.checkpoints(a, s)?;
            cps.sort_by_key(|(_, r)| r.seq);
            for (c, _) in &cps {
                trees.insert(c.clone(), btrfs::root_info(&l.checkpoint(a, s, c))?.uuid);
            }
            let base = match since {
                Some(c) => {
                    let r = self.need_checkpoint(a, s, c)?;
                    let info = btrfs::root_info(&l.checkpoint(a, s, c))?;
                    cps.retain(|(_, x)| x.seq > r.seq);
                    Some(archive::Base {
                        id: c.to_string(),
                        uuid: uuid_of(&info),
                    })
                }
                None => None,
            };
            let key = session_key(a, s);
            let dir = l
                .session_dir(a, s)
                .join(format!(".export-{}", self.new_op_id()));
            _in_flight = InFlight::new(self, &dir);
            mkdir(&dir)?;
            scratch = Scratch(Some(dir.clone()));
            self.snapshot_current(a, s, &dir.join(CURRENT), true)?;
            let sent: HashSet<&str> = cps.iter().map(|(c, _)| c.as_str()).collect();
            let parent_of = |p: &Option<String>| {
                p.as_ref()
                    .filter(|p| sent.contains(p.as_str()))
                    .cloned()
                    .or_else(|| since.map(str::to_string))
            };
            let mut streams: Vec<StreamInfo> = cps
                .iter()
                .map(|(c, r)| StreamInfo {
                    tree: Tree::Checkpoint(c.clone()),
                    parent: parent_of(&r.parent),
                })
                .collect();
            streams.push(StreamInfo {
                tree: Tree::Current,
                parent: parent_of(&rec.head),
            });
            Manifest {
                agent: a.into(),
                session: s.into(),
                created_ms: rec.created_ms,
                head: rec.head.clone(),
                network: self.index.network(&key)?.unwrap_or_default(),
                policy: self.index.policy(&key)?,
                clock: self.index.clock(a, s)?,
                fork: self.index.fork(a, s)?,
                limits: limits.clone(),
                checkpoints: cps
                    .into_iter()
                    .map(|(id, record)| ArchivedCheckpoint { id, record })
                    .collect(),
                turns: self.index.turns(a, s)?,
                since: base,
                streams,
            }
        };
        let dir = scratch.0.clone().unwrap_or_default();
        let mut w = archive::Writer::new(out, &manifest)
            .map_err(|e| StoreError::Export(format!("writing the manifest: {e}")))?;
        let path_of = |t: &Tree| match t {
            Tree::Checkpoint(c) => l.checkpoint(a, s, c),
            Tree::Current => dir.join(CURRENT),
        };
        for st in &manifest.streams {
            let mut cmd = btrfs_cli();
            cmd.args(["send", "-q"]);
            if let Some(p) = &st.parent {
                cmd.arg("-p").arg(l.checkpoint(a, s, p));
            }
            cmd.arg(path_of(&st.tree));
            // The tree and its parent are still those the manifest
            // records, before the send and after it.
            let same = |c: &str| {
                btrfs::root_info(&l.checkpoint(a, s, c))
                    .ok()
                    .map(|i| i.uuid)
                    == trees.get(c).copied()
            };
            let unchanged = || {
                let tree = match &st.tree {
                    Tree::Checkpoint(c) => same(c),
                    Tree::Current => true,
                };
                tree && st.parent.as_deref().is_none_or(same)
            };
            let replaced = || {
                // The whole session (or agent) gone: said as such ("export
                // again" cannot work then).
                if !matches!(self.index.session(a, s), Ok(Some(_))) {
                    return StoreError::ChangedDuring(format!(
                        "the export of {a}/{s} stopped: the session was deleted while the export ran"
                    ));
                }
                StoreError::ChangedDuring(format!(
                    "the export of {a}/{s} stopped: {} (or the checkpoint it is sent against) was deleted, or made again under its name, while the export ran; export again",
                    st.tree
                ))
            };
            if !unchanged() {
                return Err(replaced());
            }
            // Deleted (the host's, or a turn of the agent's pruning it) or
            // made again while it was sent: said as such, whether the send
            // failed for it or not.
            let sent = send(cmd, &st.tree, &mut w);
            if !unchanged() {
                return Err(replaced());
            }
            sent?;
            w.end_stream()
                .map_err(|e| StoreError::Export(format!("writing {}: {e}", st.tree)))?;
        }
        let (bytes, _) = w
            .finish()
            .map_err(|e| StoreError::Export(format!("writing the end mark: {e}")))?;
        drop(scratch);
        Ok(Exported {
            bytes,
            checkpoints: manifest.checkpoints.len(),
        })
    }

    /// Begins an import into agent `a` (which must exist) as session `s`
    /// (the archive's own id when `None`).
    pub fn import_begin(self: &Arc<Self>, a: &str, s: Option<&str>) -> Result<Import> {
        validate_id("agent_id", a)?;
        if let Some(s) = s {
            validate_id("session_id", s)?;
        }
        self.check_fence()?;
        self.need_agent(a)?;
        // As a session.create: a new tree is not begun on a full disk.
        self.check_space()?;
        let staging = format!(".import-{}", self.new_op_id());
        let dir = self.layout.sessions_dir(a).join(&staging);
        mkdir(&dir)?;
        let in_flight = InFlight::new(self, &dir);
        let scratch = Scratch(Some(dir.clone()));
        mkdir(&dir.join("checkpoints"))?;
        Ok(Import {
            store: self.clone(),
            agent: a.into(),
            session: s.map(str::to_string),
            staging,
            scratch,
            _in_flight: in_flight,
            reader: archive::Reader::default(),
            manifest: None,
            receiving: None,
            inspecting: None,
            uuids: HashMap::new(),
            locals: HashMap::new(),
            dropped: 0,
            serves: Box::new(|_| Ok(())),
            clock_default: None,
        })
    }
}

fn uuid_of(info: &btrfs::RootInfo) -> [u8; 16] {
    if info.received_uuid != [0; 16] {
        info.received_uuid
    } else {
        info.uuid
    }
}

/// Runs `cmd` (a `btrfs send`) and writes its output as the next stream.
fn send<W: Write>(mut cmd: Command, tree: &Tree, w: &mut archive::Writer<W>) -> Result<()> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| StoreError::Export(format!("cannot run btrfs send (btrfs-progs): {e}")))?;
    let mut stdout = child.stdout.take().expect("piped");
    // Room for `btrfs send` to run ahead of the writer.
    let _ = rustix::pipe::fcntl_setpipe_size(&stdout, PIPE);
    let mut stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut buf = vec![0u8; archive::MAX_FRAME];
    let copied: std::io::Result<()> = loop {
        match stdout.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                if let Err(e) = w.data(&buf[..n]) {
                    break Err(e);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    if copied.is_err() {
        let _ = child.kill();
    }
    let status = child.wait();
    let why = errors.join().unwrap_or_default();
    copied.map_err(|e| StoreError::Export(format!("writing {tree}: {e}")))?;
    match status {
        Ok(st) if st.success() => Ok(()),
        Ok(st) => Err(StoreError::Export(format!(
            "btrfs send of {tree} failed ({st}): {}",
            why.trim()
        ))),
        Err(e) => Err(StoreError::Export(format!("btrfs send of {tree}: {e}"))),
    }
}

/// An import under way: bytes are pushed as they come; [`Import::commit`]
/// makes the session appear. Dropped before that, it leaves nothing.
pub struct Import {
    store: Arc<Store>,
    agent: String,
    session: Option<String>,
    staging: String,
    scratch: Scratch,
    /// Dropped after `scratch` (fields drop in order).
    _in_flight: InFlight,
    reader: archive::Reader,
    manifest: Option<Manifest>,
    /// The `btrfs receive` of the stream being read.
    receiving: Option<Receiving>,
    /// The check of the stream being read.
    inspecting: Option<Inspector>,
    /// The UUIDs the sender gave the trees received so far (and the base).
    uuids: HashMap<String, [u8; 16]>,
    /// For each of those, the tree's own UUID on this filesystem.
    locals: HashMap<[u8; 16], [u8; 16]>,
    /// Privileges dropped, in the streams read whole.
    dropped: u64,
    /// Whether the daemon serves the network an archive's new session
    /// asks for: `Err(why)` refuses the archive before anything is
    /// received ([`Import::serving`]).
    serves: Box<NetworkCheck>,
    /// The limits over time a new session takes where its archive has
    /// none ([`Import::with_clock_default`]).
    clock_default: Option<crate::index::ClockRecord>,
}

/// See [`Import::serving`].
pub type NetworkCheck =
    dyn Fn(&crate::index::NetworkRecord) -> std::result::Result<(), String> + Send + Sync;

struct Receiving {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Drop for Receiving {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl std::fmt::Debug for Import {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Import")
            .field("agent", &self.agent)
            .field("session", &self.session)
            .field("staging", &self.staging)
            .field("read", &self.reader.read())
            .finish()
    }
}

impl Import {
    /// Bytes read so far.
    pub fn read(&self) -> u64 {
        self.reader.read()
    }

    fn staging(&self) -> PathBuf {
        self.scratch.0.clone().unwrap_or_default()
    }

    /// Refuses an archive whose new session asks for a network `check`
    /// says this daemon does not serve (a session in `proxy` mode where the
    /// network plugin is off: it would move, and then every run in it be
    /// refused). An archive that adds to a session keeps that session's.
    pub fn serving(mut self, check: Box<NetworkCheck>) -> Import {
        self.serves = check;
        self
    }

    /// The idle timeout and lifetime a new session takes where its archive
    /// gives none: its agent's, else the daemon's, as a session made here
    /// does (an archive without them took none, whatever the daemon was
    /// told). An archive that adds to a session keeps that session's.
    pub fn with_clock_default(mut self, c: Option<crate::index::ClockRecord>) -> Import {
        self.clock_default = c;
        self
    }

    /// Reads the next bytes of the archive.
    pub fn push(&mut self, bytes: &[u8]) -> Result<()> {
        let staging = self.staging();
        let Import {
            reader,
            manifest,
            receiving,
            inspecting,
            uuids,
            locals,
            store,
            agent,
            session,
            dropped,
            serves,
            ..
        } = self;
        let r = reader.push(bytes, &mut |item| -> Result<()> {
            match item {
                Item::Manifest(m) => {
                    check_manifest(store, agent, session.as_deref(), &m)?;
                    if m.since.is_none() {
                        serves(&m.network).map_err(|why| {
                            StoreError::Unserved(format!(
                                "its session {agent}/{} {why}",
                                session.as_deref().unwrap_or(&m.session)
                            ))
                        })?;
                    }
                    if let Some(b) = &m.since {
                        // The session's checkpoint, found the same tree
                        // as the sender's by the check.
                        let s = session.as_deref().unwrap_or(&m.session);
                        let here = btrfs::root_info(&store.layout.checkpoint(agent, s, &b.id))?;
                        uuids.insert(b.id.clone(), b.uuid);
                        locals.insert(b.uuid, here.uuid);
                    }
                    *manifest = Some(*m);
                }
                Item::Data { index, bytes } => {
                    let tree = stream_name(manifest, index);
                    let i = inspecting.get_or_insert_with(|| Inspector::new(&received_name(manifest, index)));
                    // Only what was checked reaches receive.
                    let checked = i
                        .push(bytes, &|u| locals.get(u).copied())
                        .map_err(|why| StoreError::BadArchive(format!("the send stream of {tree}: {why}")))?;
                    if receiving.is_none() {
                        *receiving = Some(receive(&into(&staging, manifest, index))?);
                    }
                    let rx = receiving.as_mut().expect("made above");
                    let stdin = rx.stdin.as_mut().expect("open until the stream ends");
                    if let Err(e) = stdin.write_all(&checked) {
                        let tree = stream_name(manifest, index);
                        let why = finish_receive(receiving.take().expect("there"));
                        return Err(receive_failed(format!(
                            "btrfs receive of {tree} stopped ({e}): {why}"
                        )));
                    }
                }
                Item::StreamEnd { index } => {
                    let tree = stream_name(manifest, index);
                    let inspected = inspecting.take().unwrap_or_else(|| Inspector::new(""));
                    let made = inspected
                        .finish()
                        .map_err(|why| StoreError::BadArchive(format!("the send stream of {tree}: {why}")))?;
                    *dropped += inspected.dropped();
                    let m = manifest.as_ref().expect("streams follow the manifest");
                    let parent = m.streams[index].parent.as_ref().map(|p| uuids.get(p).copied());
                    if made.parent != parent.flatten() || parent == Some(None) {
                        return Err(StoreError::BadArchive(format!(
                            "the send stream of {tree} is not relative to the tree the manifest says"
                        )));
                    }
                    // An empty stream: receive refuses it below.
                    let rx = match receiving.take() {
                        Some(rx) => rx,
                        None => receive(&into(&staging, manifest, index))?,
                    };
                    let why = finish_receive(rx);
                    if !why.is_empty() {
                        return Err(receive_failed(format!(
                            "btrfs receive of {tree} failed: {why}"
                        )));
                    }
                    store.crash_point("session_import.before_check");
                    let parent_here = made.parent.and_then(|p| locals.get(&p).copied());
                    let here = check_received(
                        &staging,
                        &m.streams[..=index],
                        &m.streams[index].tree,
                        &made.uuid,
                        parent_here.unwrap_or_default(),
                    )?;
                    if let Tree::Checkpoint(c) = &m.streams[index].tree {
                        uuids.insert(c.clone(), made.uuid);
                        locals.insert(made.uuid, here);
                    }
                }
                Item::End => {}
            }
            Ok(())
        });
        match r {
            Ok(()) => Ok(()),
            Err(PushError::Archive(e)) => Err(StoreError::Archive(e)),
            Err(PushError::Handler(e)) => Err(agent_gone(store, agent, e)),
        }
    }

    /// Makes the session appear, if the archive ended and checked.
    pub fn commit(self) -> Result<Imported> {
        let (store, agent) = (self.store.clone(), self.agent.clone());
        self.commit_checked()
            .map_err(|e| agent_gone(&store, &agent, e))
    }

    fn commit_checked(mut self) -> Result<Imported> {
        self.reader.finish()?;
        let m = self
            .manifest
            .take()
            .expect("a whole archive has a manifest");
        if m.since.is_some() {
            return self.commit_since(m);
        }
        let st = self.store.clone();
        let bytes = self.reader.read();
        let a = self.agent.clone();
        let s = self.session.clone().unwrap_or_else(|| m.session.clone());
        let staging = self.staging();
        let l = &st.layout;
        let _g = st.guard();
        st.need_agent(&a)?;
        if st.index.session(&a, &s)?.is_some() {
            return Err(StoreError::Exists(format!("session {a}/{s}")));
        }
        let dir = l.session_dir(&a, &s);
        if dir.exists() {
            return Err(StoreError::OnDiskNotIndexed(dir));
        }
        let key = session_key(&a, &s);
        let now = crate::clock::now_ms();
        let build = |w: &mut crate::index::Writer<'_>| {
            w.put_network(&key, &m.network)?;
            match &m.policy {
                Some(p) => w.put_policy(&key, p)?,
                None => w.remove_policy(&key)?,
            }
            let clock = match (&m.clock, &self.clock_default) {
                (Some(c), Some(d)) => Some(crate::index::ClockRecord {
                    idle_timeout_ms: c.idle_timeout_ms.or(d.idle_timeout_ms),
                    max_lifetime_ms: c.max_lifetime_ms.or(d.max_lifetime_ms),
                    ..c.clone()
                }),
                (c, d) => c.clone().or_else(|| d.clone()),
            };
            match &clock {
                // Its lifetime counts from the import.
                Some(c) => w.put_clock(
                    &a,
                    &s,
                    &crate::index::ClockRecord {
                        lifetime_from_ms: now,
                        last_active_ms: now,
                        expired_ms: None,
                        ..c.clone()
                    },
                )?,
                None => w.remove_clock(&a, &s)?,
            }
            let checkpoints = numbered(w, &m)?;
            Ok(Op::SessionImport {
                agent: a.clone(),
                session: s.clone(),
                created_ms: m.created_ms,
                staging: self.staging.clone(),
                head: m.head.clone(),
                checkpoints,
                turns: m.turns.clone(),
                fork: m.fork.clone(),
            })
        };
        st.check_space()?;
        st.fits_session_quota(archive_trees(&staging, &m), true, "nothing was made")?;
        st.journaled(build, |op_id, op| {
            st.crash_point("session_import.after_journal");
            // The staging directory is laid out as the session's: a
            // read-only subvolume cannot move to another directory, but
            // the directory holding it can.
            let current = staging.join("current");
            btrfs::snapshot(&staging.join(CURRENT), &current, false)?;
            st.limit_session_tree(&current)?;
            st.crash_point("session_import.after_current");
            std::fs::rename(&staging, &dir).map_err(|e| StoreError::io("rename", &staging, e))?;
            st.crash_point("session_import.after_rename");
            st.end(op_id, op, &After::Nothing)?;
            st.crash_point("session_import.after_commit");
            Ok(((), After::Nothing))
        })?;
        // What is left of the staging is the received current/, now in the
        // session's directory under a name no user tree has.
        self.scratch.0 = Some(dir.join(CURRENT));
        drop(_g);
        let privileges_dropped = self.dropped;
        drop(self);
        Ok(Imported {
            session: st.session_info_of(&a, &s)?,
            checkpoints: m.checkpoints.len(),
            bytes,
            limits: m.limits.clone(),
            privileges_dropped,
        })
    }
}

impl Import {
    /// The existing session an archive made `since` a checkpoint changes
    /// (known once its manifest was read); `None` for a whole session.
    pub fn changes(&self) -> Option<(String, String)> {
        let m = self.manifest.as_ref()?;
        m.since.as_ref()?;
        Some((
            self.agent.clone(),
            self.session.clone().unwrap_or_else(|| m.session.clone()),
        ))
    }

    /// An archive made `since` a checkpoint: its checkpoints added to the
    /// session, its `current/` put in place of the session's (whose runs
    /// the caller has stopped).
    fn commit_since(self, m: Manifest) -> Result<Imported> {
        let st = self.store.clone();
        let bytes = self.reader.read();
        let a = self.agent.clone();
        let s = self.session.clone().unwrap_or_else(|| m.session.clone());
        let staging = self.staging();
        let l = &st.layout;
        let _g = st.guard();
        check_base(&st, &a, &s, &m)?;
        st.room_for_checkpoints(&a, &s, m.checkpoints.len())?;
        let current = l.current(&a, &s);
        let old_subvolume = btrfs::subvolume_id(&current)?;
        let build = |w: &mut crate::index::Writer<'_>| {
            let checkpoints = numbered(w, &m)?;
            Ok(Op::SessionImportSince {
                agent: a.clone(),
                session: s.clone(),
                staging: self.staging.clone(),
                head: m.head.clone(),
                checkpoints,
                turns: m.turns.clone(),
                old_subvolume,
            })
        };
        st.check_space()?;
        st.fits_session_quota(archive_trees(&staging, &m), true, "nothing was made")?;
        st.journaled(build, |op_id, op| {
            st.crash_point("session_import_since.after_journal");
            for c in &m.checkpoints {
                // A read-only tree cannot move to another directory (its
                // `..` would change): writable for the move, read-only
                // again before the next step.
                let from = staging.join("checkpoints").join(&c.id);
                let to = l.checkpoint(&a, &s, &c.id);
                btrfs::set_read_only(&from, false)?;
                std::fs::rename(&from, &to).map_err(|e| StoreError::io("rename", &from, e))?;
                btrfs::set_read_only(&to, true)?;
            }
            st.crash_point("session_import_since.after_checkpoints");
            let fresh = staging.join("current");
            btrfs::snapshot(&staging.join(CURRENT), &fresh, false)?;
            st.limit_session_tree(&fresh)?;
            btrfs::exchange(&fresh, &current)?;
            st.crash_point("session_import_since.after_exchange");
            st.end(op_id, op, &After::Nothing)?;
            st.crash_point("session_import_since.after_commit");
            Ok(((), After::Nothing))
        })?;
        drop(_g);
        let privileges_dropped = self.dropped;
        drop(self);
        Ok(Imported {
            session: st.session_info_of(&a, &s)?,
            checkpoints: m.checkpoints.len(),
            bytes,
            limits: m.limits.clone(),
            privileges_dropped,
        })
    }
}

/// A `btrfs receive` that failed: for want of space (the disk or the
/// quota is full: free space and retry), else refused by the archive.
fn receive_failed(why: String) -> StoreError {
    if why.contains("No space left on device") || why.contains("Disk quota exceeded") {
        StoreError::OutOfSpace(why)
    } else {
        StoreError::BadArchive(why)
    }
}

/// An import's failure when its agent was deleted meanwhile (its staging
/// went with it, and a receive, a read or a rename failed): said, not
/// blamed on the archive nor reported as the store's own failure.
fn agent_gone(store: &Store, agent: &str, e: StoreError) -> StoreError {
    let failed = matches!(
        e,
        StoreError::BadArchive(_) | StoreError::Io { .. } | StoreError::Btrfs(_)
    );
    if failed && store.index.agent(agent).ok().flatten().is_none() {
        return StoreError::ChangedDuring(format!(
            "agent {agent} was deleted during the import; nothing was made"
        ));
    }
    e
}

/// For an archive made `since` a checkpoint: the session exists, holds
/// that checkpoint as the sender had it (its UUID, or the UUID it was
/// received from, is the archive's), and none of the archive's own.
fn check_base(st: &Store, a: &str, s: &str, m: &Manifest) -> Result<()> {
    let Some(base) = &m.since else { return Ok(()) };
    st.need_session(a, s)?;
    let mismatch = |why: String| {
        StoreError::BaseMismatch(format!(
            "the archive adds to {a}/{s} after checkpoint {}, {why}",
            base.id
        ))
    };
    if st.index.checkpoint(a, s, &base.id)?.is_none() {
        return Err(mismatch("which this session does not have".into()));
    }
    let info = btrfs::root_info(&st.layout.checkpoint(a, s, &base.id))?;
    if uuid_of(&info) != base.uuid {
        return Err(mismatch(
            "but this session's checkpoint of that name is another tree".into(),
        ));
    }
    for c in &m.checkpoints {
        if st.index.checkpoint(a, s, &c.id)?.is_some() || st.layout.checkpoint(a, s, &c.id).exists()
        {
            return Err(StoreError::Exists(format!("checkpoint {a}/{s}/{}", c.id)));
        }
    }
    // The archive carries the sender's whole list of turns, put in place
    // of this session's: each turn here must be the sender's as it is
    // (else its history went on here too, and a turn would be re-opened,
    // or two open at once, or two of one number).
    let theirs: HashMap<&str, &crate::index::TurnRecord> =
        m.turns.iter().map(|(t, r)| (t.as_str(), r)).collect();
    for (t, r) in st.index.turns(a, s)? {
        match theirs.get(t.as_str()) {
            Some(x) if **x == r => {}
            // Open here as it left, ended by the sender since: the
            // sender's history going on.
            Some(x)
                if r.ended_ms.is_none()
                    && (x.number, x.began_ms) == (r.number, r.began_ms)
                    && r.checkpoint_id.is_none() => {}
            Some(_) => {
                return Err(mismatch(format!(
                    "but turn {t} of this session is not the sender's as it is (it went on here since: move the other way, or fork)"
                )))
            }
            None => {
                return Err(mismatch(format!(
                    "but turn {t} of this session was made here and the sender has no such turn (move the other way, or fork)"
                )))
            }
        }
    }
    Ok(())
}

/// Where stream `index` is received: a checkpoint into the staging's
/// `checkpoints/`, `current/` beside it.
fn into(staging: &Path, m: &Option<Manifest>, index: usize) -> PathBuf {
    match m
        .as_ref()
        .and_then(|m| m.streams.get(index))
        .map(|s| &s.tree)
    {
        Some(Tree::Checkpoint(_)) => staging.join("checkpoints"),
        _ => staging.to_path_buf(),
    }
}

/// The name stream `index`'s subvolume has (and its stream gives it).
fn received_name(m: &Option<Manifest>, index: usize) -> String {
    match m
        .as_ref()
        .and_then(|m| m.streams.get(index))
        .map(|s| &s.tree)
    {
        Some(Tree::Checkpoint(c)) => c.clone(),
        _ => CURRENT.to_string(),
    }
}

/// The archive's checkpoint records, numbered in this store's creation
/// order (each store has its own).
fn numbered(
    w: &mut crate::index::Writer<'_>,
    m: &Manifest,
) -> Result<Vec<(String, CheckpointRecord)>, crate::index::IndexError> {
    m.checkpoints
        .iter()
        .map(|c| {
            let seq = w.next_seq("checkpoint")?;
            Ok((
                c.id.clone(),
                CheckpointRecord {
                    seq,
                    ..c.record.clone()
                },
            ))
        })
        .collect()
}

fn stream_name(m: &Option<Manifest>, index: usize) -> String {
    m.as_ref()
        .and_then(|m| m.streams.get(index))
        .map(|s| s.tree.to_string())
        .unwrap_or_default()
}

/// A `btrfs receive` into `dir`, confined to it, ending at the stream's
/// end.
fn receive(dir: &Path) -> Result<Receiving> {
    let mut child = btrfs_cli()
        .args(["receive", "-q", "-e", "--chroot"])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            StoreError::BadArchive(format!("cannot run btrfs receive (btrfs-progs): {e}"))
        })?;
    let stdin = child.stdin.take();
    // Room for a whole piece: its request is answered while `btrfs
    // receive` still applies it.
    if let Some(i) = &stdin {
        let _ = rustix::pipe::fcntl_setpipe_size(i, PIPE);
    }
    Ok(Receiving { child, stdin })
}

/// Ends a receive: empty when it succeeded, else what it said.
fn finish_receive(mut rx: Receiving) -> String {
    drop(rx.stdin.take());
    let mut err = String::new();
    if let Some(mut e) = rx.child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    match rx.child.wait() {
        Ok(st) if st.success() => String::new(),
        Ok(st) => format!("{st}: {}", err.trim()),
        Err(e) => e.to_string(),
    }
}

/// Checks what receive made of stream `tree`: the trees the manifest
/// lists so far and no other, this one read-only with the sender's `uuid`
/// as its received UUID, and a snapshot of the tree whose own UUID is
/// `parent` (zero: made whole). Answers its own UUID here.
fn check_received(
    staging: &Path,
    done: &[StreamInfo],
    tree: &Tree,
    uuid: &[u8; 16],
    parent: [u8; 16],
) -> Result<[u8; 16]> {
    let names = |dir: &Path| -> Result<HashSet<String>> {
        let mut found = HashSet::new();
        for e in std::fs::read_dir(dir).map_err(|e| StoreError::io("read", dir, e))? {
            let e = e.map_err(|e| StoreError::io("read", dir, e))?;
            found.insert(e.file_name().to_string_lossy().into_owned());
        }
        Ok(found)
    };
    let mut want: HashSet<String> = done
        .iter()
        .filter_map(|s| match &s.tree {
            Tree::Checkpoint(c) => Some(c.clone()),
            Tree::Current => None,
        })
        .collect();
    let mut top: HashSet<String> = ["checkpoints".to_string()].into();
    if done.iter().any(|s| s.tree == Tree::Current) {
        top.insert(CURRENT.to_string());
    }
    for (dir, want) in [
        (staging.join("checkpoints"), &mut want),
        (staging.to_path_buf(), &mut top),
    ] {
        let found = names(&dir)?;
        if found != *want {
            let extra: Vec<_> = found.difference(want).cloned().collect();
            let missing: Vec<_> = want.difference(&found).cloned().collect();
            return Err(StoreError::BadArchive(format!(
                "after the stream of {tree} the received trees are not those the manifest lists (unexpected: {extra:?}, missing: {missing:?})"
            )));
        }
    }
    let p = match tree {
        Tree::Checkpoint(c) => staging.join("checkpoints").join(c),
        Tree::Current => staging.join(CURRENT),
    };
    let info = btrfs::root_info(&p)
        .map_err(|_| StoreError::BadArchive(format!("{tree} was not received as a subvolume")))?;
    let dir = std::fs::File::open(&p).map_err(|e| StoreError::io("open", &p, e))?;
    if info.received_uuid != *uuid || !btrfs::is_read_only(&dir, &p)? {
        return Err(StoreError::BadArchive(format!(
            "{tree} was not received whole (no received UUID, or still writable)"
        )));
    }
    if info.parent_uuid != parent {
        return Err(StoreError::BadArchive(format!(
            "{tree} was received from another tree than the one the archive names"
        )));
    }
    Ok(info.uuid)
}

/// Refuses a manifest that does not describe one session: ids that are
/// not ids, streams that are not one per checkpoint plus `current/` last,
/// parents that do not come first, links to checkpoints it does not hold.
fn check_manifest(st: &Store, a: &str, s: Option<&str>, m: &Manifest) -> Result<()> {
    let bad = |why: String| Err(StoreError::BadArchive(why));
    for (what, id) in [("agent", &m.agent), ("session", &m.session)] {
        if let Err(e) = validate_id(what, id) {
            return bad(format!("its {what} id: {e}"));
        }
    }
    if m.checkpoints.len() > MAX_ITEMS || m.turns.len() > MAX_ITEMS {
        return bad(format!("more than {MAX_ITEMS} checkpoints or turns"));
    }
    let mut ids = HashMap::new();
    for c in &m.checkpoints {
        if let Err(e) = validate_id("checkpoint_id", &c.id) {
            return bad(format!("a checkpoint id: {e}"));
        }
        if c.record.label.as_ref().is_some_and(|l| l.len() > MAX_LABEL) {
            return bad(format!("checkpoint {}'s label is too long", c.id));
        }
        if ids.insert(c.id.as_str(), &c.record).is_some() {
            return bad(format!("checkpoint {} is listed twice", c.id));
        }
    }
    for (t, _) in &m.turns {
        if let Err(e) = validate_id("turn_id", t) {
            return bad(format!("a turn id: {e}"));
        }
    }
    let base = m.since.as_ref().map(|b| b.id.as_str());
    let session = s.unwrap_or(&m.session);
    st.room_for_checkpoints(a, session, m.checkpoints.len())?;
    // An archive made `since` a checkpoint may link to the session's own.
    let theirs: HashSet<String> = if base.is_some() {
        check_base(st, a, session, m)?;
        st.index
            .checkpoints(a, session)?
            .into_iter()
            .map(|(c, _)| c)
            .collect()
    } else {
        HashSet::new()
    };
    let known = |c: &str| ids.contains_key(c) || base == Some(c) || theirs.contains(c);
    for c in &m.checkpoints {
        if let Some(p) = &c.record.parent {
            if !known(p) {
                return bad(format!("checkpoint {}'s parent {p} is not in it", c.id));
            }
        }
    }
    if let Some(h) = &m.head {
        if !known(h) {
            return bad(format!("its head {h} is not in it"));
        }
    }
    let want = m.checkpoints.len() + 1;
    if m.streams.len() != want || m.streams.last().map(|x| &x.tree) != Some(&Tree::Current) {
        return bad(format!(
            "{} streams where one per checkpoint and current/ last ({want}) are needed",
            m.streams.len()
        ));
    }
    let mut sent = HashSet::new();
    for (i, x) in m.streams.iter().enumerate() {
        if let Tree::Checkpoint(c) = &x.tree {
            if m.checkpoints.get(i).map(|k| &k.id) != Some(c) {
                return bad(format!("stream {i} is not the checkpoint listed there"));
            }
        }
        if let Some(p) = &x.parent {
            if !sent.contains(p.as_str()) && base != Some(p.as_str()) {
                return bad(format!(
                    "stream {i} ({}) is relative to {p}, which does not come before it",
                    x.tree
                ));
            }
        }
        if let Tree::Checkpoint(c) = &x.tree {
            sent.insert(c.as_str());
        }
    }
    if base.is_none() && st.index.session(a, session)?.is_some() {
        return Err(StoreError::Exists(format!("session {a}/{session}")));
    }
    Ok(())
}

/// The trees an archive received into `staging`, each with how an error
/// names it: its `current/`, then its checkpoints.
fn archive_trees(staging: &std::path::Path, m: &Manifest) -> Vec<(String, std::path::PathBuf)> {
    std::iter::once(("the archive's current/".to_string(), staging.join(CURRENT)))
        .chain(m.checkpoints.iter().map(|c| {
            (
                format!("the archive's checkpoint {}", c.id),
                staging.join("checkpoints").join(&c.id),
            )
        }))
        .collect()
}
