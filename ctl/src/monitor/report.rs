//! A session's report: one self-contained HTML page with its timeline,
//! summaries and runs.

use super::ReportData;
use allox_protocol::{CheckpointInfo, MonitorBody, MonitorSummary, Span, SpanOperation, TurnInfo};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// Escapes text for HTML.
fn esc(t: &str) -> String {
    let mut o = String::with_capacity(t.len());
    for ch in t.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c if c.is_control() => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

fn ms_text(us: u64) -> String {
    if us >= 1_000_000 {
        format!("{:.2} s", us as f64 / 1e6)
    } else {
        format!("{:.1} ms", us as f64 / 1e3)
    }
}

fn bytes_text(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else {
        format!("{} KiB", b / 1024)
    }
}

/// One row of the timeline.
struct Row {
    kind: &'static str,
    class: String,
    label: String,
    depth: usize,
    start: u64,
    end: u64,
    detail: String,
}

const STYLE: &str = r#"
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222;background:#fff}
h1{font-size:18px;margin:0 0 4px}
.meta{color:#666;margin-bottom:12px}
.wrap{display:flex;gap:16px;align-items:flex-start}
.chart{flex:1 1 auto;min-width:500px;border:1px solid #ddd;position:relative}
.side{flex:0 0 420px}
.row{display:flex;height:20px;border-bottom:1px solid #f2f2f2}
.lbl{flex:0 0 220px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;padding:0 4px;font-size:12px;line-height:20px}
.lane{flex:1 1 auto;position:relative}
.bar{position:absolute;top:3px;height:14px;border-radius:2px;min-width:2px;opacity:.9}
.turn{background:#c9d7f2}.invoke_agent{background:#7e57c2}.execute_tool{background:#26a69a}
.chat{background:#ffa726}.other{background:#90a4ae}.run{background:#5c6bc0}.run.failed{background:#e53935}
.mark{position:absolute;top:0;bottom:0;width:0;border-left:2px dashed #43a047}
.mark.rollback{border-left:2px solid #e53935}
.marks{position:absolute;left:220px;right:0;top:0;bottom:0;pointer-events:none}
table{border-collapse:collapse;width:100%;margin-bottom:12px;font-size:12px}
th,td{border:1px solid #ddd;padding:2px 5px;text-align:right}
th:first-child,td:first-child,#runs td:nth-child(-n+3),#runs th:nth-child(-n+3){text-align:left}
th{background:#f5f5f5}
.legend span{display:inline-block;padding:0 6px;margin-right:4px;border-radius:2px;color:#fff}
"#;

/// The page: a time axis with the session's turns, its spans (nested by
/// parent) and the runs under each span, checkpoints and rollbacks as
/// marks; the summaries by tool and by turn beside it; a table of runs.
pub fn report_html(d: &ReportData) -> String {
    let mut spans: Vec<(&Span, &str)> = Vec::new();
    let mut runs = Vec::new();
    for r in &d.records {
        match &r.body {
            MonitorBody::Span(sp) => spans.push((sp, r.source.as_str())),
            MonitorBody::Run(run) => runs.push(run),
        }
    }
    spans.sort_by_key(|(sp, _)| (sp.start_unix_nano, sp.span_id.clone()));
    runs.sort_by_key(|r| r.start_unix_nano);
    let ms = 1_000_000u64;
    let turns: &[TurnInfo] = &d.timeline.turns;
    let cps: &[CheckpointInfo] = &d.timeline.checkpoints;
    // The axis: everything shown.
    let mut lo = u64::MAX;
    let mut hi = 0u64;
    let mut see = |a: u64, b: u64| {
        lo = lo.min(a);
        hi = hi.max(b);
    };
    for (sp, _) in &spans {
        see(sp.start_unix_nano, sp.end_unix_nano);
    }
    for r in &runs {
        see(r.start_unix_nano, r.end_unix_nano);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|x| x.as_nanos() as u64)
        .unwrap_or(0);
    for t in turns {
        see(
            t.began_ms * ms,
            t.ended_ms.map_or(t.began_ms * ms, |e| e * ms),
        );
    }
    for c in cps {
        see(c.created_ms * ms, c.created_ms * ms);
    }
    for (t, _) in &d.rollbacks {
        see(t * ms, t * ms);
    }
    if lo == u64::MAX {
        lo = now;
        hi = now;
    }
    let span_ns = (hi - lo).max(1) as f64;
    let pos = |t: u64| (t.saturating_sub(lo)) as f64 * 100.0 / span_ns;

    let mut rows: Vec<Row> = Vec::new();
    for t in turns {
        let end = t.ended_ms.map_or(hi, |e| e * ms);
        rows.push(Row {
            kind: "turn",
            class: "turn".into(),
            label: format!("turn {} ({})", t.turn_id, t.number),
            depth: 0,
            start: t.began_ms * ms,
            end,
            detail: format!(
                "turn {}: {}{}",
                t.turn_id,
                t.status
                    .map(|s| format!("{s:?}").to_lowercase())
                    .unwrap_or_else(|| "open".into()),
                t.checkpoint_id
                    .as_deref()
                    .map(|c| format!(", checkpoint {c}"))
                    .unwrap_or_default()
            ),
        });
    }
    // Spans in tree order (a parent before its children), each followed
    // by the runs under it.
    let ids: HashMap<(&str, &str), usize> = spans
        .iter()
        .enumerate()
        .map(|(i, (sp, _))| ((sp.trace_id.as_str(), sp.span_id.as_str()), i))
        .collect();
    let mut children: BTreeMap<Option<usize>, Vec<usize>> = BTreeMap::new();
    for (i, (sp, _)) in spans.iter().enumerate() {
        let parent = sp
            .parent_span_id
            .as_deref()
            .and_then(|p| ids.get(&(sp.trace_id.as_str(), p)).copied())
            .filter(|&p| p != i);
        children.entry(parent).or_default().push(i);
    }
    let mut runs_of: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut loose = Vec::new();
    for (j, r) in runs.iter().enumerate() {
        match r
            .trace
            .as_ref()
            .and_then(|t| ids.get(&(t.trace_id.as_str(), t.span_id.as_str())))
        {
            Some(&i) => runs_of.entry(i).or_default().push(j),
            None => loose.push(j),
        }
    }
    let run_row = |r: &allox_protocol::MonitorRun, depth: usize| {
        let u = r.usage.clone().unwrap_or_default();
        let cpu = u.cpu_user_us.unwrap_or(0) + u.cpu_system_us.unwrap_or(0);
        let failed = r.exit_code != Some(0);
        Row {
            kind: "run",
            class: if failed {
                "run failed".into()
            } else {
                "run".into()
            },
            label: format!("▸ {}", r.argv.join(" ")),
            depth,
            start: r.start_unix_nano,
            end: r.end_unix_nano,
            detail: format!(
                "run {}: {} — {}, CPU {}, memory peak {}{}",
                r.run_id,
                r.argv.join(" "),
                match (r.exit_code, r.signal) {
                    (Some(c), _) => format!("exit {c}"),
                    (None, Some(s)) => format!("signal {s}"),
                    _ => "?".into(),
                },
                ms_text(cpu),
                u.memory_peak_bytes
                    .map(bytes_text)
                    .unwrap_or_else(|| "n/a".into()),
                if r.oom_killed == Some(true) {
                    ", OOM-killed"
                } else {
                    ""
                }
            ),
        }
    };
    let mut stack: Vec<(usize, usize)> = children
        .get(&None)
        .map(|v| v.iter().rev().map(|&i| (i, 0)).collect())
        .unwrap_or_default();
    // Spans whose parent chain loops are never reached from a root: shown
    // at the end at depth 0.
    let mut shown = vec![false; spans.len()];
    let mut visit = |stack: &mut Vec<(usize, usize)>, rows: &mut Vec<Row>| {
        while let Some((i, depth)) = stack.pop() {
            if std::mem::replace(&mut shown[i], true) {
                continue;
            }
            let (sp, source) = spans[i];
            // A tool or model call by what it called; others by their
            // name, which conventionally starts with the operation.
            let op = sp.operation.as_str();
            let label = match (sp.operation, &sp.tool, &sp.model) {
                (SpanOperation::ExecuteTool, Some(w), _) | (SpanOperation::Chat, _, Some(w)) => {
                    format!("{op} {w}")
                }
                _ if sp.name.starts_with(op) => sp.name.clone(),
                _ => format!("{op} {}", sp.name),
            };
            rows.push(Row {
                kind: "span",
                class: sp.operation.as_str().into(),
                label,
                depth,
                start: sp.start_unix_nano,
                end: sp.end_unix_nano,
                detail: format!(
                    "{} ({}) {}{}{} from {}",
                    sp.name,
                    sp.operation.as_str(),
                    ms_text(sp.duration_us()),
                    match (sp.input_tokens, sp.output_tokens) {
                        (None, None) => String::new(),
                        (i, o) =>
                            format!(", tokens {} in / {} out", i.unwrap_or(0), o.unwrap_or(0)),
                    },
                    sp.error
                        .as_deref()
                        .map(|e| format!(", error: {e}"))
                        .unwrap_or_default(),
                    source
                ),
            });
            for &j in runs_of.get(&i).map(Vec::as_slice).unwrap_or(&[]) {
                rows.push(run_row(runs[j], depth + 1));
            }
            if let Some(kids) = children.get(&Some(i)) {
                stack.extend(kids.iter().rev().map(|&k| (k, depth + 1)));
            }
        }
    };
    visit(&mut stack, &mut rows);
    let rest: Vec<(usize, usize)> = (0..spans.len()).rev().map(|i| (i, 0)).collect();
    let mut rest = rest;
    visit(&mut rest, &mut rows);
    for j in loose {
        rows.push(run_row(runs[j], 0));
    }

    let mut h = String::new();
    let title = format!("{}/{}", d.agent, d.session);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Allox monitor: {}</title><style>{STYLE}</style></head><body>\n",
        esc(&title)
    );
    let _ = writeln!(
        h,
        "<h1>Session {}</h1><div class=\"meta\" id=\"meta\">{} turns · {} spans · {} runs · {} checkpoints · {} rollbacks · {} on the axis</div>",
        esc(&title),
        turns.len(),
        spans.len(),
        runs.len(),
        cps.len(),
        d.rollbacks.len(),
        ms_text((hi - lo) / 1000)
    );
    h.push_str("<div class=\"legend\"><span class=\"turn\" style=\"color:#222\">turn</span><span class=\"invoke_agent\">agent</span><span class=\"execute_tool\">tool</span><span class=\"chat\">model</span><span class=\"run\">run</span><span class=\"run failed\">failed run</span> <span style=\"color:#43a047\">┆ checkpoint</span> <span style=\"color:#e53935\">│ rollback</span></div>\n");
    h.push_str("<div class=\"wrap\"><div class=\"chart\" id=\"timeline\">\n");
    for r in &rows {
        let left = pos(r.start);
        let width = (pos(r.end) - left).max(0.15);
        let _ = writeln!(
            h,
            "<div class=\"row\"><div class=\"lbl\" style=\"padding-left:{}px\" title=\"{}\">{}</div><div class=\"lane\"><div class=\"bar {}\" data-kind=\"{}\" style=\"left:{left:.3}%;width:{width:.3}%\" title=\"{}\"></div></div></div>",
            4 + 12 * r.depth,
            esc(&r.detail),
            esc(&r.label),
            esc(&r.class),
            r.kind,
            esc(&r.detail)
        );
    }
    h.push_str("<div class=\"marks\">");
    for c in cps {
        let _ = write!(
            h,
            "<div class=\"mark checkpoint\" data-kind=\"checkpoint\" style=\"left:{:.3}%\" title=\"checkpoint {} ({:?}{})\"></div>",
            pos(c.created_ms * ms),
            esc(&c.checkpoint_id),
            c.origin,
            c.label.as_deref().map(|l| format!(", {}", esc(l))).unwrap_or_default()
        );
    }
    for (t, cp) in &d.rollbacks {
        let _ = write!(
            h,
            "<div class=\"mark rollback\" data-kind=\"rollback\" style=\"left:{:.3}%\" title=\"rollback to {}\"></div>",
            pos(t * ms),
            esc(cp)
        );
    }
    h.push_str("</div></div>\n<div class=\"side\">\n");
    summary_table(&mut h, "By tool", "tool", &d.by_tool);
    summary_table(&mut h, "By turn", "turn", &d.by_turn);
    h.push_str("</div></div>\n<h2 style=\"font-size:15px\">Runs</h2><table id=\"runs\"><tr><th>run</th><th>command</th><th>tool call</th><th>status</th><th>wall</th><th>CPU</th><th>memory peak</th><th>OOM</th></tr>\n");
    let span_name: HashMap<(&str, &str), String> = spans
        .iter()
        .map(|(sp, _)| {
            (
                (sp.trace_id.as_str(), sp.span_id.as_str()),
                sp.tool.clone().unwrap_or_else(|| sp.name.clone()),
            )
        })
        .collect();
    for r in &runs {
        let u = r.usage.clone().unwrap_or_default();
        let _ = writeln!(
            h,
            "<tr data-kind=\"run-row\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.run_id),
            esc(&r.argv.join(" ")),
            r.trace
                .as_ref()
                .and_then(|t| span_name.get(&(t.trace_id.as_str(), t.span_id.as_str())))
                .map(|n| esc(n))
                .unwrap_or_else(|| "–".into()),
            match (r.exit_code, r.signal) {
                (Some(c), _) => format!("exit {c}"),
                (None, Some(s)) => format!("signal {s}"),
                _ => "?".into(),
            },
            ms_text(r.end_unix_nano.saturating_sub(r.start_unix_nano) / 1000),
            ms_text(u.cpu_user_us.unwrap_or(0) + u.cpu_system_us.unwrap_or(0)),
            u.memory_peak_bytes.map(bytes_text).unwrap_or_else(|| "n/a".into()),
            match r.oom_killed {
                Some(true) => "killed",
                Some(false) => "–",
                None => "n/a",
            }
        );
    }
    h.push_str("</table>\n</body></html>\n");
    h
}

fn summary_table(h: &mut String, title: &str, key: &str, m: &MonitorSummary) {
    let _ = writeln!(
        h,
        "<h2 style=\"font-size:15px\">{title}</h2><table class=\"summary\" data-group=\"{key}\"><tr><th>{key}</th><th>calls</th><th>errors</th><th>time</th><th>p50</th><th>max</th><th>tokens in/out</th><th>runs</th><th>CPU</th><th>mem peak</th></tr>"
    );
    for r in &m.rows {
        let _ = writeln!(
            h,
            "<tr data-kind=\"summary-row\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.key),
            r.spans,
            r.errors,
            ms_text(r.total_us),
            ms_text(r.p50_us),
            ms_text(r.max_us),
            r.input_tokens,
            r.output_tokens,
            r.runs,
            ms_text(r.cpu_us),
            r.memory_peak_bytes
                .map(bytes_text)
                .unwrap_or_else(|| "n/a".into())
        );
    }
    h.push_str("</table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_text_is_escaped() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
