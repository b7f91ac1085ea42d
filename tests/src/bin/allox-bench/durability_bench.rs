//! What it costs that an answered change survives a power cut: the store's
//! operations with the commit before the answer (as shipped) and without it
//! (as before), side by side, in alternating blocks on the same tree.

use crate::{ms, pct};
use allox_integration::{populate, BtrfsFs};
use allox_protocol::{CheckpointCreate, SessionRollback};
use allox_supervisor::failpoint::Failpoints;
use allox_supervisor::store::Store;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Times {
    checkpoint: Vec<Duration>,
    rollback: Vec<Duration>,
    delete: Vec<Duration>,
}

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let root = fs.path().join("durability-store");
    std::fs::create_dir(&root)?;
    let st = Store::open(&root, Failpoints::default())?;
    st.agent_create("bench")?;
    println!("## Durability: what the commit before the answer costs\n");
    println!("Each step on a session of 10,000 files: `checkpoint.create`, change one file,");
    println!("`session.rollback` to it, `checkpoint.delete` of the previous checkpoint; in");
    println!("alternating blocks of 10 with the commit that makes an answered rename or");
    println!("exchange durable (*after*, as shipped) and without it (*before*: such an");
    println!("answer could be undone by a power cut). `checkpoint.create` needs no extra");
    println!("commit (its snapshot ioctl commits the filesystem's transaction), so its two");
    println!("columns differ only by noise.\n");
    let info = st.session_create("bench", "s")?;
    let cur = Path::new(&info.current).to_path_buf();
    populate(&cur, 10_000)?;
    Command::new("sync").status()?;
    let blocks = if quick { 4 } else { 20 };
    let (mut before, mut after) = (Times::default(), Times::default());
    let mut prev: Option<String> = None;
    let mut i = 0;
    for block in 0..blocks {
        let on = block % 2 == 1;
        st.set_commit_before_answer(on);
        let t = if on { &mut after } else { &mut before };
        for _ in 0..10 {
            i += 1;
            st.wait_idle();
            let c = format!("c{i}");
            let t0 = Instant::now();
            st.checkpoint_create(&CheckpointCreate {
                agent_id: "bench".into(),
                session_id: "s".into(),
                checkpoint_id: c.clone(),
                pinned: false,
                label: None,
            })?;
            t.checkpoint.push(t0.elapsed());
            std::fs::write(cur.join("d000/f0"), format!("change {i}"))?;
            let t0 = Instant::now();
            st.rollback(&SessionRollback {
                agent_id: "bench".into(),
                session_id: "s".into(),
                checkpoint_id: c.clone(),
                kill_processes: None,
            })?;
            t.rollback.push(t0.elapsed());
            if let Some(p) = prev.replace(c) {
                let t0 = Instant::now();
                st.checkpoint_delete("bench", "s", &p)?;
                t.delete.push(t0.elapsed());
            }
        }
    }
    st.set_commit_before_answer(true);
    st.wait_idle();
    println!("| operation | n | before p50 ms | before p99 ms | after p50 ms | after p99 ms | added p50 ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, b, a) in [
        ("`checkpoint.create`", &before.checkpoint, &after.checkpoint),
        ("`session.rollback`", &before.rollback, &after.rollback),
        ("`checkpoint.delete`", &before.delete, &after.delete),
    ] {
        let added = pct(a, 0.5).as_secs_f64() - pct(b, 0.5).as_secs_f64();
        println!(
            "| {name} | {} | {} | {} | {} | {} | {:+.2} |",
            a.len().min(b.len()),
            ms(pct(b, 0.5)),
            ms(pct(b, 0.99)),
            ms(pct(a, 0.5)),
            ms(pct(a, 0.99)),
            added * 1e3
        );
    }
    println!();
    st.session_delete("bench", "s")?;
    st.wait_idle();
    Ok(())
}
