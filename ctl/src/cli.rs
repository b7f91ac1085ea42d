//! The command line of `alloxctl`, and what each command asks for.

use crate::process::{read_stdin_file, StdinFileError};
use allox_protocol::{
    AgentCreate, AgentDelete, AgentList, AgentRef, AuditList, CheckpointCreate, CheckpointPin,
    CheckpointRef, Ping, ProcessKill, ProcessStart, ProcessWait, Request, SessionCreate,
    SessionDelete, SessionRef, SessionRollback,
};
use clap::{Args, Parser, Subcommand};
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
    /// Stop the supervisor in order (in the guest: power the VM off), and
    /// wait until the process serving the socket has exited.
    Shutdown {
        /// Give up waiting after this many seconds (exit 1); the stop goes
        /// on.
        #[arg(long, value_name = "S", default_value_t = 60)]
        wait_s: u64,
    },
    /// Uptime, memory of init and supervisor, processes, unreaped
    /// orphans, loaded plugins.
    Info,
    /// The plugins loaded (in load order) and the ones installed.
    Plugins,
    /// Check the store: the index against the subvolumes on disk, and
    /// whether the journal holds an unfinished operation (exit status 1 if
    /// anything is out of place).
    Check,
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
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The checkpoint.
        checkpoint: String,
        /// Kill the session's processes first instead of failing with
        /// `conflict` while they run.
        #[arg(long)]
        kill_processes: bool,
    },
    /// Draw a session's checkpoint history as a tree (same as
    /// `checkpoint list`).
    Log {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
    },
    /// What changed between two checkpoints (`current` for the session's
    /// current/), like `git diff --stat`.
    Diff {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// A checkpoint, or `current`.
        from: String,
        /// A checkpoint, or `current`.
        to: String,
        /// Also show each changed file's contents, like `git diff`: unified
        /// hunks of text files and symlinks, a note for binary files (the
        /// answer holds at most 512 KiB of patches; past that they are cut
        /// and say so).
        #[arg(long, short = 'p')]
        patch: bool,
    },
    /// Report an agent framework's turns.
    #[command(subcommand)]
    Turn(TurnCommand),
    /// Set automatic checkpoints for an agent (its sessions' default) or a
    /// session.
    Policy {
        /// The agent.
        agent: String,
        /// The session (every session's of the agent if left out).
        session: Option<String>,
        /// Take a baseline at session creation and a checkpoint after
        /// every successful turn.
        #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
        auto_checkpoint: Option<String>,
        /// Keep only the last N turn checkpoints.
        #[arg(long, value_name = "N")]
        keep_last: Option<u32>,
    },
    /// Show the audit log: the newest records (oldest of them first), and
    /// how to see more when the list is cut.
    Audit {
        /// The oldest records after this sequence number instead.
        #[arg(long, value_name = "SEQ", conflicts_with = "before")]
        after: Option<u64>,
        /// The newest records before this sequence number.
        #[arg(long, value_name = "SEQ")]
        before: Option<u64>,
        /// At most this many records (the daemon's default is 100).
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
    },
    /// Run a program in a session and pass its output through as it comes.
    ///
    /// Exits with the program's exit code, 128+N when signal N killed it,
    /// 124 when its timeout did, 1 when alloxctl or the daemon failed.
    /// With --json the output is captured instead and printed in the JSON
    /// result.
    Exec(RunArgs),
    /// Start a program in a session without waiting; print its run id.
    Start(RunArgs),
    /// Follow a terminal run (`start -t`, or an `exec -t` whose alloxctl
    /// went away) from this terminal again: its recent output first, then
    /// as `exec -t`. Exits as `exec` does.
    Attach {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The run (as `start` printed it).
        run: String,
        /// Do not show the run's recent output first.
        #[arg(long)]
        no_replay: bool,
    },
    /// A run's output, with or without a terminal, running or ended (while
    /// the daemon keeps it): what is kept of it; with -f, then what it
    /// writes until it ends, each byte once, exiting as `exec` does.
    Logs {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The run (as `start` printed it).
        run: String,
        /// Follow it until it ends.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Wait for a run to end and show how it ended; exits as `exec` does.
    Wait {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The run (as `start` printed it).
        run: String,
        /// Give up waiting after this many milliseconds.
        #[arg(long, value_name = "MS")]
        timeout_ms: Option<u64>,
    },
    /// List a session's processes.
    Ps {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The lineage of every process the session ran, live and exited,
        /// from the process tracker (`--process-tracker ebpf`).
        #[arg(long)]
        tree: bool,
        /// With --tree: only this run's processes.
        #[arg(long, requires = "tree")]
        run: Option<String>,
    },
    /// The session network: egress rules and the audit of connections.
    #[command(subcommand)]
    Net(NetCommand),
    /// Sharing of sessions' files between sessions (the share plugin):
    /// who shares what, and the host's switches.
    #[command(subcommand)]
    Share(ShareCommand),
    /// What a session uses now and has used in total (CPU, memory, I/O,
    /// OOM kills), with its limits.
    Stats {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
    },
    /// Every session and its live runs: CPU over the last interval,
    /// memory now, OOM kills; refreshed until interrupted.
    Top {
        /// Seconds between screens.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// One screen (two samples an interval apart), then exit.
        #[arg(long)]
        once: bool,
    },
    /// Traces, summaries and reports of the monitor plugin
    /// (`--monitor-root`).
    #[command(subcommand)]
    Monitor(MonitorCommand),
    /// Change a live session's limits (those given; the others stay).
    Limit {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// Most processes at once.
        #[arg(long)]
        pids_max: Option<u64>,
        /// Most memory, bytes.
        #[arg(long)]
        memory_max: Option<u64>,
        /// "QUOTA PERIOD" in µs, e.g. "50000 100000" for half a CPU.
        #[arg(long, value_name = "QUOTA PERIOD")]
        cpu_max: Option<String>,
    },
    /// A session's files, without a process: list, read, make, remove.
    #[command(subcommand)]
    Fs(FsCommand),
    /// Copy files or directories between here and a session, either way:
    /// `alloxctl cp ./src agent-a/s1:src`, `alloxctl cp agent-a/s1:out ./out`.
    Cp {
        /// A local path, or AGENT/SESSION:PATH.
        from: String,
        /// A local path, or AGENT/SESSION:PATH.
        to: String,
        /// The session's path is in its agent's shared/.
        #[arg(long)]
        shared: bool,
        /// Copy from the session as it was at this checkpoint.
        #[arg(long, value_name = "ID")]
        checkpoint: Option<String>,
    },
    /// What the process tracker recorded: forks, execs, exits, oldest first.
    Events {
        /// The agent (every agent's if left out).
        agent: Option<String>,
        /// The session (every session's of the agent if left out).
        session: Option<String>,
        /// The run (every run's of the session if left out).
        run: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Signal every process of one run, or of all a session's runs
    /// (whatever they forked); SIGKILL unless --signal says otherwise.
    Kill {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The run (as `start` printed it); all the session's runs if
        /// left out.
        run: Option<String>,
        /// Number or name (TERM, SIGTERM); the daemon's default is SIGKILL.
        #[arg(long, value_name = "SIGNAL", value_parser = crate::signal::parse)]
        signal: Option<i32>,
    },
    /// Send one request in its JSON form and print the JSON answer.
    Rpc {
        /// `{"action": "...", "params": {...}}`
        #[arg(value_name = "JSON")]
        request: String,
    },
    /// Serve the JSON form over HTTP (`POST /v1/rpc`), and files as raw
    /// bytes (`GET`/`PUT /v1/files/AGENT/SESSION/PATH`), to clients that
    /// send the bearer token (`Authorization: Bearer $(alloxctl token)`).
    Gateway(GatewayArgs),
    /// Print the gateway's bearer token (making the token file if there is
    /// none yet, as the gateway does), for scripts:
    /// `curl -H "Authorization: Bearer $(alloxctl token)" ...`.
    Token {
        #[command(flatten)]
        file: TokenFileArg,
    },
    /// Print the gateway's OpenAPI 3.1 document (what it serves at
    /// `GET /v1/openapi.json`), made from the protocol's types.
    Openapi,
}

/// Where the gateway's token is kept.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct TokenFileArg {
    /// The token file (mode 0600, made on first use) [default: gateway.token
    /// beside the control socket].
    #[arg(long, value_name = "FILE", env = "ALLOX_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

impl TokenFileArg {
    /// The file given, or the one beside `socket`.
    pub fn resolve(&self, socket: &std::path::Path) -> PathBuf {
        self.token_file
            .clone()
            .unwrap_or_else(|| allox_gateway::token::default_path(socket))
    }
}

/// How to run the HTTP gateway.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct GatewayArgs {
    /// Address to listen on (`host:port`; port 0 picks a free one). Only
    /// loopback addresses unless --allow-remote.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8092")]
    pub listen: String,
    #[command(flatten)]
    pub token: TokenFileArg,
    /// Read the token from this environment variable instead of a file
    /// (e.g. a Kubernetes Secret given through `secretKeyRef`); at least
    /// 32 visible ASCII characters.
    #[arg(long, value_name = "NAME", conflicts_with = "token_file")]
    pub token_env: Option<String>,
    /// Listen on an address that is not loopback (the token then travels
    /// in clear text over that network).
    #[arg(long)]
    pub allow_remote: bool,
    /// Accept this `Host` header value too (repeatable), e.g. a name the
    /// gateway is reached by with --allow-remote.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub allow_host: Vec<String>,
    /// Serve browsers' requests from this origin (repeatable), e.g.
    /// `https://app.example`; none by default.
    #[arg(long, value_name = "URL")]
    pub allow_origin: Vec<String>,
    /// Give up on a call to the daemon after this long: the client gets
    /// 504 `unavailable` and the worker a new daemon connection. (A file
    /// moves in many calls, each bounded by this.)
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub daemon_timeout_ms: u64,
    /// Give up on an HTTP client whose request body has not come after
    /// this long (408), or that reads nothing of its answer for this long.
    /// (For a file: each piece of the body, each write of the answer.)
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub http_timeout_ms: u64,
}

impl GatewayArgs {
    /// The gateway's configuration, for the daemon at `socket`.
    pub fn config(&self, socket: &std::path::Path) -> allox_gateway::GatewayConfig {
        let mut cfg = allox_gateway::GatewayConfig::new(self.listen.clone(), socket);
        cfg.token_file = self.token.resolve(socket);
        cfg.token_env = self.token_env.clone();
        cfg.allow_remote = self.allow_remote;
        cfg.allow_hosts = self.allow_host.clone();
        cfg.allow_origins = self.allow_origin.clone();
        cfg.daemon_timeout = std::time::Duration::from_millis(self.daemon_timeout_ms.max(1));
        cfg.http_timeout = std::time::Duration::from_millis(self.http_timeout_ms.max(1));
        cfg
    }
}

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
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    argv: Vec<String>,
}

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

/// A network mode and egress rules, as `agent create` and `session
/// create` take them.
#[derive(Args, Debug, Default, PartialEq)]
pub struct NetworkArgs {
    /// The network mode: disabled, isolated or proxy (docs/network.md).
    #[arg(long, value_name = "MODE", value_parser = ["disabled", "isolated", "proxy"])]
    pub network: Option<String>,
    #[command(flatten)]
    pub egress: EgressArgs,
}

/// Egress rules (`host[:port]`, `*.domain`, an address or network, `*`).
#[derive(Args, Debug, Default, PartialEq)]
pub struct EgressArgs {
    /// Allow this (repeatable); without any, this level does not narrow.
    #[arg(long = "allow", value_name = "RULE")]
    pub allow: Vec<String>,
    /// Deny this (repeatable); a deny always wins.
    #[arg(long = "deny", value_name = "RULE")]
    pub deny: Vec<String>,
}

impl EgressArgs {
    /// `None` when no rule is given.
    pub fn egress(self) -> Option<allox_protocol::Egress> {
        if self.allow.is_empty() && self.deny.is_empty() {
            return None;
        }
        Some(allox_protocol::Egress {
            allow: (!self.allow.is_empty()).then_some(self.allow),
            deny: self.deny,
        })
    }
}

impl NetworkArgs {
    fn mode(&self) -> Option<allox_protocol::NetworkMode> {
        self.network
            .as_deref()
            .and_then(allox_protocol::NetworkMode::parse)
    }
}

#[derive(Subcommand, Debug)]
pub enum NetCommand {
    /// Show an agent's or a session's network mode and egress rules; with
    /// --allow or --deny, replace that level's rules (live sessions apply
    /// them to their next connection).
    Policy {
        /// The agent.
        agent: String,
        /// The session (every session's of the agent if left out).
        session: Option<String>,
        #[command(flatten)]
        egress: EgressArgs,
    },
    /// Connection attempts through the sessions' proxies, oldest first.
    Audit {
        /// The agent (every agent's if left out).
        agent: Option<String>,
        /// The session (every session's of the agent if left out).
        session: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum ShareCommand {
    /// The sessions sharing now (of every agent, or one), and the agents'
    /// settings that are not the defaults.
    List {
        /// The agent (every agent's if left out).
        agent: Option<String>,
    },
    /// Show an agent's sharing settings, changing those given.
    Agent {
        /// The agent.
        agent: String,
        /// Whether its sessions may share at all (`no` turns every share
        /// of its sessions off and refuses `enable`).
        #[arg(long, value_name = "yes|no", value_parser = yes_no)]
        allowed: Option<bool>,
        /// Whether its sessions share without running `enable` (sharing is
        /// off by default).
        #[arg(long, value_name = "on|off", value_parser = on_off)]
        default: Option<bool>,
        /// The scope of that default (a directory of each session's files).
        #[arg(long, value_name = "DIR")]
        default_scope: Option<String>,
        /// The permission of that default (read-only by default).
        #[arg(long, value_name = "read|write", value_parser = permission)]
        default_permission: Option<allox_protocol::SharePermission>,
    },
    /// Turn a session's sharing on or off, as the host.
    Session {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// Whether it shares.
        #[arg(value_name = "on|off", value_parser = on_off, action = clap::ArgAction::Set)]
        state: bool,
        /// A directory of the session's files (default: all of them).
        #[arg(long, value_name = "DIR")]
        scope: Option<String>,
        /// What the other sessions may do there (read-only by default).
        #[arg(long, value_name = "read|write", value_parser = permission)]
        permission: Option<allox_protocol::SharePermission>,
    },
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?} is neither on nor off")),
    }
}

fn yes_no(s: &str) -> Result<bool, String> {
    match s {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!("{s:?} is neither yes nor no")),
    }
}

fn permission(s: &str) -> Result<allox_protocol::SharePermission, String> {
    match s {
        "read" => Ok(allox_protocol::SharePermission::Read),
        "write" => Ok(allox_protocol::SharePermission::Write),
        _ => Err(format!("{s:?} is neither read nor write")),
    }
}

/// Which tree of a session a path is in.
#[derive(Args, Debug, Default, PartialEq, Clone)]
pub struct FsWhere {
    /// In the agent's shared/ instead of the session's files.
    #[arg(long)]
    pub shared: bool,
}

/// The same, or a checkpoint's tree (read-only).
#[derive(Args, Debug, Default, PartialEq, Clone)]
pub struct FsWhereRead {
    #[command(flatten)]
    pub place: FsWhere,
    /// As it was at this checkpoint.
    #[arg(long, value_name = "ID", conflicts_with = "shared")]
    pub checkpoint: Option<String>,
}

impl FsWhere {
    fn scope(&self) -> allox_protocol::FsScope {
        if self.shared {
            allox_protocol::FsScope::Shared
        } else {
            allox_protocol::FsScope::Session
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum FsCommand {
    /// List a directory (the session's root by default).
    Ls {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The directory (default: the top).
        #[arg(default_value = "")]
        path: String,
        /// Levels below it (default 1).
        #[arg(long)]
        depth: Option<u32>,
        #[command(flatten)]
        at: FsWhereRead,
    },
    /// Print a file's bytes, as they are.
    Cat {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The path, from the top of the scope.
        path: String,
        #[command(flatten)]
        at: FsWhereRead,
    },
    /// What is at a path.
    Stat {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The path, from the top of the scope.
        path: String,
        #[command(flatten)]
        at: FsWhereRead,
    },
    /// Remove a file or an empty directory (with -r, a whole tree).
    Rm {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The path, from the top of the scope.
        path: String,
        /// A directory with everything in it.
        #[arg(short, long)]
        recursive: bool,
        #[command(flatten)]
        at: FsWhere,
    },
    /// Make a directory (with -p, its parents too).
    Mkdir {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The path, from the top of the scope.
        path: String,
        /// Its missing parents too, and no error if it exists.
        #[arg(short, long)]
        parents: bool,
        #[command(flatten)]
        at: FsWhere,
    },
    /// Report changes below a directory as they happen (Ctrl-C to stop);
    /// a rollback of the session shows as one `rolled_back`.
    Watch {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The directory (default: the top).
        #[arg(default_value = "")]
        path: String,
        /// Its subdirectories too.
        #[arg(short, long)]
        recursive: bool,
        #[command(flatten)]
        at: FsWhere,
    },
    /// Rename a path.
    Mv {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The path to rename.
        from: String,
        /// Its new path.
        to: String,
        #[command(flatten)]
        at: FsWhere,
    },
}

/// Where a listing (`events`, `net audit`) starts, how long it is, and
/// whether it goes on.
#[derive(Args, Debug, Default, PartialEq, Clone, Copy)]
pub struct PageArgs {
    /// Continue after this sequence number (from an earlier answer).
    #[arg(long)]
    pub cursor: Option<u64>,
    /// At most this many records.
    #[arg(long)]
    pub limit: Option<u32>,
    /// Keep printing new records as they come (Ctrl-C to stop).
    #[arg(long)]
    pub follow: bool,
}

fn fs_action(f: FsCommand) -> Action {
    use allox_protocol::{FsList, FsMkdir, FsMove, FsRemove, FsStat};
    let remote = |agent: String, session: String, path: String, at: FsWhereRead| {
        allox_client::files::Remote {
            agent,
            session,
            path,
            scope: at.place.scope(),
            checkpoint: at.checkpoint,
        }
    };
    Action::Call(match f {
        FsCommand::Ls {
            agent,
            session,
            path,
            depth,
            at,
        } => Request::FsList(FsList {
            agent_id: agent,
            session_id: session,
            scope: at.place.scope(),
            checkpoint_id: at.checkpoint,
            path,
            depth,
        }),
        FsCommand::Cat {
            agent,
            session,
            path,
            at,
        } => return Action::Cat(remote(agent, session, path, at)),
        FsCommand::Stat {
            agent,
            session,
            path,
            at,
        } => Request::FsStat(FsStat {
            agent_id: agent,
            session_id: session,
            scope: at.place.scope(),
            checkpoint_id: at.checkpoint,
            path,
        }),
        FsCommand::Rm {
            agent,
            session,
            path,
            recursive,
            at,
        } => Request::FsRemove(FsRemove {
            agent_id: agent,
            session_id: session,
            scope: at.scope(),
            path,
            recursive,
        }),
        FsCommand::Mkdir {
            agent,
            session,
            path,
            parents,
            at,
        } => Request::FsMkdir(FsMkdir {
            agent_id: agent,
            session_id: session,
            scope: at.scope(),
            path,
            parents,
        }),
        FsCommand::Watch {
            agent,
            session,
            path,
            recursive,
            at,
        } => {
            return Action::Follow(Request::FsWatch(allox_protocol::FsWatch {
                agent_id: agent,
                session_id: session,
                scope: at.scope(),
                path,
                recursive,
            }))
        }
        FsCommand::Mv {
            agent,
            session,
            from,
            to,
            at,
        } => Request::FsMove(FsMove {
            agent_id: agent,
            session_id: session,
            scope: at.scope(),
            path: from,
            to,
        }),
    })
}

impl PageArgs {
    /// `q` answered once, or followed.
    fn action(self, q: Request) -> Action {
        if self.follow {
            Action::Follow(q)
        } else {
            Action::Call(q)
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum AgentCommand {
    /// Create an agent and its workspace.
    Create {
        /// The agent.
        agent: String,
        /// Its sessions' default network mode and rules for all of them.
        #[command(flatten)]
        network: NetworkArgs,
    },
    /// List agents.
    List,
    /// Delete an agent with its shared/ (refused while it has sessions,
    /// unless --force).
    Delete {
        /// The agent.
        agent: String,
        /// Delete its sessions too, with their workspaces and checkpoints
        /// (pinned ones included).
        #[arg(long)]
        force: bool,
    },
}

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
}

#[derive(Subcommand, Debug)]
pub enum CheckpointCommand {
    /// Snapshot a session's current/.
    Create {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The checkpoint.
        checkpoint: String,
        /// Keep it from deletion until unpinned.
        #[arg(long)]
        pin: bool,
        /// Free text for people (at most 256 bytes).
        #[arg(long, value_name = "TEXT")]
        label: Option<String>,
    },
    /// Show a session's checkpoints as a tree.
    List {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
    },
    /// Delete a checkpoint that is not pinned.
    Delete {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The checkpoint.
        checkpoint: String,
    },
    /// Keep a checkpoint from deletion.
    Pin {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The checkpoint.
        checkpoint: String,
    },
    /// Allow a checkpoint to be deleted again.
    Unpin {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        /// The checkpoint.
        checkpoint: String,
    },
}

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

/// What a command line asks `alloxctl` to do.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// Send one request and show its answer.
    Call(Request),
    /// A run's output, kept and (`follow`) live.
    Logs(allox_protocol::ProcessLogs),
    /// Stop the daemon and wait for it, at most this long.
    Shutdown(std::time::Duration),
    /// Run a program and wait for it, passing its output through.
    Exec(Run),
    /// Start a program without waiting.
    Start(Run),
    /// Wait for a run to end.
    Wait(ProcessWait),
    /// Follow a terminal run again.
    Attach(allox_protocol::ProcessAttach),
    /// Send a request given in JSON and print the JSON answer.
    Rpc(String),
    /// Run the HTTP gateway.
    Gateway(GatewayArgs),
    /// Print the gateway's token.
    Token(TokenFileArg),
    /// Print the OpenAPI document.
    Openapi,
    /// Print the events of a subscription (`process.events` or
    /// `network.audit` with `follow`) as they come.
    Follow(Request),
    /// Print a remote file's bytes.
    Cat(allox_client::files::Remote),
    /// Show sessions' use, refreshed.
    Top { interval: f64, once: bool },
    /// Send spans read from a file.
    MonitorIngest {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        file: PathBuf,
    },
    /// Write the OTLP/JSON of what `monitor.records` gives.
    MonitorExport {
        query: allox_protocol::MonitorRecords,
        out: Option<PathBuf>,
    },
    /// Write a session's report.
    MonitorReport {
        /// The agent.
        agent: String,
        /// The session.
        session: String,
        out: PathBuf,
    },
    /// Copy between here and a session.
    Copy {
        from: String,
        to: String,
        shared: bool,
        checkpoint: Option<String>,
    },
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
    fn run(self, wait: bool) -> Run {
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
            },
            stdin_file: self.stdin_file,
            tty: self.tty,
            detach: self.detach_on_exit,
            interactive: self.interactive,
        }
    }
}

impl Command {
    pub fn action(self) -> Action {
        use Command as C;
        let call = |r| Action::Call(r);
        match self {
            C::Ping => call(Request::Ping(Ping {})),
            C::Shutdown { wait_s } => Action::Shutdown(std::time::Duration::from_secs(wait_s)),
            C::Info => call(Request::SystemInfo(allox_protocol::SystemInfoRequest {})),
            C::Check => call(Request::StoreCheck(allox_protocol::StoreCheckRequest {})),
            C::Plugins => call(Request::PluginList(allox_protocol::PluginListRequest {})),
            C::Agent(a) => call(match a {
                AgentCommand::Create { agent, network } => Request::AgentCreate(AgentCreate {
                    network: network.mode(),
                    egress: network.egress.egress(),
                    ..AgentCreate::new(agent)
                }),
                AgentCommand::List => Request::AgentList(AgentList {}),
                AgentCommand::Delete { agent, force } => Request::AgentDelete(AgentDelete {
                    force,
                    ..AgentDelete::new(agent)
                }),
            }),
            C::Session(s) => call(match s {
                SessionCommand::Create {
                    agent,
                    session,
                    network,
                } => Request::SessionCreate(SessionCreate {
                    network: network.mode(),
                    egress: network.egress.egress(),
                    ..SessionCreate::new(agent, session)
                }),
                SessionCommand::List { agent } => Request::SessionList(agent_ref(agent)),
                SessionCommand::Delete {
                    agent,
                    session,
                    force,
                } => Request::SessionDelete(SessionDelete {
                    force,
                    ..SessionDelete::new(agent, session)
                }),
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
            C::Diff {
                agent,
                session,
                from,
                to,
                patch,
            } => call(Request::CheckpointDiff(allox_protocol::CheckpointDiff {
                agent_id: agent,
                session_id: session,
                from,
                to,
                patch,
            })),
            C::Log { agent, session } => call(Request::CheckpointList(session_ref(agent, session))),
            C::Turn(TurnCommand::Begin { agent, session, id }) => {
                call(Request::TurnBegin(allox_protocol::TurnBegin {
                    agent_id: agent,
                    session_id: session,
                    turn_id: id,
                }))
            }
            C::Turn(TurnCommand::End {
                agent,
                session,
                turn,
                turn_id,
                status,
                label,
            }) => call(Request::TurnEnd(allox_protocol::TurnEnd {
                agent_id: agent,
                session_id: session,
                turn_id: turn.or(turn_id).unwrap_or_default(),
                status: match status.as_str() {
                    "failed" => allox_protocol::TurnStatus::Failed,
                    "cancelled" => allox_protocol::TurnStatus::Cancelled,
                    _ => allox_protocol::TurnStatus::Ok,
                },
                label,
            })),
            C::Policy {
                agent,
                session,
                auto_checkpoint,
                keep_last,
            } => call(Request::PolicySet(allox_protocol::PolicySet {
                agent_id: agent,
                session_id: session,
                auto_checkpoint: auto_checkpoint.map(|v| v == "on"),
                keep_last,
            })),
            C::Audit {
                after,
                before,
                limit,
            } => call(Request::AuditList(AuditList {
                after_seq: after,
                before_seq: before,
                limit,
            })),
            C::Exec(run) => Action::Exec(run.run(true)),
            C::Start(run) => Action::Start(run.run(false)),
            C::Attach {
                agent,
                session,
                run,
                no_replay,
            } => Action::Attach(allox_protocol::ProcessAttach {
                agent_id: agent,
                session_id: session,
                run_id: run,
                replay: Some(!no_replay),
            }),
            C::Logs {
                agent,
                session,
                run,
                follow,
            } => Action::Logs(allox_protocol::ProcessLogs {
                agent_id: agent,
                session_id: session,
                run_id: run,
                follow,
            }),
            C::Wait {
                agent,
                session,
                run,
                timeout_ms,
            } => Action::Wait(ProcessWait {
                agent_id: agent,
                session_id: session,
                run_id: run,
                timeout_ms,
            }),
            C::Ps {
                agent,
                session,
                tree: false,
                ..
            } => call(Request::ProcessList(session_ref(agent, session))),
            C::Ps {
                agent,
                session,
                run,
                ..
            } => call(Request::ProcessTree(allox_protocol::ProcessTreeRequest {
                agent_id: agent,
                session_id: session,
                run_id: run,
            })),
            C::Events {
                agent,
                session,
                run,
                page,
            } => page.action(Request::ProcessEvents(allox_protocol::ProcessEvents {
                agent_id: agent,
                session_id: session,
                run_id: run,
                cursor: page.cursor,
                limit: page.limit,
                follow: page.follow,
            })),
            C::Fs(f) => fs_action(f),
            C::Cp {
                from,
                to,
                shared,
                checkpoint,
            } => Action::Copy {
                from,
                to,
                shared,
                checkpoint,
            },
            C::Net(NetCommand::Policy {
                agent,
                session,
                egress,
            }) => call(match egress.egress() {
                Some(egress) => Request::NetworkPolicySet(allox_protocol::NetworkPolicySet {
                    agent_id: agent,
                    session_id: session,
                    egress,
                }),
                None => Request::NetworkPolicyGet(allox_protocol::NetworkPolicyGet {
                    agent_id: agent,
                    session_id: session,
                }),
            }),
            C::Top { interval, once } => Action::Top { interval, once },
            C::Monitor(MonitorCommand::Ingest {
                agent,
                session,
                file,
            }) => Action::MonitorIngest {
                agent,
                session,
                file,
            },
            C::Monitor(MonitorCommand::Records {
                agent,
                session,
                trace,
                cursor,
                limit,
                follow,
            }) => {
                let q = Request::MonitorRecords(allox_protocol::MonitorRecords {
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
                    call(q)
                }
            }
            C::Monitor(MonitorCommand::Summary { agent, session, by }) => call(
                Request::MonitorSummary(allox_protocol::MonitorSummaryRequest {
                    agent_id: agent,
                    session_id: session,
                    group_by: match by.as_str() {
                        "model" => allox_protocol::GroupBy::Model,
                        "turn" => allox_protocol::GroupBy::Turn,
                        _ => allox_protocol::GroupBy::Tool,
                    },
                }),
            ),
            C::Monitor(MonitorCommand::Export {
                agent,
                session,
                out,
            }) => Action::MonitorExport {
                query: allox_protocol::MonitorRecords {
                    agent_id: agent,
                    session_id: session,
                    ..Default::default()
                },
                out,
            },
            C::Monitor(MonitorCommand::Report {
                agent,
                session,
                out,
            }) => Action::MonitorReport {
                agent,
                session,
                out,
            },
            C::Stats { agent, session } => {
                call(Request::SessionStats(allox_protocol::SessionStatsRequest {
                    agent_id: agent,
                    session_id: session,
                }))
            }
            C::Limit {
                agent,
                session,
                pids_max,
                memory_max,
                cpu_max,
            } => call(Request::SessionUpdate(allox_protocol::SessionUpdate {
                agent_id: agent,
                session_id: session,
                pids_max,
                memory_max,
                cpu_max,
            })),
            C::Share(ShareCommand::List { agent }) => {
                call(Request::ShareList(allox_protocol::ShareList {
                    agent_id: agent,
                }))
            }
            C::Share(ShareCommand::Agent {
                agent,
                allowed,
                default,
                default_scope,
                default_permission,
            }) => call(Request::ShareAgentSet(allox_protocol::ShareAgentSet {
                agent_id: agent,
                allowed,
                default_on: default,
                default_scope,
                default_permission,
            })),
            C::Share(ShareCommand::Session {
                agent,
                session,
                state,
                scope,
                permission,
            }) => call(Request::ShareSessionSet(allox_protocol::ShareSessionSet {
                agent_id: agent,
                session_id: session,
                enabled: state,
                scope,
                permission,
            })),
            C::Net(NetCommand::Audit {
                agent,
                session,
                page,
            }) => page.action(Request::NetworkAudit(allox_protocol::NetworkAudit {
                agent_id: agent,
                session_id: session,
                cursor: page.cursor,
                limit: page.limit,
                follow: page.follow,
            })),
            C::Kill {
                agent,
                session,
                run,
                signal,
            } => call(Request::ProcessKill(ProcessKill {
                agent_id: agent,
                session_id: session,
                run_id: run,
                signal,
            })),
            C::Rpc { request } => Action::Rpc(request),
            C::Gateway(args) => Action::Gateway(args),
            C::Token { file } => Action::Token(file),
            C::Openapi => Action::Openapi,
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
    fn every_argument_and_flag_says_what_it_is() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if matches!(id, "help" | "version") || a.is_hide_set() {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "alloxctl", &mut missing);
        assert!(missing.is_empty(), "without help text: {missing:#?}");
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
            Action::Call(Request::AgentCreate(AgentCreate::new("a")))
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
                before_seq: None,
                limit: Some(10),
            }))
        );

        // Global flags may follow the subcommand too.
        let (_, json, action) = parse(&["rpc", "{}", "--json"]);
        assert!(json);
        assert_eq!(action, Action::Rpc("{}".into()));

        let (socket, _, action) = parse(&["gateway"]);
        let Action::Gateway(args) = action else {
            panic!("{action:?}")
        };
        let cfg = args.config(&socket);
        assert_eq!(cfg.listen, "127.0.0.1:8092");
        assert_eq!(cfg.token_file, PathBuf::from("/run/allox/gateway.token"));
        assert!(!cfg.allow_remote && cfg.allow_origins.is_empty());
        assert_eq!(cfg.daemon_timeout, allox_gateway::DAEMON_TIMEOUT);

        let (socket, _, action) = parse(&[
            "--socket",
            "/tmp/s/ctl.sock",
            "gateway",
            "--listen",
            "0.0.0.0:9000",
            "--allow-remote",
            "--allow-origin",
            "https://a.example",
            "--allow-origin",
            "https://b.example",
            "--daemon-timeout-ms",
            "500",
        ]);
        let Action::Gateway(args) = action else {
            panic!("{action:?}")
        };
        let cfg = args.config(&socket);
        assert_eq!(cfg.token_file, PathBuf::from("/tmp/s/gateway.token"));
        assert!(cfg.allow_remote);
        assert_eq!(
            cfg.allow_origins,
            ["https://a.example", "https://b.example"]
        );
        assert_eq!(cfg.daemon_timeout, std::time::Duration::from_millis(500));

        let (_, _, action) = parse(&["token", "--token-file", "/etc/t"]);
        assert_eq!(
            action,
            Action::Token(TokenFileArg {
                token_file: Some("/etc/t".into())
            })
        );

        let diff = |patch| {
            Action::Call(Request::CheckpointDiff(allox_protocol::CheckpointDiff {
                agent_id: "a".into(),
                session_id: "s".into(),
                from: "c".into(),
                to: "current".into(),
                patch,
            }))
        };
        assert_eq!(parse(&["diff", "a", "s", "c", "current"]).2, diff(false));
        assert_eq!(
            parse(&["diff", "a", "s", "c", "current", "--patch"]).2,
            diff(true)
        );
        assert_eq!(
            parse(&["diff", "-p", "a", "s", "c", "current"]).2,
            diff(true)
        );
    }

    #[test]
    fn exec_and_start_build_process_start() {
        let (_, _, action) = parse(&[
            "exec",
            "--cwd",
            "src",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--env",
            "A=2",
            "--timeout-ms",
            "500",
            "a",
            "s",
            "--",
            "ls",
            "-la",
            "--json",
        ]);
        let Action::Exec(run) = action else {
            panic!("{action:?}")
        };
        assert_eq!(run.stdin_file, None);
        let r = run.into_request().unwrap();
        assert_eq!((r.agent_id.as_str(), r.session_id.as_str()), ("a", "s"));
        // Everything after `--` belongs to the program.
        assert_eq!(r.argv, ["ls", "-la", "--json"]);
        let env: Vec<_> = r
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(env, [("A", "2"), ("B", "x=y")]);
        assert_eq!(r.cwd.as_deref(), Some("src"));
        assert_eq!(r.timeout_ms, Some(500));
        assert_eq!(r.stdin.as_deref(), Some(&b""[..]));
        assert!(r.wait && r.stream);

        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("input");
        std::fs::write(&input, "data\n").unwrap();
        let input = input.to_str().unwrap();
        let (_, json, action) = parse(&[
            "start",
            "a",
            "s",
            "--stdin-file",
            input,
            "--json",
            "--",
            "cat",
        ]);
        assert!(json);
        let Action::Start(run) = action else {
            panic!("{action:?}")
        };
        let r = run.into_request().unwrap();
        assert_eq!(r.stdin.as_deref(), Some(&b"data\n"[..]));
        assert!(!r.wait && !r.stream);

        let (_, _, action) = parse(&["start", "a", "s", "--", "sleep", "9"]);
        let Action::Start(run) = action else {
            panic!("{action:?}")
        };
        assert_eq!(run.request.stdin, None);
    }

    #[test]
    fn process_commands_map_to_requests() {
        let (_, _, action) = parse(&["ps", "a", "s"]);
        assert_eq!(
            action,
            Action::Call(Request::ProcessList(session_ref("a".into(), "s".into())))
        );

        let kill = |args: &[&str]| match parse(args).2 {
            Action::Call(Request::ProcessKill(k)) => (k.run_id, k.signal),
            other => panic!("{other:?}"),
        };
        assert_eq!(kill(&["kill", "a", "s"]), (None, None));
        assert_eq!(
            kill(&["kill", "a", "s", "r1", "--signal", "15"]),
            (Some("r1".into()), Some(15))
        );
        assert_eq!(
            kill(&["kill", "--signal", "SIGINT", "a", "s"]),
            (None, Some(2))
        );

        let (_, _, action) = parse(&["wait", "a", "s", "r1", "--timeout-ms", "10"]);
        assert_eq!(
            action,
            Action::Wait(ProcessWait {
                agent_id: "a".into(),
                session_id: "s".into(),
                run_id: "r1".into(),
                timeout_ms: Some(10),
            })
        );
    }

    #[test]
    fn usage_errors_are_refused() {
        for args in [
            &["session", "create", "a"][..],
            &["checkpoint", "list", "a"],
            &["audit", "--limit", "many"],
            &["exec", "a", "s"],
            &["exec", "a", "s", "--"],
            &["exec", "a", "s", "ls"],
            &["exec", "--env", "NOEQUALS", "a", "s", "--", "ls"],
            &["exec", "--env", "=v", "a", "s", "--", "ls"],
            &["start", "a", "--", "ls"],
            &["kill", "a", "s", "--signal", "FLY"],
            &["kill", "a", "s", "--signal", "0"],
            &["wait", "a", "s"],
            &["fly"],
        ] {
            let argv = std::iter::once("alloxctl").chain(args.iter().copied());
            assert!(Cli::try_parse_from(argv).is_err(), "{args:?}");
        }
    }
}
