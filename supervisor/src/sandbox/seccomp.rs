//! The seccomp filter of every sandboxed program.
//!
//! Refused with `EPERM`: mount, umount2, pivot_root, bpf, perf_event_open,
//! the keyctl family, kexec, module loading, open_by_handle_at, setns,
//! unshare and clone asking for a new user namespace, reboot, swapon and
//! swapoff, and the ioctls TIOCSTI and TIOCLINUX (compared on the low 32
//! bits, as the kernel reads the command, so setting high bits does not get
//! past the filter) and the Btrfs subvolume and snapshot ioctls.
//! `clone3` answers `ENOSYS`: its flags are behind a pointer the filter
//! cannot read, and C libraries fall back to `clone`, whose flags it can.
//! ptrace stays allowed: a sandbox sees only its own processes.

use super::SandboxError;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

const CLONE_NEWUSER: u64 = 0x1000_0000;
const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;

/// Btrfs ioctls that create, delete or change subvolumes and snapshots.
pub const BTRFS_SUBVOLUME_IOCTLS: &[u64] = &[
    0x5000_9401, // SNAP_CREATE
    0x5000_940E, // SUBVOL_CREATE
    0x5000_940F, // SNAP_DESTROY
    0x5000_9417, // SNAP_CREATE_V2
    0x5000_9418, // SUBVOL_CREATE_V2
    0x4008_941A, // SUBVOL_SETFLAGS
    0x4008_9413, // DEFAULT_SUBVOL
    0x5000_943F, // SNAP_DESTROY_V2
];

/// Syscalls refused outright.
pub const REFUSED: &[i64] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_open_by_handle_at,
    libc::SYS_setns,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
];

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

fn cond(
    arg: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    v: u64,
) -> Result<SeccompCondition, SandboxError> {
    SeccompCondition::new(arg, len, op, v).map_err(err)
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

/// Builds the filters.
pub fn filters() -> Result<Filters, SandboxError> {
    let mut refuse: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &nr in REFUSED {
        refuse.insert(nr, vec![]);
    }
    let newuser = |arg| -> Result<SeccompRule, SandboxError> {
        SeccompRule::new(vec![cond(
            arg,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(CLONE_NEWUSER),
            CLONE_NEWUSER,
        )?])
        .map_err(err)
    };
    refuse.insert(libc::SYS_unshare, vec![newuser(0)?]);
    refuse.insert(libc::SYS_clone, vec![newuser(0)?]);
    let mut ioctls = Vec::new();
    for &cmd in [TIOCSTI, TIOCLINUX].iter().chain(BTRFS_SUBVOLUME_IOCTLS) {
        ioctls.push(
            SeccompRule::new(vec![cond(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                cmd,
            )?])
            .map_err(err)?,
        );
    }
    refuse.insert(libc::SYS_ioctl, ioctls);
    let main = SeccompFilter::new(
        refuse,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch(),
    )
    .map_err(err)?;
    let mut nosys: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    nosys.insert(libc::SYS_clone3, vec![]);
    let clone3 = SeccompFilter::new(
        nosys,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch(),
    )
    .map_err(err)?;
    let progs = vec![
        x32_guard(),
        main.try_into().map_err(err)?,
        clone3.try_into().map_err(err)?,
    ];
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
mod tests {
    #[test]
    fn filters_compile() {
        let f = super::filters().unwrap();
        assert_eq!(f.progs.len(), 3);
        assert!(f.progs.iter().all(|p| !p.is_empty()));
    }
}
