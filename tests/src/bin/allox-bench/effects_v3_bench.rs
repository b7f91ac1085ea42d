//! System effects protocol v3 (issue 32), for `allox-bench`: a run with
//! `recovery` (A, the run, B, the workspace restored by the pinned recover
//! tool, C, B→C and A→C verified) against the same steps done by hand
//! over the RPC — `checkpoint.create`, the run, `checkpoint.create`,
//! `session.rollback`, `checkpoint.diff` — on a 10,000-file workspace:
//! by hand on the same daemon (its run observed as v2 observes every run)
//! and on a daemon without the plugin. Then the verifier over the v3 sets
//! against `diff -rq` of two 10,000-file trees.

use allox_integration::{populate, process_start, workspace_bin, BtrfsFs};
use allox_protocol::{
    AgentCreate, CheckpointCreate, CheckpointDiff, ProcessRecovery, Request, Response,
    SessionCreate, SessionRollback,
};
use allox_store::layout::Layout;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{pct, us_or_ms, BenchDaemon};

const RUN: &str = "printf changed > effect.txt";

fn ok(r: Result<Response, allox_protocol::ErrorBody>) -> anyhow::Result<Response> {
    r.map_err(|e| anyhow::anyhow!("{}: {}", e.code.as_str(), e.message))
}

/// The steps by hand in `bench/h`: its time.
fn by_hand(c: &mut allox_ctl::client::Client, i: usize) -> anyhow::Result<Duration> {
    let cp = |id: &str| {
        Request::CheckpointCreate(CheckpointCreate {
            agent_id: "bench".into(),
            session_id: "h".into(),
            checkpoint_id: id.into(),
            pinned: false,
            label: None,
        })
    };
    let (before, after) = (format!("before-{i}"), format!("after-{i}"));
    let t = Instant::now();
    ok(c.call(cp(&before))?)?;
    match ok(c.call(Request::ProcessStart(process_start(
        "bench",
        "h",
        &["/bin/sh", "-c", RUN],
    )))?)? {
        Response::Exited(r) if r.exit_code == Some(0) => {}
        other => anyhow::bail!("the run by hand: {other:?}"),
    }
    ok(c.call(cp(&after))?)?;
    ok(c.call(Request::SessionRollback(SessionRollback {
        agent_id: "bench".into(),
        session_id: "h".into(),
        checkpoint_id: before.clone(),
        kill_processes: None,
    }))?)?;
    ok(c.call(Request::CheckpointDiff(CheckpointDiff {
        agent_id: "bench".into(),
        session_id: "h".into(),
        from: before,
        to: after,
        patch: false,
    }))?)?;
    Ok(t.elapsed())
}

/// One v3 run in `bench/s`: its time; the recovery must be consistent.
fn v3(c: &mut allox_ctl::client::Client) -> anyhow::Result<Duration> {
    let mut p = process_start("bench", "s", &["/bin/sh", "-c", RUN]);
    p.recovery = Some(Box::new(ProcessRecovery {
        checkpoint_id: None,
        scrub_runtime: false,
        require_consistent: true,
    }));
    let t = Instant::now();
    let r = ok(c.call(Request::ProcessStart(p))?)?;
    let el = t.elapsed();
    match r {
        Response::Exited(r) => {
            let e = r.effects.ok_or_else(|| anyhow::anyhow!("no effects"))?;
            let rec = e.recovery.ok_or_else(|| anyhow::anyhow!("no recovery"))?;
            anyhow::ensure!(
                rec.consistent && !e.fenced,
                "a v3 run of {RUN:?} left a residue or was fenced: {:?}",
                e.fence_reason
            );
        }
        other => anyhow::bail!("v3: {other:?}"),
    }
    Ok(el)
}

fn row(name: &str, v: &[Duration], base: &[Duration]) -> f64 {
    let r50 = pct(v, 0.5).as_secs_f64() / pct(base, 0.5).as_secs_f64();
    println!(
        "| {name} | {} | {} | {r50:.2}× | {:.2}× |",
        us_or_ms(pct(v, 0.5)),
        us_or_ms(pct(v, 0.99)),
        pct(v, 0.99).as_secs_f64() / pct(base, 0.99).as_secs_f64(),
    );
    r50
}

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let n = if quick { 6 } else { 20 };
    let scope = fs.scratch().join("effects-v3-scope.json");
    std::fs::write(&scope, crate::effects_bench::SCOPE)?;
    let (args, lsm) = crate::effects_bench::observer_args(Some(&scope))?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let off = BenchDaemon::start(fs, "v3-off", &[])?;
    let on = BenchDaemon::start(fs, "v3-on", &args)?;
    let mut clients = Vec::new();
    for d in [&off, &on] {
        let mut c = d.daemon.client();
        ok(c.call(Request::AgentCreate(AgentCreate::new("bench")))?)?;
        let layout = Layout::new(&d.daemon.root);
        for s in ["s", "h"] {
            ok(c.call(Request::SessionCreate(SessionCreate::new("bench", s)))?)?;
            populate(&layout.current("bench", s), 10_000)?;
        }
        clients.push(c);
    }
    Command::new("sync").status()?;
    let (mut t_v3, mut t_hand_on, mut t_hand_off) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n + 1 {
        let a = v3(&mut clients[1])?;
        let b = by_hand(&mut clients[1], i)?;
        let c = by_hand(&mut clients[0], i)?;
        if i > 0 {
            t_v3.push(a);
            t_hand_on.push(b);
            t_hand_off.push(c);
        }
    }
    // The verifier over the v3 sets, against `diff -rq` of two trees of
    // the 10,000-file workspace.
    let verifier = workspace_bin("allox-system-effects-verify");
    let mut t_verify = Vec::new();
    for e in std::fs::read_dir(on.daemon.root.join("state/effects/bench/s"))? {
        let set = e?.path();
        let t = Instant::now();
        let st = Command::new(&verifier)
            .arg(&set)
            .stdout(Stdio::null())
            .status()?;
        t_verify.push(t.elapsed());
        anyhow::ensure!(
            st.success(),
            "the verifier finds {} not sound",
            set.display()
        );
    }
    let layout = Layout::new(&off.daemon.root);
    let mut t_diff = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        Command::new("diff")
            .arg("-rq")
            .arg(layout.current("bench", "h"))
            .arg(layout.checkpoint("bench", "h", "before-1"))
            .stdout(Stdio::null())
            .status()?;
        t_diff.push(t.elapsed());
    }
    drop(clients);
    drop(on);
    drop(off);

    println!("## System effects protocol v3 (issue 32)\n");
    println!(
        "A run of `{RUN}` with `recovery` (a baseline made and pinned, A, the run, B, the workspace restored by the pinned recover tool, C, B→C and A→C verified by the pinned verifier) against its steps done by hand over the RPC (`checkpoint.create`, the run, `checkpoint.create`, `session.rollback`, `checkpoint.diff`), on a 10,000-file workspace; {n} rounds after one untimed warm-up round, alternating. Scope: bpf, sysctl, mount, network, modules, processes{}.\n",
        if lsm { "" } else { "; this kernel refuses BPF LSM programs, so the plugin runs with `--system-effects-without-lsm`" }
    );
    println!("| what | p50 | p99 | ratio p50 | ratio p99 |");
    println!("|---|---:|---:|---:|---:|");
    row(
        "by hand, on the daemon with the plugin (its run observed, v2) (baseline)",
        &t_hand_on,
        &t_hand_on,
    );
    let r = row("v3, the same daemon", &t_v3, &t_hand_on);
    row(
        "by hand, on a daemon without the plugin",
        &t_hand_off,
        &t_hand_on,
    );
    let r_off = pct(&t_v3, 0.5).as_secs_f64() / pct(&t_hand_off, 0.5).as_secs_f64();
    println!();
    println!(
        "Budget v3 ≤ 1.5× its steps by hand: {r:.2}× against them on the same daemon ({}); {r_off:.2}× against them on a daemon without the plugin (the observation itself, A, B and C, is the difference).\n",
        if r <= 1.5 { "met" } else { "**not met**" }
    );
    println!("| what | p50 | p99 | ratio p50 | ratio p99 |");
    println!("|---|---:|---:|---:|---:|");
    row(
        "`diff -rq` of two 10,000-file trees (baseline)",
        &t_diff,
        &t_diff,
    );
    let rv = row(
        &format!("the verifier over a v3 set ({} sets)", t_verify.len()),
        &t_verify,
        &t_diff,
    );
    println!();
    println!(
        "Budget: the verifier on a set ≤ `diff -rq` of the same two trees: {rv:.2}× ({}).\n",
        if rv <= 1.0 { "met" } else { "**not met**" }
    );
    Ok(())
}
