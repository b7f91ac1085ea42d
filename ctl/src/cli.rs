//! The command line of `alloxctl`, and what each command asks for.

use allox_protocol::{
    AgentList, AgentRef, AuditList, CheckpointCreate, CheckpointPin, CheckpointRef, Ping, Request,
    SessionRef, SessionRollback,
};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Where the daemon listens unless `--socket` or `ALLOX_SOCKET` says
/// otherwise.
pub const DEFAULT_SOCKET: &str = "/run/allox/ctl.sock";

/// Control an Allox OS supervisor over its control socket.
#[derive(Parser, Debug)]
#[command(name = "alloxctl", version)]
pub struct Cli {
    /// The daemon's control socket (or the VM's control-port socket).
    #[arg(long, global = true, env = "ALLOX_SOCKET", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Print the JSON result instead of human output.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check that the daemon answers.
    Ping,
    /// Create, list and delete agents.
    #[command(subcommand)]
    Agent(AgentCommand),
    /// Create, list and delete an agent's sessions.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Create, list, delete, pin and unpin a session's checkpoints.
    #[command(subcommand)]
    Checkpoint(CheckpointCommand),
    /// Put a session's current/ back to a checkpoint.
    Rollback {
        agent: String,
        session: String,
        checkpoint: String,
        /// Kill the session's processes first instead of failing with
        /// `conflict` while they run.
        #[arg(long)]
        kill_processes: bool,
    },
    /// Show the audit log.
    Audit {
        /// Only records after this sequence number.
        #[arg(long, value_name = "SEQ")]
        after: Option<u64>,
        /// At most this many records (the daemon's default is 100).
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
    },
    /// Send one request in its JSON form and print the JSON answer.
    Rpc {
        /// `{"action": "...", "params": {...}}`
        #[arg(value_name = "JSON")]
        request: String,
    },
    /// Serve the JSON form over HTTP (`POST /v1/rpc`).
    Gateway {
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8092")]
        listen: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum AgentCommand {
    /// Create an agent and its workspace.
    Create { agent: String },
    /// List agents.
    List,
    /// Delete an agent with all its sessions.
    Delete { agent: String },
}

#[derive(Subcommand, Debug)]
pub enum SessionCommand {
    /// Create a session of an agent.
    Create { agent: String, session: String },
    /// List an agent's sessions.
    List { agent: String },
    /// Delete a session with its checkpoints.
    Delete { agent: String, session: String },
}

#[derive(Subcommand, Debug)]
pub enum CheckpointCommand {
    /// Snapshot a session's current/.
    Create {
        agent: String,
        session: String,
        checkpoint: String,
        /// Keep it from deletion until unpinned.
        #[arg(long)]
        pin: bool,
        /// Free text for people (at most 256 bytes).
        #[arg(long, value_name = "TEXT")]
        label: Option<String>,
    },
    /// Show a session's checkpoints as a tree.
    List { agent: String, session: String },
    /// Delete a checkpoint that is not pinned.
    Delete {
        agent: String,
        session: String,
        checkpoint: String,
    },
    /// Keep a checkpoint from deletion.
    Pin {
        agent: String,
        session: String,
        checkpoint: String,
    },
    /// Allow a checkpoint to be deleted again.
    Unpin {
        agent: String,
        session: String,
        checkpoint: String,
    },
}

/// What a command line asks `alloxctl` to do.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// Send one request and show its answer.
    Call(Request),
    /// Send a request given in JSON and print the JSON answer.
    Rpc(String),
    /// Run the HTTP gateway.
    Gateway { listen: String },
}

impl Command {
    pub fn action(self) -> Action {
        use Command as C;
        let call = |r| Action::Call(r);
        match self {
            C::Ping => call(Request::Ping(Ping {})),
            C::Agent(a) => call(match a {
                AgentCommand::Create { agent } => Request::AgentCreate(agent_ref(agent)),
                AgentCommand::List => Request::AgentList(AgentList {}),
                AgentCommand::Delete { agent } => Request::AgentDelete(agent_ref(agent)),
            }),
            C::Session(s) => call(match s {
                SessionCommand::Create { agent, session } => {
                    Request::SessionCreate(session_ref(agent, session))
                }
                SessionCommand::List { agent } => Request::SessionList(agent_ref(agent)),
                SessionCommand::Delete { agent, session } => {
                    Request::SessionDelete(session_ref(agent, session))
                }
            }),
            C::Checkpoint(c) => call(checkpoint_request(c)),
            C::Rollback {
                agent,
                session,
                checkpoint,
                kill_processes,
            } => call(Request::SessionRollback(SessionRollback {
                agent_id: agent,
                session_id: session,
                checkpoint_id: checkpoint,
                // Without the flag the daemon's default applies.
                kill_processes: kill_processes.then_some(true),
            })),
            C::Audit { after, limit } => call(Request::AuditList(AuditList {
                after_seq: after,
                limit,
            })),
            C::Rpc { request } => Action::Rpc(request),
            C::Gateway { listen } => Action::Gateway { listen },
        }
    }
}

fn agent_ref(agent_id: String) -> AgentRef {
    AgentRef { agent_id }
}

fn session_ref(agent_id: String, session_id: String) -> SessionRef {
    SessionRef {
        agent_id,
        session_id,
    }
}

fn checkpoint_request(c: CheckpointCommand) -> Request {
    use CheckpointCommand as C;
    let pin = |agent_id, session_id, checkpoint_id, pinned| {
        Request::CheckpointPin(CheckpointPin {
            agent_id,
            session_id,
            checkpoint_id,
            pinned,
        })
    };
    match c {
        C::Create {
            agent,
            session,
            checkpoint,
            pin,
            label,
        } => Request::CheckpointCreate(CheckpointCreate {
            agent_id: agent,
            session_id: session,
            checkpoint_id: checkpoint,
            pinned: pin,
            label,
        }),
        C::List { agent, session } => Request::CheckpointList(session_ref(agent, session)),
        C::Delete {
            agent,
            session,
            checkpoint,
        } => Request::CheckpointDelete(CheckpointRef {
            agent_id: agent,
            session_id: session,
            checkpoint_id: checkpoint,
        }),
        C::Pin {
            agent,
            session,
            checkpoint,
        } => pin(agent, session, checkpoint, true),
        C::Unpin {
            agent,
            session,
            checkpoint,
        } => pin(agent, session, checkpoint, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The global flags and the action of a command line.
    fn parse(args: &[&str]) -> (PathBuf, bool, Action) {
        let argv = std::iter::once("alloxctl").chain(args.iter().copied());
        let cli = Cli::try_parse_from(argv).unwrap();
        (cli.socket, cli.json, cli.command.action())
    }

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn commands_map_to_requests() {
        let (socket, json, action) =
            parse(&["--socket", "/tmp/x.sock", "--json", "agent", "create", "a"]);
        assert_eq!(socket, PathBuf::from("/tmp/x.sock"));
        assert!(json);
        assert_eq!(
            action,
            Action::Call(Request::AgentCreate(agent_ref("a".into())))
        );

        let (_, _, action) = parse(&[
            "checkpoint",
            "create",
            "a",
            "s",
            "c",
            "--pin",
            "--label",
            "before",
        ]);
        assert_eq!(
            action,
            Action::Call(Request::CheckpointCreate(CheckpointCreate {
                agent_id: "a".into(),
                session_id: "s".into(),
                checkpoint_id: "c".into(),
                pinned: true,
                label: Some("before".into()),
            }))
        );

        let (_, _, action) = parse(&["checkpoint", "unpin", "a", "s", "c"]);
        assert!(matches!(action, Action::Call(Request::CheckpointPin(p)) if !p.pinned));

        let (_, _, action) = parse(&["rollback", "a", "s", "c"]);
        assert!(
            matches!(action, Action::Call(Request::SessionRollback(r)) if r.kill_processes.is_none())
        );
        let (_, _, action) = parse(&["rollback", "a", "s", "c", "--kill-processes"]);
        assert!(
            matches!(action, Action::Call(Request::SessionRollback(r)) if r.kill_processes == Some(true))
        );

        let (_, _, action) = parse(&["audit", "--after", "5", "--limit", "10"]);
        assert_eq!(
            action,
            Action::Call(Request::AuditList(AuditList {
                after_seq: Some(5),
                limit: Some(10),
            }))
        );

        // Global flags may follow the subcommand too.
        let (_, json, action) = parse(&["rpc", "{}", "--json"]);
        assert!(json);
        assert_eq!(action, Action::Rpc("{}".into()));

        let (_, _, action) = parse(&["gateway"]);
        assert_eq!(
            action,
            Action::Gateway {
                listen: "127.0.0.1:8092".into()
            }
        );
    }

    #[test]
    fn usage_errors_are_refused() {
        for args in [
            &["session", "create", "a"][..],
            &["checkpoint", "list", "a"],
            &["audit", "--limit", "many"],
            &["fly"],
        ] {
            let argv = std::iter::once("alloxctl").chain(args.iter().copied());
            assert!(Cli::try_parse_from(argv).is_err(), "{args:?}");
        }
    }
}
