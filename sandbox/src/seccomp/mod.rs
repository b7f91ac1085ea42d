//! The seccomp filter of every sandboxed program.
//!
//! What it answers, by system call:
//!
//! - the allowlist ([`allowed`]): Docker's default profile, less
//!   `io_uring` and `process_vm_*`; anything not on it answers `ENOSYS`, so
//!   new kernel system calls are refused by default and C libraries take
//!   their fallbacks (`clone3`, whose flags sit behind a pointer no filter
//!   can read, is not on it: libc then uses `clone`, whose flags it can);
//!   system call numbers with bit 30 set (the x32 ABI, which carries the
//!   x86-64 audit arch) are on no list and answer `ENOSYS` too;
//! - the deny list ([`refused`]): named calls (the mount API old and new,
//!   bpf, perf, keyrings, kexec, modules, open_by_handle_at, setns, reboot,
//!   swap, syslog, io_uring, userfaultfd, kcmp, process_vm_*) and argument
//!   rules (`clone`/`unshare` with `CLONE_NEWUSER`, `socket(AF_VSOCK)`,
//!   `personality` other than the default persona, the TIOCSTI, TIOCLINUX
//!   and Btrfs subvolume ioctls) answer `EPERM`, listed or not;
//! - any architecture but this build's: the process is killed.
//!
//! It is one program, a binary search over ranges of system call numbers
//! ([`tree`]): the kernel's cost to install a filter grows with its length
//! and is paid by every run. Its tests check it answers every number and
//! every argument rule exactly as three linear filters compiled by
//! seccompiler did (the x32 guard, the allowlist, the deny list), and,
//! installed for real, that refused calls never reach the kernel.

mod allowed;
mod refused;
mod tree;

use super::SandboxError;
use seccompiler::BpfProgram;
use tree::Leaf;

pub use refused::{IOCTLS, IOCTLS_AND_CLONES, PERSONALITIES, SYSCALLS as REFUSED};

/// The compiled filter.
pub struct Filters {
    prog: BpfProgram,
}

/// The answer for system call `nr` (the deny list answering `deny`;
/// with `no_reflinks`, the calls that share a file's extents refused too).
fn leaf_of(nr: i64, deny: u32, no_reflinks: bool) -> Leaf {
    if REFUSED.contains(&nr) {
        return Leaf::Errno(deny);
    }
    if no_reflinks && nr == libc::SYS_copy_file_range {
        // What copy_file_range answers where it cannot copy: programs
        // (coreutils among them) then copy the bytes themselves.
        return Leaf::Errno(libc::EXDEV as u32);
    }
    match nr {
        libc::SYS_clone | libc::SYS_unshare => Leaf::DenyAnyBits {
            arg: 0,
            bits: refused::CLONE_NEWUSER as u32,
            deny,
        },
        libc::SYS_socket => Leaf::DenyIn {
            arg: 0,
            values: &[refused::AF_VSOCK],
            deny,
        },
        libc::SYS_personality => Leaf::DenyNotIn {
            arg: 0,
            values: PERSONALITIES,
            deny,
        },
        libc::SYS_ioctl => Leaf::DenyIn {
            arg: 1,
            values: if no_reflinks {
                IOCTLS_AND_CLONES
            } else {
                IOCTLS
            },
            deny,
        },
        _ if allowed::syscalls().any(|a| a == nr) => Leaf::Allow,
        _ => Leaf::Errno(libc::ENOSYS as u32),
    }
}

/// Builds the filters.
pub fn filters() -> Result<Filters, SandboxError> {
    filters_for(false)
}

/// Builds the filters; with `no_reflinks`, sandboxed programs may not share
/// a file's extents (FICLONE, FICLONERANGE and FIDEDUPERANGE answer
/// `EPERM`, copy_file_range `EXDEV`): under a session quota a reflink from
/// the session's unlimited `shared/` brought any number of bytes into its
/// `current/`, which Btrfs does not hold to the quota.
pub fn filters_for(no_reflinks: bool) -> Result<Filters, SandboxError> {
    filters_answering_for(libc::EPERM as u32, no_reflinks)
}

/// The filter, with the deny list answering `errno` (tests use an errno no
/// kernel path gives, to tell the filter's answer from the kernel's).
#[cfg(test)]
fn filters_answering(errno: u32) -> Result<Filters, SandboxError> {
    filters_answering_for(errno, false)
}

fn filters_answering_for(errno: u32, no_reflinks: bool) -> Result<Filters, SandboxError> {
    let max = allowed::syscalls()
        .chain(REFUSED.iter().copied())
        .max()
        .unwrap_or(0);
    let max =
        u32::try_from(max).map_err(|_| SandboxError::Seccomp(format!("system call {max}")))?;
    let prog = tree::compile(
        max,
        |nr| leaf_of(i64::from(nr), errno, no_reflinks),
        Leaf::Errno(libc::ENOSYS as u32),
    );
    if prog.len() >= 4096 {
        return Err(SandboxError::Seccomp(format!(
            "{} instructions: over the kernel's limit",
            prog.len()
        )));
    }
    Ok(Filters { prog })
}

impl Filters {
    /// Installs the filter on the calling thread (sets no_new_privs).
    pub fn apply(&self) -> Result<(), i32> {
        seccompiler::apply_filter(&self.prog).map_err(|_| libc::EPERM)
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests;
