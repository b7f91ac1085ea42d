//! The `network` plugin: each session's proxy at `http://127.0.0.1:3128`,
//! inside the session's own network namespace, served by the broker
//! outside every sandbox (`allox_network::broker`).
//!
//! It needs `--sandbox-network isolated` (a namespace per session, with
//! only loopback: no other way out). When a session's context is made,
//! before its first run, a thread of the supervisor enters the context's
//! network namespace, binds `127.0.0.1:3128` there and leaves: the
//! listening socket stays in that namespace, held by the supervisor, so
//! nothing inside can take the port first and nothing inside holds it.
//! Each connection is judged by the daemon's egress layer
//! (`--network-allow`, `--network-deny`) and recorded, one JSON line per
//! attempt, in `state/network-audit.log`. Runs get `HTTP_PROXY`,
//! `HTTPS_PROXY`, `NO_PROXY` and their lower-case forms.

use super::api::{
    ContextGuard, Contribution, Manifest, Plugin, RunRef, SessionRef, Settings, API_VERSION,
};
use super::PluginError;
use allox_network::broker::{Broker, DnsResolver, Resolve, SystemResolver, Timeouts};
use allox_network::{Egress, Layer, Policy};
use rustix::fd::BorrowedFd;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub const NAME: &str = "network";

/// Where the proxy listens inside every session.
pub const PROXY: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 3128);

/// The audit file, in the store's `state/`.
pub const AUDIT_FILE: &str = "network-audit.log";

struct Started {
    broker: Broker,
    policy: Arc<Policy>,
    audit: Arc<Mutex<std::fs::File>>,
    /// `network.py`, the seed's entry point (`python3 /run/allox/network.py
    /// connect HOST PORT` runs `allox net connect HOST PORT`).
    shim: PathBuf,
}

/// Where the entry point appears inside the sandbox.
pub const SHIM: &str = "/run/allox/network.py";

pub struct Network {
    manifest: Manifest,
    started: Mutex<Option<Arc<Started>>>,
}

impl Network {
    pub fn new() -> Network {
        Network {
            manifest: Manifest {
                name: NAME,
                api_version: API_VERSION,
                conflicts: &[],
                routes: &[],
                alias: None,
                summary: "each session's HTTP proxy at 127.0.0.1:3128, through a broker that applies the egress policy",
            },
            started: Mutex::new(None),
        }
    }

    fn started(&self) -> Option<Arc<Started>> {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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

impl Plugin for Network {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn start(&self, settings: &Settings) -> Result<(), PluginError> {
        if !settings.isolated_network {
            return Err(not_started(
                "it needs a network namespace per session: start the daemon with --sandbox-network isolated",
            ));
        }
        let n = &settings.network;
        let layer = Layer::new(
            "daemon",
            &Egress {
                allow: n.allow.clone(),
                deny: n.deny.clone(),
            },
        )
        .map_err(|e| not_started(format!("--network-allow/--network-deny: {e}")))?;
        let resolver: Arc<dyn Resolve> = match n.resolver {
            Some(addr) => Arc::new(DnsResolver::new(addr)),
            None => Arc::new(SystemResolver),
        };
        // The entry point, then the audit file; a failure leaves neither
        // behind (an audit file that was there stays as it was).
        let shim = settings.state_dir.join("network.py");
        crate::guest::write_shim(&shim, "net")
            .map_err(|e| not_started(format!("write {}: {e}", shim.display())))?;
        let path: PathBuf = settings.state_dir.join(AUDIT_FILE);
        let audit = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| {
                let _ = std::fs::remove_file(&shim);
                not_started(format!("open {}: {e}", path.display()))
            })?;
        *self.started.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(Started {
            broker: Broker {
                resolver,
                timeouts: Timeouts::default(),
            },
            policy: Arc::new(Policy::new(vec![layer])),
            audit: Arc::new(Mutex::new(audit)),
            shim,
        }));
        Ok(())
    }

    fn stop(&self) {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }

    fn contribute(&self, _run: &RunRef<'_>) -> Contribution {
        let url = format!("http://{PROXY}");
        let none = "localhost,127.0.0.1,::1".to_string();
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
        let binds = vec![allox_sandbox::spec::Bind {
            src: self.started().map(|st| st.shim.clone()).unwrap_or_default(),
            dst: SHIM.into(),
            writable: false,
        }];
        Contribution {
            env,
            binds,
            ..Contribution::default()
        }
    }

    fn session_context(
        &self,
        session: &SessionRef<'_>,
        context: BorrowedFd<'_>,
    ) -> Result<Option<ContextGuard>, PluginError> {
        let Some(st) = self.started() else {
            return Ok(None);
        };
        let listener = listen_inside(context)
            .map_err(|e| refused(format!("listen on {PROXY} in the session's network: {e}")))?;
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| refused("no async runtime to serve the session's proxy"))?;
        let (agent, sess) = (session.agent.to_string(), session.session.to_string());
        let task = rt.spawn(async move {
            let Ok(l) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            loop {
                let Ok((conn, _)) = l.accept().await else {
                    continue;
                };
                let st = st.clone();
                let (agent, sess) = (agent.clone(), sess.clone());
                tokio::spawn(async move {
                    let a = st.broker.serve(conn, &st.policy).await;
                    let line = serde_json::json!({
                        "time_ms": std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.as_millis() as u64)
                            .unwrap_or(0),
                        "agent_id": agent,
                        "session_id": sess,
                        "kind": a.kind,
                        "host": a.host,
                        "port": a.port,
                        "address": a.addr.map(|s| s.to_string()),
                        "allowed": a.allowed,
                        "verdict": a.verdict,
                        "bytes_sent": a.sent,
                        "bytes_received": a.received,
                    });
                    let mut f = st.audit.lock().unwrap_or_else(|e| e.into_inner());
                    let _ = writeln!(f, "{line}");
                });
            }
        });
        Ok(Some(Box::new(Serving(task))))
    }
}

/// The session's proxy task; aborted (its listener closed) when the
/// context ends.
struct Serving(tokio::task::JoinHandle<()>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Binds [`PROXY`] inside the network namespace of the process `pidfd`,
/// from a thread of its own that enters it and ends there.
fn listen_inside(pidfd: BorrowedFd<'_>) -> std::io::Result<std::net::TcpListener> {
    let fd = pidfd.try_clone_to_owned()?;
    std::thread::scope(|s| {
        s.spawn(move || {
            rustix::thread::move_into_thread_name_spaces(
                rustix::fd::AsFd::as_fd(&fd),
                rustix::thread::ThreadNameSpaceType::NETWORK,
            )?;
            let l = std::net::TcpListener::bind(PROXY)?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the thread panicked")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::NetworkSettings;

    fn settings(isolated: bool, allow: &[&str]) -> Settings {
        Settings {
            state_dir: std::env::temp_dir(),
            process_events_max: 10,
            isolated_network: isolated,
            network: NetworkSettings {
                allow: Some(allow.iter().map(|s| s.to_string()).collect()),
                deny: vec![],
                resolver: None,
            },
        }
    }

    #[test]
    fn it_needs_a_network_per_session_and_rules_that_read() {
        let n = Network::new();
        let e = n.start(&settings(false, &[])).unwrap_err();
        assert!(
            format!("{:?}", e).contains("--sandbox-network isolated"),
            "{e:?}"
        );
        let e = n.start(&settings(true, &["bad host"])).unwrap_err();
        assert!(format!("{:?}", e).contains("--network-allow"), "{e:?}");
        assert!(n.started().is_none());
    }

    #[test]
    fn runs_get_the_proxy_in_both_spellings() {
        let c = Network::new().contribute(&RunRef {
            agent: "a",
            session: "s",
            run: "r",
        });
        let get = |k: &str| c.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        for k in ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"] {
            assert_eq!(get(k), Some("http://127.0.0.1:3128"), "{k}");
        }
        assert_eq!(get("no_proxy"), Some("localhost,127.0.0.1,::1"));
    }
}
