//! Files through the gateway without frames, where the daemon is on this
//! machine: a body larger than one chunk is written to an unnamed file in
//! the spool directory (`O_TMPFILE`: nothing is left behind by a crash),
//! and that open file is passed to the daemon with `fs.upload_local`
//! (`fs.download_local` for a `GET`, the file then sent from the spool),
//! as `alloxctl cp` passes its own. The daemon moves the bytes itself: a
//! reflink where the spool is on the store's Btrfs, else
//! `copy_file_range` or `sendfile`.
//!
//! The rules are the local path's: the upload is committed only once the
//! whole body is spooled, so a body cut short never reaches the session;
//! the daemon writes beside the target and renames it in, so a gateway
//! killed during the copy leaves the old file. Where descriptors do not
//! pass (the VM's control port) the daemon says `unsupported` once and
//! every later file goes in frames; where the spool is full, that file
//! goes in frames, from what was spooled on.

use allox_client::client::Caller;
use allox_client::files::{download_local_request, upload_from, upload_id, CopyError, Remote};
use allox_client::ReconnectingClient;
use allox_protocol::{
    CopiedBy, ErrorCode, FsCopied, FsUploadLocal, FsWrite, Request, Response, FS_CHUNK,
};
use bytes::Bytes;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The header that says how a file's bytes moved.
pub const COPIED_BY: &str = "Allox-Copied-By";

/// The header's value: the daemon's way, or `frames`.
pub fn copied_by(by: Option<CopiedBy>) -> &'static str {
    match by {
        Some(CopiedBy::Reflink) => "reflink",
        Some(CopiedBy::CopyFileRange) => "copy_file_range",
        Some(CopiedBy::Sendfile) => "sendfile",
        None => "frames",
    }
}

/// Bytes a local transfer may take a second, at the least, on top of the
/// daemon timeout: its one call is bounded by both.
const SLOWEST: u64 = 8 << 20;

/// The bound on a local transfer of `size` bytes: the daemon timeout and a
/// second for every [`SLOWEST`] bytes.
pub fn bound(daemon_timeout: Duration, size: u64) -> Duration {
    daemon_timeout + Duration::from_secs(size / SLOWEST)
}

/// Where bodies are spooled, and whether the daemon takes descriptors.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    takes_fds: AtomicBool,
}

/// Why a spool directory cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("the spool directory {}: {source} (give --spool-dir a writable directory, or --files-framed)", .dir.display())]
pub struct SpoolError {
    pub dir: PathBuf,
    #[source]
    pub source: io::Error,
}

impl Spool {
    /// Checks that an unnamed file can be made in `dir`.
    pub fn new(dir: &Path) -> Result<Spool, SpoolError> {
        let err = |source| SpoolError {
            dir: dir.to_path_buf(),
            source,
        };
        let md = std::fs::metadata(dir).map_err(err)?;
        if !md.is_dir() {
            return Err(err(io::Error::new(
                io::ErrorKind::NotADirectory,
                "not a directory",
            )));
        }
        tempfile::tempfile_in(dir).map_err(err)?;
        Ok(Spool {
            dir: dir.to_path_buf(),
            takes_fds: AtomicBool::new(true),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether a file may still go without frames.
    pub fn takes_fds(&self) -> bool {
        self.takes_fds.load(Ordering::Relaxed)
    }

    fn no_fds(&self) {
        if self.takes_fds.swap(false, Ordering::Relaxed) {
            tracing::info!("the daemon takes no descriptors: files go in frames from now on");
        }
    }

    fn file(&self) -> io::Result<File> {
        tempfile::tempfile_in(&self.dir)
    }

    /// Whether the filesystem of `f`, a file in the spool, has room for
    /// `more` bytes and still keeps its reserve free: a tenth of it,
    /// between [`MIN_RESERVE`] and [`MAX_RESERVE`]. A file never fills the host's temporary
    /// directory; where there is no room it goes in frames.
    fn has_room(&self, f: &File, more: u64) -> bool {
        let Ok(v) = rustix::fs::fstatvfs(f) else {
            return true;
        };
        let free = v.f_bavail.saturating_mul(v.f_frsize);
        let reserve = (v.f_blocks.saturating_mul(v.f_frsize) / 10).clamp(MIN_RESERVE, MAX_RESERVE);
        let room = free >= reserve.saturating_add(more);
        if !room {
            tracing::info!(spool = %self.dir.display(), free, reserve, "the spool keeps its reserve; a file goes in frames");
        }
        room
    }
}

/// How the gateway reaches the daemon for one local transfer.
pub struct Local<'a> {
    pub spool: &'a Spool,
    pub socket: &'a Path,
    pub daemon_timeout: Duration,
}

impl Local<'_> {
    /// `q` with `f` passed, on a connection of its own bounded for `size`
    /// bytes. `Ok(None)`: the daemon takes no descriptors.
    fn call(
        &self,
        q: Request,
        f: &File,
        size: u64,
        what: &str,
    ) -> Result<Option<FsCopied>, CopyError> {
        self.call_on(&mut self.client(size), q, f, what)
    }

    /// A connection of its own, each call bounded for `size` bytes.
    fn client(&self, size: u64) -> ReconnectingClient {
        ReconnectingClient::with_timeout(self.socket, Some(bound(self.daemon_timeout, size)))
    }

    fn call_on(
        &self,
        c: &mut ReconnectingClient,
        q: Request,
        f: &File,
        what: &str,
    ) -> Result<Option<FsCopied>, CopyError> {
        match c.call_with_fd(q, f.as_fd())? {
            Ok(Response::FsCopied(x)) => Ok(Some(x)),
            Ok(_) => Err(CopyError::Other(format!(
                "{what}: an answer that is not a copy"
            ))),
            Err(body) if body.code == ErrorCode::Unsupported => {
                self.spool.no_fds();
                Ok(None)
            }
            Err(body) => Err(CopyError::Daemon {
                what: what.to_string(),
                body,
            }),
        }
    }
}

/// What an upload answered: the path, the size, and how the bytes moved
/// (`None`: in frames).
pub type Put = (String, u64, Option<CopiedBy>);

/// A request's body: read as bytes, or piece by piece as it came (no
/// copy on the way to the spool).
pub trait Body: Read {
    /// The next piece, or `None` at the body's end; a body cut short or
    /// stalled is an error.
    fn next_piece(&mut self) -> io::Result<Option<Bytes>>;
}

fn local_err(source: io::Error) -> CopyError {
    CopyError::Local {
        path: PathBuf::from("request body"),
        source,
    }
}

/// Bytes spooled before they are passed to the daemon as one chunk of
/// the upload, while the rest of the body comes.
pub const SEGMENT: u64 = 16 << 20;

/// Room a file always leaves free in the spool's filesystem: a tenth of
/// it, at least this...
pub const MIN_RESERVE: u64 = 64 << 20;
/// ...and at most this.
pub const MAX_RESERVE: u64 = 1 << 30;

/// One chunk to pass: where it begins, how long it is, whether it is the
/// last.
type Segment = (u64, u64, bool);

/// How the passing of an upload's chunks ended.
enum Passed {
    /// The commit's answer.
    Done(FsCopied),
    /// The daemon takes no descriptors: the body goes in frames.
    NoFds,
    /// The body ended before its commit was passed.
    Stopped,
}

/// The body, to its end, becomes `to`. Bodies of one chunk or less, and
/// every body where there is no spool or the daemon takes no descriptors,
/// go in frames as `alloxctl cp --framed` sends them, and so does one for
/// which the spool has no room. A larger one is spooled, and each
/// [`SEGMENT`] of it is passed to the daemon as a chunk of one upload
/// (`fs.upload_local` with `upload`) while the rest comes, the last one
/// committing. A body that fails to come (cut short,
/// stalled) is an error and the target keeps its content.
pub fn put(
    daemon: &mut impl Caller,
    body: &mut dyn Body,
    to: &Remote,
    local: Option<&Local<'_>>,
) -> Result<Put, CopyError> {
    let name = Path::new("request body");
    let mut head = Vec::with_capacity(FS_CHUNK as usize);
    (&mut *body)
        .take(FS_CHUNK)
        .read_to_end(&mut head)
        .map_err(local_err)?;
    fn in_frames(
        daemon: &mut impl Caller,
        src: &mut dyn Read,
        name: &Path,
        to: &Remote,
    ) -> Result<Put, CopyError> {
        let w = upload_from(daemon, src, name, to)?;
        Ok((w.path, w.size, None))
    }
    let local = match local {
        Some(l) if head.len() as u64 == FS_CHUNK && l.spool.takes_fds() => l,
        _ => return in_frames(daemon, &mut io::Cursor::new(head).chain(body), name, to),
    };
    let mut file = match local.spool.file() {
        Ok(f) if local.spool.has_room(&f, SEGMENT) => f,
        Ok(_) => return in_frames(daemon, &mut io::Cursor::new(head).chain(body), name, to),
        Err(e) => {
            tracing::warn!(spool = %local.spool.dir.display(), error = %e, "cannot spool a body; it goes in frames");
            return in_frames(daemon, &mut io::Cursor::new(head).chain(body), name, to);
        }
    };
    let id = upload_id();
    let (segments, to_pass) = std::sync::mpsc::channel::<Segment>();
    let (spooled, passed) = std::thread::scope(|scope| {
        let passer = scope.spawn(|| pass(local, &file, to, &id, to_pass));
        let spooled = spool_body(local, &file, Bytes::from(head), body, segments);
        let passed = passer
            .join()
            .unwrap_or_else(|_| Err(CopyError::Other("the passing of a body failed".into())));
        (spooled, passed)
    });
    // A body cut short (or a failure on the way) leaves what was passed an
    // upload never committed: dropped on the daemon at once, so that it
    // does not hold one of the session's few uploads under way until it
    // is idle five minutes.
    let abort = |daemon: &mut dyn Caller| {
        let _ = daemon.call(Request::FsWrite(FsWrite {
            scope: to.scope,
            upload: Some(id.clone()),
            abort: true,
            ..FsWrite::whole(&to.agent, &to.session, &to.path, Vec::new())
        }));
    };
    let (spooled, passed) = match (spooled, passed) {
        (Ok(s), Ok(p)) => (s, p),
        (Err(e), _) | (_, Err(e)) => {
            abort(daemon);
            return Err(e);
        }
    };
    let (spooled, unwritten) = match (spooled, passed) {
        (Spooled::Whole, Passed::Done(x)) => return Ok((x.path, x.size, Some(x.by))),
        (Spooled::Whole, Passed::Stopped) => {
            abort(daemon);
            return Err(CopyError::Other(format!(
                "{}: the upload stopped before its commit",
                to.path
            )));
        }
        (Spooled::Whole, Passed::NoFds) => (u64::MAX, Bytes::new()),
        (Spooled::Partly { spooled, unwritten }, _) => {
            abort(daemon);
            (spooled, unwritten)
        }
    };
    // The body in frames from its start: what was spooled, then the rest.
    // What was passed of it stays an upload never committed (abandoned
    // when idle).
    file.seek(SeekFrom::Start(0)).map_err(local_err)?;
    let mut src = (&file).take(spooled).chain(&unwritten[..]).chain(body);
    in_frames(daemon, &mut src, name, to)
}

/// How the spooling of a body ended.
enum Spooled {
    /// All of it; every segment handed on.
    Whole,
    /// Not all: the spool is full, or the passing ended before the body
    /// (the daemon refused a chunk, or takes no descriptors). `spooled`
    /// bytes are in the spool, `unwritten` came after them, the rest of
    /// the body is unread.
    Partly { spooled: u64, unwritten: Bytes },
}

/// Writes the body into `file` from `piece` on, handing each [`SEGMENT`]
/// to `segments` as it is whole, and the last one (committing) at the
/// end; it stops where the spool is full or the passing ended. A body
/// that fails to come is an error, and no commit is handed on.
fn spool_body(
    local: &Local<'_>,
    mut file: &File,
    mut piece: Bytes,
    body: &mut dyn Body,
    segments: std::sync::mpsc::Sender<Segment>,
) -> Result<Spooled, CopyError> {
    let mut spooled = 0u64;
    // Where the next segment begins.
    let mut next = 0u64;
    loop {
        let mut off = 0;
        while off < piece.len() {
            match file.write(&piece[off..]) {
                Ok(n) if n > 0 => {
                    off += n;
                    spooled += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => {
                    let e = r.err().unwrap_or_else(|| io::ErrorKind::WriteZero.into());
                    tracing::warn!(spool = %local.spool.dir.display(), error = %e, "the spool is full; the body goes on in frames");
                    return Ok(Spooled::Partly {
                        spooled,
                        unwritten: piece.slice(off..),
                    });
                }
            }
        }
        if spooled - next >= SEGMENT {
            // The passing ended (what it says decides the rest), or the
            // spool has no room for another segment: the body goes in
            // frames, and the spool grows no more.
            if segments.send((next, spooled - next, false)).is_err()
                || !local.spool.has_room(file, SEGMENT)
            {
                return Ok(Spooled::Partly {
                    spooled,
                    unwritten: Bytes::new(),
                });
            }
            next = spooled;
        }
        match body.next_piece().map_err(local_err)? {
            Some(p) => piece = p,
            None => break,
        }
    }
    if segments.send((next, spooled - next, true)).is_err() {
        return Ok(Spooled::Partly {
            spooled,
            unwritten: Bytes::new(),
        });
    }
    Ok(Spooled::Whole)
}

/// Passes each segment of `file` as a chunk of upload `id`, in order, on
/// one connection, until the commit, a refusal, or the end of the
/// segments.
fn pass(
    local: &Local<'_>,
    file: &File,
    to: &Remote,
    id: &str,
    segments: std::sync::mpsc::Receiver<Segment>,
) -> Result<Passed, CopyError> {
    let mut c = local.client(2 * SEGMENT);
    while let Ok((offset, length, commit)) = segments.recv() {
        let q = Request::FsUploadLocal(FsUploadLocal {
            upload: Some(id.to_string()),
            offset: Some(offset),
            length: Some(length),
            commit,
            ..FsUploadLocal::whole(&to.agent, &to.session, to.scope, &to.path)
        });
        match local.call_on(&mut c, q, file, &to.path)? {
            None => return Ok(Passed::NoFds),
            Some(x) if commit => return Ok(Passed::Done(x)),
            Some(_) => {}
        }
    }
    Ok(Passed::Stopped)
}

/// `from` copied by the daemon into a spooled file, for a `GET` of a file
/// of more than one chunk: the file (at its start) and what the daemon
/// said, or `None` where the file goes in frames (no descriptors taken, no
/// room in the spool, or any other failure: the framed read says what it
/// finds).
pub fn get(local: &Local<'_>, from: &Remote, size: u64) -> Option<(File, FsCopied)> {
    if !local.spool.takes_fds() {
        return None;
    }
    let file = match local.spool.file() {
        Ok(f) if local.spool.has_room(&f, size) => f,
        Ok(_) => return None,
        Err(e) => {
            tracing::warn!(spool = %local.spool.dir.display(), error = %e, "cannot spool a file; it goes in frames");
            return None;
        }
    };
    match local.call(download_local_request(from), &file, size, &from.path) {
        // The daemon may have written through the file's own offset.
        Ok(Some(x)) => match (&file).seek(SeekFrom::Start(0)) {
            Ok(_) => Some((file, x)),
            Err(e) => {
                tracing::warn!(path = %from.path, error = %e, "cannot read the spooled file; it goes in frames");
                None
            }
        },
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(path = %from.path, error = %e, "a GET could not be spooled; it goes in frames");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spool_must_be_a_writable_directory() {
        let dir = tempfile::tempdir().unwrap();
        let s = Spool::new(dir.path()).unwrap();
        assert!(s.takes_fds());
        // Nothing is left in it: the files have no name.
        s.file().unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let f = dir.path().join("f");
        std::fs::write(&f, "x").unwrap();
        let e = Spool::new(&f).unwrap_err().to_string();
        assert!(
            e.contains("not a directory") && e.contains("--spool-dir"),
            "{e}"
        );
        let e = Spool::new(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing"), "{e}");
    }

    #[test]
    fn a_transfer_s_bound_grows_with_its_size() {
        let t = Duration::from_secs(30);
        assert_eq!(bound(t, 0), t);
        assert_eq!(bound(t, 256 << 20), t + Duration::from_secs(32));
    }
}
