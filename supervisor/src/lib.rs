//! The Allox OS supervisor: the Btrfs workspace store with its journal,
//! index and audit log, and the control server that drives it.

pub mod audit;
pub mod btrfs;
pub mod cgroup;
pub mod daemon;
pub mod dispatch;
pub mod failpoint;
pub mod index;
pub mod journal;
pub mod layout;
pub mod peer;
pub mod ratelimit;
pub mod records;
pub mod reserve;
pub mod runs;
pub mod sandbox;
pub mod serial;
pub mod server;
pub mod store;
pub mod tracker;
pub mod tree;

/// Milliseconds since the Unix epoch.
/// Time since the kernel booted (`CLOCK_BOOTTIME`: what its log and the
/// process tracker's events count in).
pub fn since_boot() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
