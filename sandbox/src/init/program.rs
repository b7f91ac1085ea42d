//! The program's process, started by a run's PID 1.
//!
//! It is cloned sharing PID 1's memory (`CLONE_VM | CLONE_VFORK`, as
//! `posix_spawn` does), on a stack of its own, and PID 1 waits until it has
//! exec'd or failed. A fork would copy PID 1's page tables and then fault
//! in a copy of every page either side writes before the exec; on a
//! virtual machine whose page table updates go through the hypervisor,
//! that was a fifth of a run's cost (`docs/benchmarks.md`).
//!
//! Sharing the memory sets the rules of the child's code: everything it
//! uses is made before the clone ([`Program::new`]); it frees nothing of
//! PID 1's (it only reads [`Program`], and writes its one atomic); it
//! makes system calls that act on itself (credentials, capabilities,
//! seccomp, signal dispositions and the descriptor table are each the
//! child's own, as none of `CLONE_THREAD`, `CLONE_SIGHAND` or
//! `CLONE_FILES` is given); and it leaves by `execve` or `_exit`, never by
//! a return or an unwinding that would run PID 1's destructors or
//! `atexit` handlers. Signals are blocked in PID 1 around the clone, so
//! that no handler of PID 1's runs in the child before it has reset them.

use crate::seccomp;
use crate::spec::SandboxSpec;
use crate::sys;
use std::ffi::{c_int, c_void, CString};
use std::sync::atomic::{AtomicI32, Ordering};

/// The size of the child's stack: its set-up is a few calls deep.
const STACK: usize = 256 << 10;

/// The child's stack, a mapping of its own: no page of it is touched
/// before the child uses it (memory from the heap might be zeroed there
/// first, each page written a copy of one PID 1 shares with the context).
struct Stack(*mut c_void);

impl Stack {
    fn new() -> Option<Stack> {
        // SAFETY: a new private anonymous mapping, nothing else touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STACK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED).then_some(Stack(p))
    }

    /// Its top, where a stack that grows down starts (16-byte aligned).
    fn top(&self) -> *mut c_void {
        ((self.0 as usize + STACK) & !15) as *mut c_void
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, no longer used (the child has
        // exec'd or exited).
        unsafe {
            libc::munmap(self.0, STACK);
        }
    }
}

/// The program and everything its set-up needs, made before the clone.
pub(super) struct Program<'a> {
    prog: CString,
    /// The strings `argv_p` and `envp_p` point into.
    _strings: (Vec<CString>, Vec<CString>),
    argv_p: Vec<*const libc::c_char>,
    envp_p: Vec<*const libc::c_char>,
    cwd: CString,
    uid: u32,
    gid: u32,
    pty: bool,
    filter: &'a seccomp::Filters,
    /// The errno of the step that failed, written by the child before it
    /// exits; 0 while none has.
    errno: AtomicI32,
}

impl<'a> Program<'a> {
    pub(super) fn new(spec: &SandboxSpec, filter: &'a seccomp::Filters) -> Program<'a> {
        let to_c = |s: &str| CString::new(s).unwrap_or_default();
        let argv: Vec<CString> = spec.argv.iter().map(|a| to_c(a)).collect();
        let envp: Vec<CString> = spec
            .env
            .iter()
            .map(|(k, v)| to_c(&format!("{k}={v}")))
            .collect();
        let nul = |v: &[CString]| {
            v.iter()
                .map(|c| c.as_ptr())
                .chain([std::ptr::null()])
                .collect::<Vec<_>>()
        };
        Program {
            prog: to_c(&spec.program),
            argv_p: nul(&argv),
            envp_p: nul(&envp),
            _strings: (argv, envp),
            cwd: to_c(&spec.cwd),
            uid: spec.uid,
            gid: spec.gid,
            pty: spec.pty.is_some(),
            filter,
            errno: AtomicI32::new(0),
        }
    }

    /// Starts the program and returns once it has exec'd, with its pid,
    /// or once its set-up or exec failed, with its pid and that errno (it
    /// has then exited with 127). `None` if no stack could be mapped for it
    /// or it could not be cloned.
    pub(super) fn start(&self) -> Option<(i32, Option<i32>)> {
        let stack = Stack::new()?;
        // SAFETY: sigfillset and pthread_sigmask on valid sets; the clone
        // runs `child` on `stack`, which outlives it (CLONE_VFORK: this
        // thread resumes only after the child's exec or exit), and `child`
        // keeps to the rules in the module's doc.
        let pid = unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            let pid = libc::clone(
                child,
                stack.top(),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                self as *const Program as *mut c_void,
            );
            if pid > 0 {
                super::CHILD.store(pid, Ordering::SeqCst);
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            pid
        };
        drop(stack);
        if pid <= 0 {
            return None;
        }
        let errno = self.errno.load(Ordering::SeqCst);
        Some((pid, (errno != 0).then_some(errno)))
    }

    /// In the child: becomes the program. Returns only on failure, with
    /// the errno.
    fn become_it(&self) -> i32 {
        let _ = rustix::process::setsid();
        // A terminal run: the terminal on 0 becomes the new session's
        // controlling terminal (job control, ^C, SIGWINCH).
        if self.pty {
            if let Err(e) = rustix::process::ioctl_tiocsctty(rustix::stdio::stdin()) {
                return e.raw_os_error();
            }
        }
        // The program gets 0, 1 and 2 only (kernels before 5.9 lack
        // close_range; there it also gets whatever is not close-on-exec).
        // SAFETY: this process's own descriptor table, none of them used
        // again here.
        unsafe {
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
        }
        if let Err(e) = drop_privileges(self.uid, self.gid) {
            return e;
        }
        // As the unprivileged user: it can only enter what it may enter.
        if let Err(e) = rustix::process::chdir(self.cwd.as_c_str()) {
            return e.raw_os_error();
        }
        if let Err(e) = self.filter.apply() {
            return e;
        }
        reset_signals();
        // SAFETY: null-terminated arrays of C strings that outlive the call
        // (execve only returns on failure).
        unsafe {
            libc::execve(
                self.prog.as_ptr(),
                self.argv_p.as_ptr(),
                self.envp_p.as_ptr(),
            );
        }
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOEXEC)
    }
}

/// The clone's entry point; never returns.
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Program` that `start` passed, alive until this
    // process execs or exits.
    let program = unsafe { &*(arg as *const Program) };
    let errno = program.become_it();
    program.errno.store(
        if errno == 0 { libc::EPERM } else { errno },
        Ordering::SeqCst,
    );
    // SAFETY: leaves without running anything of PID 1's.
    unsafe { libc::_exit(127) }
}

/// The capability sets empty (the bounding set already is: the context
/// emptied it, see `zygote::run`), unprivileged uid/gid, no_new_privs.
fn drop_privileges(uid: u32, gid: u32) -> Result<(), i32> {
    use caps::CapSet;
    let e = |_| libc::EPERM;
    caps::clear(None, CapSet::Ambient).map_err(e)?;
    caps::clear(None, CapSet::Inheritable).map_err(e)?;
    sys::drop_credentials(uid, gid).map_err(|e| e.raw_os_error().unwrap_or(libc::EPERM))?;
    // A switch away from uid 0 clears permitted and effective; make sure.
    caps::clear(None, CapSet::Effective).map_err(e)?;
    caps::clear(None, CapSet::Permitted).map_err(e)?;
    rustix::thread::set_no_new_privs(true).map_err(|e| e.raw_os_error())?;
    Ok(())
}

/// Default dispositions, then an empty signal mask (every signal is
/// blocked until then: PID 1 blocked them around the clone).
fn reset_signals() {
    // SAFETY: this process's own signal state, before its exec.
    unsafe {
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}
