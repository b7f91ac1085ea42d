//! `monitor.summary`: spans and the runs under them, grouped by tool,
//! model or turn.
//!
//! - A span's group: `tool` groups `execute_tool` spans by `tool` (their
//!   name if none), `model` groups `chat` spans by `model` (`-` if none),
//!   `turn` groups every span by the turn its start falls in: the last turn
//!   of its session (by number) with `began_ms ≤ start ≤ ended_ms` (an
//!   open turn has no end), `-` if none. Other spans are in no group.
//! - A run's group: by `tool` and `model`, the group of the span its trace
//!   context names (same session, trace and span id), none if there is no
//!   such span or it is in no group; by `turn`, the turn its start falls
//!   in, as for spans.
//! - Without a session, turn keys are `agent/session/turn`.
//! - `p50_us` is the lower median (the `⌈n/2⌉`-th shortest duration).

use allox_protocol::{
    GroupBy, MonitorBody, MonitorRecord, MonitorSummary, Span, SpanOperation, SummaryRow, TurnInfo,
};
use std::collections::{BTreeMap, HashMap};

/// Which row a span or run goes to, or none.
fn span_key(group_by: GroupBy, sp: &Span) -> Option<String> {
    match group_by {
        GroupBy::Tool => (sp.operation == SpanOperation::ExecuteTool)
            .then(|| sp.tool.clone().unwrap_or_else(|| sp.name.clone())),
        GroupBy::Model => (sp.operation == SpanOperation::Chat)
            .then(|| sp.model.clone().unwrap_or_else(|| "-".into())),
        GroupBy::Turn => None,
    }
}

/// The turn of a moment (ns since the epoch) in a session.
fn turn_at(turns: &[TurnInfo], unix_nano: u64) -> Option<&str> {
    let ms = unix_nano / 1_000_000;
    turns
        .iter()
        .filter(|t| t.began_ms <= ms && t.ended_ms.is_none_or(|e| ms <= e))
        .max_by_key(|t| t.number)
        .map(|t| t.turn_id.as_str())
}

#[derive(Default)]
struct Acc {
    row: SummaryRow,
    durations: Vec<u64>,
}

/// The summary of `records`, with each session's turns from `turns`.
pub fn summarize(
    records: &[MonitorRecord],
    group_by: GroupBy,
    turns: &dyn Fn(&str, &str) -> Vec<TurnInfo>,
) -> MonitorSummary {
    let one_session = {
        let mut it = records.iter().map(|r| (&r.agent_id, &r.session_id));
        let first = it.next();
        it.all(|x| Some(x) == first)
    };
    let mut turn_cache: HashMap<(String, String), Vec<TurnInfo>> = HashMap::new();
    let mut turn_key = |r: &MonitorRecord, at: u64| -> String {
        let ts = turn_cache
            .entry((r.agent_id.clone(), r.session_id.clone()))
            .or_insert_with(|| turns(&r.agent_id, &r.session_id));
        let t = turn_at(ts, at).unwrap_or("-");
        if one_session {
            t.to_string()
        } else {
            format!("{}/{}/{t}", r.agent_id, r.session_id)
        }
    };
    // Each span's group, by (agent, session, trace, span).
    let mut span_group: HashMap<(&str, &str, &str, &str), String> = HashMap::new();
    let mut rows: BTreeMap<String, Acc> = BTreeMap::new();
    let (mut n_spans, mut n_runs) = (0u64, 0u64);
    for r in records {
        let MonitorBody::Span(sp) = &r.body else {
            continue;
        };
        n_spans = n_spans.saturating_add(1);
        let key = match group_by {
            GroupBy::Turn => Some(turn_key(r, sp.start_unix_nano)),
            _ => span_key(group_by, sp),
        };
        let Some(key) = key else {
            continue;
        };
        span_group.insert(
            (&r.agent_id, &r.session_id, &sp.trace_id, &sp.span_id),
            key.clone(),
        );
        let acc = rows.entry(key).or_default();
        acc.row.spans = acc.row.spans.saturating_add(1);
        acc.row.errors = acc.row.errors.saturating_add(u64::from(sp.error.is_some()));
        acc.durations.push(sp.duration_us());
        acc.row.input_tokens = acc
            .row
            .input_tokens
            .saturating_add(sp.input_tokens.unwrap_or(0));
        acc.row.output_tokens = acc
            .row
            .output_tokens
            .saturating_add(sp.output_tokens.unwrap_or(0));
    }
    for r in records {
        let MonitorBody::Run(run) = &r.body else {
            continue;
        };
        n_runs = n_runs.saturating_add(1);
        let key = match group_by {
            GroupBy::Turn => Some(turn_key(r, run.start_unix_nano)),
            _ => run.trace.as_ref().and_then(|c| {
                span_group
                    .get(&(
                        r.agent_id.as_str(),
                        r.session_id.as_str(),
                        c.trace_id.as_str(),
                        c.span_id.as_str(),
                    ))
                    .cloned()
            }),
        };
        let Some(key) = key else {
            continue;
        };
        let acc = rows.entry(key).or_default();
        acc.row.runs = acc.row.runs.saturating_add(1);
        if let Some(u) = &run.usage {
            acc.row.cpu_us = acc.row.cpu_us.saturating_add(
                u.cpu_user_us
                    .unwrap_or(0)
                    .saturating_add(u.cpu_system_us.unwrap_or(0)),
            );
            acc.row.memory_peak_bytes = acc.row.memory_peak_bytes.max(u.memory_peak_bytes);
            acc.row.oom_kills = acc.row.oom_kills.saturating_add(u.oom_kills.unwrap_or(0));
        }
    }
    let rows = rows
        .into_iter()
        .map(|(key, mut acc)| {
            acc.durations.sort_unstable();
            let d = &acc.durations;
            acc.row.key = key;
            acc.row.total_us = d.iter().fold(0u64, |t, &x| t.saturating_add(x));
            acc.row.max_us = d.last().copied().unwrap_or(0);
            acc.row.p50_us = if d.is_empty() {
                0
            } else {
                d[(d.len() - 1) / 2]
            };
            acc.row
        })
        .collect();
    MonitorSummary {
        group_by,
        rows,
        spans: n_spans,
        runs: n_runs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::{MonitorRun, TraceContext, Usage};

    const T: &str = "0af7651916cd43dd8448eb211c80319c";

    fn span(id: &str, op: SpanOperation, tool: Option<&str>, start: u64, us: u64) -> Span {
        Span {
            trace_id: T.into(),
            span_id: id.into(),
            parent_span_id: None,
            name: "x".into(),
            operation: op,
            start_unix_nano: start,
            end_unix_nano: start + us * 1000,
            tool: tool.map(str::to_string),
            model: None,
            input_tokens: Some(10),
            output_tokens: Some(5),
            error: None,
            attributes: Default::default(),
        }
    }

    fn rec(body: MonitorBody) -> MonitorRecord {
        MonitorRecord {
            seq: 0,
            time_ms: 0,
            agent_id: "a".into(),
            session_id: "s".into(),
            source: "host".into(),
            body,
        }
    }

    fn run(span: &str, start: u64, cpu: u64) -> MonitorRun {
        MonitorRun {
            run_id: "r".into(),
            argv: vec!["true".into()],
            trace: Some(TraceContext {
                trace_id: T.into(),
                span_id: span.into(),
            }),
            start_unix_nano: start,
            end_unix_nano: start,
            exit_code: Some(0),
            signal: None,
            timed_out: false,
            oom_killed: Some(false),
            usage: Some(Usage {
                cpu_user_us: Some(cpu),
                cpu_system_us: Some(1),
                memory_peak_bytes: Some(cpu * 10),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn tools_gather_their_spans_and_the_runs_under_them() {
        let recs = vec![
            rec(MonitorBody::Span(span(
                "00f067aa0ba902b7",
                SpanOperation::ExecuteTool,
                Some("bash"),
                0,
                30,
            ))),
            rec(MonitorBody::Span(span(
                "00f067aa0ba902b8",
                SpanOperation::ExecuteTool,
                Some("bash"),
                0,
                10,
            ))),
            rec(MonitorBody::Span(span(
                "00f067aa0ba902b9",
                SpanOperation::Chat,
                None,
                0,
                99,
            ))),
            rec(MonitorBody::Run(run("00f067aa0ba902b7", 0, 100))),
            rec(MonitorBody::Run(run("00f067aa0ba902b7", 0, 50))),
            rec(MonitorBody::Run(run("00f067aa0ba902b9", 0, 7))),
        ];
        let s = summarize(&recs, GroupBy::Tool, &|_, _| Vec::new());
        assert_eq!((s.spans, s.runs), (3, 3));
        assert_eq!(s.rows.len(), 1);
        let r = &s.rows[0];
        assert_eq!((r.key.as_str(), r.spans, r.runs), ("bash", 2, 2));
        assert_eq!((r.total_us, r.p50_us, r.max_us), (40, 10, 30));
        assert_eq!((r.cpu_us, r.memory_peak_bytes), (152, Some(1000)));
        let m = summarize(&recs, GroupBy::Model, &|_, _| Vec::new());
        assert_eq!(
            (m.rows[0].key.as_str(), m.rows[0].runs, m.rows[0].cpu_us),
            ("-", 1, 8)
        );
    }

    #[test]
    fn turns_take_what_starts_in_them() {
        let turn = |id: &str, n, b, e| TurnInfo {
            agent_id: "a".into(),
            session_id: "s".into(),
            turn_id: id.into(),
            number: n,
            began_ms: b,
            ended_ms: e,
            status: None,
            checkpoint_id: None,
            checkpoint_error: None,
        };
        let ms = 1_000_000;
        let recs = vec![
            rec(MonitorBody::Span(span(
                "00f067aa0ba902b7",
                SpanOperation::Other,
                None,
                5 * ms,
                1,
            ))),
            rec(MonitorBody::Span(span(
                "00f067aa0ba902b8",
                SpanOperation::Other,
                None,
                20 * ms,
                1,
            ))),
            rec(MonitorBody::Span(span(
                "00f067aa0ba902b9",
                SpanOperation::Other,
                None,
                50 * ms,
                1,
            ))),
            rec(MonitorBody::Run(run("00f067aa0ba902b7", 21 * ms, 3))),
        ];
        let turns = |_: &str, _: &str| vec![turn("t1", 1, 0, Some(10)), turn("t2", 2, 10, None)];
        let s = summarize(&recs, GroupBy::Turn, &turns);
        let keys: Vec<_> = s
            .rows
            .iter()
            .map(|r| (r.key.as_str(), r.spans, r.runs))
            .collect();
        assert_eq!(keys, [("t1", 1, 0), ("t2", 2, 1)]);
    }

    #[test]
    fn sums_of_guest_supplied_counters_saturate_instead_of_wrapping() {
        let mut big = span(
            "00f067aa0ba902b7",
            SpanOperation::ExecuteTool,
            Some("bash"),
            0,
            1,
        );
        big.input_tokens = Some(u64::MAX);
        big.output_tokens = Some(u64::MAX);
        let mut long = span(
            "00f067aa0ba902b8",
            SpanOperation::ExecuteTool,
            Some("bash"),
            0,
            1,
        );
        long.end_unix_nano = u64::MAX;
        let mut hungry = run("00f067aa0ba902b7", 0, 0);
        hungry.usage = Some(Usage {
            cpu_user_us: Some(u64::MAX),
            cpu_system_us: Some(u64::MAX),
            oom_kills: Some(u64::MAX),
            ..Default::default()
        });
        let mut recs = vec![
            rec(MonitorBody::Span(big.clone())),
            rec(MonitorBody::Span(big)),
            rec(MonitorBody::Run(hungry.clone())),
            rec(MonitorBody::Run(hungry)),
        ];
        // A thousand and one spans of u64::MAX ns: more µs than a u64.
        for i in 0..1001u64 {
            long.span_id = format!("{:016x}", 0x1000 + i);
            recs.push(rec(MonitorBody::Span(long.clone())));
        }
        let s = summarize(&recs, GroupBy::Tool, &|_, _| Vec::new());
        let r = &s.rows[0];
        assert_eq!((r.input_tokens, r.output_tokens), (u64::MAX, u64::MAX));
        assert_eq!((r.cpu_us, r.oom_kills), (u64::MAX, u64::MAX));
        assert_eq!(r.total_us, u64::MAX);
    }
}
