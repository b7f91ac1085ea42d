//! The machine as PID 1 finds it, made ready: a root sandboxes can pivot
//! away from, the kernel filesystems, Ctrl-Alt-Del as a signal, `lo` up,
//! and PID 1 out of the OOM killer's reach. Each step that fails is a
//! warning on the console; none stops the boot.

use super::log;
use rustix::fs::Mode;
use rustix::mount::MountFlags;
use std::path::Path;

/// Runs every step, logging what could not be done.
pub fn set_up() {
    if let Err(e) = remount_root() {
        log(format_args!(
            "warning: root stays the initramfs mount ({e}); sandboxes cannot pivot away from it"
        ));
    }
    mount_kernel_filesystems();
    // Ctrl-Alt-Del reaches PID 1 as SIGINT (an ordered shutdown) instead of
    // rebooting the machine on the spot.
    if let Err(e) = rustix::system::reboot(rustix::system::RebootCommand::CadOff) {
        log(format_args!(
            "warning: Ctrl-Alt-Del still reboots at once: {e}"
        ));
    }
    if let Err(e) = allox_sandbox::sys::loopback_up() {
        log(format_args!("warning: cannot bring up lo: {e}"));
    }
    let _ = std::fs::write("/proc/self/oom_score_adj", "-1000");
}

/// The initramfs is the kernel's `rootfs`, a mount without a parent, which
/// `pivot_root` cannot leave. A bind mount of it moved over `/` is an
/// ordinary mount with the same files.
fn remount_root() -> rustix::io::Result<()> {
    let dir = Path::new("/.allox-root");
    let _ = rustix::fs::mkdir(dir, Mode::from_raw_mode(0o700));
    rustix::mount::mount_bind_recursive("/", dir)?;
    rustix::process::chdir(dir)?;
    rustix::mount::mount_move(".", "/")?;
    rustix::process::chroot(".")?;
    rustix::process::chdir("/")?;
    let _ = rustix::fs::rmdir(dir);
    Ok(())
}

/// One kernel filesystem PID 1 mounts.
#[derive(Debug, Clone, Copy)]
pub struct KernelMount {
    pub source: &'static str,
    pub target: &'static str,
    pub fstype: &'static str,
    pub flags: MountFlags,
    /// Filesystem options (`mode=…`).
    pub data: &'static str,
}

const NOSUID_NODEV_NOEXEC: MountFlags = MountFlags::NOSUID
    .union(MountFlags::NODEV)
    .union(MountFlags::NOEXEC);

/// The kernel filesystems, each after the one it is mounted in.
pub const KERNEL_MOUNTS: [KernelMount; 11] = [
    KernelMount {
        source: "proc",
        target: "/proc",
        fstype: "proc",
        flags: NOSUID_NODEV_NOEXEC,
        data: "",
    },
    KernelMount {
        source: "sysfs",
        target: "/sys",
        fstype: "sysfs",
        flags: NOSUID_NODEV_NOEXEC,
        data: "",
    },
    KernelMount {
        source: "devtmpfs",
        target: "/dev",
        fstype: "devtmpfs",
        flags: MountFlags::NOSUID,
        data: "mode=0755",
    },
    KernelMount {
        source: "devpts",
        target: "/dev/pts",
        fstype: "devpts",
        flags: MountFlags::NOSUID.union(MountFlags::NOEXEC),
        data: "mode=0620,ptmxmode=0666",
    },
    KernelMount {
        source: "shm",
        target: "/dev/shm",
        fstype: "tmpfs",
        flags: MountFlags::NOSUID.union(MountFlags::NODEV),
        data: "mode=1777",
    },
    KernelMount {
        source: "run",
        target: "/run",
        fstype: "tmpfs",
        flags: MountFlags::NOSUID.union(MountFlags::NODEV),
        data: "mode=0755",
    },
    KernelMount {
        source: "tmp",
        target: "/tmp",
        fstype: "tmpfs",
        flags: MountFlags::NOSUID.union(MountFlags::NODEV),
        data: "mode=1777",
    },
    KernelMount {
        source: "cgroup2",
        target: "/sys/fs/cgroup",
        fstype: "cgroup2",
        flags: NOSUID_NODEV_NOEXEC,
        data: "nsdelegate",
    },
    KernelMount {
        source: "bpf",
        target: "/sys/fs/bpf",
        fstype: "bpf",
        flags: NOSUID_NODEV_NOEXEC,
        data: "mode=0700",
    },
    KernelMount {
        source: "tracefs",
        target: "/sys/kernel/tracing",
        fstype: "tracefs",
        flags: NOSUID_NODEV_NOEXEC,
        data: "",
    },
    // The active LSMs (`lsm`), which the system-effects plugin reads to
    // know the BPF LSM runs (CONFIG_SECURITYFS, kernel/config/effects.config).
    KernelMount {
        source: "securityfs",
        target: "/sys/kernel/security",
        fstype: "securityfs",
        flags: NOSUID_NODEV_NOEXEC,
        data: "",
    },
];

/// Mounts [`KERNEL_MOUNTS`]; one already there (`EBUSY`) is fine.
///
/// The kernel asks for no module meanwhile: from `/proc`'s mount to the
/// last one, its modprobe path is empty, then put back. The first mount of
/// bpffs asks for `bpf_preload`, which the guest's kernel neither has nor
/// builds in (`CONFIG_BPF_PRELOAD` off): the kernel would start
/// `/sbin/modprobe`, which finds nothing, on the boot's path (38 ms under
/// TCG). With the path empty the kernel starts nothing (`ENOENT` at once).
fn mount_kernel_filesystems() {
    let mut modprobe = None;
    for m in KERNEL_MOUNTS {
        let _ = std::fs::create_dir_all(m.target);
        let data = std::ffi::CString::new(m.data).unwrap_or_default();
        match rustix::mount::mount(m.source, m.target, m.fstype, m.flags, Some(data.as_c_str())) {
            Ok(()) | Err(rustix::io::Errno::BUSY) => {}
            Err(e) => log(format_args!(
                "warning: cannot mount {} on {}: {e}",
                m.fstype, m.target
            )),
        }
        if m.fstype == "proc" {
            modprobe = std::fs::read(MODPROBE)
                .ok()
                .filter(|_| std::fs::write(MODPROBE, "\n").is_ok());
        }
    }
    if let Some(path) = modprobe {
        if let Err(e) = std::fs::write(MODPROBE, &path) {
            log(format_args!(
                "warning: cannot put back the kernel's modprobe path {:?}: {e}",
                String::from_utf8_lossy(&path).trim_end()
            ));
        }
    }
}

/// The program the kernel starts to load a module it asks for.
const MODPROBE: &str = "/proc/sys/kernel/modprobe";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_filesystem_is_mounted_after_the_one_it_sits_in() {
        for (i, m) in KERNEL_MOUNTS.iter().enumerate() {
            for later in &KERNEL_MOUNTS[i + 1..] {
                assert!(
                    !Path::new(m.target).starts_with(later.target),
                    "{} is mounted before {}, which holds it",
                    m.target,
                    later.target
                );
            }
        }
    }

    #[test]
    fn no_kernel_filesystem_allows_setuid_and_options_are_c_strings() {
        for m in KERNEL_MOUNTS {
            assert!(m.flags.contains(MountFlags::NOSUID), "{}", m.target);
            assert!(std::ffi::CString::new(m.data).is_ok(), "{}", m.target);
        }
        let cgroup = KERNEL_MOUNTS
            .iter()
            .find(|m| m.fstype == "cgroup2")
            .expect("cgroup2 is mounted");
        // The supervisor delegates session subtrees.
        assert_eq!(cgroup.data, "nsdelegate");
    }
}
