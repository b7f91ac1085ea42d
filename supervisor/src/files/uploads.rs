//! Uploads: a file sent in chunks (`fs.write` with `upload`) is written to
//! `.allox-upload-<id>-<name>` beside its target and renamed over it with
//! the chunk marked `commit`, so the target has its old content until the
//! new one is whole. The partial file is the sandbox user's, mode 0600,
//! before it has a name ([`super::fresh`]); the commit gives it the
//! target's permission bits (never setuid, setgid or sticky).
//!
//! Each upload under way is recorded in the store's `state/uploads/` and
//! counted against its session's budget (`--uploads-per-session`); one
//! that gets no chunk for `--upload-idle-s` is abandoned — its partial file
//! and record removed ([`Supervisor::abandon_idle_uploads`], on a timer).
//! The daemon's start removes what an earlier one left
//! ([`Supervisor::sweep_uploads`]).

use super::fresh::{self, Fresh};
use super::path::{parent_of, Rel};
use super::Files;
use super::{pwrite_all, FilesError};
use allox_protocol::{CopiedBy, FsScope, FsWritten};
use rustix::fd::OwnedFd;
use rustix::fs::{AtFlags, Mode, OFlags};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The budgets of uploads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadLimits {
    /// `--uploads-per-session`: uploads under way in one session at once.
    pub per_session: usize,
    /// `--upload-idle-s`: how long an upload may go without a chunk before
    /// it is abandoned.
    pub idle: Duration,
}

impl Default for UploadLimits {
    fn default() -> Self {
        UploadLimits {
            per_session: 16,
            idle: Duration::from_secs(300),
        }
    }
}

/// The uploads under way in this daemon, by `agent/session/id`. Chunks
/// after the first may come in any order (a client sends several at once);
/// the commit checks that all came.
#[derive(Debug, Default)]
pub struct Live {
    limits: UploadLimits,
    under_way: std::sync::Mutex<HashMap<String, UnderWay>>,
}

#[derive(Debug)]
struct UnderWay {
    /// Bytes received.
    received: u64,
    /// When its last chunk came.
    touched: Instant,
    id: String,
    record: Record,
    /// The session whose budget it counts against, when not its target's.
    charged: Option<String>,
}

impl Live {
    pub fn new(limits: UploadLimits) -> Live {
        Live {
            limits,
            under_way: Default::default(),
        }
    }

    pub fn limits(&self) -> UploadLimits {
        self.limits
    }

    /// The partial files of the uploads under way into session `a/s`'s
    /// own tree, relative to it: what its snapshots leave out.
    pub fn partials_in(&self, a: &str, s: &str) -> Vec<String> {
        self.lock()
            .values()
            .filter(|u| {
                u.record.scope == FsScope::Session
                    && u.record.within.is_none()
                    && u.record.agent == a
                    && u.record.session == s
            })
            .map(|u| u.record.partial.clone())
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, UnderWay>> {
        self.under_way.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn idle(&self, u: &UnderWay, now: Instant) -> bool {
        now.saturating_duration_since(u.touched) >= self.limits.idle
    }

    /// Begins `key` (again, from nothing, if it was under way): refused
    /// when its session has its budget of uploads under way (those idle
    /// past the limit are abandoned already, and not counted).
    fn begin(&self, key: &str, c: &Chunk<'_>, record: Record) -> Result<(), FilesError> {
        let now = Instant::now();
        let mut live = self.lock();
        // One that ends in the request that begins it is never under way
        // between requests: it is not held to the budget (cut uploads of
        // other clients refused a write of a few bytes).
        if !live.contains_key(key) && !c.commit {
            // Counted against the session that pays: the target's own
            // (the host's and its own uploads), or the caller's for a
            // write from another session (they took the target's places).
            let target = format!("{}/{}/", c.agent, c.session);
            let pays = |k: &str, u: &UnderWay| match c.charged {
                Some(by) => u.charged.as_deref() == Some(by),
                None => u.charged.is_none() && k.starts_with(&target),
            };
            let n = live
                .iter()
                .filter(|(k, u)| pays(k, u) && !self.idle(u, now))
                .count();
            if n >= self.limits.per_session {
                let payer = c
                    .charged
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{}/{}", c.agent, c.session));
                return Err(FilesError::UploadBudget {
                    id: c.id.to_string(),
                    why: format!(
                        "session {payer} has {n} uploads under way, its budget (--uploads-per-session {}): commit one, or leave one without a chunk for {} s (--upload-idle-s), and begin again",
                        self.limits.per_session,
                        self.limits.idle.as_secs()
                    ),
                });
            }
        }
        live.insert(
            key.to_string(),
            UnderWay {
                received: 0,
                touched: now,
                id: c.id.to_string(),
                record,
                charged: c.charged.map(str::to_string),
            },
        );
        Ok(())
    }

    /// Marks `key` as having a chunk now; false if it is not under way.
    fn touch(&self, key: &str) -> bool {
        match self.lock().get_mut(key) {
            Some(u) => {
                u.touched = Instant::now();
                true
            }
            None => false,
        }
    }

    /// Adds `n` bytes to what `key` received; the total, if it is still
    /// under way.
    fn add(&self, key: &str, n: u64) -> Option<u64> {
        self.lock().get_mut(key).map(|u| {
            u.received += n;
            u.received
        })
    }

    fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    /// The partial file (as recorded) of upload `key`, if it is under way.
    fn partial_of(&self, key: &str) -> Option<String> {
        self.lock().get(key).map(|u| u.record.partial.clone())
    }

    /// Takes the uploads idle past the limit at `now` off the list.
    fn take_idle(&self, now: Instant) -> Vec<UnderWay> {
        let mut live = self.lock();
        let idle: Vec<String> = live
            .iter()
            .filter(|(_, u)| self.idle(u, now))
            .map(|(k, _)| k.clone())
            .collect();
        idle.iter().filter_map(|k| live.remove(k)).collect()
    }

    /// Takes the uploads `which` names (by key and scope) off the list.
    fn take(&self, which: impl Fn(&str, &UnderWay) -> bool) -> Vec<UnderWay> {
        let mut live = self.lock();
        let keys: Vec<String> = live
            .iter()
            .filter(|(k, u)| which(k, u))
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter().filter_map(|k| live.remove(k)).collect()
    }

    /// How many uploads are under way (idle ones included until swept).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One chunk, and where it goes.
pub struct Chunk<'a> {
    pub agent: &'a str,
    pub session: &'a str,
    pub scope: FsScope,
    /// The directory of the scope the paths are below (a share's).
    pub within: Option<&'a str>,
    pub id: &'a str,
    pub rel: &'a Rel<'a>,
    pub parent: &'a OwnedFd,
    pub name: &'a str,
    pub offset: u64,
    pub data: Data<'a>,
    pub commit: bool,
    pub create: bool,
    pub owner: Option<(u32, u32)>,
    /// Called just before the upload replaces its target.
    pub before_commit: &'a dyn Fn(),
    pub live: &'a Live,
    /// The session (`agent/session`) an upload begun by this chunk counts
    /// against, when not its target's (a write from another session).
    pub charged: Option<&'a str>,
    /// Whether a passed file's extents may be shared with the session's
    /// (not under a session quota, which a clone would pass).
    pub share_extents: bool,
}

/// A chunk's bytes: in the request, or in a file the client passed.
pub enum Data<'a> {
    Bytes(&'a [u8]),
    /// `length` bytes (`None`: to its end) of the passed file, from the
    /// chunk's offset.
    Passed {
        fd: &'a OwnedFd,
        length: Option<u64>,
    },
}

/// What `state/uploads/` keeps of an upload under way.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    agent: String,
    session: String,
    scope: FsScope,
    /// The directory of the scope `partial` is below (a share's scope).
    #[serde(default)]
    within: Option<String>,
    /// The file beside the target, relative to the scope's root (or to
    /// `within`).
    partial: String,
}

fn partial_name(id: &str, name: &str) -> String {
    format!(
        ".allox-upload-{id}-{}",
        name.chars().take(100).collect::<String>()
    )
}

/// The partial file of upload `id` of session `a/s` at `name`: in the
/// agent's `shared/`, which every session of the agent writes, its name
/// also carries the session's (two sessions' uploads under one id and
/// path shared one partial file, and a commit installed a mix of both).
fn partial_of(scope: FsScope, (a, s): (&str, &str), id: &str, name: &str) -> String {
    match scope {
        FsScope::Session => partial_name(id, name),
        FsScope::Shared => {
            use sha2::Digest;
            let tag: String = sha2::Sha256::digest(format!("{a}/{s}").as_bytes())[..4]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            partial_name(&format!("{id}-{tag}"), name)
        }
    }
}

/// The partial file's path as the record keeps it, for a request at `rel`.
fn recorded_partial(rel: &Rel<'_>, partial: &str) -> String {
    match rel.split() {
        Some((p, _)) if p != "." => format!("{p}/{partial}"),
        _ => partial.to_string(),
    }
}

fn record_path(dir: &Path, agent: &str, session: &str, id: &str) -> std::path::PathBuf {
    // Ids have no `~`: the three never run together.
    dir.join(format!("{agent}~{session}~{id}"))
}

fn upload_err(id: &str, why: impl Into<String>) -> FilesError {
    FilesError::Upload {
        id: id.to_string(),
        why: why.into(),
    }
}

/// Writes one chunk; with `commit`, the upload replaces its target.
/// Returns how a passed chunk's bytes moved too.
pub fn chunk(dir: &Path, c: &Chunk<'_>) -> Result<(FsWritten, Option<CopiedBy>), FilesError> {
    allox_protocol::validate_id("upload", c.id).map_err(|e| upload_err(c.id, e.to_string()))?;
    let partial = partial_of(c.scope, (c.agent, c.session), c.id, c.name);
    let shown = c.rel.shown;
    let key = format!("{}/{}/{}", c.agent, c.session, c.id);
    // An upload under way is of one path: a chunk, a commit or a new
    // begin under its id that names another is refused (a begin under the
    // id with another path dropped the first's record and left its
    // partial file for ever, and a commit counted bytes sent to another).
    if let Some(of) = c.live.partial_of(&key) {
        if of != recorded_partial(c.rel, &partial) {
            return Err(upload_err(
                c.id,
                "it is under way for another file: send its chunks there, abort it there, or use another id",
            ));
        }
    }
    let record = record_path(dir, c.agent, c.session, c.id);
    let target = rustix::fs::statat(c.parent, c.name, AtFlags::SYMLINK_NOFOLLOW);
    let gone = || {
        upload_err(
            c.id,
            format!(
                "nothing is under way for {shown:?} under this id (never begun, abandoned after {} s without a chunk (--upload-idle-s), or taken by a rollback or a restart): start again at offset 0",
                c.live.limits().idle.as_secs()
            ),
        )
    };
    let fd = if c.offset == 0 {
        match &target {
            Err(rustix::io::Errno::NOENT) if !c.create => {
                return Err(FilesError::NotFound { path: shown.into() })
            }
            Ok(st) if super::kind_of(st.st_mode) == allox_protocol::FsKind::Dir => {
                return Err(FilesError::NotA {
                    path: shown.into(),
                    what: "a file",
                })
            }
            _ => {}
        }
        let rec = Record {
            agent: c.agent.into(),
            session: c.session.into(),
            scope: c.scope,
            within: c.within.map(str::to_string),
            partial: recorded_partial(c.rel, &partial),
        };
        c.live.begin(&key, c, rec.clone())?;
        let begun = begin(dir, &record, &rec, c, &partial);
        if begun.is_err() {
            c.live.forget(&key);
            let _ = std::fs::remove_file(&record);
        }
        begun?
    } else {
        if !c.live.touch(&key) {
            return Err(gone());
        }
        let fd = rustix::fs::openat(
            c.parent,
            partial.as_str(),
            OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::NOENT => gone(),
            e => FilesError::from_errno("write", shown, e),
        })?;
        // Still the file this upload made: the sandbox user's own, and
        // one name (not something else moved or linked to its name).
        let st = rustix::fs::fstat(&fd).map_err(|e| FilesError::from_errno("stat", shown, e))?;
        if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_file()
            || st.st_nlink != 1
            || st.st_uid != fresh::expected_uid(c.owner)
        {
            return Err(upload_err(
                c.id,
                format!("its partial file {partial:?} was changed by something else: start again at offset 0"),
            ));
        }
        fd
    };
    let written = match c.data {
        Data::Bytes(data) => {
            pwrite_all(&fd, data, c.offset, shown).map(|()| (data.len() as u64, None))
        }
        Data::Passed { fd: src, length } => {
            super::local::copy_range(src, &fd, c.offset, length, shown, c.share_extents)
                .map(|(n, by)| (n, Some(by)))
        }
    };
    let (n, by) = match written {
        Ok(w) => w,
        // No room: the upload goes, with its partial file, which held the
        // target's quota (a writer that does not abort it, a sandbox's
        // `allox share write`, left the target session full until the
        // upload's idle timeout).
        Err(FilesError::NoSpace { path }) => {
            c.live.forget(&key);
            let _ = rustix::fs::unlinkat(c.parent, partial.as_str(), AtFlags::empty());
            let _ = std::fs::remove_file(&record);
            return Err(FilesError::NoSpaceUpload {
                path,
                id: c.id.to_string(),
            });
        }
        Err(e) => return Err(e),
    };
    let size = c.offset + n;
    let received = c.live.add(&key, n).ok_or_else(gone)?;
    if c.commit {
        c.live.forget(&key);
        if received != size {
            let _ = rustix::fs::unlinkat(c.parent, partial.as_str(), AtFlags::empty());
            let _ = std::fs::remove_file(&record);
            return Err(upload_err(
                c.id,
                format!(
                    "{received} bytes came, but the upload ends at {size}: chunks were lost or sent twice; start again"
                ),
            ));
        }
        let mode = match &target {
            Ok(st) => super::kept_mode(st),
            Err(_) => super::NEW_FILE_MODE,
        };
        fresh::give(&fd, mode, c.owner, shown)?;
        (c.before_commit)();
        rustix::fs::renameat(c.parent, partial.as_str(), c.parent, c.name)
            .map_err(|e| FilesError::from_errno("replace", shown, e))?;
        let _ = std::fs::remove_file(&record);
    }
    Ok((
        FsWritten {
            path: c.rel.joined(),
            size,
            committed: c.commit,
        },
        by,
    ))
}

/// Drops upload `id` of session `a/s` (`fs.write` with `abort`): its
/// partial file beside `name` and its record go, and it no longer counts
/// against the session's budget. Nothing under way under that id is no
/// error (an abort sent twice, or after the upload was abandoned).
pub fn abort(
    dir: &Path,
    live: &Live,
    (agent, session, id, scope): (&str, &str, &str, FsScope),
    rel: &Rel<'_>,
    parent: &OwnedFd,
    name: &str,
) -> Result<FsWritten, FilesError> {
    allox_protocol::validate_id("upload", id).map_err(|e| upload_err(id, e.to_string()))?;
    let key = format!("{agent}/{session}/{id}");
    let partial = partial_of(scope, (agent, session), id, name);
    // Of its own path only (an abort naming another left the partial file
    // with no record, for ever).
    if let Some(of) = live.partial_of(&key) {
        if of != recorded_partial(rel, &partial) {
            return Err(upload_err(
                id,
                "it is under way for another file: abort it there",
            ));
        }
    }
    live.forget(&key);
    match rustix::fs::unlinkat(parent, partial.as_str(), AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(FilesError::from_errno("remove", rel.shown, e)),
    }
    let _ = std::fs::remove_file(record_path(dir, agent, session, id));
    Ok(FsWritten {
        path: rel.joined(),
        size: 0,
        committed: false,
    })
}

/// The first chunk's work: the upload recorded, then its partial file made
/// (afresh, if this id was begun before).
fn begin(
    dir: &Path,
    record: &Path,
    rec: &Record,
    c: &Chunk<'_>,
    partial: &str,
) -> Result<OwnedFd, FilesError> {
    let shown = c.rel.shown;
    // Recorded first: a crash from here on leaves nothing unknown.
    // The root's alone, as every state directory (it was the umask's).
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| FilesError::Io {
            op: "record the upload in",
            path: dir.display().to_string(),
            source,
        })?;
    std::fs::write(record, serde_json::to_vec(rec).unwrap_or_default()).map_err(|source| {
        let _ = std::fs::remove_file(record);
        // A full disk is the file's want of room, as its own write's
        // would be (`unavailable`), not the daemon's fault.
        match source.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => FilesError::NoSpace {
                path: shown.to_string(),
            },
            _ => FilesError::Io {
                op: "record the upload in",
                path: record.display().to_string(),
                source,
            },
        }
    })?;
    let _ = rustix::fs::unlinkat(c.parent, partial, AtFlags::empty());
    let mut f = Fresh::make(c.parent, partial, 0o600, c.owner, shown)?;
    f.link(c.parent, partial, shown).map_err(|e| match e {
        FilesError::Exists { .. } => upload_err(
            c.id,
            format!("something took the name of its partial file {partial:?}: start again"),
        ),
        e => e,
    })?;
    Ok(f.fd)
}

impl Files<'_> {
    /// At start: removes what uploads left unfinished (their partial
    /// files, reached below their scope's root only) and their records.
    /// Returns how many were swept.
    pub fn sweep_uploads(&self) -> usize {
        let dir = self.uploads_dir();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return 0;
        };
        let mut swept = 0;
        for e in entries.flatten() {
            let rec = std::fs::read(e.path())
                .ok()
                .and_then(|b| serde_json::from_slice::<Record>(&b).ok());
            if rec.is_some_and(|r| self.remove_partial(&r)) {
                swept += 1;
            }
            let _ = std::fs::remove_file(e.path());
        }
        if swept > 0 {
            tracing::info!(swept, "removed what unfinished uploads left");
        }
        swept
    }

    /// Abandons the uploads that got no chunk for `--upload-idle-s`: their
    /// partial files and records removed. Returns how many. Blocking.
    pub fn abandon_idle_uploads(&self) -> usize {
        let idle = self.uploads.take_idle(Instant::now());
        let dir = self.uploads_dir();
        for u in &idle {
            self.remove_partial(&u.record);
            let _ =
                std::fs::remove_file(record_path(&dir, &u.record.agent, &u.record.session, &u.id));
        }
        if !idle.is_empty() {
            tracing::info!(
                abandoned = idle.len(),
                idle_s = self.uploads.limits().idle.as_secs(),
                "removed uploads left without a chunk"
            );
        }
        idle.len()
    }

    /// Drops the uploads under way in session `a/s` (every session of
    /// agent `a` with `None`) that a rollback or a delete took: with
    /// `rolled_back`, those in the session's own tree only (their partial
    /// files went with the old tree; the agent's `shared/` stays). Their
    /// records go, and so do partial files still in reach; they no longer
    /// count against the session's budget (they held it until they were
    /// idle five minutes, though no client could send them a chunk).
    pub fn drop_uploads(&self, a: &str, s: Option<&str>, rolled_back: bool) -> usize {
        let prefix = match s {
            Some(s) => format!("{a}/{s}/"),
            None => format!("{a}/"),
        };
        // Those into its tree, and (at a delete) those it began in other
        // sessions' trees through sharing, which were charged to it.
        let taken = self.uploads.take(|key, u| {
            let into =
                key.starts_with(&prefix) && !(rolled_back && u.record.scope == FsScope::Shared);
            let by = !rolled_back
                && u.charged
                    .as_deref()
                    .is_some_and(|c| format!("{c}/").starts_with(&prefix));
            into || by
        });
        let dir = self.uploads_dir();
        for u in &taken {
            self.remove_partial(&u.record);
            let _ =
                std::fs::remove_file(record_path(&dir, &u.record.agent, &u.record.session, &u.id));
        }
        taken.len()
    }

    /// Removes an upload's partial file, reached below its scope's root;
    /// whether there was one.
    fn remove_partial(&self, r: &Record) -> bool {
        self.fs_root(
            &r.agent,
            &r.session,
            r.scope,
            None,
            &match &r.within {
                Some(d) => super::ResolvedBelow::ShareDir(d),
                None => super::ResolvedBelow::ScopeRoot,
            },
        )
        .ok()
        .and_then(|root| {
            let rel = Rel::parse(&r.partial).ok()?;
            let (parent, name) = parent_of(&root.fd, &rel).ok()?;
            name.starts_with(".allox-upload-")
                .then(|| rustix::fs::unlinkat(&parent, name, AtFlags::empty()).is_ok())
        }) == Some(true)
    }
}
