//! Files between this machine and a session through the file API:
//! `alloxctl cp` (either way, directories too) and `alloxctl fs cat`.
//! Uploads go in chunks of [`FS_CHUNK`] under an upload id, committed with
//! the last one, so the target keeps its old content until the new one is
//! whole; downloads read chunks into a file beside the local target, which
//! is renamed into place at the end.
//!
//! Over the daemon's Unix socket on this machine, each file's bytes go
//! without frames: the open file is passed with an `fs.upload_local` or
//! `fs.download_local` request and the daemon moves them itself (a
//! reflink where both sides are on one Btrfs). Where descriptors do not
//! pass (the VM's control port), the daemon says `unsupported` once and
//! the copy goes on in frames.

use crate::client::{Caller, Client, ClientError};
use allox_protocol::{
    CopiedBy, ErrorBody, ErrorCode, FsCopied, FsData, FsDownloadLocal, FsEntry, FsKind, FsList,
    FsMkdir, FsRead, FsScope, FsStat, FsUploadLocal, FsWrite, FsWritten, Request, Response,
    FS_CHUNK,
};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// The most bytes of a file's name its partial file's name carries.
const PARTIAL_NAME_MAX: usize = 200;

/// A path in a session: `AGENT/SESSION:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub agent: String,
    pub session: String,
    pub path: String,
    pub scope: FsScope,
    /// Read from this checkpoint (downloads only).
    pub checkpoint: Option<String>,
}

impl Remote {
    /// `AGENT/SESSION:PATH`, or `None` when `s` is a local path.
    pub fn parse(s: &str) -> Option<Remote> {
        let (who, path) = s.split_once(':')?;
        let (agent, session) = who.split_once('/')?;
        if agent.is_empty() || session.is_empty() || session.contains('/') {
            return None;
        }
        Some(Remote {
            agent: agent.into(),
            session: session.into(),
            path: path.into(),
            scope: FsScope::Session,
            checkpoint: None,
        })
    }

    fn at(&self, path: &str) -> Remote {
        Remote {
            path: path.to_string(),
            ..self.clone()
        }
    }
}

/// Why a copy failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error(transparent)]
    Transport(#[from] ClientError),
    #[error("{what}: {}: {}", .body.code, .body.message)]
    Daemon { what: String, body: ErrorBody },
    #[error("{}", .path.display())]
    Local {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}

fn local(path: &Path) -> impl FnOnce(std::io::Error) -> CopyError + '_ {
    move |source| CopyError::Local {
        path: path.to_path_buf(),
        source,
    }
}

fn ask(c: &mut impl Caller, what: &str, r: Request) -> Result<Response, CopyError> {
    c.call(r)?.map_err(|body| CopyError::Daemon {
        what: what.to_string(),
        body,
    })
}

/// What a copy did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    pub files: u64,
    pub bytes: u64,
    /// Files whose bytes the daemon moved itself, by how.
    pub reflink: u64,
    pub copy_file_range: u64,
    pub sendfile: u64,
    /// Files whose bytes went in frames.
    pub framed: u64,
}

impl Copied {
    fn add(&mut self, o: Copied) {
        self.files += o.files;
        self.bytes += o.bytes;
        self.reflink += o.reflink;
        self.copy_file_range += o.copy_file_range;
        self.sendfile += o.sendfile;
        self.framed += o.framed;
    }

    fn one(bytes: u64, by: Option<CopiedBy>) -> Copied {
        let mut c = Copied {
            files: 1,
            bytes,
            ..Copied::default()
        };
        match by {
            Some(CopiedBy::Reflink) => c.reflink = 1,
            Some(CopiedBy::CopyFileRange) => c.copy_file_range = 1,
            Some(CopiedBy::Sendfile) => c.sendfile = 1,
            None => c.framed = 1,
        }
        c
    }
}

/// How a copy moves each file's bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The open file passed to the daemon where it takes one, else frames.
    #[default]
    Auto,
    /// Frames only (`fs.write` chunks, `fs.read`).
    Frames,
}

/// Whether the next file may still go without frames.
struct Way(bool);

impl Way {
    fn new(via: Via) -> Way {
        Way(via == Via::Auto)
    }

    /// `local`'s answer, or `None` (and frames from now on) where the
    /// daemon cannot take a descriptor on this connection.
    fn local(
        &mut self,
        local: impl FnOnce() -> Result<FsCopied, CopyError>,
    ) -> Result<Option<FsCopied>, CopyError> {
        if !self.0 {
            return Ok(None);
        }
        match local() {
            Ok(c) => Ok(Some(c)),
            Err(CopyError::Daemon { body, .. }) if body.code == ErrorCode::Unsupported => {
                self.0 = false;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// `q` with the open local file `f` passed to the daemon, for `path`.
fn with_file(
    c: &mut Client,
    q: Request,
    f: &std::fs::File,
    path: &str,
) -> Result<FsCopied, CopyError> {
    let r = c
        .call_with_fd(q, f.as_fd())?
        .map_err(|body| CopyError::Daemon {
            what: path.to_string(),
            body,
        })?;
    match r {
        Response::FsCopied(c) => Ok(c),
        _ => Err(CopyError::Other(format!(
            "{path}: an answer that is not a copy"
        ))),
    }
}

/// The whole of the open local file `f` becomes `to`, the daemon reading
/// it from the descriptor passed with the request.
pub fn upload_local(c: &mut Client, f: &std::fs::File, to: &Remote) -> Result<FsCopied, CopyError> {
    let q = Request::FsUploadLocal(FsUploadLocal::whole(
        &to.agent,
        &to.session,
        to.scope,
        &to.path,
    ));
    with_file(c, q, f, &to.path)
}

/// The remote file `from` written by the daemon into the open local file
/// `f` (from its start, cut to the file's size).
pub fn download_local(
    c: &mut Client,
    from: &Remote,
    f: &std::fs::File,
) -> Result<FsCopied, CopyError> {
    with_file(c, download_local_request(from), f, &from.path)
}

/// The `fs.download_local` of the remote file `from` (its descriptor to
/// be passed with it).
pub fn download_local_request(from: &Remote) -> Request {
    Request::FsDownloadLocal(FsDownloadLocal {
        agent_id: from.agent.clone(),
        session_id: from.session.clone(),
        scope: from.scope,
        checkpoint_id: from.checkpoint.clone(),
        path: from.path.clone(),
    })
}

/// Chunks of an upload in flight at once.
const WINDOW: usize = 8;

/// A fresh upload id: 16 random hex digits.
pub fn upload_id() -> String {
    let mut r = [0u8; 8];
    let _ = getrandom::fill(&mut r);
    r.iter().map(|b| format!("{b:02x}")).collect()
}

/// Sends the local file or directory `from` to `to`.
pub fn upload(c: &mut Client, from: &Path, to: &Remote) -> Result<Copied, CopyError> {
    upload_via(c, from, to, Via::Auto)
}

/// [`upload`], each file's bytes moved as `via` says.
pub fn upload_via(c: &mut Client, from: &Path, to: &Remote, via: Via) -> Result<Copied, CopyError> {
    unnameable(from)?;
    upload_in(c, from, to, &mut Way::new(via))
}

/// Refuses, before anything is copied, a tree holding a name that is not
/// UTF-8: names travel as UTF-8 text, and two such names would reach the
/// session as one (each bad byte read as U+FFFD), the last file copied
/// over the others.
fn unnameable(from: &Path) -> Result<(), CopyError> {
    let md = std::fs::symlink_metadata(from).map_err(local(from))?;
    if !md.is_dir() {
        return Ok(());
    }
    let mut dirs = vec![from.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).map_err(local(&dir))? {
            let e = e.map_err(local(&dir))?;
            let p = e.path();
            if e.file_name().to_str().is_none() {
                return Err(CopyError::Other(format!(
                    "{}: a name that is not UTF-8 cannot be copied into a session (names travel as UTF-8 text); rename it first (nothing was copied)",
                    p.display()
                )));
            }
            if e.file_type().map_err(local(&p))?.is_dir() {
                dirs.push(p);
            }
        }
    }
    Ok(())
}

fn upload_in(c: &mut Client, from: &Path, to: &Remote, way: &mut Way) -> Result<Copied, CopyError> {
    let md = std::fs::symlink_metadata(from).map_err(local(from))?;
    let mut done = Copied::default();
    if md.is_dir() {
        ask(
            c,
            &to.path,
            Request::FsMkdir(FsMkdir {
                agent_id: to.agent.clone(),
                session_id: to.session.clone(),
                scope: to.scope,
                path: to.path.clone(),
                parents: true,
            }),
        )?;
        let mut names: Vec<_> = std::fs::read_dir(from)
            .map_err(local(from))?
            .flatten()
            .map(|e| e.file_name())
            .collect();
        names.sort();
        for n in names {
            // Every name was found UTF-8 before anything was copied
            // ([`unnameable`]); one renamed since is refused here.
            let name = n
                .to_str()
                .ok_or_else(|| {
                    CopyError::Other(format!(
                        "{}: a name that is not UTF-8 cannot be copied into a session",
                        from.join(&n).display()
                    ))
                })?
                .to_owned();
            let sub = to.at(&format!("{}/{name}", to.path.trim_end_matches('/')));
            done.add(upload_in(c, &from.join(&n), &sub, way)?);
        }
        return Ok(done);
    }
    if !md.is_file() {
        eprintln!(
            "alloxctl: {}: skipped (only files and directories are copied)",
            from.display()
        );
        return Ok(done);
    }
    let mut f = std::fs::File::open(from).map_err(local(from))?;
    if let Some(x) = way.local(|| upload_local(c, &f, to))? {
        return Ok(Copied::one(x.size, Some(x.by)));
    }
    let written = upload_from(c, &mut f, from, to)?;
    Ok(Copied::one(written.size, None))
}

/// Sends what `source` gives, to its end, as the file `to`: in chunks of
/// [`FS_CHUNK`] under a fresh upload id, the last one committing. The
/// target keeps its old content unless the whole of `source` came; a read
/// error is a [`CopyError::Local`] naming `name`. Returns the commit's
/// answer.
pub fn upload_from(
    c: &mut impl Caller,
    source: &mut dyn Read,
    name: &Path,
    to: &Remote,
) -> Result<FsWritten, CopyError> {
    let id = upload_id();
    let mut next = || -> Result<Vec<u8>, CopyError> {
        let mut buf = vec![0u8; FS_CHUNK as usize];
        let mut n = 0;
        while n < buf.len() {
            match source.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(local(name)(e)),
            }
        }
        buf.truncate(n);
        Ok(buf)
    };
    let chunk = |offset: u64, data: Vec<u8>, commit: bool| {
        Request::FsWrite(FsWrite {
            scope: to.scope,
            offset: Some(offset),
            upload: Some(id.clone()),
            commit,
            ..FsWrite::whole(&to.agent, &to.session, &to.path, data)
        })
    };
    let written = |r: Response| match r {
        Response::FsWritten(w) => Ok(w),
        _ => Err(CopyError::Other(format!(
            "{}: an answer that is not a write",
            to.path
        ))),
    };
    // The first chunk alone (it begins the upload), then the full ones with
    // up to WINDOW unanswered, and the last one (short, maybe empty),
    // which commits, after all the others.
    let first = next()?;
    let mut offset = first.len() as u64;
    let last = written(ask(c, &to.path, chunk(0, first, offset < FS_CHUNK))?)?;
    if last.committed {
        return Ok(last);
    }
    let mut tail = None;
    let mut read_err = None;
    let mut daemon_err = None;
    c.pipeline(
        WINDOW,
        &mut || {
            if tail.is_some() || read_err.is_some() {
                return None;
            }
            match next() {
                Ok(data) if data.len() == FS_CHUNK as usize => {
                    let n = data.len() as u64;
                    let r = chunk(offset, data, false);
                    offset += n;
                    Some(r)
                }
                Ok(data) => {
                    tail = Some(data);
                    None
                }
                Err(e) => {
                    read_err = Some(e);
                    None
                }
            }
        },
        &mut |a| match a {
            Ok(_) => true,
            Err(body) => {
                daemon_err = Some(CopyError::Daemon {
                    what: to.path.clone(),
                    body,
                });
                false
            }
        },
    )?;
    if let Some(e) = read_err.or(daemon_err) {
        // Dropped on the daemon, so that it does not hold one of the
        // session's few uploads under way until it is idle five minutes
        // (best effort: the daemon may be what failed).
        let _ = ask(
            c,
            &to.path,
            Request::FsWrite(FsWrite {
                scope: to.scope,
                upload: Some(id.clone()),
                abort: true,
                ..FsWrite::whole(&to.agent, &to.session, &to.path, Vec::new())
            }),
        );
        return Err(e);
    }
    let data = tail.unwrap_or_default();
    let last = written(ask(c, &to.path, chunk(offset, data, true))?)?;
    if !last.committed {
        return Err(CopyError::Other(format!(
            "{}: the last chunk was not committed",
            to.path
        )));
    }
    Ok(last)
}

/// Reads all of the remote file `from`, chunk by chunk, into `out`: the
/// first chunk tells the size, the rest is asked for with up to WINDOW
/// reads unanswered; a file that grew meanwhile is read on to its end.
pub fn read_to(c: &mut Client, from: &Remote, out: &mut dyn Write) -> Result<u64, CopyError> {
    let read = |offset: u64| {
        Request::FsRead(FsRead {
            agent_id: from.agent.clone(),
            session_id: from.session.clone(),
            scope: from.scope,
            checkpoint_id: from.checkpoint.clone(),
            path: from.path.clone(),
            offset: Some(offset),
            length: None,
        })
    };
    let not_data = || CopyError::Other(format!("{}: an answer that is not data", from.path));
    let put = |out: &mut dyn Write, data: &[u8]| {
        out.write_all(data).map_err(|source| CopyError::Local {
            path: PathBuf::from("-"),
            source,
        })
    };
    let Response::FsData(FsData {
        data,
        eof,
        size,
        inode,
        ..
    }) = ask(c, &from.path, read(0))?
    else {
        return Err(not_data());
    };
    // Every chunk of the one file: one replaced at its path meanwhile
    // (another inode) would leave a mix of the two.
    let same_file = |d: &FsData| {
        if d.inode == inode {
            Ok(())
        } else {
            Err(CopyError::Other(format!(
                "{}: the file was replaced while it was read (the copy would mix two files): copy it again",
                from.path
            )))
        }
    };
    put(out, &data)?;
    let mut pos = data.len() as u64;
    // Shared by the two closures below.
    let ended = std::cell::Cell::new(eof || data.is_empty());
    let mut asked = pos;
    // Set after a short chunk: no more reads asked for.
    let short = std::cell::Cell::new(false);
    let mut err = None;
    c.pipeline(
        WINDOW,
        &mut || {
            (!ended.get() && !short.get() && asked < size).then(|| {
                let r = read(asked);
                asked += FS_CHUNK;
                r
            })
        },
        &mut |a| {
            let r = match a {
                Ok(Response::FsData(d)) => {
                    same_file(&d).and_then(|()| put(out, &d.data)).map(|()| d)
                }
                Ok(_) => Err(not_data()),
                Err(body) => Err(CopyError::Daemon {
                    what: from.path.clone(),
                    body,
                }),
            };
            match r {
                Ok(d) => {
                    pos += d.data.len() as u64;
                    ended.set(d.eof || d.data.is_empty());
                    // After a short chunk the reads already asked for are
                    // at the wrong offsets: dropped, and read on from here.
                    short.set((d.data.len() as u64) < FS_CHUNK);
                    !ended.get() && !short.get()
                }
                Err(e) => {
                    err = Some(e);
                    false
                }
            }
        },
    )?;
    if let Some(e) = err {
        return Err(e);
    }
    // Grown since: on to its end.
    let mut ended = ended.get();
    while !ended {
        let Response::FsData(d) = ask(c, &from.path, read(pos))? else {
            return Err(not_data());
        };
        same_file(&d)?;
        put(out, &d.data)?;
        pos += d.data.len() as u64;
        ended = d.eof || d.data.is_empty();
    }
    Ok(pos)
}

fn stat(c: &mut Client, r: &Remote) -> Result<FsEntry, CopyError> {
    match ask(
        c,
        &r.path,
        Request::FsStat(FsStat {
            agent_id: r.agent.clone(),
            session_id: r.session.clone(),
            scope: r.scope,
            checkpoint_id: r.checkpoint.clone(),
            path: r.path.clone(),
        }),
    )? {
        Response::FsEntry(e) => Ok(e),
        _ => Err(CopyError::Other(format!(
            "{}: an answer that is not an entry",
            r.path
        ))),
    }
}

/// Fetches the remote file or directory `from` to the local `to`.
pub fn download(c: &mut Client, from: &Remote, to: &Path) -> Result<Copied, CopyError> {
    download_via(c, from, to, Via::Auto)
}

/// [`download`], each file's bytes moved as `via` says.
pub fn download_via(
    c: &mut Client,
    from: &Remote,
    to: &Path,
    via: Via,
) -> Result<Copied, CopyError> {
    let way = &mut Way::new(via);
    let e = stat(c, from)?;
    let mut done = Copied::default();
    match e.kind {
        FsKind::File => done = fetch_file(c, from, to, way)?,
        FsKind::Dir => {
            let base = e.path.trim_end_matches('/').to_string();
            // The whole tree is listed before anything is copied, so a
            // name that cannot be copied out stops the copy before it
            // begins. Listed [`LIST_DEPTH`] levels at a time: a directory
            // at the last level listed is listed again from there, so a
            // deeper tree comes out whole. Each listed by the path the
            // daemon names it by (as `fs.stat` answered for the first),
            // which its entries' paths begin with.
            //
            // A listing cut at its 10,000 entries is asked again one level
            // deep, its subdirectories then each as a tree of their own:
            // a tree of more entries comes out whole as long as no one
            // directory holds more (a project of 12,000 files in 20
            // directories was refused before).
            let mut entries = Vec::new();
            let mut dirs = vec![(base.clone(), LIST_DEPTH)];
            while let Some((dir, depth)) = dirs.pop() {
                let listing = match ask(
                    c,
                    &dir,
                    Request::FsList(FsList {
                        agent_id: from.agent.clone(),
                        session_id: from.session.clone(),
                        scope: from.scope,
                        checkpoint_id: from.checkpoint.clone(),
                        path: dir.clone(),
                        depth: Some(depth),
                    }),
                )? {
                    Response::FsListing(l) => l,
                    _ => return Err(CopyError::Other("an answer that is not a listing".into())),
                };
                if listing.truncated && depth > 1 {
                    dirs.push((dir, 1));
                    continue;
                }
                if listing.truncated {
                    return Err(CopyError::Other(format!(
                        "{dir}: one directory of more than {} entries cannot be listed whole \
                         (nothing was copied); copy its files by name, or take the whole \
                         session with session export",
                        listing.entries.len()
                    )));
                }
                let listed = dir.trim_end_matches('/');
                for x in listing.entries {
                    if x.escaped {
                        // Its name is not UTF-8: the path the daemon gave
                        // is written with escapes and names nothing.
                        return Err(CopyError::Other(format!(
                            "{}: a name that is not UTF-8 cannot be copied out of a session (nothing was copied)",
                            x.path
                        )));
                    }
                    if x.kind == FsKind::Dir && levels_below(listed, &x.path) >= depth {
                        dirs.push((x.path.clone(), LIST_DEPTH));
                    }
                    entries.push(x);
                }
            }
            std::fs::create_dir_all(to).map_err(local(to))?;
            for x in &entries {
                let rel = if base == "." {
                    x.path.as_str()
                } else {
                    x.path.strip_prefix(&format!("{base}/")).unwrap_or(&x.path)
                };
                let dst = to.join(rel);
                match x.kind {
                    FsKind::Dir => std::fs::create_dir_all(&dst).map_err(local(&dst))?,
                    FsKind::File => done.add(fetch_file(c, &from.at(&x.path), &dst, way)?),
                    _ => eprintln!(
                        "alloxctl: {}: skipped (only files and directories are copied)",
                        x.path
                    ),
                }
            }
        }
        _ => {
            return Err(CopyError::Other(format!(
                "{}: only files and directories are copied",
                from.path
            )))
        }
    }
    Ok(done)
}

/// How many levels one `fs.list` of a download asks for (the most it
/// gives).
const LIST_DEPTH: u32 = 64;

/// How many levels `path` (as `fs.list` names it) is below `dir` (as
/// listed: `.` for the scope's root): 1 for an entry of `dir` itself.
fn levels_below(dir: &str, path: &str) -> u32 {
    let rel = if dir == "." || dir.is_empty() {
        path
    } else {
        path.strip_prefix(dir)
            .and_then(|r| r.strip_prefix('/'))
            .unwrap_or(path)
    };
    rel.split('/').filter(|c| !c.is_empty()).count() as u32
}

/// One remote file to a local one ([`Output`]: a regular file written
/// beside it and renamed).
fn fetch_file(
    c: &mut Client,
    from: &Remote,
    to: &Path,
    way: &mut Way,
) -> Result<Copied, CopyError> {
    let mut out = Output::open(to).map_err(local(to))?;
    let done = match &mut out {
        Output::Aside { .. } => match way.local(|| download_local(c, from, out.file()))? {
            Some(x) => Copied::one(x.size, Some(x.by)),
            None => Copied::one(read_to(c, from, out.file())?, None),
        },
        // A device or a FIFO: its bytes written to it, as they come.
        Output::Direct(f) => Copied::one(read_to(c, from, f)?, None),
    };
    out.finish().map_err(local(to))?;
    Ok(done)
}

/// A local file something is written to, as a user means the name given:
/// a regular file (or a name not there yet) is written aside and renamed
/// over it once whole, so no half file is ever under its name and no
/// other file is touched; a device or a FIFO (`/dev/null`,
/// `/dev/stdout`, a pipe's name) is written to as it is, never replaced;
/// a symbolic link is followed (what it names is written, the link stays).
///
/// The aside file has no name until it is whole (`O_TMPFILE` in the
/// target's directory), so an alloxctl stopped however (Ctrl-C,
/// `SIGKILL`) leaves nothing behind: a named one was left for ever,
/// `.NAME.XXXXXX.partial`. A filesystem without unnamed files gets a
/// named one, removed if alloxctl ends by itself.
pub enum Output {
    Aside { tmp: Aside, to: std::path::PathBuf },
    Direct(std::fs::File),
}

/// The file an [`Output`] writes before it is renamed into place.
pub enum Aside {
    /// Unnamed, in `dir`; `stem` begins the name it is linked under
    /// before the rename.
    Unnamed {
        file: std::fs::File,
        dir: std::path::PathBuf,
        stem: String,
    },
    Named(tempfile::NamedTempFile),
}

impl Output {
    pub fn open(to: &Path) -> std::io::Result<Output> {
        let link = std::fs::symlink_metadata(to).is_ok_and(|m| m.file_type().is_symlink());
        let target = if link {
            match std::fs::canonicalize(to) {
                Ok(t) => t,
                // A link to nothing yet: created through it.
                Err(_) => return std::fs::File::create(to).map(Output::Direct),
            }
        } else {
            to.to_path_buf()
        };
        if std::fs::metadata(&target).is_ok_and(|m| !m.is_file()) {
            // Not truncated: a device or a FIFO has nothing to cut (and a
            // directory refuses to be opened for writing, naming itself).
            return std::fs::OpenOptions::new()
                .write(true)
                .open(&target)
                .map(Output::Direct);
        }
        let dir = target
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        // Named after the file, cut so that the whole name (a dot, the
        // name, a dot, six random letters, `.partial`) fits the 255 bytes
        // a name may have: a file whose name is near that long came out
        // of nothing before ("File name too long").
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        let mut cut = name.as_ref();
        while cut.len() > PARTIAL_NAME_MAX {
            let mut end = PARTIAL_NAME_MAX;
            while !cut.is_char_boundary(end) {
                end -= 1;
            }
            cut = &cut[..end];
        }
        let stem = format!(".{cut}.");
        use rustix::fs::{Mode, OFlags};
        let unnamed = rustix::fs::open(
            dir,
            OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        );
        let tmp = match unnamed {
            Ok(fd) => Aside::Unnamed {
                file: std::fs::File::from(fd),
                dir: dir.to_path_buf(),
                stem,
            },
            // A filesystem without them (or an old kernel); any other
            // failure is the directory's, said by the named file's.
            Err(_) => Aside::Named(
                tempfile::Builder::new()
                    .prefix(&stem)
                    .suffix(".partial")
                    .tempfile_in(dir)?,
            ),
        };
        Ok(Output::Aside { tmp, to: target })
    }

    /// Where to write.
    pub fn file(&mut self) -> &mut std::fs::File {
        match self {
            Output::Aside {
                tmp: Aside::Unnamed { file, .. },
                ..
            } => file,
            Output::Aside {
                tmp: Aside::Named(t),
                ..
            } => t.as_file_mut(),
            Output::Direct(f) => f,
        }
    }

    /// Puts what was written in place (made durable first); dropped
    /// before, an aside file goes and nothing else is touched.
    pub fn finish(self) -> std::io::Result<()> {
        match self {
            Output::Aside {
                tmp: Aside::Unnamed { file, dir, stem },
                to,
            } => {
                file.sync_all()?;
                // Named (a fresh name of its directory), then renamed over
                // the target: a link cannot replace a file.
                let fd = format!("/proc/self/fd/{}", rustix::fd::AsRawFd::as_raw_fd(&file));
                let mut tries = 0u32;
                let named = loop {
                    let name = dir.join(format!(
                        "{stem}{:06x}.partial",
                        (std::process::id() ^ tries.wrapping_mul(0x9e37_79b9)) & 0xff_ffff
                    ));
                    match rustix::fs::linkat(
                        rustix::fs::CWD,
                        fd.as_str(),
                        rustix::fs::CWD,
                        &name,
                        rustix::fs::AtFlags::SYMLINK_FOLLOW,
                    ) {
                        Ok(()) => break name,
                        Err(rustix::io::Errno::EXIST) if tries < 100 => tries += 1,
                        Err(e) => return Err(e.into()),
                    }
                };
                std::fs::rename(&named, &to).inspect_err(|_| {
                    let _ = std::fs::remove_file(&named);
                })
            }
            Output::Aside {
                tmp: Aside::Named(tmp),
                to,
            } => {
                tmp.as_file().sync_all()?;
                tmp.persist(&to).map(drop).map_err(|e| e.error)
            }
            Output::Direct(mut f) => std::io::Write::flush(&mut f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_below_a_listed_directory_are_counted_from_it() {
        assert_eq!(levels_below(".", "a"), 1);
        assert_eq!(levels_below(".", "a/b/c"), 3);
        assert_eq!(levels_below("top", "top/d"), 1);
        assert_eq!(levels_below("top/d", "top/d/e/f"), 2);
        assert_eq!(levels_below("", "x/y"), 2);
    }

    #[test]
    fn remote_paths_name_agent_session_and_path() {
        let r = Remote::parse("agent-a/s1:src/main.py").unwrap();
        assert_eq!((r.agent.as_str(), r.session.as_str()), ("agent-a", "s1"));
        assert_eq!(r.path, "src/main.py");
        assert_eq!(Remote::parse("a/s:").unwrap().path, "");
        for local in ["./x", "/tmp/a:b", "noslash:x", "a/b/c:x", "/s:x"] {
            assert_eq!(Remote::parse(local), None, "{local}");
        }
    }
}
