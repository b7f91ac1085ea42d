//! `allox-init`: wiring only. Started by the kernel as PID 1 without a
//! subcommand it is the guest's init ([`pid1`]); `supervise` runs the
//! supervisor as a daemon over a Btrfs store (the init's child in the
//! guest, or standalone on any Linux host); `container` is a container's
//! PID 1 over a store block device ([`in_container`]). What each does is in
//! the library (`allox_init`). Started as `allox` (inside a sandbox) it is
//! the in-sandbox interface's client (`allox_init::client`).

mod in_container;
mod pid1;

use allox_init::container::ContainerArgs;
use allox_init::guest::{EXIT_SETTINGS_REFUSED, EXIT_SHUTDOWN_REQUESTED};
use allox_init::supervise::{SuperviseArgs, ThisMachine};
use allox_supervisor::daemon;
use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "allox-init",
    bin_name = "allox-init",
    version,
    about = "Allox OS init and supervisor"
)]
struct Cli {
    /// Log filter (tracing env-filter syntax), e.g. `info`, `allox_supervisor=debug`.
    #[arg(long, env = "ALLOX_LOG", default_value = "info", global = true)]
    log: String,
    /// Log lines as text, or as one JSON object per line (time, level,
    /// target, message, the event's fields, and the request's action,
    /// agent, session and run in `span` where there is one).
    #[arg(long, env = "ALLOX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the workspace store at --root over a control socket.
    Supervise(Box<SuperviseArgs>),
    /// Be a container's PID 1: mount the store from its block device,
    /// keep the supervisor running, stop in order on SIGTERM and exit 0.
    Container(Box<ContainerArgs>),
    /// A session's context, which makes its runs' sandboxes (started by
    /// the supervisor, not by hand).
    #[command(hide = true)]
    SessionContext,
}

fn main() {
    // On a guest, where the supervisor's start is on the boot's path.
    let entered_ms = allox_store::clock::since_boot().as_millis() as u64;
    // Started as `allox` inside a sandbox: the in-sandbox interface's client.
    if allox_init::client::started_as_client(std::env::args_os().next().as_deref()) {
        std::process::exit(allox_init::client::main(std::env::args_os()));
    }
    // A session's context runs before anything else: no logging, no
    // threads (its runs are copies of it).
    if std::env::args().nth(1).as_deref() == Some("session-context") {
        allox_sandbox::zygote::run();
    }
    // The kernel starts /init with no subcommand (only words of its
    // command line it did not take); anything else started as PID 1 (a
    // container's entrypoint) runs the subcommand it names.
    if rustix::process::getpid().is_init()
        && !matches!(
            std::env::args().nth(1).as_deref(),
            Some("container" | "supervise" | "help" | "--help" | "-h" | "--version" | "-V")
        )
    {
        pid1::run();
    }
    let cli = read_without_parser().unwrap_or_else(Cli::parse);
    let parsed_ms = allox_store::clock::since_boot().as_millis() as u64;
    let logs = tracing_subscriber::fmt()
        // A log that cannot be written (a full or size-limited file, a
        // console gone) loses the line; it must not panic the supervisor.
        .log_internal_errors(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs
            .with_ansi(
                std::io::IsTerminal::is_terminal(&std::io::stderr())
                    && std::env::var_os("NO_COLOR").is_none(),
            )
            .init(),
        LogFormat::Json => {
            logs.json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(false)
                .init();
            // A container's keeper logs through the same subscriber.
            allox_init::guest::log_as_json(true);
        }
    }
    tracing::debug!(
        entered_ms,
        parsed_ms,
        logging_ms = allox_store::clock::since_boot().as_millis() as u64,
        "started (ms after boot)"
    );
    match run(cli.cmd, entered_ms) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("allox-init: {e:#}");
            std::process::exit(1);
        }
    }
}

/// `supervise` as the guest's PID 1 starts it, read without clap
/// (`allox_init::supervise::words`, where the reason is); `None` for any
/// other command line, which clap reads.
fn read_without_parser() -> Option<Cli> {
    let words: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if words.get(1)? != "supervise" {
        return None;
    }
    let args = allox_init::supervise::words::parse(&words[2..])?;
    let (log, json) = allox_init::supervise::words::log_settings(|name| std::env::var_os(name))?;
    Some(Cli {
        log,
        log_format: if json {
            LogFormat::Json
        } else {
            LogFormat::Text
        },
        cmd: Cmd::Supervise(Box::new(args)),
    })
}

/// Returns the exit status. `entered_ms`: when `main` began, after boot.
fn run(cmd: Cmd, entered_ms: u64) -> anyhow::Result<i32> {
    match cmd {
        Cmd::Supervise(args) => {
            // Started by a keeper, it inherited its blocked signals.
            allox_init::keeper::unblock_signals();
            let under_init = args.under_init;
            let cfg = match args.into_config(&ThisMachine) {
                Ok(cfg) => cfg,
                // Under a keeper: said, and not started again.
                Err(e) if under_init => {
                    eprintln!("allox-init: {:#}", anyhow::Error::from(e));
                    return Ok(EXIT_SETTINGS_REFUSED);
                }
                Err(e) => return Err(e.into()),
            };
            tracing::debug!(
                entered_ms,
                configured_ms = allox_store::clock::since_boot().as_millis() as u64,
                "supervisor configured (ms after boot)"
            );
            let stopped = daemon::run(cfg.daemon).context("supervisor stopped")?;
            Ok(match stopped {
                daemon::Stopped::Requested if under_init => EXIT_SHUTDOWN_REQUESTED,
                _ => 0,
            })
        }
        Cmd::Container(args) => in_container::run(*args),
        Cmd::SessionContext => bail!("session-context is started by the supervisor only"),
    }
}
