//! `fs.upload_local` and `fs.download_local`: a client on this machine
//! passes an open file with its request and the daemon moves the bytes
//! between it and the session's file itself — a reflink where both are on
//! one Btrfs, else `copy_file_range`, else `sendfile` — never through the
//! frame codec.
//!
//! The passed descriptor carries the client's own access: it is used only
//! as it was opened (read from for an upload, written to for a download),
//! and must be a regular file. The session's side is what `fs.write` and
//! `fs.read` use: resolved below the scope without following links, an
//! upload written to a new file beside the target (the sandbox user's
//! before it has a name) and renamed into place under the session's
//! writer guard, so the target is the old file or the whole new one.

use super::{replace, FilesError, Root};
use allox_protocol::CopiedBy;
use rustix::fd::OwnedFd;
use rustix::fs::{FileType, OFlags};
use rustix::io::Errno;

/// Why a passed descriptor cannot be used.
pub(super) fn refused(why: String) -> FilesError {
    FilesError::Descriptor { why }
}

/// What a request needs its descriptor for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Use {
    /// Read from (an upload's source).
    Read,
    /// Written to (a download's target).
    Write,
}

/// The descriptor that came with the request, checked for `use_`.
pub(super) fn passed(action: &'static str, use_: Use) -> Result<OwnedFd, FilesError> {
    let fd = crate::passed::take().ok_or(FilesError::NoDescriptor { action })?;
    let flags =
        rustix::fs::fcntl_getfl(&fd).map_err(|e| refused(format!("cannot read its flags: {e}")))?;
    if flags.contains(OFlags::PATH) {
        return Err(refused(
            "it is open with O_PATH, for no reading or writing".into(),
        ));
    }
    let mode = flags & OFlags::RWMODE;
    match use_ {
        Use::Read if mode == OFlags::WRONLY => {
            return Err(refused(
                "it is open for writing only; open the file to read it".into(),
            ))
        }
        Use::Write if mode == OFlags::RDONLY => {
            return Err(refused(
                "it is open for reading only; open the file to write it".into(),
            ))
        }
        Use::Write if flags.contains(OFlags::APPEND) => {
            return Err(refused(
                "it is open to append; open it without O_APPEND".into(),
            ))
        }
        _ => {}
    }
    let st = rustix::fs::fstat(&fd).map_err(|e| refused(format!("cannot stat it: {e}")))?;
    if !FileType::from_raw_mode(st.st_mode).is_file() {
        return Err(refused("it is not a regular file".into()));
    }
    Ok(fd)
}

/// Copies all of `src`, from its start, to `dst` from its start; `dst`
/// is empty. Only `src`'s data is copied, extent by extent (`SEEK_DATA`,
/// `SEEK_HOLE`): its holes stay holes, so a sparse file stays sparse.
/// Returns the size `dst` is left with and how its bytes moved.
///
/// Without `share` nothing shares extents with `src`: no reflink, no
/// `copy_file_range` (which reflinks on one Btrfs), `sendfile` only — for
/// a copy into a session held to a quota, which a clone would pass.
pub(super) fn copy_whole(
    src: &OwnedFd,
    dst: &OwnedFd,
    shown: &str,
    share: bool,
) -> Result<(u64, CopiedBy), FilesError> {
    use rustix::fs::SeekFrom;
    let size = rustix::fs::fstat(src)
        .map_err(|e| FilesError::from_errno("stat", shown, e))?
        .st_size as u64;
    if share && rustix::fs::ioctl_ficlone(dst, src).is_ok() {
        return Ok((size, CopiedBy::Reflink));
    }
    let mut by = None;
    let mut at = 0u64;
    loop {
        let data = match rustix::fs::seek(src, SeekFrom::Data(at)) {
            Ok(d) => d,
            // No data from `at` on: the rest is a hole.
            Err(Errno::NXIO) => break,
            // A file that cannot tell its holes: all data.
            Err(Errno::INVAL | Errno::OPNOTSUPP) => at,
            Err(e) => return Err(FilesError::from_errno("seek", shown, e)),
        };
        let hole = match rustix::fs::seek(src, SeekFrom::Hole(data)) {
            Ok(h) => Some(h),
            Err(Errno::NXIO | Errno::INVAL | Errno::OPNOTSUPP) => None,
            Err(e) => return Err(FilesError::from_errno("seek", shown, e)),
        };
        let (end, how) = copy_extent(src, dst, data, hole, shown, share)?;
        if by != Some(CopiedBy::Sendfile) {
            by = Some(how);
        }
        at = end;
        // The end of the file (to EOF without a hole, or an extent that
        // ended short: the file was cut meanwhile).
        if hole.is_none_or(|h| end < h) {
            break;
        }
    }
    // A file that ends in a hole ends where its size says.
    let size = rustix::fs::fstat(src)
        .map_err(|e| FilesError::from_errno("stat", shown, e))?
        .st_size as u64;
    let size = size.max(at);
    // No data at all: how the kernel would have moved it, asked at its
    // end (so nothing is copied).
    let by = match by {
        Some(by) => by,
        None => copy_extent(src, dst, size, None, shown, share)?.1,
    };
    rustix::fs::ftruncate(dst, size).map_err(|e| FilesError::from_errno("resize", shown, e))?;
    Ok((size, by))
}

/// The most bytes one call copies: a copy whose client went away stops
/// within one step (a download went on writing gigabytes into the file of
/// a client that was gone).
const STEP: usize = 64 << 20;

/// Refuses to go on with a copy whose client has gone.
fn gone(shown: &str) -> Result<(), FilesError> {
    if crate::passed::client_gone() {
        return Err(FilesError::ClientGone { path: shown.into() });
    }
    Ok(())
}

/// `src`'s bytes from `from` to `until` (`None`: to its end; fewer if it
/// ends first) to the same offsets of `dst`: `copy_file_range`, else
/// `sendfile`. Where it stopped, and how.
fn copy_extent(
    src: &OwnedFd,
    dst: &OwnedFd,
    mut from: u64,
    until: Option<u64>,
    shown: &str,
    share: bool,
) -> Result<(u64, CopiedBy), FilesError> {
    let want = |from: u64| {
        until.map_or(STEP, |u| {
            usize::try_from(u - from).unwrap_or(usize::MAX).min(STEP)
        })
    };
    let mut to = from;
    while share && until.is_none_or(|u| from < u) {
        let n = want(from);
        gone(shown)?;
        match rustix::fs::copy_file_range(src, Some(&mut from), dst, Some(&mut to), n) {
            Ok(0) => return Ok((from, CopiedBy::CopyFileRange)),
            Ok(_) | Err(Errno::INTR) => {}
            // Filesystems (or pairs of them) the kernel does not copy
            // between: sendfile, from where it stopped.
            Err(Errno::XDEV | Errno::INVAL | Errno::OPNOTSUPP | Errno::NOSYS) => break,
            Err(e) => return Err(FilesError::from_errno("copy", shown, e)),
        }
    }
    if share && until.is_some_and(|u| from >= u) {
        return Ok((from, CopiedBy::CopyFileRange));
    }
    rustix::fs::seek(dst, rustix::fs::SeekFrom::Start(from))
        .map_err(|e| FilesError::from_errno("seek", shown, e))?;
    while until.is_none_or(|u| from < u) {
        let n = want(from);
        gone(shown)?;
        match rustix::fs::sendfile(dst, src, Some(&mut from), n) {
            Ok(0) => break,
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(FilesError::from_errno("copy", shown, e)),
        }
    }
    Ok((from, CopiedBy::Sendfile))
}

/// `length` bytes (`None`: to its end) of `src` from `offset` written at
/// the same offset of `dst`: `copy_file_range` (a reflink where the
/// kernel can), else `sendfile`. A passed file shorter than `length` is
/// refused. Returns the bytes copied and how.
pub(super) fn copy_range(
    src: &OwnedFd,
    dst: &OwnedFd,
    offset: u64,
    length: Option<u64>,
    shown: &str,
    share: bool,
) -> Result<(u64, CopiedBy), FilesError> {
    let end = match length {
        Some(n) => offset.checked_add(n).ok_or_else(|| {
            refused(format!(
                "offset {offset} and length {n} go past the largest file"
            ))
        })?,
        None => {
            rustix::fs::fstat(src)
                .map_err(|e| FilesError::from_errno("stat", shown, e))?
                .st_size as u64
        }
    };
    let short = |at: u64| {
        refused(format!(
            "it ends at {at} bytes, short of the chunk's end at {end}"
        ))
    };
    let (mut from, mut to) = (offset, offset);
    while share && from < end {
        let want = usize::try_from(end - from).unwrap_or(usize::MAX).min(STEP);
        gone(shown)?;
        match rustix::fs::copy_file_range(src, Some(&mut from), dst, Some(&mut to), want) {
            Ok(0) => return Err(short(from)),
            Ok(_) | Err(Errno::INTR) => {}
            Err(Errno::XDEV | Errno::INVAL | Errno::OPNOTSUPP | Errno::NOSYS) => break,
            Err(e) => return Err(FilesError::from_errno("copy", shown, e)),
        }
    }
    if share && from == end {
        return Ok((end - offset, CopiedBy::CopyFileRange));
    }
    rustix::fs::seek(dst, rustix::fs::SeekFrom::Start(from))
        .map_err(|e| FilesError::from_errno("seek", shown, e))?;
    while from < end {
        let want = usize::try_from(end - from).unwrap_or(usize::MAX).min(STEP);
        gone(shown)?;
        match rustix::fs::sendfile(dst, src, Some(&mut from), want) {
            Ok(0) => return Err(short(from)),
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(FilesError::from_errno("copy", shown, e)),
        }
    }
    Ok((end - offset, CopiedBy::Sendfile))
}

/// The whole file `name` in `parent` becomes the passed file's bytes
/// (sharing their extents only with `share`: see [`copy_whole`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn upload(
    parent: &OwnedFd,
    name: &str,
    rel: &super::path::Rel<'_>,
    src: &OwnedFd,
    create: bool,
    owner: Option<(u32, u32)>,
    before_commit: &dyn Fn(),
    share: bool,
) -> Result<(u64, CopiedBy), FilesError> {
    let by = std::cell::Cell::new(CopiedBy::default());
    let fill = |fd: &OwnedFd| {
        let (n, how) = copy_whole(src, fd, rel.shown, share)?;
        if crate::passed::client_gone() {
            return Err(FilesError::ClientGone {
                path: rel.shown.into(),
            });
        }
        by.set(how);
        Ok(n)
    };
    let size = replace(parent, name, rel, &fill, create, owner, before_commit)?;
    Ok((size, by.get()))
}

/// The regular file at `rel` below `root` into `dst`, which is cut to its
/// size.
pub(super) fn download(
    root: &Root,
    rel: &super::path::Rel<'_>,
    dst: &OwnedFd,
) -> Result<(u64, CopiedBy), FilesError> {
    // Non-blocking: a FIFO must not hold the request.
    let src = root.open(rel, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY)?;
    let st = rustix::fs::fstat(&src).map_err(|e| FilesError::from_errno("stat", rel.shown, e))?;
    if !FileType::from_raw_mode(st.st_mode).is_file() {
        return Err(FilesError::NotA {
            path: rel.shown.into(),
            what: "a regular file",
        });
    }
    rustix::fs::ftruncate(dst, 0).map_err(|e| refused(format!("cannot empty it: {e}")))?;
    // Out of the session, into the client's file: a clone there is the
    // client's to have.
    let (n, by) = copy_whole(&src, dst, rel.shown, true)?;
    rustix::fs::ftruncate(dst, n).map_err(|e| refused(format!("cannot cut it: {e}")))?;
    Ok((n, by))
}
