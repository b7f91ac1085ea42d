//! The command line of `alloxctl`, and what each command asks for: the
//! commands here, each noun's arguments and request in its own module.

mod agent;
mod checkpoint;
mod effects;
mod fs;
mod gateway;
mod monitor;
mod net;
mod port;
mod process;
mod secret;
mod session;
mod share;
mod system;
#[cfg(test)]
mod tests;
mod turn;
mod vm;

pub use agent::AgentCommand;
pub use checkpoint::{CheckpointCommand, DiffArgs, LogArgs, PolicyArgs, RollbackArgs};
pub use effects::EffectsCommand;
pub use fs::{CpArgs, FsCommand, FsWhere, FsWhereRead};
pub use gateway::{GatewayArgs, LogFormat, TokenFileArg};
pub use monitor::MonitorCommand;
pub use net::{EgressArgs, NetCommand, NetworkArgs};
pub use port::PortCommand;
pub use process::{AttachArgs, EventsArgs, KillArgs, LogsArgs, PsArgs, Run, RunArgs, WaitArgs};
pub use secret::{SecretCommand, ValueFrom};
pub use session::{LimitArgs, SessionCommand, StatsArgs, TopArgs};
pub use share::ShareCommand;
pub use system::{AuditArgs, ShutdownArgs};
pub use turn::TurnCommand;
pub use vm::VmCommand;

use allox_protocol::{Ping, ProcessWait, Request, SessionRef};
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
    /// Talk to the guest of this VM (`alloxctl vm`): its control port's
    /// socket instead of --socket.
    #[arg(long, global = true, value_name = "NAME")]
    pub vm: Option<String>,
    /// With --vm: a paused VM answers `unavailable` at once instead of the
    /// request waiting for its resume.
    #[arg(long, global = true, requires = "vm")]
    pub if_running: bool,
    /// Where the VMs live.
    #[arg(long, global = true, env = "ALLOX_VM_DIR", default_value = allox_vmm::DEFAULT_ROOT)]
    pub vm_dir: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The command line: the hot commands (`exec`, `cp`) through a parser
    /// of theirs alone, since building the parser of every command is most
    /// of a start's time; anything that one does not take as it is (help,
    /// a mistake, another command) through the whole one, so what is
    /// printed is the same.
    pub fn parse_fast() -> Cli {
        Self::fast_from(std::env::args_os()).unwrap_or_else(Cli::parse)
    }

    /// [`Cli::parse_fast`]'s fast half over `argv`, or `None`.
    pub fn fast_from<I, T>(argv: I) -> Option<Cli>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let argv: Vec<std::ffi::OsString> = argv.into_iter().map(Into::into).collect();
        // The first word that is not a global option names the command.
        let mut words = argv.get(1..)?.iter();
        let (mut socket, mut json, mut globals) = (None, false, 0);
        let command = loop {
            match words.next()?.to_str()? {
                "--json" => json = true,
                "--socket" => socket = Some(words.next()?.clone()),
                w if w.starts_with("--socket=") => socket = Some(w["--socket=".len()..].into()),
                w => break w,
            }
            globals += 1;
        };
        if !matches!(command, "exec" | "cp") {
            return None;
        }
        // The commonest line, `exec AGENT SESSION -- CMD...` without an
        // option, needs no parser at all.
        let once = globals == usize::from(json) + usize::from(socket.is_some());
        if let (true, "exec", Some(run)) = (once, command, plain_exec(words.as_slice())) {
            let socket = match socket {
                Some(s) => s,
                None => match std::env::var_os("ALLOX_SOCKET") {
                    Some(s) if !s.is_empty() => s,
                    Some(_) => return None,
                    None => DEFAULT_SOCKET.into(),
                },
            };
            return Some(Cli {
                socket: socket.into(),
                json,
                vm: None,
                if_running: false,
                vm_dir: allox_vmm::DEFAULT_ROOT.into(),
                command: Command::Exec(run),
            });
        }
        let hot = Hot::try_parse_from(&argv).ok()?;
        Some(Cli {
            socket: hot.socket,
            json: hot.json,
            vm: None,
            if_running: false,
            vm_dir: allox_vmm::DEFAULT_ROOT.into(),
            command: match hot.command {
                HotCommand::Exec(a) => Command::Exec(a),
                HotCommand::Cp(a) => Command::Cp(a),
            },
        })
    }
}

/// `AGENT SESSION -- CMD...` (after `exec`) as the parser reads it, or
/// `None` for anything else (an option, a word that looks like one, no
/// command): that goes to the parser.
fn plain_exec(words: &[std::ffi::OsString]) -> Option<RunArgs> {
    let [agent, session, dashes, argv @ ..] = words else {
        return None;
    };
    let (agent, session) = (agent.to_str()?, session.to_str()?);
    if agent.starts_with('-') || session.starts_with('-') || dashes != "--" || argv.is_empty() {
        return None;
    }
    let argv = argv
        .iter()
        .map(|w| w.to_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()?;
    Some(RunArgs::plain(agent.into(), session.into(), argv))
}

/// [`Cli`] with the hot commands only.
#[derive(Parser, Debug)]
#[command(name = "alloxctl")]
struct Hot {
    #[arg(long, global = true, env = "ALLOX_SOCKET", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: HotCommand,
}

#[derive(Subcommand, Debug)]
enum HotCommand {
    Exec(RunArgs),
    Cp(CpArgs),
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check that the daemon answers.
    Ping,
    /// Stop the supervisor in order (in the guest: power the VM off), and
    /// wait until the process serving the socket has exited.
    Shutdown(ShutdownArgs),
    /// Uptime, memory of init and supervisor, processes, unreaped
    /// orphans, loaded plugins.
    Info,
    /// Every metric the daemon keeps, in the Prometheus (OpenMetrics) text
    /// format: what the gateway serves at `GET /metrics`.
    Metrics,
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
    Rollback(RollbackArgs),
    /// Draw a session's checkpoint history as a tree (same as
    /// `checkpoint list`).
    Log(LogArgs),
    /// What changed between two checkpoints (`current` for the session's
    /// current/), like `git diff --stat`.
    Diff(DiffArgs),
    /// Report an agent framework's turns.
    #[command(subcommand)]
    Turn(TurnCommand),
    /// Set automatic checkpoints for an agent (its sessions' default) or a
    /// session.
    Policy(PolicyArgs),
    /// Show the audit log: the newest records (oldest of them first), and
    /// how to see more when the list is cut.
    Audit(AuditArgs),
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
    Attach(AttachArgs),
    /// A run's output, with or without a terminal, running or ended (while
    /// the daemon keeps it): what is kept of it; with -f, then what it
    /// writes until it ends, each byte once, exiting as `exec` does.
    Logs(LogsArgs),
    /// Wait for a run to end and show how it ended; exits as `exec` does.
    Wait(WaitArgs),
    /// List a session's processes.
    Ps(PsArgs),
    /// The session network: egress rules and the audit of connections.
    #[command(subcommand)]
    Net(NetCommand),
    /// Credentials a session's runs use through its proxy but never read:
    /// set, list, delete.
    #[command(subcommand)]
    Secret(SecretCommand),
    /// A session's ports served to the host: expose, list, unexpose, and
    /// forward from a port of this host.
    #[command(subcommand)]
    Port(PortCommand),
    /// Guests of this host under QEMU: create, start, stop, kill, pause,
    /// resume, snapshot, restore, clone, list, rm.
    #[command(subcommand)]
    Vm(VmCommand),
    /// Sharing of sessions' files between sessions (the share plugin):
    /// who shares what, and the host's switches.
    #[command(subcommand)]
    Share(ShareCommand),
    /// What observed runs changed outside their workspaces (the
    /// system-effects plugin), and the sessions it fenced.
    #[command(subcommand)]
    Effects(EffectsCommand),
    /// What a session uses now and has used in total (CPU, memory, I/O,
    /// OOM kills), with its limits.
    Stats(StatsArgs),
    /// Every session and its live runs: CPU over the last interval,
    /// memory now, OOM kills; refreshed until interrupted.
    Top(TopArgs),
    /// Traces, summaries and reports of the monitor plugin
    /// (`--monitor-root`).
    #[command(subcommand)]
    Monitor(MonitorCommand),
    /// Change a live session's limits (those given; the others stay).
    Limit(LimitArgs),
    /// A session's files, without a process: list, read, make, remove.
    #[command(subcommand)]
    Fs(FsCommand),
    /// Copy files or directories between here and a session, either way:
    /// `alloxctl cp ./src agent-a/s1:src`, `alloxctl cp agent-a/s1:out ./out`.
    Cp(CpArgs),
    /// What the process tracker recorded: forks, execs, exits, oldest first.
    Events(EventsArgs),
    /// Signal every process of one run, or of all a session's runs
    /// (whatever they forked); SIGKILL unless --signal says otherwise.
    Kill(KillArgs),
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

impl Command {
    /// What the command line asks for: each noun maps its own arguments.
    pub fn action(self) -> Action {
        use Command as C;
        let call = Action::Call;
        match self {
            C::Ping => call(Request::Ping(Ping {})),
            C::Shutdown(a) => a.action(),
            C::Info => call(Request::SystemInfo(allox_protocol::SystemInfoRequest {})),
            C::Metrics => call(Request::SystemMetrics(
                allox_protocol::SystemMetricsRequest {},
            )),
            C::Check => call(Request::StoreCheck(allox_protocol::StoreCheckRequest {})),
            C::Plugins => call(Request::PluginList(allox_protocol::PluginListRequest {})),
            C::Agent(a) => call(a.request()),
            C::Session(s) => s.action(),
            C::Checkpoint(c) => call(c.request()),
            C::Rollback(a) => call(a.request()),
            C::Log(a) => call(a.request()),
            C::Diff(a) => call(a.request()),
            C::Turn(t) => call(t.request()),
            C::Policy(a) => call(a.request()),
            C::Audit(a) => call(a.request()),
            C::Exec(run) => Action::Exec(run.run(true)),
            C::Start(run) => Action::Start(run.run(false)),
            C::Attach(a) => a.action(),
            C::Logs(a) => a.action(),
            C::Wait(a) => a.action(),
            C::Ps(a) => call(a.request()),
            C::Net(n) => n.action(),
            C::Secret(c) => c.action(),
            C::Port(c) => c.action(),
            C::Vm(c) => c.action(),
            C::Share(s) => call(s.request()),
            C::Effects(e) => e.action(),
            C::Stats(a) => call(a.request()),
            C::Top(a) => a.action(),
            C::Monitor(m) => m.action(),
            C::Limit(a) => call(a.request()),
            C::Fs(f) => f.action(),
            C::Cp(a) => a.action(),
            C::Events(a) => a.action(),
            C::Kill(a) => call(a.request()),
            C::Rpc { request } => Action::Rpc(request),
            C::Gateway(args) => Action::Gateway(args),
            C::Token { file } => Action::Token(file),
            C::Openapi => Action::Openapi,
        }
    }
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

/// A session named by its agent and its id.
fn session_ref(agent_id: String, session_id: String) -> SessionRef {
    SessionRef {
        agent_id,
        session_id,
    }
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
    /// Check a run's evidence: in the daemon (`query`), or here over an
    /// export file by the verifier executable.
    EffectsVerify {
        query: Option<allox_protocol::EffectsVerify>,
        export: Option<PathBuf>,
        root: Option<String>,
        verifier: Option<PathBuf>,
    },
    /// Write a run's evidence set as an archive.
    EffectsExport {
        query: allox_protocol::EffectsExport,
        out: Option<PathBuf>,
    },
    /// Write a session's archive.
    SessionExport {
        query: allox_protocol::SessionExport,
        out: Option<PathBuf>,
    },
    /// Make a session from an archive.
    SessionImport {
        agent: String,
        session: Option<String>,
        input: Option<PathBuf>,
    },
    /// Copy a session to another daemon.
    SessionMove {
        agent: String,
        session: String,
        to: PathBuf,
        new_session: Option<String>,
        since: Option<String>,
    },
    /// Forward connections from `listen` to a session's exposed port.
    PortForward {
        agent: String,
        session: String,
        port: u16,
        listen: std::net::SocketAddr,
    },
    /// Set a secret whose value is read here first.
    SecretSet {
        request: allox_protocol::SecretSet,
        from: ValueFrom,
    },
    /// Manage VMs.
    Vm(VmCommand),
    /// Copy between here and a session.
    Copy {
        from: String,
        to: String,
        shared: bool,
        checkpoint: Option<String>,
        framed: bool,
        verbose: bool,
    },
}
