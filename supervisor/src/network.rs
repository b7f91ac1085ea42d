//! The session network as the core sees it: a session's mode resolved
//! when it is made (its own, else its agent's, else the daemon's), the
//! egress rules of a request read before anything is made, and the
//! network a start hands to the runs. The proxy and the broker are the
//! `network` plugin's (`plugins/network.rs`).

use crate::error::RequestError;
use crate::plugins::{network as plugin, SessionNetwork};
use crate::supervisor::Supervisor;
use allox_protocol::{Egress, NetworkMode};

/// Reads every rule of `e`; the first that does not read is the error.
pub fn check_egress(e: &Egress) -> Result<(), RequestError> {
    let none: &[String] = &[];
    allox_network::Layer::new("check", e.allow.as_deref(), none).map_err(|source| {
        RequestError::EgressRule {
            list: "allow",
            source,
        }
    })?;
    allox_network::Layer::new("check", None, &e.deny).map_err(|source| {
        RequestError::EgressRule {
            list: "deny",
            source,
        }
    })?;
    Ok(())
}

impl Supervisor {
    /// Checks what an `agent.create` or `session.create` asks of the
    /// network, before anything is made.
    pub(crate) fn check_network(
        &self,
        mode: Option<NetworkMode>,
        egress: Option<&Egress>,
    ) -> Result<(), RequestError> {
        if mode == Some(NetworkMode::Proxy) && !self.plugins.has(plugin::NAME) {
            return Err(RequestError::NetworkNeedsPlugin(NetworkMode::Proxy));
        }
        egress.map(check_egress).transpose()?;
        Ok(())
    }

    /// The mode a new session of agent `a` gets when it asks for `asked`.
    pub(crate) fn resolve_mode(
        &self,
        a: &str,
        asked: Option<NetworkMode>,
    ) -> Result<NetworkMode, RequestError> {
        let mode = match asked {
            Some(m) => m,
            None => self
                .store
                .network_of(a, None)?
                .mode
                .unwrap_or(self.network_default),
        };
        self.check_network(Some(mode), None)?;
        Ok(mode)
    }

    /// Session `a/s`'s network, as a start needs it.
    pub(crate) fn session_network(&self, a: &str, s: &str) -> Result<SessionNetwork, RequestError> {
        let agent = self.store.network_of(a, None)?;
        let session = self.store.network_of(a, Some(s))?;
        Ok(SessionNetwork {
            // A session made before modes were recorded has the daemon's.
            mode: session.mode.unwrap_or(self.network_default),
            agent: agent.egress,
            session: session.egress,
        })
    }
}
