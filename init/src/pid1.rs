//! `allox-init` as the guest's PID 1: the loop that wires the library's
//! parts ([`allox_init::guest`]).
//!
//! It makes the machine ready ([`machine::set_up`]), reads `allox.*=`
//! settings from the kernel command line, mounts the Btrfs store from its
//! virtio disk ([`store_disk::mount_store`]), and starts the supervisor
//! (this same binary, `supervise`) as its child, restarting it with backoff
//! if it dies. It reaps every orphan. On SIGTERM, SIGINT, SIGPWR, or the
//! supervisor stopping after `system.shutdown`, it shuts down in order: the
//! supervisor refuses new work, kills the sessions and flushes the store;
//! then everything left is killed, the disks are synced, the store is
//! unmounted and the machine powers off. It never exits: a fatal error, or
//! a panic anywhere in it, is logged to the console, synced and turned into
//! a power-off, never a kernel panic.

use allox_init::guest::{
    log, machine, store_disk, supervisor, Settings, EXIT_SHUTDOWN_REQUESTED, STORE_MOUNT,
    STORE_ROOT,
};
use allox_store::clock::since_boot;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use rustix::mount::UnmountFlags;
use rustix::process::{Pid, WaitOptions};
use std::time::{Duration, Instant};

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
    machine::set_up();
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let settings = Settings::parse(&cmdline);
    for u in &settings.unknown {
        log(format_args!(
            "warning: ignoring kernel command line setting {u:?}"
        ));
    }
    if let Some(up) = &settings.net {
        uplink(up);
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
    if let Err(e) = store_disk::mount_store(&settings) {
        fatal(allox_protocol::error_chain(&e));
    }
    let _ = std::fs::create_dir_all(STORE_ROOT);
    log(format_args!(
        "store mounted; starting the supervisor ({} ms after boot)",
        since_boot().as_millis()
    ));
    let (mem_total, pid_max) = allox_init::limits::machine();
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

/// Configures the first network device as `allox.net=` says; a failure
/// is logged, and the guest goes on without an uplink.
fn uplink(up: &allox_init::guest::uplink::Uplink) {
    use allox_init::guest::uplink;
    let Some(dev) = uplink::devices().into_iter().next() else {
        log("warning: allox.net= is set but the machine has no network device (QEMU: --net user)");
        return;
    };
    match uplink::configure(&dev, up) {
        Ok(()) => log(format_args!(
            "network: {dev} {}/{}{}",
            up.addr,
            up.prefix,
            up.gateway.map(|g| format!(" via {g}")).unwrap_or_default()
        )),
        Err(e) => log(format_args!("warning: cannot configure {dev}: {e}")),
    }
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
        // Failpoints are armed in the first supervisor only.
        let failpoints = self.settings.failpoints.take();
        if let Some(f) = &failpoints {
            log(format_args!("arming failpoints {f} in this supervisor"));
        }
        let mut cmd = supervisor::command(
            &self.settings,
            self.mem_total,
            self.pid_max,
            failpoints.as_deref(),
        );
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
        let delay = supervisor::restart_delay(self.restarts);
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
                        if since.elapsed() > supervisor::STABLE_AFTER {
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
