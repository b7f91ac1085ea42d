//! `GET /metrics`: the daemon's metrics (`system.metrics`) followed by
//! the gateway's own — connections accepted and requests by route and
//! status — in the OpenMetrics text format, for Prometheus.
//!
//! Who may scrape: on the gateway's address, a caller with the metrics
//! token (`--metrics-token-file` / `--metrics-token-env`; never the
//! gateway's own token, which can do everything); on the separate
//! `--metrics-listen` address, anyone who can reach it (it serves only
//! `/metrics` and `/healthz`, and is loopback-only unless
//! `--allow-remote`).

use crate::body::{full, HttpResponse};
use crate::daemon::Daemon;
use crate::Route;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::time::Duration;

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long a scrape waits for the daemon's part.
const DAEMON_WAIT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    status: u16,
}

/// The gateway's own metrics.
#[derive(Debug)]
pub struct GatewayMetrics {
    registry: Registry,
    connections: Counter,
    requests: Family<RequestLabels, Counter>,
    daemon_up: Gauge,
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("allox_gateway");
        let connections = Counter::default();
        let requests = Family::default();
        let daemon_up = Gauge::default();
        registry.register(
            "connections",
            "Client connections the gateway accepted (its metrics address's too)",
            connections.clone(),
        );
        registry.register(
            "requests",
            "HTTP requests answered, by route (rpc, files, openapi, healthz, readyz, metrics, other) and status",
            requests.clone(),
        );
        registry.register(
            "daemon_up",
            "1 if the daemon answered this scrape (with its metrics unless it runs with --no-metrics), 0 if it did not answer",
            daemon_up.clone(),
        );
        GatewayMetrics {
            registry,
            connections,
            requests,
            daemon_up,
        }
    }
}

impl GatewayMetrics {
    pub fn connection(&self) {
        self.connections.inc();
    }

    /// A request answered with `status`.
    pub fn request(&self, route: &'static str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels { route, status })
            .inc();
    }
}

/// The label of a route in `allox_gateway_requests_total`.
pub fn route_label(r: &Route) -> &'static str {
    match r {
        Route::Rpc(_) => "rpc",
        Route::Files(_) => "files",
        Route::Port(_) => "ports",
        Route::OpenApi => "openapi",
        Route::Health => "healthz",
        Route::Ready => "readyz",
        Route::Metrics => "metrics",
        Route::Refused(_) => "other",
    }
}

/// The daemon's metrics and the gateway's, one OpenMetrics document.
pub async fn scrape(daemon: &Daemon, m: &GatewayMetrics) -> HttpResponse {
    let call = daemon.call(allox_protocol::Request::SystemMetrics(
        allox_protocol::SystemMetricsRequest {},
    ));
    // Up: the daemon answered, with its metrics or with a refusal (a
    // daemon run with `--no-metrics` refuses them and is up all the same).
    let (up, daemon) = match tokio::time::timeout(DAEMON_WAIT, call).await {
        Ok(Ok(Ok(allox_protocol::Response::Metrics(m)))) => (true, Some(m.text)),
        Ok(Ok(Err(e))) => {
            if e.code != allox_protocol::ErrorCode::Unsupported {
                tracing::warn!(code = e.code.as_str(), why = %e.message, "the daemon refused system.metrics");
            }
            (true, None)
        }
        _ => (false, None),
    };
    m.daemon_up.set(up as i64);
    let mut text = daemon
        .as_deref()
        .map(|t| t.strip_suffix("# EOF\n").unwrap_or(t).to_owned())
        .unwrap_or_default();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode_registry(&mut text, &m.registry);
    let _ = prometheus_client::encoding::text::encode_eof(&mut text);
    hyper::Response::builder()
        .status(200)
        .header("Content-Type", CONTENT_TYPE)
        .body(full(text))
        .unwrap_or_else(|_| hyper::Response::new(full(String::new())))
}
