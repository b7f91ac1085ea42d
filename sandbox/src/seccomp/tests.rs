//! The real filter, installed on a thread of its own (seccomp filters
//! and no_new_privs belong to a thread; the rest of the test process is
//! untouched), answering an errno no kernel path gives for these calls.

use super::*;

/// What the deny list answers in these tests: no kernel path gives it for
/// the calls below, so it can only come from the filter.
const MARK: i32 = libc::EHWPOISON;
/// An address that is never mapped: were the filter missing, the kernel
/// would answer EFAULT (or EINVAL, EBADF) for most calls, never act.
const BAD: i64 = 1;

fn call(nr: i64, a: [i64; 6]) -> Result<i64, i32> {
    // SAFETY: every pointer argument is either null or the unmapped address
    // 1, which the kernel refuses to dereference (EFAULT); no call below can
    // write into this process's memory.
    let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}

/// Runs `f` on a new thread under the filters.
fn filtered<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let filters = filters_answering(MARK as u32).unwrap();
    std::thread::spawn(move || {
        filters.apply().expect("install the filters");
        f()
    })
    .join()
    .unwrap()
}

/// Each refused call with arguments that would make it fail harmlessly if
/// it ever reached the kernel.
fn refused_calls() -> Vec<(&'static str, i64, [i64; 6])> {
    let me = i64::from(std::process::id());
    let mut v = vec![
        ("mount", libc::SYS_mount, [BAD, BAD, BAD, 0, BAD, 0]),
        ("umount2", libc::SYS_umount2, [BAD, 0, 0, 0, 0, 0]),
        ("pivot_root", libc::SYS_pivot_root, [BAD, BAD, 0, 0, 0, 0]),
        ("fsopen", libc::SYS_fsopen, [BAD, 0, 0, 0, 0, 0]),
        ("fsconfig", libc::SYS_fsconfig, [-1, 0, 0, 0, 0, 0]),
        ("fsmount", libc::SYS_fsmount, [-1, 0, 0, 0, 0, 0]),
        ("fspick", libc::SYS_fspick, [-1, BAD, 0, 0, 0, 0]),
        ("open_tree", libc::SYS_open_tree, [-1, BAD, 0, 0, 0, 0]),
        ("open_tree_attr", 467, [-1, BAD, 0, BAD, 0, 0]),
        ("move_mount", libc::SYS_move_mount, [-1, BAD, -1, BAD, 0, 0]),
        (
            "mount_setattr",
            libc::SYS_mount_setattr,
            [-1, BAD, 0, BAD, 0, 0],
        ),
        ("bpf", libc::SYS_bpf, [1, BAD, 8, 0, 0, 0]),
        (
            "perf_event_open",
            libc::SYS_perf_event_open,
            [BAD, 0, -1, -1, 0, 0],
        ),
        ("keyctl", libc::SYS_keyctl, [0xffff, 0, 0, 0, 0, 0]),
        ("add_key", libc::SYS_add_key, [BAD, BAD, BAD, 0, 0, 0]),
        (
            "request_key",
            libc::SYS_request_key,
            [BAD, BAD, BAD, 0, 0, 0],
        ),
        // Too many segments and an unknown architecture.
        (
            "kexec_load",
            libc::SYS_kexec_load,
            [0, 1000, BAD, 0x1234_0000, 0, 0],
        ),
        (
            "kexec_file_load",
            libc::SYS_kexec_file_load,
            [-1, -1, 0, BAD, -1, 0],
        ),
        ("init_module", libc::SYS_init_module, [BAD, 0, BAD, 0, 0, 0]),
        (
            "finit_module",
            libc::SYS_finit_module,
            [-1, BAD, 0, 0, 0, 0],
        ),
        (
            "delete_module",
            libc::SYS_delete_module,
            [BAD, 0, 0, 0, 0, 0],
        ),
        (
            "open_by_handle_at",
            libc::SYS_open_by_handle_at,
            [-1, BAD, 0, 0, 0, 0],
        ),
        ("setns", libc::SYS_setns, [-1, 0, 0, 0, 0, 0]),
        // Wrong magic numbers.
        ("reboot", libc::SYS_reboot, [0, 0, 0, BAD, 0, 0]),
        ("swapon", libc::SYS_swapon, [BAD, 0, 0, 0, 0, 0]),
        ("swapoff", libc::SYS_swapoff, [BAD, 0, 0, 0, 0, 0]),
        ("syslog", libc::SYS_syslog, [3, BAD, -1, 0, 0, 0]),
        (
            "io_uring_setup",
            libc::SYS_io_uring_setup,
            [1, BAD, 0, 0, 0, 0],
        ),
        (
            "io_uring_enter",
            libc::SYS_io_uring_enter,
            [-1, 0, 0, 0, 0, 0],
        ),
        (
            "io_uring_register",
            libc::SYS_io_uring_register,
            [-1, 0, 0, 0, 0, 0],
        ),
        // UFFD_USER_MODE_ONLY and an unknown flag.
        ("userfaultfd", libc::SYS_userfaultfd, [0x11, 0, 0, 0, 0, 0]),
        ("kcmp", libc::SYS_kcmp, [me, me, 99, 0, 0, 0]),
        (
            "process_vm_readv",
            libc::SYS_process_vm_readv,
            [me, BAD, 1, BAD, 1, 0],
        ),
        (
            "process_vm_writev",
            libc::SYS_process_vm_writev,
            [me, BAD, 1, BAD, 1, 0],
        ),
        // With an invalid socket type: never a socket.
        (
            "socket AF_VSOCK",
            libc::SYS_socket,
            [40, 0x100_0001, 0, 0, 0, 0],
        ),
        (
            "socket AF_VSOCK, high bits",
            libc::SYS_socket,
            [40 | 1 << 32, 0x100_0001, 0, 0, 0, 0],
        ),
        // CLONE_NEWUSER with flags that make the kernel refuse anyway.
        (
            "unshare CLONE_NEWUSER",
            libc::SYS_unshare,
            [0x1000_8000, 0, 0, 0, 0, 0],
        ),
        (
            "clone CLONE_NEWUSER",
            libc::SYS_clone,
            [0x1000_0200, 0, 0, 0, 0, 0],
        ),
        (
            "personality READ_IMPLIES_EXEC",
            libc::SYS_personality,
            [0x40_0000, 0, 0, 0, 0, 0],
        ),
        (
            "personality UNAME26",
            libc::SYS_personality,
            [0x2_0000, 0, 0, 0, 0, 0],
        ),
        (
            "personality high bits",
            libc::SYS_personality,
            [1 << 32 | 0x40_0000, 0, 0, 0, 0, 0],
        ),
    ];
    for &cmd in IOCTLS {
        v.push(("ioctl", libc::SYS_ioctl, [-1, cmd as i64, BAD, 0, 0, 0]));
        v.push((
            "ioctl, high bits",
            libc::SYS_ioctl,
            [-1, (1 << 32 | cmd) as i64, BAD, 0, 0, 0],
        ));
    }
    v
}

#[test]
fn the_filter_is_one_short_program() {
    let f = filters().unwrap();
    // Three linear programs of 1,760 instructions in all before.
    assert!(f.prog.len() < 400, "{} instructions", f.prog.len());
}

/// The filters as they were compiled before the search tree: three linear
/// programs by seccompiler, installed in this order.
mod reference {
    use super::super::{allowed, refused};
    use seccompiler::{
        sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
        SeccompFilter, SeccompRule, TargetArch,
    };
    use std::collections::BTreeMap;

    fn arch() -> TargetArch {
        #[cfg(target_arch = "aarch64")]
        return TargetArch::aarch64;
        #[cfg(not(target_arch = "aarch64"))]
        TargetArch::x86_64
    }

    fn rule(conds: Vec<(u8, SeccompCmpArgLen, SeccompCmpOp, u64)>) -> SeccompRule {
        let conds = conds
            .into_iter()
            .map(|(arg, len, op, v)| SeccompCondition::new(arg, len, op, v).unwrap())
            .collect();
        SeccompRule::new(conds).unwrap()
    }

    fn x32_guard() -> BpfProgram {
        let s = |code, jt, jf, k| sock_filter { code, jt, jf, k };
        vec![
            s(0x20, 0, 0, 0),
            s(0x35, 1, 0, 0x4000_0000),
            s(0x06, 0, 0, 0x7fff_0000),
            s(0x06, 0, 0, 0x0005_0000 | libc::ENOSYS as u32),
        ]
    }

    fn allowlist() -> BpfProgram {
        let rules: BTreeMap<i64, Vec<SeccompRule>> =
            allowed::syscalls().map(|nr| (nr, vec![])).collect();
        SeccompFilter::new(
            rules,
            SeccompAction::Errno(libc::ENOSYS as u32),
            SeccompAction::Allow,
            arch(),
        )
        .unwrap()
        .try_into()
        .unwrap()
    }

    fn denylist(errno: u32) -> BpfProgram {
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
        rules.insert(libc::SYS_unshare, vec![newuser(0)]);
        rules.insert(libc::SYS_clone, vec![newuser(0)]);
        rules.insert(
            libc::SYS_socket,
            vec![rule(vec![(0, Dword, SeccompCmpOp::Eq, refused::AF_VSOCK)])],
        );
        let other_persona = refused::PERSONALITIES
            .iter()
            .map(|&p| (0, Dword, SeccompCmpOp::Ne, p))
            .collect();
        rules.insert(libc::SYS_personality, vec![rule(other_persona)]);
        let ioctls = refused::IOCTLS
            .iter()
            .map(|&cmd| rule(vec![(1, Dword, SeccompCmpOp::Eq, cmd)]))
            .collect();
        rules.insert(libc::SYS_ioctl, ioctls);
        SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno),
            arch(),
        )
        .unwrap()
        .try_into()
        .unwrap()
    }

    /// In installation order.
    pub fn programs(errno: u32) -> Vec<BpfProgram> {
        vec![x32_guard(), allowlist(), denylist(errno)]
    }
}

/// Runs a classic BPF program on `seccomp_data` (the instructions seccomp
/// programs use; any other fails the test).
fn interpret(prog: &[seccompiler::sock_filter], data: &[u8; 64]) -> u32 {
    let (mut a, mut pc) = (0u32, 0usize);
    loop {
        let i = &prog[pc];
        pc += 1;
        let k = i.k;
        let taken = match i.code {
            0x20 => {
                let k = k as usize;
                a = u32::from_ne_bytes(data[k..k + 4].try_into().unwrap());
                continue;
            }
            0x54 => {
                a &= k;
                continue;
            }
            0x05 => {
                pc += k as usize;
                continue;
            }
            0x06 => return k,
            0x15 => a == k,
            0x25 => a > k,
            0x35 => a >= k,
            0x45 => a & k != 0,
            c => panic!("instruction {c:#x} at {}", pc - 1),
        };
        pc += usize::from(if taken { i.jt } else { i.jf });
    }
}

/// The kernel's rule: every filter runs, newest first; the strictest
/// action wins, the first one run among equals.
fn answer(progs: &[&[seccompiler::sock_filter]], data: &[u8; 64]) -> u32 {
    let action = |r: u32| (r & 0xffff_0000) as i32;
    let mut ret = libc::SECCOMP_RET_ALLOW;
    for p in progs.iter().rev() {
        let cur = interpret(p, data);
        if action(cur) < action(ret) {
            ret = cur;
        }
    }
    ret
}

fn seccomp_data(nr: u32, arch: u32, args: [u64; 6]) -> [u8; 64] {
    let mut d = [0u8; 64];
    d[0..4].copy_from_slice(&nr.to_ne_bytes());
    d[4..8].copy_from_slice(&arch.to_ne_bytes());
    d[8..16].copy_from_slice(&0x7f00_1234_5678u64.to_ne_bytes());
    for (i, a) in args.iter().enumerate() {
        d[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
    }
    d
}

#[test]
fn the_search_tree_answers_every_call_as_the_three_linear_filters_did() {
    let tree = filters_answering(MARK as u32).unwrap().prog;
    let old = reference::programs(MARK as u32);
    let old: Vec<&[seccompiler::sock_filter]> = old.iter().map(|p| p.as_slice()).collect();
    // Every listed value in every argument position that has a rule, alone,
    // with high bits set, with neighbours and other flags.
    let mut values: Vec<u64> = vec![0, 1, 0x11, 0x200, u64::from(u32::MAX), u64::MAX];
    for &v in IOCTLS
        .iter()
        .chain(PERSONALITIES)
        .chain(&[refused::AF_VSOCK, refused::CLONE_NEWUSER])
    {
        values.extend([v, v | 1 << 32, v + 1, v.wrapping_sub(1), v | 0x200]);
    }
    let mut argsets = vec![[0u64; 6], [u64::MAX; 6]];
    for &v in &values {
        argsets.push([v, 0, 0, 0, 0, 0]);
        argsets.push([0, v, 0, 0, 0, 0]);
        argsets.push([v, v, v, v, v, v]);
    }
    let mut numbers: Vec<u32> = (0..1024).collect();
    numbers.extend((0..600).map(|n| 0x4000_0000 | n));
    numbers.extend([0x3fff_ffff, 0x7fff_ffff, 0x8000_0000, u32::MAX]);
    let mut checked = 0;
    for arch in [tree::AUDIT_ARCH, 0x4000_0003, 0] {
        for &nr in &numbers {
            // Every argument set for the calls with argument rules (and
            // their x32 numbers), two for the others.
            let ruled = [
                libc::SYS_clone,
                libc::SYS_unshare,
                libc::SYS_socket,
                libc::SYS_personality,
                libc::SYS_ioctl,
            ]
            .contains(&i64::from(nr & !0x4000_0000));
            let sets = if ruled { &argsets[..] } else { &argsets[..2] };
            for args in sets {
                let d = seccomp_data(nr, arch, *args);
                let want = answer(&old, &d);
                let got = answer(&[&tree], &d);
                assert_eq!(got, want, "nr {nr:#x}, arch {arch:#x}, args {args:x?}");
                checked += 1;
            }
        }
    }
    assert!(checked > 10_000, "{checked}");
}

#[test]
fn every_refused_call_gets_the_deny_lists_errno() {
    let calls = refused_calls();
    // Every name on the deny list is probed.
    for nr in REFUSED {
        assert!(calls.iter().any(|c| c.1 == *nr), "{nr} is not probed");
    }
    let out = filtered(move || {
        calls
            .into_iter()
            .map(|(name, nr, a)| (name, call(nr, a)))
            .collect::<Vec<_>>()
    });
    for (name, r) in out {
        assert_eq!(r, Err(MARK), "{name}");
    }
}

#[test]
fn unlisted_calls_answer_enosys_and_listed_ones_pass() {
    let out = filtered(|| {
        let clone3 = call(libc::SYS_clone3, [BAD, 88, 0, 0, 0, 0]);
        // listmount (6.8) and a number no kernel has yet.
        let listmount = call(458, [BAD, BAD, 0, 0, 0, 0]);
        let future = call(1000, [0; 6]);
        let chroot = call(libc::SYS_chroot, [BAD, 0, 0, 0, 0, 0]);
        // x32 unshare(CLONE_NEWUSER).
        let x32 = call(
            0x4000_0000 | libc::SYS_unshare,
            [0x1000_0000, 0, 0, 0, 0, 0],
        );
        let getpid = call(libc::SYS_getpid, [0; 6]);
        let query = call(libc::SYS_personality, [0xffff_ffff, 0, 0, 0, 0, 0]);
        let no_aslr = call(libc::SYS_personality, [0x4_0000, 0, 0, 0, 0, 0]);
        let linux = call(libc::SYS_personality, [0, 0, 0, 0, 0, 0]);
        let bad_fd_ioctl = call(libc::SYS_ioctl, [-1, libc::FIONREAD as i64, BAD, 0, 0, 0]);
        let unshare_nothing = call(libc::SYS_unshare, [0; 6]);
        [
            clone3,
            listmount,
            future,
            chroot,
            x32,
            getpid,
            query,
            no_aslr,
            linux,
            bad_fd_ioctl,
            unshare_nothing,
        ]
    });
    let [clone3, listmount, future, chroot, x32, getpid, query, no_aslr, linux, ioctl, unshare] =
        out;
    for (name, r) in [
        ("clone3", clone3),
        ("listmount", listmount),
        ("1000", future),
        ("chroot", chroot),
        ("x32", x32),
    ] {
        assert_eq!(r, Err(libc::ENOSYS), "{name}");
    }
    assert!(getpid.is_ok());
    assert_eq!((query, no_aslr, linux), (Ok(0), Ok(0), Ok(0x4_0000)));
    assert_eq!(ioctl, Err(libc::EBADF));
    assert_eq!(unshare, Ok(0));
}
