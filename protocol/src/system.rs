//! The supervisor itself: liveness (`system.ping`), what it runs on
//! (`system.info`), its plugins (`plugin.list`), the store's consistency
//! (`store.check`) and an orderly stop (`system.shutdown`).

use crate::target::target;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Ping {}

target!(Ping);

/// `system.info`: the machine as the supervisor sees it.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct SystemInfoRequest {}

target!(SystemInfoRequest);

/// `system.metrics`: every metric the daemon keeps, in the OpenMetrics
/// text format (what the gateway serves at `GET /metrics`).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct SystemMetricsRequest {}

target!(SystemMetricsRequest);

/// The answer to `system.metrics`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct MetricsText {
    /// The OpenMetrics text, ending with `# EOF`.
    pub text: String,
}

/// `plugin.list`: the plugins loaded, in load order, and the ones
/// installed (compiled in), enabled or not.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct PluginListRequest {}

target!(PluginListRequest);

/// `store.check`: compare the index with the subvolumes on disk and say
/// what the journal still holds (read-only).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct StoreCheckRequest {}

target!(StoreCheckRequest);

/// `system.shutdown`: stop the supervisor in order (refuse new work, kill
/// every session's processes, flush the store); as the guest's PID 1's
/// child, the VM then powers off.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Shutdown {}

target!(Shutdown);

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct Pong {
    pub version: u32,
    pub build: String,
}

/// The answer to `system.info`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct SystemInfo {
    /// Milliseconds since the kernel booted.
    pub uptime_ms: u64,
    /// The supervisor's process id, and whether PID 1 is its parent (the
    /// guest) or not (a daemon on a host).
    pub supervisor_pid: u32,
    pub under_init: bool,
    /// Resident memory of PID 1 and of the supervisor, in KiB.
    pub init_rss_kib: u64,
    pub supervisor_rss_kib: u64,
    /// Processes on the machine, and exited children PID 1 has not reaped.
    pub processes: u32,
    pub init_zombies: u32,
    /// The plugins loaded, in load order.
    #[serde(default)]
    pub plugins: Vec<String>,
    /// Milliseconds since the supervisor started (a host daemon's own
    /// uptime; `uptime_ms` is the machine's).
    #[serde(default)]
    pub supervisor_uptime_ms: u64,
    /// Why the store refuses changes, if it does: it opened read-only (its
    /// index, its audit log or its recovery failed), an undo did not
    /// finish, or its filesystem is mounted read-only. `None`: it takes
    /// changes (the gateway's `/readyz`).
    #[serde(default)]
    pub store_read_only: Option<String>,
}

/// A loaded plugin, as `plugin.list` shows it.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct PluginInfo {
    pub name: String,
    /// The plugin API version it declares.
    pub api_version: u32,
    /// The actions it serves.
    pub routes: Vec<String>,
    /// The plugins it cannot be loaded with.
    pub conflicts: Vec<String>,
}

/// A plugin compiled into the supervisor.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct InstalledPlugin {
    pub name: String,
    pub api_version: u32,
    /// Whether a daemon flag enabled it (`--plugin NAME`).
    pub enabled: bool,
    /// What it does, in a line.
    pub summary: String,
}

/// The answer to `plugin.list`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct PluginListing {
    /// Loaded plugins, in load order (they stop in the reverse order).
    pub loaded: Vec<PluginInfo>,
    /// Every plugin compiled in, by name.
    pub installed: Vec<InstalledPlugin>,
}

/// The answer to `store.check`. The store is consistent when every list is
/// empty: the journal holds no unfinished operation and every record of
/// the index has its subvolume on disk and the other way round.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
pub struct StoreCheckReport {
    /// Journal entries of operations that neither finished nor were undone.
    pub unfinished: Vec<String>,
    /// Finished operations whose old tree is still being removed.
    pub removing: u32,
    /// Index records without their subvolume (`agent[/session[/checkpoint]]`).
    pub missing_on_disk: Vec<String>,
    /// Subvolumes without an index record, and leftover in-flight names.
    pub missing_in_index: Vec<String>,
    /// Why the store refuses changes, when it does (a failed recovery or
    /// an undo that could not finish).
    pub read_only: Option<String>,
    /// Names that are not records but not out of place either: the
    /// scratch trees of exports and imports going on, and trees whose
    /// removal is being tried again (deleted while an export sent them).
    #[serde(default)]
    pub in_progress: Vec<String>,
}

impl StoreCheckReport {
    /// Whether nothing is out of place.
    pub fn is_consistent(&self) -> bool {
        self.unfinished.is_empty()
            && self.missing_on_disk.is_empty()
            && self.missing_in_index.is_empty()
    }
}

/// The answer to `system.shutdown`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct Stopping {
    /// Whether the machine powers off after the supervisor stops (it runs
    /// as the child of the guest's PID 1).
    pub power_off: bool,
}

/// `system.resumed`: the VM manager tells the guest it was just resumed or
/// restored from a snapshot: set the wall clock from the host's, and (after
/// a restore, when two guests may run from one snapshot) mix a seed into
/// the kernel's random pool and reseed it, so nothing generated from here
/// on is repeated by another guest of the same snapshot. Only the guest's
/// supervisor (the one that owns the machine) accepts it.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct SystemResumed {
    /// The host's wall clock when it sent this, in nanoseconds since the
    /// Unix epoch.
    pub realtime_ns: u64,
    /// 32 bytes from the host's random source; empty after a plain resume.
    #[serde(default)]
    pub seed: crate::Bytes,
}

target!(SystemResumed);

/// The answer to `system.resumed`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct Resumed {
    /// How far the guest's wall clock was moved, in milliseconds (positive:
    /// forward; a guest resumed an hour later was an hour behind).
    pub clock_step_ms: i64,
    /// Whether the kernel's random pool was reseeded.
    pub reseeded: bool,
    /// A new id of this incarnation of the guest, drawn after the reseed:
    /// two guests restored from one snapshot never share it.
    pub instance: String,
}
