//! `allox-init` as the guest's PID 1.
//!
//! It makes the root a mount sandboxes can pivot away from, mounts the
//! kernel filesystems, brings up `lo`, reads `allox.*=` settings from the
//! kernel command line, mounts the Btrfs store from its virtio disk, and
//! starts the supervisor (this same binary, `supervise`) as its child,
//! restarting it with backoff if it dies. It reaps every orphan. On SIGTERM,
//! SIGINT, SIGPWR, or the supervisor stopping after `system.shutdown`, it
//! shuts down in order: the supervisor refuses new work, kills the sessions
//! and flushes the store; then everything left is killed, the disks are
//! synced, the store is unmounted and the machine powers off. It never
//! exits: a fatal error, or a panic anywhere in it, is logged to the
//! console, synced and turned into a power-off, never a kernel panic.

use crate::limits::LimitSettings;
use allox_store::clock::since_boot;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, UnmountFlags};
use rustix::process::{Pid, WaitOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where the store filesystem is mounted, and the store root on it.
pub const STORE_MOUNT: &str = "/mnt/store";
pub const STORE_ROOT: &str = "/mnt/store/allox";
/// The control socket inside the guest.
pub const GUEST_SOCKET: &str = "/run/allox/ctl.sock";
/// Exit status of `supervise` after a `system.shutdown` request.
pub const EXIT_SHUTDOWN_REQUESTED: i32 = 3;

/// Settings from the kernel command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `allox.store=`: the store's block device.
    pub store: PathBuf,
    /// `allox.ctl=`: the virtio-serial port name of the control port.
    pub ctl: String,
    /// `allox.log=`: log filter for init and supervisor.
    pub log: String,
    /// `allox.format=1`: format the store device if it is blank.
    pub format: bool,
    /// `allox.args=`: extra `supervise` options, comma-separated.
    pub args: Vec<String>,
    /// `allox.stop_timeout_ms=`: how long the supervisor gets to stop.
    pub stop_timeout: Duration,
    /// `allox.failpoints=`: crash points for tests, armed in the first
    /// supervisor only (its restart must come up clean).
    pub failpoints: Option<String>,
    /// `allox.session_pids_max=` and the other limits ([`crate::limits`]).
    pub limits: LimitSettings,
    /// Settings that were not understood, to be reported.
    pub unknown: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            store: PathBuf::from("/dev/vda"),
            ctl: "org.allox.ctl".into(),
            log: "info".into(),
            format: false,
            args: Vec::new(),
            stop_timeout: Duration::from_secs(10),
            failpoints: None,
            limits: LimitSettings::default(),
            unknown: Vec::new(),
        }
    }
}

impl Settings {
    pub fn parse(cmdline: &str) -> Settings {
        let mut s = Settings::default();
        for word in cmdline.split_whitespace() {
            let Some(kv) = word.strip_prefix("allox.") else {
                continue;
            };
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "store" if v.starts_with("/dev/") => s.store = PathBuf::from(v),
                "ctl" if !v.is_empty() => s.ctl = v.to_string(),
                "log" if !v.is_empty() => s.log = v.to_string(),
                "format" if matches!(v, "0" | "1") => s.format = v == "1",
                "args" => {
                    s.args = v
                        .split(',')
                        .filter(|a| !a.is_empty())
                        .map(str::to_string)
                        .collect()
                }
                "failpoints" if !v.is_empty() => s.failpoints = Some(v.to_string()),
                "stop_timeout_ms" if v.parse::<u64>().is_ok() => {
                    s.stop_timeout = Duration::from_millis(v.parse().unwrap_or(10_000))
                }
                _ if s.limits.take(k, v) => {}
                _ => s.unknown.push(word.to_string()),
            }
        }
        s
    }
}

fn log(msg: impl std::fmt::Display) {
    let t = since_boot();
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "[{:>5}.{:03}] allox-init: {msg}",
        t.as_secs(),
        t.subsec_millis()
    );
}

fn power_off() -> ! {
    rustix::fs::sync();
    loop {
        let _ = rustix::system::reboot(rustix::system::RebootCommand::PowerOff);
        // Only reachable if the kernel refused; never return from PID 1.
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// SIGKILL to every process but PID 1.
fn kill_everything() {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-1), Signal::SIGKILL);
}

/// A fatal error: say why on the console, then power off cleanly.
fn fatal(msg: impl std::fmt::Display) -> ! {
    log(format_args!("FATAL: {msg}"));
    log("powering off");
    // Whatever is still running must not outlive the store's unmount.
    kill_everything();
    let _ = rustix::mount::unmount(STORE_MOUNT, UnmountFlags::DETACH);
    power_off()
}

pub fn run() -> ! {
    std::panic::set_hook(Box::new(|info| {
        log(format_args!("panic: {info}"));
        log("powering off");
        power_off();
    }));
    let started = since_boot();
    log(format_args!(
        "started ({} ms after boot)",
        started.as_millis()
    ));
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
    if let Err(e) = loopback_up() {
        log(format_args!("warning: cannot bring up lo: {e}"));
    }
    let _ = std::fs::write("/proc/self/oom_score_adj", "-1000");
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let settings = Settings::parse(&cmdline);
    for u in &settings.unknown {
        log(format_args!(
            "warning: ignoring kernel command line setting {u:?}"
        ));
    }
    // Signals arrive through a descriptor, never as handlers.
    let mut mask = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGPWR,
        Signal::SIGHUP,
    ] {
        mask.add(s);
    }
    if let Err(e) = mask.thread_block() {
        fatal(format_args!("cannot block signals: {e}"));
    }
    let sfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .unwrap_or_else(|e| fatal(format_args!("cannot open a signalfd: {e}")));
    if let Err(e) = mount_store(&settings) {
        fatal(e);
    }
    let _ = std::fs::create_dir_all(STORE_ROOT);
    log(format_args!(
        "store mounted; starting the supervisor ({} ms after boot)",
        since_boot().as_millis()
    ));
    let (mem_total, pid_max) = crate::limits::machine();
    Init {
        settings,
        mem_total,
        pid_max,
        sfd,
        supervisor: None,
        restarts: 0,
        next_start: Some(Instant::now()),
    }
    .main_loop()
}

struct Init {
    settings: Settings,
    /// The guest's memory in bytes and `kernel.pid_max`, for the limits.
    mem_total: u64,
    pid_max: u64,
    sfd: SignalFd,
    supervisor: Option<(Pid, Instant)>,
    restarts: u32,
    next_start: Option<Instant>,
}

impl Init {
    fn main_loop(mut self) -> ! {
        loop {
            if let Some(at) = self.next_start {
                if Instant::now() >= at {
                    self.next_start = None;
                    self.start_supervisor();
                }
            }
            let wait = self
                .next_start
                .map(|at| at.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(60));
            let mut fds = [rustix::event::PollFd::new(
                &self.sfd,
                rustix::event::PollFlags::IN,
            )];
            let ts = rustix::event::Timespec {
                tv_sec: wait.as_secs() as _,
                tv_nsec: wait.subsec_nanos() as _,
            };
            let _ = rustix::event::poll(&mut fds, Some(&ts));
            let mut stop = None;
            while let Ok(Some(info)) = self.sfd.read_signal() {
                match Signal::try_from(info.ssi_signo as i32) {
                    Ok(Signal::SIGTERM) | Ok(Signal::SIGINT) | Ok(Signal::SIGPWR) => {
                        stop = Some(format!("signal {}", info.ssi_signo))
                    }
                    _ => {}
                }
            }
            if let Some(why) = self.reap() {
                stop = Some(why);
            }
            if let Some(why) = stop {
                self.shutdown(&why);
            }
        }
    }

    fn start_supervisor(&mut self) {
        let s = self.settings.clone();
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg("supervise")
            .args(["--root", STORE_ROOT])
            .args(["--listen", &format!("unix:{GUEST_SOCKET}")])
            .args(["--listen", &format!("virtio:{}", s.ctl)])
            .args(["--cgroup-root", "/sys/fs/cgroup"])
            .arg("--under-init")
            .args(&s.args)
            .args(s.limits.args(self.mem_total, self.pid_max, &s.args))
            .env("ALLOX_LOG", &s.log)
            .env("NO_COLOR", "1")
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        if let Some(f) = self.settings.failpoints.take() {
            log(format_args!("arming failpoints {f} in this supervisor"));
            cmd.env("ALLOX_FAILPOINTS", f);
        }
        match cmd.spawn() {
            Ok(child) => {
                let pid = Pid::from_raw(child.id() as i32).expect("a child has a pid");
                log(format_args!(
                    "supervisor started (pid {})",
                    pid.as_raw_nonzero()
                ));
                self.supervisor = Some((pid, Instant::now()));
                // std's Child would reap on drop only if waited; the reaper
                // below collects it.
                std::mem::forget(child);
            }
            Err(e) => {
                log(format_args!("cannot start the supervisor: {e}"));
                self.schedule_restart();
            }
        }
    }

    fn schedule_restart(&mut self) {
        // 100 ms, doubling to 5 s; a supervisor that stayed up a minute
        // starts the count again.
        let delay =
            Duration::from_millis(100 * (1u64 << self.restarts.min(6))).min(Duration::from_secs(5));
        self.restarts += 1;
        log(format_args!(
            "restarting the supervisor in {} ms",
            delay.as_millis()
        ));
        self.next_start = Some(Instant::now() + delay);
    }

    /// Reaps every exited child. Returns why to shut down, if the
    /// supervisor asked for it.
    fn reap(&mut self) -> Option<String> {
        let mut stop = None;
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, status))) => {
                    if self.supervisor.map(|(p, _)| p) == Some(pid) {
                        let (_, since) = self.supervisor.take().expect("checked");
                        if since.elapsed() > Duration::from_secs(60) {
                            self.restarts = 0;
                        }
                        if status.exit_status() == Some(EXIT_SHUTDOWN_REQUESTED as _) {
                            stop = Some("system.shutdown request".to_string());
                        } else {
                            log(format_args!("supervisor ended ({status:?})"));
                            self.schedule_restart();
                        }
                    }
                }
                Ok(None) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => break,
            }
        }
        stop
    }

    fn shutdown(&mut self, why: &str) -> ! {
        log(format_args!("shutting down ({why})"));
        if let Some((pid, _)) = self.supervisor {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            let deadline = Instant::now() + self.settings.stop_timeout;
            while self.supervisor.is_some() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
                let _ = self.reap();
            }
            if self.supervisor.is_some() {
                log("the supervisor did not stop in time; killing it");
            }
        }
        kill_everything();
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some(_)) => continue,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => break,
            }
        }
        rustix::fs::sync();
        match rustix::mount::unmount(STORE_MOUNT, UnmountFlags::empty()) {
            Ok(()) => log("store unmounted"),
            Err(e) => {
                log(format_args!(
                    "cannot unmount the store cleanly ({e}); detaching it"
                ));
                let _ = rustix::mount::unmount(STORE_MOUNT, UnmountFlags::DETACH);
            }
        }
        log("powering off");
        power_off()
    }
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

fn mount_kernel_filesystems() {
    let m = |src: &str, target: &str, fstype: &str, flags: MountFlags, data: &str| {
        let _ = std::fs::create_dir_all(target);
        let data = std::ffi::CString::new(data).unwrap_or_default();
        match rustix::mount::mount(src, target, fstype, flags, Some(data.as_c_str())) {
            Ok(()) | Err(rustix::io::Errno::BUSY) => {}
            Err(e) => log(format_args!(
                "warning: cannot mount {fstype} on {target}: {e}"
            )),
        }
    };
    let nosuid = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    m("proc", "/proc", "proc", nosuid, "");
    m("sysfs", "/sys", "sysfs", nosuid, "");
    m(
        "devtmpfs",
        "/dev",
        "devtmpfs",
        MountFlags::NOSUID,
        "mode=0755",
    );
    m(
        "devpts",
        "/dev/pts",
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        "mode=0620,ptmxmode=0666",
    );
    m(
        "shm",
        "/dev/shm",
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        "mode=1777",
    );
    m(
        "run",
        "/run",
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        "mode=0755",
    );
    m(
        "tmp",
        "/tmp",
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        "mode=1777",
    );
    m("cgroup2", "/sys/fs/cgroup", "cgroup2", nosuid, "nsdelegate");
    m("bpf", "/sys/fs/bpf", "bpf", nosuid, "mode=0700");
    m("tracefs", "/sys/kernel/tracing", "tracefs", nosuid, "");
}

/// `ip link set lo up`.
#[allow(unsafe_code)]
fn loopback_up() -> std::io::Result<()> {
    let sock = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )?;
    // SAFETY: an all-zero `ifreq` is valid; the name is NUL-terminated and
    // shorter than IFNAMSIZ.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *s as libc::c_char;
    }
    use rustix::fd::AsRawFd;
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS take a pointer to an `ifreq`,
    // which lives for both calls; the socket is open.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut req) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// What the first bytes of a block device say about it.
#[derive(Debug, PartialEq, Eq)]
pub enum DiskState {
    Btrfs,
    Blank,
    Other,
}

/// The Btrfs primary superblock is at 64 KiB; its magic at offset 0x40.
pub fn disk_state(head: &[u8]) -> DiskState {
    const SB: usize = 0x1_0000;
    if head.len() >= SB + 0x48 && &head[SB + 0x40..SB + 0x48] == b"_BHRfS_M" {
        DiskState::Btrfs
    } else if head.iter().all(|&b| b == 0) {
        DiskState::Blank
    } else {
        DiskState::Other
    }
}

fn mount_store(s: &Settings) -> Result<(), String> {
    let dev = &s.store;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dev.exists() {
        if Instant::now() > deadline {
            return Err(format!(
                "the store device {} does not exist (attach the store disk, or name it with allox.store=)",
                dev.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut head = vec![0u8; 1 << 20];
    let n = {
        let fd = rustix::fs::open(dev, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| format!("cannot open the store device {}: {e}", dev.display()))?;
        let mut got = 0;
        while got < head.len() {
            match rustix::io::pread(&fd, &mut head[got..], got as u64) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    return Err(format!(
                        "cannot read the store device {}: {e}",
                        dev.display()
                    ))
                }
            }
        }
        got
    };
    match disk_state(&head[..n]) {
        DiskState::Btrfs => {}
        DiskState::Blank if s.format => format_store(dev)?,
        DiskState::Blank => {
            return Err(format!(
                "the store device {} is blank; boot with allox.format=1 to format it",
                dev.display()
            ))
        }
        DiskState::Other => {
            return Err(format!(
                "the store device {} holds no Btrfs filesystem (and is not blank); refusing to touch it",
                dev.display()
            ))
        }
    }
    let _ = std::fs::create_dir_all(STORE_MOUNT);
    rustix::mount::mount(dev, STORE_MOUNT, "btrfs", MountFlags::NOSUID | MountFlags::NODEV, None)
        .map_err(|e| {
            format!(
                "cannot mount the store device {} as Btrfs: {e} (the filesystem is damaged, or the kernel lacks Btrfs); the kernel log above says more",
                dev.display()
            )
        })
}

fn format_store(dev: &Path) -> Result<(), String> {
    let mkfs = ["/usr/sbin/mkfs.btrfs", "/sbin/mkfs.btrfs", "/usr/bin/mkfs.btrfs"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .ok_or_else(|| {
            format!(
                "the store device {} is blank and this image has no mkfs.btrfs to format it; format it on the host (rootfs-builder store-image --format)",
                dev.display()
            )
        })?;
    log(format_args!(
        "formatting the blank store device {}",
        dev.display()
    ));
    let out = Command::new(mkfs)
        .args(["-q", "-L", "allox-store"])
        .arg(dev)
        .output()
        .map_err(|e| format!("cannot run {mkfs}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{mkfs} failed on {}: {}",
            dev.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_come_from_the_command_line() {
        let s = Settings::parse(
            "console=ttyS0 quiet allox.store=/dev/vdb allox.ctl=org.x allox.log=debug \
             allox.format=1 allox.args=--default-pids-max=64,--sandbox-network=isolated \
             allox.stop_timeout_ms=2500 allox.bogus=1 allox.store=relative",
        );
        assert_eq!(s.store, PathBuf::from("/dev/vdb"));
        assert_eq!(s.ctl, "org.x");
        assert_eq!(s.log, "debug");
        assert!(s.format);
        assert_eq!(
            s.args,
            ["--default-pids-max=64", "--sandbox-network=isolated"]
        );
        assert_eq!(s.stop_timeout, Duration::from_millis(2500));
        assert_eq!(s.unknown, ["allox.bogus=1", "allox.store=relative"]);
        assert_eq!(Settings::parse("console=ttyS0"), Settings::default());
    }

    #[test]
    fn disks_are_told_apart_by_their_first_mebibyte() {
        let mut d = vec![0u8; 1 << 20];
        assert_eq!(disk_state(&d), DiskState::Blank);
        d[0x1_0040..0x1_0048].copy_from_slice(b"_BHRfS_M");
        assert_eq!(disk_state(&d), DiskState::Btrfs);
        d[0x1_0040] = b'X';
        assert_eq!(disk_state(&d), DiskState::Other);
        assert_eq!(disk_state(&[]), DiskState::Blank);
    }
}
