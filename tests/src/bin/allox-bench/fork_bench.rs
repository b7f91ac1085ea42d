//! `session.fork` against `checkpoint.create` of the same tree and
//! `cp -a --reflink=always` of it (what a user would script), at 100,
//! 10,000 and 100,000 files, through the store library; side by side,
//! round by round.

use super::{ms, pct};
use allox_integration::{populate, BtrfsFs};
use allox_protocol::{CheckpointCreate, SessionFork};
use allox_store::failpoint::Failpoints;
use allox_store::Store;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let root = fs.path().join("fork-store");
    std::fs::create_dir(&root)?;
    let st = Store::open(&root, Failpoints::default())?;
    st.agent_create("bench")?;
    println!("## Session fork (issue 33)\n");
    println!("Through the store library on loop-backed Btrfs. Each round, in turn: `checkpoint.create` of the");
    println!("session (the baseline), `session.fork` from that checkpoint and from `current`, and `cp -a");
    println!("--reflink=always` of `current/` (fewer rounds at 100,000 files). Forks and copies are removed");
    println!("between rounds, outside the timing.\n");
    println!("| files | what | n | p50 | p99 | ratio p50 | ratio p99 |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    let mut fork_p50 = Vec::new();
    for files in [100usize, 10_000, 100_000] {
        let s = format!("s{files}");
        let info = st.session_create("bench", &s)?;
        let cur = Path::new(&info.current).to_path_buf();
        populate(&cur, files)?;
        Command::new("sync").status()?;
        let n = match (quick, files) {
            (true, _) => 15,
            (false, 100_000) => 20,
            _ => 60,
        };
        let (mut ck, mut from_ck, mut from_cur, mut cp) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            let c = format!("c{i}");
            let t = Instant::now();
            st.checkpoint_create(&CheckpointCreate {
                agent_id: "bench".into(),
                session_id: s.clone(),
                checkpoint_id: c.clone(),
                pinned: false,
                label: None,
            })?;
            ck.push(t.elapsed());
            for (from, out) in [(c.as_str(), &mut from_ck), ("current", &mut from_cur)] {
                let to = format!("f{files}-{i}-{}", out.len());
                let t = Instant::now();
                st.session_fork(&SessionFork {
                    agent_id: "bench".into(),
                    session_id: s.clone(),
                    from: from.into(),
                    new_agent_id: None,
                    new_session_id: to.clone(),
                    label: None,
                })?;
                out.push(t.elapsed());
                st.session_delete("bench", &to)?;
            }
            if files < 100_000 || i < n.min(5) {
                let dest = fs.path().join(format!("cp-{files}-{i}"));
                let t = Instant::now();
                let ok = Command::new("cp")
                    .args(["-a", "--reflink=always"])
                    .arg(&cur)
                    .arg(&dest)
                    .status()?
                    .success();
                cp.push(t.elapsed());
                anyhow::ensure!(ok, "cp -a --reflink=always failed");
                std::fs::remove_dir_all(&dest)?;
            }
            st.wait_idle();
        }
        let base = (pct(&ck, 0.5), pct(&ck, 0.99));
        for (what, v) in [
            ("`checkpoint.create` (baseline)", &ck),
            ("`session.fork` from that checkpoint", &from_ck),
            ("`session.fork` from `current`", &from_cur),
            ("`cp -a --reflink=always`", &cp),
        ] {
            let (p50, p99) = (pct(v, 0.5), pct(v, 0.99));
            println!(
                "| {files} | {what} | {} | {} ms | {} ms | {:.2}× | {:.2}× |",
                v.len(),
                ms(p50),
                ms(p99),
                ratio(p50, base.0),
                ratio(p99, base.1)
            );
        }
        fork_p50.push((files, pct(&from_ck, 0.5), pct(&from_cur, 0.5), base.0));
    }
    println!();
    let (_, small_ck, small_cur, _) = fork_p50[0];
    println!("| budget | measured | |");
    println!("|---|---:|---|");
    for (files, f_ck, f_cur, c) in &fork_p50 {
        let worst = ratio(*f_ck, *c).max(ratio(*f_cur, *c));
        println!(
            "| fork ≤ 1.5× `checkpoint.create`, {files} files | {worst:.2}× | {} |",
            if worst <= 1.5 { "met" } else { "**not met**" }
        );
    }
    let (_, big_ck, big_cur, _) = fork_p50[fork_p50.len() - 1];
    let flat = ratio(big_ck, small_ck).max(ratio(big_cur, small_cur));
    println!(
        "| flat: 100,000 files ≤ 2× 100 files | {flat:.2}× | {} |",
        if flat <= 2.0 { "met" } else { "**not met**" }
    );
    println!();
    Ok(())
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-9)
}
