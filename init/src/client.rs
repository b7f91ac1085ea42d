//! `allox`, the in-sandbox interface's client inside every sandbox: the same
//! executable as the supervisor, started under the name `allox`
//! (`/run/allox/bin/allox`, on the sandbox's `PATH`).
//!
//! ```text
//! allox whoami
//! allox turn begin [--turn-id ID]
//! allox turn end [--status ok|failed|cancelled] [--turn-id ID] [--label TEXT]
//! allox call ROUTE [JSON]
//! allox net connect HOST PORT
//! allox share enable|disable|status|list|stat|read|write ...
//! ```
//!
//! Human output by default, the answer's JSON with `--json`; exit status 0,
//! or 1 with the error on stderr.

use allox_protocol::sandbox_api::{
    PluginCall, SandboxRequest, SandboxResponse, SandboxTurnBegin, SandboxTurnEnd, Whoami,
    SANDBOX_API_SOCKET,
};
use allox_protocol::{ErrorBody, TurnInfo, TurnStatus};
use clap::{Parser, Subcommand, ValueEnum};
use std::io::Write;

/// Whether the executable was started as the client (`argv[0]`'s last
/// component is `allox`).
pub fn started_as_client(argv0: Option<&std::ffi::OsStr>) -> bool {
    argv0
        .map(std::path::Path::new)
        .and_then(|p| p.file_name())
        .is_some_and(|n| n == "allox")
}

#[derive(Parser, Debug)]
#[command(
    name = "allox",
    version,
    about = "Talk to Allox OS from inside a sandbox, as this run (through /run/allox/guest.sock)"
)]
pub struct Cli {
    /// Print the answer as JSON (for scripts).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// The agent, session and run this program belongs to.
    Whoami,
    /// Begin or end a turn of this session.
    Turn {
        #[command(subcommand)]
        cmd: TurnCmd,
    },
    /// Call a route a plugin owns, with JSON parameters (default `{}`).
    Call {
        route: String,
        params: Option<String>,
    },
    /// The session's network (with the daemon's network plugin).
    Net {
        #[command(subcommand)]
        cmd: NetCmd,
    },
    /// Share this session's files with other sessions, and reach theirs
    /// (with the daemon's share plugin, --share-tools).
    Share {
        #[command(subcommand)]
        cmd: crate::share::ShareCmd,
    },
}

#[derive(Subcommand, Debug)]
enum NetCmd {
    /// A TCP connection to HOST:PORT through the session's proxy, relayed
    /// on stdin and stdout (an SSH ProxyCommand).
    Connect { host: String, port: u16 },
}

#[derive(Subcommand, Debug)]
enum TurnCmd {
    /// Begin a turn (the session may have one open turn at a time).
    Begin {
        /// Name of the turn; default `turn-<n>`.
        #[arg(long)]
        turn_id: Option<String>,
    },
    /// End the open turn (or the one named); with the session's automatic
    /// checkpoints on, an `ok` turn is checkpointed.
    End {
        #[arg(long, value_enum, default_value = "ok")]
        status: Status,
        /// The turn to end; default the session's open turn.
        #[arg(long)]
        turn_id: Option<String>,
        /// Label of the automatic checkpoint.
        #[arg(long)]
        label: Option<String>,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Status {
    Ok,
    Failed,
    Cancelled,
}

impl From<Status> for TurnStatus {
    fn from(s: Status) -> TurnStatus {
        match s {
            Status::Ok => TurnStatus::Ok,
            Status::Failed => TurnStatus::Failed,
            Status::Cancelled => TurnStatus::Cancelled,
        }
    }
}

impl Cli {
    fn request(&self) -> Result<SandboxRequest, ErrorBody> {
        Ok(match &self.cmd {
            Cmd::Whoami => SandboxRequest::Whoami(Whoami {}),
            Cmd::Turn {
                cmd: TurnCmd::Begin { turn_id },
            } => SandboxRequest::TurnBegin(SandboxTurnBegin {
                turn_id: turn_id.clone(),
            }),
            Cmd::Turn {
                cmd:
                    TurnCmd::End {
                        status,
                        turn_id,
                        label,
                    },
            } => SandboxRequest::TurnEnd(SandboxTurnEnd {
                turn_id: turn_id.clone(),
                status: (*status).into(),
                label: label.clone(),
            }),
            Cmd::Call { route, params } => {
                let text = params.as_deref().unwrap_or("{}");
                let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
                    ErrorBody::invalid(format!("parameters are not valid JSON: {e}"))
                })?;
                SandboxRequest::PluginCall(PluginCall {
                    route: route.clone(),
                    params: v.to_string(),
                })
            }
            Cmd::Net { .. } | Cmd::Share { .. } => {
                return Err(ErrorBody::invalid(
                    "net and share commands are not one guest request",
                ))
            }
        })
    }
}

/// Runs the client; returns the exit status.
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    if let Cmd::Net {
        cmd: NetCmd::Connect { host, port },
    } = &cli.cmd
    {
        return match crate::netconnect::connect(host, *port) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("allox: net connect: {e}");
                1
            }
        };
    }
    let socket =
        std::env::var_os("ALLOX_GUEST_SOCKET").unwrap_or_else(|| SANDBOX_API_SOCKET.into());
    if let Cmd::Share { cmd } = &cli.cmd {
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        return match crate::share::run(std::path::Path::new(&socket), cmd, cli.json, &mut out)
            .and_then(|()| {
                out.flush()
                    .map_err(|e| ErrorBody::invalid(format!("cannot write: {e}")))
            }) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("allox: {}: {}", e.code, e.message);
                1
            }
        };
    }
    let out = cli
        .request()
        .and_then(|req| crate::sandbox_call::ask(std::path::Path::new(&socket), req));
    match out {
        Ok(resp) => {
            let text = if cli.json {
                format!("{}\n", resp.to_json())
            } else {
                human(&resp)
            };
            let _ = std::io::stdout().write_all(text.as_bytes());
            0
        }
        Err(e) => {
            eprintln!("allox: {}: {}", e.code, e.message);
            1
        }
    }
}

/// The answer as a person reads it.
fn human(r: &SandboxResponse) -> String {
    match r {
        SandboxResponse::Identity(i) => format!(
            "agent   {}\nsession {}\nrun     {}\n",
            i.agent_id, i.session_id, i.run_id
        ),
        SandboxResponse::Turn(t) => turn_line(t),
        SandboxResponse::Plugin(_) => {
            let v = r.to_json();
            format!(
                "{}\n",
                serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string())
            )
        }
    }
}

fn turn_line(t: &TurnInfo) -> String {
    let Some(status) = t.status else {
        return format!(
            "turn {} began (number {} of session {}/{})\n",
            t.turn_id, t.number, t.agent_id, t.session_id
        );
    };
    let status = serde_json::to_value(status)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default();
    let checkpoint = match (&t.checkpoint_id, &t.checkpoint_error) {
        (Some(c), _) => format!("; checkpoint {c}"),
        (None, Some(e)) => format!("; no checkpoint: {e}"),
        (None, None) => String::new(),
    };
    format!("turn {} ended {status}{checkpoint}\n", t.turn_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(args: &[&str]) -> Result<SandboxRequest, String> {
        let cli = Cli::try_parse_from(args).map_err(|e| e.to_string())?;
        cli.request().map_err(|e| e.message)
    }

    #[test]
    fn the_name_decides() {
        use std::ffi::OsStr;
        assert!(started_as_client(Some(OsStr::new("/run/allox/bin/allox"))));
        assert!(started_as_client(Some(OsStr::new("allox"))));
        assert!(!started_as_client(Some(OsStr::new("allox-init"))));
        assert!(!started_as_client(None));
    }

    #[test]
    fn commands_become_guest_requests() {
        assert_eq!(
            req(&["allox", "whoami"]).unwrap(),
            SandboxRequest::Whoami(Whoami {})
        );
        assert_eq!(
            req(&["allox", "turn", "end", "--status", "failed", "--json"]).unwrap(),
            SandboxRequest::TurnEnd(SandboxTurnEnd {
                turn_id: None,
                status: TurnStatus::Failed,
                label: None
            })
        );
        assert_eq!(
            req(&["allox", "call", "net.connect", r#"{"port": 22}"#]).unwrap(),
            SandboxRequest::PluginCall(PluginCall {
                route: "net.connect".into(),
                params: r#"{"port":22}"#.into()
            })
        );
        assert!(req(&["allox", "call", "x", "{"])
            .unwrap_err()
            .contains("not valid JSON"));
        // Nothing names another agent, session or run.
        for forged in [
            &["allox", "whoami", "--agent", "b"][..],
            &["allox", "turn", "begin", "--session", "other"],
            &[
                "allox",
                "turn",
                "end",
                "--status",
                "ok",
                "--session-id",
                "other",
            ],
        ] {
            assert!(req(forged).is_err(), "{forged:?}");
        }
    }

    #[test]
    fn turns_read_as_sentences() {
        let mut t = TurnInfo {
            agent_id: "a".into(),
            session_id: "s".into(),
            turn_id: "turn-1".into(),
            number: 1,
            began_ms: 0,
            ended_ms: None,
            status: None,
            checkpoint_id: None,
            checkpoint_error: None,
        };
        assert_eq!(
            turn_line(&t),
            "turn turn-1 began (number 1 of session a/s)\n"
        );
        t.status = Some(TurnStatus::Ok);
        t.checkpoint_id = Some("turn-1".into());
        assert_eq!(turn_line(&t), "turn turn-1 ended ok; checkpoint turn-1\n");
    }
}
