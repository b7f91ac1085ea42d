//! Programs in a session: `exec` and `start` ([`RunArgs`]), following a
//! run again (`attach`, `logs`), waiting for one (`wait`), listing them
//! (`ps`), signalling them (`kill`) and what the process tracker saw
//! (`events`).

use super::{session_ref, Action, PageArgs};
use crate::process::{read_stdin_file, StdinFileError};
use allox_protocol::{ProcessKill, ProcessStart, ProcessWait, Request};
use clap::Args;
use std::path::PathBuf;

/// What to run, for `exec` and `start`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The agent.
    agent: String,
    /// The session.
    session: String,
    /// Working directory, relative to the session's current/.
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// Set an environment variable (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Kill the run's whole process tree after this many milliseconds.
    #[arg(long, value_name = "MS")]
    timeout_ms: Option<u64>,
    /// Give the program this file's bytes on stdin ('-': alloxctl's stdin).
    /// Without it, `exec` gives an empty stdin and `start` leaves stdin
    /// open for `process.stdin`.
    #[arg(long, value_name = "FILE")]
    stdin_file: Option<PathBuf>,
    /// `exec`: pass alloxctl's stdin to the program as it comes, and close
    /// the program's at its end (as `docker exec -i` does).
    #[arg(short = 'i', long, conflicts_with = "stdin_file")]
    interactive: bool,
    /// Run the program on a terminal in the sandbox: `exec -t` puts this
    /// terminal in raw mode and passes keys, window size changes and
    /// Ctrl-C through (`start -t`: follow it with `alloxctl attach`).
    #[arg(short = 't', long = "tty")]
    tty: bool,
    /// `exec`: when alloxctl is interrupted (Ctrl-C, SIGTERM, SIGHUP) or
    /// killed, leave the run going instead of signalling or killing it;
    /// alloxctl names it, and `alloxctl logs -f` follows it again.
    #[arg(long)]
    detach_on_exit: bool,
    /// The tool call this run serves (`TRACE_ID:SPAN_ID` or a
    /// traceparent): recorded under it by the monitor, and given to the
    /// program as TRACEPARENT.
    #[arg(long, value_name = "TRACE_ID:SPAN_ID", value_parser = parse_trace)]
    trace: Option<allox_protocol::TraceContext>,
    /// Observe the run under system-effects protocol v3: after it, the
    /// workspace is restored to a baseline (made and pinned now, or
    /// `--recover-to`) and C is captured; the session stays fenced if
    /// anything of the run is left (A→C not CONSISTENT).
    #[arg(long)]
    recover: bool,
    /// `--recover`: the checkpoint to restore to (a full id, equal to
    /// current/ now).
    #[arg(long, value_name = "CHECKPOINT", requires = "recover")]
    recover_to: Option<String>,
    /// `--recover`: also reset the session's context (its namespaces and
    /// every process in them).
    #[arg(long, requires = "recover")]
    scrub_runtime: bool,
    /// `--recover`: list a residue without fencing the session
    /// (`require_consistent: false`).
    #[arg(long, requires = "recover")]
    allow_residue: bool,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    argv: Vec<String>,
}

impl RunArgs {
    /// `AGENT SESSION -- ARGV` with every option at its default, as the
    /// parser makes it ([`super::Cli::fast_from`]).
    pub(super) fn plain(agent: String, session: String, argv: Vec<String>) -> RunArgs {
        RunArgs {
            agent,
            session,
            cwd: None,
            env: Vec::new(),
            timeout_ms: None,
            stdin_file: None,
            interactive: false,
            tty: false,
            detach_on_exit: false,
            trace: None,
            recover: false,
            recover_to: None,
            scrub_runtime: false,
            allow_residue: false,
            argv,
        }
    }
}

/// `TRACE_ID:SPAN_ID` (32 and 16 hex digits), or a W3C `traceparent`.
fn parse_trace(text: &str) -> Result<allox_protocol::TraceContext, String> {
    let parts: Vec<&str> = text.split(['-', ':']).collect();
    let (t, s) = match parts.as_slice() {
        [t, s] => (*t, *s),
        ["00", t, s, _] => (*t, *s),
        _ => {
            return Err(format!(
                "expected TRACE_ID:SPAN_ID or a traceparent, got {text:?}"
            ))
        }
    };
    let c = allox_protocol::TraceContext {
        trace_id: t.to_string(),
        span_id: s.to_string(),
    };
    c.check().map_err(|e| e.message)?;
    Ok(c)
}

/// `K=V` as a pair; the value may contain `=`.
fn parse_env(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected K=V, got {text:?}")),
    }
}

/// A `process.start` request, and where its stdin text is still to be
/// read from.
#[derive(Debug, PartialEq)]
pub struct Run {
    pub request: ProcessStart,
    pub stdin_file: Option<PathBuf>,
    /// `-t`: on a terminal, driven from this one.
    pub tty: bool,
    /// `--detach-on-exit`.
    pub detach: bool,
    /// `-i`: alloxctl's stdin passed on as it comes.
    pub interactive: bool,
}

impl Run {
    /// The request, with the stdin file's text read into it.
    pub fn into_request(self) -> Result<ProcessStart, StdinFileError> {
        let mut request = self.request;
        if let Some(path) = &self.stdin_file {
            request.stdin = Some(read_stdin_file(path)?.into());
        }
        Ok(request)
    }
}

impl RunArgs {
    /// `wait`: whether the answer comes at the end of the run (`exec`) or
    /// at its start (`start`).
    pub fn run(self, wait: bool) -> Run {
        Run {
            request: ProcessStart {
                agent_id: self.agent,
                session_id: self.session,
                argv: self.argv,
                env: self.env.into_iter().collect(),
                cwd: self.cwd,
                // Without -i, `exec` does not pass its own stdin on: the
                // program reads end of file instead of hanging.
                stdin: (wait && !self.interactive).then(Default::default),
                timeout_ms: self.timeout_ms,
                wait,
                stream: wait,
                // A placeholder: alloxctl gives it this terminal's size and TERM.
                pty: self.tty.then_some(allox_protocol::PtySize {
                    rows: 24,
                    cols: 80,
                    term: None,
                }),
                trace: self.trace.map(Box::new),
                on_disconnect: Default::default(),
                recovery: self.recover.then(|| {
                    Box::new(allox_protocol::ProcessRecovery {
                        checkpoint_id: self.recover_to,
                        scrub_runtime: self.scrub_runtime,
                        require_consistent: !self.allow_residue,
                    })
                }),
            },
            stdin_file: self.stdin_file,
            tty: self.tty,
            detach: self.detach_on_exit,
            interactive: self.interactive,
        }
    }
}

/// `alloxctl attach`.
#[derive(Args, Debug)]
pub struct AttachArgs {
    /// The agent.
    pub agent: String,
    /// The session.
    pub session: String,
    /// The run (as `start` printed it).
    pub run: String,
    /// Do not show the run's recent output first.
    #[arg(long)]
    pub no_replay: bool,
}

impl AttachArgs {
    pub fn action(self) -> Action {
        Action::Attach(allox_protocol::ProcessAttach {
            agent_id: self.agent,
            session_id: self.session,
            run_id: self.run,
            replay: Some(!self.no_replay),
        })
    }
}

/// `alloxctl logs`.
#[derive(Args, Debug)]
pub struct LogsArgs {
    /// The agent.
    pub agent: String,
    /// The session.
    pub session: String,
    /// The run (as `start` printed it).
    pub run: String,
    /// Follow it until it ends.
    #[arg(short = 'f', long)]
    pub follow: bool,
}

impl LogsArgs {
    pub fn action(self) -> Action {
        Action::Logs(allox_protocol::ProcessLogs {
            agent_id: self.agent,
            session_id: self.session,
            run_id: self.run,
            follow: self.follow,
        })
    }
}

/// `alloxctl wait`.
#[derive(Args, Debug)]
pub struct WaitArgs {
    /// The agent.
    pub agent: String,
    /// The session.
    pub session: String,
    /// The run (as `start` printed it).
    pub run: String,
    /// Give up waiting after this many milliseconds.
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
}

impl WaitArgs {
    pub fn action(self) -> Action {
        Action::Wait(ProcessWait {
            agent_id: self.agent,
            session_id: self.session,
            run_id: self.run,
            timeout_ms: self.timeout_ms,
        })
    }
}

/// `alloxctl ps`.
#[derive(Args, Debug)]
pub struct PsArgs {
    /// The agent.
    pub agent: String,
    /// The session.
    pub session: String,
    /// The lineage of every process the session ran, live and exited,
    /// from the process tracker (`--process-tracker ebpf`), or from the
    /// system-effects observer (observed runs, once each has ended).
    #[arg(long)]
    pub tree: bool,
    /// With --tree: only this run's processes.
    #[arg(long, requires = "tree")]
    pub run: Option<String>,
}

impl PsArgs {
    pub fn request(self) -> Request {
        if !self.tree {
            return Request::ProcessList(session_ref(self.agent, self.session));
        }
        Request::ProcessTree(allox_protocol::ProcessTreeRequest {
            agent_id: self.agent,
            session_id: self.session,
            run_id: self.run,
        })
    }
}

/// `alloxctl events`.
#[derive(Args, Debug)]
pub struct EventsArgs {
    /// The agent (every agent's if left out).
    pub agent: Option<String>,
    /// The session (every session's of the agent if left out).
    pub session: Option<String>,
    /// The run (every run's of the session if left out).
    pub run: Option<String>,
    #[command(flatten)]
    pub page: PageArgs,
}

impl EventsArgs {
    pub fn action(self) -> Action {
        let page = self.page;
        page.action(Request::ProcessEvents(allox_protocol::ProcessEvents {
            agent_id: self.agent,
            session_id: self.session,
            run_id: self.run,
            cursor: page.cursor,
            limit: page.limit,
            follow: page.follow,
        }))
    }
}

/// `alloxctl kill`.
#[derive(Args, Debug)]
pub struct KillArgs {
    /// The agent.
    pub agent: String,
    /// The session.
    pub session: String,
    /// The run (as `start` printed it); all the session's runs if
    /// left out.
    pub run: Option<String>,
    /// Number or name (TERM, SIGTERM); the daemon's default is SIGKILL.
    #[arg(long, value_name = "SIGNAL", value_parser = crate::signal::parse)]
    pub signal: Option<i32>,
}

impl KillArgs {
    pub fn request(self) -> Request {
        Request::ProcessKill(ProcessKill {
            agent_id: self.agent,
            session_id: self.session,
            run_id: self.run,
            signal: self.signal,
        })
    }
}
