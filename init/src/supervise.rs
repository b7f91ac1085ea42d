//! The `supervise` command: its flags ([`SuperviseArgs`]) and their
//! conversion into the daemon's configuration ([`SuperviseArgs::into_config`]).
//!
//! What the conversion needs from the machine (the cgroup2 mount, this
//! binary's path) comes through [`Host`], so tests pass a fake.

use allox_sandbox::cgroup::{Cgroups, Limits as CgroupLimits};
use allox_supervisor::daemon::{DaemonConfig, PluginsConfig};
use allox_supervisor::peer::PeerPolicy;
use allox_supervisor::runs::RunsConfig;
use allox_supervisor::server::Limits;
use allox_supervisor::supervisor::Policy;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

pub mod words;

/// The flags of `allox-init supervise`.
#[derive(Debug, Clone, clap::Args)]
pub struct SuperviseArgs {
    /// Store root: a directory on a mounted Btrfs filesystem.
    #[arg(long)]
    pub root: PathBuf,
    /// Where to listen, as `unix:PATH` or `virtio:PORT-NAME` (a
    /// virtio-serial port); repeat to listen on several. One `unix:` is
    /// required.
    #[arg(long, default_value = SuperviseArgs::DEFAULT_LISTEN)]
    pub listen: Vec<String>,
    /// Started by the guest's PID 1: `system.shutdown` powers the VM
    /// off (exit status 3 tells the init so).
    #[arg(long, hide = true)]
    pub under_init: bool,
    /// Started by the guest's PID 1 while it mounts the store: this
    /// inherited descriptor (a pipe's read end) reads end-of-file once the
    /// store is mounted. The control ports answer Hello before that.
    #[arg(long, value_name = "FD", hide = true)]
    pub store_mounted_fd: Option<i32>,
    /// Kill a session's processes before every rollback unless the
    /// request says otherwise.
    #[arg(long)]
    pub kill_session_processes_on_rollback: bool,
    /// Most uploads (`fs.write` with `upload`) one session may have under
    /// way at once; the next one begun is refused naming this flag.
    #[arg(long, value_name = "N", default_value_t = SuperviseArgs::DEFAULT_UPLOADS_PER_SESSION, value_parser = clap::value_parser!(u32).range(1..))]
    pub uploads_per_session: u32,
    /// An upload that gets no chunk for this many seconds is abandoned:
    /// its partial file and record are removed.
    #[arg(long, value_name = "SECONDS", default_value_t = SuperviseArgs::DEFAULT_UPLOAD_IDLE_S, value_parser = clap::value_parser!(u64).range(1..))]
    pub upload_idle_s: u64,
    /// Most `fs.watch` streams open at once on the daemon: each takes one
    /// of root's inotify instances, which every root process of the
    /// machine shares (`fs.inotify.max_user_instances`, 128 by default).
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub watches: u32,
    /// Most `fs.watch` streams open at once on one session.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub watches_per_session: u32,
    /// A new session's idle timeout unless it asks for its own: paused
    /// after this many ms without a request for it and without CPU used
    /// by its processes (the next request resumes it).
    #[arg(long, value_name = "MS")]
    pub idle_timeout_ms: Option<u64>,
    /// A new session's lifetime unless it asks for its own: this many ms
    /// after it is made its processes are killed and its changes refused
    /// until `session.update` gives it more time.
    #[arg(long, value_name = "MS")]
    pub max_lifetime_ms: Option<u64>,
    /// Limit each session's current/ to this many bytes (suffixes K, M,
    /// G, T: powers of 1024) with Btrfs quota groups, which this turns
    /// on; a write past it fails with EDQUOT. Off by default: quota
    /// groups make snapshots and their deletion slower (docs/store.md).
    #[arg(long, value_name = "BYTES", value_parser = allox_store::parse_size)]
    pub session_quota: Option<u64>,
    /// The most turn records a session keeps: as a turn begins past it,
    /// the oldest ended ones go (their checkpoints stay). Bounds what an
    /// agent looping `allox turn begin`/`end` spends in the index.
    #[arg(long, value_name = "N", default_value_t = allox_store::TURNS_KEPT, value_parser = at_least_one)]
    pub turns_kept: usize,
    /// The most checkpoints a session may hold (at most 1000, so that its
    /// listing is one answer): a checkpoint, a turn's checkpoint or an
    /// import past it is refused, saying so.
    #[arg(long, value_name = "N", default_value_t = allox_store::SESSION_CHECKPOINTS, value_parser = session_checkpoints)]
    pub session_checkpoints: usize,
    /// Run without process support (store only).
    #[arg(long)]
    pub no_processes: bool,
    /// cgroup2 mount to put session cgroups under (default: detected).
    #[arg(long)]
    pub cgroup_root: Option<PathBuf>,
    /// User and group that sandboxed programs run as.
    #[arg(long, default_value_t = SuperviseArgs::DEFAULT_SANDBOX_ID)]
    pub sandbox_uid: u32,
    #[arg(long, default_value_t = SuperviseArgs::DEFAULT_SANDBOX_ID)]
    pub sandbox_gid: u32,
    /// Default `pids.max` of every session's cgroup.
    #[arg(long)]
    pub default_pids_max: Option<u64>,
    /// Default `memory.max` (bytes) of every session's cgroup.
    #[arg(long)]
    pub default_memory_max: Option<u64>,
    /// Default `cpu.max` ("QUOTA PERIOD" in µs) of every session's cgroup.
    #[arg(long)]
    pub default_cpu_max: Option<String>,
    /// `pids.max` of all sessions together (the `allox` cgroup), so
    /// that the supervisor always has process ids left.
    #[arg(long)]
    pub sessions_pids_max: Option<u64>,
    /// `memory.max` (bytes) of all sessions together, so that the
    /// supervisor and the kernel keep the rest.
    #[arg(long)]
    pub sessions_memory_max: Option<u64>,
    /// `host`: sandboxes share the VM's network; `isolated`: each session
    /// has its own network namespace with only loopback, shared by its
    /// runs.
    #[arg(long, default_value = SuperviseArgs::DEFAULT_SANDBOX_NETWORK, value_parser = ["host", "isolated"])]
    pub sandbox_network: String,
    /// The network mode of sessions whose request and agent name none:
    /// `disabled` (as --sandbox-network has it), `isolated` (a loopback of
    /// the session's own) or `proxy` (that, plus the proxy at
    /// 127.0.0.1:3128; needs --plugin network). See docs/network.md.
    #[arg(long, default_value = SuperviseArgs::DEFAULT_SESSION_NETWORK, value_parser = ["disabled", "isolated", "proxy"])]
    pub session_network: String,
    /// Empty directory where sandboxes assemble their root.
    #[arg(long, default_value = SuperviseArgs::DEFAULT_SANDBOX_STAGE)]
    pub sandbox_stage: PathBuf,
    /// `ebpf`: attribute every process of every run, in the kernel, to
    /// its agent, session and run (needs a kernel with BTF and
    /// CAP_BPF/CAP_PERFMON or CAP_SYS_ADMIN); `off`: nothing is loaded.
    /// The same as `--plugin process-tree`.
    #[arg(long, default_value = SuperviseArgs::DEFAULT_PROCESS_TRACKER, value_parser = ["off", "ebpf"])]
    pub process_tracker: String,
    /// Load this plugin (repeatable; they load in the order given and
    /// stop in the reverse). Installed: see `alloxctl plugins` or
    /// docs/plugins.md. None is loaded unless named.
    #[arg(long = "plugin", value_name = "NAME")]
    pub plugins: Vec<String>,
    /// Sessions that enable sharing reach each other's files through
    /// their in-sandbox interface (`allox share ...`; docs/share.md). The same
    /// as `--plugin share`.
    #[arg(long)]
    pub share_tools: bool,
    /// Keep the spans agent frameworks send (from the host or from inside
    /// a sandbox) and the runs that end, with what they used, in this
    /// directory (outside every workspace): traces, summaries and reports
    /// (docs/monitor.md). The same as `--plugin monitor`, which keeps
    /// them in the store's `state/monitor/`.
    #[arg(long, value_name = "DIR")]
    pub monitor_root: Option<PathBuf>,
    /// Most monitor records (spans and runs) kept; the oldest go first.
    #[arg(long, default_value_t = allox_supervisor::plugins::defaults::monitor::DEFAULT_RECORDS_MAX)]
    pub monitor_records_max: u64,
    /// Most bytes of spans and runs the monitor keeps for one session
    /// (suffixes K, M, G, T); with `--session-quota`, at most that. Spans
    /// past it are refused naming this flag.
    #[arg(long, value_name = "BYTES", value_parser = allox_store::parse_size,
          default_value_t = allox_supervisor::plugins::defaults::monitor::DEFAULT_SESSION_BYTES)]
    pub monitor_session_bytes: u64,
    /// Most bytes of spans a second one session may send from inside its
    /// sandbox (eight seconds' worth at once); spans past it are refused
    /// naming this flag.
    #[arg(long, value_name = "BYTES", value_parser = allox_store::parse_size,
          default_value_t = allox_supervisor::plugins::defaults::monitor::DEFAULT_BYTES_PER_S)]
    pub monitor_bytes_per_s: u64,
    /// Most bytes of one span, encoded as the monitor keeps it; a request
    /// with a larger one is refused naming this flag.
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1024..),
          default_value_t = allox_supervisor::plugins::defaults::monitor::DEFAULT_SPAN_BYTES)]
    pub monitor_span_bytes: u64,
    /// Size past which the audit log (`state/audit.log`) and the plugins'
    /// audit files (`state/share-audit.log`, `state/network-audit.log`)
    /// are rotated: renamed `.1`, replacing the one before (at least 1M;
    /// suffixes K, M, G, T).
    #[arg(long, value_name = "BYTES", value_parser = allox_store::parse_size,
          default_value_t = allox_store::audit::DEFAULT_FILE_BYTES)]
    pub audit_file_bytes: u64,
    /// Audit records a second of one session's guest calls (ten times as
    /// many at once); past it they are counted, and one record says how
    /// many were left out. 0: no limit.
    #[arg(long, value_name = "N", default_value_t = allox_store::audit::DEFAULT_LINES_PER_S)]
    pub audit_lines_per_s: u64,
    /// Do not read what each run used from its cgroup when it ends
    /// (`usage` and `oom_killed` of its result stay empty): the
    /// benchmark's baseline for what that costs.
    #[arg(long)]
    pub no_run_usage: bool,
    /// Keep the next run's PID 1 made ahead in each session's context
    /// (docs/sandbox.md): `never` (each run's PID 1 made when it is asked
    /// for; measured faster on 2 vCPUs, docs/benchmarks.md), `auto` (where
    /// the cgroup2 mount has `favordynmods`: without it, moving the PID 1
    /// into its run's cgroup waits for an RCU grace period, milliseconds),
    /// or `always`.
    #[arg(long, value_name = "WHEN", default_value = SuperviseArgs::DEFAULT_PREPARED_RUNS,
          value_parser = ["auto", "always", "never"])]
    pub prepared_runs: String,
    /// Keep no metrics (`system.metrics` is then refused): the
    /// benchmark's baseline for what counting costs.
    #[arg(long)]
    pub no_metrics: bool,
    /// Count runs started by agent too (`allox_agent_runs_started_total`),
    /// for at most this many agents; the rest count as one, `_other`. 0:
    /// no per-agent label.
    #[arg(long, value_name = "AGENTS", default_value_t = SuperviseArgs::DEFAULT_METRICS_AGENT_LABEL)]
    pub metrics_agent_label: usize,
    /// How long an observed run's cgroup may take to freeze
    /// (`--plugin system-effects`), at its start and at its end: past it
    /// the start is refused, or the end is a fault that fences the
    /// session.
    #[arg(long, value_name = "MS", default_value_t = allox_supervisor::runs::RunsConfig::DEFAULT_FREEZE_MS)]
    pub freeze_timeout_ms: u64,
    /// With `--plugin system-effects`: the scope file, naming the domains
    /// beyond `workspace` and `shared` confirmed at S0/S1 and the
    /// filesystem domain's paths (docs/system-effects.md).
    #[arg(long, value_name = "FILE")]
    pub system_effects_scope: Option<PathBuf>,
    /// The observer executable (default: `allox-observe` beside this
    /// binary). It is read once into a sealed memory file, its sha256
    /// checked against the pinned one, and run from there.
    #[arg(long, value_name = "FILE")]
    pub system_effects_observer: Option<PathBuf>,
    /// The observer's pinned sha256 (hex), when this binary was built
    /// without one (`ALLOX_OBSERVE_SHA256` at build).
    #[arg(long, value_name = "HEX")]
    pub system_effects_observer_sha256: Option<String>,
    /// The verifier executable (default: `allox-system-effects-verify`
    /// beside this binary), read, checked and run as the observer is: it
    /// checks every observed run's evidence before the run is answered.
    #[arg(long, value_name = "FILE")]
    pub system_effects_verifier: Option<PathBuf>,
    /// The verifier's pinned sha256 (hex), when this binary was built
    /// without one (`ALLOX_VERIFY_SHA256` at build).
    #[arg(long, value_name = "HEX")]
    pub system_effects_verifier_sha256: Option<String>,
    /// The recover tool (default: `allox-system-effects-recover` beside
    /// this binary), read, checked and run as the observer is: it restores
    /// the workspace of a run started with `recovery` (protocol v3).
    #[arg(long, value_name = "FILE")]
    pub system_effects_recover: Option<PathBuf>,
    /// The recover tool's pinned sha256 (hex), when this binary was built
    /// without one (`ALLOX_RECOVER_SHA256` at build).
    #[arg(long, value_name = "HEX")]
    pub system_effects_recover_sha256: Option<String>,
    /// The observer history's ring buffer (a power of two, at least one
    /// page; suffixes K, M, G): records that do not fit are counted lost,
    /// and a run with lost history is INCOMPLETE and fenced.
    #[arg(long, value_name = "BYTES", value_parser = ring_bytes,
          default_value_t = allox_supervisor::plugins::defaults::system_effects::DEFAULT_RING_BYTES)]
    pub system_effects_ring_bytes: u64,
    /// Observe without the history's BPF LSM hooks (write opens, path
    /// changes, mounts, module loads, netlink messages, allowed signals),
    /// on a kernel that refuses BPF LSM programs: the system calls, the
    /// processes and the sysctl accesses are still recorded. Without it,
    /// such a kernel stops the daemon, naming what it lacks.
    #[arg(long)]
    pub system_effects_without_lsm: bool,
    /// Most process events kept in state/events.redb; the oldest go first.
    #[arg(long, default_value_t = allox_supervisor::plugins::defaults::process_tree::DEFAULT_MAX_EVENTS)]
    pub process_events_max: u64,
    /// With `--plugin network`: hosts sessions may reach through the proxy
    /// (repeatable; `name`, `*.domain`, address or network, each with an
    /// optional `:PORT`; see docs/network.md). Without any, nothing is
    /// reachable: the proxy denies what is not allowed.
    #[arg(long, value_name = "RULE")]
    pub network_allow: Vec<String>,
    /// With `--plugin network`: hosts no session may reach (repeatable;
    /// a deny always wins).
    #[arg(long, value_name = "RULE")]
    pub network_deny: Vec<String>,
    /// With `--plugin network`: the DNS server the broker asks
    /// (ADDRESS:PORT); the system's resolver otherwise.
    #[arg(long, value_name = "ADDRESS:PORT")]
    pub network_resolver: Option<std::net::SocketAddr>,
    /// With `--plugin network`: the roots (PEM) the broker verifies the
    /// servers of intercepted HTTPS connections against (a secret's
    /// `intercept`); the system's roots otherwise.
    #[arg(long, value_name = "FILE")]
    pub network_ca_file: Option<std::path::PathBuf>,
    /// With `--plugin network`: the key secrets are sealed under in the
    /// store (32 random bytes, mode 0600; made on the first `secret.set`
    /// when there is none). Keep it outside the store.
    #[arg(long, value_name = "FILE", default_value = allox_supervisor::plugin_api::DEFAULT_SECRETS_KEY_FILE)]
    pub secrets_key_file: std::path::PathBuf,
    /// With `--plugin network`: most connections one session's proxy
    /// holds open at once; the next is answered 503 naming this flag.
    #[arg(long, value_name = "N", default_value_t = allox_supervisor::plugins::defaults::network::DEFAULT_CONNECTIONS_PER_SESSION, value_parser = clap::value_parser!(u32).range(1..))]
    pub proxy_connections_per_session: u32,
    /// With `--plugin network`: most proxy connections of all sessions
    /// open at once; the next is answered 503 naming this flag.
    #[arg(long, value_name = "N", default_value_t = allox_supervisor::plugins::defaults::network::DEFAULT_CONNECTIONS, value_parser = clap::value_parser!(u32).range(1..))]
    pub proxy_connections: u32,
    /// With `--plugin network`: most name lookups one session's proxy
    /// waits for at once; the next is refused (502) naming this flag.
    #[arg(long, value_name = "N", default_value_t = allox_supervisor::plugins::defaults::network::DEFAULT_LOOKUPS_PER_SESSION, value_parser = clap::value_parser!(u32).range(1..))]
    pub proxy_lookups_per_session: u32,
    /// Also serve this user on the control socket (repeatable). Root and
    /// the daemon's own user always are; with any --allow-uid or
    /// --allow-gid the socket file is 0666 and the peer's credentials
    /// (SO_PEERCRED) decide, otherwise it is 0600.
    #[arg(long, value_name = "UID")]
    pub allow_uid: Vec<u32>,
    /// Also serve peers whose (primary) group is this one (repeatable).
    #[arg(long, value_name = "GID")]
    pub allow_gid: Vec<u32>,
    /// Bytes of captured output the finished runs keep together for
    /// `process.wait`; past it the oldest runs' output is dropped
    /// (their exit status stays).
    #[arg(long, default_value_t = RunsConfig::DEFAULT_FINISHED_OUTPUT_BUDGET)]
    pub finished_output_budget: usize,
    /// Finished runs kept for `process.wait` (each at most 10 minutes);
    /// the oldest go first.
    #[arg(long, default_value_t = RunsConfig::DEFAULT_FINISHED_RUNS_MAX)]
    pub finished_runs_max: usize,
    /// Drop a client that stops sending in the middle of a frame for this long.
    #[arg(long, default_value_t = SuperviseArgs::DEFAULT_STALL_TIMEOUT_MS, hide = true)]
    pub stall_timeout_ms: u64,
    /// Drop a client that does not read an answer for this long.
    #[arg(long, default_value_t = SuperviseArgs::DEFAULT_WRITE_TIMEOUT_MS, hide = true)]
    pub write_timeout_ms: u64,
    /// Drop a client that takes longer than this over one frame.
    #[arg(long, default_value_t = SuperviseArgs::DEFAULT_FRAME_TIMEOUT_MS, hide = true)]
    pub frame_timeout_ms: u64,
}

impl SuperviseArgs {
    pub const DEFAULT_LISTEN: &'static str = "unix:/run/allox/ctl.sock";
    pub const DEFAULT_UPLOADS_PER_SESSION: u32 = 16;
    pub const DEFAULT_UPLOAD_IDLE_S: u64 = 300;
    pub const DEFAULT_SANDBOX_ID: u32 = 10_000;
    pub const DEFAULT_SANDBOX_NETWORK: &'static str = "host";
    pub const DEFAULT_SESSION_NETWORK: &'static str = "disabled";
    pub const DEFAULT_SANDBOX_STAGE: &'static str = "/run/allox/sandbox-root";
    pub const DEFAULT_PROCESS_TRACKER: &'static str = "off";
    pub const DEFAULT_PREPARED_RUNS: &'static str = "never";
    pub const DEFAULT_METRICS_AGENT_LABEL: usize = 0;
    pub const DEFAULT_STALL_TIMEOUT_MS: u64 = 10_000;
    pub const DEFAULT_WRITE_TIMEOUT_MS: u64 = 10_000;
    pub const DEFAULT_FRAME_TIMEOUT_MS: u64 = 30_000;

    /// Every flag at its default, the store at `root`: what the parser
    /// gives for `supervise --root ROOT` (a test holds the two equal), made
    /// without it ([`words`]).
    pub fn at_defaults(root: PathBuf) -> SuperviseArgs {
        use allox_supervisor::plugins::defaults::{monitor, network, process_tree, system_effects};
        SuperviseArgs {
            root,
            listen: vec![Self::DEFAULT_LISTEN.to_string()],
            under_init: false,
            store_mounted_fd: None,
            kill_session_processes_on_rollback: false,
            uploads_per_session: Self::DEFAULT_UPLOADS_PER_SESSION,
            watches: 32,
            watches_per_session: 8,
            upload_idle_s: Self::DEFAULT_UPLOAD_IDLE_S,
            idle_timeout_ms: None,
            max_lifetime_ms: None,
            session_quota: None,
            turns_kept: allox_store::TURNS_KEPT,
            session_checkpoints: allox_store::SESSION_CHECKPOINTS,
            no_processes: false,
            cgroup_root: None,
            sandbox_uid: Self::DEFAULT_SANDBOX_ID,
            sandbox_gid: Self::DEFAULT_SANDBOX_ID,
            default_pids_max: None,
            default_memory_max: None,
            default_cpu_max: None,
            sessions_pids_max: None,
            sessions_memory_max: None,
            sandbox_network: Self::DEFAULT_SANDBOX_NETWORK.to_string(),
            session_network: Self::DEFAULT_SESSION_NETWORK.to_string(),
            sandbox_stage: PathBuf::from(Self::DEFAULT_SANDBOX_STAGE),
            process_tracker: Self::DEFAULT_PROCESS_TRACKER.to_string(),
            plugins: Vec::new(),
            share_tools: false,
            monitor_root: None,
            monitor_records_max: monitor::DEFAULT_RECORDS_MAX,
            monitor_session_bytes: monitor::DEFAULT_SESSION_BYTES,
            monitor_bytes_per_s: monitor::DEFAULT_BYTES_PER_S,
            monitor_span_bytes: monitor::DEFAULT_SPAN_BYTES,
            audit_file_bytes: allox_store::audit::DEFAULT_FILE_BYTES,
            audit_lines_per_s: allox_store::audit::DEFAULT_LINES_PER_S,
            no_run_usage: false,
            prepared_runs: Self::DEFAULT_PREPARED_RUNS.to_string(),
            no_metrics: false,
            metrics_agent_label: Self::DEFAULT_METRICS_AGENT_LABEL,
            freeze_timeout_ms: RunsConfig::DEFAULT_FREEZE_MS,
            system_effects_scope: None,
            system_effects_observer: None,
            system_effects_observer_sha256: None,
            system_effects_verifier: None,
            system_effects_verifier_sha256: None,
            system_effects_recover: None,
            system_effects_recover_sha256: None,
            system_effects_ring_bytes: system_effects::DEFAULT_RING_BYTES,
            system_effects_without_lsm: false,
            process_events_max: process_tree::DEFAULT_MAX_EVENTS,
            network_allow: Vec::new(),
            network_deny: Vec::new(),
            network_resolver: None,
            network_ca_file: None,
            secrets_key_file: PathBuf::from(allox_supervisor::plugin_api::DEFAULT_SECRETS_KEY_FILE),
            proxy_connections_per_session: network::DEFAULT_CONNECTIONS_PER_SESSION,
            proxy_connections: network::DEFAULT_CONNECTIONS,
            proxy_lookups_per_session: network::DEFAULT_LOOKUPS_PER_SESSION,
            allow_uid: Vec::new(),
            allow_gid: Vec::new(),
            finished_output_budget: RunsConfig::DEFAULT_FINISHED_OUTPUT_BUDGET,
            finished_runs_max: RunsConfig::DEFAULT_FINISHED_RUNS_MAX,
            stall_timeout_ms: Self::DEFAULT_STALL_TIMEOUT_MS,
            write_timeout_ms: Self::DEFAULT_WRITE_TIMEOUT_MS,
            frame_timeout_ms: Self::DEFAULT_FRAME_TIMEOUT_MS,
        }
    }
}

/// A flag, or a combination of flags, that cannot be served; each names
/// the flag.
#[derive(Debug, Error)]
pub enum SuperviseError {
    #[error("--listen {0:?}: only one unix: socket")]
    SecondSocket(String),
    #[error("--listen {0:?}: expected unix:PATH or virtio:PORT-NAME")]
    BadListen(String),
    #[error("--listen: one unix:PATH is required")]
    NoSocket,
    #[error("--store-mounted-fd {0}: not an open descriptor")]
    StoreMountedFd(i32),
    #[error("--process-tracker ebpf needs process support; drop --no-processes")]
    TrackerWithoutProcesses,
    #[error("--plugin {0} needs process support; drop --no-processes")]
    PluginWithoutProcesses(String),
    #[error("no cgroup2 mount at /sys/fs/cgroup or /sys/fs/cgroup/unified; pass --cgroup-root or --no-processes")]
    NoCgroup2,
    #[error("--cgroup-root {}: not in a cgroup2 filesystem (give a directory of the cgroup2 mount, e.g. /sys/fs/cgroup/NAME, or /sys/fs/cgroup/unified/NAME on a hybrid host)", .0.display())]
    NotCgroup2(PathBuf),
    #[error("cannot find this binary for the sandbox init")]
    Exe(#[source] std::io::Error),
    #[error("--default-cpu-max {0:?}: expected \"QUOTA PERIOD\" or \"max PERIOD\"")]
    CpuMax(String),
    #[error("--session-network proxy needs the network plugin: add --plugin network")]
    ProxyWithoutPlugin,
    #[error("{0} is a setting of the system-effects plugin: add --plugin system-effects")]
    EffectsWithoutPlugin(&'static str),
}

/// What [`SuperviseArgs::into_config`] reads from the machine.
pub trait Host {
    /// The cgroup2 mount, when `--cgroup-root` does not name one.
    fn cgroup2_mount(&self) -> Option<PathBuf>;
    /// Whether `dir`, or the nearest of its parents that exists (the
    /// daemon makes the rest), is in a cgroup2 filesystem.
    fn in_cgroup2(&self, dir: &Path) -> bool;
    /// This binary, which every sandbox runs as its init.
    fn exe(&self) -> std::io::Result<PathBuf>;
}

/// The machine this runs on.
pub struct ThisMachine;

impl Host for ThisMachine {
    fn cgroup2_mount(&self) -> Option<PathBuf> {
        cgroup2_mount_among(&[
            Path::new("/sys/fs/cgroup"),
            Path::new("/sys/fs/cgroup/unified"),
        ])
    }

    fn in_cgroup2(&self, dir: &Path) -> bool {
        const CGROUP2_SUPER_MAGIC: u64 = 0x6367_7270;
        dir.ancestors()
            .find(|d| d.exists())
            .and_then(|d| rustix::fs::statfs(d).ok())
            .is_some_and(|s| s.f_type as u64 == CGROUP2_SUPER_MAGIC)
    }

    fn exe(&self) -> std::io::Result<PathBuf> {
        std::fs::read_link("/proc/self/exe")
    }
}

/// The first of `candidates` that is a cgroup2 mount: `/sys/fs/cgroup` on
/// a pure v2 host, the `unified` mount on a hybrid one.
pub fn cgroup2_mount_among(candidates: &[&Path]) -> Option<PathBuf> {
    candidates
        .iter()
        .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.subtree_control").exists())
        .map(|p| p.to_path_buf())
}

/// The daemon's configuration.
#[derive(Debug)]
pub struct Supervise {
    pub daemon: DaemonConfig,
}

impl SuperviseArgs {
    /// The daemon's configuration these flags ask for (the plugins are
    /// loaded, and an unknown name refused, when the daemon starts).
    pub fn into_config(self, host: &dyn Host) -> Result<Supervise, SuperviseError> {
        let (socket, virtio_ports) = listeners(&self.listen)?;
        let store_mounted = match self.store_mounted_fd {
            Some(fd) => Some(std::sync::Arc::new(
                allox_sandbox::sys::take_inherited_fd(fd)
                    .ok_or(SuperviseError::StoreMountedFd(fd))?,
            )),
            None => None,
        };
        // `--process-tracker ebpf` is `--plugin process-tree`, first.
        let mut enabled = Vec::new();
        if self.process_tracker == "ebpf" {
            if self.no_processes {
                return Err(SuperviseError::TrackerWithoutProcesses);
            }
            enabled.push(allox_supervisor::plugins::defaults::process_tree::NAME.to_string());
        }
        // Every plugin v1 knows of works on runs.
        if let (true, Some(p)) = (self.no_processes, self.plugins.first()) {
            return Err(SuperviseError::PluginWithoutProcesses(p.clone()));
        }
        enabled.extend(self.plugins);
        let share = allox_supervisor::plugins::defaults::share::NAME;
        if self.share_tools && !enabled.iter().any(|p| p == share) {
            if self.no_processes {
                return Err(SuperviseError::PluginWithoutProcesses(share.to_string()));
            }
            enabled.push(share.to_string());
        }
        let monitor = allox_supervisor::plugins::defaults::monitor::NAME;
        if self.monitor_root.is_some() && !enabled.iter().any(|p| p == monitor) {
            if self.no_processes {
                return Err(SuperviseError::PluginWithoutProcesses(monitor.to_string()));
            }
            enabled.push(monitor.to_string());
        }
        let effects = allox_supervisor::plugins::defaults::system_effects::NAME;
        if !enabled.iter().any(|p| p == effects) {
            for (given, flag) in [
                (
                    self.system_effects_scope.is_some(),
                    "--system-effects-scope",
                ),
                (
                    self.system_effects_observer.is_some(),
                    "--system-effects-observer",
                ),
                (
                    self.system_effects_observer_sha256.is_some(),
                    "--system-effects-observer-sha256",
                ),
                (
                    self.system_effects_verifier.is_some(),
                    "--system-effects-verifier",
                ),
                (
                    self.system_effects_verifier_sha256.is_some(),
                    "--system-effects-verifier-sha256",
                ),
                (
                    self.system_effects_recover.is_some(),
                    "--system-effects-recover",
                ),
                (
                    self.system_effects_recover_sha256.is_some(),
                    "--system-effects-recover-sha256",
                ),
                (
                    self.system_effects_without_lsm,
                    "--system-effects-without-lsm",
                ),
            ] {
                if given {
                    return Err(SuperviseError::EffectsWithoutPlugin(flag));
                }
            }
        }
        let default_mode =
            allox_protocol::NetworkMode::parse(&self.session_network).unwrap_or_default();
        if default_mode == allox_protocol::NetworkMode::Proxy
            && !enabled
                .iter()
                .any(|p| p == allox_supervisor::plugins::defaults::network::NAME)
        {
            return Err(SuperviseError::ProxyWithoutPlugin);
        }
        let runs = if self.no_processes {
            None
        } else {
            let mount = match self.cgroup_root {
                // A plain directory (a typo among them: the daemon makes
                // what is missing) took every run's `internal` error.
                Some(p) if !host.in_cgroup2(&p) => return Err(SuperviseError::NotCgroup2(p)),
                Some(p) => p,
                None => host.cgroup2_mount().ok_or(SuperviseError::NoCgroup2)?,
            };
            let exe = host.exe().map_err(SuperviseError::Exe)?;
            let mut rc = RunsConfig::new(mount, exe, self.sandbox_stage);
            rc.isolate_network = self.sandbox_network == "isolated";
            // Under a session quota a reflink would bring bytes into a
            // session without the quota's check (from its unlimited
            // shared/): refused there.
            rc.no_reflinks = self.session_quota.is_some();
            rc.run_usage = !self.no_run_usage;
            rc.prepare_runs = match self.prepared_runs.as_str() {
                "always" => true,
                "never" => false,
                _ => allox_sandbox::cgroup::favors_dynmods(&rc.cgroup_mount),
            };
            tracing::debug!(prepared_runs = rc.prepare_runs, "the next run made ahead");
            rc.freeze_wait = std::time::Duration::from_millis(self.freeze_timeout_ms);
            rc.finished.output_budget = self.finished_output_budget;
            rc.finished.max_runs = self.finished_runs_max;
            rc.uid = self.sandbox_uid;
            rc.gid = self.sandbox_gid;
            rc.total = CgroupLimits {
                pids_max: self.sessions_pids_max,
                memory_max: self.sessions_memory_max,
                cpu_max: None,
            };
            rc.limits = CgroupLimits {
                pids_max: self.default_pids_max,
                memory_max: self.default_memory_max,
                cpu_max: match self.default_cpu_max {
                    Some(t) => Some(Cgroups::parse_cpu_max(&t).ok_or(SuperviseError::CpuMax(t))?),
                    None => None,
                },
            };
            Some(rc)
        };
        Ok(Supervise {
            daemon: DaemonConfig {
                root: self.root,
                store: allox_store::StoreOptions {
                    session_quota: self.session_quota,
                    turns_kept: self.turns_kept,
                    session_checkpoints: self.session_checkpoints,
                },
                socket,
                virtio_ports,
                policy: Policy {
                    kill_processes_on_rollback: self.kill_session_processes_on_rollback,
                    power_off_on_shutdown: self.under_init,
                    uploads: allox_supervisor::files::uploads::UploadLimits {
                        per_session: self.uploads_per_session as usize,
                        idle: Duration::from_secs(self.upload_idle_s),
                    },
                    watches: allox_supervisor::files::watch::WatchLimits {
                        most: self.watches as usize,
                        per_session: self.watches_per_session as usize,
                    },
                    idle_timeout_ms: self.idle_timeout_ms,
                    max_lifetime_ms: self.max_lifetime_ms,
                },
                limits: Limits {
                    stall: Duration::from_millis(self.stall_timeout_ms),
                    write: Duration::from_millis(self.write_timeout_ms),
                    frame: Duration::from_millis(self.frame_timeout_ms),
                    ..Limits::default()
                },
                runs,
                peers: PeerPolicy {
                    uids: self.allow_uid,
                    gids: self.allow_gid,
                },
                plugins: PluginsConfig {
                    enabled,
                    process_events_max: self.process_events_max,
                    monitor: allox_supervisor::plugin_api::MonitorSettings {
                        root: self.monitor_root,
                        records_max: self.monitor_records_max,
                        session_bytes: self.monitor_session_bytes,
                        bytes_per_s: self.monitor_bytes_per_s,
                        span_bytes: self.monitor_span_bytes,
                        session_quota: self.session_quota,
                    },
                    audit: allox_store::audit::AuditBounds {
                        file_bytes: self.audit_file_bytes,
                        lines_per_s: self.audit_lines_per_s,
                    },
                    effects: allox_supervisor::plugin_api::EffectsSettings {
                        scope: self.system_effects_scope,
                        observer: self.system_effects_observer,
                        observer_sha256: self.system_effects_observer_sha256,
                        verifier: self.system_effects_verifier,
                        verifier_sha256: self.system_effects_verifier_sha256,
                        recover: self.system_effects_recover,
                        recover_sha256: self.system_effects_recover_sha256,
                        ring_bytes: u32::try_from(self.system_effects_ring_bytes)
                            .unwrap_or(u32::MAX),
                        without_lsm: self.system_effects_without_lsm,
                    },
                    network: allox_supervisor::plugin_api::NetworkSettings {
                        // No rule: the daemon does not narrow (and with no
                        // allow list at any level, nothing is open).
                        allow: (!self.network_allow.is_empty()).then_some(self.network_allow),
                        deny: self.network_deny,
                        resolver: self.network_resolver,
                        default_mode,
                        connections_per_session: self.proxy_connections_per_session as usize,
                        connections: self.proxy_connections as usize,
                        lookups_per_session: self.proxy_lookups_per_session as usize,
                        secrets_key_file: self.secrets_key_file,
                        ca_file: self.network_ca_file,
                    },
                },
                metrics: allox_supervisor::plugin_api::metrics::MetricsConfig {
                    enabled: !self.no_metrics,
                    agent_label_cap: self.metrics_agent_label,
                },
                store_mounted,
            },
        })
    }
}

/// The one `unix:` socket and the virtio-serial ports of the `--listen`
/// flags.
/// `--system-effects-ring-bytes`: a power of two from one page to 1 GiB,
/// in bytes or with a suffix K, M or G.
fn ring_bytes(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&s[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (bytes, or with K, M or G)"))?;
    let bytes = n.saturating_mul(mult);
    if !(4096..=1 << 30).contains(&bytes) || !bytes.is_power_of_two() {
        return Err(format!(
            "{s} is not a power of two between 4K and 1G (the ring buffer's sizes)"
        ));
    }
    Ok(bytes)
}

fn listeners(listen: &[String]) -> Result<(PathBuf, Vec<String>), SuperviseError> {
    let mut socket = None;
    let mut virtio_ports = Vec::new();
    for l in listen {
        if let Some(p) = l.strip_prefix("unix:").filter(|p| !p.is_empty()) {
            if socket.replace(PathBuf::from(p)).is_some() {
                return Err(SuperviseError::SecondSocket(l.clone()));
            }
        } else if let Some(n) = l.strip_prefix("virtio:").filter(|n| !n.is_empty()) {
            virtio_ports.push(n.to_string());
        } else {
            return Err(SuperviseError::BadListen(l.clone()));
        }
    }
    let socket = socket.ok_or(SuperviseError::NoSocket)?;
    Ok((socket, virtio_ports))
}

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;

/// A count from 1 to [`allox_store::SESSION_CHECKPOINTS`]
/// (`--session-checkpoints`).
fn session_checkpoints(s: &str) -> Result<usize, String> {
    let most = allox_store::SESSION_CHECKPOINTS;
    match s.parse::<usize>() {
        Ok(n) if (1..=most).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?}: a whole number from 1 to {most} (a session's listing of its checkpoints is one answer)"
        )),
    }
}

/// A count of at least 1 (`--turns-kept`).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?}: a whole number, at least 1")),
    }
}
