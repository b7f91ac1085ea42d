//! Room the store keeps for its own files in `state/` — the index (with
//! the journal), the audit log, the tracker's events — so that they go on
//! working when an agent has filled the filesystem.
//!
//! Each file is `NOCOW` (`chattr +C`): Btrfs rewrites its blocks in place
//! instead of copying them, so overwriting a page of the index needs no
//! free space. And each keeps some room ([`room_for`]: 1/256 of the
//! filesystem, from 1 to 16 MiB) allocated past its end
//! (`fallocate(FALLOC_FL_KEEP_SIZE)`), filled from the start with the
//! file's holes, so appending to the audit log or growing the index writes
//! into blocks it already owns. Btrfs takes such writes even when it has no
//! free data space left (`btrfs_check_nocow_lock`), and nothing an agent
//! does can take those blocks away: they belong to the file.
//!
//! What this costs: Btrfs keeps no checksums of a NOCOW file's data (the
//! audit log checksums each record; redb checksums its pages) and never
//! compresses it. What it does not cover: the metadata space (inodes,
//! directory entries) every write also touches, which Btrfs keeps apart
//! and agents fill far more slowly; and growth past the room while the disk
//! is full.
//!
//! Every step is best effort: a file that cannot be prepared (the disk is
//! already full, the filesystem is not Btrfs) is used as it is, and the
//! failure is logged.

use rustix::fs::{self as rfs, FallocateFlags, IFlags};
use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// An empty file in `state/` with room allocated past its end, given up
/// (truncated, which frees the room) when one of the daemon's small state
/// files (the share plugin's choices, the vault's secrets, the kept cgroup
/// root) cannot be written for want of space, so that a host's decision
/// is kept on a disk an agent filled. The store tops it up with the
/// others once there is space again.
pub const SPARE_ROOM_FILE: &str = ".spare-room";

/// The room [`SPARE_ROOM_FILE`] keeps: many times what the small state
/// files need at once.
pub const SPARE_ROOM_BYTES: u64 = 1 << 20;

/// Most bytes a state file keeps allocated past its end.
pub const MAX_ROOM: u64 = 16 << 20;

/// The room each state file keeps on the filesystem `dir` is on: 1/256 of
/// its size, at least 1 MiB and at most [`MAX_ROOM`] (16 MiB from a 4 GiB
/// filesystem up; 8 MiB on the 2 GiB store the guest is usually given).
pub fn room_for(dir: &Path) -> u64 {
    let size = rfs::statvfs(dir)
        .map(|st| st.f_blocks.saturating_mul(st.f_frsize))
        .unwrap_or(0);
    (size / 256).clamp(1 << 20, MAX_ROOM)
}

/// Makes `path` a NOCOW file before it is first opened: an absent or empty
/// file gets the flag directly (Btrfs accepts it only on empty files); an
/// existing one without it is copied into a new NOCOW file that then
/// replaces it (once per store; the copy is synced before the rename, so a
/// crash leaves either file whole). Then the room is allocated.
pub fn prepare(path: &Path, room: u64) {
    if let Err(e) = prepare_inner(path, room) {
        tracing::warn!(
            error = %e, path = %path.display(),
            "cannot keep room for this state file; it will work as long as the filesystem has space"
        );
    }
}

fn prepare_inner(path: &Path, room: u64) -> io::Result<()> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let flags = rfs::ioctl_getflags(&f)?;
    if !flags.contains(IFlags::NOCOW) {
        if f.metadata()?.len() == 0 {
            rfs::ioctl_setflags(&f, flags | IFlags::NOCOW)?;
        } else {
            drop(f);
            copy_to_nocow(path, room)?;
            tracing::info!(path = %path.display(), "state file rewritten without copy-on-write");
        }
    }
    top_up(path, room)?;
    Ok(())
}

fn copy_to_nocow(path: &Path, room: u64) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let tmp = dir.join(format!(".{}.nocow", name.to_string_lossy()));
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut out = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        let flags = rfs::ioctl_getflags(&out)?;
        rfs::ioctl_setflags(&out, flags | IFlags::NOCOW)?;
        let mut src = File::open(path)?;
        let len = src.metadata()?.len();
        rfs::fallocate(&out, FallocateFlags::KEEP_SIZE, 0, len + room)?;
        io::copy(&mut src, &mut out)?;
        out.sync_all()?;
        std::fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Makes `path` a new, empty state file with its room allocated
/// ([`room_for`] its directory; `NOCOW` where the filesystem has it), to
/// take a rotated file's place: an error when the room cannot be had (the
/// disk is full), so that the caller keeps the file it has, with its room,
/// rather than begin one with none.
pub fn make_with_room(path: &Path) -> io::Result<File> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let _ = std::fs::remove_file(path);
    let f = OpenOptions::new()
        .read(true)
        .append(true)
        .create_new(true)
        .open(path)?;
    rfs::fchmod(&f, rfs::Mode::from_raw_mode(0o600))?;
    if let Ok(flags) = rfs::ioctl_getflags(&f) {
        let _ = rfs::ioctl_setflags(&f, flags | IFlags::NOCOW);
    }
    match rfs::fallocate(&f, FallocateFlags::KEEP_SIZE, 0, room_for(dir)) {
        Ok(()) => Ok(f),
        // A filesystem that cannot allocate ahead: the file as it is.
        Err(e) if e == rustix::io::Errno::OPNOTSUPP => Ok(f),
        Err(e) => {
            drop(f);
            let _ = std::fs::remove_file(path);
            Err(e.into())
        }
    }
}

/// Rotates the state file `path` (open as `file`) to `to`: a new file
/// with its room ([`make_with_room`], as `.NAME.next`) first, then the old
/// one (synced) renamed `to` and the new one renamed in. Returns the new
/// file; on an error the old one stays where it was, still in use.
pub fn rotate_with_room(path: &Path, to: &Path, file: &File) -> io::Result<File> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let next = path.with_file_name(format!(".{name}.next"));
    let new = make_with_room(&next)?;
    let moved = file.sync_data().and_then(|()| std::fs::rename(path, to));
    if let Err(e) = moved {
        let _ = std::fs::remove_file(&next);
        return Err(e);
    }
    std::fs::rename(&next, path)?;
    Ok(new)
}

/// Gives up the spare room kept in `dir` ([`SPARE_ROOM_FILE`]), committing
/// the filesystem so that its blocks are free at once: whether there was
/// any to give.
pub fn give_up_spare_room(dir: &Path) -> bool {
    let path = dir.join(SPARE_ROOM_FILE);
    let Ok(f) = OpenOptions::new().write(true).open(&path) else {
        return false;
    };
    let had = rfs::fstat(&f).is_ok_and(|st| st.st_blocks > 0);
    if !had || f.set_len(0).is_err() {
        return false;
    }
    // Btrfs frees a truncated file's blocks when its transaction commits.
    let _ = rfs::syncfs(&f);
    tracing::warn!(
        path = %path.display(),
        "the filesystem is full: the spare room kept for the daemon's state files was given up; it is taken again once there is space"
    );
    true
}

/// Allocates the file's holes and `room` bytes past its end, unless at
/// least half of that room is still there. Fails (changing nothing) when
/// the filesystem has no space for it. Returns whether it allocated.
pub fn top_up(path: &Path, room: u64) -> io::Result<bool> {
    let f = OpenOptions::new().write(true).open(path)?;
    let st = rfs::fstat(&f)?;
    let (len, allocated) = (st.st_size as u64, st.st_blocks as u64 * 512);
    if allocated >= len + room / 2 {
        return Ok(false);
    }
    rfs::fallocate(&f, FallocateFlags::KEEP_SIZE, 0, len + room)?;
    Ok(true)
}
