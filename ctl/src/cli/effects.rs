//! `alloxctl effects`: what observed runs changed outside their
//! workspaces (the system-effects plugin), and the fences it holds.

use allox_protocol::Request;
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum EffectsCommand {
    /// One observed run's effects: per domain, what changed and who did it.
    Get {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The observed run.
        run: String,
    },
    /// A session's observed runs with their verdicts.
    List {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
    },
    /// What the observer's history recorded of a run (system calls that
    /// change state, refusals, forks, execs, exits).
    History {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The observed run.
        run: String,
        /// Continue after this sequence number.
        #[arg(long)]
        cursor: Option<u64>,
        /// Most records (default 1,000).
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Whether runs are observed, what the scope covers, and the fenced
    /// sessions (of one agent, or all).
    Status {
        /// The agent (every agent's fences if left out).
        agent: Option<String>,
    },
    /// Lift the fence a run put on its session, given that run's evidence
    /// root (it is in `effects get` and in the fence's message).
    Unfence {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The run whose fault fenced the session.
        run: String,
        /// The run's evidence root (sha256, hex).
        evidence_root: String,
    },
}

impl EffectsCommand {
    pub fn request(self) -> Request {
        use allox_protocol as p;
        match self {
            EffectsCommand::Get {
                agent,
                session,
                run,
            } => Request::EffectsGet(p::EffectsGet {
                agent_id: agent,
                session_id: session,
                run_id: run,
            }),
            EffectsCommand::List { agent, session } => Request::EffectsList(p::EffectsList {
                agent_id: agent,
                session_id: session,
            }),
            EffectsCommand::History {
                agent,
                session,
                run,
                cursor,
                limit,
            } => Request::EffectsHistory(p::EffectsHistory {
                agent_id: agent,
                session_id: session,
                run_id: run,
                cursor,
                limit,
            }),
            EffectsCommand::Status { agent } => {
                Request::EffectsStatus(p::EffectsStatusRequest { agent_id: agent })
            }
            EffectsCommand::Unfence {
                agent,
                session,
                run,
                evidence_root,
            } => Request::EffectsUnfence(p::EffectsUnfence {
                agent_id: agent,
                session_id: session,
                run_id: run,
                evidence_root,
            }),
        }
    }
}
