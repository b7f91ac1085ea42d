//! Two builds of the daemon side by side: `process.start` with wait of
//! `/bin/true`, alternating call by call between a daemon of this build
//! and one of the build named by `ALLOX_BENCH_AB_INIT` (an `allox-init`
//! kept from before a change), each on its own store and cgroup root.
//! The pair-by-pair ratio cancels what the machine does meanwhile, which
//! moves a whole run's p50 by 5–25% here: what a change of a few percent
//! needs to be seen at all.

use crate::spawn_bench::{bench_session, daemon};
use crate::{pct, us_or_ms};
use allox_integration::{cgroup2_mount, workspace_bin, BtrfsFs};
use allox_protocol::{Request, Response};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let before = std::env::var_os("ALLOX_BENCH_AB_INIT")
        .map(PathBuf::from)
        .ok_or_else(|| {
            anyhow::anyhow!("ALLOX_BENCH_AB_INIT must name the allox-init to compare with")
        })?;
    anyhow::ensure!(before.is_file(), "{} is not a file", before.display());
    let mount = cgroup2_mount().ok_or_else(|| anyhow::anyhow!("no cgroup2 mount"))?;
    let cg_root = mount.join(format!("allox-bench-ab-{}", std::process::id()));
    std::fs::create_dir_all(&cg_root)?;
    let result = bench(fs, &cg_root, &before, quick);
    let _ = std::fs::write(cg_root.join("cgroup.kill"), "1");
    std::thread::sleep(Duration::from_millis(200));
    allox_integration::remove_cgroup_tree(&cg_root);
    result
}

fn bench(fs: &BtrfsFs, cg_root: &Path, before: &Path, quick: bool) -> anyhow::Result<()> {
    let n = if quick { 100 } else { 1000 };
    let this = workspace_bin("allox-init");
    // Two rounds, each with a pair of new daemons, this build's started
    // first in one and the other's in the other: neither is always the
    // older daemon. (The same build on both sides still shows about 2%
    // against this build's side, whichever starts first: the bias a change
    // must beat, docs/benchmarks.md.)
    let gaps = [None, Some(Duration::from_millis(20))];
    let mut times: Vec<[Vec<Duration>; 2]> = vec![Default::default(), Default::default()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(), Vec::new()];
    for round in 0..2 {
        let (first, second): (&Path, &Path) = if round == 0 {
            (&this, before)
        } else {
            (before, &this)
        };
        let d_first = daemon(fs, cg_root, first, &format!("ab-first-{round}"), "never")?;
        let d_second = daemon(fs, cg_root, second, &format!("ab-second-{round}"), "never")?;
        // Index 0 is always this build's.
        let mut clients = if round == 0 {
            [d_first.client(), d_second.client()]
        } else {
            [d_second.client(), d_first.client()]
        };
        for c in &mut clients {
            bench_session(c)?;
        }
        for (g, gap) in gaps.iter().enumerate() {
            let count = if gap.is_some() { n / 5 } else { n };
            for i in 0..count + 20 {
                let mut pair = [Duration::ZERO; 2];
                // Which goes first alternates too.
                let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
                for k in order {
                    if let Some(gap) = gap {
                        std::thread::sleep(*gap);
                    }
                    let t = Instant::now();
                    let r = clients[k].call(Request::ProcessStart(crate::spawn_bench::start(
                        &["/bin/true"],
                        true,
                    )))?;
                    pair[k] = t.elapsed();
                    anyhow::ensure!(
                        matches!(r, Ok(Response::Exited(ref x)) if x.exit_code == Some(0)),
                        "{r:?}"
                    );
                }
                if i >= 20 {
                    times[g][0].push(pair[0]);
                    times[g][1].push(pair[1]);
                    ratios[g].push(pair[0].as_secs_f64() / pair[1].as_secs_f64());
                }
            }
        }
        d_first.stop();
        d_second.stop();
    }
    println!("## Two builds side by side: `process.start` with wait of `/bin/true`\n");
    println!(
        "This build's daemon against `{}`, call by call, alternating which goes first; `--prepared-runs never`; two rounds of new daemons, each build's started first once.\n",
        before.display()
    );
    println!("| calls | this p50 | this p99 | before p50 | before p99 | this ÷ before, p50 | median of the pairs' ratios |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (g, gap) in gaps.iter().enumerate() {
        let (times, ratios) = (&times[g], &mut ratios[g]);
        ratios.sort_by(f64::total_cmp);
        let what = match gap {
            None => format!("{}, back to back", ratios.len()),
            Some(g) => format!("{}, {} ms apart", ratios.len(), g.as_millis()),
        };
        println!(
            "| {what} | {} | {} | {} | {} | {:.3}× | {:.3}× |",
            us_or_ms(pct(&times[0], 0.5)),
            us_or_ms(pct(&times[0], 0.99)),
            us_or_ms(pct(&times[1], 0.5)),
            us_or_ms(pct(&times[1], 0.99)),
            pct(&times[0], 0.5).as_secs_f64() / pct(&times[1], 0.5).as_secs_f64(),
            ratios[ratios.len() / 2],
        );
    }
    println!();
    Ok(())
}
