//! Resource attribution: what reading a run's cgroup at its end costs a
//! spawn (`process.start` of `/bin/true` to its result, with and without
//! `--no-run-usage`, in alternating blocks on two daemons), and
//! `session.stats`.

use allox_integration::BtrfsFs;
use allox_protocol::{AgentCreate, Request, SessionCreate, SessionStatsRequest};
use std::time::{Duration, Instant};

use crate::{pct, us_or_ms};

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let with = crate::BenchDaemon::start(fs, "usage-on", &[])?;
    let without = crate::BenchDaemon::start(fs, "usage-off", &["--no-run-usage"])?;
    let mut clients = Vec::new();
    for bd in [&with, &without] {
        let mut c = bd.daemon.client();
        c.call(Request::AgentCreate(AgentCreate::new("bench")))?
            .map_err(anyhow::Error::msg)?;
        c.call(Request::SessionCreate(SessionCreate::new("bench", "s")))?
            .map_err(anyhow::Error::msg)?;
        clients.push(c);
    }
    let n = if quick { 200 } else { 1000 };
    let block = 50;
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let spawn = allox_integration::process_start("bench", "s", &["/bin/true"]);
    // Warm both.
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
    println!("## Resource attribution\n");
    println!(
        "`process.start` of `/bin/true` to its result, {n} each, in alternating blocks of {block} \
         on two daemons: one reading the run's cgroup when it ends (`usage`, `oom_killed`), \
         one started with `--no-run-usage` (baseline). Then `session.stats` {n} times beside \
         `system.ping` on the same connection.\n"
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
    row("`system.ping` (baseline)", &pings, &pings);
    row("`session.stats`", &stats, &pings);
    println!();
    Ok(())
}
