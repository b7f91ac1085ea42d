//! Starting the sandbox's PID 1: `clone3` into new namespaces and the run's
//! cgroup, then `execveat` of the supervisor's binary.
//!
//! The child of `clone3` is a copy of a multi-threaded process, so between
//! the clone and the exec it does nothing but `dup2` and `execveat` on
//! values prepared beforehand — no allocation, no locks. This file,
//! `init.rs` and `sys.rs` are the sandbox's files with `unsafe`.
#![allow(unsafe_code)]

use super::spec::{SandboxSpec, SPEC_FD, STATUS_FD};
use super::SandboxError;
use rustix::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ffi::CString;
use std::io::Write;

/// What the supervisor holds of a started sandbox.
pub struct Spawned {
    /// PID of the sandbox init, in the supervisor's PID namespace.
    pub pid: i32,
    pub pidfd: OwnedFd,
    /// Write end of the program's standard input.
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// Read end of the status pipe (one [`super::InitStatus`]).
    pub status: OwnedFd,
}

const CLONE_PIDFD: u64 = 0x0000_1000;
const CLONE_NEWNS: u64 = 0x0002_0000;
const CLONE_NEWUTS: u64 = 0x0400_0000;
const CLONE_NEWIPC: u64 = 0x0800_0000;
const CLONE_NEWPID: u64 = 0x2000_0000;
const CLONE_NEWNET: u64 = 0x4000_0000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

fn pipe() -> Result<(OwnedFd, OwnedFd), SandboxError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SandboxError::sys("pipe", e))
}

/// A close-on-exec copy at 10 or above, so that moving it to 0–4 in the
/// child cannot clobber another of the child's descriptors.
fn high(fd: &OwnedFd) -> Result<OwnedFd, SandboxError> {
    rustix::io::fcntl_dupfd_cloexec(fd, 10).map_err(|e| SandboxError::sys("dup", e))
}

/// Starts the sandbox init `init_exe` (an open handle to the supervisor's
/// own binary) in new namespaces inside the cgroup `cgroup`, and hands it
/// `spec`.
pub fn spawn(
    init_exe: &OwnedFd,
    spec: &SandboxSpec,
    cgroup: &OwnedFd,
) -> Result<Spawned, SandboxError> {
    let bytes = postcard::to_stdvec(spec)
        .map_err(|e| SandboxError::sys("encode spec", std::io::Error::other(e)))?;
    let (stdin_r, stdin_w) = pipe()?;
    let (stdout_r, stdout_w) = pipe()?;
    let (stderr_r, stderr_w) = pipe()?;
    let (spec_r, spec_w) = pipe()?;
    let (status_r, status_w) = pipe()?;
    // Child's 0, 1, 2, SPEC_FD, STATUS_FD, in that order.
    let child_fds = [
        high(&stdin_r)?,
        high(&stdout_w)?,
        high(&stderr_w)?,
        high(&spec_r)?,
        high(&status_w)?,
    ];
    debug_assert_eq!(SPEC_FD, 3);
    debug_assert_eq!(STATUS_FD, 4);
    let raw: [i32; 5] = [
        child_fds[0].as_raw_fd(),
        child_fds[1].as_raw_fd(),
        child_fds[2].as_raw_fd(),
        child_fds[3].as_raw_fd(),
        child_fds[4].as_raw_fd(),
    ];
    let arg0 = CString::new("allox-init").unwrap_or_default();
    let arg1 = CString::new("sandbox-init").unwrap_or_default();
    let empty = CString::default();
    let argv: [*const libc::c_char; 3] = [arg0.as_ptr(), arg1.as_ptr(), std::ptr::null()];
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let exe = init_exe.as_raw_fd();

    let mut pidfd: libc::c_int = -1;
    // SAFETY: clone_args is plain integers; all-zero is its "unset" value.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = CLONE_PIDFD
        | CLONE_NEWNS
        | CLONE_NEWUTS
        | CLONE_NEWIPC
        | CLONE_NEWPID
        | CLONE_INTO_CGROUP
        | if spec.isolate_network {
            CLONE_NEWNET
        } else {
            0
        };
    args.pidfd = &mut pidfd as *mut libc::c_int as u64;
    args.exit_signal = libc::SIGCHLD as u64;
    args.cgroup = cgroup.as_raw_fd() as u64;
    // SAFETY: `args` is a valid clone_args of the size passed; the flags
    // give the child its own copy of memory (no CLONE_VM) and no stack is
    // set, so it continues on a copy of this stack exactly as after fork.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    if pid == 0 {
        // In the child. Only async-signal-safe system calls on values
        // prepared above until the exec replaces this process image.
        // SAFETY: dup2, execveat and _exit are async-signal-safe; every
        // pointer refers to memory of this (copied) address space that the
        // parent prepared before the clone and that nothing has freed.
        unsafe {
            for (target, fd) in raw.iter().enumerate() {
                if libc::dup2(*fd, target as libc::c_int) < 0 {
                    libc::_exit(126);
                }
            }
            libc::syscall(
                libc::SYS_execveat,
                exe,
                empty.as_ptr(),
                argv.as_ptr(),
                envp.as_ptr(),
                libc::AT_EMPTY_PATH,
            );
            libc::_exit(126);
        }
    }
    if pid < 0 {
        return Err(SandboxError::sys("clone3", std::io::Error::last_os_error()));
    }
    drop(child_fds);
    drop((stdin_r, stdout_w, stderr_w, spec_r, status_w));
    // SAFETY: the kernel stored a new pidfd that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let mut w = std::fs::File::from(spec_w);
    // The pipe holds 64 KiB; a larger spec is written while the init reads.
    if let Err(e) = w.write_all(&bytes) {
        // The init died before reading it: kill what is left and reap it,
        // so nothing unsupervised or unreaped remains.
        let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
        let _ = rustix::process::waitid(
            rustix::process::WaitId::PidFd(rustix::fd::AsFd::as_fd(&pidfd)),
            rustix::process::WaitIdOptions::EXITED,
        );
        return Err(SandboxError::sys("write spec", e));
    }
    drop(w);
    Ok(Spawned {
        pid: pid as i32,
        pidfd,
        stdin: stdin_w,
        stdout: stdout_r,
        stderr: stderr_r,
        status: status_r,
    })
}
