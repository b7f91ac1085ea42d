//! Session file sharing (the `share` plugin): what a session offers other
//! sessions (a directory of its files, readable or writable), the host's
//! view and switches (`share.list`, `share.agent.set`,
//! `share.session.set`), and the parameters and answers of the routes a
//! sandbox reaches through the in-sandbox interface (`share.enable`,
//! `share.read`, ...), which are JSON carried by `plugin.call`.
//!
//! A session reaches another's files only when both have sharing on; the
//! caller is the run whose guest socket the request came through, never a
//! field of the request. docs/share.md describes it.

use crate::target::target;
use crate::{Bytes, FsData};
use serde::{Deserialize, Serialize};

/// What other sessions may do in a session's share scope.
#[derive(
    Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum SharePermission {
    /// List, stat and read (the default).
    #[default]
    Read,
    /// Also write files (safely: a whole file is written beside the target
    /// and renamed into place), while the session has no live run.
    Write,
}

impl SharePermission {
    pub fn as_str(self) -> &'static str {
        match self {
            SharePermission::Read => "read",
            SharePermission::Write => "write",
        }
    }
}

impl std::fmt::Display for SharePermission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a session's sharing state comes from.
#[derive(
    Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum ShareOrigin {
    /// Nobody turned it on: sharing is off.
    #[default]
    Default,
    /// The session itself (`allox share enable` / `disable`).
    Session,
    /// The host (`share.session.set`).
    Host,
    /// Its agent's default (`share.agent.set --default-on`).
    Agent,
    /// Its agent may not share (`share.agent.set`, `allowed: false`).
    AgentDenied,
}

/// A session's sharing as it is now.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct ShareInfo {
    pub agent_id: String,
    pub session_id: String,
    pub enabled: bool,
    /// The directory of the session's files it offers (`.` is all of
    /// them); `None` when sharing is off.
    pub scope: Option<String>,
    pub permission: Option<SharePermission>,
    pub origin: ShareOrigin,
    /// When the current state was set (ms since the epoch); `None` for a
    /// default.
    pub since_ms: Option<u64>,
}

impl ShareInfo {
    /// `agent/session`, as routes name a target.
    pub fn target(&self) -> String {
        format!("{}/{}", self.agent_id, self.session_id)
    }
}

/// An agent's sharing settings.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct ShareAgentInfo {
    pub agent_id: String,
    /// Whether its sessions may share at all (default true); false turns
    /// every share of its sessions off and refuses `enable`.
    pub allowed: bool,
    /// Whether its sessions share without asking (default false: sharing
    /// is off by default).
    pub default_on: bool,
    /// The scope and permission of that default (`.`, read).
    pub default_scope: String,
    pub default_permission: SharePermission,
}

/// `share.list`: who shares what (every agent, or one).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct ShareList {
    #[serde(default)]
    pub agent_id: Option<String>,
}

target!(ShareList: agent_id);

/// The answer to `share.list`: the sessions that share now, and the
/// agents whose settings are not the defaults.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
pub struct ShareListing {
    pub shares: Vec<ShareInfo>,
    pub agents: Vec<ShareAgentInfo>,
}

/// `share.agent.set`: changes an agent's settings (fields left out stay
/// as they are).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct ShareAgentSet {
    pub agent_id: String,
    #[serde(default)]
    pub allowed: Option<bool>,
    #[serde(default)]
    pub default_on: Option<bool>,
    #[serde(default)]
    pub default_scope: Option<String>,
    #[serde(default)]
    pub default_permission: Option<SharePermission>,
}

target!(ShareAgentSet: agent_id);

/// `share.session.set`: turns a session's sharing on (with a scope and a
/// permission) or off, from the host.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShareSessionSet {
    pub agent_id: String,
    pub session_id: String,
    pub enabled: bool,
    /// Default `.` (all the session's files).
    #[serde(default)]
    pub scope: Option<String>,
    /// Default `read`.
    #[serde(default)]
    pub permission: Option<SharePermission>,
}

target!(ShareSessionSet: agent_id, session_id);

// ---- The guest routes' JSON (through `plugin.call`) ----

/// `share.enable`: offer this session's files to the sessions that share.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct ShareEnable {
    /// A directory of the session's files, relative (`output`); default
    /// `.`, all of them.
    #[serde(default)]
    pub scope: Option<String>,
    #[serde(default)]
    pub permission: Option<SharePermission>,
}

/// `share.status`: this session's sharing, and the sessions it can reach.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct ShareStatus {
    pub own: ShareInfo,
    /// The other sessions sharing now (empty while this one does not
    /// share: it reaches none).
    pub peers: Vec<ShareInfo>,
}

/// `share.list` (inside a sandbox) and `share.stat`: a path in a target's
/// scope.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct SharePath {
    /// `agent/session`.
    pub target: String,
    /// Relative to the target's scope; default its root.
    #[serde(default)]
    pub path: Option<String>,
    /// `share.list` only: how deep (default 1).
    #[serde(default)]
    pub depth: Option<u32>,
}

/// `share.read`: a part of a file in a target's scope.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct ShareRead {
    pub target: String,
    pub path: String,
    #[serde(default)]
    pub offset: Option<u64>,
    #[serde(default)]
    pub length: Option<u64>,
    /// The `tree` of an earlier answer: refused with `conflict` if the
    /// target's files were replaced since (a rollback), so the parts of a
    /// file read in several requests come from one tree.
    #[serde(default)]
    pub tree: Option<u64>,
}

/// The answer to `share.read`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct ShareData {
    #[serde(flatten)]
    pub file: FsData,
    /// Which tree of the target's files this was read from: it changes
    /// when a rollback replaces them.
    pub tree: u64,
}

/// `share.write`: a file in a target's scope (which must allow writes).
/// Without `offset` the whole file becomes `data`, written beside it and
/// renamed into place; with `upload`, chunks go to a file beside it that
/// the chunk with `commit` renames into place (as `fs.write`).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct ShareWrite {
    pub target: String,
    pub path: String,
    pub data: Bytes,
    #[serde(default)]
    pub offset: Option<u64>,
    #[serde(default)]
    pub upload: Option<String>,
    #[serde(default)]
    pub commit: bool,
    /// Default true.
    #[serde(default)]
    pub create: Option<bool>,
}

/// The most one `share.write` carries (its JSON must fit a guest frame).
pub const SHARE_WRITE_MAX: usize = 256 * 1024;
/// The most one `share.read` answers.
pub const SHARE_READ_MAX: u64 = 256 * 1024;

/// One line of the share audit (`state/share-audit.log`): who asked what
/// of whom, and how it went.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct ShareAuditRecord {
    /// Numbered from 1.
    pub seq: u64,
    pub time_ms: u64,
    /// `agent/session/run` of the caller (or `host`).
    pub caller: String,
    /// The route or action (`share.read`, `share.disable`, ...).
    pub route: String,
    /// `agent/session` acted on.
    pub target: String,
    pub path: Option<String>,
    /// `ok`, or the error code.
    pub verdict: String,
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_parameters_refuse_unknown_fields_and_name_targets_only_as_targets() {
        let e = serde_json::from_str::<ShareEnable>(r#"{"scope":"out","agent_id":"b"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `agent_id`"), "{e}");
        let r: ShareRead =
            serde_json::from_str(r#"{"target":"agent-b/session-1","path":"report.txt"}"#).unwrap();
        assert_eq!(r.offset, None);
        let p: SharePermission = serde_json::from_str(r#""write""#).unwrap();
        assert_eq!(p, SharePermission::Write);
        assert!(serde_json::from_str::<SharePermission>(r#""admin""#).is_err());
    }

    #[test]
    fn read_answers_carry_the_file_and_its_tree_flat() {
        let d = ShareData {
            file: FsData {
                path: "r.txt".into(),
                offset: 0,
                data: Bytes(b"hi".to_vec()),
                size: 2,
                eof: true,
                inode: 257,
            },
            tree: 260,
        };
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["data"], "aGk=");
        assert_eq!(v["tree"], 260);
        assert_eq!(serde_json::from_value::<ShareData>(v).unwrap(), d);
    }
}
