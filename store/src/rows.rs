//! The rows of the index's tables, one type a table (values are postcard).
//! The journal holds some of them too (a checkpoint's record travels in its
//! create operation), so they live apart from both.

use allox_protocol::{Egress, NetworkMode, Origin, TurnStatus};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct AgentRecord {
    pub created_ms: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SessionRecord {
    pub created_ms: u64,
    /// The checkpoint `current/` descends from.
    pub head: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct CheckpointRecord {
    pub created_ms: u64,
    /// Creation order within the store.
    pub seq: u64,
    pub parent: Option<String>,
    pub origin: Origin,
    pub pinned: bool,
    pub label: Option<String>,
    pub turn_id: Option<String>,
}

/// Automatic-checkpoint policy of an agent (key `agent`) or a session
/// (key `agent/session`); `None` fields fall back to the agent, then off.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct PolicyRecord {
    pub auto_checkpoint: Option<bool>,
    pub keep_last: Option<u32>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TurnRecord {
    pub number: u64,
    pub began_ms: u64,
    pub ended_ms: Option<u64>,
    pub status: Option<TurnStatus>,
    pub checkpoint_id: Option<String>,
    pub checkpoint_error: Option<String>,
}

/// The session network of an agent (key `agent`: the default of its new
/// sessions, and rules for all of them) or a session (key `agent/session`:
/// its mode, fixed when it was made, and its own rules).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct NetworkRecord {
    pub mode: Option<NetworkMode>,
    pub egress: Option<Egress>,
}

/// Where a forked session came from (key `agent/session` of the fork): the
/// source session, its checkpoint (`None`: its `current/` at the time), and
/// the fork's baseline checkpoint that stands for that point.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ForkRecord {
    pub agent: String,
    pub session: String,
    pub checkpoint: Option<String>,
    pub baseline: String,
    pub forked_ms: u64,
}

/// A session's limits over time (key `agent/session`): its idle timeout,
/// its lifetime counted from `lifetime_from_ms`, when it expired, and when
/// it was last seen active (kept so that a restarted supervisor's idle
/// clock goes on from there).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct ClockRecord {
    pub idle_timeout_ms: Option<u64>,
    pub max_lifetime_ms: Option<u64>,
    pub lifetime_from_ms: u64,
    pub expired_ms: Option<u64>,
    pub last_active_ms: u64,
}

impl ClockRecord {
    /// When the lifetime ends, if there is one.
    pub fn expires_ms(&self) -> Option<u64> {
        self.max_lifetime_ms
            .map(|m| self.lifetime_from_ms.saturating_add(m))
    }
}

/// A session's own cgroup limits (key `agent/session`), as it was given
/// them (at `session.create`, `session.update`, an import or a fork):
/// kept so that its cgroup, made again after a boot (the guest's cgroups
/// live in memory) or a host's reboot, gets them back, not the daemon's
/// defaults. `cpu_max` is `(quota µs, period µs)`, `u64::MAX` for no quota.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct LimitsRecord {
    pub pids_max: Option<u64>,
    pub memory_max: Option<u64>,
    pub cpu_max: Option<(u64, u64)>,
}

/// What the store keeps of a deleted tree of a session (key
/// `agent/session/UUID`, the tree's uuid in hex): where it descends from,
/// so that the diff's Btrfs hints can follow a line of descent through it
/// (a session rolled back twice descends from a tree that is gone).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct DepartedRecord {
    /// The uuid of the subvolume it was a snapshot of (zero if none).
    pub parent_uuid: [u8; 16],
    /// The transaction that made it.
    pub otransid: u64,
    /// When it was made, seconds since the epoch.
    pub otime: u64,
}
