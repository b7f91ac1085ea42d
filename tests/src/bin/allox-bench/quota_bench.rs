//! What a session quota costs: checkpoint, rollback and checkpoint
//! deletion through the store with Btrfs quota groups off and on, for
//! `allox-bench` (`ALLOX_BENCH_ONLY=quota`).

use allox_integration::BtrfsFs;
use allox_protocol::{CheckpointCreate, SessionRollback};
use allox_store::btrfs::{self, quota};
use allox_store::failpoint::Failpoints;
use allox_store::{Store, StoreOptions};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{pct, us_or_ms};

/// `n` files of 8 KiB (each its own data extent, as most files of a source
/// tree are, unlike the tiny inline files of the main benchmark) in
/// directories of 1,000.
fn populate_data(dir: &Path, n: usize) -> std::io::Result<()> {
    let body = vec![b'x'; 8192];
    for i in 0..n {
        let sub = dir.join(format!("d{:03}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir_all(&sub)?;
        }
        let mut b = body.clone();
        b[..8].copy_from_slice(&(i as u64).to_le_bytes());
        std::fs::write(sub.join(format!("f{i}")), b)?;
    }
    Ok(())
}

/// Waits until the kernel has dropped every deleted subvolume: until the
/// root tree holds no orphan item (one marks each deleted subvolume not
/// yet dropped). `btrfs filesystem sync` (`BTRFS_IOC_SYNC`) wakes the
/// kernel's cleaner, which otherwise drops them only every 30 seconds.
fn wait_dropped(path: &Path) -> anyhow::Result<()> {
    const ORPHAN_OBJECTID: u64 = u64::MAX - 4;
    const ORPHAN_ITEM: u8 = 48;
    let fd = std::fs::File::open(path)?;
    let mut search = btrfs::TreeSearch::default();
    loop {
        Command::new("btrfs")
            .args(["filesystem", "sync"])
            .arg(path)
            .stdout(std::process::Stdio::null())
            .status()?;
        let mut pending = 0;
        let key = btrfs::SearchKey::object(
            btrfs::ROOT_TREE_ID,
            ORPHAN_OBJECTID,
            ORPHAN_ITEM..=ORPHAN_ITEM,
        );
        search.run(&fd, key, |_| pending += 1)?;
        if pending == 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct Row {
    files: usize,
    quotas: bool,
    checkpoint: Vec<Duration>,
    rollback: Vec<Duration>,
    bare: Vec<Duration>,
    delete_all: Duration,
    open: Duration,
}

pub fn run(quick: bool) -> anyhow::Result<()> {
    let n = if quick { 10 } else { 50 };
    let mut rows = Vec::new();
    for files in [100usize, 10_000] {
        for quotas in [false, true] {
            let fs = BtrfsFs::new(8192)?;
            let root = fs.path().join("store");
            std::fs::create_dir(&root)?;
            // The session is made and filled first, so that turning quota
            // groups on (at the next open) counts it, as on a store that
            // ran without them.
            let st = Store::open(&root, Failpoints::default())?;
            st.agent_create("a")?;
            let info = st.session_create("a", "s")?;
            let cur = Path::new(&info.current).to_path_buf();
            populate_data(&cur, files)?;
            drop(st);
            Command::new("sync").status()?;
            let t = Instant::now();
            let st = Store::open_with(
                &root,
                Failpoints::default(),
                StoreOptions {
                    session_quota: quotas.then_some(4 << 30),
                    ..Default::default()
                },
            )?;
            let open = t.elapsed();
            let (mut checkpoint, mut rollback) = (Vec::new(), Vec::new());
            for i in 0..n {
                let c = format!("c{i}");
                let t = Instant::now();
                st.checkpoint_create(&CheckpointCreate {
                    agent_id: "a".into(),
                    session_id: "s".into(),
                    checkpoint_id: c.clone(),
                    pinned: false,
                    label: None,
                })?;
                checkpoint.push(t.elapsed());
                std::fs::write(cur.join("d000/f0"), format!("change {i}"))?;
                let t = Instant::now();
                st.rollback(&SessionRollback {
                    agent_id: "a".into(),
                    session_id: "s".into(),
                    checkpoint_id: c,
                    kill_processes: None,
                })?;
                rollback.push(t.elapsed());
            }
            st.wait_idle();
            wait_dropped(fs.path())?;
            Command::new("sync").status()?;
            // The floor: the bare snapshot ioctl of the same tree.
            let mut bare = Vec::new();
            for i in 0..n.min(20) {
                let dest = fs.path().join(format!("bare{i}"));
                let t = Instant::now();
                btrfs::snapshot(&cur, &dest, true)?;
                bare.push(t.elapsed());
                btrfs::remove_tree(&dest)?;
                wait_dropped(fs.path())?;
            }
            // Deleting the checkpoints, until the kernel has dropped them
            // (the known slow path of quota groups).
            let t = Instant::now();
            for i in 0..n {
                st.checkpoint_delete("a", "s", &format!("c{i}"))?;
            }
            st.wait_idle();
            wait_dropped(fs.path())?;
            let delete_all = t.elapsed();
            if quotas {
                let s = quota::status(fs.path())?;
                anyhow::ensure!(
                    s.is_some_and(|s| !s.inconsistent),
                    "quota numbers became inconsistent: {s:?}"
                );
            }
            drop(st);
            rows.push(Row {
                files,
                quotas,
                checkpoint,
                rollback,
                bare,
                delete_all,
                open,
            });
        }
    }
    println!("## Session quota (Btrfs quota groups)\n");
    println!("Through the store library, a session of 8 KiB files, {n} iterations back to back, each configuration on a new filesystem;");
    println!("quotas on: quota groups on and the session limited to 4 GiB. Each iteration: `checkpoint.create`, change one file,");
    println!("`session.rollback` to that checkpoint (the old tree is deleted in the background, as always).");
    println!("*bare snapshot*: the snapshot ioctl alone afterwards, the tree's deletion waited for between samples;");
    println!("*delete all*: `checkpoint.delete` of the {n} checkpoints until the kernel has dropped them;");
    println!("*open*: opening the store with the session already filled (quotas on: turning quota groups on and the rescan).\n");
    println!("| files | quotas | open | checkpoint p50 | checkpoint p99 | rollback p50 | rollback p99 | bare snapshot p50 | delete all {n} |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.files,
            if r.quotas { "on" } else { "off" },
            us_or_ms(r.open),
            us_or_ms(pct(&r.checkpoint, 0.5)),
            us_or_ms(pct(&r.checkpoint, 0.99)),
            us_or_ms(pct(&r.rollback, 0.5)),
            us_or_ms(pct(&r.rollback, 0.99)),
            us_or_ms(pct(&r.bare, 0.5)),
            us_or_ms(r.delete_all),
        );
    }
    println!();
    Ok(())
}
