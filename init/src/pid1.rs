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

use allox_init::guest::{log, machine, store_disk, supervisor, Settings, STORE_MOUNT, STORE_ROOT};
use allox_init::keeper::{self, kill_everything, Keeper, KillRest};
use allox_store::clock::since_boot;
use rustix::mount::UnmountFlags;
use std::time::Duration;

fn power_off() -> ! {
    rustix::fs::sync();
    loop {
        let _ = rustix::system::reboot(rustix::system::RebootCommand::PowerOff);
        // Only reachable if the kernel refused; never return from PID 1.
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A fatal error: say why on the console, then power off cleanly.
fn fatal(msg: impl std::fmt::Display) -> ! {
    allox_init::guest::release_logs(allox_init::guest::logs_json());
    log(format_args!("FATAL: {msg}"));
    log("powering off");
    // Whatever is still running must not outlive the store's unmount.
    kill_everything();
    let _ = rustix::mount::unmount(STORE_MOUNT, UnmountFlags::DETACH);
    power_off()
}

pub fn run() -> ! {
    // Lines wait until the kernel command line (read once /proc is
    // mounted) says whether they are JSON.
    allox_init::guest::hold_logs();
    std::panic::set_hook(Box::new(|info| {
        allox_init::guest::release_logs(allox_init::guest::logs_json());
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
    let mut settings = Settings::parse(&cmdline);
    if settings.log_json {
        tracing_subscriber::fmt()
            .log_internal_errors(false)
            .with_writer(std::io::stderr)
            .json()
            .flatten_event(true)
            .init();
    }
    allox_init::guest::release_logs(settings.log_json);
    for u in &settings.unknown {
        log(format_args!(
            "warning: ignoring kernel command line setting {u:?}"
        ));
    }
    if let Some(up) = &settings.net {
        uplink(up);
    }
    // Signals arrive through a descriptor, never as handlers.
    let sfd = keeper::signal_fd()
        .unwrap_or_else(|e| fatal(format_args!("cannot take signals through a signalfd: {e}")));
    // The store's device is waited for, checked (formatted if asked) and
    // mounted while the supervisor starts, which answers the host's Hello
    // meanwhile and opens the store once this pipe's write end is closed.
    // A device refused or a failed mount powers off with the write end
    // still open.
    let (mounted, mounted_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .unwrap_or_else(|e| fatal(format_args!("cannot make a pipe: {e}")));
    // Every supervisor started inherits the read end.
    if let Err(e) = rustix::io::fcntl_setfd(&mounted, rustix::io::FdFlags::empty()) {
        fatal(format_args!("cannot pass a pipe to the supervisor: {e}"));
    }
    let (dev, format) = (settings.store.clone(), settings.format);
    let mounting = std::thread::spawn(move || {
        let mounted = store_disk::prepare_store(&dev, format, &store_disk::GUEST)
            .and_then(|()| store_disk::mount_prepared(&dev));
        if let Err(e) = mounted {
            fatal(allox_protocol::error_chain(&e));
        }
        let _ = std::fs::create_dir_all(STORE_ROOT);
        log(format_args!(
            "store mounted ({} ms after boot)",
            since_boot().as_millis()
        ));
        drop(mounted_w);
    });
    let mounted_fd = std::os::fd::AsRawFd::as_raw_fd(&mounted);
    log(format_args!(
        "starting the supervisor ({} ms after boot)",
        since_boot().as_millis()
    ));
    let (mem_total, pid_max) = allox_init::limits::machine();
    // Failpoints are armed in the first supervisor only.
    let mut failpoints = settings.failpoints.take();
    let stop_timeout = settings.stop_timeout;
    let why = Keeper::new(sfd, stop_timeout, move || {
        let f = failpoints.take();
        if let Some(f) = &f {
            log(format_args!("arming failpoints {f} in this supervisor"));
        }
        supervisor::command(&settings, mem_total, pid_max, f.as_deref(), mounted_fd)
    })
    .run(KillRest::Everything);
    let _ = mounting.join();
    store_disk::unmount_store();
    log(format_args!("powering off ({why})"));
    power_off()
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
