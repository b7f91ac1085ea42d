//! The `monitor` plugin (`--monitor-root DIR`): the seed's observation
//! and profiling plugin. Agent frameworks send spans shaped like
//! OpenTelemetry's GenAI conventions (agent invocations, tool executions,
//! model calls with their tokens) from the host (`monitor.ingest`) or from
//! inside a sandbox (the guest route `monitor.spans`, which names the
//! caller's session whatever the span says); every run that ends is
//! recorded with what it used and the tool call it served (`process.start`
//! with a `trace` context). Both go to one bounded record file outside
//! every workspace, read in pages or followed (`monitor.records`),
//! summarized by tool, model or turn (`monitor.summary`, [`summary`]), and
//! shown on a session's timeline (`monitor.timeline` gives its turns and
//! checkpoints; `alloxctl monitor report` draws it).
//!
//! What a session may make the monitor keep is bounded by bytes, not only
//! by records: a span's encoded size (`--monitor-span-bytes`), the bytes
//! kept for a session (`--monitor-session-bytes`, at most the session's
//! `--session-quota`) and, for spans from inside a sandbox, the bytes a
//! second (`--monitor-bytes-per-s`). Past one, the request is refused
//! whole, naming the budget and its flag.

pub mod summary;

pub use super::defaults::monitor::{
    DEFAULT_BYTES_PER_S, DEFAULT_RECORDS_MAX, DEFAULT_SESSION_BYTES, DEFAULT_SPAN_BYTES, NAME,
};
use super::records::{Adding, Numbered, Records};
use super::slot::Slot;
use crate::plugin_api::{
    Core, Manifest, MonitorSettings, Plugin, PluginError, RouteContext, RouteFuture, RunEnded,
    Settings, API_VERSION,
};
use allox_protocol::sandbox_api::SandboxCaller;
use allox_protocol::{
    ErrorBody, ErrorCode, MonitorBody, MonitorIngested, MonitorListing, MonitorRecord,
    MonitorRecords, MonitorRun, MonitorTimeline, Request, Response, Span, TurnInfo,
    SPANS_PER_REQUEST_MAX,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The record file, in the monitor's directory.
pub const RECORDS_FILE: &str = "records.log";

/// The route it serves inside sandboxes: `{"spans": [...]}`.
pub const SANDBOX_ROUTES: &[&str] = &["monitor.spans"];

impl Numbered for MonitorRecord {
    fn seq(&self) -> u64 {
        self.seq
    }
    fn set_seq(&mut self, seq: u64) {
        self.seq = seq;
    }
    fn owner(&self) -> Option<String> {
        Some(owner(&self.agent_id, &self.session_id))
    }
}

/// How the bytes kept for session `a/s` are named.
fn owner(a: &str, s: &str) -> String {
    format!("{a}/{s}")
}

/// The bytes a session may make the monitor keep and write.
pub struct Budget {
    /// A span's encoded record (0: no limit).
    pub span_bytes: u64,
    /// Kept for one session (0: no limit): `--monitor-session-bytes`, or
    /// the session quota if smaller.
    pub session_bytes: u64,
    /// Whether `session_bytes` is the session quota.
    pub by_quota: bool,
    /// Written a second for one session from inside its sandbox.
    pub rate: allox_store::rate::Buckets,
}

impl Budget {
    pub fn new(m: &MonitorSettings) -> Budget {
        let (session_bytes, by_quota) = match m.session_quota {
            Some(q) if m.session_bytes == 0 || q < m.session_bytes => (q, true),
            _ => (m.session_bytes, false),
        };
        Budget {
            span_bytes: m.span_bytes,
            session_bytes,
            by_quota,
            rate: allox_store::rate::Buckets::new(m.bytes_per_s, m.bytes_per_s.saturating_mul(8)),
        }
    }

    /// Whether `a/s` may add what `add` says (`guest`: from inside its
    /// sandbox, held to the rate as well).
    fn admit(&self, who: &str, add: &Adding, guest: bool) -> Result<(), ErrorBody> {
        let over = |m: String| ErrorBody::new(ErrorCode::Unavailable, m);
        if self.span_bytes > 0 && add.largest > self.span_bytes {
            return Err(ErrorBody::invalid(format!(
                "a span of {} bytes (encoded) is over the monitor's span budget of {} bytes \
                 (--monitor-span-bytes)",
                add.largest, self.span_bytes
            )));
        }
        if self.session_bytes > 0 && add.kept.saturating_add(add.bytes) > self.session_bytes {
            let flag = if self.by_quota {
                "--session-quota, which caps --monitor-session-bytes"
            } else {
                "--monitor-session-bytes"
            };
            return Err(over(format!(
                "session {who} keeps {} bytes of spans in the monitor: {} more would pass its \
                 budget of {} bytes ({flag})",
                add.kept, add.bytes, self.session_bytes
            )));
        }
        if guest {
            if let allox_store::rate::Taken::No = self.rate.take(who, add.bytes) {
                return Err(over(format!(
                    "session {who} sends spans faster than the monitor's budget of {} bytes a \
                     second, {} at once (--monitor-bytes-per-s): {} bytes refused",
                    self.rate.per_s(),
                    self.rate.burst(),
                    add.bytes
                )));
            }
        }
        Ok(())
    }
}

/// What `start` acquired.
pub struct Started {
    pub dir: PathBuf,
    pub records: Records<MonitorRecord>,
    pub budget: Budget,
}

pub struct Monitor {
    manifest: Manifest,
    started: Slot<Started>,
}

impl Monitor {
    pub fn new() -> Monitor {
        Monitor {
            manifest: Manifest {
                name: NAME,
                api_version: API_VERSION,
                conflicts: &[],
                alias: Some("--monitor-root"),
                summary: "keeps the spans agent frameworks send (host or guest) and every run's resources under the tool call it served; summaries by tool, model or turn; a session's timeline",
            },
            started: Slot::default(),
        }
    }

    fn running(&self) -> Result<Arc<Started>, ErrorBody> {
        self.started
            .get()
            .ok_or_else(|| ErrorBody::new(ErrorCode::Unavailable, "the monitor plugin is stopping"))
    }
}

impl Default for Monitor {
    fn default() -> Self {
        Monitor::new()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn unix_nano(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The spans of one request, checked: all or none are taken.
fn check_spans(spans: &[Span]) -> Result<(), ErrorBody> {
    if spans.len() > SPANS_PER_REQUEST_MAX {
        return Err(ErrorBody::invalid(format!(
            "{} spans in one request (at most {SPANS_PER_REQUEST_MAX})",
            spans.len()
        )));
    }
    spans.iter().try_for_each(Span::check)
}

/// The guest route's parameters. A span's session is the caller's: what
/// the request claims (`agent_id`, `session_id`) is read and ignored.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SandboxSpans {
    spans: Vec<Span>,
    #[serde(default, rename = "agent_id")]
    _agent_id: Option<String>,
    #[serde(default, rename = "session_id")]
    _session_id: Option<String>,
}

impl Started {
    /// Appends the spans of one session, from `source` (`guest`: from
    /// inside its sandbox), within its budget: all or none are taken.
    fn ingest(
        &self,
        a: &str,
        s: &str,
        source: &str,
        guest: bool,
        spans: Vec<Span>,
    ) -> Result<MonitorIngested, ErrorBody> {
        let time_ms = now_ms();
        let n = spans.len() as u32;
        let recs = spans
            .into_iter()
            .map(|sp| MonitorRecord {
                seq: 0,
                time_ms,
                agent_id: a.to_string(),
                session_id: s.to_string(),
                source: source.to_string(),
                body: MonitorBody::Span(sp),
            })
            .collect();
        let who = owner(a, s);
        let done = self
            .records
            .append_admitted(Some(&who), recs, |add| self.budget.admit(&who, add, guest))?;
        Ok(match done {
            Some((first_seq, last_seq)) => MonitorIngested {
                accepted: n,
                first_seq,
                last_seq,
            },
            // Spans given and none written: the file took nothing (a full
            // disk). Said, not answered as a success of none.
            None if n > 0 => {
                return Err(ErrorBody::new(
                    ErrorCode::Unavailable,
                    format!(
                        "{n} spans of {who} could not be recorded in {} (is the disk full?): none was kept; send them again once there is room",
                        self.records.path().display()
                    ),
                ))
            }
            None => MonitorIngested {
                accepted: 0,
                first_seq: 0,
                last_seq: 0,
            },
        })
    }

    /// The records after the cursor that `q` asks for; with a session,
    /// only those recorded since it was made (`created_ms`).
    fn page(&self, q: &MonitorRecords, created_ms: u64) -> std::io::Result<MonitorListing> {
        let limit = q.limit.unwrap_or(1000).clamp(1, 10_000) as usize;
        let page = self
            .records
            .page(q.cursor.unwrap_or(0), limit, |r| matches(q, created_ms, r))?;
        Ok(MonitorListing {
            records: page.records,
            next_cursor: page.next_cursor,
        })
    }

    /// Every record `q` asks for (the summary's input).
    pub fn all(&self, q: &MonitorRecords, created_ms: u64) -> std::io::Result<Vec<MonitorRecord>> {
        Ok(self
            .records
            .page_within(0, usize::MAX, usize::MAX, |r| matches(q, created_ms, r))?
            .records)
    }
}

fn matches(q: &MonitorRecords, created_ms: u64, r: &MonitorRecord) -> bool {
    q.agent_id.as_ref().is_none_or(|a| *a == r.agent_id)
        && q.session_id.as_ref().is_none_or(|s| *s == r.session_id)
        && r.time_ms >= created_ms
        && q.trace_id.as_ref().is_none_or(|t| match &r.body {
            MonitorBody::Span(sp) => sp.trace_id == *t,
            MonitorBody::Run(run) => run.trace.as_ref().is_some_and(|c| c.trace_id == *t),
        })
}

/// When the session a query names was made (0 without one); `not_found`
/// for a missing agent or session.
fn created_of(
    ctx: &RouteContext<'_>,
    a: Option<&String>,
    s: Option<&String>,
) -> Result<u64, PluginError> {
    match (a, s) {
        (Some(a), Some(s)) => Ok(ctx.core.session_created(a, s).map_err(answered)?),
        (Some(a), None) => {
            ctx.store.session_list(a)?;
            Ok(0)
        }
        (None, Some(_)) => Err(answered(ErrorBody::invalid(
            "session_id needs agent_id".to_string(),
        ))),
        (None, None) => Ok(0),
    }
}

fn answered(e: ErrorBody) -> PluginError {
    PluginError::Answered(e)
}

fn io(e: std::io::Error) -> PluginError {
    PluginError::Run {
        plugin: NAME,
        source: Box::new(e),
    }
}

impl Plugin for Monitor {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn start(&self, settings: &Settings) -> Result<(), PluginError> {
        let dir = settings
            .monitor
            .root
            .clone()
            .unwrap_or_else(|| settings.state_dir.join("monitor"));
        let fail = |why: String| PluginError::Start {
            plugin: NAME,
            alias: Some("--monitor-root"),
            source: why.into(),
        };
        let made = !dir.exists();
        std::fs::create_dir_all(&dir).map_err(|e| fail(format!("make {}: {e}", dir.display())))?;
        if !dir.is_dir() {
            return Err(fail(format!("{} is not a directory", dir.display())));
        }
        let path = dir.join(RECORDS_FILE);
        let max = (settings.monitor.records_max > 0).then_some(settings.monitor.records_max);
        let records = Records::open_bounded(&path, max).map_err(|e| {
            if made {
                let _ = std::fs::remove_dir(&dir);
            }
            fail(format!("open {}: {e}", path.display()))
        })?;
        self.started.fill(Started {
            dir,
            records,
            budget: Budget::new(&settings.monitor),
        });
        Ok(())
    }

    fn stop(&self) {
        self.started.empty();
    }

    fn run_ended(&self, r: &RunEnded<'_>) {
        let Some(st) = self.started.get() else {
            return;
        };
        let res = r.result;
        st.records.append(MonitorRecord {
            seq: 0,
            time_ms: now_ms(),
            agent_id: r.run.agent.to_string(),
            session_id: r.run.session.to_string(),
            source: "host".into(),
            body: MonitorBody::Run(MonitorRun {
                run_id: r.run.run.to_string(),
                argv: r.argv.to_vec(),
                trace: r.trace.cloned(),
                start_unix_nano: unix_nano(r.started),
                end_unix_nano: unix_nano(r.ended),
                exit_code: res.exit_code,
                signal: res.signal,
                timed_out: res.timed_out,
                oom_killed: res.oom_killed,
                usage: res.usage.clone(),
            }),
        });
    }

    fn sandbox_routes(&self) -> &'static [&'static str] {
        SANDBOX_ROUTES
    }

    fn sandbox_call(
        &self,
        _core: &dyn Core,
        caller: &SandboxCaller,
        route: &str,
        params: &str,
    ) -> Result<String, ErrorBody> {
        let st = self.running()?;
        if route != "monitor.spans" {
            return Err(ErrorBody::new(
                ErrorCode::Unsupported,
                format!("the monitor plugin has no guest route {route}"),
            ));
        }
        let p: SandboxSpans = serde_json::from_str(params)
            .map_err(|e| ErrorBody::invalid(format!("bad params for {route}: {e}")))?;
        check_spans(&p.spans)?;
        let source = format!("run:{}", caller.run_id);
        let done = st.ingest(&caller.agent_id, &caller.session_id, &source, true, p.spans)?;
        serde_json::to_string(&done).map_err(|e| ErrorBody::new(ErrorCode::Internal, e.to_string()))
    }

    fn serve<'a>(&'a self, req: &'a Request, ctx: RouteContext<'a>) -> RouteFuture<'a> {
        Box::pin(async move {
            let st = self.running().map_err(answered)?;
            match req {
                Request::MonitorIngest(p) => {
                    check_spans(&p.spans).map_err(answered)?;
                    ctx.core
                        .session_created(&p.agent_id, &p.session_id)
                        .map_err(answered)?;
                    let st2 = st.clone();
                    let p = p.clone();
                    // Encoding and writing thousands of spans is not for
                    // the I/O task.
                    let done = tokio::task::spawn_blocking(move || {
                        st2.ingest(&p.agent_id, &p.session_id, "host", false, p.spans)
                    })
                    .await
                    .map_err(|e| io(std::io::Error::other(e.to_string())))?
                    .map_err(answered)?;
                    Ok(Response::MonitorIngested(done))
                }
                Request::MonitorRecords(q) => {
                    let created = created_of(&ctx, q.agent_id.as_ref(), q.session_id.as_ref())?;
                    if let Some(t) = &q.trace_id {
                        allox_protocol::check_hex_id("trace_id", t, 32).map_err(answered)?;
                    }
                    if !q.follow {
                        return Ok(Response::MonitorRecords(st.page(q, created).map_err(io)?));
                    }
                    let Some(sink) = ctx.events else {
                        return Err(PluginError::FollowNeedsStream);
                    };
                    let mut q = q.clone();
                    loop {
                        let page = st.page(&q, created).map_err(io)?;
                        for r in page.records {
                            if sink.send(allox_protocol::Event::Monitor(r)).await.is_err() {
                                return Err(PluginError::SubscriberGone);
                            }
                        }
                        q.cursor = Some(page.next_cursor);
                        if sink.is_closed() {
                            return Err(PluginError::SubscriberGone);
                        }
                        st.records
                            .wait_newer(page.next_cursor, Duration::from_secs(1))
                            .await;
                    }
                }
                Request::MonitorSummary(q) => {
                    let created = created_of(&ctx, q.agent_id.as_ref(), q.session_id.as_ref())?;
                    let which = MonitorRecords {
                        agent_id: q.agent_id.clone(),
                        session_id: q.session_id.clone(),
                        ..Default::default()
                    };
                    let st2 = st.clone();
                    let recs = tokio::task::spawn_blocking(move || st2.all(&which, created))
                        .await
                        .map_err(|e| io(std::io::Error::other(e.to_string())))?
                        .map_err(io)?;
                    let turns = |a: &str, s: &str| turns_of(ctx.store, a, s).unwrap_or_default();
                    Ok(Response::MonitorSummary(summary::summarize(
                        &recs, q.group_by, &turns,
                    )))
                }
                Request::MonitorTimeline(q) => {
                    let (a, s) = (q.agent_id.as_str(), q.session_id.as_str());
                    ctx.core.session_created(a, s).map_err(answered)?;
                    let checkpoints = ctx.store.checkpoint_list(a, s)?.checkpoints;
                    let turns = turns_of(ctx.store, a, s).map_err(answered)?;
                    Ok(Response::MonitorTimeline(Box::new(MonitorTimeline {
                        agent_id: a.to_string(),
                        session_id: s.to_string(),
                        turns,
                        checkpoints,
                    })))
                }
                _ => Err(PluginError::NoHandler {
                    plugin: NAME,
                    action: req.action(),
                }),
            }
        })
    }
}

/// A session's turns, in order.
fn turns_of(store: &allox_store::Store, a: &str, s: &str) -> Result<Vec<TurnInfo>, ErrorBody> {
    let turns = store.index().turns(a, s).map_err(|e| {
        ErrorBody::new(
            ErrorCode::Internal,
            format!("read the turns of {a}/{s}: {e}"),
        )
    })?;
    Ok(turns
        .into_iter()
        .map(|(id, t)| TurnInfo {
            agent_id: a.to_string(),
            session_id: s.to_string(),
            turn_id: id.rsplit('/').next().unwrap_or(&id).to_string(),
            number: t.number,
            began_ms: t.began_ms,
            ended_ms: t.ended_ms,
            status: t.status,
            checkpoint_id: t.checkpoint_id,
            checkpoint_error: t.checkpoint_error,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::SpanOperation;

    fn started(dir: &std::path::Path, m: MonitorSettings) -> Started {
        Started {
            dir: dir.to_path_buf(),
            records: Records::open(&dir.join(RECORDS_FILE)).unwrap(),
            budget: Budget::new(&m),
        }
    }

    /// A span with `attrs` attributes of 4 KiB.
    fn span(i: u64, attrs: usize) -> Span {
        Span {
            trace_id: format!("{:032x}", 1),
            span_id: format!("{:016x}", 1 + i),
            parent_span_id: None,
            name: "execute_tool bash".into(),
            operation: SpanOperation::ExecuteTool,
            start_unix_nano: 1,
            end_unix_nano: 2,
            tool: Some("bash".into()),
            model: None,
            input_tokens: None,
            output_tokens: None,
            error: None,
            attributes: (0..attrs)
                .map(|k| (format!("k{k}"), "x".repeat(4096)))
                .collect(),
        }
    }

    fn settings() -> MonitorSettings {
        MonitorSettings {
            session_bytes: 1 << 20,
            bytes_per_s: 0,
            span_bytes: 64 << 10,
            ..Default::default()
        }
    }

    #[test]
    fn a_span_past_its_size_is_refused_naming_the_flag() {
        let d = tempfile::tempdir().unwrap();
        let st = started(d.path(), settings());
        let e = st
            .ingest("a", "s", "run:r", true, vec![span(0, 1), span(1, 32)])
            .unwrap_err();
        assert!(e.message.contains("--monitor-span-bytes"), "{}", e.message);
        // All or none: the small one was not kept either.
        assert_eq!(st.records.kept("a/s"), 0);
        assert_eq!(
            st.ingest("a", "s", "run:r", true, vec![span(0, 15)])
                .unwrap()
                .accepted,
            1
        );
    }

    #[test]
    fn a_session_keeps_at_most_its_bytes_and_the_quota_caps_them() {
        let d = tempfile::tempdir().unwrap();
        let st = started(d.path(), settings());
        let mut refused = None;
        for i in 0..100 {
            match st.ingest("a", "s", "host", false, vec![span(i, 15)]) {
                Ok(_) => {}
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        let e = refused.expect("refused before 100 spans of 60 KiB");
        assert!(
            e.message.contains("--monitor-session-bytes"),
            "{}",
            e.message
        );
        assert!(st.records.kept("a/s") <= 1 << 20);
        let file = std::fs::metadata(d.path().join(RECORDS_FILE))
            .unwrap()
            .len();
        assert_eq!(file, st.records.kept("a/s"));
        // Another session is not held back; counted across reopening.
        assert!(st
            .ingest("a", "t", "host", false, vec![span(0, 15)])
            .is_ok());
        let kept = st.records.kept("a/s");
        drop(st);
        let st = started(d.path(), settings());
        assert_eq!(st.records.kept("a/s"), kept);
        assert!(st
            .ingest("a", "s", "host", false, vec![span(0, 15)])
            .is_err());
        // A smaller session quota is the budget.
        let d = tempfile::tempdir().unwrap();
        let mut m = settings();
        m.session_quota = Some(100 << 10);
        let st = started(d.path(), m);
        assert!(st
            .ingest("a", "s", "host", false, vec![span(0, 15)])
            .is_ok());
        let e = st
            .ingest("a", "s", "host", false, vec![span(1, 15)])
            .unwrap_err();
        assert!(e.message.contains("--session-quota"), "{}", e.message);
    }

    #[test]
    fn a_guest_past_its_rate_is_refused_and_others_are_not() {
        let d = tempfile::tempdir().unwrap();
        let mut m = settings();
        m.session_bytes = 0;
        m.bytes_per_s = 64 << 10;
        let st = started(d.path(), m);
        // The burst is eight seconds' worth: 512 KiB, about 8 spans.
        let mut taken = 0;
        let mut refused = None;
        for i in 0..20 {
            match st.ingest("a", "s", "run:r", true, vec![span(i, 15)]) {
                Ok(_) => taken += 1,
                Err(e) => refused = Some(e),
            }
        }
        assert!((7..=9).contains(&taken), "{taken}");
        let e = refused.unwrap();
        assert!(e.message.contains("--monitor-bytes-per-s"), "{}", e.message);
        assert!(st
            .ingest("b", "s", "run:r", true, vec![span(0, 15)])
            .is_ok());
        // The host's own ingest is not held to the guest's rate.
        assert!(st
            .ingest("a", "s", "host", false, vec![span(0, 15)])
            .is_ok());
    }
}
