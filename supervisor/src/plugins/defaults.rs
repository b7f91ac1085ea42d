//! What the daemon's flags and the core need of each plugin whether or not
//! it is built in (its cargo feature): its name and its settings' defaults.

/// Every plugin of the project, built into this binary or not (its
/// cargo feature): the request table may give an action to any of them.
pub const KNOWN: [&str; 5] = [
    process_tree::NAME,
    network::NAME,
    share::NAME,
    monitor::NAME,
    system_effects::NAME,
];

pub mod network {
    pub const NAME: &str = "network";

    pub use crate::plugin_api::{
        DEFAULT_CONNECTIONS, DEFAULT_CONNECTIONS_PER_SESSION, DEFAULT_LOOKUPS_PER_SESSION,
    };
}

pub mod monitor {
    pub const NAME: &str = "monitor";

    /// `--monitor-records-max` unless given.
    pub const DEFAULT_RECORDS_MAX: u64 = 1_000_000;

    /// `--monitor-session-bytes` unless given.
    pub const DEFAULT_SESSION_BYTES: u64 = 64 << 20;

    /// `--monitor-bytes-per-s` unless given; eight seconds' worth may come at
    /// once.
    pub const DEFAULT_BYTES_PER_S: u64 = 1 << 20;

    /// `--monitor-span-bytes` unless given.
    pub const DEFAULT_SPAN_BYTES: u64 = 64 << 10;
}

pub mod share {
    pub const NAME: &str = "share";
}

pub mod system_effects {
    pub const NAME: &str = "system-effects";

    /// The history's ring buffer by default: 8 MiB.
    pub const DEFAULT_RING_BYTES: u64 = 8 << 20;
}

pub mod process_tree {
    pub const NAME: &str = "process-tree";

    /// Default cap of the event store.
    pub const DEFAULT_MAX_EVENTS: u64 = 1_000_000;
}
