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
pub mod records;
pub mod runs;
pub mod sandbox;
pub mod serial;
pub mod server;
pub mod store;
pub mod tracker;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
