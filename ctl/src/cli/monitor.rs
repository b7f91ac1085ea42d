//! `alloxctl monitor`: traces, summaries and reports of the monitor
//! plugin.

use super::Action;
use allox_protocol::{GroupBy, MonitorRecords, Request};
use clap::Subcommand;
use std::path::PathBuf;

/// `alloxctl monitor ...`.
#[derive(Subcommand, Debug, PartialEq)]
pub enum MonitorCommand {
    /// Send spans (a JSON array of spans, or `{"spans": [...]}`, from a
    /// file or '-' for stdin) for a session.
    Ingest {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// A JSON file of spans, or '-' for stdin.
        file: PathBuf,
    },
    /// Spans and runs recorded, oldest first.
    Records {
        /// The agent (every agent's if left out).
        agent: Option<String>,
        /// The session (every session's of the agent if left out).
        session: Option<String>,
        /// Only this trace's.
        #[arg(long)]
        trace: Option<String>,
        /// Start after this record number.
        #[arg(long)]
        cursor: Option<u64>,
        /// At most this many records.
        #[arg(long)]
        limit: Option<u32>,
        /// Then print new records as they come, until interrupted.
        #[arg(long)]
        follow: bool,
    },
    /// Calls, time, tokens, and the runs' CPU and memory, by tool, model
    /// or turn.
    Summary {
        /// The agent (every agent's if left out).
        agent: Option<String>,
        /// The session (every session's of the agent if left out).
        session: Option<String>,
        /// What to group by.
        #[arg(long = "by", default_value = "tool", value_parser = ["tool", "model", "turn"])]
        by: String,
    },
    /// Spans and runs as OTLP/JSON (an ExportTraceServiceRequest) for
    /// observability tools.
    Export {
        /// The agent (every agent's if left out).
        agent: Option<String>,
        /// The session (every session's of the agent if left out).
        session: Option<String>,
        /// Write here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// One self-contained HTML page: the session's turns, tool calls and
    /// model calls, its runs with their CPU and memory, checkpoints and
    /// rollbacks on one time axis, and the summaries.
    Report {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The HTML file to write.
        #[arg(long)]
        out: PathBuf,
    },
}

impl MonitorCommand {
    pub fn action(self) -> Action {
        match self {
            MonitorCommand::Ingest {
                agent,
                session,
                file,
            } => Action::MonitorIngest {
                agent,
                session,
                file,
            },
            MonitorCommand::Records {
                agent,
                session,
                trace,
                cursor,
                limit,
                follow,
            } => {
                let q = Request::MonitorRecords(MonitorRecords {
                    agent_id: agent,
                    session_id: session,
                    trace_id: trace,
                    cursor,
                    limit,
                    follow,
                });
                if follow {
                    Action::Follow(q)
                } else {
                    Action::Call(q)
                }
            }
            MonitorCommand::Summary { agent, session, by } => Action::Call(
                Request::MonitorSummary(allox_protocol::MonitorSummaryRequest {
                    agent_id: agent,
                    session_id: session,
                    group_by: match by.as_str() {
                        "model" => GroupBy::Model,
                        "turn" => GroupBy::Turn,
                        _ => GroupBy::Tool,
                    },
                }),
            ),
            MonitorCommand::Export {
                agent,
                session,
                out,
            } => Action::MonitorExport {
                query: MonitorRecords {
                    agent_id: agent,
                    session_id: session,
                    ..Default::default()
                },
                out,
            },
            MonitorCommand::Report {
                agent,
                session,
                out,
            } => Action::MonitorReport {
                agent,
                session,
                out,
            },
        }
    }
}
