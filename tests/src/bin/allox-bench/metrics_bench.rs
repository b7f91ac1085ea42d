//! What keeping metrics costs, for `allox-bench`: `process.start` and
//! `checkpoint.create` on a daemon with metrics and on one started with
//! `--no-metrics` (the baseline), side by side in one run, alternating
//! request by request; and a scrape (`system.metrics`) of a daemon with
//! 1,000 sessions, against `system.info` (one /proc walk) in the same run.

use allox_integration::BtrfsFs;
use allox_protocol::{
    AgentCreate, CheckpointCreate, ProcessStart, Request, Response, SessionCreate,
    SystemInfoRequest, SystemMetricsRequest,
};
use std::time::{Duration, Instant};

use crate::{pct, BenchDaemon};

fn true_run() -> ProcessStart {
    allox_integration::process_start("bench", "s", &["/bin/true"])
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let n = if quick { 60 } else { 300 };
    let on = BenchDaemon::start(fs, "metrics-on", &[])?;
    let off = BenchDaemon::start(fs, "metrics-off", &["--no-metrics"])?;
    let mut clients = [on.daemon.client(), off.daemon.client()];
    for c in clients.iter_mut() {
        c.call(Request::AgentCreate(AgentCreate::new("bench")))?
            .map_err(anyhow::Error::msg)?;
        c.call(Request::SessionCreate(SessionCreate::new("bench", "s")))?
            .map_err(anyhow::Error::msg)?;
    }
    // [on, off] × [start, checkpoint]; the order within a pair alternates.
    let mut took: [[Vec<Duration>; 2]; 2] = Default::default();
    for i in 0..n + 10 {
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for d in order {
            let c = &mut clients[d];
            let t = Instant::now();
            let r = c.call(Request::ProcessStart(true_run()))?;
            let start = t.elapsed();
            anyhow::ensure!(
                matches!(r, Ok(Response::Exited(ref x)) if x.exit_code == Some(0)),
                "{r:?}"
            );
            let t = Instant::now();
            c.call(Request::CheckpointCreate(CheckpointCreate {
                agent_id: "bench".into(),
                session_id: "s".into(),
                checkpoint_id: format!("c{i}"),
                pinned: false,
                label: None,
            }))?
            .map_err(anyhow::Error::msg)?;
            let ck = t.elapsed();
            if i >= 10 {
                took[d][0].push(start);
                took[d][1].push(ck);
            }
        }
    }
    drop(off);
    println!("## Metrics: what counting costs\n");
    println!("`process.start` (`/bin/true`, waited for) and `checkpoint.create` over the control socket, on a daemon");
    println!("with metrics and on one started with `--no-metrics` (the baseline), alternating request by request, n = {n} each.\n");
    println!("| request | metrics on p50 ms | on p99 ms | --no-metrics p50 ms | off p99 ms | on / off (p50) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (k, name) in ["process.start", "checkpoint.create"].iter().enumerate() {
        let (a, b) = (&took[0][k], &took[1][k]);
        println!(
            "| {name} | {} | {} | {} | {} | {:.3}× |",
            ms(pct(a, 0.5)),
            ms(pct(a, 0.99)),
            ms(pct(b, 0.5)),
            ms(pct(b, 0.99)),
            pct(a, 0.5).as_secs_f64() / pct(b, 0.5).as_secs_f64()
        );
    }

    // A scrape of a daemon with 1,000 sessions (ten agents of 100).
    let c = &mut clients[0];
    for a in 0..10 {
        let agent = format!("agent{a}");
        c.call(Request::AgentCreate(AgentCreate::new(agent.as_str())))?
            .map_err(anyhow::Error::msg)?;
        for s in 0..100 {
            c.call(Request::SessionCreate(SessionCreate::new(
                agent.as_str(),
                format!("s{s}").as_str(),
            )))?
            .map_err(anyhow::Error::msg)?;
        }
    }
    let scrapes = if quick { 50 } else { 200 };
    let (mut scrape, mut info) = (Vec::new(), Vec::new());
    let mut bytes = 0;
    for i in 0..scrapes + 5 {
        let t = Instant::now();
        let r = c.call(Request::SystemMetrics(SystemMetricsRequest {}))?;
        let el = t.elapsed();
        match r {
            Ok(Response::Metrics(m)) => {
                anyhow::ensure!(
                    m.text.contains("allox_sessions{state=\"active\"} 1001"),
                    "the scrape does not count 1,001 sessions"
                );
                bytes = m.text.len();
            }
            other => anyhow::bail!("system.metrics: {other:?}"),
        }
        let t = Instant::now();
        c.call(Request::SystemInfo(SystemInfoRequest {}))?
            .map_err(anyhow::Error::msg)?;
        let el_info = t.elapsed();
        if i >= 5 {
            scrape.push(el);
            info.push(el_info);
        }
    }
    println!(
        "\nA scrape (`system.metrics`, {bytes} bytes of text) of a daemon with 1,001 sessions of 11 agents, n = {scrapes};"
    );
    println!("baseline: `system.info` (one walk of /proc) in the same run, alternating.\n");
    println!("| request | p50 ms | p99 ms | ratio to system.info (p50) | budget |");
    println!("|---|---:|---:|---:|---|");
    let ratio = pct(&scrape, 0.5).as_secs_f64() / pct(&info, 0.5).as_secs_f64();
    println!(
        "| system.metrics, 1,001 sessions | {} | {} | {ratio:.2}× | ≤ 10 ms: {} |",
        ms(pct(&scrape, 0.5)),
        ms(pct(&scrape, 0.99)),
        if pct(&scrape, 0.5) <= Duration::from_millis(10) {
            "met"
        } else {
            "missed"
        }
    );
    println!(
        "| system.info | {} | {} | 1.00× | |\n",
        ms(pct(&info, 0.5)),
        ms(pct(&info, 0.99))
    );
    drop(on);
    Ok(())
}
