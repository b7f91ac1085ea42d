//! The session network: the mode and egress rules `agent create` and
//! `session create` take, and `alloxctl net` (policy, audit).

use super::{Action, PageArgs};
use allox_protocol::Request;
use clap::{Args, Subcommand};

/// A network mode and egress rules, as `agent create` and `session
/// create` take them.
#[derive(Args, Debug, Default, PartialEq)]
pub struct NetworkArgs {
    /// The network mode: disabled, isolated or proxy (docs/network.md).
    #[arg(long, value_name = "MODE", value_parser = ["disabled", "isolated", "proxy"])]
    pub network: Option<String>,
    #[command(flatten)]
    pub egress: EgressArgs,
}

/// Egress rules (`host[:port]`, `*.domain`, an address or network, `*`).
#[derive(Args, Debug, Default, PartialEq)]
pub struct EgressArgs {
    /// Allow this (repeatable); without any, this level does not narrow.
    #[arg(long = "allow", value_name = "RULE")]
    pub allow: Vec<String>,
    /// Deny this (repeatable); a deny always wins.
    #[arg(long = "deny", value_name = "RULE")]
    pub deny: Vec<String>,
}

impl EgressArgs {
    /// `None` when no rule is given.
    pub fn egress(self) -> Option<allox_protocol::Egress> {
        if self.allow.is_empty() && self.deny.is_empty() {
            return None;
        }
        Some(allox_protocol::Egress {
            allow: (!self.allow.is_empty()).then_some(self.allow),
            deny: self.deny,
        })
    }
}

impl NetworkArgs {
    pub fn mode(&self) -> Option<allox_protocol::NetworkMode> {
        self.network
            .as_deref()
            .and_then(allox_protocol::NetworkMode::parse)
    }
}

#[derive(Subcommand, Debug)]
pub enum NetCommand {
    /// Show an agent's or a session's network mode and egress rules; with
    /// --allow or --deny, replace that level's rules (live sessions apply
    /// them to their next connection).
    Policy {
        /// The agent.
        agent: String,
        /// The session (every session's of the agent if left out).
        session: Option<String>,
        #[command(flatten)]
        egress: EgressArgs,
    },
    /// Connection attempts through the sessions' proxies, oldest first.
    Audit {
        /// The agent (every agent's if left out).
        agent: Option<String>,
        /// The session (every session's of the agent if left out).
        session: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
}

impl NetCommand {
    pub fn action(self) -> Action {
        match self {
            NetCommand::Policy {
                agent,
                session,
                egress,
            } => Action::Call(match egress.egress() {
                Some(egress) => Request::NetworkPolicySet(allox_protocol::NetworkPolicySet {
                    agent_id: agent,
                    session_id: session,
                    egress,
                }),
                None => Request::NetworkPolicyGet(allox_protocol::NetworkPolicyGet {
                    agent_id: agent,
                    session_id: session,
                }),
            }),
            NetCommand::Audit {
                agent,
                session,
                page,
            } => page.action(Request::NetworkAudit(allox_protocol::NetworkAudit {
                agent_id: agent,
                session_id: session,
                cursor: page.cursor,
                limit: page.limit,
                follow: page.follow,
            })),
        }
    }
}
