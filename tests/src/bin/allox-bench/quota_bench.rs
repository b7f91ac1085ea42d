//! What quota groups cost: snapshot, rollback and snapshot deletion with
//! quotas off and on, for `allox-bench` (`ALLOX_BENCH_ONLY=quota`).

use allox_integration::BtrfsFs;
use allox_supervisor::btrfs::{self, quota};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{pct, us_or_ms};

/// `n` files of 8 KiB (each its own data extent, unlike tiny inline files)
/// in directories of 1,000.
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

/// Waits until the kernel has dropped every deleted subvolume.
fn wait_dropped(path: &Path, ids: &[u64]) -> anyhow::Result<()> {
    loop {
        let live: Vec<u64> = btrfs::subvolumes(&std::fs::File::open(path)?)?
            .iter()
            .map(|r| r.id)
            .collect();
        if !ids.iter().any(|i| live.contains(i)) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct Row {
    files: usize,
    quotas: bool,
    snap: Vec<Duration>,
    rollback: Vec<Duration>,
    delete: Vec<Duration>,
    drop_all: Duration,
}

pub fn run(quick: bool) -> anyhow::Result<()> {
    let n = if quick { 20 } else { 100 };
    let sizes: &[usize] = if quick {
        &[100, 10_000]
    } else {
        &[100, 10_000, 100_000]
    };
    let mut rows = Vec::new();
    for &files in sizes {
        for quotas in [false, true] {
            let fs = BtrfsFs::new(8192)?;
            let root = fs.path();
            if quotas {
                quota::enable(root)?;
                quota::wait_rescan(root)?;
            }
            let cur = root.join("current");
            btrfs::create_subvolume(&cur)?;
            let limit = quotas.then_some(4u64 << 30);
            if quotas {
                quota::set_limit(root, btrfs::subvolume_id(&cur)?, limit)?;
            }
            populate_data(&cur, files)?;
            Command::new("sync").status()?;
            let (mut snap, mut rollback, mut delete) = (Vec::new(), Vec::new(), Vec::new());
            let mut ck_ids = Vec::new();
            for i in 0..n {
                let ck = root.join(format!("ck{i}"));
                let t = Instant::now();
                btrfs::snapshot(&cur, &ck, true)?;
                snap.push(t.elapsed());
                ck_ids.push(btrfs::subvolume_id(&ck)?);
                std::fs::write(cur.join("d000/f0"), format!("change {i}"))?;
                let fresh = root.join(format!(".rollback{i}"));
                let t = Instant::now();
                btrfs::snapshot(&ck, &fresh, false)?;
                if quotas {
                    quota::set_limit(root, btrfs::subvolume_id(&fresh)?, limit)?;
                }
                btrfs::exchange(&fresh, &cur)?;
                btrfs::commit(root)?;
                rollback.push(t.elapsed());
                let t = Instant::now();
                btrfs::delete_subvolume(&fresh)?;
                btrfs::commit(root)?;
                delete.push(t.elapsed());
            }
            Command::new("sync").status()?;
            let t = Instant::now();
            for i in 0..n {
                btrfs::delete_subvolume(&root.join(format!("ck{i}")))?;
            }
            btrfs::commit(root)?;
            wait_dropped(root, &ck_ids)?;
            Command::new("sync").status()?;
            let drop_all = t.elapsed();
            if quotas {
                let st = quota::status(root)?;
                anyhow::ensure!(
                    st.is_some_and(|s| !s.inconsistent),
                    "quota numbers became inconsistent: {st:?}"
                );
            }
            rows.push(Row {
                files,
                quotas,
                snap,
                rollback,
                delete,
                drop_all,
            });
        }
    }
    println!("## Quota groups\n");
    println!("Bare filesystem operations on a subvolume of 8 KiB files, {n} iterations, each on a new filesystem:");
    println!("*snapshot*: read-only snapshot ioctl (a checkpoint's disk step); *rollback*: writable snapshot of it,");
    println!("limit set (quotas on), exchange, commit; *delete*: delete the old tree and commit;");
    println!("*drop all*: delete the {n} read-only snapshots and wait until the kernel has dropped them.\n");
    println!("| files | quotas | snapshot p50 | snapshot p99 | rollback p50 | rollback p99 | delete p50 | delete p99 | drop all |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.files,
            if r.quotas { "on, limit" } else { "off" },
            us_or_ms(pct(&r.snap, 0.5)),
            us_or_ms(pct(&r.snap, 0.99)),
            us_or_ms(pct(&r.rollback, 0.5)),
            us_or_ms(pct(&r.rollback, 0.99)),
            us_or_ms(pct(&r.delete, 0.5)),
            us_or_ms(pct(&r.delete, 0.99)),
            us_or_ms(r.drop_all),
        );
    }
    println!();
    Ok(())
}
