//! `alloxctl secret`: credentials a session's runs use through its proxy
//! but never read (`secret.set|list|delete`, docs/network.md). A value is
//! never taken on the command line (other users see it in `ps`): it comes
//! from a file, standard input or an environment variable.

use super::Action;
use allox_protocol::Request;
use clap::{ArgGroup, Subcommand};
use std::path::PathBuf;

/// Where `secret set` reads the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueFrom {
    /// A file; `-` is standard input. One trailing newline is dropped.
    File(PathBuf),
    /// An environment variable of alloxctl's.
    Env(String),
}

impl ValueFrom {
    /// The value, or why it cannot be read.
    pub fn read(&self) -> Result<String, String> {
        let mut v = match self {
            ValueFrom::File(p) if p.as_os_str() == "-" => {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                    .map_err(|e| format!("read the value from standard input: {e}"))?;
                s
            }
            ValueFrom::File(p) => std::fs::read_to_string(p)
                .map_err(|e| format!("read the value from {}: {e}", p.display()))?,
            ValueFrom::Env(k) => std::env::var(k)
                .map_err(|e| format!("read the value from the environment variable {k}: {e}"))?,
        };
        if v.ends_with('\n') {
            v.pop();
            if v.ends_with('\r') {
                v.pop();
            }
        }
        Ok(v)
    }
}

#[derive(Subcommand, Debug)]
pub enum SecretCommand {
    /// Set (or replace) a secret: the runs of the agent's proxy sessions
    /// (or of --session only) see NAME set to a placeholder, and the
    /// broker puts the value in requests to the hosts given, and only
    /// there.
    #[command(group(ArgGroup::new("value").required(true).args(["value_file", "value_env"])))]
    Set {
        /// The agent.
        agent: String,
        /// The secret's name: the runs' environment variable.
        name: String,
        /// Only this session's runs (every proxy session of the agent's if
        /// left out).
        #[arg(long)]
        session: Option<String>,
        /// A host the value may go to (repeatable): `api.test`,
        /// `*.api.test`, `api.test:8443`.
        #[arg(long = "host", value_name = "RULE", required = true)]
        hosts: Vec<String>,
        /// A header the broker sets on requests to those hosts, `{}` where
        /// the value goes: 'Authorization: Bearer {}'.
        #[arg(long, value_name = "TEMPLATE")]
        header: Option<String>,
        /// A query parameter the broker adds to requests to those hosts.
        #[arg(long, value_name = "NAME")]
        query: Option<String>,
        /// Intercept HTTPS to those hosts (the session's runs trust its
        /// own certificate authority; the broker verifies the server).
        #[arg(long)]
        intercept: bool,
        /// Read the value from this file (`-`: standard input).
        #[arg(long, value_name = "FILE")]
        value_file: Option<PathBuf>,
        /// Read the value from this environment variable.
        #[arg(long, value_name = "VAR")]
        value_env: Option<String>,
    },
    /// An agent's secrets (and a session's own): names, hosts and
    /// placeholders, never values.
    List {
        /// The agent.
        agent: String,
        /// The session.
        session: Option<String>,
    },
    /// Delete a secret of the agent (or of --session).
    Delete {
        /// The agent.
        agent: String,
        /// The secret's name.
        name: String,
        /// The session whose own secret it is (the agent's if left out).
        #[arg(long)]
        session: Option<String>,
    },
}

impl SecretCommand {
    pub fn action(self) -> Action {
        match self {
            SecretCommand::Set {
                agent,
                name,
                session,
                hosts,
                header,
                query,
                intercept,
                value_file,
                value_env,
            } => Action::SecretSet {
                request: allox_protocol::SecretSet {
                    agent_id: agent,
                    session_id: session,
                    name,
                    value: allox_protocol::SecretValue::default(),
                    hosts,
                    header,
                    query,
                    intercept,
                },
                from: match (value_file, value_env) {
                    (Some(f), _) => ValueFrom::File(f),
                    (None, Some(v)) => ValueFrom::Env(v),
                    (None, None) => ValueFrom::File("-".into()),
                },
            },
            SecretCommand::List { agent, session } => {
                Action::Call(Request::SecretList(allox_protocol::SecretList {
                    agent_id: agent,
                    session_id: session,
                }))
            }
            SecretCommand::Delete {
                agent,
                name,
                session,
            } => Action::Call(Request::SecretDelete(allox_protocol::SecretDelete {
                agent_id: agent,
                session_id: session,
                name,
            })),
        }
    }
}
