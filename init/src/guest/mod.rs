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

/// One line on the console, stamped with the time since boot (as the
/// kernel's own lines are).
pub fn log(msg: impl std::fmt::Display) {
    let t = since_boot();
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "[{:>5}.{:03}] allox-init: {msg}",
        t.as_secs(),
        t.subsec_millis()
    );
}
