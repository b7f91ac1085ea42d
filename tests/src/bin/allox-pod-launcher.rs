//! `allox-pod-launcher`: what a container runtime in a Kata guest does
//! before the container's first process, done by hand, for the VM test of
//! container mode on a pure cgroup v2 kernel (`vm::guest_container_mode_*`).
//!
//! Booted as the guest's init (`rdinit=/usr/sbin/allox-pod-launcher`), in
//! three stages of the same binary:
//!
//! 1. PID 1 of the VM: the kernel filesystems (as `allox-init` would mount
//!    them), a pod cgroup `/sys/fs/cgroup/pod` with `pids.max` and
//!    `memory.max` (the pod's limits, as the kubelet sets them) and the
//!    container's cgroup `pod/ctr` below it; starts stage 2, reaps every
//!    orphan, and when stage 2 ends logs the container's exit status,
//!    syncs and powers the VM off.
//! 2. Unshares PID, UTS and IPC namespaces, starts stage 3 — PID 1 of the
//!    new PID namespace — and exits with its status. It stays out of the
//!    container's cgroup, as a runtime's own process does.
//! 3. Joins `pod/ctr`, unshares cgroup and mount namespaces (so the
//!    container's cgroup namespace is rooted at `pod/ctr`), makes its
//!    mounts private, mounts a fresh `/proc` and cgroup2 at
//!    `/sys/fs/cgroup` read-write (it shows `pod/ctr` as its root), and
//!    execs `/init container` with the options the kernel command line
//!    gives in `allox_pod.args=` (comma-separated).
//!
//! Nothing here is part of the product: it stands in for runc/kata-agent.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const POD: &str = "/sys/fs/cgroup/pod";
const CTR: &str = "/sys/fs/cgroup/pod/ctr";
/// The pod's limits.
const POD_MEMORY_MAX: &str = "805306368";
const POD_PIDS_MAX: &str = "4096";

fn log(msg: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr(), "allox-pod-launcher: {msg}");
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("stage2") => stage2(),
        Some("stage3") => stage3(),
        _ => stage1(),
    }
}

fn power_off() -> ! {
    rustix::fs::sync();
    loop {
        let _ = rustix::system::reboot(rustix::system::RebootCommand::PowerOff);
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn write(path: &str, text: &str) {
    if let Err(e) = std::fs::write(path, text) {
        log(format_args!("cannot write {text:?} to {path}: {e}"));
    }
}

fn stage1() -> ! {
    allox_init::guest::machine::set_up();
    // The runtime's part: a pod cgroup with the pod's limits, the
    // container's below it, controllers enabled down to it.
    for c in ["+pids", "+memory", "+cpu"] {
        write("/sys/fs/cgroup/cgroup.subtree_control", c);
    }
    let _ = std::fs::create_dir_all(CTR);
    for c in ["+pids", "+memory", "+cpu"] {
        write(&format!("{POD}/cgroup.subtree_control"), c);
    }
    // The pod's limits on the pod, the container's on the container (the
    // same here: one container).
    for dir in [POD, CTR] {
        write(&format!("{dir}/memory.max"), POD_MEMORY_MAX);
        write(&format!("{dir}/pids.max"), POD_PIDS_MAX);
    }
    log(format_args!(
        "pod cgroup {POD} (memory.max {POD_MEMORY_MAX}, pids.max {POD_PIDS_MAX}), container cgroup {CTR}"
    ));
    let child = match Command::new("/proc/self/exe").arg("stage2").spawn() {
        Ok(c) => c,
        Err(e) => {
            log(format_args!("cannot start stage 2: {e}"));
            power_off()
        }
    };
    let stage2 = child.id() as i32;
    std::mem::forget(child);
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
            Ok(Some((pid, status))) if pid.as_raw_nonzero().get() == stage2 => {
                log(format_args!(
                    "the container exited (status {:?})",
                    status.exit_status()
                ));
                power_off()
            }
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                log(format_args!("wait: {e}"));
                power_off()
            }
        }
    }
}

fn stage2() -> ! {
    use nix::sched::CloneFlags as F;
    if let Err(e) = nix::sched::unshare(F::CLONE_NEWPID | F::CLONE_NEWUTS | F::CLONE_NEWIPC) {
        log(format_args!("unshare: {e}"));
        std::process::exit(125);
    }
    let status = Command::new("/proc/self/exe")
        .arg("stage3")
        .status()
        .map(|s| s.code().unwrap_or(128))
        .unwrap_or_else(|e| {
            log(format_args!("cannot start stage 3: {e}"));
            125
        });
    std::process::exit(status)
}

fn stage3() -> ! {
    use rustix::mount::{mount, mount_change, unmount, MountFlags, MountPropagationFlags};
    let fail = |what: &str, e: rustix::io::Errno| -> ! {
        log(format_args!("{what}: {e}"));
        std::process::exit(125)
    };
    // Into the container's cgroup, then a cgroup namespace rooted there
    // (as runc's init does: join, then unshare), and a mount namespace.
    write(&format!("{CTR}/cgroup.procs"), "0");
    use nix::sched::CloneFlags as F;
    if let Err(e) = nix::sched::unshare(F::CLONE_NEWCGROUP | F::CLONE_NEWNS) {
        log(format_args!("unshare: {e}"));
        std::process::exit(125);
    }
    if let Err(e) = mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    ) {
        fail("make / private", e);
    }
    let _ = unmount("/proc", rustix::mount::UnmountFlags::DETACH);
    if let Err(e) = mount("proc", "/proc", "proc", MountFlags::empty(), None) {
        fail("mount /proc", e);
    }
    let _ = unmount("/sys/fs/cgroup", rustix::mount::UnmountFlags::DETACH);
    if let Err(e) = mount(
        "cgroup2",
        "/sys/fs/cgroup",
        "cgroup2",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        None,
    ) {
        fail("mount cgroup2", e);
    }
    let _ = rustix::system::sethostname(b"allox-pod");
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let args: Vec<String> = cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("allox_pod.args="))
        .map(|v| {
            v.split(',')
                .filter(|a| !a.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let init = Path::new("/init");
    let e = Command::new(init)
        .arg("container")
        .args(&args)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .exec();
    log(format_args!("cannot exec /init container: {e}"));
    std::process::exit(127)
}
