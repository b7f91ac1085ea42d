//! The raw system calls of the sandbox that rustix does not wrap, and the
//! credential drop, each written once. Used by the sandbox init and by the
//! guest's PID 1 (`lo`).
//!
//! With `spawn.rs` (the `clone3` and what its child does before the exec)
//! and `init.rs` (fork, exec and signal handlers of the sandbox's PID 1),
//! this is one of the three files of the crate with `unsafe` (tests aside).
#![allow(unsafe_code)]

use rustix::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use rustix::process::{Gid, Uid};
use std::ffi::CString;
use std::io;
use std::path::Path;

/// `ip link set lo up`, in this process's network namespace.
pub fn loopback_up() -> io::Result<()> {
    let sock = rustix::net::socket_with(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    let fd = sock.as_raw_fd();
    // SAFETY: an all-zero `ifreq` is valid and its name "lo" stays
    // NUL-terminated; SIOCGIFFLAGS and SIOCSIFFLAGS take a pointer to an
    // `ifreq`, which lives across both calls on an open socket; the first
    // call sets `ifru_flags`, the union field read after it.
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (d, s) in req.ifr_name.iter_mut().zip(b"lo") {
            *d = *s as libc::c_char;
        }
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Leaves root for `uid` and `gid`: no supplementary groups, then the
/// group, then the user (real, effective and saved), each result checked.
///
/// These are the raw system calls, which change the calling thread only
/// (glibc's `setresuid` would change every thread of the process): the
/// callers, the sandbox init and the program it forks, are single-threaded.
pub(crate) fn drop_credentials(uid: u32, gid: u32) -> io::Result<()> {
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    rustix::thread::set_thread_groups(&[])?;
    rustix::thread::set_thread_res_gid(gid, gid, gid)?;
    rustix::thread::set_thread_res_uid(uid, uid, uid)?;
    Ok(())
}

/// `mount_setattr(AT_RECURSIVE)`: read-only, nosuid, nodev on the whole
/// tree at `dst`. Kernels before 5.12 lack it (`ENOSYS`).
pub(crate) fn set_tree_read_only(dst: &Path) -> io::Result<()> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const MOUNT_ATTR_NOSUID: u64 = 0x2;
    const MOUNT_ATTR_NODEV: u64 = 0x4;
    const AT_RECURSIVE: u32 = 0x8000;
    let path = CString::new(dst.as_os_str().as_encoded_bytes())?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: a valid NUL-terminated path and an attribute struct of the
    // size passed, both alive for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Takes ownership of descriptor `fd`, which the process was started with
/// (a session context's control socket).
pub(crate) fn inherited_fd(fd: i32) -> OwnedFd {
    // SAFETY: called once, at the start of a fresh exec, for a descriptor
    // the supervisor placed for this process and nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Takes ownership of descriptor `fd`, named on the command line as one
/// the process was started with: `None` if it is one of the standard
/// three or not open. Call it once per descriptor. It is closed on exec
/// from then on: what the process starts does not inherit it.
pub fn take_inherited_fd(fd: i32) -> Option<OwnedFd> {
    if fd < 3 {
        return None;
    }
    // SAFETY: borrowed only for the call that asks whether it is open.
    rustix::io::fcntl_getfd(unsafe { BorrowedFd::borrow_raw(fd) }).ok()?;
    let fd = inherited_fd(fd);
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC).ok()?;
    Some(fd)
}

/// Closes every descriptor above 2 but those of `keep` (`close_range`
/// over the gaps between them).
pub(crate) fn close_all_above_stdio_except(keep: &[BorrowedFd<'_>]) -> io::Result<()> {
    let kept = keep
        .iter()
        .map(|k| u32::try_from(k.as_raw_fd()))
        .collect::<Result<Vec<u32>, _>>()
        .map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    for (first, last) in gaps(kept) {
        // SAFETY: closes descriptors this process no longer uses: the
        // callers (the program's child before its exec, a run's PID 1
        // after its mounts, a PID 1 made ahead as it starts) never return
        // to the frames that own them, except those kept, left open.
        let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The ranges (first, last) of descriptors from 3 up that are not in
/// `kept`.
fn gaps(mut kept: Vec<u32>) -> Vec<(u32, u32)> {
    kept.sort_unstable();
    kept.dedup();
    let mut first = 3u32;
    let mut out = Vec::with_capacity(kept.len() + 1);
    for k in kept {
        if k >= first {
            if k > first {
                out.push((first, k - 1));
            }
            first = k + 1;
        }
    }
    out.push((first, u32::MAX));
    out
}

/// Points this process's descriptors 0, 1 and 2 at `/dev/null` (best
/// effort): it keeps no end of anyone's pipes, and descriptors it receives
/// later land at 3 and above.
pub fn stdio_to_null() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let _ = rustix::stdio::dup2_stdin(&null);
        let _ = rustix::stdio::dup2_stdout(&null);
        let _ = rustix::stdio::dup2_stderr(&null);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gaps_leave_exactly_the_kept_descriptors_and_stdio() {
        assert_eq!(gaps(vec![]), [(3, u32::MAX)]);
        assert_eq!(gaps(vec![3]), [(4, u32::MAX)]);
        assert_eq!(gaps(vec![9, 5, 5]), [(3, 4), (6, 8), (10, u32::MAX)]);
        assert_eq!(gaps(vec![4, 3, 1]), [(5, u32::MAX)]);
    }

    #[test]
    fn only_an_open_descriptor_above_stdio_is_taken_and_then_closed_on_exec() {
        use std::os::fd::{AsRawFd, IntoRawFd};
        assert!(take_inherited_fd(0).is_none());
        assert!(take_inherited_fd(2).is_none());
        let (r, w) = rustix::pipe::pipe().unwrap();
        let raw = r.into_raw_fd();
        let taken = take_inherited_fd(raw).expect("an open pipe's end is taken");
        assert_eq!(taken.as_raw_fd(), raw);
        assert!(rustix::io::fcntl_getfd(&taken)
            .unwrap()
            .contains(rustix::io::FdFlags::CLOEXEC));
        drop((taken, w));
        // Above any descriptor limit: never open.
        assert!(take_inherited_fd(1 << 30).is_none());
    }

    #[test]
    fn a_path_with_a_nul_is_refused_before_any_call() {
        let e = set_tree_read_only(Path::new("a\0b")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
