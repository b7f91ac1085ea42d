//! A session's ports served to the host: `port.expose|unexpose|list`, and
//! `port.connect`, by which a client on the daemon's Unix socket (the
//! gateway, `alloxctl port forward`) gets a connection to a port of a
//! session's own loopback.

use crate::target::target;
use serde::{Deserialize, Serialize};

/// `port.expose`: serve `port` of the session's own loopback to the host,
/// through the gateway (at the port's own host, `{host}.{ports domain}`,
/// an origin of its own for a browser; and at
/// `/v1/ports/{agent}/{session}/{port}/` for a client with the gateway's
/// token) and `alloxctl port forward`. The session must have a network of
/// its own (`isolated` or `proxy`). Exposing it again while it is exposed
/// keeps its token and its host (only `public` changes); once unexposed,
/// it gets new ones.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PortExpose {
    pub agent_id: String,
    pub session_id: String,
    pub port: u16,
    /// Served without a token (anyone who reaches the gateway). By
    /// default the gateway's token or the port's own is needed.
    #[serde(default)]
    pub public: bool,
}

target!(PortExpose, |r| format!(
    "{}/{}/port-{}",
    r.agent_id, r.session_id, r.port
));

/// `port.unexpose`: stop serving a port (connections open end).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PortUnexpose {
    pub agent_id: String,
    pub session_id: String,
    pub port: u16,
}

target!(PortUnexpose, |r| format!(
    "{}/{}/port-{}",
    r.agent_id, r.session_id, r.port
));

/// `port.list`: the exposed ports of an agent's sessions (or of one).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PortList {
    pub agent_id: String,
    #[serde(default)]
    pub session_id: Option<String>,
}

target!(PortList: agent_id, session_id);

/// `port.connect`: a connection to an exposed port, relayed by the daemon
/// to the Unix stream socket whose descriptor comes with the request
/// (`SCM_RIGHTS`; only on the daemon's Unix socket). Refused
/// `unauthorized` unless the port is public, `authorized` (the caller
/// checked the gateway's token) or `token` is the port's.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PortConnect {
    /// The port's agent, session and number; left empty (and 0) when
    /// `host` names the port.
    #[serde(default)]
    pub agent_id: String,
    #[serde(default)]
    pub session_id: String,
    #[serde(default)]
    pub port: u16,
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub authorized: bool,
    /// The port's own host ([`PortInfo::host`]), for a request that came
    /// to it: the port connected is the one exposed at that host (refused
    /// `not_found` when none is, or when agent, session and port are given
    /// too and are not that port's).
    #[serde(default)]
    pub host: Option<String>,
}

target!(PortConnect, |r| match (&r.host, r.agent_id.is_empty()) {
    (Some(h), true) => format!("port-host/{h}"),
    _ => format!("{}/{}/port-{}", r.agent_id, r.session_id, r.port),
});

/// An exposed port.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct PortInfo {
    pub agent_id: String,
    pub session_id: String,
    pub port: u16,
    pub public: bool,
    /// The port's own token: what a browser can be handed
    /// (`…/{port}/?token=…` once, then a cookie scoped to the port's path).
    pub token: String,
    /// Where the gateway serves it to a client with its token.
    pub path: String,
    /// The port's own host, `{port}-{16 hex digits}` (random; kept while
    /// the port stays exposed, new once it was unexposed): the
    /// gateway serves the port at `http://{host}.{ports domain}:{its
    /// port}/` (`{host}.localhost` by default), an origin no other port
    /// shares, which is where a browser is sent.
    pub host: String,
    /// When it was exposed, milliseconds since the Unix epoch.
    pub exposed_ms: u64,
}

/// The answer to `port.list`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct PortListing {
    pub ports: Vec<PortInfo>,
}

/// The answer to `port.connect`: the connection is open and relayed.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct PortConnected {
    pub agent_id: String,
    pub session_id: String,
    pub port: u16,
    /// The port's own host ([`PortInfo::host`]).
    pub host: String,
}

/// Whether `label` has the form of a port's own host
/// ([`PortInfo::host`]): `{port}-{16 lowercase hex digits}`.
pub fn is_port_host(label: &str) -> bool {
    let Some((port, id)) = label.split_once('-') else {
        return false;
    };
    port.parse::<u16>().is_ok_and(|p| p > 0)
        && !port.starts_with('0')
        && id.len() == 16
        && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Where the gateway serves a session's port.
pub fn port_path(agent: &str, session: &str, port: u16) -> String {
    format!("/v1/ports/{agent}/{session}/{port}/")
}
