//! Turns of an agent framework and the automatic checkpoints taken at
//! their end (`turn.begin`, `turn.end`, `policy.set`).

use crate::target::target;
use serde::{Deserialize, Serialize};

/// How a turn ended.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    Ok,
    Failed,
    Cancelled,
}

/// `turn.begin`: an agent framework starts a turn of a session.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TurnBegin {
    pub agent_id: String,
    pub session_id: String,
    /// Chosen by the caller, or made up (`turn-<n>`).
    #[serde(default)]
    pub turn_id: Option<String>,
}

target!(TurnBegin: agent_id, session_id);

/// `turn.end`: the turn is over.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TurnEnd {
    pub agent_id: String,
    pub session_id: String,
    /// The turn to end; empty or left out: the session's open turn.
    #[serde(default)]
    pub turn_id: String,
    pub status: TurnStatus,
    /// Label of the automatic checkpoint.
    #[serde(default)]
    pub label: Option<String>,
}

target!(TurnEnd: agent_id, session_id, turn_id);

/// `policy.set`: automatic checkpoints for an agent (default of its
/// sessions) or one session.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicySet {
    pub agent_id: String,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub auto_checkpoint: Option<bool>,
    #[serde(default)]
    pub keep_last: Option<u32>,
}

target!(PolicySet: agent_id, session_id);

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct TurnInfo {
    pub agent_id: String,
    pub session_id: String,
    pub turn_id: String,
    /// 1 for a session's first turn.
    pub number: u64,
    pub began_ms: u64,
    pub ended_ms: Option<u64>,
    pub status: Option<TurnStatus>,
    /// The automatic checkpoint taken at its end, if any.
    pub checkpoint_id: Option<String>,
    /// Why the automatic checkpoint could not be taken (the turn still
    /// ended).
    pub checkpoint_error: Option<String>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct PolicyInfo {
    pub agent_id: String,
    pub session_id: Option<String>,
    /// In force for this agent or session, defaults applied.
    pub auto_checkpoint: bool,
    pub keep_last: Option<u32>,
}
