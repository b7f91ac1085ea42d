//! The guest's PID 1, as parts: [`settings`] from the kernel command line,
//! [`machine`] set-up, the [`store_disk`], and the [`supervisor`] child.
//! `src/pid1.rs` wires them into the init's loop.

pub mod machine;
pub mod settings;
pub mod store_disk;
pub mod supervisor;
pub mod uplink;

pub use settings::Settings;

use allox_store::clock::since_boot;
use std::io::Write;

/// Where the store filesystem is mounted, and the store root on it.
pub const STORE_MOUNT: &str = "/mnt/store";
pub const STORE_ROOT: &str = "/mnt/store/allox";
/// The control socket inside the guest.
pub const GUEST_SOCKET: &str = "/run/allox/ctl.sock";
/// Exit status of `supervise` after a `system.shutdown` request.
pub const EXIT_SHUTDOWN_REQUESTED: i32 = 3;
/// Exit status of `supervise` whose options are refused (`allox.args=`
/// naming a flag there is not, a bad value), as clap's own usage error's
/// (2): started again, it would be refused again.
pub const EXIT_SETTINGS_REFUSED: i32 = 4;
/// Exit status of a usage error of clap's.
pub const EXIT_USAGE: i32 = 2;

/// Whether [`log`] writes JSON (`allox.log_format=json` in the guest,
/// `--log-format json` in a container).
static JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Lines said before the format is known (PID 1 learns it from the kernel
/// command line once `/proc` is mounted): `None` once it is.
static HELD: std::sync::Mutex<Option<Vec<(std::time::Duration, String)>>> =
    std::sync::Mutex::new(None);

fn held() -> std::sync::MutexGuard<'static, Option<Vec<(std::time::Duration, String)>>> {
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes [`log`] write its lines as JSON log events (through the `tracing`
/// subscriber the caller set up, one object per line), or as text.
pub fn log_as_json(on: bool) {
    JSON.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`log`] writes JSON (a supervisor it starts is told to too).
pub fn logs_json() -> bool {
    JSON.load(std::sync::atomic::Ordering::Relaxed)
}

/// Holds [`log`]'s lines until [`release_logs`] says in which format to
/// write them.
pub fn hold_logs() {
    held().get_or_insert_with(Vec::new);
}

/// Writes the held lines, and every later one, as JSON (`json`) or text.
pub fn release_logs(json: bool) {
    let lines = held().take().unwrap_or_default();
    log_as_json(json);
    for (t, msg) in lines {
        write_line(t, &msg);
    }
}

/// One line on the console, stamped with the time since boot (as the
/// kernel's own lines are); with [`log_as_json`], a JSON log event (its
/// level from the line: `FATAL` and `panic` are errors, `warning` a
/// warning).
pub fn log(msg: impl std::fmt::Display) {
    let t = since_boot();
    if let Some(lines) = held().as_mut() {
        lines.push((t, msg.to_string()));
        return;
    }
    write_line(t, &msg.to_string());
}

fn write_line(t: std::time::Duration, msg: &str) {
    if logs_json() {
        let since_boot_ms = t.as_millis() as u64;
        if msg.starts_with("FATAL") || msg.starts_with("panic") {
            tracing::error!(target: "allox_init", since_boot_ms, "{msg}");
        } else if msg.starts_with("warning") {
            tracing::warn!(target: "allox_init", since_boot_ms, "{msg}");
        } else {
            tracing::info!(target: "allox_init", since_boot_ms, "{msg}");
        }
        return;
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "[{:>5}.{:03}] allox-init: {msg}",
        t.as_secs(),
        t.subsec_millis()
    );
}
