//! A session: `alloxctl session` (create, list, delete, fork, pause,
//! resume), what it uses
//! (`stats`, `top`) and its limits (`limit`).

use super::net::NetworkArgs;
use super::Action;
use allox_protocol::{AgentRef, Request, SessionCreate, SessionDelete, SessionFork};
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum SessionCommand {
    /// Create a session of an agent.
    Create {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// Its network mode (else its agent's, else the daemon's) and its
        /// own egress rules.
        #[command(flatten)]
        network: NetworkArgs,
        /// Paused after this many ms without a request and without CPU
        /// used (the next request resumes it).
        #[arg(long, value_name = "MS")]
        idle_timeout_ms: Option<u64>,
        /// Expired this many ms after it is made: processes killed,
        /// changes refused until `alloxctl limit --max-lifetime-ms`.
        #[arg(long, value_name = "MS")]
        max_lifetime_ms: Option<u64>,
    },
    /// One session: its head, checkpoints, whether it is paused, its idle
    /// timeout and when it expires.
    Info {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
    },
    /// List an agent's sessions.
    List {
        /// The agent.
        agent: String,
    },
    /// Delete a session with its checkpoints (refused while it holds
    /// pinned ones, unless --force).
    Delete {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// Delete its pinned checkpoints too.
        #[arg(long)]
        force: bool,
    },
    /// Freeze every process of a session (they keep their state, use no
    /// CPU); the next request that needs it to run resumes it, unless
    /// --hold.
    Pause {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// Refuse requests that need it to run until `session resume`.
        #[arg(long)]
        hold: bool,
    },
    /// Let a paused session's processes run again.
    Resume {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
    },
    /// Make a new session from a checkpoint of a session, or from its
    /// current/ as it is now: a writable snapshot, with its own history
    /// starting at a baseline `fork`; network, policy and limits copied.
    Fork {
        /// The source session's agent.
        agent: String,
        /// The source session.
        session: String,
        /// The new session, `SESSION` or `AGENT/SESSION` (another agent).
        new_session: String,
        /// A checkpoint of the source, or `current`.
        #[arg(long, default_value = "current")]
        from: String,
        /// A label for the new session's baseline.
        #[arg(long)]
        label: Option<String>,
    },
    /// Write a session with its whole checkpoint history (checkpoints,
    /// their DAG, labels, pins, turns; its network, policy and limits; its
    /// current/ as it is now) as an archive, to a file or standard output.
    /// No process state travels.
    Export {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// Only what came after this checkpoint (which the importing side
        /// has).
        #[arg(long)]
        since: Option<String>,
        /// Write here (aside, then renamed), not to standard output.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Make a session from an archive of `session export` (a file, or
    /// standard input), in one step or not at all. The agent must exist.
    Import {
        /// The agent.
        agent: String,
        /// The session's id here (else the archive's).
        session: Option<String>,
        /// Read this file, not standard input.
        #[arg(short, long, value_name = "FILE")]
        input: Option<PathBuf>,
    },
    /// Copy a session with its whole history to another daemon (its
    /// control socket), straight from one to the other; the agent is made
    /// there if it does not exist. With --since, only what came after that
    /// checkpoint, added to the copy there. The session here stays.
    Move {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The other daemon's control socket.
        #[arg(long, value_name = "SOCKET")]
        to: PathBuf,
        /// Its id there (else the same).
        #[arg(long = "as", value_name = "SESSION")]
        new_session: Option<String>,
        /// Only what came after this checkpoint, added to the session there
        /// (which has it from an earlier move).
        #[arg(long)]
        since: Option<String>,
    },
}

impl SessionCommand {
    pub fn action(self) -> Action {
        match self {
            SessionCommand::Export {
                agent,
                session,
                since,
                output,
            } => Action::SessionExport {
                query: allox_protocol::SessionExport {
                    agent_id: agent,
                    session_id: session,
                    since,
                },
                out: output,
            },
            SessionCommand::Import {
                agent,
                session,
                input,
            } => Action::SessionImport {
                agent,
                session,
                input,
            },
            SessionCommand::Move {
                agent,
                session,
                to,
                new_session,
                since,
            } => Action::SessionMove {
                agent,
                session,
                to,
                new_session,
                since,
            },
            other => Action::Call(other.request()),
        }
    }

    fn request(self) -> Request {
        match self {
            SessionCommand::Create {
                agent,
                session,
                network,
                idle_timeout_ms,
                max_lifetime_ms,
            } => Request::SessionCreate(SessionCreate {
                network: network.mode(),
                egress: network.egress.egress(),
                idle_timeout_ms,
                max_lifetime_ms,
                ..SessionCreate::new(agent, session)
            }),
            SessionCommand::Info { agent, session } => {
                Request::SessionInfoRequest(allox_protocol::SessionRef {
                    agent_id: agent,
                    session_id: session,
                })
            }
            SessionCommand::List { agent } => Request::SessionList(AgentRef { agent_id: agent }),
            SessionCommand::Delete {
                agent,
                session,
                force,
            } => Request::SessionDelete(SessionDelete {
                force,
                ..SessionDelete::new(agent, session)
            }),
            SessionCommand::Pause {
                agent,
                session,
                hold,
            } => Request::SessionPause(allox_protocol::SessionPause {
                agent_id: agent,
                session_id: session,
                hold,
            }),
            SessionCommand::Resume { agent, session } => {
                Request::SessionResume(allox_protocol::SessionRef {
                    agent_id: agent,
                    session_id: session,
                })
            }
            SessionCommand::Fork {
                agent,
                session,
                new_session,
                from,
                label,
            } => {
                let (new_agent_id, new_session_id) = match new_session.split_once('/') {
                    Some((a, s)) => (Some(a.to_string()), s.to_string()),
                    None => (None, new_session),
                };
                Request::SessionFork(SessionFork {
                    agent_id: agent,
                    session_id: session,
                    from,
                    new_agent_id,
                    new_session_id,
                    label,
                })
            }
            SessionCommand::Export { .. }
            | SessionCommand::Import { .. }
            | SessionCommand::Move { .. } => unreachable!("answered by action()"),
        }
    }
}

/// `alloxctl stats`.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// The agent.
    pub agent: String,
    /// The session.
    pub session: String,
}

impl StatsArgs {
    pub fn request(self) -> Request {
        Request::SessionStats(allox_protocol::SessionStatsRequest {
            agent_id: self.agent,
            session_id: self.session,
        })
    }
}

/// `alloxctl top`.
#[derive(Args, Debug)]
pub struct TopArgs {
    /// Seconds between screens.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// One screen (two samples an interval apart), then exit.
    #[arg(long)]
    pub once: bool,
}

impl TopArgs {
    pub fn action(self) -> Action {
        Action::Top {
            interval: self.interval,
            once: self.once,
        }
    }
}

/// `alloxctl limit`.
#[derive(Args, Debug)]
pub struct LimitArgs {
    /// The agent.
    pub agent: String,
    /// The session.
    pub session: String,
    /// Most processes at once.
    #[arg(long)]
    pub pids_max: Option<u64>,
    /// Most memory, bytes.
    #[arg(long)]
    pub memory_max: Option<u64>,
    /// "QUOTA PERIOD" in µs, e.g. "50000 100000" for half a CPU.
    #[arg(long, value_name = "QUOTA PERIOD")]
    pub cpu_max: Option<String>,
    /// A new idle timeout, ms (0: none).
    #[arg(long, value_name = "MS")]
    pub idle_timeout_ms: Option<u64>,
    /// A new lifetime, ms from now (0: none); an expired session takes
    /// changes again.
    #[arg(long, value_name = "MS")]
    pub max_lifetime_ms: Option<u64>,
}

impl LimitArgs {
    pub fn request(self) -> Request {
        Request::SessionUpdate(allox_protocol::SessionUpdate {
            agent_id: self.agent,
            session_id: self.session,
            pids_max: self.pids_max,
            memory_max: self.memory_max,
            cpu_max: self.cpu_max,
            idle_timeout_ms: self.idle_timeout_ms,
            max_lifetime_ms: self.max_lifetime_ms,
        })
    }
}
