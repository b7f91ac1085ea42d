//! The monitor's costs: what reading a run's cgroup at its end costs a
//! spawn (`process.start` of `/bin/true` to its result, with and without
//! `--no-run-usage`, and with the monitor plugin on, in alternating blocks
//! on three daemons); `session.stats`; and the span ingestion rate of
//! `monitor.ingest` over the Unix socket, by batch size.

use allox_integration::BtrfsFs;
use allox_protocol::{
    AgentCreate, MonitorIngest, Request, SessionCreate, SessionStatsRequest, Span, SpanOperation,
};
use std::time::{Duration, Instant};

use crate::{pct, us_or_ms};

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let with = crate::BenchDaemon::start(fs, "usage-on", &[])?;
    let without = crate::BenchDaemon::start(fs, "usage-off", &["--no-run-usage"])?;
    let monitor_dir = fs.scratch().join("monitor-bench");
    let monitored = crate::BenchDaemon::start(
        fs,
        "monitor-on",
        // Every span goes to one session: past the default budget of
        // bytes kept for a session, which is not what is measured here.
        &[
            "--monitor-root",
            monitor_dir.to_str().unwrap_or_default(),
            "--monitor-session-bytes",
            "4G",
        ],
    )?;
    let mut clients = Vec::new();
    for bd in [&with, &without, &monitored] {
        let mut c = bd.daemon.client();
        c.call(Request::AgentCreate(AgentCreate::new("bench")))?
            .map_err(anyhow::Error::msg)?;
        c.call(Request::SessionCreate(SessionCreate::new("bench", "s")))?
            .map_err(anyhow::Error::msg)?;
        clients.push(c);
    }
    let n = if quick { 200 } else { 1000 };
    let block = 50;
    let mut times: [Vec<Duration>; 3] = Default::default();
    let spawn = allox_integration::process_start("bench", "s", &["/bin/true"]);
    // Warm all.
    for c in clients.iter_mut() {
        for _ in 0..20 {
            c.call(Request::ProcessStart(spawn.clone()))?
                .map_err(anyhow::Error::msg)?;
        }
    }
    while times[0].len() < n {
        for (i, c) in clients.iter_mut().enumerate() {
            for _ in 0..block {
                let t = Instant::now();
                c.call(Request::ProcessStart(spawn.clone()))?
                    .map_err(anyhow::Error::msg)?;
                times[i].push(t.elapsed());
            }
        }
    }
    let stats_req = Request::SessionStats(SessionStatsRequest {
        agent_id: "bench".into(),
        session_id: "s".into(),
    });
    let ping = Request::Ping(allox_protocol::Ping {});
    let mut stats = Vec::new();
    let mut pings = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        clients[0]
            .call(stats_req.clone())?
            .map_err(anyhow::Error::msg)?;
        stats.push(t.elapsed());
        let t = Instant::now();
        clients[0].call(ping.clone())?.map_err(anyhow::Error::msg)?;
        pings.push(t.elapsed());
    }
    println!("## Resource attribution and the monitor\n");
    println!(
        "`process.start` of `/bin/true` to its result, {n} each, in alternating blocks of {block} \
         on three daemons: one started with `--no-run-usage` (baseline), one reading the run's \
         cgroup when it ends (`usage`, `oom_killed`; the default), one with the monitor plugin \
         on as well (`--monitor-root`: each run's end is also a record). Then `session.stats` \
         {n} times beside `system.ping` on the same connection.\n"
    );
    println!("| what | p50 | p99 | ratio (p50) |");
    println!("|---|---:|---:|---:|");
    let row = |what: &str, v: &[Duration], base: &[Duration]| {
        println!(
            "| {what} | {} | {} | {:.3}× |",
            us_or_ms(pct(v, 0.5)),
            us_or_ms(pct(v, 0.99)),
            pct(v, 0.5).as_secs_f64() / pct(base, 0.5).as_secs_f64()
        );
    };
    row("spawn without attribution (baseline)", &times[1], &times[1]);
    row("spawn with attribution", &times[0], &times[1]);
    row(
        "spawn with attribution and the monitor on",
        &times[2],
        &times[1],
    );
    row("`system.ping` (baseline)", &pings, &pings);
    row("`session.stats`", &stats, &pings);
    println!();
    ingestion(&mut clients[2], quick)
}

/// Spans as an agent framework sends them: a model call with its tokens,
/// a tool call, a few attributes.
fn spans(from: u64, n: usize) -> Vec<Span> {
    (0..n as u64)
        .map(|i| {
            let k = from + i;
            let chat = k % 2 == 0;
            let start = 1_790_000_000_000_000_000 + k * 1_000_000;
            Span {
                trace_id: format!("{:032x}", 1 + k / 64),
                span_id: format!("{:016x}", 1 + k),
                parent_span_id: None,
                name: if chat {
                    "chat m-large"
                } else {
                    "execute_tool bash"
                }
                .into(),
                operation: if chat {
                    SpanOperation::Chat
                } else {
                    SpanOperation::ExecuteTool
                },
                start_unix_nano: start,
                end_unix_nano: start + 800_000,
                tool: (!chat).then(|| "bash".into()),
                model: chat.then(|| "m-large".into()),
                input_tokens: chat.then_some(1200),
                output_tokens: chat.then_some(300),
                error: None,
                attributes: [("gen_ai.system".to_string(), "bench".to_string())].into(),
            }
        })
        .collect()
}

fn ingestion(c: &mut allox_ctl::client::Client, quick: bool) -> anyhow::Result<()> {
    let total = if quick { 20_000 } else { 100_000 };
    println!(
        "`monitor.ingest` of {total} spans per batch size on one connection (each span a model \
         or tool call with tokens and an attribute, appended to the record file), against the \
         issue's goal of 50,000 spans/s (baseline). p50/p99 are per request.\n"
    );
    println!("| batch | requests | p50 | p99 | spans/s | ratio to 50,000/s |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut next = 0u64;
    for batch in [1usize, 100, 1000] {
        let requests = (total / batch).min(if batch == 1 { 5_000 } else { usize::MAX });
        let prepared: Vec<Request> = (0..requests)
            .map(|r| {
                Request::MonitorIngest(MonitorIngest {
                    agent_id: "bench".into(),
                    session_id: "s".into(),
                    spans: spans(next + (r * batch) as u64, batch),
                })
            })
            .collect();
        next += (requests * batch) as u64;
        let mut each = Vec::with_capacity(requests);
        let t0 = Instant::now();
        for req in prepared {
            let t = Instant::now();
            c.call(req)?.map_err(anyhow::Error::msg)?;
            each.push(t.elapsed());
        }
        let rate = (requests * batch) as f64 / t0.elapsed().as_secs_f64();
        println!(
            "| {batch} | {requests} | {} | {} | {rate:.0} | {:.2}× |",
            us_or_ms(pct(&each, 0.5)),
            us_or_ms(pct(&each, 0.99)),
            rate / 50_000.0
        );
    }
    println!();
    Ok(())
}
