//! `allox-init`: wiring only. `supervise` runs the supervisor as a daemon
//! over a Btrfs store; PID 1 mode comes with the guest image.

use allox_supervisor::daemon::{self, DaemonConfig};
use allox_supervisor::dispatch::Policy;
use allox_supervisor::server::Limits;
use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "allox-init", version, about = "Allox OS init and supervisor")]
struct Cli {
    /// Log filter (tracing env-filter syntax), e.g. `info`, `allox_supervisor=debug`.
    #[arg(long, env = "ALLOX_LOG", default_value = "info", global = true)]
    log: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the workspace store at --root over a control socket.
    Supervise {
        /// Store root: a directory on a mounted Btrfs filesystem.
        #[arg(long)]
        root: PathBuf,
        /// Where to listen, as `unix:PATH`.
        #[arg(long, default_value = "unix:/run/allox/ctl.sock")]
        listen: String,
        /// Kill a session's processes before every rollback unless the
        /// request says otherwise.
        #[arg(long)]
        kill_session_processes_on_rollback: bool,
        /// Drop a client that stops sending in the middle of a frame for this long.
        #[arg(long, default_value_t = 10_000, hide = true)]
        stall_timeout_ms: u64,
        /// Drop a client that does not read an answer for this long.
        #[arg(long, default_value_t = 10_000, hide = true)]
        write_timeout_ms: u64,
    },
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(cli.cmd) {
        eprintln!("allox-init: {e:#}");
        std::process::exit(1);
    }
}

fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Supervise {
            root,
            listen,
            kill_session_processes_on_rollback,
            stall_timeout_ms,
            write_timeout_ms,
        } => {
            let Some(path) = listen.strip_prefix("unix:") else {
                bail!("--listen {listen:?}: only unix:PATH is supported");
            };
            daemon::run(DaemonConfig {
                root,
                socket: PathBuf::from(path),
                policy: Policy {
                    kill_processes_on_rollback: kill_session_processes_on_rollback,
                },
                limits: Limits {
                    stall: Duration::from_millis(stall_timeout_ms),
                    write: Duration::from_millis(write_timeout_ms),
                    ..Limits::default()
                },
            })
            .context("supervisor stopped")
        }
    }
}
