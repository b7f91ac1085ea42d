//! What every route of the gateway is served with: the shared state (the
//! access rules, the daemon's connections, the gateway's metrics, idle
//! connections to sessions' ports, the spool).

use crate::access::Access;
use crate::daemon::Daemon;
use crate::{error, Reply};
use allox_client::ReconnectingClient;
use allox_protocol::ErrorCode;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Daemon connections kept idle for the next calls.
const IDLE_DAEMON_CONNECTIONS: usize = 16;

/// What every request is served with.
pub struct Shared {
    pub access: Access,
    pub socket: std::path::PathBuf,
    pub daemon_timeout: Duration,
    pub http_timeout: Duration,
    /// Where plain calls go.
    pub daemon: Daemon,
    idle: Mutex<Vec<ReconnectingClient>>,
    /// The gateway's own metrics.
    pub metrics: crate::metrics::GatewayMetrics,
    /// Idle connections to sessions' ports, for the next requests.
    pub ports: crate::port_pool::Pool,
    /// Where large file bodies are spooled (`None`: files in frames).
    pub spool: Option<crate::spool::Spool>,
}

impl Shared {
    pub fn new(
        access: Access,
        socket: std::path::PathBuf,
        daemon_timeout: Duration,
        http_timeout: Duration,
    ) -> Shared {
        Shared {
            daemon: Daemon::new(socket.clone(), daemon_timeout),
            access,
            socket,
            daemon_timeout,
            http_timeout,
            idle: Mutex::new(Vec::new()),
            metrics: Default::default(),
            ports: Default::default(),
            spool: None,
        }
    }

    /// Files larger than a chunk go through `spool` where the daemon
    /// takes descriptors.
    pub fn with_spool(mut self, spool: Option<crate::spool::Spool>) -> Shared {
        self.spool = spool;
        self
    }

    /// How a file goes without frames, if it may.
    pub fn local(&self) -> Option<crate::spool::Local<'_>> {
        self.spool.as_ref().map(|spool| crate::spool::Local {
            spool,
            socket: &self.socket,
            daemon_timeout: self.daemon_timeout,
        })
    }

    /// Runs `f` on the blocking pool (at once, whether or not the answer
    /// is awaited) with a daemon connection from the pool (a new one if
    /// none is idle), and puts the connection back.
    pub fn with_daemon<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut ReconnectingClient) -> T + Send + 'static,
    ) -> impl Future<Output = Result<T, Reply>> + Send + 'static {
        let me = Arc::clone(self);
        let task = tokio::task::spawn_blocking(move || {
            let taken = me.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let mut daemon = taken.unwrap_or_else(|| {
                ReconnectingClient::with_timeout(&me.socket, Some(me.daemon_timeout))
            });
            let out = f(&mut daemon);
            let mut idle = me.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < IDLE_DAEMON_CONNECTIONS {
                idle.push(daemon);
            }
            out
        });
        async move {
            task.await.map_err(|e| {
                Reply::json(error(
                    500,
                    ErrorCode::Internal,
                    format!("the gateway's call to the daemon failed: {e}"),
                ))
            })
        }
    }
}
