//! The seccomp filters of every sandboxed program.
//!
//! Three filters, installed in this order:
//!
//! 1. the x32 guard: system call numbers with bit 30 set (the x32 ABI, which
//!    carries the x86-64 audit arch) answer `ENOSYS`;
//! 2. the allowlist ([`allowed`]): Docker's default profile, less
//!    `io_uring` and `process_vm_*`; anything not on it answers `ENOSYS`, so
//!    new kernel system calls are refused by default and C libraries take
//!    their fallbacks (`clone3`, whose flags sit behind a pointer no filter
//!    can read, is not on it: libc then uses `clone`, whose flags it can);
//! 3. the deny list ([`refused`]): named calls (the mount API old and new,
//!    bpf, perf, keyrings, kexec, modules, open_by_handle_at, setns, reboot,
//!    swap, syslog, io_uring, userfaultfd, kcmp, process_vm_*) and argument
//!    rules (`clone`/`unshare` with `CLONE_NEWUSER`, `socket(AF_VSOCK)`,
//!    `personality` other than the default persona, the TIOCSTI, TIOCLINUX
//!    and Btrfs subvolume ioctls) answer `EPERM`.
//!
//! The kernel runs every filter, newest first, and keeps the strictest
//! action; between equal actions (two `ERRNO`s) the first one it ran wins,
//! which is the filter installed last. So a call on the deny list answers
//! `EPERM` even though the allowlist, which does not list it, says `ENOSYS`.

mod allowed;
mod refused;

use super::SandboxError;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

pub use refused::{IOCTLS, PERSONALITIES, SYSCALLS as REFUSED};

/// The compiled filters, applied together.
pub struct Filters {
    progs: Vec<BpfProgram>,
}

fn arch() -> TargetArch {
    #[cfg(target_arch = "aarch64")]
    return TargetArch::aarch64;
    #[cfg(not(target_arch = "aarch64"))]
    TargetArch::x86_64
}

fn err(e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Seccomp(e.to_string())
}

fn rule(
    conds: Vec<(u8, SeccompCmpArgLen, SeccompCmpOp, u64)>,
) -> Result<SeccompRule, SandboxError> {
    let conds = conds
        .into_iter()
        .map(|(arg, len, op, v)| SeccompCondition::new(arg, len, op, v).map_err(err))
        .collect::<Result<Vec<_>, _>>()?;
    SeccompRule::new(conds).map_err(err)
}

/// System call numbers with bit 30 set are the x32 ABI: they carry the
/// x86-64 audit arch, so rules on the x86-64 numbers would not see them.
/// All of them answer ENOSYS.
fn x32_guard() -> BpfProgram {
    use seccompiler::sock_filter;
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JGE_K: u16 = 0x35;
    const BPF_RET_K: u16 = 0x06;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    vec![
        // A = seccomp_data.nr
        sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        // if A >= 0x40000000 goto deny else goto allow
        sock_filter {
            code: BPF_JGE_K,
            jt: 1,
            jf: 0,
            k: 0x4000_0000,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: RET_ALLOW,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: RET_ERRNO | libc::ENOSYS as u32,
        },
    ]
}

/// The allowlist: listed calls pass, everything else is `ENOSYS`.
fn allowlist() -> Result<BpfProgram, SandboxError> {
    let rules: BTreeMap<i64, Vec<SeccompRule>> =
        allowed::syscalls().map(|nr| (nr, vec![])).collect();
    SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::ENOSYS as u32),
        SeccompAction::Allow,
        arch(),
    )
    .map_err(err)?
    .try_into()
    .map_err(err)
}

/// The deny list: named calls and argument rules answer `errno`.
fn denylist(errno: u32) -> Result<BpfProgram, SandboxError> {
    use SeccompCmpArgLen::{Dword, Qword};
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        refused::SYSCALLS.iter().map(|&nr| (nr, vec![])).collect();
    let newuser = |arg| {
        rule(vec![(
            arg,
            Qword,
            SeccompCmpOp::MaskedEq(refused::CLONE_NEWUSER),
            refused::CLONE_NEWUSER,
        )])
    };
    rules.insert(libc::SYS_unshare, vec![newuser(0)?]);
    rules.insert(libc::SYS_clone, vec![newuser(0)?]);
    rules.insert(
        libc::SYS_socket,
        vec![rule(vec![(0, Dword, SeccompCmpOp::Eq, refused::AF_VSOCK)])?],
    );
    // One rule whose conditions all hold: the value is none of the allowed.
    let other_persona = refused::PERSONALITIES
        .iter()
        .map(|&p| (0, Dword, SeccompCmpOp::Ne, p))
        .collect();
    rules.insert(libc::SYS_personality, vec![rule(other_persona)?]);
    let ioctls = refused::IOCTLS
        .iter()
        .map(|&cmd| rule(vec![(1, Dword, SeccompCmpOp::Eq, cmd)]))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_ioctl, ioctls);
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno),
        arch(),
    )
    .map_err(err)?
    .try_into()
    .map_err(err)
}

/// Builds the filters.
pub fn filters() -> Result<Filters, SandboxError> {
    filters_answering(libc::EPERM as u32)
}

/// The filters, with the deny list answering `errno` (tests use an errno no
/// kernel path gives, to tell the filter's answer from the kernel's).
fn filters_answering(errno: u32) -> Result<Filters, SandboxError> {
    // The deny list last: its EPERM wins over the allowlist's ENOSYS.
    let progs = vec![x32_guard(), allowlist()?, denylist(errno)?];
    Ok(Filters { progs })
}

impl Filters {
    /// Installs the filters on the calling thread (sets no_new_privs).
    pub fn apply(&self) -> Result<(), i32> {
        for p in &self.progs {
            seccompiler::apply_filter(p).map_err(|_| libc::EPERM)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests;
