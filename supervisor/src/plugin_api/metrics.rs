//! The daemon's metrics, in the Prometheus/OpenMetrics text format
//! (`system.metrics`; the gateway serves them at `GET /metrics`).
//!
//! Counters and histograms are kept as things happen: requests by action
//! and outcome, runs started and how they ended, the store's checkpoints,
//! rollbacks, diffs and forks, file bytes. Gauges of what is (agents,
//! sessions by state, live runs and processes, the store's state and
//! space) are read at each scrape (the supervisor's `metrics_text`). A plugin
//! registers its own families as it starts ([`Metrics::register`]), so a
//! daemon without it exports none of them.
//!
//! Cardinality is bounded: no label names a session or an agent, but for
//! the opt-in `allox_agent_runs_started_total{agent}`, kept for at most
//! `--metrics-agent-label` agents (the rest count under `agent="_other"`).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

/// The prefix of every metric the daemon and the gateway export.
pub const PREFIX: &str = "allox";

/// The agents' label value once the cap is reached.
pub const OTHER_AGENTS: &str = "_other";

/// How a daemon keeps metrics (`--no-metrics`, `--metrics-agent-label`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsConfig {
    /// Off: nothing is counted (the benchmark's baseline) and
    /// `system.metrics` is refused.
    pub enabled: bool,
    /// Agents given a label of their own in
    /// `allox_agent_runs_started_total`; 0 (the default) exports no such
    /// family.
    pub agent_label_cap: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: true,
            agent_label_cap: 0,
        }
    }
}

/// The bounds of the latency histograms, in seconds: 100 µs to 30 s.
fn latency_buckets() -> Histogram {
    Histogram::new([
        0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
        2.5, 5.0, 10.0, 30.0,
    ])
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    action: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabel {
    action: &'static str,
}

/// How a run ended, as `allox_runs_ended_total{how}` counts it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RunEnd {
    /// Its program exited by itself (whatever its code).
    exited,
    /// Its timeout passed and it was killed.
    timed_out,
    /// The OOM killer killed one of its processes.
    oom,
    /// It ended by SIGKILL (`process.kill`, a rollback, a deletion, a
    /// stop).
    killed,
    /// It ended by another signal.
    signaled,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndLabel {
    how: RunEnd,
}

/// A store operation timed in `allox_store_operation_duration_seconds`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum StoreOp {
    checkpoint,
    rollback,
    diff,
    fork,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    operation: StoreOp,
}

/// Which way bytes went: `in` (a file written) or `out` (read).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Direction {
    In,
    Out,
}

impl EncodeLabelValue for Direction {
    fn encode(
        &self,
        e: &mut prometheus_client::encoding::LabelValueEncoder,
    ) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        e.write_str(match self {
            Direction::In => "in",
            Direction::Out => "out",
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: Direction,
}

/// A session's state, as `allox_sessions{state}` counts it: the first
/// that applies of fenced, expired, paused, active.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum SessionState {
    active,
    paused,
    expired,
    fenced,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: SessionState,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentLabel {
    agent: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpaceLabel {
    kind: &'static str,
}

/// What is, read at each scrape.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Snapshot {
    pub agents: i64,
    /// Sessions in each state.
    pub sessions: Vec<(SessionState, i64)>,
    /// Runs whose program has not ended.
    pub runs_live: i64,
    /// Programs in those runs (the sandboxes' PID 1s not counted).
    pub processes: i64,
    /// The store refuses changes (degraded, fenced or mounted read-only).
    pub store_read_only: bool,
    /// The store's filesystem: bytes used and free (to an unprivileged
    /// writer), and the free space below which no agent or session is
    /// made.
    pub store_used_bytes: i64,
    pub store_free_bytes: i64,
    pub store_reserve_bytes: i64,
}

/// The daemon's metrics.
pub struct Metrics {
    on: bool,
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    request_seconds: Family<ActionLabel, Histogram, fn() -> Histogram>,
    runs_started: Counter,
    runs_ended: Family<EndLabel, Counter>,
    store_seconds: Family<OpLabel, Histogram, fn() -> Histogram>,
    file_bytes: Family<DirectionLabel, Counter>,
    agent_runs: Family<AgentLabel, Counter>,
    agent_cap: usize,
    agents_labelled: Mutex<HashSet<String>>,
    journal_replays: Gauge,
    agents: Gauge,
    sessions: Family<StateLabel, Gauge>,
    runs_live: Gauge,
    processes: Gauge,
    store_read_only: Gauge,
    store_bytes: Family<SpaceLabel, Gauge>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").field("on", &self.on).finish()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(MetricsConfig::default())
    }
}

impl Metrics {
    pub fn new(cfg: MetricsConfig) -> Metrics {
        let m = Metrics {
            on: cfg.enabled,
            registry: Mutex::new(Registry::with_prefix(PREFIX)),
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(latency_buckets),
            runs_started: Counter::default(),
            runs_ended: Family::default(),
            store_seconds: Family::new_with_constructor(latency_buckets),
            file_bytes: Family::default(),
            agent_runs: Family::default(),
            agent_cap: cfg.agent_label_cap,
            agents_labelled: Mutex::new(HashSet::new()),
            journal_replays: Gauge::default(),
            agents: Gauge::default(),
            sessions: Family::default(),
            runs_live: Gauge::default(),
            processes: Gauge::default(),
            store_read_only: Gauge::default(),
            store_bytes: Family::default(),
        };
        // Every series of a fixed label set exists from the start, at 0:
        // a rate over it is defined before the first event.
        for how in [
            RunEnd::exited,
            RunEnd::timed_out,
            RunEnd::oom,
            RunEnd::killed,
            RunEnd::signaled,
        ] {
            let _ = m.runs_ended.get_or_create(&EndLabel { how });
        }
        for operation in [
            StoreOp::checkpoint,
            StoreOp::rollback,
            StoreOp::diff,
            StoreOp::fork,
        ] {
            let _ = m.store_seconds.get_or_create(&OpLabel { operation });
        }
        for direction in [Direction::In, Direction::Out] {
            let _ = m.file_bytes.get_or_create(&DirectionLabel { direction });
        }
        m.register(
            "requests",
            "Requests answered, by action and outcome (ok or the error code)",
            m.requests.clone(),
        );
        m.register(
            "request_duration_seconds",
            "Time from a request's admission to its answer, by action",
            m.request_seconds.clone(),
        );
        m.register("runs_started", "Runs started", m.runs_started.clone());
        m.register(
            "runs_ended",
            "Runs ended, by how: exited, timed_out, oom, killed (SIGKILL), signaled",
            m.runs_ended.clone(),
        );
        m.register(
            "store_operation_duration_seconds",
            "Time the store took for each checkpoint, rollback, diff and fork that succeeded",
            m.store_seconds.clone(),
        );
        m.register(
            "file_bytes",
            "Bytes of session files written (in) and read (out) through the file API",
            m.file_bytes.clone(),
        );
        if m.agent_cap > 0 {
            m.register(
                "agent_runs_started",
                "Runs started, by agent (the first --metrics-agent-label agents; the rest as _other)",
                m.agent_runs.clone(),
            );
        }
        m.register(
            "store_journal_replays",
            "Interrupted operations the store's journal finished or undid when this daemon started",
            m.journal_replays.clone(),
        );
        m.register("agents", "Agents", m.agents.clone());
        m.register(
            "sessions",
            "Sessions, by state: fenced, expired, paused or active (the first that applies)",
            m.sessions.clone(),
        );
        m.register(
            "runs_live",
            "Runs whose program has not ended",
            m.runs_live.clone(),
        );
        m.register(
            "processes",
            "Processes of live runs (their sandboxes' PID 1s not counted)",
            m.processes.clone(),
        );
        m.register(
            "store_read_only",
            "1 while the store refuses changes (degraded, fenced, or its filesystem read-only)",
            m.store_read_only.clone(),
        );
        m.register(
            "store_filesystem_bytes",
            "The store's filesystem: bytes used, free, and kept in reserve (no agent or session is made below it)",
            m.store_bytes.clone(),
        );
        m
    }

    /// Whether metrics are kept (not `--no-metrics`).
    pub fn enabled(&self) -> bool {
        self.on
    }

    /// Adds a family or metric under the `allox_` prefix (a plugin's, as it
    /// starts). A counter's name gets `_total` on export.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .register(name, help, metric);
    }

    /// Adds what is read at each scrape from elsewhere (a plugin's own
    /// counters).
    pub fn register_collector(&self, c: Box<dyn Collector>) {
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .register_collector(c);
    }

    /// A request answered.
    pub fn request(&self, action: &'static str, outcome: &'static str, took: Duration) {
        if !self.on {
            return;
        }
        self.requests
            .get_or_create(&RequestLabels { action, outcome })
            .inc();
        self.request_seconds
            .get_or_create(&ActionLabel { action })
            .observe(took.as_secs_f64());
    }

    /// A run started for `agent`.
    pub fn run_started(&self, agent: &str) {
        if !self.on {
            return;
        }
        self.runs_started.inc();
        if self.agent_cap == 0 {
            return;
        }
        let label = {
            let mut seen = self
                .agents_labelled
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if seen.contains(agent) || seen.len() < self.agent_cap && seen.insert(agent.into()) {
                agent.to_string()
            } else {
                OTHER_AGENTS.to_string()
            }
        };
        self.agent_runs
            .get_or_create(&AgentLabel { agent: label })
            .inc();
    }

    /// A run ended.
    pub fn run_ended(&self, how: RunEnd) {
        if self.on {
            self.runs_ended.get_or_create(&EndLabel { how }).inc();
        }
    }

    /// A store operation that succeeded, and how long it took.
    pub fn store_op(&self, operation: StoreOp, took: Duration) {
        if self.on {
            self.store_seconds
                .get_or_create(&OpLabel { operation })
                .observe(took.as_secs_f64());
        }
    }

    /// Times `f` as `operation` when it succeeds.
    pub fn timed<T, E>(
        &self,
        operation: StoreOp,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let t0 = std::time::Instant::now();
        let out = f();
        if out.is_ok() {
            self.store_op(operation, t0.elapsed());
        }
        out
    }

    /// Bytes of files moved.
    pub fn file_bytes(&self, direction: Direction, n: u64) {
        if self.on && n > 0 {
            self.file_bytes
                .get_or_create(&DirectionLabel { direction })
                .inc_by(n);
        }
    }

    /// Interrupted operations replayed at start.
    pub fn journal_replayed(&self, n: u64) {
        self.journal_replays.set(n as i64);
    }

    /// The text of every metric, `snap` as the gauges of what is.
    pub fn encode(&self, snap: &Snapshot) -> String {
        self.agents.set(snap.agents);
        for (state, n) in &snap.sessions {
            self.sessions
                .get_or_create(&StateLabel { state: *state })
                .set(*n);
        }
        self.runs_live.set(snap.runs_live);
        self.processes.set(snap.processes);
        self.store_read_only.set(snap.store_read_only as i64);
        for (kind, v) in [
            ("used", snap.store_used_bytes),
            ("free", snap.store_free_bytes),
            ("reserve", snap.store_reserve_bytes),
        ] {
            self.store_bytes.get_or_create(&SpaceLabel { kind }).set(v);
        }
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

/// A counter read from elsewhere at each scrape (a plugin's atomics), as
/// a [`Collector`].
pub struct ReadCounter {
    pub name: &'static str,
    pub help: &'static str,
    pub read: Box<dyn Fn() -> u64 + Send + Sync>,
}

impl std::fmt::Debug for ReadCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl Collector for ReadCounter {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        let c = prometheus_client::metrics::counter::ConstCounter::new((self.read)());
        let m = encoder.encode_descriptor(self.name, self.help, None, c.metric_type())?;
        c.encode(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn counts_requests_runs_and_store_operations_and_reads_gauges_at_encode() {
        let m = Metrics::default();
        m.request("checkpoint.create", "ok", Duration::from_millis(3));
        m.request("checkpoint.create", "ok", Duration::from_millis(4));
        m.request("session.create", "conflict", Duration::from_micros(50));
        m.run_started("a");
        m.run_ended(RunEnd::timed_out);
        m.store_op(StoreOp::rollback, Duration::from_millis(2));
        m.file_bytes(Direction::In, 10);
        m.file_bytes(Direction::In, 5);
        let t = m.encode(&Snapshot {
            agents: 2,
            sessions: vec![(SessionState::paused, 3)],
            store_read_only: true,
            store_free_bytes: 7,
            ..Default::default()
        });
        let has = |l: &str| assert!(t.lines().any(|x| x == l), "no {l:?} in\n{t}");
        has(r#"allox_requests_total{action="checkpoint.create",outcome="ok"} 2"#);
        has(r#"allox_requests_total{action="session.create",outcome="conflict"} 1"#);
        has(r#"allox_request_duration_seconds_count{action="checkpoint.create"} 2"#);
        has("allox_runs_started_total 1");
        has(r#"allox_runs_ended_total{how="timed_out"} 1"#);
        has(r#"allox_store_operation_duration_seconds_count{operation="rollback"} 1"#);
        has(r#"allox_file_bytes_total{direction="in"} 15"#);
        has("allox_agents 2");
        has(r#"allox_sessions{state="paused"} 3"#);
        has("allox_store_read_only 1");
        has(r#"allox_store_filesystem_bytes{kind="free"} 7"#);
        assert!(t.ends_with("# EOF\n"));
        // No per-agent family unless asked for.
        assert!(line(&t, "allox_agent_runs_started").is_none(), "{t}");
    }

    #[test]
    fn the_agent_label_is_capped() {
        let m = Metrics::new(MetricsConfig {
            enabled: true,
            agent_label_cap: 2,
        });
        for a in ["a", "b", "c", "a", "d"] {
            m.run_started(a);
        }
        let t = m.encode(&Snapshot::default());
        let has = |l: &str| assert!(t.lines().any(|x| x == l), "no {l:?} in\n{t}");
        has(r#"allox_agent_runs_started_total{agent="a"} 2"#);
        has(r#"allox_agent_runs_started_total{agent="b"} 1"#);
        has(r#"allox_agent_runs_started_total{agent="_other"} 2"#);
        assert!(line(&t, r#"allox_agent_runs_started_total{agent="c"}"#).is_none());
    }

    #[test]
    fn off_counts_nothing() {
        let m = Metrics::new(MetricsConfig {
            enabled: false,
            agent_label_cap: 0,
        });
        m.request("system.ping", "ok", Duration::from_millis(1));
        m.run_started("a");
        let t = m.encode(&Snapshot::default());
        assert!(line(&t, "allox_requests_total").is_none(), "{t}");
        assert!(t.lines().any(|l| l == "allox_runs_started_total 0"), "{t}");
    }

    #[test]
    fn a_read_counter_is_read_at_each_encode() {
        let m = Metrics::default();
        let n = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(4));
        let n2 = n.clone();
        m.register_collector(Box::new(ReadCounter {
            name: "tracker_events",
            help: "events",
            read: Box::new(move || n2.load(std::sync::atomic::Ordering::Relaxed)),
        }));
        assert!(m
            .encode(&Snapshot::default())
            .lines()
            .any(|l| l == "allox_tracker_events_total 4"));
        n.store(9, std::sync::atomic::Ordering::Relaxed);
        assert!(m
            .encode(&Snapshot::default())
            .lines()
            .any(|l| l == "allox_tracker_events_total 9"));
    }
}
