//! `alloxctl port`: a session's ports served to the host (`port.expose`,
//! `port.unexpose`, `port.list`), and `port forward`, a plain TCP
//! forward from a port of this host to one of a session's.

use super::Action;
use allox_protocol::Request;
use clap::Subcommand;
use std::net::SocketAddr;

#[derive(Subcommand, Debug)]
pub enum PortCommand {
    /// Serve a port of the session's own loopback through the gateway
    /// (`/v1/ports/AGENT/SESSION/PORT/`, with the gateway's token or the
    /// port's own) and `port forward`.
    Expose {
        /// The agent.
        agent: String,
        /// The session (isolated or proxy).
        session: String,
        /// The port on the session's loopback.
        port: u16,
        /// Serve it without any token (anyone who reaches the gateway).
        #[arg(long)]
        public: bool,
    },
    /// Stop serving a port.
    Unexpose {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The port.
        port: u16,
    },
    /// The exposed ports of an agent's sessions (or of one), with each
    /// one's path and token.
    List {
        /// The agent.
        agent: String,
        /// The session.
        session: Option<String>,
    },
    /// Forward connections to an address of this host to an exposed port
    /// of the session, until interrupted.
    Forward {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The port.
        port: u16,
        /// Where to listen (ADDRESS:PORT).
        #[arg(long, value_name = "ADDRESS:PORT", default_value = "127.0.0.1:0")]
        listen: SocketAddr,
    },
}

impl PortCommand {
    pub fn action(self) -> Action {
        match self {
            PortCommand::Expose {
                agent,
                session,
                port,
                public,
            } => Action::Call(Request::PortExpose(allox_protocol::PortExpose {
                agent_id: agent,
                session_id: session,
                port,
                public,
            })),
            PortCommand::Unexpose {
                agent,
                session,
                port,
            } => Action::Call(Request::PortUnexpose(allox_protocol::PortUnexpose {
                agent_id: agent,
                session_id: session,
                port,
            })),
            PortCommand::List { agent, session } => {
                Action::Call(Request::PortList(allox_protocol::PortList {
                    agent_id: agent,
                    session_id: session,
                }))
            }
            PortCommand::Forward {
                agent,
                session,
                port,
                listen,
            } => Action::PortForward {
                agent,
                session,
                port,
                listen,
            },
        }
    }
}
