//! The system calls refused by name, and the argument rules, answered with
//! `EPERM` (see the module above for why that filter is installed last).

/// `open_tree_attr` (Linux 6.15): newer than the libc crate's tables; the
/// generic table's number, the same on every architecture.
const SYS_OPEN_TREE_ATTR: i64 = 467;

/// Refused whatever their arguments.
pub const SYSCALLS: &[i64] = &[
    // Mounting, old and new API: the sandbox's view of the files is fixed.
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_open_tree,
    SYS_OPEN_TREE_ATTR,
    libc::SYS_move_mount,
    libc::SYS_mount_setattr,
    // Kernel programs, kernel keyrings, kernel images and modules.
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
    // Escapes from the file or namespace view.
    libc::SYS_open_by_handle_at,
    libc::SYS_setns,
    // The machine's state.
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_syslog,
    // Large kernel surfaces behind most recent local privilege escalations.
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_userfaultfd,
    // Reading other processes' memory and descriptors; ptrace stays (for
    // debuggers) and checks the same permissions.
    libc::SYS_kcmp,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
];

/// `clone` and `unshare` with this flag: no user namespaces, the usual
/// first step of a kernel exploit from an unprivileged user.
pub const CLONE_NEWUSER: u64 = 0x1000_0000;

/// `socket` in this family: in a VM, AF_VSOCK reaches the host directly.
pub const AF_VSOCK: u64 = 40;

/// The only `personality` values allowed; compared on the low 32 bits, as
/// the kernel reads its argument: `PER_LINUX` (the default persona),
/// `0xffffffff` (only asks for the current one), `PER_LINUX32` (`uname`
/// says i686, for `linux32` builds; Docker allows it too) and
/// `ADDR_NO_RANDOMIZE` with either (address-space randomisation off for the
/// caller's next program: what gdb and `setarch -R` ask for; Docker refuses
/// it, but here it only weakens the agent's own programs, since
/// no_new_privs and the kernel drop it on any exec that would gain
/// privilege). Refused: chiefly `READ_IMPLIES_EXEC` (every readable mapping
/// executable), and `UNAME26` (0x20000, which Docker allows for old
/// binaries and which once leaked kernel memory through `uname`).
pub const PERSONALITIES: &[u64] = &[0, 0x8, 0x4_0000, 0x4_0008, 0xffff_ffff];

/// ioctls refused on any descriptor, compared on the low 32 bits (the
/// kernel's `unsigned int cmd`), so setting high bits does not get past.
pub const IOCTLS: &[u64] = &[
    0x5412, // TIOCSTI: type into the terminal of whoever reads it
    0x541C, // TIOCLINUX: the same, and console memory
    // Btrfs: create, delete or change subvolumes and snapshots.
    0x5000_9401, // SNAP_CREATE
    0x5000_940E, // SUBVOL_CREATE
    0x5000_940F, // SNAP_DESTROY
    0x5000_9417, // SNAP_CREATE_V2
    0x5000_9418, // SUBVOL_CREATE_V2
    0x4008_941A, // SUBVOL_SETFLAGS
    0x4008_9413, // DEFAULT_SUBVOL
    0x5000_943F, // SNAP_DESTROY_V2
];

/// [`IOCTLS`], and those that share a file's extents with another file
/// (refused under a session quota: see [`super::filters_for`]).
pub const IOCTLS_AND_CLONES: &[u64] = &[
    0x5412,
    0x541C,
    0x5000_9401,
    0x5000_940E,
    0x5000_940F,
    0x5000_9417,
    0x5000_9418,
    0x4008_941A,
    0x4008_9413,
    0x5000_943F,
    0x4004_9409, // FICLONE (BTRFS_IOC_CLONE)
    0x4020_940D, // FICLONERANGE (BTRFS_IOC_CLONE_RANGE)
    0xC018_9436, // FIDEDUPERANGE
];
