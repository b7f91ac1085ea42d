//! The monitor plugin (`--monitor-root`) through the real daemon, real
//! sandboxes and a real Btrfs store: spans from the host and from inside a
//! sandbox, runs under the tool call of their trace context, summaries
//! against a brute-force recomputation, the OTLP export, and the HTML
//! report rendered in headless Chromium.

use allox_integration::{
    alloxctl, call, make_sessions, process_start as start, require, ProcDaemon,
};
use allox_protocol::*;
use std::collections::BTreeMap;
use std::path::PathBuf;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn setup(name: &str, extra: &[&str]) -> Option<ProcDaemon> {
    if !require(&format!("traces::{name}")) {
        return None;
    }
    if allox_integration::cgroup2_mount().is_none() {
        panic!("traces::{name} needs a cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified)");
    }
    let d = ProcDaemon::start(name, extra);
    make_sessions(&d, &[("a", "s"), ("a", "t"), ("b", "u")]);
    Some(d)
}

/// A daemon whose monitor keeps its records in `<scratch>/monitor`.
fn with_monitor(name: &str) -> Option<(ProcDaemon, PathBuf)> {
    if !require(&format!("traces::{name}")) {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("allox-monitor-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = setup(name, &["--monitor-root", dir.to_str().unwrap()])?;
    Some((d, dir))
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn span_id(n: u64) -> String {
    format!("{:016x}", 0x1000_0000_0000_0000u64 + n)
}

fn span(n: u64, op: SpanOperation, what: Option<&str>, start: u64, us: u64) -> Span {
    Span {
        trace_id: TRACE.into(),
        span_id: span_id(n),
        parent_span_id: None,
        name: format!("{} {}", op.as_str(), what.unwrap_or("")),
        operation: op,
        start_unix_nano: start,
        end_unix_nano: start + us * 1000,
        tool: what
            .filter(|_| op == SpanOperation::ExecuteTool)
            .map(str::to_string),
        model: what
            .filter(|_| op == SpanOperation::Chat)
            .map(str::to_string),
        input_tokens: (op == SpanOperation::Chat).then_some(100 + n),
        output_tokens: (op == SpanOperation::Chat).then_some(10 + n),
        error: None,
        attributes: Default::default(),
    }
}

fn ingest(
    d: &ProcDaemon,
    a: &str,
    s: &str,
    spans: Vec<Span>,
) -> Result<MonitorIngested, ErrorBody> {
    call(
        d,
        Request::MonitorIngest(MonitorIngest {
            agent_id: a.into(),
            session_id: s.into(),
            spans,
        }),
    )
    .map(|r| match r {
        Response::MonitorIngested(i) => i,
        other => panic!("{other:?}"),
    })
}

fn records(d: &ProcDaemon, q: MonitorRecords) -> Vec<MonitorRecord> {
    let mut out = Vec::new();
    let mut q = MonitorRecords {
        limit: Some(10_000),
        ..q
    };
    loop {
        let page = match call(d, Request::MonitorRecords(q.clone())) {
            Ok(Response::MonitorRecords(l)) => l,
            other => panic!("{other:?}"),
        };
        if page.records.is_empty() && page.next_cursor == q.cursor.unwrap_or(0) {
            return out;
        }
        out.extend(page.records);
        q.cursor = Some(page.next_cursor);
    }
}

fn of_session(a: &str, s: &str) -> MonitorRecords {
    MonitorRecords {
        agent_id: Some(a.into()),
        session_id: Some(s.into()),
        ..Default::default()
    }
}

fn sh(d: &ProcDaemon, who: (&str, &str), script: &str) -> RunResult {
    match call(
        d,
        Request::ProcessStart(start(who.0, who.1, &["/bin/sh", "-c", script])),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{script}: {other:?}"),
    }
}

fn traced(d: &ProcDaemon, who: (&str, &str), span: &str, argv: &[&str]) -> RunResult {
    match call(
        d,
        Request::ProcessStart(ProcessStart {
            trace: Some(Box::new(TraceContext {
                trace_id: TRACE.into(),
                span_id: span.into(),
            })),
            ..start(who.0, who.1, argv)
        }),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{argv:?}: {other:?}"),
    }
}

#[test]
fn spans_sent_from_inside_a_sandbox_belong_to_its_session_whatever_they_claim() {
    let Some((d, dir)) =
        with_monitor("spans_sent_from_inside_a_sandbox_belong_to_its_session_whatever_they_claim")
    else {
        return;
    };
    // The span claims another session, in the request and in its
    // attributes.
    let t0 = now_ns();
    let params = serde_json::json!({
        "agent_id": "b", "session_id": "u",
        "spans": [{
            "trace_id": TRACE, "span_id": span_id(1), "name": "call bash",
            "operation": "execute_tool", "tool": "bash",
            "start_unix_nano": t0, "end_unix_nano": t0 + 5_000_000,
            "attributes": {"allox.agent_id": "b", "allox.session_id": "u"}
        }]
    });
    let r = sh(
        &d,
        ("a", "s"),
        &format!("allox call monitor.spans '{params}'"),
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let answer: serde_json::Value = serde_json::from_str(&r.stdout).expect("a JSON answer");
    assert_eq!(answer["accepted"], 1, "{r:?}");
    // Two records of a/s: the span, then the run that sent it.
    let mine = records(&d, of_session("a", "s"));
    assert_eq!(mine.len(), 2, "{mine:?}");
    let MonitorBody::Span(sp) = &mine[0].body else {
        panic!("{mine:?}")
    };
    assert_eq!(sp.tool.as_deref(), Some("bash"));
    let MonitorBody::Run(run) = &mine[1].body else {
        panic!("{mine:?}")
    };
    // The span names the run it came from, and that run is a run of a/s.
    assert_eq!(mine[0].source, format!("run:{}", run.run_id), "{mine:?}");
    assert_eq!(run.run_id, r.run_id);
    // It arrived while that run ran.
    let (from, to) = (
        run.start_unix_nano / 1_000_000,
        run.end_unix_nano / 1_000_000,
    );
    assert!((from..=to).contains(&mine[0].time_ms), "{mine:?}");
    // Nothing reached the sessions it claimed, or any other.
    for (a, s) in [("b", "u"), ("a", "t")] {
        assert!(records(&d, of_session(a, s)).is_empty(), "{a}/{s}");
    }
    // Only the span and the run that sent it are recorded, nothing else.
    let all = records(&d, MonitorRecords::default());
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all
        .iter()
        .all(|r| (r.agent_id.as_str(), r.session_id.as_str()) == ("a", "s")));
    // A bad span is refused whole, naming what is wrong.
    let bad = serde_json::json!({"spans": [
        {"trace_id": TRACE, "span_id": span_id(2), "name": "ok", "operation": "other",
         "start_unix_nano": 1, "end_unix_nano": 2},
        {"trace_id": "xyz", "span_id": span_id(3), "name": "bad", "operation": "other",
         "start_unix_nano": 1, "end_unix_nano": 2}
    ]});
    let r = sh(&d, ("a", "t"), &format!("allox call monitor.spans '{bad}'"));
    assert_eq!(r.exit_code, Some(1), "{r:?}");
    assert!(
        r.stderr.contains("invalid_request") && r.stderr.contains("trace_id \"xyz\""),
        "{r:?}"
    );
    let ends_before = serde_json::json!({"spans": [
        {"trace_id": TRACE, "span_id": span_id(2), "name": "x", "operation": "other",
         "start_unix_nano": 9, "end_unix_nano": 2}]});
    let r = sh(
        &d,
        ("a", "t"),
        &format!("allox call monitor.spans '{ends_before}'"),
    );
    assert!(r.stderr.contains("is before start_unix_nano"), "{r:?}");
    assert!(
        records(&d, of_session("a", "t"))
            .iter()
            .all(|r| matches!(r.body, MonitorBody::Run(_))),
        "a refused span was kept"
    );
    // The host's ingest names the session; a missing one is not_found.
    let e = ingest(
        &d,
        "a",
        "nope",
        vec![span(4, SpanOperation::Other, None, t0, 1)],
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e:?}");
    let i = ingest(
        &d,
        "b",
        "u",
        vec![span(4, SpanOperation::Other, None, t0, 1)],
    )
    .unwrap();
    assert_eq!(i.accepted, 1);
    let u = records(&d, of_session("b", "u"));
    assert_eq!((u.len(), u[0].source.as_str()), (1, "host"));
    // Kept in the monitor's directory, outside every workspace.
    let file = dir.join("records.log");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("call bash"), "{text}");
    let r = sh(
        &d,
        ("a", "s"),
        "grep -rl 'call bash' $HOME $ALLOX_AGENT_SHARED 2>/dev/null; true",
    );
    assert_eq!(r.stdout, "", "spans leaked into a workspace");
    // A session deleted and made again does not inherit the old records.
    call(
        &d,
        Request::SessionDelete(SessionDelete {
            agent_id: "b".into(),
            session_id: "u".into(),
            force: true,
        }),
    )
    .unwrap();
    make_sessions(&d, &[("b", "u")]);
    assert!(records(&d, of_session("b", "u")).is_empty());
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn runs_started_with_a_trace_context_appear_under_their_span_with_their_resources() {
    let Some((d, dir)) = with_monitor(
        "runs_started_with_a_trace_context_appear_under_their_span_with_their_resources",
    ) else {
        return;
    };
    if allox_integration::which("python3").is_none() {
        panic!("traces needs python3 (its CPU burner)");
    }
    let t0 = now_ns();
    let tool = span_id(10);
    ingest(
        &d,
        "a",
        "s",
        vec![
            span(9, SpanOperation::InvokeAgent, None, t0, 2_000_000),
            Span {
                parent_span_id: Some(span_id(9)),
                ..span(
                    10,
                    SpanOperation::ExecuteTool,
                    Some("python"),
                    t0,
                    1_500_000,
                )
            },
            Span {
                parent_span_id: Some(span_id(9)),
                ..span(11, SpanOperation::Chat, Some("m-small"), t0, 700_000)
            },
        ],
    )
    .unwrap();
    let burn =
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\n";
    let r1 = traced(&d, ("a", "s"), &tool, &["python3", "-c", burn]);
    assert_eq!(r1.exit_code, Some(0), "{r1:?}");
    // The run sees the context as TRACEPARENT.
    let r2 = traced(
        &d,
        ("a", "s"),
        &tool,
        &["/bin/sh", "-c", "echo $TRACEPARENT"],
    );
    assert_eq!(r2.stdout.trim(), format!("00-{TRACE}-{tool}-01"));
    let plain = sh(&d, ("a", "s"), "echo ${TRACEPARENT:-none}");
    assert_eq!(plain.stdout.trim(), "none");
    // Both runs are recorded under the tool's span with what they used.
    let under: Vec<MonitorRun> = records(
        &d,
        MonitorRecords {
            trace_id: Some(TRACE.into()),
            ..of_session("a", "s")
        },
    )
    .into_iter()
    .filter_map(|r| match r.body {
        MonitorBody::Run(run) => Some(run),
        _ => None,
    })
    .collect();
    assert_eq!(under.len(), 2, "{under:?}");
    let first = under
        .iter()
        .find(|r| r.run_id == r1.run_id)
        .expect("the burner");
    assert_eq!(first.trace.as_ref().unwrap().span_id, tool);
    assert_eq!(first.argv[0], "python3");
    assert_eq!(first.usage, r1.usage, "the record's usage is the result's");
    let cpu = first
        .usage
        .as_ref()
        .map(|u| u.cpu_user_us.unwrap() + u.cpu_system_us.unwrap());
    assert!(cpu.unwrap() >= 250_000, "{first:?}");
    assert!(first.end_unix_nano > first.start_unix_nano);
    // The summary puts them under the tool, none under the model.
    let sum = match call(
        &d,
        Request::MonitorSummary(MonitorSummaryRequest {
            agent_id: Some("a".into()),
            session_id: Some("s".into()),
            group_by: GroupBy::Tool,
        }),
    ) {
        Ok(Response::MonitorSummary(m)) => m,
        other => panic!("{other:?}"),
    };
    assert_eq!(sum.rows.len(), 1, "{sum:?}");
    assert_eq!((sum.rows[0].key.as_str(), sum.rows[0].runs), ("python", 2));
    assert!(sum.rows[0].cpu_us >= cpu.unwrap(), "{sum:?}");
    assert_eq!(sum.runs, 3, "the untraced run is looked at too: {sum:?}");
    // alloxctl exec --trace does the same; a bad context is refused
    // before anything runs.
    let (code, out, err) = alloxctl(
        &d.daemon.socket,
        &[
            "exec",
            "a",
            "s",
            "--trace",
            &format!("{TRACE}:{tool}"),
            "--",
            "/bin/sh",
            "-c",
            "echo $TRACEPARENT",
        ],
    );
    assert_eq!(
        (code, String::from_utf8_lossy(&out).trim()),
        (0, format!("00-{TRACE}-{tool}-01").as_str()),
        "{err}"
    );
    let e = call(
        &d,
        Request::ProcessStart(ProcessStart {
            trace: Some(Box::new(TraceContext {
                trace_id: TRACE.into(),
                span_id: "0000000000000000".into(),
            })),
            ..start("a", "s", &["/bin/sh", "-c", "touch $HOME/ran"])
        }),
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest);
    assert!(e.message.contains("span_id"), "{e:?}");
    assert_eq!(sh(&d, ("a", "s"), "test -e $HOME/ran").exit_code, Some(1));
    let (code, _, err) = alloxctl(
        &d.daemon.socket,
        &["exec", "a", "s", "--trace", "nope", "--", "true"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("TRACE_ID:SPAN_ID"), "{err}");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The brute-force summary: for each key, every record looked at again.
fn brute(
    recs: &[MonitorRecord],
    by: GroupBy,
    turns: &BTreeMap<(String, String), Vec<TurnInfo>>,
    one_session: bool,
) -> Vec<SummaryRow> {
    let turn_of = |r: &MonitorRecord, ns: u64| -> String {
        let ms = ns / 1_000_000;
        let mut best: Option<&TurnInfo> = None;
        for t in &turns[&(r.agent_id.clone(), r.session_id.clone())] {
            let inside = t.began_ms <= ms && t.ended_ms.map(|e| ms <= e).unwrap_or(true);
            if inside && best.map(|b| t.number > b.number).unwrap_or(true) {
                best = Some(t);
            }
        }
        let id = best
            .map(|t| t.turn_id.clone())
            .unwrap_or_else(|| "-".into());
        if one_session {
            id
        } else {
            format!("{}/{}/{id}", r.agent_id, r.session_id)
        }
    };
    let key_of_span = |r: &MonitorRecord, sp: &Span| -> Option<String> {
        match by {
            GroupBy::Tool if sp.operation == SpanOperation::ExecuteTool => {
                Some(sp.tool.clone().unwrap_or(sp.name.clone()))
            }
            GroupBy::Model if sp.operation == SpanOperation::Chat => {
                Some(sp.model.clone().unwrap_or("-".into()))
            }
            GroupBy::Turn => Some(turn_of(r, sp.start_unix_nano)),
            _ => None,
        }
    };
    let key_of_run = |r: &MonitorRecord, run: &MonitorRun| -> Option<String> {
        if by == GroupBy::Turn {
            return Some(turn_of(r, run.start_unix_nano));
        }
        let t = run.trace.as_ref()?;
        recs.iter().find_map(|o| match &o.body {
            MonitorBody::Span(sp)
                if o.agent_id == r.agent_id
                    && o.session_id == r.session_id
                    && sp.trace_id == t.trace_id
                    && sp.span_id == t.span_id =>
            {
                key_of_span(o, sp)
            }
            _ => None,
        })
    };
    let mut keys: Vec<String> = Vec::new();
    for r in recs {
        let k = match &r.body {
            MonitorBody::Span(sp) => key_of_span(r, sp),
            MonitorBody::Run(run) => key_of_run(r, run),
        };
        if let Some(k) = k {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let mut row = SummaryRow {
                key: k.clone(),
                ..Default::default()
            };
            let mut ds = Vec::new();
            for r in recs {
                match &r.body {
                    MonitorBody::Span(sp) if key_of_span(r, sp).as_deref() == Some(&k) => {
                        row.spans += 1;
                        row.errors += sp.error.is_some() as u64;
                        ds.push((sp.end_unix_nano - sp.start_unix_nano) / 1000);
                        row.input_tokens += sp.input_tokens.unwrap_or(0);
                        row.output_tokens += sp.output_tokens.unwrap_or(0);
                    }
                    MonitorBody::Run(run) if key_of_run(r, run).as_deref() == Some(&k) => {
                        row.runs += 1;
                        let u = run.usage.clone().unwrap_or_default();
                        row.cpu_us += u.cpu_user_us.unwrap_or(0) + u.cpu_system_us.unwrap_or(0);
                        row.memory_peak_bytes = row.memory_peak_bytes.max(u.memory_peak_bytes);
                        row.oom_kills += u.oom_kills.unwrap_or(0);
                    }
                    _ => {}
                }
            }
            ds.sort();
            row.total_us = ds.iter().sum();
            row.max_us = ds.last().copied().unwrap_or(0);
            // The lower median: the ⌈n/2⌉-th shortest.
            row.p50_us = if ds.is_empty() {
                0
            } else {
                ds[ds.len().div_ceil(2) - 1]
            };
            row
        })
        .collect()
}

#[test]
fn summaries_equal_a_brute_force_recomputation_from_the_stored_spans_and_runs() {
    let Some((d, dir)) =
        with_monitor("summaries_equal_a_brute_force_recomputation_from_the_stored_spans_and_runs")
    else {
        return;
    };
    // A pseudo-random mix, over turns of two sessions of agent a and one
    // of agent b.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let tools = ["bash", "python", "edit", "search"];
    let models = ["m-large", "m-small"];
    let mut next = 100;
    let mut tool_spans: Vec<((&str, &str), String)> = Vec::new();
    for turn in 0..3 {
        for who in [("a", "s"), ("a", "t"), ("b", "u")] {
            let t = call(
                &d,
                Request::TurnBegin(TurnBegin {
                    agent_id: who.0.into(),
                    session_id: who.1.into(),
                    turn_id: Some(format!("turn-{turn}")),
                }),
            );
            assert!(t.is_ok(), "{t:?}");
            let t0 = now_ns();
            let mut spans = Vec::new();
            for _ in 0..(20 + rnd(30)) {
                next += 1;
                let op = match rnd(4) {
                    0 => SpanOperation::Chat,
                    1 => SpanOperation::Other,
                    _ => SpanOperation::ExecuteTool,
                };
                let what = match op {
                    SpanOperation::Chat => Some(models[rnd(2) as usize]),
                    SpanOperation::ExecuteTool => Some(tools[rnd(4) as usize]),
                    _ => None,
                };
                let mut sp = span(next, op, what, t0 + rnd(1_000_000), 1 + rnd(50_000));
                if rnd(10) == 0 {
                    sp.error = Some("failed".into());
                }
                if op == SpanOperation::ExecuteTool && rnd(3) == 0 {
                    // Some tool spans name no tool: their name counts.
                    sp.tool = None;
                }
                if op == SpanOperation::ExecuteTool {
                    tool_spans.push((who, sp.span_id.clone()));
                }
                spans.push(sp);
            }
            ingest(&d, who.0, who.1, spans).unwrap();
            // Real runs under some tool spans of this turn, and one
            // under no span at all.
            for _ in 0..2 {
                let (w, id) = tool_spans[rnd(tool_spans.len() as u64) as usize].clone();
                if w == who {
                    let r = traced(
                        &d,
                        who,
                        &id,
                        &[
                            "/bin/sh",
                            "-c",
                            "i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done",
                        ],
                    );
                    assert_eq!(r.exit_code, Some(0), "{r:?}");
                }
            }
            let r = traced(&d, who, &span_id(999_999), &["true"]);
            assert_eq!(r.exit_code, Some(0));
            call(
                &d,
                Request::TurnEnd(TurnEnd {
                    agent_id: who.0.into(),
                    session_id: who.1.into(),
                    turn_id: format!("turn-{turn}"),
                    status: TurnStatus::Ok,
                    label: None,
                }),
            )
            .unwrap();
        }
    }
    // A run outside every turn, and spans that start before the first.
    sh(&d, ("a", "s"), "true");
    ingest(
        &d,
        "a",
        "s",
        vec![span(5, SpanOperation::ExecuteTool, Some("bash"), 1_000, 10)],
    )
    .unwrap();
    let mut turns = BTreeMap::new();
    for (a, s) in [("a", "s"), ("a", "t"), ("b", "u")] {
        let tl = match call(
            &d,
            Request::MonitorTimeline(MonitorTimelineRequest {
                agent_id: a.into(),
                session_id: s.into(),
            }),
        ) {
            Ok(Response::MonitorTimeline(t)) => t,
            other => panic!("{other:?}"),
        };
        assert_eq!(tl.turns.len(), 3, "{tl:?}");
        turns.insert((a.to_string(), s.to_string()), tl.turns);
    }
    let mut compared = 0;
    for (agent, session) in [(Some("a"), Some("s")), (Some("a"), None), (None, None)] {
        let q = MonitorRecords {
            agent_id: agent.map(str::to_string),
            session_id: session.map(str::to_string),
            ..Default::default()
        };
        let recs = records(&d, q);
        assert!(recs.len() > 30, "{}", recs.len());
        for by in [GroupBy::Tool, GroupBy::Model, GroupBy::Turn] {
            let got = match call(
                &d,
                Request::MonitorSummary(MonitorSummaryRequest {
                    agent_id: agent.map(str::to_string),
                    session_id: session.map(str::to_string),
                    group_by: by,
                }),
            ) {
                Ok(Response::MonitorSummary(m)) => m,
                other => panic!("{other:?}"),
            };
            let want = brute(&recs, by, &turns, session.is_some());
            assert_eq!(got.rows, want, "{agent:?}/{session:?} by {by:?}");
            let spans = recs
                .iter()
                .filter(|r| matches!(r.body, MonitorBody::Span(_)))
                .count();
            assert_eq!(got.spans as usize, spans);
            assert_eq!(got.runs as usize, recs.len() - spans);
            assert!(
                got.rows.iter().any(|r| r.runs > 0) || by == GroupBy::Model,
                "{got:?}"
            );
            compared += got.rows.len();
        }
    }
    assert!(compared > 20, "{compared} rows compared");
    // The same through alloxctl.
    let (code, out, err) = alloxctl(
        &d.daemon.socket,
        &["monitor", "summary", "a", "s", "--by", "turn"],
    );
    let out = String::from_utf8_lossy(&out);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("TURN") && out.contains("turn-2"), "{out}");
    // The OTLP export: every span, and every run as a span of its own.
    let (code, out, err) = alloxctl(&d.daemon.socket, &["monitor", "export", "a"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let rs = v["resourceSpans"].as_array().unwrap();
    assert_eq!(rs.len(), 2, "one resource per session of agent a");
    let n: usize = rs
        .iter()
        .map(|r| r["scopeSpans"][0]["spans"].as_array().unwrap().len())
        .sum();
    let of_a = records(
        &d,
        MonitorRecords {
            agent_id: Some("a".into()),
            ..Default::default()
        },
    );
    assert_eq!(n, of_a.len());
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_report_renders_in_chromium_with_the_session_s_runs_turns_and_rollbacks() {
    let Some((d, dir)) =
        with_monitor("the_report_renders_in_chromium_with_the_session_s_runs_turns_and_rollbacks")
    else {
        return;
    };
    let browser = allox_integration::chromium("traces::the_report");
    // Two turns; the first with a tool call that runs twice and a model
    // call, the second with a failing run; a checkpoint and a rollback.
    let mut spans = 0;
    let mut runs = 0;
    for (turn, fail) in [("turn-1", false), ("turn-2", true)] {
        call(
            &d,
            Request::TurnBegin(TurnBegin {
                agent_id: "a".into(),
                session_id: "s".into(),
                turn_id: Some(turn.into()),
            }),
        )
        .unwrap();
        // The work first, then its spans, as a framework exports them:
        // a model call, then the tool call whose runs follow.
        let t0 = now_ns();
        let id = 20 + spans;
        std::thread::sleep(std::time::Duration::from_millis(30));
        let t1 = now_ns();
        let script = if fail {
            "echo '<b>bold</b>'; exit 3"
        } else {
            "echo 'x' > $HOME/f.txt"
        };
        let r = traced(&d, ("a", "s"), &span_id(id + 1), &["/bin/sh", "-c", script]);
        assert_eq!(r.exit_code, Some(if fail { 3 } else { 0 }));
        runs += 1;
        if !fail {
            traced(&d, ("a", "s"), &span_id(id + 1), &["true"]);
            runs += 1;
        }
        let t2 = now_ns();
        ingest(
            &d,
            "a",
            "s",
            vec![
                span(
                    id,
                    SpanOperation::Chat,
                    Some("m-large"),
                    t0,
                    (t1 - t0) / 1000,
                ),
                span(
                    id + 1,
                    SpanOperation::ExecuteTool,
                    Some("bash"),
                    t1,
                    (t2 - t1) / 1000,
                ),
            ],
        )
        .unwrap();
        spans += 2;
        call(
            &d,
            Request::TurnEnd(TurnEnd {
                agent_id: "a".into(),
                session_id: "s".into(),
                turn_id: turn.into(),
                status: TurnStatus::Ok,
                label: None,
            }),
        )
        .unwrap();
    }
    call(
        &d,
        Request::CheckpointCreate(CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "before-undo".into(),
            pinned: false,
            label: None,
        }),
    )
    .unwrap();
    call(
        &d,
        Request::SessionRollback(SessionRollback {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "before-undo".into(),
            kill_processes: None,
        }),
    )
    .unwrap();
    // Another session's runs are not in the report.
    sh(&d, ("a", "t"), "true");
    let out = allox_integration::artifacts_dir().join("monitor-report.html");
    let (code, text, err) = alloxctl(
        &d.daemon.socket,
        &[
            "monitor",
            "report",
            "a",
            "s",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        String::from_utf8_lossy(&text).contains("written to"),
        "{err}"
    );
    let html = std::fs::read_to_string(&out).unwrap();
    // Self-contained: nothing is fetched.
    for needle in ["http://", "https://", "<script", "<link"] {
        assert!(!html.contains(needle), "the page refers to {needle}");
    }
    // What the browser sees.
    let profile = tempfile::tempdir().unwrap();
    let url = format!("file://{}", out.display());
    let dom =
        allox_integration::headless("traces::the_report", &["--dump-dom", &url], profile.path());
    assert!(
        dom.status.success(),
        "{} --dump-dom: {}",
        browser.display(),
        String::from_utf8_lossy(&dom.stderr)
    );
    let dom = String::from_utf8_lossy(&dom.stdout).into_owned();
    let count = |kind: &str| dom.matches(&format!("data-kind=\"{kind}\"")).count();
    assert_eq!(count("turn"), 2, "{dom}");
    assert_eq!(count("run"), runs as usize, "{dom}");
    assert_eq!(count("run-row"), runs as usize, "{dom}");
    assert_eq!(count("span"), spans as usize, "{dom}");
    assert_eq!(count("rollback"), 1, "{dom}");
    // Two turn checkpoints (if the policy takes them) and the manual one.
    assert!(count("checkpoint") >= 1, "{dom}");
    assert!(
        dom.contains("&lt;b&gt;bold&lt;/b&gt;") && !dom.contains("<b>bold</b>"),
        "unescaped output"
    );
    assert!(
        dom.contains("class=\"bar run failed\""),
        "the failed run is not marked"
    );
    assert!(
        dom.contains("data-group=\"tool\"") && dom.contains(">bash<"),
        "no summary by tool"
    );
    // A screenshot, kept as the test's artifact.
    let png = allox_integration::artifacts_dir().join("monitor-report.png");
    let _ = std::fs::remove_file(&png);
    let shot = allox_integration::headless(
        "traces::the_report",
        &[
            "--hide-scrollbars",
            "--window-size=1400,700",
            &format!("--screenshot={}", png.display()),
            &url,
        ],
        profile.path(),
    );
    assert!(
        shot.status.success(),
        "{}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let bytes = std::fs::read(&png).expect("the screenshot");
    assert!(
        bytes.len() > 10_000 && bytes.starts_with(b"\x89PNG"),
        "{} bytes",
        bytes.len()
    );
    eprintln!("traces: report screenshot kept at {}", png.display());
    // A session without a monitor record still has a report; a missing
    // one is an error naming it.
    let (code, _, err) = alloxctl(
        &d.daemon.socket,
        &["monitor", "report", "a", "nope", "--out", "/dev/null"],
    );
    assert_eq!(code, 1);
    assert!(err.contains("not_found") && err.contains("nope"), "{err}");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn with_the_monitor_off_the_sandbox_is_unchanged_and_its_actions_say_how_to_enable_it() {
    let Some(off) = setup(
        "with_the_monitor_off_the_sandbox_is_unchanged_and_its_actions_say_how_to_enable_it",
        &[],
    ) else {
        return;
    };
    let Some((on, dir)) = with_monitor("monitor_plugin_on") else {
        return;
    };
    let view = "awk '{print $5, $6}' /proc/self/mountinfo; env | grep -v '^ALLOX_RUN_ID=' | sort; ls /run/allox";
    let without = sh(&off, ("a", "s"), view);
    let with = sh(&on, ("a", "s"), view);
    assert_eq!(without.exit_code, Some(0), "{without:?}");
    assert_eq!(without.stdout, with.stdout);
    // Off: the actions name the flag; the guest route does not exist.
    let e = call(
        &off,
        Request::MonitorSummary(MonitorSummaryRequest::default()),
    )
    .unwrap_err();
    assert!(
        e.message.contains("monitor") && e.message.contains("--monitor-root"),
        "{e:?}"
    );
    let r = sh(
        &off,
        ("a", "s"),
        "allox call monitor.spans '{\"spans\": []}'",
    );
    assert_eq!(r.exit_code, Some(1));
    assert!(
        r.stderr.contains("no plugin owns route \"monitor.spans\""),
        "{r:?}"
    );
    // A trace context is still handed to the run; nothing is recorded.
    let r = traced(
        &off,
        ("a", "s"),
        &span_id(1),
        &["/bin/sh", "-c", "echo $TRACEPARENT"],
    );
    assert_eq!(r.stdout.trim(), format!("00-{TRACE}-{}-01", span_id(1)));
    assert!(!off.daemon.root.join("state/monitor").exists());
    drop(on);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_record_file_is_bounded_and_keeps_the_newest() {
    if !require("traces::the_record_file_is_bounded_and_keeps_the_newest") {
        return;
    }
    let Some(d) = setup(
        "the_record_file_is_bounded_and_keeps_the_newest",
        &["--plugin", "monitor", "--monitor-records-max", "100"],
    ) else {
        return;
    };
    let t0 = now_ns();
    for batch in 0..10u64 {
        let spans = (0..100)
            .map(|i| span(batch * 100 + i, SpanOperation::Other, None, t0, 1))
            .collect();
        let i = ingest(&d, "a", "s", spans).unwrap();
        assert_eq!(
            (i.first_seq, i.last_seq),
            (batch * 100 + 1, batch * 100 + 100)
        );
    }
    let all = records(&d, of_session("a", "s"));
    assert!((100..=150).contains(&all.len()), "{} kept", all.len());
    assert_eq!(all.last().unwrap().seq, 1000);
    assert!(
        all.windows(2).all(|w| w[1].seq == w[0].seq + 1),
        "a gap among the kept"
    );
    // Without --monitor-root, in the store's state/.
    let file = d.daemon.root.join("state/monitor/records.log");
    let lines = std::fs::read_to_string(&file).unwrap().lines().count();
    assert_eq!(lines, all.len());
    // A request over the limit is refused whole.
    let many = (0..4097)
        .map(|i| span(i, SpanOperation::Other, None, t0, 1))
        .collect();
    let e = ingest(&d, "a", "s", many).unwrap_err();
    assert!(e.message.contains("4097 spans in one request"), "{e:?}");
}

/// Spans sent on a disk an agent filled are recorded, or refused
/// `unavailable` saying none was kept: never answered as a success of
/// none (`accepted: 0`, exit 0, before).
#[test]
fn spans_that_cannot_be_recorded_are_refused_not_answered_as_none() {
    let Some(d) = setup("spans_that_cannot_be_recorded", &["--plugin", "monitor"]) else {
        return;
    };
    allox_integration::fill_disk(&d.daemon.root.join("agents/b/workspace/sessions/u/current"));
    let start = now_ns();
    let spans: Vec<Span> = (0..3)
        .map(|n| span(n, SpanOperation::ExecuteTool, Some("t"), start, 10))
        .collect();
    match ingest(&d, "a", "s", spans) {
        Ok(i) => assert_eq!(i.accepted, 3, "{i:?}"),
        Err(e) => {
            assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
            assert!(e.message.contains("none was kept"), "{e:?}");
        }
    }
}
