//! Spans and runs as one OTLP/JSON `ExportTraceServiceRequest`, for
//! observability tools.

use allox_protocol::{MonitorBody, MonitorRecord, Span, SpanOperation};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// An attribute: a key and its value.
fn attr(key: &str, v: Value) -> Value {
    json!({ "key": key, "value": v })
}

/// A string value.
fn s(v: &str) -> Value {
    json!({ "stringValue": v })
}

/// OTLP/JSON integers are strings.
fn int(v: u64) -> Value {
    json!({ "intValue": v.to_string() })
}

/// The records as one OTLP/JSON `ExportTraceServiceRequest`: a resource
/// per session (`allox.agent_id`, `allox.session_id`), spans with the
/// GenAI attributes, and each run as an internal span under the span of
/// its trace context (or a trace of its own) with what it used.
pub fn otlp(records: &[MonitorRecord]) -> Value {
    let mut by_session: BTreeMap<(&str, &str), Vec<Value>> = BTreeMap::new();
    for r in records {
        let spans = by_session.entry((&r.agent_id, &r.session_id)).or_default();
        match &r.body {
            MonitorBody::Span(sp) => spans.push(otlp_span(sp, &r.source)),
            MonitorBody::Run(run) => {
                let (trace_id, parent) = match &run.trace {
                    Some(t) => (t.trace_id.clone(), Some(t.span_id.clone())),
                    None => (format!("{:032x}", fnv(&run.run_id) as u128 | 1 << 64), None),
                };
                let mut attrs = vec![
                    attr("allox.run_id", s(&run.run_id)),
                    attr(
                        "process.command_args",
                        json!({"arrayValue": {"values":
                        run.argv.iter().map(|a| s(a)).collect::<Vec<_>>()}}),
                    ),
                ];
                if let Some(c) = run.exit_code {
                    attrs.push(attr("process.exit.code", int(c as u64)));
                }
                if let Some(sig) = run.signal {
                    attrs.push(attr("allox.signal", int(sig as u64)));
                }
                if let Some(o) = run.oom_killed {
                    attrs.push(attr("allox.oom_killed", json!({ "boolValue": o })));
                }
                if let Some(u) = &run.usage {
                    for (k, v) in [
                        ("allox.cpu_user_us", u.cpu_user_us),
                        ("allox.cpu_system_us", u.cpu_system_us),
                        ("allox.memory_peak_bytes", u.memory_peak_bytes),
                        ("allox.io_read_bytes", u.io_read_bytes),
                        ("allox.io_write_bytes", u.io_write_bytes),
                    ] {
                        if let Some(v) = v {
                            attrs.push(attr(k, int(v)));
                        }
                    }
                }
                let failed = run.exit_code != Some(0);
                let mut span = json!({
                    "traceId": trace_id,
                    "spanId": format!("{:016x}", fnv(&run.run_id) | 1),
                    "name": format!("process {}", run.argv.first().map(String::as_str).unwrap_or("")),
                    "kind": 1,
                    "startTimeUnixNano": run.start_unix_nano.to_string(),
                    "endTimeUnixNano": run.end_unix_nano.to_string(),
                    "attributes": attrs,
                    "status": { "code": if failed { 2 } else { 1 } },
                });
                if let Some(p) = parent {
                    span["parentSpanId"] = json!(p);
                }
                spans.push(span);
            }
        }
    }
    let resource_spans: Vec<Value> = by_session
        .into_iter()
        .map(|((a, s_), spans)| {
            json!({
                "resource": { "attributes": [
                    attr("service.name", s("allox")),
                    attr("allox.agent_id", s(a)),
                    attr("allox.session_id", s(s_)),
                ]},
                "scopeSpans": [{
                    "scope": { "name": "allox.monitor", "version": env!("CARGO_PKG_VERSION") },
                    "spans": spans,
                }],
            })
        })
        .collect();
    json!({ "resourceSpans": resource_spans })
}

fn otlp_span(sp: &Span, source: &str) -> Value {
    let mut attrs = vec![
        attr("gen_ai.operation.name", s(sp.operation.as_str())),
        attr("allox.source", s(source)),
    ];
    if let Some(t) = &sp.tool {
        attrs.push(attr("gen_ai.tool.name", s(t)));
    }
    if let Some(m) = &sp.model {
        attrs.push(attr("gen_ai.request.model", s(m)));
    }
    if let Some(n) = sp.input_tokens {
        attrs.push(attr("gen_ai.usage.input_tokens", int(n)));
    }
    if let Some(n) = sp.output_tokens {
        attrs.push(attr("gen_ai.usage.output_tokens", int(n)));
    }
    for (k, v) in &sp.attributes {
        attrs.push(attr(k, s(v)));
    }
    // CLIENT for model calls, INTERNAL otherwise.
    let kind = if sp.operation == SpanOperation::Chat {
        3
    } else {
        1
    };
    let mut v = json!({
        "traceId": sp.trace_id,
        "spanId": sp.span_id,
        "name": sp.name,
        "kind": kind,
        "startTimeUnixNano": sp.start_unix_nano.to_string(),
        "endTimeUnixNano": sp.end_unix_nano.to_string(),
        "attributes": attrs,
        "status": match &sp.error {
            Some(e) => json!({ "code": 2, "message": e }),
            None => json!({ "code": 1 }),
        },
    });
    if let Some(p) = &sp.parent_span_id {
        v["parentSpanId"] = json!(p);
    }
    v
}

/// A stable 64-bit hash (FNV-1a), for ids derived from run ids.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_become_spans_under_their_tool_call() {
        let r = MonitorRecord {
            seq: 1,
            time_ms: 0,
            agent_id: "a".into(),
            session_id: "s".into(),
            source: "host".into(),
            body: MonitorBody::Run(allox_protocol::MonitorRun {
                run_id: "7".into(),
                argv: vec!["echo".into(), "hi".into()],
                trace: Some(allox_protocol::TraceContext {
                    trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
                    span_id: "b7ad6b7169203331".into(),
                }),
                start_unix_nano: 5,
                end_unix_nano: 9,
                exit_code: Some(0),
                signal: None,
                timed_out: false,
                oom_killed: Some(false),
                usage: Some(allox_protocol::Usage {
                    cpu_user_us: Some(12),
                    ..Default::default()
                }),
            }),
        };
        let v = otlp(&[r]);
        let sp = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(sp["parentSpanId"], "b7ad6b7169203331");
        assert_eq!(sp["traceId"], "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(sp["name"], "process echo");
        assert!(sp["attributes"]
            .as_array()
            .unwrap()
            .contains(&attr("allox.cpu_user_us", int(12))));
    }
}
