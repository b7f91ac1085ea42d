//! The session network's part of the protocol: a session's mode, the
//! egress rules of an agent or a session, and the record of each
//! connection attempt (`network.policy.set|get`, `network.audit`).

use crate::target::target;
use serde::{Deserialize, Serialize};

/// What a session's sandboxes can reach.
#[derive(
    Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// The session network is off: the sandbox's execution path as the
    /// daemon has it (`--sandbox-network`).
    #[default]
    Disabled,
    /// A network namespace of the session's own, with a loopback only.
    Isolated,
    /// `isolated`, plus an HTTP proxy at `127.0.0.1:3128` inside it that
    /// reaches the network only through the broker, under the egress
    /// policy.
    Proxy,
}

impl NetworkMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::Disabled => "disabled",
            NetworkMode::Isolated => "isolated",
            NetworkMode::Proxy => "proxy",
        }
    }

    /// `disabled`, `isolated` or `proxy`.
    pub fn parse(s: &str) -> Option<NetworkMode> {
        [
            NetworkMode::Disabled,
            NetworkMode::Isolated,
            NetworkMode::Proxy,
        ]
        .into_iter()
        .find(|m| m.as_str() == s)
    }
}

impl std::fmt::Display for NetworkMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Egress rules of one level (the daemon, an agent, a session): each rule
/// `host[:port]`, `*.domain[:port]`, an address or a network
/// (`10.0.0.0/8`), or `*`. A connection must pass every level: any deny
/// refuses it, and a level with an allow list refuses what is not on it.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct Egress {
    /// `None`: this level does not narrow what is allowed.
    #[serde(default)]
    pub allow: Option<Vec<String>>,
    #[serde(default)]
    pub deny: Vec<String>,
}

/// `network.policy.set`: replaces the egress rules of an agent (every
/// session of it) or of one session. Live sessions apply them to their
/// next connection.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicySet {
    pub agent_id: String,
    #[serde(default)]
    pub session_id: Option<String>,
    pub egress: Egress,
}

target!(NetworkPolicySet: agent_id, session_id);

/// `network.policy.get`: an agent's or a session's mode and rules.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicyGet {
    pub agent_id: String,
    #[serde(default)]
    pub session_id: Option<String>,
}

target!(NetworkPolicyGet: agent_id, session_id);

/// One level's rules, as a policy answer shows them.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct EgressLevel {
    /// `daemon`, `agent` or `session`.
    pub level: String,
    pub egress: Egress,
}

/// The answer to `network.policy.set|get`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct NetworkPolicyInfo {
    pub agent_id: String,
    pub session_id: Option<String>,
    /// The session's mode (an agent's: the default of its new sessions).
    pub mode: NetworkMode,
    /// Every level that applies, outermost first; a connection must pass
    /// them all.
    pub levels: Vec<EgressLevel>,
}

/// `network.audit`: connection attempts, oldest first, filtered by agent
/// and session; `cursor` continues after the last record of an earlier
/// answer. With `follow`, matching records keep coming as stream events
/// after the answer's backlog, until the client goes.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct NetworkAudit {
    #[serde(default)]
    pub agent_id: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
    /// Sequence number to continue after (exclusive).
    #[serde(default)]
    pub cursor: Option<u64>,
    /// Most records in the answer (default 1,000, at most 10,000).
    #[serde(default)]
    pub limit: Option<u32>,
    #[serde(default)]
    pub follow: bool,
}

target!(NetworkAudit: agent_id, session_id);

/// One connection attempt through a session's proxy.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct NetworkAuditRecord {
    /// Position in the audit, from 1.
    pub seq: u64,
    /// When the attempt was decided, milliseconds since the Unix epoch.
    pub time_ms: u64,
    pub agent_id: String,
    pub session_id: String,
    /// The run whose process connected, when the broker could tell.
    pub run_id: Option<String>,
    /// `CONNECT` (a tunnel) or `HTTP` (an absolute URI).
    pub kind: String,
    /// As the client asked.
    pub host: String,
    pub port: u16,
    /// The address connected to (or the one refused).
    pub address: Option<String>,
    pub allowed: bool,
    /// `allowed`, or why not.
    pub verdict: String,
    /// Bytes from the client to the server, and back.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Secrets the broker put into this request (by name).
    #[serde(default)]
    pub secrets_injected: Vec<String>,
    /// Secrets whose placeholders went out as they were: the request was
    /// to a host the secret does not name.
    #[serde(default)]
    pub secrets_withheld: Vec<String>,
    /// Whether the broker terminated the client's TLS (a secret asked for
    /// interception of this host).
    #[serde(default)]
    pub intercepted: bool,
    /// A connection allowed and now open, recorded as its bytes begin to
    /// flow (its bytes not counted): a connection is in the audit while it
    /// lasts. Its record without `open` follows when it ends, with the
    /// bytes (none if the daemon stopped first).
    #[serde(default)]
    pub open: bool,
}

/// The answer to `network.audit`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct NetworkAuditListing {
    pub records: Vec<NetworkAuditRecord>,
    /// The cursor to continue from.
    pub next_cursor: u64,
}

/// A secret's value: carried as the string it is, never shown (`Debug`
/// prints a stand-in), and wiped from memory when dropped.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, PartialEq, Eq, Default)]
#[serde(transparent)]
pub struct SecretValue(pub String);

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretValue(<not shown>)")
    }
}

impl Drop for SecretValue {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

/// `secret.set`: a credential the runs of an agent's `proxy` sessions (or
/// of one session) can use but never read. A run sees `NAME` set to a
/// placeholder; the broker replaces the placeholder with the value in
/// requests to the hosts named here, and only there. Setting a secret
/// again replaces it (its placeholder stays). Host actions only.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SecretSet {
    pub agent_id: String,
    /// `None`: every session of the agent.
    #[serde(default)]
    pub session_id: Option<String>,
    /// The run's environment variable (letters, digits, `_`).
    pub name: String,
    pub value: SecretValue,
    /// Where the value may go: rules as the egress policy writes them
    /// (`api.test`, `*.api.test`, `api.test:8443`), matched against the
    /// host the client asked for. `*` is refused.
    pub hosts: Vec<String>,
    /// A header the broker sets on requests to those hosts, `{}` standing
    /// for the value: `Authorization: Bearer {}`.
    #[serde(default)]
    pub header: Option<String>,
    /// A query parameter the broker adds to requests to those hosts.
    #[serde(default)]
    pub query: Option<String>,
    /// Intercept HTTPS to those hosts: the broker terminates the client's
    /// TLS with the session's own certificate authority (which the
    /// session's runs trust) and verifies the server's certificate itself.
    #[serde(default)]
    pub intercept: bool,
}

target!(SecretSet: agent_id, session_id, name);

/// `secret.list`: an agent's secrets (and, with `session_id`, that
/// session's own): names, hosts and placeholders, never values.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SecretList {
    pub agent_id: String,
    #[serde(default)]
    pub session_id: Option<String>,
}

target!(SecretList: agent_id, session_id);

/// `secret.delete`: one secret of an agent, or of one of its sessions.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SecretDelete {
    pub agent_id: String,
    #[serde(default)]
    pub session_id: Option<String>,
    pub name: String,
}

target!(SecretDelete: agent_id, session_id, name);

/// A secret, as `secret.set|list` show it: everything but its value.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct SecretInfo {
    pub agent_id: String,
    /// `None`: the agent's, for every session of it.
    pub session_id: Option<String>,
    pub name: String,
    pub hosts: Vec<String>,
    pub header: Option<String>,
    pub query: Option<String>,
    pub intercept: bool,
    /// What the runs see in `NAME`.
    pub placeholder: String,
    /// When it was last set, milliseconds since the Unix epoch.
    pub updated_ms: u64,
}

/// The answer to `secret.list`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct SecretListing {
    pub secrets: Vec<SecretInfo>,
}
