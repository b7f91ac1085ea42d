//! Agents: the top level of the store, each with its workspace and
//! sessions (`agent.create`, `agent.list`, `agent.delete`).

use crate::target::target;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentRef {
    pub agent_id: String,
}

target!(AgentRef: agent_id);

/// `agent.delete`: the agent, its sessions, checkpoints and `shared/`.
/// Refused (`conflict`, naming what would be lost) while it has sessions,
/// unless `force`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentDelete {
    pub agent_id: String,
    #[serde(default)]
    pub force: bool,
}

target!(AgentDelete: agent_id);

impl AgentDelete {
    pub fn new(agent_id: impl Into<String>) -> Self {
        AgentDelete {
            agent_id: agent_id.into(),
            force: false,
        }
    }
}

/// `agent.create`, with the agent's automatic-checkpoint policy (the
/// default of its sessions).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentCreate {
    pub agent_id: String,
    #[serde(default)]
    pub auto_checkpoint: Option<bool>,
    #[serde(default)]
    pub keep_last: Option<u32>,
    /// The network mode of its sessions that do not name one.
    #[serde(default)]
    pub network: Option<crate::NetworkMode>,
    /// Egress rules for every session of it.
    #[serde(default)]
    pub egress: Option<crate::Egress>,
    /// The idle timeout of its sessions that do not ask for their own
    /// (`session.create`); `None` leaves them the daemon's.
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
    /// The lifetime of its sessions that do not ask for their own.
    #[serde(default)]
    pub max_lifetime_ms: Option<u64>,
}

target!(AgentCreate: agent_id);

impl AgentCreate {
    /// An agent without a policy of its own.
    pub fn new(agent_id: impl Into<String>) -> Self {
        AgentCreate {
            agent_id: agent_id.into(),
            auto_checkpoint: None,
            keep_last: None,
            network: None,
            egress: None,
            idle_timeout_ms: None,
            max_lifetime_ms: None,
        }
    }
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct AgentList {}

target!(AgentList);

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct AgentInfo {
    pub agent_id: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: u64,
    pub sessions: u32,
    /// Absolute path of the agent's level-1 workspace.
    pub workspace: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct AgentListing {
    pub agents: Vec<AgentInfo>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct Deleted {
    /// What was deleted, as `agent[/session[/checkpoint]]`.
    pub deleted: String,
}
