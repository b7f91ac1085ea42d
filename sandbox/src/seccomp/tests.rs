//! The real filters, installed on a thread of their own (seccomp filters
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
fn filters_compile_within_the_kernel_limit() {
    let f = filters().unwrap();
    assert_eq!(f.progs.len(), 3);
    assert!(f.progs.iter().all(|p| !p.is_empty() && p.len() < 4096));
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
