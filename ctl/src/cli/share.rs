//! `alloxctl share`: sharing of sessions' files between sessions (the
//! share plugin).

use allox_protocol::{Request, SharePermission};
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum ShareCommand {
    /// The sessions sharing now (of every agent, or one), and the agents'
    /// settings that are not the defaults.
    List {
        /// The agent (every agent's if left out).
        agent: Option<String>,
    },
    /// Show an agent's sharing settings, changing those given.
    Agent {
        /// The agent.
        agent: String,
        /// Whether its sessions may share at all (`no` turns every share
        /// of its sessions off and refuses `enable`).
        #[arg(long, value_name = "yes|no", value_parser = yes_no)]
        allowed: Option<bool>,
        /// Whether its sessions share without running `enable` (sharing is
        /// off by default).
        #[arg(long, value_name = "on|off", value_parser = on_off)]
        default: Option<bool>,
        /// The scope of that default (a directory of each session's files).
        #[arg(long, value_name = "DIR")]
        default_scope: Option<String>,
        /// The permission of that default (read-only by default).
        #[arg(long, value_name = "read|write", value_parser = permission)]
        default_permission: Option<SharePermission>,
    },
    /// Turn a session's sharing on or off, as the host.
    Session {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// Whether it shares.
        #[arg(value_name = "on|off", value_parser = on_off, action = clap::ArgAction::Set)]
        state: bool,
        /// A directory of the session's files (default: all of them).
        #[arg(long, value_name = "DIR")]
        scope: Option<String>,
        /// What the other sessions may do there (read-only by default).
        #[arg(long, value_name = "read|write", value_parser = permission)]
        permission: Option<SharePermission>,
    },
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?} is neither on nor off")),
    }
}

fn yes_no(s: &str) -> Result<bool, String> {
    match s {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!("{s:?} is neither yes nor no")),
    }
}

fn permission(s: &str) -> Result<SharePermission, String> {
    match s {
        "read" => Ok(SharePermission::Read),
        "write" => Ok(SharePermission::Write),
        _ => Err(format!("{s:?} is neither read nor write")),
    }
}

impl ShareCommand {
    pub fn request(self) -> Request {
        match self {
            ShareCommand::List { agent } => {
                Request::ShareList(allox_protocol::ShareList { agent_id: agent })
            }
            ShareCommand::Agent {
                agent,
                allowed,
                default,
                default_scope,
                default_permission,
            } => Request::ShareAgentSet(allox_protocol::ShareAgentSet {
                agent_id: agent,
                allowed,
                default_on: default,
                default_scope,
                default_permission,
            }),
            ShareCommand::Session {
                agent,
                session,
                state,
                scope,
                permission,
            } => Request::ShareSessionSet(allox_protocol::ShareSessionSet {
                agent_id: agent,
                session_id: session,
                enabled: state,
                scope,
                permission,
            }),
        }
    }
}
