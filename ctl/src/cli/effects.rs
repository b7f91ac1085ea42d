//! `alloxctl effects`: what observed runs changed outside their
//! workspaces (the system-effects plugin), and the fences it holds.

use super::Action;
use allox_protocol::Request;
use clap::Subcommand;
use std::path::PathBuf;

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
    /// Check a run's evidence with the independent verifier: in the
    /// daemon (`effects verify AGENT SESSION RUN`), or here over an export
    /// (`effects verify --export FILE`, by the `allox-system-effects-verify`
    /// beside alloxctl). Prints the first bad file and record, if any, and
    /// exits 1 then; with --json, the verifier's report exactly as it
    /// wrote it (the same bytes wherever it runs).
    Verify {
        /// The agent (with the daemon).
        #[arg(required_unless_present = "export")]
        agent: Option<String>,
        /// The session.
        #[arg(required_unless_present = "export")]
        session: Option<String>,
        /// The observed run.
        #[arg(required_unless_present = "export")]
        run: Option<String>,
        /// The evidence root kept from the run's answer: a set whose chain
        /// was made again does not end there.
        #[arg(long, value_name = "HEX")]
        root: Option<String>,
        /// Verify this export (from `effects export`) here, not in the
        /// daemon.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["agent", "session", "run"])]
        export: Option<PathBuf>,
        /// The verifier to run over an export (default:
        /// `allox-system-effects-verify` beside alloxctl, else on PATH).
        #[arg(long, value_name = "FILE", requires = "export")]
        verifier: Option<PathBuf>,
    },
    /// Write a closed run's evidence set as one tar archive (to FILE with
    /// -o, else to standard output), for `effects verify --export`.
    Export {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The observed run.
        run: String,
        /// Write here instead of to standard output.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

impl EffectsCommand {
    /// What the command asks alloxctl to do.
    pub fn action(self) -> Action {
        use allox_protocol as p;
        let call = Action::Call;
        match self {
            EffectsCommand::Verify {
                agent,
                session,
                run,
                root,
                export,
                verifier,
            } => Action::EffectsVerify {
                query: match (agent, session, run) {
                    (Some(agent_id), Some(session_id), Some(run_id)) if export.is_none() => {
                        Some(allox_protocol::EffectsVerify {
                            agent_id,
                            session_id,
                            run_id,
                            evidence_root: root.clone(),
                        })
                    }
                    _ => None,
                },
                export,
                root,
                verifier,
            },
            EffectsCommand::Export {
                agent,
                session,
                run,
                output,
            } => Action::EffectsExport {
                query: allox_protocol::EffectsExport {
                    agent_id: agent,
                    session_id: session,
                    run_id: run,
                    offset: None,
                },
                out: output,
            },
            EffectsCommand::Get {
                agent,
                session,
                run,
            } => call(Request::EffectsGet(p::EffectsGet {
                agent_id: agent,
                session_id: session,
                run_id: run,
            })),
            EffectsCommand::List { agent, session } => call(Request::EffectsList(p::EffectsList {
                agent_id: agent,
                session_id: session,
            })),
            EffectsCommand::History {
                agent,
                session,
                run,
                cursor,
                limit,
            } => call(Request::EffectsHistory(p::EffectsHistory {
                agent_id: agent,
                session_id: session,
                run_id: run,
                cursor,
                limit,
            })),
            EffectsCommand::Status { agent } => {
                call(Request::EffectsStatus(p::EffectsStatusRequest {
                    agent_id: agent,
                }))
            }
            EffectsCommand::Unfence {
                agent,
                session,
                run,
                evidence_root,
            } => call(Request::EffectsUnfence(p::EffectsUnfence {
                agent_id: agent,
                session_id: session,
                run_id: run,
                evidence_root,
            })),
        }
    }
}
