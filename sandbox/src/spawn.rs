//! The two `clone3` calls of the sandbox.
//!
//! * [`spawn_context`]: the supervisor starts a session's context in new
//!   mount, UTS and IPC namespaces (and network, when isolated), directly
//!   in the context's cgroup, then `execveat` of the supervisor's binary as
//!   `allox-init session-context`. The child of `clone3` is a copy of a
//!   multi-threaded process, so between the clone and the exec it does
//!   nothing but `dup2` and `execveat` on values prepared beforehand — no
//!   allocation, no locks.
//! * [`clone_run`]: the (single-threaded) context makes a run's PID 1 in a
//!   new PID, mount and IPC namespace, in the run's cgroup, as a child of
//!   the supervisor (`CLONE_PARENT`).
//!
//! This file, `init.rs` and `sys.rs` are the sandbox's files with `unsafe`.
#![allow(unsafe_code)]

use super::spec::CONTROL_FD;
use super::SandboxError;
use rustix::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ffi::CString;

/// What the supervisor holds of a started sandbox.
pub struct Spawned {
    /// PID of the sandbox init, in the supervisor's PID namespace.
    pub pid: i32,
    pub pidfd: OwnedFd,
    /// The program's standard input, output and error.
    pub io: RunIo,
    /// Read end of the status pipe (the PID 1's [`super::InitStatus`] reports).
    pub status: OwnedFd,
}

/// How the supervisor talks to the program.
pub enum RunIo {
    /// Write end of its stdin, read ends of its stdout and stderr.
    Pipes {
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
    },
    /// Its terminal (its stdin, stdout and stderr are the terminal), whose
    /// master side its PID 1 sends once it runs: [`Terminal::receive`].
    Pty(Terminal),
}

/// Where a terminal run's PID 1 sends its terminal's master side.
pub struct Terminal(pub(crate) OwnedFd);

impl Terminal {
    /// The master side of the run's terminal, or why it could not be had
    /// (the run then reports the failure on its status pipe as well). It
    /// blocks until the run's PID 1 sends it, at most 10 s: a run started
    /// in a frozen cgroup sends nothing before it is thawed, so that is
    /// done first.
    pub fn receive(self) -> Result<OwnedFd, String> {
        use rustix::fd::AsFd;
        let mut buf = Vec::new();
        match super::wire::recv(self.0.as_fd(), &mut buf) {
            Ok(Some(fds)) => fds
                .into_iter()
                .next()
                .ok_or_else(|| "the run sent no terminal".to_string()),
            Ok(None) => Err("the run ended before it had a terminal".to_string()),
            Err(e) => Err(format!("receive the run's terminal: {e}")),
        }
    }
}

const CLONE_PARENT: u64 = 0x0000_8000;
const CLONE_PIDFD: u64 = 0x0000_1000;
const CLONE_NEWNS: u64 = 0x0002_0000;
const CLONE_NEWUTS: u64 = 0x0400_0000;
const CLONE_NEWIPC: u64 = 0x0800_0000;
const CLONE_NEWPID: u64 = 0x2000_0000;
const CLONE_NEWNET: u64 = 0x4000_0000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `clone3` with a pidfd into `cgroup`, fork-like (no new stack). Returns
/// the child's PID in the parent (with the pidfd in `pidfd`), 0 in the
/// child.
///
/// # Safety
/// In a multi-threaded caller the child may only make async-signal-safe
/// calls until it execs or exits.
unsafe fn clone3(
    flags: u64,
    cgroup: Option<BorrowedFd<'_>>,
    pidfd: &mut libc::c_int,
) -> libc::c_long {
    // SAFETY: clone_args is plain integers; all-zero is its "unset" value.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = flags
        | CLONE_PIDFD
        | if cgroup.is_some() {
            CLONE_INTO_CGROUP
        } else {
            0
        };
    args.pidfd = pidfd as *mut libc::c_int as u64;
    // With CLONE_PARENT the child takes the caller's own exit signal, and
    // clone3 wants 0 here.
    args.exit_signal = if flags & CLONE_PARENT == 0 {
        libc::SIGCHLD as u64
    } else {
        0
    };
    if let Some(cg) = cgroup {
        args.cgroup = cg.as_raw_fd() as u64;
    }
    // SAFETY: `args` is a valid clone_args of the size passed; the flags
    // give the child its own copy of memory (no CLONE_VM) and no stack is
    // set, so it continues on a copy of this stack exactly as after fork.
    unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    }
}

/// Starts `allox-init session-context` (`init_exe`, an open handle to the
/// supervisor's own binary) in the cgroup `cgroup`, with `control` as its
/// fd 3. Returns its PID and pidfd.
pub(crate) fn spawn_context(
    init_exe: &OwnedFd,
    cgroup: &OwnedFd,
    control: &OwnedFd,
    isolate_network: bool,
) -> Result<(i32, OwnedFd), SandboxError> {
    let arg0 = CString::new("allox-init").unwrap_or_default();
    let arg1 = CString::new("session-context").unwrap_or_default();
    let empty = CString::default();
    let argv: [*const libc::c_char; 3] = [arg0.as_ptr(), arg1.as_ptr(), std::ptr::null()];
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    // Both at 10 or above: the dup2 to 3 then makes a copy without
    // close-on-exec (a dup2 onto itself would keep the flag), and cannot
    // replace the executable's descriptor (which may be 3 in the caller).
    let init_exe =
        rustix::io::fcntl_dupfd_cloexec(init_exe, 10).map_err(|e| SandboxError::sys("dup", e))?;
    let exe = init_exe.as_raw_fd();
    let control =
        rustix::io::fcntl_dupfd_cloexec(control, 10).map_err(|e| SandboxError::sys("dup", e))?;
    let ctl = control.as_raw_fd();
    let flags =
        CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | if isolate_network { CLONE_NEWNET } else { 0 };
    let mut pidfd: libc::c_int = -1;
    // SAFETY: the child below makes async-signal-safe calls only.
    let pid = unsafe { clone3(flags, Some(rustix::fd::AsFd::as_fd(cgroup)), &mut pidfd) };
    if pid == 0 {
        // In the child. Only async-signal-safe system calls on values
        // prepared above until the exec replaces this process image.
        // SAFETY: dup2, execveat and _exit are async-signal-safe; every
        // pointer refers to memory of this (copied) address space that the
        // parent prepared before the clone and that nothing has freed.
        unsafe {
            if libc::dup2(ctl, CONTROL_FD) < 0 {
                libc::_exit(126);
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
        return Err(SandboxError::sys(
            "clone3 (session context)",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: the kernel stored a new pidfd that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok((pid as i32, pidfd))
}

/// Which side of [`clone_run`] this is.
pub(crate) enum Forked {
    /// The new run's PID 1.
    Child,
    /// The context, with the child's PID and pidfd.
    Parent { pid: i32, pidfd: OwnedFd },
}

/// In a session's context (single-threaded): makes a run's PID 1, a
/// sibling of the context (a child of the supervisor), in new PID, mount
/// and IPC namespaces, inside the run's cgroup — or, for a PID 1 made
/// ahead (`cgroup` None), in the context's own cgroup, which the context
/// moves it out of when a run claims it.
pub(crate) fn clone_run(cgroup: Option<BorrowedFd<'_>>) -> Result<Forked, SandboxError> {
    let mut pidfd: libc::c_int = -1;
    // SAFETY: the context is single-threaded (an exec'd image that starts
    // no thread), so the child may run ordinary code, as after fork.
    let pid = unsafe {
        clone3(
            CLONE_PARENT | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC,
            cgroup,
            &mut pidfd,
        )
    };
    match pid {
        0 => Ok(Forked::Child),
        p if p < 0 => Err(SandboxError::sys(
            "clone3 (run)",
            std::io::Error::last_os_error(),
        )),
        p => Ok(Forked::Parent {
            pid: p as i32,
            // SAFETY: the kernel stored a new pidfd that nothing else owns.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        }),
    }
}
