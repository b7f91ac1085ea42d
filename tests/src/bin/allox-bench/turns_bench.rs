//! `turn.end` with an automatic checkpoint, and `checkpoint.diff`, for
//! `allox-bench`.

use allox_integration::{populate, BtrfsFs};
use allox_protocol::{CheckpointCreate, CheckpointDiff, PolicySet, TurnBegin, TurnEnd, TurnStatus};
use allox_store::failpoint::Failpoints;
use allox_store::Store;
use std::process::Command;
use std::time::Instant;

use crate::{pct, us_or_ms};

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let root = fs.path().join("turns-store");
    std::fs::create_dir(&root)?;
    let st = Store::open(&root, Failpoints::default())?;
    st.agent_create("a")?;
    st.session_create("a", "s")?;
    st.policy_set(&PolicySet {
        agent_id: "a".into(),
        session_id: None,
        auto_checkpoint: Some(true),
        keep_last: None,
    })?;
    let cur = st.layout().current("a", "s");
    populate(&cur, 10_000)?;
    Command::new("sync").status()?;
    let n = if quick { 20 } else { 100 };
    let mut ends = Vec::new();
    for i in 0..n {
        let t = st.turn_begin(&TurnBegin {
            agent_id: "a".into(),
            session_id: "s".into(),
            turn_id: None,
        })?;
        std::fs::write(cur.join("d000/f0"), format!("turn {i}"))?;
        st.wait_idle();
        Command::new("sync").status()?;
        let t0 = Instant::now();
        let r = st.turn_end(&TurnEnd {
            agent_id: "a".into(),
            session_id: "s".into(),
            turn_id: t.turn_id,
            status: TurnStatus::Ok,
            label: None,
        })?;
        ends.push(t0.elapsed());
        anyhow::ensure!(r.checkpoint_id.is_some(), "no checkpoint: {r:?}");
    }
    println!("## Turns\n");
    println!("`turn.end` (ok) with the automatic checkpoint, 10,000-file workspace, {n} turns.\n");
    println!("| what | p50 | p99 |");
    println!("|---|---:|---:|");
    println!(
        "| `turn.end` with auto-checkpoint | {} | {} |",
        us_or_ms(pct(&ends, 0.5)),
        us_or_ms(pct(&ends, 0.99))
    );
    println!();

    // Diff: 10 changed files out of 100,000.
    st.session_create("a", "big")?;
    let big = st.layout().current("a", "big");
    populate(&big, 100_000)?;
    let ck = |c: &str| {
        st.checkpoint_create(&CheckpointCreate {
            agent_id: "a".into(),
            session_id: "big".into(),
            checkpoint_id: c.into(),
            pinned: false,
            label: None,
        })
    };
    ck("x")?;
    for i in 0..10 {
        std::fs::write(
            big.join(format!("d{:03}/f{}", i * 9, i * 9000 + 1)),
            "changed",
        )?;
    }
    ck("y")?;
    Command::new("sync").status()?;
    let req = CheckpointDiff {
        agent_id: "a".into(),
        session_id: "big".into(),
        from: "x".into(),
        to: "y".into(),
        patch: false,
    };
    let reps = if quick { 5 } else { 20 };
    let mut ds = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let d = st.checkpoint_diff(&req)?;
        ds.push(t.elapsed());
        anyhow::ensure!(d.modified == 10, "diff found {} changes", d.modified);
    }
    let (x, y) = (
        st.layout().checkpoint("a", "big", "x"),
        st.layout().checkpoint("a", "big", "y"),
    );
    // The same answer by comparing every entry (the method without Btrfs).
    let mut dw = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let (_, _, c) = allox_store::diff::diff_trees(&x, &y, allox_store::diff::DiffMethod::Walk)?;
        dw.push(t.elapsed());
        anyhow::ensure!(c[1] == 10, "walk found {c:?}");
    }
    // Against the live tree, with 10 more files changed since `y`.
    for i in 0..10 {
        std::fs::write(
            big.join(format!("d{:03}/f{}", i * 9 + 3, i * 9000 + 3001)),
            "live",
        )?;
    }
    let live = CheckpointDiff {
        to: "current".into(),
        ..req.clone()
    };
    let mut dl = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let d = st.checkpoint_diff(&live)?;
        dl.push(t.elapsed());
        anyhow::ensure!(
            d.modified == 20,
            "diff to current found {} changes",
            d.modified
        );
    }
    // Across two rollbacks: a checkpoint of a tree the second rollback
    // replaced, against current/ (made from another checkpoint): the two
    // lines of descent meet only in trees that are gone, which the store
    // keeps the lineage of; without it the hints find no common history
    // and the diff compares every entry.
    let rollback = |c: &str| {
        st.rollback(&allox_protocol::SessionRollback {
            agent_id: "a".into(),
            session_id: "big".into(),
            checkpoint_id: c.into(),
            kill_processes: Some(false),
        })
    };
    rollback("x")?;
    for i in 0..5 {
        std::fs::write(
            big.join(format!("d{:03}/f{}", i * 9 + 5, i * 9000 + 5005)),
            "z",
        )?;
    }
    ck("z")?;
    rollback("y")?;
    for i in 0..5 {
        std::fs::write(
            big.join(format!("d{:03}/f{}", i * 9 + 7, i * 9000 + 7007)),
            "w",
        )?;
    }
    st.wait_idle();
    Command::new("sync").status()?;
    let across = CheckpointDiff {
        from: "z".into(),
        to: "current".into(),
        ..req.clone()
    };
    let mut da = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let d = st.checkpoint_diff(&across)?;
        da.push(t.elapsed());
        anyhow::ensure!(
            d.modified == 20,
            "diff across rollbacks found {} changes",
            d.modified
        );
    }
    let z = st.layout().checkpoint("a", "big", "z");
    let mut dn = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let d = allox_store::diff::compare_knowing(
            &z,
            &big,
            allox_store::diff::DiffMethod::Btrfs,
            &[],
            &allox_store::diff::Limits::default(),
            false,
        )?;
        dn.push(t.elapsed());
        anyhow::ensure!(
            d.counts[1] == 20,
            "diff without the lineage found {:?}",
            d.counts
        );
    }
    let mut dr = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let out = Command::new("diff")
            .args(["-rq", "--no-dereference"])
            .arg(&x)
            .arg(&y)
            .output()?;
        dr.push(t.elapsed());
        anyhow::ensure!(
            out.status.code() == Some(1),
            "diff -r did not see the changes"
        );
    }
    println!("## Checkpoint diff\n");
    println!(
        "Two checkpoints that differ in 10 files out of 100,000; warm cache. Across two rollbacks: a checkpoint of a tree the second rollback replaced (5 changes after the first rollback) against current/, made from the other checkpoint (5 changes since).\n"
    );
    println!("| what | n | p50 | p99 | ratio (p50) |");
    println!("|---|---:|---:|---:|---:|");
    let base = pct(&dr, 0.5).as_secs_f64();
    for (what, v) in [
        ("`diff -rq --no-dereference` (baseline)", &dr),
        ("full walk, every entry compared", &dw),
        ("`checkpoint.diff`, checkpoint → checkpoint", &ds),
        ("`checkpoint.diff`, checkpoint → current (20 changes)", &dl),
        (
            "across two rollbacks, without the deleted trees' lineage (20 changes)",
            &dn,
        ),
        ("`checkpoint.diff`, across two rollbacks (20 changes)", &da),
    ] {
        println!(
            "| {what} | {} | {} | {} | {:.3}× |",
            v.len(),
            us_or_ms(pct(v, 0.5)),
            us_or_ms(pct(v, 0.99)),
            pct(v, 0.5).as_secs_f64() / base
        );
    }
    println!();
    Ok(())
}
