//! Sessions that move (issue 34): `alloxctl session move` of a 10,000-file,
//! 100 MiB session with its checkpoints from one daemon to another (each on
//! its own loop-backed Btrfs), against the same subvolumes moved by hand
//! (`btrfs send -p … | btrfs receive`, one pipeline per subvolume) and
//! against `tar | tar` of its `current/` and checkpoints; then incremental
//! moves of ten changed files (`--since`) against the same incremental
//! send by hand. Side by side, round by round.

use super::{ms, pct, BenchDaemon};
use allox_integration::{populate, workspace_bin, BtrfsFs};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// As many as the test session has: what `tar` copies grows with
/// them (a whole tree each), what a send stream carries does not (each
/// checkpoint against the one before).
const CHECKPOINTS: usize = 20;

fn run_ok(what: &str, c: &mut Command) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let out = c.output()?;
    let took = t.elapsed();
    anyhow::ensure!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(took)
}

fn ctl(socket: &Path) -> Command {
    let mut c = Command::new(workspace_bin("alloxctl"));
    c.arg("--socket").arg(socket);
    c
}

/// `alloxctl session move bench s` from `a` to `b` as `to` (with
/// `--since`, only what came after that checkpoint).
fn move_cmd(a: &BenchDaemon, b: &BenchDaemon, to: &str, since: Option<&str>) -> Command {
    let mut c = ctl(&a.socket);
    c.args(["session", "move", "bench", "s", "--to"])
        .arg(&b.socket)
        .args(["--as", to]);
    if let Some(p) = since {
        c.args(["--since", p]);
    }
    c
}

fn sh(script: &str) -> Command {
    let mut c = Command::new("sh");
    c.args(["-ec", script]);
    c
}

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let other = BtrfsFs::new(4096)?;
    let a = BenchDaemon::start(fs, "transfer-a", &[])?;
    let b = BenchDaemon::start(&other, "transfer-b", &[])?;
    let sa = a.daemon.root.join("agents/bench/workspace/sessions/s");
    run_ok("agent", ctl(&a.socket).args(["agent", "create", "bench"]))?;
    run_ok(
        "session",
        ctl(&a.socket).args(["session", "create", "bench", "s"]),
    )?;
    let cur = sa.join("current");
    populate(&cur, 10_000)?;
    // 100 MiB that does not compress: ten files of 10 MiB.
    let mut seed: u64 = 0x9e3779b97f4a7c15;
    for i in 0..10 {
        let mut data = vec![0u8; 10 << 20];
        for chunk in data.chunks_mut(8) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            chunk.copy_from_slice(&seed.to_le_bytes()[..chunk.len()]);
        }
        std::fs::write(cur.join(format!("big{i}")), data)?;
    }
    for c in 0..CHECKPOINTS {
        for f in 0..100 {
            std::fs::write(
                cur.join(format!("d{:03}/f{}", f / 10, f * 10 + c)),
                format!("checkpoint {c}\n"),
            )?;
        }
        run_ok(
            "checkpoint",
            ctl(&a.socket).args(["checkpoint", "create", "bench", "s", &format!("c{c}")]),
        )?;
    }
    std::fs::write(cur.join("after"), "not checkpointed\n")?;
    Command::new("sync").status()?;

    println!("## Sessions that move (issue 34)\n");
    println!("A session of 10,000 files and 100 MiB (ten 10 MiB files that do not compress) with {CHECKPOINTS}");
    println!("checkpoints and a change after the last, moved from one daemon to another, each on its own");
    println!("loop-backed Btrfs on the machine's disk. *ours*: `alloxctl session move` as a whole command");
    println!("(export, the archive through alloxctl, import, the session made to appear). *by hand*: the same");
    println!("subvolumes with `btrfs send [-p parent] X | btrfs receive` (each checkpoint against the one before,");
    println!("then a read-only snapshot of `current/` against the last), no checks. *tar*: `tar -cf - current");
    println!("checkpoints | tar -xf -` on the other filesystem. Each round moves to a new name; what a round made");
    println!("is removed between rounds, outside the timing.\n");
    let n = if quick { 1 } else { 3 };
    let (mut ours, mut hand, mut tar) = (Vec::new(), Vec::new(), Vec::new());
    let hand_dir = other.path().join("by-hand");
    let tar_dir = other.path().join("tar");
    for round in 0..n {
        let to = format!("r{round}");
        ours.push(run_ok("move", &mut move_cmd(&a, &b, &to, None))?);
        let snap = sa.join(format!(".bench-{round}"));
        let dest = hand_dir.join(&to);
        std::fs::create_dir_all(&dest)?;
        let mut script = String::new();
        let mut parent: Option<String> = None;
        for c in 0..CHECKPOINTS {
            let p = sa.join("checkpoints").join(format!("c{c}"));
            script += &format!(
                "btrfs send -q {} {} | btrfs receive -q {}\n",
                parent
                    .as_ref()
                    .map(|p| format!("-p {p}"))
                    .unwrap_or_default(),
                p.display(),
                dest.display()
            );
            parent = Some(p.display().to_string());
        }
        script = format!(
            "btrfs -q subvolume snapshot -r {} {}\n{script}btrfs send -q -p {} {} | btrfs receive -q {}\n",
            cur.display(),
            snap.display(),
            parent.unwrap_or_default(),
            snap.display(),
            dest.display()
        );
        hand.push(run_ok("by hand", &mut sh(&script))?);
        let tdest = tar_dir.join(&to);
        std::fs::create_dir_all(&tdest)?;
        tar.push(run_ok(
            "tar",
            &mut sh(&format!(
                "tar -C {} -cf - current checkpoints | tar -C {} -xf -",
                sa.display(),
                tdest.display()
            )),
        )?);
        // Outside the timing: what the round made goes.
        run_ok(
            "delete",
            ctl(&b.socket).args(["session", "delete", "bench", &to]),
        )?;
        run_ok(
            "clean",
            &mut sh(&format!(
                "btrfs -q subvolume delete {snap} {dest}/*; rm -rf {tdest}",
                snap = snap.display(),
                dest = dest.display(),
                tdest = tdest.display()
            )),
        )?;
        Command::new("sync").status()?;
    }
    println!("| what | n | p50 | p99 | ours ÷ it (p50) |");
    println!("|---|---:|---:|---:|---:|");
    let o50 = pct(&ours, 0.5);
    for (what, v) in [
        ("ours: `alloxctl session move`", &ours),
        ("by hand: `btrfs send -p | btrfs receive`", &hand),
        ("`tar | tar`", &tar),
    ] {
        println!(
            "| {what} | {} | {} ms | {} ms | {:.2}× |",
            v.len(),
            ms(pct(v, 0.5)),
            ms(pct(v, 0.99)),
            o50.as_secs_f64() / pct(v, 0.5).as_secs_f64()
        );
    }

    // Incremental: the copy on b is kept; each round changes ten files,
    // checkpoints, and moves what came after the previous checkpoint.
    run_ok("base", &mut move_cmd(&a, &b, "inc", None))?;
    let rounds = if quick { 3 } else { 10 };
    let (mut inc, mut inc_hand) = (Vec::new(), Vec::new());
    let mut prev = format!("c{}", CHECKPOINTS - 1);
    let hand_inc = hand_dir.join("inc");
    std::fs::create_dir_all(&hand_inc)?;
    run_ok(
        "base by hand",
        &mut sh(&format!(
            "btrfs send -q {} | btrfs receive -q {}",
            sa.join("checkpoints").join(&prev).display(),
            hand_inc.display()
        )),
    )?;
    for r in 0..rounds {
        for f in 0..10 {
            std::fs::write(
                cur.join(format!("d009/f{}", 9000 + f)),
                format!("round {r}\n"),
            )?;
        }
        let c = format!("i{r}");
        run_ok(
            "checkpoint",
            ctl(&a.socket).args(["checkpoint", "create", "bench", "s", &c]),
        )?;
        Command::new("sync").status()?;
        inc.push(run_ok(
            "incremental move",
            &mut move_cmd(&a, &b, "inc", Some(&prev)),
        )?);
        inc_hand.push(run_ok(
            "incremental by hand",
            &mut sh(&format!(
                "btrfs send -q -p {} {} | btrfs receive -q {}",
                sa.join("checkpoints").join(&prev).display(),
                sa.join("checkpoints").join(&c).display(),
                hand_inc.display()
            )),
        )?);
        prev = c;
    }
    let over = pct(&inc, 0.5).saturating_sub(pct(&inc_hand, 0.5));
    println!();
    println!("Incremental moves of ten changed files and one checkpoint (`--since` the previous), against the");
    println!("same checkpoint sent by hand (`btrfs send -p | btrfs receive`), which stands for the transfer:\n");
    println!("| what | n | p50 | p99 |");
    println!("|---|---:|---:|---:|");
    println!(
        "| ours: `alloxctl session move --since` | {} | {} ms | {} ms |",
        inc.len(),
        ms(pct(&inc, 0.5)),
        ms(pct(&inc, 0.99))
    );
    println!(
        "| by hand: `btrfs send -p | btrfs receive` | {} | {} ms | {} ms |",
        inc_hand.len(),
        ms(pct(&inc_hand, 0.5)),
        ms(pct(&inc_hand, 0.99))
    );
    println!();
    let by_hand = o50.as_secs_f64() / pct(&hand, 0.5).as_secs_f64();
    let vs_tar = pct(&tar, 0.5).as_secs_f64() / o50.as_secs_f64();
    println!("| budget | measured | |");
    println!("|---|---:|---|");
    println!(
        "| move ≤ 1.5× by hand | {by_hand:.2}× | {} |",
        if by_hand <= 1.5 { "met" } else { "**not met**" }
    );
    println!(
        "| move ≥ 5× faster than `tar | tar` | {vs_tar:.2}× | {} |",
        if vs_tar >= 5.0 { "met" } else { "**not met**" }
    );
    println!(
        "| incremental move ≤ 100 ms over the transfer by hand | {} ms | {} |",
        ms(over),
        if over <= Duration::from_millis(100) {
            "met"
        } else {
            "**not met**"
        }
    );
    println!();
    Ok(())
}
