//! A `proxy` session's proxy: its accept loop, the connection budgets it
//! keeps (the session's and the daemon's), and each admitted connection
//! served by the broker and recorded in the audit.
//!
//! A connection past a budget is answered `503` at once, naming the budget
//! and its flag, and closed: nothing waits for room. Those refusals are
//! recorded at most once a second per session, each record counting the
//! ones since the last (a flood of them cannot flood the audit). An error
//! of `accept` itself (out of descriptors: `EMFILE`, `ENFILE`) pauses the
//! loop, doubling from 10 ms up to 250 ms while it lasts, instead of
//! asking again at once.

use super::{Live, Started, PROXY};
use allox_network::broker::Broker;
use allox_network::diag::SockDiag;
use allox_protocol::NetworkAuditRecord;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The first pause after a failed `accept`, and the longest.
const PAUSE_FIRST: Duration = Duration::from_millis(10);
const PAUSE_MAX: Duration = Duration::from_millis(250);

/// How often at most a session's refusals over a budget are recorded.
const REFUSALS_RECORDED_EVERY: Duration = Duration::from_secs(1);

/// A connection budget: permits, and what a refusal says.
pub(super) struct Budget {
    permits: Arc<Semaphore>,
    refusal: String,
}

impl Budget {
    /// The daemon's: every session's proxy connections together.
    pub(super) fn all(max: usize) -> Budget {
        Budget {
            permits: Arc::new(Semaphore::new(max)),
            refusal: format!(
                "refused: {max} proxy connections of all sessions are open, the daemon's budget (--proxy-connections)"
            ),
        }
    }

    /// One session's.
    pub(super) fn session(max: usize) -> Budget {
        Budget {
            permits: Arc::new(Semaphore::new(max)),
            refusal: format!(
                "refused: {max} proxy connections of this session are open, its budget (--proxy-connections-per-session)"
            ),
        }
    }

    fn take(&self) -> Result<OwnedSemaphorePermit, &str> {
        self.permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| self.refusal.as_str())
    }
}

/// Everything one session's proxy serves with.
pub(super) struct SessionProxy {
    pub(super) started: Arc<Started>,
    pub(super) live: Arc<Live>,
    pub(super) agent: String,
    pub(super) session: String,
    pub(super) diag: Option<Arc<SockDiag>>,
    /// The shared broker with this session's lookup budget.
    pub(super) broker: Broker,
    pub(super) connections: Budget,
    /// Refusals over a budget not yet recorded, and when one last was.
    untold: AtomicU64,
    told: Mutex<Option<Instant>>,
}

impl SessionProxy {
    pub(super) fn new(
        started: Arc<Started>,
        live: Arc<Live>,
        (agent, session): (String, String),
        diag: Option<Arc<SockDiag>>,
        broker: Broker,
        connections: Budget,
    ) -> SessionProxy {
        SessionProxy {
            started,
            live,
            agent,
            session,
            diag,
            broker,
            connections,
            untold: AtomicU64::new(0),
            told: Mutex::new(None),
        }
    }

    /// Both budgets' permits for one more connection, or the refusal of
    /// the first that has none left; and a place in the session's audit
    /// rate (every attempt is recorded: past the rate one is refused, not
    /// let flood the audit until it rotates the session's earlier records
    /// away).
    fn admit(&self) -> Result<[OwnedSemaphorePermit; 2], String> {
        let key = format!("{}/{}", self.agent, self.session);
        if let allox_store::rate::Taken::No = self.started.lines.take(&key, 1) {
            return Err(format!(
                "session {key}'s connections are past its audit rate (--audit-lines-per-s): every attempt is recorded, so this one is refused; try again in a moment"
            ));
        }
        let mine = self.connections.take().map_err(str::to_string)?;
        let all = self.started.connections.take().map_err(str::to_string)?;
        Ok([mine, all])
    }

    /// Records `r`; whether it was written.
    fn record(&self, mut r: NetworkAuditRecord) -> bool {
        r.agent_id = self.agent.clone();
        r.session_id = self.session.clone();
        self.started.audit.append_all(vec![r]).is_some()
    }

    /// A connection past a budget: `503` naming it, closed; recorded if
    /// none was in the last [`REFUSALS_RECORDED_EVERY`].
    fn refuse(&self, conn: tokio::net::TcpStream, why: &str) {
        // What the socket's buffer takes at once; the client may be gone.
        let _ = conn.try_write(&allox_network::http::answer(
            503,
            "Service Unavailable",
            why,
        ));
        drop(conn);
        self.started.metrics.refused();
        self.untold.fetch_add(1, Ordering::Relaxed);
        {
            let mut told = self.told.lock().unwrap_or_else(|e| e.into_inner());
            if told.is_some_and(|t| t.elapsed() < REFUSALS_RECORDED_EVERY) {
                return;
            }
            *told = Some(Instant::now());
        }
        let n = self.untold.swap(0, Ordering::Relaxed);
        let verdict = if n > 1 {
            format!("{why} ({n} connections refused so since the last such record)")
        } else {
            why.to_string()
        };
        let _ = self.record(record(None, verdict));
    }

    /// Which run a connection to the proxy came from: the cgroup of the
    /// client's socket, asked of the kernel in the session's namespace.
    async fn run_of(&self, peer: SocketAddr) -> Option<String> {
        let (Some(diag), SocketAddr::V4(peer)) = (&self.diag, peer) else {
            return None;
        };
        let proxy = std::net::SocketAddrV4::new(Ipv4Addr::LOCALHOST, PROXY.port());
        let id = diag.cgroup_of(peer, proxy).await.ok().flatten()?;
        let runs = self.started.runs.lock().unwrap_or_else(|e| e.into_inner());
        let key = runs.by_id.get(&id)?;
        key.rsplit('/').next().map(str::to_string)
    }
}

/// A record without agent and session (filled in by
/// [`SessionProxy::record`]).
fn record(run_id: Option<String>, verdict: String) -> NetworkAuditRecord {
    NetworkAuditRecord {
        seq: 0,
        time_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        agent_id: String::new(),
        session_id: String::new(),
        run_id,
        kind: String::new(),
        host: String::new(),
        port: 0,
        address: None,
        allowed: false,
        verdict,
        bytes_sent: 0,
        bytes_received: 0,
        secrets_injected: Vec::new(),
        secrets_withheld: Vec::new(),
        intercepted: false,
        open: false,
    }
}

/// The record of attempt `a`.
fn attempt_record(
    run_id: Option<String>,
    a: &allox_network::broker::Attempt,
) -> NetworkAuditRecord {
    let mut r = record(run_id, a.verdict.clone());
    r.kind = a.kind.to_string();
    r.host = a.host.clone();
    r.port = a.port;
    r.address = a.addr.map(|s| s.to_string());
    r.allowed = a.allowed;
    r.bytes_sent = a.sent;
    r.bytes_received = a.received;
    r.secrets_injected = a.secrets.injected.clone();
    r.secrets_withheld = a.secrets.withheld.clone();
    r.intercepted = a.intercepted;
    r
}

/// Accepts and serves the session's proxy clients until aborted.
pub(super) async fn serve(l: tokio::net::TcpListener, proxy: Arc<SessionProxy>) {
    let mut pause = Duration::ZERO;
    loop {
        let (conn, peer) = match l.accept().await {
            Ok(c) => {
                pause = Duration::ZERO;
                c
            }
            Err(e) => {
                if pause.is_zero() {
                    tracing::warn!(agent = %proxy.agent, session = %proxy.session, error = %e,
                        "the session's proxy cannot accept; pausing while it lasts");
                }
                pause = (pause * 2).clamp(PAUSE_FIRST, PAUSE_MAX);
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        let permits = match proxy.admit() {
            Ok(p) => p,
            Err(why) => {
                proxy.refuse(conn, &why);
                continue;
            }
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let _permits = permits;
            let run_id = proxy.run_of(peer).await;
            let policy = proxy
                .live
                .policy
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let secrets = proxy
                .live
                .secrets
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let opened = |a: &allox_network::broker::Attempt| {
                let mut r = attempt_record(run_id.clone(), a);
                r.open = true;
                r.bytes_sent = 0;
                proxy.record(r)
            };
            let a = proxy.broker.serve(conn, &policy, &secrets, &opened).await;
            proxy.started.metrics.connection(a.allowed);
            let _ = proxy.record(attempt_record(run_id, &a));
        });
    }
}
