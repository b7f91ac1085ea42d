//! What it costs that an answered change survives a power cut. As shipped
//! it costs no extra I/O: a delete is decided by one durable index commit
//! (the sync the journal's Begin always had), and a rollback is answered
//! once its snapshot is whole, which recovery then finishes. The baseline
//! beside it is the direct fix: the same operations followed by a
//! filesystem commit (`btrfs::commit`) before the answer. Alternating
//! blocks on the same tree.

use crate::{ms, pct};
use allox_integration::{populate, BtrfsFs};
use allox_protocol::{CheckpointCreate, SessionRollback};
use allox_store::failpoint::Failpoints;
use allox_store::Store;
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
    println!("## Durability: what makes an answer survive a power cut\n");
    println!("Each step on a session of 10,000 files: `checkpoint.create`, change one file,");
    println!("`session.rollback` to it, `checkpoint.delete` of the previous checkpoint. In");
    println!("alternating blocks of 10: *as shipped* (durable at the answer through the");
    println!("journal: no I/O beyond what the operations did before) and *with a commit*:");
    println!("the same operations followed by a filesystem commit before the answer, the");
    println!("direct way to make a rename or exchange durable.\n");
    let info = st.session_create("bench", "s")?;
    let cur = Path::new(&info.current).to_path_buf();
    populate(&cur, 10_000)?;
    Command::new("sync").status()?;
    let blocks = if quick { 4 } else { 20 };
    let (mut before, mut after) = (Times::default(), Times::default());
    let mut prev: Option<String> = None;
    let mut i = 0;
    for block in 0..blocks {
        let commit = block % 2 == 1;
        let t = if commit { &mut after } else { &mut before };
        let settle = |t0: Instant| -> anyhow::Result<Duration> {
            if commit {
                allox_store::btrfs::commit(&root)?;
            }
            Ok(t0.elapsed())
        };
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
            t.checkpoint.push(settle(t0)?);
            std::fs::write(cur.join("d000/f0"), format!("change {i}"))?;
            let t0 = Instant::now();
            st.rollback(&SessionRollback {
                agent_id: "bench".into(),
                session_id: "s".into(),
                checkpoint_id: c.clone(),
                kill_processes: None,
            })?;
            t.rollback.push(settle(t0)?);
            if let Some(p) = prev.replace(c) {
                let t0 = Instant::now();
                st.checkpoint_delete("bench", "s", &p)?;
                t.delete.push(settle(t0)?);
            }
        }
    }
    st.wait_idle();
    println!("| operation | n | as shipped p50 ms | as shipped p99 ms | with a commit p50 ms | with a commit p99 ms | a commit would add, p50 ms |");
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
