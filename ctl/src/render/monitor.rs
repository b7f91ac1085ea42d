//! The monitor's answers as people read them.

use super::clean;
use super::stats::bytes;
use super::table::Table;
use allox_protocol::{MonitorBody, MonitorIngested, MonitorListing, MonitorRecord, MonitorSummary};

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1e3)
}

/// One record, a line.
pub fn record(r: &MonitorRecord) -> String {
    let who = format!("#{} {}/{}", r.seq, clean(&r.agent_id), clean(&r.session_id));
    match &r.body {
        MonitorBody::Span(sp) => format!(
            "{who} span {} {} {} ({}) {}{} trace {} from {}\n",
            sp.span_id,
            sp.operation.as_str(),
            clean(
                sp.tool
                    .as_deref()
                    .or(sp.model.as_deref())
                    .unwrap_or(&sp.name)
            ),
            clean(&sp.name),
            ms(sp.duration_us()),
            sp.error
                .as_deref()
                .map(|e| format!(" error: {}", clean(e)))
                .unwrap_or_default(),
            sp.trace_id,
            clean(&r.source)
        ),
        MonitorBody::Run(run) => {
            let u = run.usage.clone().unwrap_or_default();
            format!(
                "{who} run {} {} — {}, cpu {}, memory peak {}{}{}\n",
                clean(&run.run_id),
                clean(&run.argv.join(" ")),
                match (run.exit_code, run.signal) {
                    (Some(c), _) => format!("exit {c}"),
                    (None, Some(s)) => format!("signal {s}"),
                    _ => "?".into(),
                },
                ms(u.cpu_user_us.unwrap_or(0) + u.cpu_system_us.unwrap_or(0)),
                u.memory_peak_bytes.map(bytes).unwrap_or_else(|| "-".into()),
                if run.oom_killed == Some(true) {
                    ", OOM-killed"
                } else {
                    ""
                },
                run.trace
                    .as_ref()
                    .map(|t| format!(" under {}:{}", t.trace_id, t.span_id))
                    .unwrap_or_default()
            )
        }
    }
}

pub fn listing(l: &MonitorListing) -> String {
    let mut out: String = l.records.iter().map(record).collect();
    out.push_str(&format!("next cursor: {}\n", l.next_cursor));
    out
}

pub fn ingested(i: &MonitorIngested) -> String {
    format!(
        "{} spans recorded (#{}..#{})\n",
        i.accepted, i.first_seq, i.last_seq
    )
}

pub fn summary(m: &MonitorSummary) -> String {
    let by = format!("{:?}", m.group_by).to_uppercase();
    let mut t = Table::with_header(&[
        &by,
        "CALLS",
        "ERRORS",
        "TIME",
        "P50",
        "MAX",
        "TOKENS IN",
        "TOKENS OUT",
        "RUNS",
        "CPU",
        "MEM PEAK",
    ]);
    for r in &m.rows {
        t.row(vec![
            clean(&r.key),
            r.spans.to_string(),
            r.errors.to_string(),
            ms(r.total_us),
            ms(r.p50_us),
            ms(r.max_us),
            r.input_tokens.to_string(),
            r.output_tokens.to_string(),
            r.runs.to_string(),
            ms(r.cpu_us),
            r.memory_peak_bytes.map(bytes).unwrap_or_else(|| "-".into()),
        ]);
    }
    format!(
        "{}{} spans, {} runs looked at\n",
        t.render(),
        m.spans,
        m.runs
    )
}
