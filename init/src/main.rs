//! `allox-init`: wiring only. As PID 1 it is the guest's init ([`pid1`]);
//! `supervise` runs the supervisor as a daemon over a Btrfs store (the
//! init's child in the guest, or standalone on any Linux host).

mod limits;
mod pid1;

use allox_supervisor::daemon::{self, DaemonConfig};
use allox_supervisor::runs::RunsConfig;
use allox_supervisor::server::Limits;
use allox_supervisor::supervisor::Policy;
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

// Parsed once at start-up; the size of the biggest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Serve the workspace store at --root over a control socket.
    Supervise {
        /// Store root: a directory on a mounted Btrfs filesystem.
        #[arg(long)]
        root: PathBuf,
        /// Where to listen, as `unix:PATH` or `virtio:PORT-NAME` (a
        /// virtio-serial port); repeat to listen on several. One `unix:` is
        /// required.
        #[arg(long, default_value = "unix:/run/allox/ctl.sock")]
        listen: Vec<String>,
        /// Started by the guest's PID 1: `system.shutdown` powers the VM
        /// off (exit status 3 tells the init so).
        #[arg(long, hide = true)]
        under_init: bool,
        /// Kill a session's processes before every rollback unless the
        /// request says otherwise.
        #[arg(long)]
        kill_session_processes_on_rollback: bool,
        /// Limit each session's current/ to this many bytes (suffixes K, M,
        /// G, T: powers of 1024) with Btrfs quota groups, which this turns
        /// on; a write past it fails with EDQUOT. Off by default: quota
        /// groups make snapshots and their deletion slower (docs/store.md).
        #[arg(long, value_name = "BYTES", value_parser = allox_store::parse_size)]
        session_quota: Option<u64>,
        /// Run without process support (store only).
        #[arg(long)]
        no_processes: bool,
        /// cgroup2 mount to put session cgroups under (default: detected).
        #[arg(long)]
        cgroup_root: Option<PathBuf>,
        /// User and group that sandboxed programs run as.
        #[arg(long, default_value_t = 10_000)]
        sandbox_uid: u32,
        #[arg(long, default_value_t = 10_000)]
        sandbox_gid: u32,
        /// Default `pids.max` of every session's cgroup.
        #[arg(long)]
        default_pids_max: Option<u64>,
        /// Default `memory.max` (bytes) of every session's cgroup.
        #[arg(long)]
        default_memory_max: Option<u64>,
        /// Default `cpu.max` ("QUOTA PERIOD" in µs) of every session's cgroup.
        #[arg(long)]
        default_cpu_max: Option<String>,
        /// `pids.max` of all sessions together (the `allox` cgroup), so
        /// that the supervisor always has process ids left.
        #[arg(long)]
        sessions_pids_max: Option<u64>,
        /// `memory.max` (bytes) of all sessions together, so that the
        /// supervisor and the kernel keep the rest.
        #[arg(long)]
        sessions_memory_max: Option<u64>,
        /// `host`: sandboxes share the VM's network; `isolated`: each has
        /// its own network namespace with only loopback.
        #[arg(long, default_value = "host", value_parser = ["host", "isolated"])]
        sandbox_network: String,
        /// Empty directory where sandboxes assemble their root.
        #[arg(long, default_value = "/run/allox/sandbox-root")]
        sandbox_stage: PathBuf,
        /// `ebpf`: attribute every process of every run, in the kernel, to
        /// its agent, session and run (needs a kernel with BTF and
        /// CAP_BPF/CAP_PERFMON or CAP_SYS_ADMIN); `off`: nothing is loaded.
        #[arg(long, default_value = "off", value_parser = ["off", "ebpf"])]
        process_tracker: String,
        /// Most process events kept in state/events.redb; the oldest go first.
        #[arg(long, default_value_t = allox_supervisor::tracker::DEFAULT_MAX_EVENTS)]
        process_events_max: u64,
        /// Also serve this user on the control socket (repeatable). Root and
        /// the daemon's own user always are; with any --allow-uid or
        /// --allow-gid the socket file is 0666 and the peer's credentials
        /// (SO_PEERCRED) decide, otherwise it is 0600.
        #[arg(long, value_name = "UID")]
        allow_uid: Vec<u32>,
        /// Also serve peers whose (primary) group is this one (repeatable).
        #[arg(long, value_name = "GID")]
        allow_gid: Vec<u32>,
        /// Bytes of captured output the finished runs keep together for
        /// `process.wait`; past it the oldest runs' output is dropped
        /// (their exit status stays).
        #[arg(long, default_value_t = RunsConfig::DEFAULT_FINISHED_OUTPUT_BUDGET)]
        finished_output_budget: usize,
        /// Finished runs kept for `process.wait` (each at most 10 minutes);
        /// the oldest go first.
        #[arg(long, default_value_t = RunsConfig::DEFAULT_FINISHED_RUNS_MAX)]
        finished_runs_max: usize,
        /// Drop a client that stops sending in the middle of a frame for this long.
        #[arg(long, default_value_t = 10_000, hide = true)]
        stall_timeout_ms: u64,
        /// Drop a client that does not read an answer for this long.
        #[arg(long, default_value_t = 10_000, hide = true)]
        write_timeout_ms: u64,
        /// Drop a client that takes longer than this over one frame.
        #[arg(long, default_value_t = 30_000, hide = true)]
        frame_timeout_ms: u64,
    },
    /// PID 1 of a sandbox (started by the supervisor, not by hand).
    #[command(hide = true)]
    SandboxInit,
}

fn main() {
    // The sandbox init runs before anything else: no logging, no threads.
    if std::env::args().nth(1).as_deref() == Some("sandbox-init") {
        allox_sandbox::init::run();
    }
    if rustix::process::getpid().is_init() {
        pid1::run();
    }
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        // A log that cannot be written (a full or size-limited file, a
        // console gone) loses the line; it must not panic the supervisor.
        .log_internal_errors(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none(),
        )
        .init();
    match run(cli.cmd) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("allox-init: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Returns the exit status.
fn run(cmd: Cmd) -> anyhow::Result<i32> {
    match cmd {
        Cmd::Supervise {
            root,
            listen,
            under_init,
            kill_session_processes_on_rollback,
            stall_timeout_ms,
            write_timeout_ms,
            frame_timeout_ms,
            no_processes,
            session_quota,
            cgroup_root,
            sandbox_uid,
            sandbox_gid,
            sandbox_stage,
            default_pids_max,
            default_memory_max,
            default_cpu_max,
            sessions_pids_max,
            sessions_memory_max,
            sandbox_network,
            process_tracker,
            process_events_max,
            allow_uid,
            allow_gid,
            finished_output_budget,
            finished_runs_max,
        } => {
            let mut socket = None;
            let mut virtio_ports = Vec::new();
            for l in &listen {
                if let Some(p) = l.strip_prefix("unix:").filter(|p| !p.is_empty()) {
                    if socket.replace(PathBuf::from(p)).is_some() {
                        bail!("--listen {l:?}: only one unix: socket");
                    }
                } else if let Some(n) = l.strip_prefix("virtio:").filter(|n| !n.is_empty()) {
                    virtio_ports.push(n.to_string());
                } else {
                    bail!("--listen {l:?}: expected unix:PATH or virtio:PORT-NAME");
                }
            }
            let Some(socket) = socket else {
                bail!("--listen: one unix:PATH is required");
            };
            let tracker = if process_tracker == "ebpf" {
                if no_processes {
                    bail!("--process-tracker ebpf needs process support; drop --no-processes");
                }
                let state = root.join("state");
                std::fs::create_dir_all(&state)
                    .with_context(|| format!("cannot create {}", state.display()))?;
                Some(
                    allox_supervisor::tracker::ProcessTracker::start(&state, process_events_max)
                        .map_err(|e| anyhow::anyhow!("--process-tracker ebpf: {e}"))?,
                )
            } else {
                None
            };
            let runs = if no_processes {
                None
            } else {
                let mount = match cgroup_root {
                    Some(p) => p,
                    None => detect_cgroup2()?,
                };
                let exe = std::fs::read_link("/proc/self/exe")
                    .context("cannot find this binary for the sandbox init")?;
                let mut rc = RunsConfig::new(mount, exe, sandbox_stage);
                rc.isolate_network = sandbox_network == "isolated";
                rc.tracker = tracker;
                rc.finished.output_budget = finished_output_budget;
                rc.finished.max_runs = finished_runs_max;
                rc.uid = sandbox_uid;
                rc.gid = sandbox_gid;
                rc.total = allox_sandbox::cgroup::Limits {
                    pids_max: sessions_pids_max,
                    memory_max: sessions_memory_max,
                    cpu_max: None,
                };
                rc.limits = allox_sandbox::cgroup::Limits {
                    pids_max: default_pids_max,
                    memory_max: default_memory_max,
                    cpu_max: match default_cpu_max {
                        Some(t) => Some(
                            allox_sandbox::cgroup::Cgroups::parse_cpu_max(&t).with_context(|| {
                                format!("--default-cpu-max {t:?}: expected \"QUOTA PERIOD\" or \"max PERIOD\"")
                            })?,
                        ),
                        None => None,
                    },
                };
                Some(rc)
            };
            let stopped = daemon::run(DaemonConfig {
                root,
                store: allox_store::StoreOptions { session_quota },
                socket,
                virtio_ports,
                policy: Policy {
                    kill_processes_on_rollback: kill_session_processes_on_rollback,
                    power_off_on_shutdown: under_init,
                },
                limits: Limits {
                    stall: Duration::from_millis(stall_timeout_ms),
                    write: Duration::from_millis(write_timeout_ms),
                    frame: Duration::from_millis(frame_timeout_ms),
                    ..Limits::default()
                },
                runs,
                peers: allox_supervisor::peer::PeerPolicy {
                    uids: allow_uid,
                    gids: allow_gid,
                },
            })
            .context("supervisor stopped")?;
            Ok(match stopped {
                daemon::Stopped::Requested if under_init => pid1::EXIT_SHUTDOWN_REQUESTED,
                _ => 0,
            })
        }
        Cmd::SandboxInit => bail!("sandbox-init is started by the supervisor only"),
    }
}

/// The cgroup2 mount: `/sys/fs/cgroup` on a pure v2 host, the `unified`
/// mount on a hybrid one.
fn detect_cgroup2() -> anyhow::Result<PathBuf> {
    for p in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        if std::path::Path::new(p).join("cgroup.procs").exists()
            && std::path::Path::new(p)
                .join("cgroup.subtree_control")
                .exists()
        {
            return Ok(PathBuf::from(p));
        }
    }
    bail!("no cgroup2 mount at /sys/fs/cgroup or /sys/fs/cgroup/unified; pass --cgroup-root or --no-processes")
}
