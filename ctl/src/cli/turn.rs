//! `alloxctl turn`: an agent framework's turns, begun and ended.

use allox_protocol::{Request, TurnStatus};
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum TurnCommand {
    /// A turn starts (the same as `allox turn begin` in a sandbox).
    Begin {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// Name of the turn (default: turn-<n>).
        #[arg(long = "turn-id", visible_alias = "id", value_name = "ID")]
        id: Option<String>,
    },
    /// A turn ends (the same as `allox turn end` in a sandbox); with the
    /// session's automatic checkpoints on, an `ok` turn is checkpointed.
    End {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The turn to end (default: the session's open turn).
        #[arg(value_name = "TURN", conflicts_with = "turn_id")]
        turn: Option<String>,
        /// The turn to end, as `allox turn end --turn-id` names it.
        #[arg(long, value_name = "ID")]
        turn_id: Option<String>,
        /// How the turn went.
        #[arg(long, value_parser = ["ok", "failed", "cancelled"], default_value = "ok")]
        status: String,
        /// Label of the automatic checkpoint.
        #[arg(long)]
        label: Option<String>,
    },
}

impl TurnCommand {
    pub fn request(self) -> Request {
        match self {
            TurnCommand::Begin { agent, session, id } => {
                Request::TurnBegin(allox_protocol::TurnBegin {
                    agent_id: agent,
                    session_id: session,
                    turn_id: id,
                })
            }
            TurnCommand::End {
                agent,
                session,
                turn,
                turn_id,
                status,
                label,
            } => Request::TurnEnd(allox_protocol::TurnEnd {
                agent_id: agent,
                session_id: session,
                turn_id: turn.or(turn_id).unwrap_or_default(),
                status: match status.as_str() {
                    "failed" => TurnStatus::Failed,
                    "cancelled" => TurnStatus::Cancelled,
                    _ => TurnStatus::Ok,
                },
                label,
            }),
        }
    }
}
