//! The system calls the history records (x86-64 numbers), and how their
//! arguments are shown.
//!
//! Recorded: calls that change the machine outside the caller's own
//! process or files it opened — mounts and the root, BPF, kernel modules
//! and kexec, signals and tracing of other processes, namespaces, host
//! name, power, swap, device nodes, the clock, sockets (their family), and
//! the path changers (unlink, rename, mkdir, rmdir, link, symlink, chmod,
//! chown, truncate). Not recorded: reads, writes through a descriptor
//! already open, `open` itself (the `file_open` LSM hook records opens for
//! writing with their full path), `fchmod`/`fchown`/`ftruncate` (the file
//! was opened for writing first), and everything else; those are counted
//! only.

/// How one recorded call is read at `sys_enter` and shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyscallSpec {
    pub nr: u32,
    pub name: &'static str,
    /// The argument copied as the first text (at most 255 bytes), if any.
    pub str1: Option<u8>,
    /// The argument copied as the second text (at most 127 bytes), if any.
    pub str2: Option<u8>,
    /// How many arguments the call takes.
    pub nargs: u8,
}

const fn s(nr: u32, name: &'static str, nargs: u8, str1: i8, str2: i8) -> SyscallSpec {
    SyscallSpec {
        nr,
        name,
        str1: if str1 < 0 { None } else { Some(str1 as u8) },
        str2: if str2 < 0 { None } else { Some(str2 as u8) },
        nargs,
    }
}

/// Every recorded call, x86-64 numbering (arch/x86/entry/syscalls/syscall_64.tbl).
pub const RECORDED: &[SyscallSpec] = &[
    // Mounts and the root.
    s(165, "mount", 5, 1, 2), // target, fstype
    s(166, "umount2", 2, 0, -1),
    s(428, "open_tree", 3, 1, -1),
    s(429, "move_mount", 5, 3, 1), // to, from
    s(430, "fsopen", 2, 0, -1),
    s(431, "fsconfig", 5, 2, -1), // key
    s(432, "fsmount", 3, -1, -1),
    s(442, "mount_setattr", 5, 1, -1),
    s(155, "pivot_root", 2, 0, 1),
    s(161, "chroot", 1, 0, -1),
    // BPF, modules, kexec.
    s(321, "bpf", 3, -1, -1),
    s(175, "init_module", 3, -1, 2), // params
    s(313, "finit_module", 3, -1, 1),
    s(176, "delete_module", 2, 0, -1),
    s(246, "kexec_load", 4, -1, -1),
    s(320, "kexec_file_load", 5, -1, 3),
    // Other processes.
    s(62, "kill", 2, -1, -1),
    s(200, "tkill", 2, -1, -1),
    s(234, "tgkill", 3, -1, -1),
    s(424, "pidfd_send_signal", 4, -1, -1),
    s(101, "ptrace", 4, -1, -1),
    s(311, "process_vm_writev", 6, -1, -1),
    // Namespaces, names, power, swap, devices, sockets, time.
    s(308, "setns", 2, -1, -1),
    s(272, "unshare", 1, -1, -1),
    s(170, "sethostname", 2, 0, -1),
    s(171, "setdomainname", 2, 0, -1),
    s(169, "reboot", 4, -1, -1),
    s(167, "swapon", 2, 0, -1),
    s(168, "swapoff", 1, 0, -1),
    s(133, "mknod", 3, 0, -1),
    s(259, "mknodat", 4, 1, -1),
    s(41, "socket", 3, -1, -1),
    s(164, "settimeofday", 2, -1, -1),
    s(227, "clock_settime", 2, -1, -1),
    s(159, "adjtimex", 1, -1, -1),
    s(305, "clock_adjtime", 2, -1, -1),
    // Paths.
    s(87, "unlink", 1, 0, -1),
    s(263, "unlinkat", 3, 1, -1),
    s(82, "rename", 2, 0, 1),
    s(264, "renameat", 4, 1, 3),
    s(316, "renameat2", 5, 1, 3),
    s(83, "mkdir", 2, 0, -1),
    s(258, "mkdirat", 3, 1, -1),
    s(84, "rmdir", 1, 0, -1),
    s(86, "link", 2, 0, 1),
    s(265, "linkat", 5, 1, 3),
    s(88, "symlink", 2, 1, 0),    // the link, its target
    s(266, "symlinkat", 3, 2, 0), // the link, its target
    s(90, "chmod", 2, 0, -1),
    s(268, "fchmodat", 3, 1, -1),
    s(452, "fchmodat2", 4, 1, -1),
    s(92, "chown", 3, 0, -1),
    s(94, "lchown", 3, 0, -1),
    s(260, "fchownat", 5, 1, -1),
    s(76, "truncate", 2, 0, -1),
];

/// The recorded call numbered `nr`, if it is one.
pub fn recorded(nr: i32) -> Option<&'static SyscallSpec> {
    RECORDED.iter().find(|s| i64::from(s.nr) == i64::from(nr))
}

/// `bpf(2)` commands by number (include/uapi/linux/bpf.h).
pub fn bpf_cmd(cmd: u64) -> Option<&'static str> {
    const CMDS: [&str; 37] = [
        "BPF_MAP_CREATE",
        "BPF_MAP_LOOKUP_ELEM",
        "BPF_MAP_UPDATE_ELEM",
        "BPF_MAP_DELETE_ELEM",
        "BPF_MAP_GET_NEXT_KEY",
        "BPF_PROG_LOAD",
        "BPF_OBJ_PIN",
        "BPF_OBJ_GET",
        "BPF_PROG_ATTACH",
        "BPF_PROG_DETACH",
        "BPF_PROG_TEST_RUN",
        "BPF_PROG_GET_NEXT_ID",
        "BPF_MAP_GET_NEXT_ID",
        "BPF_PROG_GET_FD_BY_ID",
        "BPF_MAP_GET_FD_BY_ID",
        "BPF_OBJ_GET_INFO_BY_FD",
        "BPF_PROG_QUERY",
        "BPF_RAW_TRACEPOINT_OPEN",
        "BPF_BTF_LOAD",
        "BPF_BTF_GET_FD_BY_ID",
        "BPF_TASK_FD_QUERY",
        "BPF_MAP_LOOKUP_AND_DELETE_ELEM",
        "BPF_MAP_FREEZE",
        "BPF_BTF_GET_NEXT_ID",
        "BPF_MAP_LOOKUP_BATCH",
        "BPF_MAP_LOOKUP_AND_DELETE_BATCH",
        "BPF_MAP_UPDATE_BATCH",
        "BPF_MAP_DELETE_BATCH",
        "BPF_LINK_CREATE",
        "BPF_LINK_UPDATE",
        "BPF_LINK_GET_FD_BY_ID",
        "BPF_LINK_GET_NEXT_ID",
        "BPF_ENABLE_STATS",
        "BPF_ITER_CREATE",
        "BPF_LINK_DETACH",
        "BPF_PROG_BIND_MAP",
        "BPF_TOKEN_CREATE",
    ];
    usize::try_from(cmd).ok().and_then(|i| CMDS.get(i).copied())
}

/// Socket address families worth a name.
pub fn family(af: u64) -> Option<&'static str> {
    Some(match af {
        1 => "AF_UNIX",
        2 => "AF_INET",
        10 => "AF_INET6",
        16 => "AF_NETLINK",
        17 => "AF_PACKET",
        38 => "AF_ALG",
        40 => "AF_VSOCK",
        44 => "AF_XDP",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_unique_and_fit_the_map() {
        let mut seen = std::collections::BTreeSet::new();
        for s in RECORDED {
            assert!(s.nr < 512, "{} {}", s.name, s.nr);
            assert!(seen.insert(s.nr), "{} twice", s.nr);
            for a in [s.str1, s.str2].into_iter().flatten() {
                assert!(a < s.nargs, "{}: text argument {a} of {}", s.name, s.nargs);
            }
        }
        assert_eq!(recorded(165).map(|s| s.name), Some("mount"));
        assert_eq!(recorded(39), None); // getpid
        assert_eq!(bpf_cmd(0), Some("BPF_MAP_CREATE"));
        assert_eq!(bpf_cmd(5), Some("BPF_PROG_LOAD"));
    }
}
