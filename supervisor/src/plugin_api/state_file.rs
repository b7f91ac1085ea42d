//! Small files in `state/` (the plugins' entry points, the share
//! plugin's choices, the vault's secrets, the daemon's kept cgroup root),
//! each written whole, or not at all: lent to plugins with the rest of
//! the API.

use allox_protocol::ErrorCode;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// Writes `bytes` to `path` (mode `mode`; its directory made, 0700, if it
/// is missing): aside as `.NAME.new`, synced, renamed in, the directory
/// synced. A failure (a full disk) leaves what was there, and nothing
/// half-written beside it.
///
/// When the disk is full, the spare room the store keeps in `state/`
/// ([`allox_store::reserve::SPARE_ROOM_FILE`]) is given up and the write
/// tried once more: a host's choice is kept on a disk an agent filled.
pub fn write(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    match write_once(path, bytes, mode) {
        Err(e) if is_full(&e) && give_up_spare_room(path) => write_once(path, bytes, mode),
        r => r,
    }
}

/// [`write`] for a choice a sandbox made (an agent's own `allox share
/// disable`): it may not spend the spare room, which an agent that keeps
/// the disk full would spend before the host's choice came.
pub fn write_without_spare(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    write_once(path, bytes, mode)
}

/// Gives up the spare room of the nearest of `path`'s directories that
/// keeps one (`state/`, above the vault's and the plugins' folders).
fn give_up_spare_room(path: &Path) -> bool {
    path.ancestors()
        .skip(1)
        .take(6)
        .find(|d| d.join(allox_store::reserve::SPARE_ROOM_FILE).exists())
        .is_some_and(allox_store::reserve::give_up_spare_room)
}

fn write_once(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(
        ".{}.new",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file")
    ));
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    std::fs::File::open(dir)?.sync_all()
}

/// Whether `e` is a want of room: the disk or the quota is full.
pub fn is_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// The code of a state file that could not be written: `unavailable` for
/// a full disk or quota (free space and retry), else `internal`.
pub fn error_code(e: &std::io::Error) -> ErrorCode {
    if is_full(e) {
        ErrorCode::Unavailable
    } else {
        ErrorCode::Internal
    }
}
