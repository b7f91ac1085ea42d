//! `allox-init supervise`: the supervisor as a daemon on a Btrfs mount.

use crate::peer::PeerPolicy;
use crate::plugin_api::Settings;
use crate::plugin_host::{PluginHostError, Plugins};
use crate::plugins;
use crate::runs::{RunError, Runs, RunsConfig};
use crate::sandbox_api::{SandboxApi, SandboxRoutes};
use crate::server::{serve_unix, Limits, Ready};
use crate::supervisor::{Policy, Supervisor};
use allox_store::failpoint::Failpoints;
use allox_store::{Store, StoreError, StoreOptions};
use std::path::PathBuf;
use std::sync::Arc;
use thiserror::Error;

#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub root: PathBuf,
    /// How the store is opened (a session quota).
    pub store: StoreOptions,
    pub socket: PathBuf,
    /// virtio-serial ports (by name) to serve as well.
    pub virtio_ports: Vec<String>,
    pub policy: Policy,
    pub limits: Limits,
    /// Process support; `None` runs the store alone.
    pub runs: Option<RunsConfig>,
    /// Who besides root and the daemon's user may use the socket.
    pub peers: PeerPolicy,
    /// Which plugins to load, and their settings.
    pub plugins: PluginsConfig,
    /// `--no-metrics`, `--metrics-agent-label`.
    pub metrics: crate::plugin_api::metrics::MetricsConfig,
    /// Read to its end before the store is opened: the guest's PID 1
    /// mounts the store while the supervisor starts, and closes its end
    /// once the store is mounted. The virtio ports answer Hello meanwhile.
    pub store_mounted: Option<Arc<std::os::fd::OwnedFd>>,
}

/// The plugins a daemon loads (`--plugin NAME`, in order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginsConfig {
    pub enabled: Vec<String>,
    /// `--process-events-max`.
    pub process_events_max: u64,
    /// `--monitor-root`, `--monitor-records-max`.
    pub monitor: crate::plugin_api::MonitorSettings,
    /// `--network-allow`, `--network-deny`, `--network-resolver`.
    pub network: crate::plugin_api::NetworkSettings,
    /// `--audit-file-bytes`, `--audit-lines-per-s`: the audit log's and
    /// the plugins' audit files'.
    pub audit: allox_store::audit::AuditBounds,
    /// `--system-effects-*`.
    pub effects: crate::plugin_api::EffectsSettings,
}

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("cannot open the store")]
    Store(#[source] StoreError),
    #[error("cannot listen on {path}")]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another process is serving {0}")]
    SocketInUse(PathBuf),
    #[error("{0} is there and is not a socket: it is not replaced (remove it, or listen on another path)")]
    NotASocket(PathBuf),
    #[error("cannot set up process support")]
    Processes(#[source] RunError),
    #[error("runs of this store are still in {} (an earlier supervisor's --cgroup-root was {}, this one's is {}): start it with --cgroup-root {}, or end them first (write 1 to {}/cgroup.kill)", .left.display(), .old.display(), .new.display(), .old.display(), .left.display())]
    CgroupRootMoved {
        old: PathBuf,
        new: PathBuf,
        left: PathBuf,
    },
    #[error("cannot keep this daemon's cgroup root {} in {} (a successor would not find its runs, so it does not start): free space on the store, or start it with the cgroup root kept there", .root.display(), .kept.display())]
    CgroupRootNotKept {
        root: PathBuf,
        kept: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set up the in-sandbox interface")]
    SandboxApi(#[source] crate::sandbox_api::SandboxApiError),
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("the store was not mounted (its mount's descriptor failed)")]
    NotMounted(#[source] rustix::io::Errno),
    #[error(transparent)]
    Plugins(#[from] PluginHostError),
}

/// The file of `state/` that keeps the cgroup root the store's runs were
/// last made under.
const CGROUP_ROOT_FILE: &str = "cgroup-root";

/// Refuses to start under cgroup root `new` while the one the store's runs
/// were last made under (kept in `kept`) still holds processes that no
/// daemon holds: those runs would go on unseen, and no `ps`, kill or
/// delete would reach them.
fn check_cgroup_root(kept: &std::path::Path, new: &std::path::Path) -> Result<(), DaemonError> {
    let Ok(old) = std::fs::read_to_string(kept) else {
        return Ok(());
    };
    let old = PathBuf::from(old.trim_end_matches('\n'));
    let same = |a: &std::path::Path, b: &std::path::Path| {
        a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
    };
    if same(&old, new) {
        return Ok(());
    }
    match allox_sandbox::cgroup::left_runs(&old) {
        Some(left) => Err(DaemonError::CgroupRootMoved {
            old,
            new: new.to_path_buf(),
            left,
        }),
        None => Ok(()),
    }
}

/// Keeps the cgroup root this daemon's runs are made under, for
/// [`check_cgroup_root`] at the next start (written aside and renamed: a
/// crash leaves the old one or the new). One that cannot be kept (a full
/// disk) refuses the start: after a crash its runs would go on unseen by a
/// successor started with the root kept before.
fn keep_cgroup_root(kept: &std::path::Path, root: &std::path::Path) -> Result<(), DaemonError> {
    use std::os::unix::ffi::OsStrExt;
    // Already kept (each start after the first): nothing is written.
    if std::fs::read(kept).is_ok_and(|k| k == root.as_os_str().as_bytes()) {
        return Ok(());
    }
    crate::plugin_api::state_file::write(kept, root.as_os_str().as_bytes(), 0o600).map_err(
        |source| DaemonError::CgroupRootNotKept {
            root: root.to_path_buf(),
            kept: kept.to_path_buf(),
            source,
        },
    )
}

/// Blocks until `fd` (a pipe's read end) reads end-of-file.
fn wait_for_end(fd: &std::os::fd::OwnedFd) -> Result<(), rustix::io::Errno> {
    let mut buf = [0u8; 64];
    loop {
        match rustix::io::read(fd, &mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Why the daemon stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// SIGTERM or SIGINT.
    Signal,
    /// A `system.shutdown` request.
    Requested,
}

/// Runs until SIGTERM, SIGINT or `system.shutdown`; then refuses new work,
/// kills every session's processes (after `system.shutdown`, or always as
/// the guest's supervisor; a host daemon stopped by a signal leaves them to
/// its successor), flushes the store and returns.
pub fn run(cfg: DaemonConfig) -> Result<Stopped, DaemonError> {
    let t0 = std::time::Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(crate::supervisor::BLOCKING_THREADS)
        .enable_all()
        .thread_name("allox-io")
        .build()
        .map_err(DaemonError::Runtime)?;
    // The control ports first: a host's Hello is answered while the store
    // is mounted and opened, and its requests wait for the daemon to be
    // ready (`server::Ready`).
    let (ready_tx, ready) = Ready::later();
    let mut servers: Vec<_> = cfg
        .virtio_ports
        .iter()
        .map(|name| {
            rt.spawn(crate::serial::serve_virtio(
                name.clone(),
                ready.clone(),
                cfg.limits.clone(),
            ))
        })
        .collect();
    if let Some(fd) = &cfg.store_mounted {
        wait_for_end(fd).map_err(DaemonError::NotMounted)?;
        let boot_ms = allox_store::clock::since_boot().as_millis() as u64;
        tracing::debug!(
            ms = t0.elapsed().as_millis() as u64,
            boot_ms,
            "store mounted"
        );
    }
    let failpoints = Failpoints::from_env();
    failpoints.hit("daemon.before_store_open");
    let store = Store::open_or_read_only(&cfg.root, failpoints.clone(), cfg.store.clone())
        .map_err(DaemonError::Store)?;
    let store = Arc::new(store);
    store.audit().bound(cfg.plugins.audit);
    let metrics = Arc::new(crate::plugin_api::metrics::Metrics::new(cfg.metrics));
    metrics.journal_replayed(store.journal_replays());
    tracing::debug!(ms = t0.elapsed().as_millis() as u64, "store open");
    warn_unless_nosuid_nodev(&cfg.root);
    // Loaded and started before the runs, which tell them of the runs an
    // earlier supervisor left; stopped in the reverse order when `_running`
    // goes, on every path out of here.
    let system_dirs = cfg
        .runs
        .as_ref()
        .map(|r| r.system_dirs.clone())
        .unwrap_or_default();
    let plugins = Arc::new(Plugins::load(
        plugins::installed(),
        &cfg.plugins.enabled,
        allox_protocol::Request::ROUTES,
        &system_dirs,
        failpoints.clone(),
    )?);
    let _running = plugins.start_guarded(&Settings {
        state_dir: cfg.root.join("state"),
        process_events_max: cfg.plugins.process_events_max,
        monitor: cfg.plugins.monitor.clone(),
        network: cfg.plugins.network.clone(),
        audit: cfg.plugins.audit,
        effects: cfg.plugins.effects.clone(),
        metrics: metrics.clone(),
        store: Some(store.clone()),
    })?;
    // What the plugins made in `state/` at their start is the store's.
    allox_store::private::keep_state_private(store.layout());
    // Many runs mean many descriptors; and the supervisor must be the last
    // thing the OOM killer picks.
    let nofile = raise_nofile();
    // A quarter of the descriptors for clients; the rest for runs (five
    // each) and the store. Beyond that, idle clients make room for new ones.
    let mut limits = cfg.limits.clone();
    limits.connections = limits.connections.min((nofile / 4).max(16) as usize);
    let _ = std::fs::write("/proc/self/oom_score_adj", "-1000");
    // Declared before what uses the cgroups, so dropped after them.
    let mut made_cgroups = MadeCgroups::default();
    let runs = match &cfg.runs {
        Some(rc) => {
            // A subreaper, so that a descendant orphaned outside the
            // sandboxes would come here rather than to init. Today there is
            // none: every child is a sandbox init, reaped through its pidfd
            // (`runs`), and the orphans of a run's programs go to that init,
            // PID 1 of the run's PID namespace, which reaps them. Nothing
            // here waits for unknown children (docs/sandbox.md).
            let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
            let mut rc = rc.clone();
            rc.plugins = plugins.clone();
            rc.failpoints = failpoints;
            rc.metrics = metrics.clone();
            let kept = cfg.root.join("state").join(CGROUP_ROOT_FILE);
            check_cgroup_root(&kept, &rc.cgroup_mount)?;
            // What this start makes of the cgroup tree goes again if the
            // start is refused (it was left, empty, at each attempt).
            made_cgroups.dirs = [rc.cgroup_mount.join("allox"), rc.cgroup_mount.clone()]
                .into_iter()
                .filter(|d| !d.exists())
                .collect();
            let runs = Runs::new(rc).map_err(DaemonError::Processes)?;
            keep_cgroup_root(&kept, &runs.config().cgroup_mount)?;
            runs.restore_limits(&store);
            Some(Arc::new(runs))
        }
        None => None,
    };
    tracing::debug!(
        ms = t0.elapsed().as_millis() as u64,
        "process support ready"
    );
    // `plugin.call` from inside sandboxes goes to the loaded plugins.
    let sandbox_routes: Arc<dyn SandboxRoutes> = plugins.clone();
    let sup = Arc::new(Supervisor {
        network_default: cfg.plugins.network.default_mode,
        metrics,
        ..Supervisor::new(store, cfg.policy.clone(), runs, plugins)
    });
    // What uploads an earlier daemon did not finish left beside their
    // targets.
    sup.files().sweep_uploads();
    // The in-sandbox interface: a listener per run, in a directory of its own
    // beside the control socket.
    let guest = match &sup.runs {
        Some(runs) => {
            let svc = Arc::new(
                SandboxApi::new(
                    crate::sandbox_api::dir_for(&cfg.socket),
                    runs.config().init_exe.clone(),
                    runs.cgroups().clone(),
                    Arc::downgrade(&sup),
                    sandbox_routes,
                )
                .map_err(DaemonError::SandboxApi)?,
            );
            runs.set_services(svc.clone());
            Some(svc)
        }
        None => None,
    };
    // The socket this daemon put at its path, removed at its end only if
    // the path still names it: a start refused because another daemon
    // serves the path removed that daemon's socket, and a daemon whose
    // path was taken over removed its successor's.
    let mut bound: Option<(u64, u64)> = None;
    let result = rt.block_on(async {
        // SIGTERM and SIGINT are caught from here on, before anything says
        // the daemon is ready: one sent once it is is never lost.
        let mut stop_signals = allox_signals::StopSignals::install("the daemon");
        // Runs an earlier supervisor left get their in-sandbox interface again.
        if let Some(runs) = &sup.runs {
            runs.reattach();
        }
        // A write past RLIMIT_FSIZE fails with EFBIG (and is refused as
        // such) instead of killing the supervisor.
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut xfsz) = signal(SignalKind::from_raw(libc::SIGXFSZ)) {
            tokio::spawn(async move { while xfsz.recv().await.is_some() {} });
        }
        let listener = bind(&cfg.socket, cfg.peers.socket_mode())?;
        bound = file_id(&cfg.socket);
        // Serving: the cgroups are this daemon's runs', kept for its
        // successor.
        made_cgroups.dirs.clear();
        servers.push(tokio::spawn(serve_unix(
            listener,
            sup.clone(),
            limits.clone(),
            cfg.peers.clone(),
        )));
        ready_tx.send_replace(Some(sup.clone()));
        let boot_ms = allox_store::clock::since_boot().as_millis() as u64;
        tracing::info!(root = %cfg.root.display(), socket = %cfg.socket.display(), boot_ms, "supervisor ready");
        let syncer = tokio::spawn(sync_audit_every_second(sup.clone()));
        let abandoner = tokio::spawn(abandon_idle_uploads(sup.clone()));
        let clocks = tokio::spawn(tick_clocks(sup.clone()));
        let why = tokio::select! {
            _ = stop_signals.wait() => Stopped::Signal,
            _ = sup.stop.requested() => Stopped::Requested,
        };
        // From here every request that would change state is refused.
        sup.stop.request();
        // A shutdown kills the sessions' processes; a host daemon stopped
        // by a signal leaves them running for its successor to adopt, but
        // for the runs that asked to die with their client.
        let kill = why == Stopped::Requested || cfg.policy.power_off_on_shutdown;
        if kill {
            tracing::info!(?why, "stopping: refusing new work, killing the sessions' processes, flushing the store");
        } else {
            tracing::info!(?why, "stopping: refusing new work, flushing the store; runs are left for the next supervisor to take up, but those that asked to die with their client");
        }
        // Changes already admitted end and are answered before the
        // connections close (a copy whose client was told "the daemon
        // closed the connection" was made all the same); at most 10 s.
        if !sup.stop.settled(std::time::Duration::from_secs(10)).await {
            tracing::warn!("changes still going on after 10 s: their clients are not answered");
        }
        // Their answers, queued, reach their clients.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        for s in &servers {
            s.abort();
        }
        syncer.abort();
        abandoner.abort();
        clocks.abort();
        if let Some(runs) = sup.runs.as_ref().filter(|_| !kill) {
            // Their connections are closed: they are ended as asked (the
            // successor would, but there may be none for a while).
            let ended = runs
                .end_live_runs(std::time::Duration::from_secs(30), true)
                .await;
            tracing::info!(runs = ended, "runs that asked to die with their client ended");
        }
        if let Some(runs) = sup.runs.as_ref().filter(|_| kill) {
            let (runs, base) = (runs.clone(), runs.cgroups().base().to_path_buf());
            // The runs first, each settled (an observed one's B captured
            // while its session's context lives): a shutdown is not a
            // fault of their observation. Then the rest.
            let ended = runs
                .end_live_runs(std::time::Duration::from_secs(30), false)
                .await;
            tracing::info!(runs = ended, "runs ended");
            match tokio::task::spawn_blocking(move || runs.kill_tree(&base, false)).await {
                Ok(Ok(n)) => tracing::info!(killed = n, "sessions' processes killed"),
                Ok(Err(e)) => tracing::error!(error = %e.chain(), "cannot kill the sessions' processes"),
                Err(e) => tracing::error!(error = %e, "cannot kill the sessions' processes"),
            }
        }
        // Let answers already queued (the shutdown's own) reach their clients.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        Ok(why)
    });
    if bound.is_some() && file_id(&cfg.socket) == bound {
        let _ = std::fs::remove_file(&cfg.socket);
    }
    // Runs left running for a successor keep their sandboxes, but nobody
    // serves their guest sockets until the successor does.
    if let Some(g) = &guest {
        g.remove(matches!(&result, Ok(why) if !(*why == Stopped::Requested || cfg.policy.power_off_on_shutdown)));
    }
    if let Err(e) = sup.store.sync() {
        tracing::error!(error = %e.chain(), "flushing the store at shutdown failed");
    }
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    result
}

/// Audit records are written at once; this makes them durable, and tops
/// up the room the state files keep for a full filesystem.
async fn sync_audit_every_second(sup: Arc<Supervisor>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        let s = sup.clone();
        let r = tokio::task::spawn_blocking(move || {
            s.store.keep_room();
            s.store.audit().sync()
        })
        .await;
        if let Ok(Err(e)) = r {
            tracing::warn!(error = %e, "cannot sync the audit log");
        }
    }
}

/// Uploads left without a chunk for `--upload-idle-s` are abandoned (their
/// partial files and records removed), checked a few times a period.
/// Sessions' idle and lifetime clocks, checked every `clocks::TICK`.
async fn tick_clocks(sup: Arc<Supervisor>) {
    let mut tick = tokio::time::interval(crate::clocks::TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let s = sup.clone();
        let _ = tokio::task::spawn_blocking(move || {
            s.clocks.tick(&s.store, s.runs.as_ref());
            // Imports whose client stopped sending.
            s.imports.drop_idle();
        })
        .await;
    }
}

async fn abandon_idle_uploads(sup: Arc<Supervisor>) {
    let every = (sup.uploads.limits().idle / 4).clamp(
        std::time::Duration::from_millis(250),
        std::time::Duration::from_secs(60),
    );
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if sup.uploads.is_empty() {
            continue;
        }
        let s = sup.clone();
        let _ = tokio::task::spawn_blocking(move || s.files().abandon_idle_uploads()).await;
    }
}

/// The store's mount should have `nosuid` and `nodev` (the VM mounts it
/// so): a file in a session made setuid or a device node there would
/// otherwise mean something on the host. Says so when it lacks either.
fn warn_unless_nosuid_nodev(root: &std::path::Path) {
    use rustix::fs::StatVfsMountFlags as F;
    match rustix::fs::statvfs(root) {
        Ok(st) => {
            let lacks: Vec<&str> = [(F::NOSUID, "nosuid"), (F::NODEV, "nodev")]
                .into_iter()
                .filter(|(f, _)| !st.f_flag.contains(*f))
                .map(|(_, n)| n)
                .collect();
            if !lacks.is_empty() {
                tracing::warn!(
                    root = %root.display(),
                    lacks = %lacks.join(","),
                    "the store's mount lacks nosuid or nodev: a setuid file or a device node in a session would work on the host; mount it with nosuid,nodev (docs/files.md)"
                );
            }
        }
        Err(e) => {
            tracing::warn!(root = %root.display(), error = %e, "cannot check the store's mount options")
        }
    }
}

/// Raises the descriptor limit (to 65,536 where the hard limit is lower
/// and this process may raise it, else to the hard limit) and returns it.
fn raise_nofile() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    const WANT: u64 = 65_536;
    let l = getrlimit(Resource::Nofile);
    let hard = l.maximum.unwrap_or(u64::MAX);
    for n in [hard.max(WANT), hard] {
        let n = n.min(1 << 20);
        let set = Rlimit {
            current: Some(n),
            maximum: Some(n.max(hard.min(1 << 20))),
        };
        if setrlimit(Resource::Nofile, set).is_ok() {
            return n;
        }
    }
    l.current.unwrap_or(1024)
}

/// Binds the control socket at `path` with `mode`, which it has from the
/// moment it exists under that name.
///
/// The socket is bound inside a fresh directory that only this user can
/// enter (0700), given its mode there, then renamed into place, which also
/// replaces a stale socket in the same step. Setting a restrictive umask
/// around `bind` would close the window too, but the umask is the whole
/// process's, and other threads (the runtime's, the tracker's) may create
/// files and directories at that moment.
fn bind(path: &std::path::Path, mode: u32) -> Result<tokio::net::UnixListener, DaemonError> {
    use std::os::unix::fs::PermissionsExt;
    let listen_err = |source| DaemonError::Listen {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(listen_err)?;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        // Only a stale socket is replaced (a file there was lost).
        if !m.file_type().is_socket() {
            return Err(DaemonError::NotASocket(path.to_path_buf()));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(DaemonError::SocketInUse(path.to_path_buf()));
        }
    }
    // Removed on every path, with the socket if it is still in it.
    let staging = tempfile::Builder::new()
        .prefix(".ctl")
        .rand_bytes(6)
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(dir)
        .map_err(listen_err)?;
    let staged = staging.path().join("s");
    let l = tokio::net::UnixListener::bind(&staged).map_err(listen_err)?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(mode)).map_err(listen_err)?;
    std::fs::rename(&staged, path).map_err(listen_err)?;
    Ok(l)
}

/// The cgroup directories a start made, removed (empty ones, deepest
/// first) if it ends before it serves: a refused start left them at each
/// attempt.
#[derive(Default)]
struct MadeCgroups {
    dirs: Vec<PathBuf>,
}

impl Drop for MadeCgroups {
    fn drop(&mut self) {
        fn remove(dir: &std::path::Path) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    remove(&e.path());
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
        for d in &self.dirs {
            remove(d);
        }
    }
}

/// Which file a path names (device and inode), if any.
fn file_id(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}
