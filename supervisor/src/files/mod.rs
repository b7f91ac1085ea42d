//! The file API (`fs.*`): a session's `current/`, its agent's `shared/`, or
//! a checkpoint's tree (read-only), read and changed by the supervisor
//! itself, without a process in the sandbox. docs/files.md describes it.
//!
//! Every path is resolved below the scope's root ([`path`]); what is made
//! belongs to the sandbox's user from before it has a name, never with a
//! setuid, setgid or sticky bit ([`fresh`]); a whole-file write and an upload go to a
//! file beside the target that is renamed into place when complete
//! ([`uploads`]); changes hold the session's writer guard, so they never
//! interleave with a rollback or a delete of it.

pub mod fresh;
mod local;
pub mod path;
pub mod uploads;
pub mod watch;

use crate::runs::{RunError, Runs};
use allox_protocol::{
    Bytes, Deleted, ErrorCode, FsCopied, FsData, FsDownloadLocal, FsEntry, FsKind, FsList,
    FsListing, FsMkdir, FsMove, FsRead, FsRemove, FsScope, FsUploadLocal, FsWrite, FsWritten,
    Request, Response, FS_CHUNK,
};
use fresh::Fresh;
use path::{open_beneath, parent_of, Rel};
use rustix::fd::OwnedFd;
use rustix::fs::{AtFlags, Mode, OFlags};
use std::path::Path;
use std::sync::Arc;
use thiserror::Error;

/// The file API over one store: what a file request needs of the
/// supervisor, lent for the request.
pub struct Files<'a> {
    pub store: &'a allox_store::Store,
    /// Process support; `None` when the daemon runs without it.
    pub runs: Option<&'a Arc<Runs>>,
    /// The uploads under way.
    pub uploads: &'a uploads::Live,
    /// The watches open.
    pub watches: &'a watch::Watches,
    /// The session an upload begun now is charged to, when not its
    /// target's (a write from another session, through sharing).
    pub charged_to: Option<&'a str>,
    /// Each session rolled back (agent, session), for `fs.watch`.
    pub rollbacks: &'a tokio::sync::broadcast::Sender<(String, String)>,
}

/// Most entries in one `fs.list` answer.
pub const MAX_ENTRIES: usize = 10_000;
/// Deepest `fs.list`.
pub const MAX_DEPTH: u32 = 64;

#[derive(Debug, Error)]
pub enum FilesError {
    #[error(transparent)]
    Store(#[from] allox_store::StoreError),
    #[error(transparent)]
    Runs(#[from] RunError),
    #[error(
        "follow streams events, which only the binary protocol carries; page with cursor instead"
    )]
    FollowNeedsStream,
    #[error("subscriber gone")]
    SubscriberGone,
    #[error("{action} is not a file request")]
    NotFiles { action: &'static str },
    #[error("path {path:?} {why}")]
    BadPath { path: String, why: &'static str },
    #[error(
        "path {path:?} leads outside the {scope} (a symbolic link out of it, or a magic link)"
    )]
    Outside { path: String, scope: &'static str },
    #[error("{path:?}: no such file or directory")]
    NotFound { path: String },
    #[error("{path:?} exists")]
    Exists { path: String },
    #[error("directory {path:?} is not empty (remove it with recursive, or move it elsewhere)")]
    NotEmpty { path: String },
    #[error("{path:?} is not {what}")]
    NotA { path: String, what: &'static str },
    #[error("the share scope {scope:?} of the session {why}")]
    BadScope { scope: String, why: &'static str },
    #[error("session {session} has a live run: its files are written only while none runs")]
    Busy { session: String },
    #[error("checkpoints are of sessions: the shared scope has none")]
    SharedCheckpoint,
    #[error("upload {id}: {why}")]
    Upload { id: String, why: String },
    #[error("upload {id}: {why}")]
    UploadBudget { id: String, why: String },
    #[error("fs.watch refused: {why}")]
    WatchBudget { why: String },
    #[error("the new content of {path:?} was moved away before it replaced the file (by something in the session): nothing was replaced")]
    Taken { path: String },
    #[error("no room left for {path:?} (the file system or the session's quota is full)")]
    NoSpace { path: String },
    #[error("no room left for {path:?} (the file system or the session's quota is full): upload {id} was dropped, with what it had written; begin it again once there is room")]
    NoSpaceUpload { path: String, id: String },
    #[error("{action} takes the file as a descriptor passed with the request (SCM_RIGHTS over the daemon's Unix socket), and none came: this connection cannot pass one (the gateway, the VM's control port); send the file with fs.write or read it with fs.read")]
    NoDescriptor { action: &'static str },
    #[error("the descriptor passed with the request cannot be used: {why}")]
    Descriptor { why: String },
    #[error("the client went away before the copy of {path:?} was done: it was dropped, and nothing was replaced")]
    ClientGone { path: String },
    #[error("cannot {op} {path:?}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl FilesError {
    /// An errno of `op` on `path`, as the client should read it.
    pub fn from_errno(op: &'static str, path: &str, e: rustix::io::Errno) -> FilesError {
        use rustix::io::Errno;
        let path = path.to_string();
        match e {
            Errno::NOENT => FilesError::NotFound { path },
            Errno::EXIST => FilesError::Exists { path },
            Errno::NOTEMPTY => FilesError::NotEmpty { path },
            Errno::NAMETOOLONG => FilesError::BadPath {
                path,
                why: "has a name longer than the file system takes (255 bytes)",
            },
            // A directory moved into itself (rename), an offset past what a
            // file can hold (write): what was asked cannot be.
            Errno::INVAL if op == "move" => FilesError::BadPath {
                path,
                why: "cannot be moved there (a directory into itself, or onto one of its parents)",
            },
            Errno::INVAL | Errno::FBIG if op == "write" => FilesError::BadPath {
                path,
                why:
                    "cannot be written at that offset (past the largest file the file system takes)",
            },
            Errno::XDEV | Errno::LOOP => FilesError::Outside {
                path,
                scope: "scope",
            },
            Errno::NOTDIR => FilesError::NotA {
                path,
                what: "a directory (or a part of it is not)",
            },
            Errno::ISDIR => FilesError::NotA {
                path,
                what: "a file",
            },
            Errno::NOSPC | Errno::DQUOT => FilesError::NoSpace { path },
            e => FilesError::Io {
                op,
                path,
                source: e.into(),
            },
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            FilesError::Store(e) => e.code(),
            FilesError::Runs(e) => e.code(),
            FilesError::FollowNeedsStream => ErrorCode::InvalidRequest,
            FilesError::SubscriberGone => ErrorCode::Unavailable,
            FilesError::NotFiles { .. } => ErrorCode::Internal,
            FilesError::BadPath { .. }
            | FilesError::Outside { .. }
            | FilesError::NotA { .. }
            | FilesError::BadScope { .. }
            | FilesError::SharedCheckpoint => ErrorCode::InvalidRequest,
            FilesError::Busy { .. } => ErrorCode::Conflict,
            FilesError::NotFound { .. } => ErrorCode::NotFound,
            FilesError::Exists { .. } | FilesError::NotEmpty { .. } | FilesError::Upload { .. } => {
                ErrorCode::Conflict
            }
            FilesError::Taken { .. } => ErrorCode::Conflict,
            FilesError::NoSpace { .. }
            | FilesError::NoSpaceUpload { .. }
            | FilesError::UploadBudget { .. }
            | FilesError::WatchBudget { .. } => ErrorCode::Unavailable,
            FilesError::NoDescriptor { .. } => ErrorCode::Unsupported,
            FilesError::Descriptor { .. } => ErrorCode::InvalidRequest,
            FilesError::ClientGone { .. } => ErrorCode::Unavailable,
            FilesError::Io { .. } => ErrorCode::Internal,
        }
    }
}

/// Where a request's paths are resolved.
enum ResolvedBelow<'a> {
    /// Its scope's root (the session's files, `shared/`, a checkpoint).
    ScopeRoot,
    /// A directory of the session's files (a share's scope).
    ShareDir(&'a str),
}

/// The root of a request's scope, open.
struct Root {
    fd: OwnedFd,
    scope: &'static str,
}

impl Root {
    /// `rel` below the root (`flags` as for `openat`).
    fn open(&self, rel: &Rel<'_>, flags: OFlags) -> Result<OwnedFd, FilesError> {
        open_beneath(&self.fd, rel.joined(), flags, rel.shown).map_err(|e| scoped(e, self.scope))
    }
}

impl Files<'_> {
    fn runs(&self) -> Result<&Arc<Runs>, RunError> {
        self.runs.ok_or(RunError::NoProcesses)
    }

    /// Answers a file request. Blocking.
    pub fn answer(&self, req: &Request) -> Result<Response, FilesError> {
        self.answer_in(req, &ResolvedBelow::ScopeRoot)
    }

    /// Answers a file request (`fs.stat`, `fs.list`, `fs.read`, `fs.write`
    /// of a session's own files) within the directory `dir` of the
    /// session's files, for another session (the share plugin): `dir` is
    /// reached without following any symbolic link and every path is
    /// resolved beneath it; the session's access guard is held throughout,
    /// so a rollback or delete of it and the request exclude each other
    /// (`conflict` while one works on it); a write also requires that the
    /// session has no live run. Returns the answer and the id of the tree
    /// it came from (the subvolume of `current/`, which a rollback
    /// replaces). Blocking.
    pub fn answer_within(&self, req: &Request, dir: &str) -> Result<(Response, u64), FilesError> {
        let (a, s) = match req {
            Request::FsStat(r) => (&r.agent_id, &r.session_id),
            Request::FsList(r) => (&r.agent_id, &r.session_id),
            Request::FsRead(r) => (&r.agent_id, &r.session_id),
            Request::FsWrite(r) => (&r.agent_id, &r.session_id),
            _ => {
                return Err(FilesError::NotFiles {
                    action: req.action(),
                })
            }
        };
        let runs = self.runs()?;
        let _access = runs.writing(a, s)?;
        if matches!(req, Request::FsWrite(_)) && runs.live(a, s) > 0 {
            return Err(FilesError::Busy {
                session: format!("{a}/{s}"),
            });
        }
        let current = self.store.layout().current(a, s);
        let tree = rustix::fs::open(
            &current,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FilesError::from_errno("open", ".", e))
        .and_then(|fd| {
            allox_store::btrfs::subvolume_id_of(&fd, &current).map_err(|e| FilesError::Io {
                op: "look up the tree of",
                path: ".".into(),
                source: std::io::Error::other(allox_protocol::error_chain(&e)),
            })
        })?;
        let out = self.answer_in(req, &ResolvedBelow::ShareDir(dir))?;
        Ok((out, tree))
    }

    fn answer_in(&self, req: &Request, w: &ResolvedBelow<'_>) -> Result<Response, FilesError> {
        Ok(match req {
            Request::FsStat(r) => {
                let root = self.fs_root(
                    &r.agent_id,
                    &r.session_id,
                    r.scope,
                    r.checkpoint_id.as_deref(),
                    w,
                )?;
                Response::FsEntry(stat(&root, &Rel::parse(&r.path)?)?)
            }
            Request::FsList(r) => Response::FsListing(self.fs_list(r, w)?),
            Request::FsRead(r) => Response::FsData(self.fs_read(r, w)?),
            Request::FsWrite(r) => Response::FsWritten(self.fs_write(r, w)?),
            Request::FsMkdir(r) => Response::FsEntry(self.fs_mkdir(r)?),
            Request::FsRemove(r) => Response::Deleted(self.fs_remove(r)?),
            Request::FsMove(r) => Response::FsEntry(self.fs_move(r)?),
            Request::FsUploadLocal(r) => Response::FsCopied(self.fs_upload_local(r)?),
            Request::FsDownloadLocal(r) => Response::FsCopied(self.fs_download_local(r)?),
            _ => {
                return Err(FilesError::NotFiles {
                    action: req.action(),
                })
            }
        })
    }

    fn fs_root(
        &self,
        a: &str,
        s: &str,
        scope: FsScope,
        checkpoint: Option<&str>,
        w: &ResolvedBelow<'_>,
    ) -> Result<Root, FilesError> {
        self.store.session_info_of(a, s)?;
        let l = self.store.layout();
        // (A checkpoint's tree is reached only by reads: no change names
        // one.)
        let (dir, name) = match (scope, checkpoint) {
            (FsScope::Session, None) => (l.current(a, s), "session's files"),
            (FsScope::Session, Some(c)) => {
                allox_protocol::validate_id("checkpoint_id", c)
                    .map_err(allox_store::StoreError::from)?;
                if !self
                    .store
                    .checkpoint_list(a, s)?
                    .checkpoints
                    .iter()
                    .any(|k| k.checkpoint_id == c)
                {
                    return Err(allox_store::StoreError::NotFound(format!(
                        "checkpoint {a}/{s}/{c}"
                    ))
                    .into());
                }
                (l.checkpoint(a, s, c), "checkpoint's files")
            }
            (FsScope::Shared, None) => (l.shared(a), "agent's shared files"),
            (FsScope::Shared, Some(_)) => return Err(FilesError::SharedCheckpoint),
        };
        let fd = rustix::fs::open(
            &dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FilesError::from_errno("open", &dir.display().to_string(), e))?;
        match (w, scope, checkpoint) {
            (ResolvedBelow::ScopeRoot, ..) => Ok(Root { fd, scope: name }),
            (ResolvedBelow::ShareDir(d), FsScope::Session, None) => Ok(Root {
                fd: path::open_dir_plainly(&fd, d)?,
                scope: "shared scope",
            }),
            (ResolvedBelow::ShareDir(_), ..) => Err(FilesError::BadPath {
                path: ".".into(),
                why: "is not of the session's own files (a share reaches no checkpoint and no shared/)",
            }),
        }
    }

    /// The root of a change: writable, with the session's writer guard
    /// held (refused while a rollback or delete works on the session).
    fn fs_change<T>(
        &self,
        a: &str,
        s: &str,
        scope: FsScope,
        f: impl FnOnce(&Root, Option<(u32, u32)>) -> Result<T, FilesError>,
    ) -> Result<T, FilesError> {
        self.fs_change_in(a, s, scope, &ResolvedBelow::ScopeRoot, f)
    }

    /// [`Supervisor::fs_change`], paths resolved where `w` says.
    fn fs_change_in<T>(
        &self,
        a: &str,
        s: &str,
        scope: FsScope,
        w: &ResolvedBelow<'_>,
        f: impl FnOnce(&Root, Option<(u32, u32)>) -> Result<T, FilesError>,
    ) -> Result<T, FilesError> {
        let runs = self.runs.as_ref();
        let _writer = runs.map(|r| r.writing(a, s)).transpose()?;
        let root = self.fs_root(a, s, scope, None, w)?;
        let owner = runs.map(|r| (r.config().uid, r.config().gid));
        f(&root, owner)
    }

    fn fs_list(&self, r: &FsList, w: &ResolvedBelow<'_>) -> Result<FsListing, FilesError> {
        let root = self.fs_root(
            &r.agent_id,
            &r.session_id,
            r.scope,
            r.checkpoint_id.as_deref(),
            w,
        )?;
        let rel = Rel::parse(&r.path)?;
        let depth = r.depth.unwrap_or(1).clamp(1, MAX_DEPTH);
        let dir = root.open(&rel, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let mut out = FsListing {
            entries: Vec::new(),
            truncated: false,
        };
        let prefix = if rel.is_root() {
            String::new()
        } else {
            format!("{}/", rel.joined())
        };
        list_into(dir, prefix.as_bytes(), depth, &mut out)?;
        out.entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn fs_read(&self, r: &FsRead, w: &ResolvedBelow<'_>) -> Result<FsData, FilesError> {
        let root = self.fs_root(
            &r.agent_id,
            &r.session_id,
            r.scope,
            r.checkpoint_id.as_deref(),
            w,
        )?;
        let rel = Rel::parse(&r.path)?;
        // Non-blocking: a FIFO must not hold the request.
        let fd = root.open(&rel, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY)?;
        let st =
            rustix::fs::fstat(&fd).map_err(|e| FilesError::from_errno("stat", rel.shown, e))?;
        if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() {
            return Err(FilesError::NotA {
                path: rel.shown.into(),
                what: "a regular file",
            });
        }
        let size = st.st_size as u64;
        let offset = r.offset.unwrap_or(0);
        let want = r
            .length
            .unwrap_or(FS_CHUNK)
            .min(FS_CHUNK)
            .min(size.saturating_sub(offset)) as usize;
        let mut data = vec![0u8; want];
        let mut got = 0;
        while got < want {
            match rustix::io::pread(&fd, &mut data[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(FilesError::from_errno("read", rel.shown, e)),
            }
        }
        data.truncate(got);
        Ok(FsData {
            path: rel.joined(),
            offset,
            eof: offset + got as u64 >= size,
            size,
            data: Bytes(data),
            inode: st.st_ino,
        })
    }

    fn fs_write(&self, r: &FsWrite, w: &ResolvedBelow<'_>) -> Result<FsWritten, FilesError> {
        let rel = Rel::parse(&r.path)?;
        self.fs_change_in(&r.agent_id, &r.session_id, r.scope, w, |root, owner| {
            let (parent, name) = parent_of(&root.fd, &rel).map_err(|e| scoped(e, root.scope))?;
            let create = r.create.unwrap_or(true);
            if r.abort {
                let Some(id) = &r.upload else {
                    return Err(local::refused(
                        "abort ends an upload: give upload too".into(),
                    ));
                };
                return uploads::abort(
                    &self.uploads_dir(),
                    self.uploads,
                    (&r.agent_id, &r.session_id, id, r.scope),
                    &rel,
                    &parent,
                    name,
                );
            }
            if let Some(id) = &r.upload {
                return uploads::chunk(
                    &self.uploads_dir(),
                    &uploads::Chunk {
                        agent: &r.agent_id,
                        session: &r.session_id,
                        scope: r.scope,
                        within: match w {
                            ResolvedBelow::ShareDir(d) => Some(d),
                            ResolvedBelow::ScopeRoot => None,
                        },
                        id,
                        rel: &rel,
                        parent: &parent,
                        name,
                        offset: r.offset.unwrap_or(0),
                        data: uploads::Data::Bytes(&r.data),
                        commit: r.commit,
                        create,
                        owner,
                        before_commit: &|| self.store.failpoint("fs_write.before_commit"),
                        live: self.uploads,
                        charged: self.charged_to,
                        share_extents: !self.store.quotas_on(),
                    },
                )
                .map(|(w, _)| w);
            }
            let size = match r.offset {
                None => {
                    let fill = |fd: &OwnedFd| {
                        pwrite_all(fd, &r.data, 0, rel.shown).map(|()| r.data.len() as u64)
                    };
                    replace(&parent, name, &rel, &fill, create, owner, &|| {
                        self.store.failpoint("fs_write.before_commit")
                    })?
                }
                Some(off) => {
                    write_at(&parent, name, &rel, off, &r.data, create, r.truncate, owner)?
                }
            };
            Ok(FsWritten {
                path: rel.joined(),
                size,
                committed: true,
            })
        })
    }

    fn fs_upload_local(&self, r: &FsUploadLocal) -> Result<FsCopied, FilesError> {
        let src = local::passed("fs.upload_local", local::Use::Read)?;
        let rel = Rel::parse(&r.path)?;
        if r.upload.is_none() && (r.offset.is_some() || r.length.is_some() || r.commit) {
            return Err(local::refused(
                "offset, length and commit are an upload's chunk: give upload too".into(),
            ));
        }
        self.fs_change(&r.agent_id, &r.session_id, r.scope, |root, owner| {
            let (parent, name) = parent_of(&root.fd, &rel).map_err(|e| scoped(e, root.scope))?;
            if let Some(id) = &r.upload {
                let (w, by) = uploads::chunk(
                    &self.uploads_dir(),
                    &uploads::Chunk {
                        agent: &r.agent_id,
                        session: &r.session_id,
                        scope: r.scope,
                        within: None,
                        id,
                        rel: &rel,
                        parent: &parent,
                        name,
                        offset: r.offset.unwrap_or(0),
                        data: uploads::Data::Passed {
                            fd: &src,
                            length: r.length,
                        },
                        commit: r.commit,
                        create: r.create.unwrap_or(true),
                        owner,
                        before_commit: &|| self.store.failpoint("fs_write.before_commit"),
                        live: self.uploads,
                        charged: None,
                        share_extents: !self.store.quotas_on(),
                    },
                )?;
                // A commit's bytes all came: it stands whether or not
                // the client is still there for the answer.
                return Ok(FsCopied {
                    path: w.path,
                    size: w.size,
                    by: by.unwrap_or_default(),
                });
            }
            let (size, by) = local::upload(
                &parent,
                name,
                &rel,
                &src,
                r.create.unwrap_or(true),
                owner,
                &|| self.store.failpoint("fs_write.before_commit"),
                !self.store.quotas_on(),
            )?;
            Ok(FsCopied {
                path: rel.joined(),
                size,
                by,
            })
        })
    }

    fn fs_download_local(&self, r: &FsDownloadLocal) -> Result<FsCopied, FilesError> {
        let dst = local::passed("fs.download_local", local::Use::Write)?;
        let root = self.fs_root(
            &r.agent_id,
            &r.session_id,
            r.scope,
            r.checkpoint_id.as_deref(),
            &ResolvedBelow::ScopeRoot,
        )?;
        let rel = Rel::parse(&r.path)?;
        let (size, by) = local::download(&root, &rel, &dst)?;
        Ok(FsCopied {
            path: rel.joined(),
            size,
            by,
        })
    }

    fn fs_mkdir(&self, r: &FsMkdir) -> Result<FsEntry, FilesError> {
        let rel = Rel::parse(&r.path)?;
        self.fs_change(&r.agent_id, &r.session_id, r.scope, |root, owner| {
            if r.parents {
                // One level at a time, each below the last one's handle.
                let mut dir = rustix::fs::openat(
                    &root.fd,
                    ".",
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| FilesError::from_errno("open", ".", e))?;
                for p in &rel.parts {
                    match rustix::fs::mkdirat(&dir, *p, Mode::from_raw_mode(0o755)) {
                        Ok(()) => chown_dir(&dir, p, owner, rel.shown)?,
                        Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(FilesError::from_errno("make", rel.shown, e)),
                    }
                    dir = rustix::fs::openat(
                        &dir,
                        *p,
                        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(|e| FilesError::from_errno("open", rel.shown, e))?;
                }
            } else {
                let (parent, name) =
                    parent_of(&root.fd, &rel).map_err(|e| scoped(e, root.scope))?;
                rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755))
                    .map_err(|e| FilesError::from_errno("make", rel.shown, e))?;
                chown_dir(&parent, name, owner, rel.shown)?;
            }
            stat(root, &rel)
        })
    }

    fn fs_remove(&self, r: &FsRemove) -> Result<Deleted, FilesError> {
        let rel = Rel::parse(&r.path)?;
        self.fs_change(&r.agent_id, &r.session_id, r.scope, |root, _| {
            let (parent, name) = parent_of(&root.fd, &rel).map_err(|e| scoped(e, root.scope))?;
            let st = rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| FilesError::from_errno("stat", rel.shown, e))?;
            if rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() {
                if r.recursive {
                    let parent = rustix::fs::openat(
                        &parent,
                        ".",
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(|e| FilesError::from_errno("open", rel.shown, e))?;
                    allox_store::btrfs::remove_at(
                        &parent,
                        std::ffi::OsStr::new(name),
                        Path::new(rel.shown),
                    )
                    .map_err(|e| FilesError::Io {
                        op: "remove",
                        path: rel.shown.into(),
                        source: std::io::Error::other(allox_protocol::error_chain(&e)),
                    })?;
                } else {
                    rustix::fs::unlinkat(&parent, name, AtFlags::REMOVEDIR)
                        .map_err(|e| FilesError::from_errno("remove", rel.shown, e))?;
                }
            } else {
                rustix::fs::unlinkat(&parent, name, AtFlags::empty())
                    .map_err(|e| FilesError::from_errno("remove", rel.shown, e))?;
            }
            Ok(Deleted {
                deleted: rel.joined(),
            })
        })
    }

    fn fs_move(&self, r: &FsMove) -> Result<FsEntry, FilesError> {
        let from = Rel::parse(&r.path)?;
        let to = Rel::parse(&r.to)?;
        self.fs_change(&r.agent_id, &r.session_id, r.scope, |root, _| {
            let (fp, fname) = parent_of(&root.fd, &from).map_err(|e| scoped(e, root.scope))?;
            let (tp, tname) = parent_of(&root.fd, &to).map_err(|e| scoped(e, root.scope))?;
            rustix::fs::renameat(&fp, fname, &tp, tname).map_err(|e| match e {
                // What is in the way is the target, not what moves.
                rustix::io::Errno::ISDIR => FilesError::NotA {
                    path: to.shown.into(),
                    what: "a file (it is a directory: name the path inside it)",
                },
                rustix::io::Errno::NOTEMPTY | rustix::io::Errno::EXIST => FilesError::NotEmpty {
                    path: to.shown.into(),
                },
                e => FilesError::from_errno("move", from.shown, e),
            })?;
            stat(root, &to)
        })
    }

    /// Where unfinished uploads are recorded (the store's `state/`).
    pub(crate) fn uploads_dir(&self) -> std::path::PathBuf {
        self.store.layout().state_dir().join("uploads")
    }
}

/// A resolution error, naming the scope it would have left.
fn scoped(e: FilesError, scope: &'static str) -> FilesError {
    match e {
        FilesError::Outside { path, .. } => FilesError::Outside { path, scope },
        e => e,
    }
}

fn kind_of(mode: u32) -> FsKind {
    let t = rustix::fs::FileType::from_raw_mode(mode);
    if t.is_file() {
        FsKind::File
    } else if t.is_dir() {
        FsKind::Dir
    } else if t.is_symlink() {
        FsKind::Symlink
    } else {
        FsKind::Other
    }
}

/// The entry at `path` (bytes: a name need not be UTF-8), whose link, if
/// it is one, points at `link`.
fn entry(path: &[u8], st: &rustix::fs::Stat, link: Option<&[u8]>) -> FsEntry {
    let (path, escaped) = allox_protocol::path_from_bytes(path);
    let link = link.map(allox_protocol::path_from_bytes);
    FsEntry {
        path,
        kind: kind_of(st.st_mode),
        size: st.st_size as u64,
        mode: st.st_mode & 0o7777,
        mtime_ms: (st.st_mtime as u64).saturating_mul(1000) + st.st_mtime_nsec / 1_000_000,
        escaped: escaped || link.as_ref().is_some_and(|l| l.1),
        link: link.map(|l| l.0),
    }
}

/// `fs.stat`: the entry itself (a link is not followed).
fn stat(root: &Root, rel: &Rel<'_>) -> Result<FsEntry, FilesError> {
    if rel.is_root() {
        let st = rustix::fs::fstat(&root.fd).map_err(|e| FilesError::from_errno("stat", ".", e))?;
        return Ok(entry(b".", &st, None));
    }
    let (parent, name) = parent_of(&root.fd, rel).map_err(|e| scoped(e, root.scope))?;
    let st = rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| FilesError::from_errno("stat", rel.shown, e))?;
    let link = (kind_of(st.st_mode) == FsKind::Symlink)
        .then(|| rustix::fs::readlinkat(&parent, name, Vec::new()).ok())
        .flatten();
    Ok(entry(
        rel.joined().as_bytes(),
        &st,
        link.as_ref().map(|l| l.as_bytes()),
    ))
}

/// Appends `dir`'s entries (and, `depth` > 1, its subdirectories') to
/// `out`, reached through handles only.
fn list_into(
    dir: OwnedFd,
    prefix: &[u8],
    depth: u32,
    out: &mut FsListing,
) -> Result<(), FilesError> {
    let mut subdirs = Vec::new();
    let shown = String::from_utf8_lossy(prefix).into_owned();
    let it =
        rustix::fs::Dir::read_from(&dir).map_err(|e| FilesError::from_errno("list", &shown, e))?;
    for e in it {
        let e = e.map_err(|e| FilesError::from_errno("list", &shown, e))?;
        let name = e.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if out.entries.len() >= MAX_ENTRIES {
            out.truncated = true;
            return Ok(());
        }
        // Gone meanwhile: skipped.
        let Ok(st) = rustix::fs::statat(&dir, e.file_name(), AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        let link = (kind_of(st.st_mode) == FsKind::Symlink)
            .then(|| rustix::fs::readlinkat(&dir, e.file_name(), Vec::new()).ok())
            .flatten();
        let path = [prefix, name].concat();
        if depth > 1 && kind_of(st.st_mode) == FsKind::Dir {
            subdirs.push((e.file_name().to_owned(), [&path[..], b"/"].concat()));
        }
        out.entries
            .push(entry(&path, &st, link.as_ref().map(|l| l.as_bytes())));
    }
    for (name, p) in subdirs {
        // Swapped for something else meanwhile: NOFOLLOW refuses a link.
        let Ok(sub) = rustix::fs::openat(
            &dir,
            name.as_c_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        list_into(sub, &p, depth - 1, out)?;
        if out.truncated {
            break;
        }
    }
    Ok(())
}

/// Gives the directory `name` just made in `dir` to the sandbox's user
/// (when the daemon may), on a descriptor of it: a link swapped in for it
/// is not followed, and only a directory still the daemon's is given away.
fn chown_dir(
    dir: &OwnedFd,
    name: &str,
    owner: Option<(u32, u32)>,
    shown: &str,
) -> Result<(), FilesError> {
    let Some((uid, gid)) = owner else {
        return Ok(());
    };
    let me = rustix::process::geteuid();
    if !me.is_root() {
        return Ok(());
    }
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| FilesError::from_errno("chown", shown, e))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| FilesError::from_errno("chown", shown, e))?;
    if st.st_uid != me.as_raw() {
        return Ok(());
    }
    rustix::fs::fchown(
        &fd,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    )
    .map_err(|e| FilesError::from_errno("chown", shown, e))
}

/// Writes all of `data` at `offset` of `fd`.
pub(crate) fn pwrite_all(
    fd: &OwnedFd,
    data: &[u8],
    offset: u64,
    shown: &str,
) -> Result<(), FilesError> {
    let mut done = 0;
    while done < data.len() {
        match rustix::io::pwrite(fd, &data[done..], offset + done as u64) {
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(FilesError::from_errno("write", shown, e)),
        }
    }
    Ok(())
}

/// A name for a file beside `name` that nothing else uses.
fn beside(name: &str, what: &str) -> String {
    let mut r = [0u8; 6];
    let _ = getrandom::fill(&mut r);
    let tag: String = r.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        ".allox-{what}-{tag}-{}",
        name.chars().take(64).collect::<String>()
    )
}

/// The mode of a new file.
pub(crate) const NEW_FILE_MODE: u32 = 0o644;

/// The mode a file written over `st` gets: a regular file's permission
/// bits (without setuid, setgid or sticky), else (a symlink, whose bits
/// are 0777, a FIFO, a socket) a new file's.
pub(crate) fn kept_mode(st: &rustix::fs::Stat) -> u32 {
    if kind_of(st.st_mode) == FsKind::File {
        st.st_mode & fresh::PERMISSIONS
    } else {
        NEW_FILE_MODE
    }
}

/// The whole file becomes what `fill` writes into a new file beside it
/// (returning its size), which is given its owner and mode before it has
/// a name or a byte ([`fresh`]), then named and renamed over it. The mode
/// kept is the replaced file's ([`kept_mode`]).
fn replace(
    parent: &OwnedFd,
    name: &str,
    rel: &Rel<'_>,
    fill: &dyn Fn(&OwnedFd) -> Result<u64, FilesError>,
    create: bool,
    owner: Option<(u32, u32)>,
    before_commit: &dyn Fn(),
) -> Result<u64, FilesError> {
    // What is there decides the mode kept, and whether it may be replaced.
    let mode = match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if kind_of(st.st_mode) == FsKind::Dir => {
            return Err(FilesError::NotA {
                path: rel.shown.into(),
                what: "a file",
            })
        }
        Ok(st) => kept_mode(&st),
        Err(rustix::io::Errno::NOENT) if create => NEW_FILE_MODE,
        Err(e) => return Err(FilesError::from_errno("stat", rel.shown, e)),
    };
    let tmp = beside(name, "write");
    let mut f = Fresh::make(parent, &tmp, mode, owner, rel.shown)?;
    let mut size = 0;
    let done = fill(&f.fd)
        .and_then(|n| {
            size = n;
            f.link(parent, &tmp, rel.shown)
        })
        .and_then(|()| {
            before_commit();
            rustix::fs::renameat(parent, tmp.as_str(), parent, name).map_err(|e| match e {
                rustix::io::Errno::NOENT => FilesError::Taken {
                    path: rel.shown.into(),
                },
                e => FilesError::from_errno("replace", rel.shown, e),
            })
        });
    if done.is_err() && f.named() {
        let _ = rustix::fs::unlinkat(parent, tmp.as_str(), AtFlags::empty());
    }
    done.map(|()| size)
}

/// `data` at `offset` of the file itself.
#[allow(clippy::too_many_arguments)]
fn write_at(
    parent: &OwnedFd,
    name: &str,
    rel: &Rel<'_>,
    offset: u64,
    data: &[u8],
    create: bool,
    truncate: bool,
    owner: Option<(u32, u32)>,
) -> Result<u64, FilesError> {
    let flags = OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(parent, name, flags, Mode::empty()) {
        // A new file is the sandbox user's before it has a name.
        Err(rustix::io::Errno::NOENT) if create => {
            let mut f = Fresh::make(parent, name, 0o644, owner, rel.shown)?;
            match f.link(parent, name, rel.shown) {
                Ok(()) => Ok(f.fd),
                // Made meanwhile: that one is written.
                Err(FilesError::Exists { .. }) => {
                    rustix::fs::openat(parent, name, flags, Mode::empty())
                }
                Err(e) => return Err(e),
            }
        }
        r => r,
    }
    .map_err(|e| FilesError::from_errno("write", rel.shown, e))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| FilesError::from_errno("stat", rel.shown, e))?;
    if kind_of(st.st_mode) != FsKind::File {
        return Err(FilesError::NotA {
            path: rel.shown.into(),
            what: "a regular file",
        });
    }
    pwrite_all(&fd, data, offset, rel.shown)?;
    let end = offset + data.len() as u64;
    if truncate {
        rustix::fs::ftruncate(&fd, end)
            .map_err(|e| FilesError::from_errno("truncate", rel.shown, e))?;
    }
    let st = rustix::fs::fstat(&fd).map_err(|e| FilesError::from_errno("stat", rel.shown, e))?;
    Ok(st.st_size as u64)
}
