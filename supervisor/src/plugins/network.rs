//! The `network` plugin: the proxy of each `proxy` session at
//! `http://127.0.0.1:3128`, inside the session's own network namespace,
//! served by the broker outside every sandbox (`allox_network::broker`);
//! `network.policy.set|get` and `network.audit`.
//!
//! When a `proxy` session's context is made, before its first run, a
//! thread of the supervisor enters the context's network namespace, binds
//! `127.0.0.1:3128` there and leaves: the listening socket stays in that
//! namespace, held by the supervisor, so nothing inside can take the port
//! first and nothing inside holds it. Each connection is judged by the
//! session's policy as it is at that moment (the daemon's, the agent's and
//! the session's rules) and recorded, one JSON line per attempt, in
//! `state/network-audit.log`. Runs of `proxy` sessions get `HTTP_PROXY`,
//! `HTTPS_PROXY`, `NO_PROXY` and their lower-case forms; `NO_PROXY` is the
//! session's own loopback ([`no_proxy`]), less what its policy names.

mod audit;
mod counted;
mod proxy;
mod vault;

pub use super::defaults::network::{
    DEFAULT_CONNECTIONS, DEFAULT_CONNECTIONS_PER_SESSION, DEFAULT_LOOKUPS_PER_SESSION, NAME,
};
use super::slot::Slot;
use crate::plugin_api::{
    ContextGuard, Contribution, Manifest, Plugin, RouteContext, RouteFuture, RunRef,
    SessionNetwork, SessionRef, Settings, API_VERSION,
};
use crate::plugin_api::{NetworkSettings, PluginError};
use allox_network::broker::{
    Broker, DnsResolver, LookupBudget, Resolve, SessionSecrets, SystemResolver, Timeouts,
};
use allox_network::diag::SockDiag;
use allox_network::own::OwnAddresses;
use allox_network::{Layer, Policy, RuleError};
use allox_protocol::{EgressLevel, NetworkMode, NetworkPolicyInfo, Request, Response};
use audit::AuditLog;
use rustix::fd::BorrowedFd;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

/// Where the proxy listens inside every `proxy` session.
pub const PROXY: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 3128);

/// The audit file, in the store's `state/`.
pub const AUDIT_FILE: &str = "network-audit.log";

/// Where the entry point appears inside the sandbox.
pub const SHIM: &str = "/run/allox/network.py";

/// A `proxy` session with a context: the policy its next connection is
/// judged by.
struct Live {
    policy: RwLock<Arc<Policy>>,
    /// Its secrets (the agent's and its own) and its authority.
    secrets: RwLock<Arc<SessionSecrets>>,
}

/// The runs by cgroup id (told by [`Plugin::before_run`]), for naming the
/// run of a connection in the audit.
#[derive(Default)]
struct RunsByCgroup {
    by_id: HashMap<u64, String>,
    ids: HashMap<String, u64>,
}

struct Started {
    /// Every session's resolver, each session asking it within its own
    /// lookup budget.
    resolver: Arc<dyn Resolve>,
    own: Arc<OwnAddresses>,
    /// `--proxy-connections`.
    connections: proxy::Budget,
    settings: NetworkSettings,
    audit: AuditLog,
    /// Connections a second each session's proxy takes, as many as its
    /// audit may record (`--audit-lines-per-s`): past it one is refused,
    /// so that no session floods the audit past its bound and pushes its
    /// own earlier records (or others') out of the two files kept.
    lines: allox_store::rate::Buckets,
    /// `network.py`, the seed's entry point (`python3 /run/allox/network.py
    /// connect HOST PORT` runs `allox net connect HOST PORT`).
    shim: PathBuf,
    /// `agent/session` → its live policy.
    live: Mutex<HashMap<String, Arc<Live>>>,
    runs: Mutex<RunsByCgroup>,
    metrics: counted::NetMetrics,
    /// Secrets and the sessions' certificate authorities.
    vault: vault::Vault,
    /// What intercepted connections' servers are verified against.
    upstream_tls: Result<Arc<allox_network::rustls::ClientConfig>, String>,
}

impl Started {
    /// The policy of a session: the daemon's rules, its agent's, its own.
    fn policy(&self, net: &SessionNetwork) -> Result<Policy, RuleError> {
        let none: Vec<String> = Vec::new();
        let d = &self.settings;
        let mut layers = vec![Layer::new("daemon", d.allow.as_deref(), &d.deny)?];
        for (level, e) in [("agent", &net.agent), ("session", &net.session)] {
            if let Some(e) = e {
                layers.push(Layer::new(level, e.allow.as_deref(), &e.deny)?);
            } else {
                layers.push(Layer::new(level, None, &none)?);
            }
        }
        Ok(Policy::new(layers))
    }
}

pub struct Network {
    manifest: Manifest,
    started: Slot<Started>,
}

impl Network {
    pub fn new() -> Network {
        Network {
            manifest: Manifest {
                name: NAME,
                api_version: API_VERSION,
                conflicts: &[],
                alias: None,
                summary: "the proxy of each proxy-mode session at 127.0.0.1:3128, through a broker that applies the egress policy and records every attempt",
            },
            started: Slot::default(),
        }
    }

    fn started(&self) -> Option<Arc<Started>> {
        self.started.get()
    }

    fn running(&self) -> Result<Arc<Started>, PluginError> {
        self.started().ok_or_else(|| PluginError::Run {
            plugin: NAME,
            source: "the network plugin is stopping".into(),
        })
    }
}

impl Default for Network {
    fn default() -> Self {
        Network::new()
    }
}

fn not_started(why: impl Into<String>) -> PluginError {
    PluginError::Start {
        plugin: NAME,
        alias: None,
        source: why.into().into(),
    }
}

fn refused(why: impl Into<String>) -> PluginError {
    PluginError::Run {
        plugin: NAME,
        source: why.into().into(),
    }
}

fn key(a: &str, s: &str) -> String {
    format!("{a}/{s}")
}

impl Plugin for Network {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn start(&self, settings: &Settings) -> Result<(), PluginError> {
        let n = &settings.network;
        let none: &[String] = &[];
        Layer::new("daemon", n.allow.as_deref(), none)
            .map_err(|e| not_started(format!("--network-allow: {e}")))?;
        Layer::new("daemon", None, &n.deny)
            .map_err(|e| not_started(format!("--network-deny: {e}")))?;
        let resolver: Arc<dyn Resolve> = match n.resolver {
            Some(addr) => Arc::new(DnsResolver::new(addr)),
            None => Arc::new(SystemResolver::new()),
        };
        // The entry point, then the audit file; a failure leaves neither
        // behind (an audit file that was there stays as it was).
        let shim = settings.state_dir.join("network.py");
        crate::plugin_api::write_shim(&shim, "net")
            .map_err(|e| not_started(format!("write {}: {e}", shim.display())))?;
        let path: PathBuf = settings.state_dir.join(AUDIT_FILE);
        // Room kept for it, as for the daemon's own audit log, so that
        // connections go on being recorded (and made) on a full disk.
        allox_store::reserve::prepare(&path, allox_store::reserve::room_for(&settings.state_dir));
        // Bounded like the other audit files (`--audit-file-bytes`, one
        // rotated file kept and read).
        let max = (settings.audit.file_bytes > 0).then_some(settings.audit.file_bytes);
        let audit = AuditLog::open_rotating(&path, max).map_err(|e| {
            let _ = std::fs::remove_file(&shim);
            not_started(format!("open {}: {e}", path.display()))
        })?;
        let vault = vault::Vault::open(
            &settings.state_dir,
            &n.secrets_key_file,
            n.ca_file.as_deref(),
            settings.store.as_deref(),
        )
        .map_err(|e| {
            let _ = std::fs::remove_file(&shim);
            not_started(format!("secrets: {e}"))
        })?;
        let upstream_tls = match allox_network::intercept::upstream_config(n.ca_file.as_deref()) {
            Ok(c) => Ok(c),
            Err(e) if n.ca_file.is_some() => {
                let _ = std::fs::remove_file(&shim);
                return Err(not_started(format!("--network-ca-file: {e}")));
            }
            Err(e) => Err(e.to_string()),
        };
        self.started.fill(Started {
            resolver,
            own: Arc::new(OwnAddresses::new()),
            connections: proxy::Budget::all(n.connections),
            settings: n.clone(),
            audit,
            lines: allox_store::rate::Buckets::new(
                settings.audit.lines_per_s,
                settings.audit.lines_per_s.saturating_mul(10),
            ),
            shim,
            live: Mutex::new(HashMap::new()),
            runs: Mutex::new(RunsByCgroup::default()),
            metrics: counted::NetMetrics::registered(&settings.metrics),
            vault,
            upstream_tls,
        });
        Ok(())
    }

    fn stop(&self) {
        self.started.empty();
    }

    fn contribute(&self, run: &RunRef<'_>) -> Contribution {
        if run.network.mode != NetworkMode::Proxy {
            return Contribution::default();
        }
        let url = format!("http://{PROXY}");
        // The session's policy as it is now (a run keeps the environment
        // it started with); rules that do not read name nothing.
        let policy = self.started().and_then(|st| st.policy(run.network).ok());
        let none = no_proxy(policy.as_ref());
        let mut env = Vec::new();
        for (k, v) in [
            ("HTTP_PROXY", &url),
            ("HTTPS_PROXY", &url),
            ("NO_PROXY", &none),
        ] {
            env.push((k.to_string(), v.clone()));
            env.push((k.to_ascii_lowercase(), v.clone()));
        }
        // The target is what the core checks when it loads the plugins;
        // the source is known once it has started (and only started
        // plugins contribute to runs).
        let mut binds = vec![allox_sandbox::spec::Bind {
            src: self.started().map(|st| st.shim.clone()).unwrap_or_default(),
            dst: SHIM.into(),
            writable: false,
        }];
        // Secrets: placeholders only; the roots with the session's
        // authority when one intercepts.
        if let Some(st) = self.started() {
            let (more, bundle) = st.vault.contribution(run.agent, run.session);
            env.extend(more);
            if let Some(src) = bundle {
                // Where the variables point, and over Debian's own bundle
                // where the system has one (clients that read no variable).
                let debian = allox_sandbox::binds::SYSTEM_FILES[0];
                let has_debian = std::fs::symlink_metadata(debian).is_ok_and(|m| m.is_file());
                for dst in std::iter::once(vault::BUNDLE).chain(has_debian.then_some(debian)) {
                    binds.push(allox_sandbox::spec::Bind {
                        src: src.clone(),
                        dst: dst.into(),
                        writable: false,
                    });
                }
            }
        }
        Contribution {
            env,
            binds,
            ..Contribution::default()
        }
    }

    fn before_run(&self, run: &RunRef<'_>, cgroup_id: u64) -> Result<(), PluginError> {
        self.adopt_run(run, cgroup_id);
        Ok(())
    }

    fn deleted(&self, agent: &str, session: Option<&str>) {
        if let Some(st) = self.started() {
            st.vault.deleted(agent, session);
        }
    }

    fn adopt_run(&self, run: &RunRef<'_>, cgroup_id: u64) {
        if let Some(st) = self.started() {
            let mut r = st.runs.lock().unwrap_or_else(|e| e.into_inner());
            let k = format!("{}/{}/{}", run.agent, run.session, run.run);
            r.by_id.insert(cgroup_id, k.clone());
            r.ids.insert(k, cgroup_id);
        }
    }

    fn after_run(&self, run: &RunRef<'_>) {
        if let Some(st) = self.started() {
            let mut r = st.runs.lock().unwrap_or_else(|e| e.into_inner());
            let k = format!("{}/{}/{}", run.agent, run.session, run.run);
            if let Some(id) = r.ids.remove(&k) {
                r.by_id.remove(&id);
            }
        }
    }

    fn session_context(
        &self,
        session: &SessionRef<'_>,
        context: BorrowedFd<'_>,
    ) -> Result<Option<ContextGuard>, PluginError> {
        if session.network.mode != NetworkMode::Proxy {
            return Ok(None);
        }
        let Some(st) = self.started() else {
            return Err(refused("the network plugin is not running"));
        };
        let policy = st
            .policy(session.network)
            .map_err(|e| refused(format!("the session's egress rules: {e}")))?;
        let (listener, diag) = listen_inside(context)
            .map_err(|e| refused(format!("listen on {PROXY} in the session's network: {e}")))?;
        let diag = diag.map(Arc::new);
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| refused("no async runtime to serve the session's proxy"))?;
        let live = Arc::new(Live {
            policy: RwLock::new(Arc::new(policy)),
            secrets: RwLock::new(Arc::new(
                st.vault.session_secrets(session.agent, session.session),
            )),
        });
        let k = key(session.agent, session.session);
        st.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(k.clone(), live.clone());
        let lookups = st.settings.lookups_per_session;
        // The session's end (its serving dropped) ends every connection
        // its proxy relays.
        let (end, end_rx) = tokio::sync::watch::channel(false);
        let broker = Broker {
            resolver: st.metrics.counting(Arc::new(LookupBudget::new(
                st.resolver.clone(),
                lookups,
                format!(
                    "{lookups} lookups of this session are in flight, its budget (--proxy-lookups-per-session)"
                ),
            ))),
            timeouts: Timeouts::default(),
            own: st.own.clone(),
            upstream_tls: st.upstream_tls.clone(),
            ended: Some(end_rx),
            tally: Some(st.metrics.tally()),
        };
        let served = Arc::new(proxy::SessionProxy::new(
            st.clone(),
            live.clone(),
            (session.agent.to_string(), session.session.to_string()),
            diag,
            broker,
            proxy::Budget::session(st.settings.connections_per_session),
        ));
        let task = rt.spawn(async move {
            let Ok(l) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            proxy::serve(l, served).await
        });
        Ok(Some(Box::new(Serving {
            task,
            end,
            key: k,
            live,
            started: st,
        })))
    }

    fn serve<'a>(&'a self, req: &'a Request, ctx: RouteContext<'a>) -> RouteFuture<'a> {
        Box::pin(async move {
            let st = self.running()?;
            match req {
                Request::NetworkPolicySet(p) => {
                    allox_network::check_egress(p.egress.allow.as_deref(), &p.egress.deny)
                        .map_err(|e| {
                            PluginError::Answered(allox_protocol::ErrorBody::invalid(
                                allox_protocol::error_chain(&e),
                            ))
                        })?;
                    let (a, s) = (p.agent_id.as_str(), p.session_id.as_deref());
                    ctx.store.network_egress_set(a, s, &p.egress)?;
                    st.refresh(ctx.store, a, s);
                    Ok(Response::NetworkPolicy(st.info(ctx.store, a, s)?))
                }
                Request::NetworkPolicyGet(p) => Ok(Response::NetworkPolicy(st.info(
                    ctx.store,
                    &p.agent_id,
                    p.session_id.as_deref(),
                )?)),
                Request::NetworkAudit(q) => audit::serve(&st.audit, q, ctx).await,
                Request::SecretSet(p) => {
                    let (a, s) = (p.agent_id.as_str(), p.session_id.as_deref());
                    let info = st.info(ctx.store, a, s)?;
                    if let (Some(s), false) = (s, info.mode == NetworkMode::Proxy) {
                        return Err(PluginError::Answered(allox_protocol::ErrorBody::invalid(
                            format!(
                                "session {a}/{s} is in network mode {}: secrets reach runs through the session's proxy, so only proxy sessions use them",
                                info.mode
                            ),
                        )));
                    }
                    let set = st.vault.set(p).map_err(PluginError::Answered)?;
                    st.refresh_secrets(a, s);
                    Ok(Response::Secret(set))
                }
                Request::SecretList(p) => {
                    let (a, s) = (p.agent_id.as_str(), p.session_id.as_deref());
                    // The agent (and session) must exist.
                    st.info(ctx.store, a, s)?;
                    Ok(Response::Secrets(allox_protocol::SecretListing {
                        secrets: st.vault.list(a, s),
                    }))
                }
                Request::SecretDelete(p) => {
                    let (a, s) = (p.agent_id.as_str(), p.session_id.as_deref());
                    st.info(ctx.store, a, s)?;
                    let what = match s {
                        Some(s) => format!("{a}/{s}/{}", p.name),
                        None => format!("{a}/{}", p.name),
                    };
                    if !st
                        .vault
                        .delete(a, s, &p.name)
                        .map_err(PluginError::Answered)?
                    {
                        return Err(PluginError::Answered(allox_protocol::ErrorBody::new(
                            allox_protocol::ErrorCode::NotFound,
                            format!("secret {what}: no such secret"),
                        )));
                    }
                    st.refresh_secrets(a, s);
                    Ok(Response::Deleted(allox_protocol::Deleted { deleted: what }))
                }
                _ => Err(PluginError::NoHandler {
                    plugin: NAME,
                    action: req.action(),
                }),
            }
        })
    }
}

impl Started {
    /// `network.policy.get`: the mode and every level's rules.
    fn info(
        &self,
        store: &allox_store::Store,
        a: &str,
        s: Option<&str>,
    ) -> Result<NetworkPolicyInfo, PluginError> {
        let agent = store.network_of(a, None)?;
        let sess = s.map(|s| store.network_of(a, Some(s))).transpose()?;
        let d = &self.settings;
        let mut levels = vec![EgressLevel {
            level: "daemon".into(),
            egress: allox_protocol::Egress {
                allow: d.allow.clone(),
                deny: d.deny.clone(),
            },
        }];
        levels.push(EgressLevel {
            level: "agent".into(),
            egress: agent.egress.clone().unwrap_or_default(),
        });
        if let Some(r) = &sess {
            levels.push(EgressLevel {
                level: "session".into(),
                egress: r.egress.clone().unwrap_or_default(),
            });
        }
        let mode = match &sess {
            Some(r) => r.mode,
            None => agent.mode,
        }
        .unwrap_or(d.default_mode);
        Ok(NetworkPolicyInfo {
            agent_id: a.to_string(),
            session_id: s.map(str::to_string),
            mode,
            levels,
        })
    }

    /// The live sessions a change of agent `a` (or session `a/s`) touches,
    /// by key.
    fn touched(&self, a: &str, s: Option<&str>) -> Vec<(String, Arc<Live>)> {
        let prefix = key(a, "");
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(k, _)| match s {
                Some(s) => **k == key(a, s),
                None => k.starts_with(&prefix),
            })
            .map(|(k, l)| (k.clone(), l.clone()))
            .collect()
    }

    /// After a secret of agent `a` (or session `a/s`) changed: each live
    /// session it touches uses the new set from its next connection.
    fn refresh_secrets(&self, a: &str, s: Option<&str>) {
        let prefix = key(a, "");
        let touched = self.touched(a, s);
        for (k, live) in touched {
            let fresh = Arc::new(self.vault.session_secrets(a, &k[prefix.len()..]));
            *live.secrets.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        }
    }

    /// After a rules change of agent `a` (or session `a/s`): each live
    /// session it touches judges its next connection by the new policy.
    fn refresh(&self, store: &allox_store::Store, a: &str, s: Option<&str>) {
        let prefix = key(a, "");
        let touched = self.touched(a, s);
        for (k, live) in touched {
            let sess = &k[prefix.len()..];
            // A level that cannot be read keeps the policy as it was
            // (reading it as "no rules" would open what it closes).
            let read = store
                .network_of(a, None)
                .and_then(|agent| Ok((agent, store.network_of(a, Some(sess))?)));
            let (agent, session) = match read {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(session = %k, error = %e, "cannot read the session's egress rules; its policy stays as it was");
                    continue;
                }
            };
            let net = SessionNetwork {
                mode: NetworkMode::Proxy,
                agent: agent.egress,
                session: session.egress,
            };
            match self.policy(&net) {
                Ok(p) => *live.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(p),
                // Rules are read before they are stored: not expected.
                Err(e) => {
                    tracing::error!(session = %k, error = %e, "cannot read the session's egress rules; its policy stays as it was")
                }
            }
        }
    }
}

/// A `proxy` session's proxy: its task aborted (its listener closed, its
/// connections ended) and its policy forgotten when the context ends.
struct Serving {
    task: tokio::task::JoinHandle<()>,
    /// Set as it is dropped: the session's relayed connections end.
    end: tokio::sync::watch::Sender<bool>,
    key: String,
    live: Arc<Live>,
    started: Arc<Started>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.task.abort();
        self.end.send_replace(true);
        let mut live = self.started.live.lock().unwrap_or_else(|e| e.into_inner());
        // Only its own entry: a newer context of the session has its own.
        if live
            .get(&self.key)
            .is_some_and(|l| Arc::ptr_eq(l, &self.live))
        {
            live.remove(&self.key);
        }
    }
}

/// The session's own loopback, as `NO_PROXY` names it.
const OWN_LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// `NO_PROXY` for a run of a `proxy` session: what its runs reach without
/// the proxy, the session's own loopback — less each of its names that
/// `policy` names ([`Policy::names`]): an allow rule for `127.0.0.1` (or
/// `localhost`, `::1`) means the loopback outside the session, which only
/// the broker reaches, so clients must go through the proxy for it.
fn no_proxy(policy: Option<&Policy>) -> String {
    OWN_LOOPBACK
        .iter()
        .filter(|h| {
            !policy.is_some_and(|p| allox_network::Host::parse(h).is_ok_and(|h| p.names(&h)))
        })
        .copied()
        .collect::<Vec<_>>()
        .join(",")
}

/// Binds [`PROXY`] inside the network namespace of the process `pidfd`,
/// from a thread of its own that enters it and ends there; and makes the
/// namespace's socket-diagnosis socket there (`None` if the kernel has
/// none: runs are then not named in the audit).
fn listen_inside(
    pidfd: BorrowedFd<'_>,
) -> std::io::Result<(std::net::TcpListener, Option<SockDiag>)> {
    let fd = pidfd.try_clone_to_owned()?;
    std::thread::scope(|s| {
        s.spawn(move || {
            rustix::thread::move_into_thread_name_spaces(
                rustix::fd::AsFd::as_fd(&fd),
                rustix::thread::ThreadNameSpaceType::NETWORK,
            )?;
            let l = std::net::TcpListener::bind(PROXY)?;
            l.set_nonblocking(true)?;
            Ok((l, SockDiag::new().ok()))
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the thread panicked")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &std::path::Path, allow: &[&str]) -> Settings {
        Settings {
            state_dir: dir.to_path_buf(),
            process_events_max: 10,
            monitor: Default::default(),
            network: NetworkSettings {
                allow: Some(allow.iter().map(|s| s.to_string()).collect()),
                ..NetworkSettings::default()
            },
            audit: Default::default(),
            effects: Default::default(),
            metrics: Default::default(),
            store: None,
        }
    }

    #[test]
    fn rules_that_do_not_read_stop_the_start() {
        let n = Network::new();
        let dir = tempfile::tempdir().unwrap();
        let e = n.start(&settings(dir.path(), &["bad host"])).unwrap_err();
        assert!(format!("{:?}", e).contains("--network-allow"), "{e:?}");
        assert!(n.started().is_none());
    }

    fn run(mode: NetworkMode) -> Contribution {
        Network::new().contribute(&RunRef {
            agent: "a",
            session: "s",
            run: "r",
            network: &SessionNetwork {
                mode,
                ..SessionNetwork::default()
            },
        })
    }

    #[test]
    fn runs_of_proxy_sessions_get_the_proxy_in_both_spellings_and_others_nothing() {
        let c = run(NetworkMode::Proxy);
        let get = |k: &str| c.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        for k in ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"] {
            assert_eq!(get(k), Some("http://127.0.0.1:3128"), "{k}");
        }
        assert_eq!(get("no_proxy"), Some("localhost,127.0.0.1,::1"));
        for m in [NetworkMode::Disabled, NetworkMode::Isolated] {
            assert_eq!(run(m), Contribution::default(), "{m}");
        }
    }

    #[test]
    fn a_loopback_the_policy_names_goes_through_the_proxy() {
        let n = Network::new();
        let dir = tempfile::tempdir().unwrap();
        let no_proxy = |allow: &[&str]| {
            let net = SessionNetwork {
                mode: NetworkMode::Proxy,
                agent: None,
                session: Some(allox_protocol::Egress {
                    allow: Some(allow.iter().map(|s| s.to_string()).collect()),
                    deny: vec![],
                }),
            };
            let c = n.contribute(&RunRef {
                agent: "a",
                session: "s",
                run: "r",
                network: &net,
            });
            let get = |k: &str| c.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            assert_eq!(get("NO_PROXY"), get("no_proxy"));
            get("NO_PROXY").unwrap()
        };
        // No allow list at the daemon's level: the session's decides.
        let mut open = settings(dir.path(), &[]);
        open.network.allow = None;
        n.start(&open).unwrap();
        // `*` names no loopback: the session's own stays direct.
        assert_eq!(no_proxy(&["*"]), "localhost,127.0.0.1,::1");
        assert_eq!(no_proxy(&["*", "127.0.0.1:8095"]), "localhost,::1");
        assert_eq!(no_proxy(&["127.0.0.0/8"]), "localhost,::1");
        assert_eq!(no_proxy(&["localhost", "[::1]:80"]), "127.0.0.1");
        n.stop();
        // The daemon's `*` does not name 127.0.0.1, so the broker would
        // refuse it whatever the session allows: it stays direct.
        n.start(&settings(dir.path(), &["*"])).unwrap();
        assert_eq!(no_proxy(&["127.0.0.1:8095"]), "localhost,127.0.0.1,::1");
        n.stop();
        n.start(&settings(dir.path(), &["*", "127.0.0.1"])).unwrap();
        assert_eq!(no_proxy(&["127.0.0.1:8095"]), "localhost,::1");
        n.stop();
    }

    #[test]
    fn a_session_policy_narrows_the_agent_and_the_daemon() {
        let n = Network::new();
        let dir = tempfile::tempdir().unwrap();
        n.start(&settings(dir.path(), &["*.test"])).unwrap();
        let st = n.started().unwrap();
        let net = SessionNetwork {
            mode: NetworkMode::Proxy,
            agent: Some(allox_protocol::Egress {
                allow: None,
                deny: vec!["secret.test".into()],
            }),
            session: Some(allox_protocol::Egress {
                allow: Some(vec!["*".into()]),
                deny: vec![],
            }),
        };
        let p = st.policy(&net).unwrap();
        let host = |h: &str| allox_network::Host::parse(h).unwrap();
        assert!(p.check_target(&host("pypi.test"), 443).allowed());
        // The session's `*` opens neither what the daemon does not allow
        // nor what the agent denies.
        assert!(!p.check_target(&host("example.com"), 443).allowed());
        assert!(!p.check_target(&host("secret.test"), 443).allowed());
        n.stop();
    }
}
