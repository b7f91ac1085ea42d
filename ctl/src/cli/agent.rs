//! `alloxctl agent`: create, list and delete agents.

use super::net::NetworkArgs;
use allox_protocol::{AgentCreate, AgentDelete, AgentList, Request};
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum AgentCommand {
    /// Create an agent and its workspace.
    Create {
        /// The agent.
        agent: String,
        /// Its sessions' default network mode and rules for all of them.
        #[command(flatten)]
        network: NetworkArgs,
        /// Its sessions' idle timeout, ms, unless they ask for their own.
        #[arg(long, value_name = "MS")]
        idle_timeout_ms: Option<u64>,
        /// Its sessions' lifetime, ms, unless they ask for their own.
        #[arg(long, value_name = "MS")]
        max_lifetime_ms: Option<u64>,
    },
    /// List agents.
    List,
    /// Delete an agent with its shared/ (refused while it has sessions,
    /// unless --force).
    Delete {
        /// The agent.
        agent: String,
        /// Delete its sessions too, with their workspaces and checkpoints
        /// (pinned ones included).
        #[arg(long)]
        force: bool,
    },
}

impl AgentCommand {
    pub fn request(self) -> Request {
        match self {
            AgentCommand::Create {
                agent,
                network,
                idle_timeout_ms,
                max_lifetime_ms,
            } => Request::AgentCreate(AgentCreate {
                network: network.mode(),
                egress: network.egress.egress(),
                idle_timeout_ms,
                max_lifetime_ms,
                ..AgentCreate::new(agent)
            }),
            AgentCommand::List => Request::AgentList(AgentList {}),
            AgentCommand::Delete { agent, force } => Request::AgentDelete(AgentDelete {
                force,
                ..AgentDelete::new(agent)
            }),
        }
    }
}
