//! What runs and sessions cost, from their cgroups: CPU time, memory,
//! I/O and OOM kills (`RunResult.usage`, `session.stats`), and changing a
//! live session's limits (`session.update`). A figure whose controller the
//! kernel does not offer there is `None`, never a guess.

use crate::target::target;
use serde::{Deserialize, Serialize};

/// What a cgroup (a run's, a session's) used.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time in user and kernel mode (`cpu.stat`), µs.
    pub cpu_user_us: Option<u64>,
    pub cpu_system_us: Option<u64>,
    /// The most memory it held at once (`memory.peak`), bytes.
    pub memory_peak_bytes: Option<u64>,
    /// Bytes read and written on block devices (`io.stat`).
    pub io_read_bytes: Option<u64>,
    pub io_write_bytes: Option<u64>,
    /// Processes the OOM killer killed in it (`memory.events` `oom_kill`).
    pub oom_kills: Option<u64>,
}

/// `session.stats`: what a session uses now and has used in total.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionStatsRequest {
    pub agent_id: String,
    pub session_id: String,
}

target!(SessionStatsRequest: agent_id, session_id);

/// A session's limits as its cgroup has them (`None`: no limit, or no
/// controller).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionLimits {
    pub pids_max: Option<u64>,
    pub memory_max: Option<u64>,
    /// `"QUOTA PERIOD"` in µs.
    pub cpu_max: Option<String>,
}

/// The answer to `session.stats` and `session.update`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct SessionStats {
    pub agent_id: String,
    pub session_id: String,
    /// Runs going on, and their programs (the sandboxes' PID 1s not
    /// counted).
    pub live_runs: u32,
    pub processes: u32,
    /// Memory held now (`memory.current`), bytes.
    pub memory_current_bytes: Option<u64>,
    /// What the live runs used so far.
    pub now: Usage,
    /// Each live run's part of `now`.
    pub runs: Vec<RunUsage>,
    /// What the session's cgroup used since it was made (its runs that
    /// ended included).
    pub total: Usage,
    pub limits: SessionLimits,
}

/// What one live run used so far.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct RunUsage {
    pub run_id: String,
    pub usage: Usage,
    /// Memory it holds now (`memory.current`), bytes.
    pub memory_current_bytes: Option<u64>,
}

/// `session.update`: changes a live session's limits, idle timeout and
/// lifetime (those given; the others stay).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct SessionUpdate {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub pids_max: Option<u64>,
    #[serde(default)]
    pub memory_max: Option<u64>,
    #[serde(default)]
    pub cpu_max: Option<String>,
    /// A new idle timeout (0: none).
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
    /// A new lifetime, counted from now (0: none); an expired session
    /// takes changes again.
    #[serde(default)]
    pub max_lifetime_ms: Option<u64>,
}

target!(SessionUpdate: agent_id, session_id);

/// W3C trace context of the tool call a `process.start` serves: its runs
/// are recorded under that span (`--monitor-root`), and the run sees it as
/// `TRACEPARENT`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TraceContext {
    /// 32 lowercase hex digits, not all zero.
    pub trace_id: String,
    /// 16 lowercase hex digits, not all zero.
    pub span_id: String,
}

impl TraceContext {
    /// Checks both ids (`invalid_request` naming the one that is wrong).
    pub fn check(&self) -> Result<(), crate::ErrorBody> {
        check_hex_id("trace_id", &self.trace_id, 32)?;
        check_hex_id("span_id", &self.span_id, 16)
    }

    /// `TRACEPARENT` (W3C `traceparent`, sampled).
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-01", self.trace_id, self.span_id)
    }
}

/// An id of `len` lowercase hex digits, not all zero (as OpenTelemetry
/// has trace and span ids).
pub fn check_hex_id(what: &str, id: &str, len: usize) -> Result<(), crate::ErrorBody> {
    let ok = id.len() == len
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && id.bytes().any(|b| b != b'0');
    if ok {
        Ok(())
    } else {
        Err(crate::ErrorBody::invalid(format!(
            "{what} {id:?} is not {len} lowercase hex digits (not all zero)"
        )))
    }
}

/// What a span is, as OpenTelemetry's GenAI conventions name the
/// operation (`gen_ai.operation.name`).
#[derive(
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
)]
pub enum SpanOperation {
    /// An agent's invocation (`invoke_agent`).
    #[serde(rename = "invoke_agent")]
    InvokeAgent,
    /// A tool's execution (`execute_tool`): `tool` names it.
    #[serde(rename = "execute_tool")]
    ExecuteTool,
    /// A model call (`chat`): `model`, tokens.
    #[serde(rename = "chat")]
    Chat,
    /// Anything else the framework traces.
    #[serde(rename = "other")]
    Other,
}

impl SpanOperation {
    pub fn as_str(self) -> &'static str {
        match self {
            SpanOperation::InvokeAgent => "invoke_agent",
            SpanOperation::ExecuteTool => "execute_tool",
            SpanOperation::Chat => "chat",
            SpanOperation::Other => "other",
        }
    }
}

/// One span as a framework sends it: OpenTelemetry's shape with the GenAI
/// conventions' fields named.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Span {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    #[serde(default)]
    pub parent_span_id: Option<String>,
    pub name: String,
    pub operation: SpanOperation,
    /// Nanoseconds since the Unix epoch; `end` ≥ `start`.
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// `gen_ai.tool.name` (for `execute_tool`).
    #[serde(default)]
    pub tool: Option<String>,
    /// `gen_ai.request.model` (for `chat`).
    #[serde(default)]
    pub model: Option<String>,
    /// `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`.
    #[serde(default)]
    pub input_tokens: Option<u64>,
    #[serde(default)]
    pub output_tokens: Option<u64>,
    /// Why it failed (OpenTelemetry status `ERROR`); `None` is `OK`.
    #[serde(default)]
    pub error: Option<String>,
    /// Other attributes (at most 32, keys ≤ 128 bytes, values ≤ 4 KiB).
    #[serde(default)]
    pub attributes: std::collections::BTreeMap<String, String>,
}

/// Most spans in one `monitor.ingest` (or guest `monitor.spans`).
/// (About 100 bytes each on the wire, within a frame's 1 MiB.)
pub const SPANS_PER_REQUEST_MAX: usize = 4096;

impl Span {
    /// Checks ids, times, names and sizes (`invalid_request` naming the
    /// field).
    pub fn check(&self) -> Result<(), crate::ErrorBody> {
        let bad = |why: String| Err(crate::ErrorBody::invalid(why));
        check_hex_id("trace_id", &self.trace_id, 32)?;
        check_hex_id("span_id", &self.span_id, 16)?;
        if let Some(p) = &self.parent_span_id {
            check_hex_id("parent_span_id", p, 16)?;
        }
        if self.name.is_empty() || self.name.len() > 256 {
            return bad(format!(
                "span {}: name must be 1 to 256 bytes",
                self.span_id
            ));
        }
        if self.end_unix_nano < self.start_unix_nano {
            return bad(format!(
                "span {}: end_unix_nano {} is before start_unix_nano {}",
                self.span_id, self.end_unix_nano, self.start_unix_nano
            ));
        }
        for (what, v) in [("tool", &self.tool), ("model", &self.model)] {
            if v.as_ref().is_some_and(|v| v.is_empty() || v.len() > 256) {
                return bad(format!(
                    "span {}: {what} must be 1 to 256 bytes",
                    self.span_id
                ));
            }
        }
        if self.error.as_ref().is_some_and(|e| e.len() > 4096) {
            return bad(format!("span {}: error is over 4 KiB", self.span_id));
        }
        if self.attributes.len() > 32 {
            return bad(format!(
                "span {}: {} attributes (at most 32)",
                self.span_id,
                self.attributes.len()
            ));
        }
        for (k, v) in &self.attributes {
            if k.is_empty() || k.len() > 128 || v.len() > 4096 {
                return bad(format!(
                    "span {}: attribute {k:?}: keys are 1 to 128 bytes, values at most 4 KiB",
                    self.span_id
                ));
            }
        }
        Ok(())
    }

    pub fn duration_us(&self) -> u64 {
        (self.end_unix_nano - self.start_unix_nano) / 1000
    }
}

/// `monitor.ingest` (host): spans of a session's agent framework.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MonitorIngest {
    pub agent_id: String,
    pub session_id: String,
    pub spans: Vec<Span>,
}

target!(MonitorIngest: agent_id, session_id);

/// The answer to `monitor.ingest` (and the guest's `monitor.spans`).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct MonitorIngested {
    pub accepted: u32,
    /// The numbers the records got (`0, 0` when none).
    pub first_seq: u64,
    pub last_seq: u64,
}

/// A run that ended, as the monitor keeps it.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct MonitorRun {
    pub run_id: String,
    pub argv: Vec<String>,
    /// The tool call it served (`process.start`'s `trace`).
    pub trace: Option<TraceContext>,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: Option<bool>,
    pub usage: Option<Usage>,
}

/// What a monitor record holds.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum MonitorBody {
    Span(Span),
    Run(MonitorRun),
}

/// One record of the monitor (`--monitor-root`), numbered from 1.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct MonitorRecord {
    pub seq: u64,
    /// When it was recorded, ms since the Unix epoch.
    pub time_ms: u64,
    pub agent_id: String,
    pub session_id: String,
    /// Where it came from: `host`, or `run:<id>` for the in-sandbox interface
    /// of that run (which names the session, whatever the span says).
    pub source: String,
    pub body: MonitorBody,
}

/// `monitor.records`: spans and runs, a page after `cursor`, or followed.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct MonitorRecords {
    #[serde(default)]
    pub agent_id: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
    /// Only this trace's.
    #[serde(default)]
    pub trace_id: Option<String>,
    #[serde(default)]
    pub cursor: Option<u64>,
    /// Most records in the answer (default 1,000, at most 10,000).
    #[serde(default)]
    pub limit: Option<u32>,
    #[serde(default)]
    pub follow: bool,
}

target!(MonitorRecords: agent_id, session_id);

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct MonitorListing {
    pub records: Vec<MonitorRecord>,
    pub next_cursor: u64,
}

/// How `monitor.summary` groups.
#[derive(
    Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    #[default]
    Tool,
    Model,
    Turn,
}

/// `monitor.summary`: spans and the runs under them, grouped.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct MonitorSummaryRequest {
    #[serde(default)]
    pub agent_id: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub group_by: GroupBy,
}

target!(MonitorSummaryRequest: agent_id, session_id);

/// One group of a summary: a tool, a model, or a turn.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq, Default)]
pub struct SummaryRow {
    /// The tool's or model's name, or the turn's id (`-` for what falls
    /// in no turn).
    pub key: String,
    /// Spans in the group (`execute_tool` spans of the tool, `chat` spans
    /// of the model, every span of the turn) and how many failed.
    pub spans: u64,
    pub errors: u64,
    /// Their durations: sum, median, longest (µs).
    pub total_us: u64,
    pub p50_us: u64,
    pub max_us: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Runs under the group's spans (by trace context; for a turn, runs
    /// that started in it) and what they used.
    pub runs: u64,
    pub cpu_us: u64,
    /// The largest peak of any of those runs; none when no run's peak is
    /// known (no memory controller).
    pub memory_peak_bytes: Option<u64>,
    pub oom_kills: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct MonitorSummary {
    pub group_by: GroupBy,
    /// Sorted by key.
    pub rows: Vec<SummaryRow>,
    /// Spans and runs looked at.
    pub spans: u64,
    pub runs: u64,
}

/// `monitor.timeline`: what a session's report shows besides its spans
/// and runs: its turns and checkpoints.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MonitorTimelineRequest {
    pub agent_id: String,
    pub session_id: String,
}

target!(MonitorTimelineRequest: agent_id, session_id);

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct MonitorTimeline {
    pub agent_id: String,
    pub session_id: String,
    pub turns: Vec<crate::TurnInfo>,
    pub checkpoints: Vec<crate::CheckpointInfo>,
}
