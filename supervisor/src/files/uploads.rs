//! Uploads: a file sent in chunks (`fs.write` with `upload`) is written to
//! `.allox-upload-<id>-<name>` beside its target and renamed over it with
//! the chunk marked `commit`, so the target has its old content until the
//! new one is whole. Each upload under way is recorded in the store's
//! `state/uploads/`; the daemon's start removes what unfinished ones left
//! ([`Supervisor::sweep_uploads`]).

use super::path::{parent_of, Rel};
use super::{chown_at, pwrite_all, FilesError};
use crate::supervisor::Supervisor;
use allox_protocol::{FsScope, FsWritten};
use rustix::fd::OwnedFd;
use rustix::fs::{AtFlags, Mode, OFlags};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The uploads under way in this daemon: bytes received, by
/// `agent/session/id`. Chunks after the first may come in any order (a
/// client sends several at once); the commit checks that all came.
#[derive(Debug, Default)]
pub struct Live(std::sync::Mutex<std::collections::HashMap<String, u64>>);

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
    pub data: &'a [u8],
    pub commit: bool,
    pub create: bool,
    pub owner: Option<(u32, u32)>,
    /// Called just before the upload replaces its target.
    pub before_commit: &'a dyn Fn(),
    pub live: &'a Live,
}

/// What `state/uploads/` keeps of an upload under way.
#[derive(Serialize, Deserialize)]
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

fn record_path(dir: &Path, c: &Chunk<'_>) -> std::path::PathBuf {
    // Ids have no `~`: the three never run together.
    dir.join(format!("{}~{}~{}", c.agent, c.session, c.id))
}

fn upload_err(id: &str, why: impl Into<String>) -> FilesError {
    FilesError::Upload {
        id: id.to_string(),
        why: why.into(),
    }
}

/// Writes one chunk; with `commit`, the upload replaces its target.
pub fn chunk(dir: &Path, c: &Chunk<'_>) -> Result<FsWritten, FilesError> {
    allox_protocol::validate_id("upload", c.id).map_err(|e| upload_err(c.id, e.to_string()))?;
    let partial = partial_name(c.id, c.name);
    let shown = c.rel.shown;
    let target = rustix::fs::statat(c.parent, c.name, AtFlags::SYMLINK_NOFOLLOW);
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
        // Recorded first: a crash from here on leaves nothing unknown.
        let rec = Record {
            agent: c.agent.into(),
            session: c.session.into(),
            scope: c.scope,
            within: c.within.map(str::to_string),
            partial: match c.rel.split() {
                Some((p, _)) if p != "." => format!("{p}/{partial}"),
                _ => partial.clone(),
            },
        };
        std::fs::create_dir_all(dir).map_err(|source| FilesError::Io {
            op: "record the upload in",
            path: dir.display().to_string(),
            source,
        })?;
        let rp = record_path(dir, c);
        std::fs::write(&rp, serde_json::to_vec(&rec).unwrap_or_default()).map_err(|source| {
            FilesError::Io {
                op: "record the upload in",
                path: rp.display().to_string(),
                source,
            }
        })?;
        rustix::fs::openat(
            c.parent,
            partial.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(|e| FilesError::from_errno("write", shown, e))?
    } else {
        let fd = rustix::fs::openat(
            c.parent,
            partial.as_str(),
            OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::NOENT => upload_err(
                c.id,
                format!(
                    "nothing was begun for {shown:?} under this id (or a rollback or a restart took it): start again at offset 0"
                ),
            ),
            e => FilesError::from_errno("write", shown, e),
        })?;
        fd
    };
    pwrite_all(&fd, c.data, c.offset, shown)?;
    let size = c.offset + c.data.len() as u64;
    let key = format!("{}/{}/{}", c.agent, c.session, c.id);
    let received = {
        let mut live = c.live.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = live.entry(key.clone()).or_insert(0);
        if c.offset == 0 {
            *n = 0;
        }
        *n += c.data.len() as u64;
        *n
    };
    if c.commit {
        c.live
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        if received != size {
            let _ = rustix::fs::unlinkat(c.parent, partial.as_str(), AtFlags::empty());
            let _ = std::fs::remove_file(record_path(dir, c));
            return Err(upload_err(
                c.id,
                format!(
                    "{received} bytes came, but the upload ends at {size}: chunks were lost or sent twice; start again"
                ),
            ));
        }
        if let Ok(st) = &target {
            let _ = rustix::fs::fchmod(&fd, Mode::from_raw_mode(st.st_mode & 0o7777));
        }
        chown_at(c.parent, &partial, c.owner, shown)?;
        (c.before_commit)();
        rustix::fs::renameat(c.parent, partial.as_str(), c.parent, c.name)
            .map_err(|e| FilesError::from_errno("replace", shown, e))?;
        let _ = std::fs::remove_file(record_path(dir, c));
    }
    Ok(FsWritten {
        path: c.rel.joined(),
        size,
        committed: c.commit,
    })
}

impl Supervisor {
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
            if let Some(r) = rec {
                let gone = self
                    .fs_root(
                        &r.agent,
                        &r.session,
                        r.scope,
                        None,
                        &match &r.within {
                            Some(d) => super::Within::Dir(d),
                            None => super::Within::Scope,
                        },
                    )
                    .ok()
                    .and_then(|root| {
                        let rel = Rel::parse(&r.partial).ok()?;
                        let (parent, name) = parent_of(&root.fd, &rel).ok()?;
                        name.starts_with(".allox-upload-")
                            .then(|| rustix::fs::unlinkat(&parent, name, AtFlags::empty()).is_ok())
                    });
                if gone == Some(true) {
                    swept += 1;
                }
            }
            let _ = std::fs::remove_file(e.path());
        }
        if swept > 0 {
            tracing::info!(swept, "removed what unfinished uploads left");
        }
        swept
    }
}
