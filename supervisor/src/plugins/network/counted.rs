//! The session network's metrics, registered as the plugin starts:
//! `allox_network_connections_total{verdict}`,
//! `allox_network_bytes_total{direction}` and
//! `allox_network_dns_lookups_total{outcome}`.

use allox_network::broker::Resolve;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabel {
    verdict: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// The plugin's counters (clones share them).
#[derive(Clone, Default)]
pub(super) struct NetMetrics {
    connections: Family<VerdictLabel, Counter>,
    bytes: Family<DirectionLabel, Counter>,
    lookups: Family<OutcomeLabel, Counter>,
}

impl NetMetrics {
    /// Made and registered with the daemon's metrics.
    pub(super) fn registered(m: &crate::plugin_api::metrics::Metrics) -> NetMetrics {
        let n = NetMetrics::default();
        // Every series exists from the start, at 0.
        for verdict in ["allowed", "denied", "refused"] {
            let _ = n.connections.get_or_create(&VerdictLabel { verdict });
        }
        for direction in ["sent", "received"] {
            let _ = n.bytes.get_or_create(&DirectionLabel { direction });
        }
        for outcome in ["ok", "failed", "refused"] {
            let _ = n.lookups.get_or_create(&OutcomeLabel { outcome });
        }
        m.register(
            "network_connections",
            "Connections to sessions' proxies, by verdict: allowed, denied (by a rule, a special address or a failed lookup), refused (over a budget)",
            n.connections.clone(),
        );
        m.register(
            "network_bytes",
            "Bytes relayed by sessions' proxies: sent (out of the session) and received",
            n.bytes.clone(),
        );
        m.register(
            "network_dns_lookups",
            "Name lookups made for sessions' connections, by outcome: ok, failed, refused (over the session's budget)",
            n.lookups.clone(),
        );
        n
    }

    /// A connection served: allowed or not (its bytes are counted as they
    /// move: [`NetMetrics::tally`]).
    pub(super) fn connection(&self, allowed: bool) {
        let verdict = if allowed { "allowed" } else { "denied" };
        self.connections
            .get_or_create(&VerdictLabel { verdict })
            .inc();
    }

    /// A broker's tally: the bytes its connections move, counted as they
    /// move, so that a long connection shows while it lasts.
    pub(super) fn tally(&self) -> allox_network::broker::Tally {
        let sent = self
            .bytes
            .get_or_create(&DirectionLabel { direction: "sent" })
            .clone();
        let received = self
            .bytes
            .get_or_create(&DirectionLabel {
                direction: "received",
            })
            .clone();
        Arc::new(move |s: u64, r: u64| {
            if s > 0 {
                sent.inc_by(s);
            }
            if r > 0 {
                received.inc_by(r);
            }
        })
    }

    /// A connection refused over a budget.
    pub(super) fn refused(&self) {
        self.connections
            .get_or_create(&VerdictLabel { verdict: "refused" })
            .inc();
    }

    /// `inner`, its lookups counted.
    pub(super) fn counting(&self, inner: Arc<dyn Resolve>) -> Arc<dyn Resolve> {
        Arc::new(Counted {
            inner,
            lookups: self.lookups.clone(),
        })
    }
}

/// A resolver whose lookups are counted by outcome.
struct Counted {
    inner: Arc<dyn Resolve>,
    lookups: Family<OutcomeLabel, Counter>,
}

impl Resolve for Counted {
    fn resolve<'a>(
        &'a self,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send + 'a>> {
        Box::pin(async move {
            let out = self.inner.resolve(name).await;
            let outcome = match &out {
                Ok(_) => "ok",
                // The session's lookup budget says so.
                Err(e) if e.kind() == io::ErrorKind::ResourceBusy => "refused",
                Err(_) => "failed",
            };
            self.lookups.get_or_create(&OutcomeLabel { outcome }).inc();
            out
        })
    }
}
