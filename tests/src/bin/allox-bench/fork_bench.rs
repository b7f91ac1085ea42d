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
                // The fork's subvolumes go in the background: gone before
                // the next timing, as before the baseline's.
                st.wait_idle();
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

/// `session.pause` and `session.resume` of a session with 100 processes,
/// over the RPC, and what auto-resume adds to a `process.start`.
pub fn pause(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    use allox_protocol::{
        AgentCreate, ProcessStart, Request, Response, SessionCreate, SessionPause, SessionRef,
    };
    let bd = crate::BenchDaemon::start(fs, "pause", &[])?;
    let mut c = bd.daemon.client();
    let mut ok =
        |r: Request| -> anyhow::Result<Response> { c.call(r)?.map_err(anyhow::Error::msg) };
    ok(Request::AgentCreate(AgentCreate::new("a")))?;
    ok(Request::SessionCreate(SessionCreate::new("a", "s")))?;
    let start = |script: &str, wait: bool| ProcessStart {
        wait,
        ..allox_integration::process_start("a", "s", &["/bin/sh", "-c", script])
    };
    // 100 processes: 99 sleeps and their shell.
    ok(Request::ProcessStart(start(
        "for i in $(seq 99); do sleep 600 & done; wait",
        false,
    )))?;
    let cg = bd.cgroup_dir().join("allox/a/s");
    let t = Instant::now();
    loop {
        let n: usize = std::fs::read_to_string(cg.join("pids.current"))
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| count_procs(&cg));
        if n >= 100 {
            break;
        }
        anyhow::ensure!(t.elapsed() < Duration::from_secs(20), "only {n} processes");
        std::thread::sleep(Duration::from_millis(20));
    }
    let n = if quick { 20 } else { 60 };
    let (mut p, mut r, mut auto, mut plain) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let pause = |hold: bool| {
        Request::SessionPause(SessionPause {
            agent_id: "a".into(),
            session_id: "s".into(),
            hold,
        })
    };
    for _ in 0..n {
        let t = Instant::now();
        ok(pause(false))?;
        p.push(t.elapsed());
        let t = Instant::now();
        ok(Request::SessionResume(SessionRef {
            agent_id: "a".into(),
            session_id: "s".into(),
        }))?;
        r.push(t.elapsed());
        // A start of a running session, then one of a paused session.
        let t = Instant::now();
        ok(Request::ProcessStart(start("true", true)))?;
        plain.push(t.elapsed());
        ok(pause(false))?;
        let t = Instant::now();
        ok(Request::ProcessStart(start("true", true)))?;
        auto.push(t.elapsed());
    }
    println!("### Pause and resume (100 processes, over the RPC)\n");
    println!("| what | n | p50 | p99 | ratio p50 | ratio p99 |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (what, v) in [("`session.pause`", &p), ("`session.resume`", &r)] {
        println!(
            "| {what} | {} | {} ms | {} ms | | |",
            v.len(),
            ms(pct(v, 0.5)),
            ms(pct(v, 0.99))
        );
    }
    let base = (pct(&plain, 0.5), pct(&plain, 0.99));
    for (what, v) in [
        (
            "`process.start` (wait) `true`, running session (baseline)",
            &plain,
        ),
        ("the same, paused session (auto-resume)", &auto),
    ] {
        println!(
            "| {what} | {} | {} ms | {} ms | {:.2}× | {:.2}× |",
            v.len(),
            ms(pct(v, 0.5)),
            ms(pct(v, 0.99)),
            ratio(pct(v, 0.5), base.0),
            ratio(pct(v, 0.99), base.1)
        );
    }
    let added = pct(&auto, 0.5).saturating_sub(base.0);
    println!();
    println!("| budget | measured | |");
    println!("|---|---:|---|");
    for (what, v) in [("pause", pct(&p, 0.5)), ("resume", pct(&r, 0.5))] {
        println!(
            "| {what} p50 ≤ 5 ms with 100 processes | {} ms | {} |",
            ms(v),
            if v <= Duration::from_millis(5) {
                "met"
            } else {
                "**not met**"
            }
        );
    }
    println!(
        "| auto-resume adds ≤ 5 ms to the first request | {} ms | {} |",
        ms(added),
        if added <= Duration::from_millis(5) {
            "met"
        } else {
            "**not met**"
        }
    );
    println!();
    Ok(())
}

fn count_procs(cg: &Path) -> usize {
    fn walk(p: &Path) -> usize {
        let own = std::fs::read_to_string(p.join("cgroup.procs"))
            .map(|s| s.lines().count())
            .unwrap_or(0);
        own + std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| walk(&e.path()))
            .sum::<usize>()
    }
    walk(cg)
}
