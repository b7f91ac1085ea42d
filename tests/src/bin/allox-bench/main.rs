//! Store and protocol benchmark: prints Markdown tables.
//!
//! * checkpoint and rollback latency at 100, 10,000 and 100,000 files,
//!   beside `cp -a --reflink=always` of the same tree;
//! * what the commit before the answer adds to checkpoint, rollback and
//!   checkpoint delete (on and off, side by side);
//! * the RPC round trip of `system.ping` over the daemon's Unix socket,
//!   beside a bare echo over a Unix socket pair.
//!
//! Needs root, loop devices and Btrfs; run it through `scripts/bench.sh`.

use allox_integration::{missing, populate, workspace_bin, BtrfsFs, Daemon};
use allox_protocol::{CheckpointCreate, Ping, Request, SessionRollback};
use allox_store::failpoint::Failpoints;
use allox_store::Store;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod ab_bench;
mod container_bench;
mod durability_bench;
mod effects_bench;
mod effects_v3_bench;
mod files_bench;
mod fork_bench;
mod http_bench;
mod intercept_bench;
mod metrics_bench;
mod monitor_bench;
mod network_bench;
mod ports_bench;
mod quota_bench;
mod share_bench;
mod spawn_bench;
mod terminals_bench;
mod tracker_bench;
mod transfer_bench;
mod turns_bench;
mod vm_bench;
mod vmm_bench;

/// A daemon with process support for one benchmark: a store of its own
/// below `fs`, a cgroup of its own, its socket in the scratch directory.
/// Dropped, it is stopped and its cgroup emptied and removed.
pub(crate) struct BenchDaemon {
    pub daemon: Daemon,
    pub socket: std::path::PathBuf,
    cgroup: std::path::PathBuf,
}

impl BenchDaemon {
    pub fn start(fs: &BtrfsFs, name: &str, extra: &[&str]) -> anyhow::Result<BenchDaemon> {
        let mount = allox_integration::cgroup2_mount()
            .ok_or_else(|| anyhow::anyhow!("no cgroup2 mount"))?;
        let cgroup = mount.join(format!("allox-bench-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&cgroup)?;
        let root = fs.path().join(format!("{name}-store"));
        std::fs::create_dir(&root)?;
        let stage = fs.scratch().join(format!("stage-{name}"));
        let socket = fs.scratch().join(format!("{name}.sock"));
        let mut args = vec![
            "--cgroup-root".to_string(),
            cgroup.display().to_string(),
            "--sandbox-stage".to_string(),
            stage.display().to_string(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let daemon = Daemon::start(&root, &socket, &[], &args);
        Ok(BenchDaemon {
            daemon,
            socket,
            cgroup,
        })
    }
}

impl BenchDaemon {
    /// The daemon's own cgroup (its `--cgroup-root`).
    pub fn cgroup_dir(&self) -> &Path {
        &self.cgroup
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        self.daemon.terminate();
        let _ = std::fs::write(self.cgroup.join("cgroup.kill"), "1");
        std::thread::sleep(Duration::from_millis(200));
        allox_integration::remove_cgroup_tree(&self.cgroup);
    }
}

/// Writes `mib` MiB of random bytes to `path` (`dd` from `/dev/urandom`).
pub(crate) fn random_file(path: &std::path::Path, mib: u64) -> anyhow::Result<()> {
    let st = std::process::Command::new("dd")
        .args(["if=/dev/urandom", "bs=1M", "status=none"])
        .arg(format!("count={mib}"))
        .arg(format!("of={}", path.display()))
        .status()?;
    anyhow::ensure!(st.success(), "dd failed");
    Ok(())
}

pub(crate) fn pct(v: &[Duration], p: f64) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    let i = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
    s[i]
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

pub(crate) fn us_or_ms(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{:.0} µs", d.as_secs_f64() * 1e6)
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("?")
        .trim()
        .to_string();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    format!("{cores} cores, {cpu}, Linux {}", kernel.trim())
}

fn main() -> anyhow::Result<()> {
    if let Some(what) = missing() {
        anyhow::bail!("allox-bench needs {what}");
    }
    let quick = std::env::var("ALLOX_BENCH_QUICK").is_ok();
    println!("# Allox OS benchmark\n\nmachine: {}\n", machine());
    std::fs::create_dir_all("/var/tmp")?;
    let fs = BtrfsFs::new(8192)?;
    let only = std::env::var("ALLOX_BENCH_ONLY").unwrap_or_default();
    if only.is_empty() || only == "store" {
        store_bench(&fs, quick)?;
        rpc_bench(&fs, quick)?;
    }
    if only.is_empty() || only == "fork" {
        fork_bench::run(&fs, quick)?;
        fork_bench::pause(&fs, quick)?;
    }
    if only == "pause" {
        fork_bench::pause(&fs, quick)?;
    }
    if only.is_empty() || only == "durability" {
        durability_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "quota" {
        quota_bench::run(quick)?;
    }
    if only.is_empty() || only == "spawn" {
        spawn_bench::run(&fs, quick)?;
    }
    // Only when asked: it needs a second build to compare with.
    if only == "ab" {
        ab_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "network" {
        network_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "files" {
        files_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "http" {
        http_bench::run(&fs, quick)?;
    }
    if only == "intercept" {
        intercept_bench::run(quick)?;
    }
    if only.is_empty() || only == "http" || only == "ports" {
        ports_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "monitor" {
        monitor_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "share" {
        share_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "terminals" {
        terminals_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "turns" {
        turns_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "tracker" {
        tracker_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "container" {
        container_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "effects" {
        effects_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "effects-v3" {
        effects_v3_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "metrics" {
        metrics_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "transfer" {
        transfer_bench::run(&fs, quick)?;
    }
    if only.is_empty() || only == "vm" {
        vm_bench::run(quick)?;
    }
    if only.is_empty() || only == "vmm" {
        vmm_bench::run(quick)?;
    }
    Ok(())
}

fn store_bench(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let root = fs.path().join("store");
    std::fs::create_dir(&root)?;
    let st = Store::open(&root, Failpoints::default())?;
    st.agent_create("bench")?;
    println!("## Checkpoint and rollback (loop-backed Btrfs on the machine's disk)\n");
    println!("Each iteration: `checkpoint.create`, change one file, `session.rollback` to that checkpoint.");
    println!("*spaced*: the previous rollback's old tree has been removed before the next step (as between agent turns);");
    println!("*back-to-back*: no pause, so the kernel is still cleaning up the previous trees.");
    println!("Baselines in the same run: the bare snapshot ioctl of the same tree (the filesystem's floor), and");
    println!("`cp -a --reflink=always` of the same tree (a reflink copy, the usual way to snapshot without subvolumes).\n");
    println!("| files | mode | n | checkpoint p50 ms | checkpoint p99 ms | rollback p50 ms | rollback p99 ms | bare snapshot p50 ms | cp --reflink p50 ms | cp / checkpoint |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for files in [100usize, 10_000, 100_000] {
        let s = format!("s{files}");
        let info = st.session_create("bench", &s)?;
        let cur = Path::new(&info.current).to_path_buf();
        populate(&cur, files)?;
        Command::new("sync").status()?;
        let n = if quick { 30 } else { 100 };
        let mut rows = Vec::new();
        for spaced in [true, false] {
            let (mut ck, mut rb) = (Vec::new(), Vec::new());
            for i in 0..n {
                let c = format!("c{i}-{spaced}");
                if spaced {
                    st.wait_idle();
                    Command::new("sync").status()?;
                }
                let t = Instant::now();
                st.checkpoint_create(&CheckpointCreate {
                    agent_id: "bench".into(),
                    session_id: s.clone(),
                    checkpoint_id: c.clone(),
                    pinned: false,
                    label: None,
                })?;
                ck.push(t.elapsed());
                std::fs::write(cur.join("d000/f0"), format!("change {i}"))?;
                if spaced {
                    Command::new("sync").status()?;
                }
                let t = Instant::now();
                st.rollback(&SessionRollback {
                    agent_id: "bench".into(),
                    session_id: s.clone(),
                    checkpoint_id: c,
                    kill_processes: None,
                })?;
                rb.push(t.elapsed());
            }
            st.wait_idle();
            rows.push((spaced, ck, rb));
        }
        // Baselines after the store's own runs, so their clean-up load
        // (hundreds of thousands of unlinks for the cp copies) does not
        // land on the store's numbers.
        Command::new("sync").status()?;
        // Floor: bare read-only snapshots of the same tree.
        let mut bare = Vec::new();
        for i in 0..n.min(30) {
            let dest = fs.path().join(format!("bare-{files}-{i}"));
            let t = Instant::now();
            allox_store::btrfs::snapshot(&cur, &dest, true)?;
            bare.push(t.elapsed());
            allox_store::btrfs::remove_tree(&dest)?;
            Command::new("sync").status()?;
        }
        let reps = if files >= 100_000 || quick { 5 } else { 20 };
        let mut cp = Vec::new();
        for i in 0..reps {
            let dest = fs.path().join(format!("cp-{files}-{i}"));
            let t = Instant::now();
            let ok = Command::new("cp")
                .args(["-a", "--reflink=always"])
                .arg(&cur)
                .arg(&dest)
                .status()?
                .success();
            cp.push(t.elapsed());
            anyhow::ensure!(ok, "cp --reflink failed");
            std::fs::remove_dir_all(&dest)?;
            Command::new("sync").status()?;
        }
        for (spaced, ck, rb) in rows {
            let ratio = pct(&cp, 0.5).as_secs_f64() / pct(&ck, 0.5).as_secs_f64();
            println!(
                "| {files} | {} | {n} | {} | {} | {} | {} | {} | {} | {ratio:.0}× |",
                if spaced { "spaced" } else { "back-to-back" },
                ms(pct(&ck, 0.5)),
                ms(pct(&ck, 0.99)),
                ms(pct(&rb, 0.5)),
                ms(pct(&rb, 0.99)),
                ms(pct(&bare, 0.5)),
                ms(pct(&cp, 0.5)),
            );
        }
        st.session_delete("bench", &s)?;
        st.wait_idle();
    }
    println!();
    Ok(())
}

fn rpc_bench(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let root = fs.path().join("rpc-store");
    std::fs::create_dir(&root)?;
    let _ = workspace_bin("allox-init");
    let d = Daemon::start(&root, &fs.scratch().join("bench.sock"), &[], &[]);
    let mut c = d.client();
    let n = if quick { 2_000 } else { 20_000 };
    for _ in 0..1000 {
        c.call(Request::Ping(Ping {}))?
            .map_err(anyhow::Error::msg)?;
    }
    let mut rpc = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        c.call(Request::Ping(Ping {}))?
            .map_err(anyhow::Error::msg)?;
        rpc.push(t.elapsed());
    }
    // Baseline: the same number of bytes bounced off a thread over a Unix
    // socket pair, without any protocol.
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair()?;
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok(k) = b.read(&mut buf) {
            if k == 0 || b.write_all(&buf[..k]).is_err() {
                break;
            }
        }
    });
    let mut raw = Vec::with_capacity(n);
    let mut buf = [0u8; 64];
    for _ in 0..(n + 1000) {
        let t = Instant::now();
        a.write_all(&[1u8; 8])?;
        let mut got = 0;
        while got < 8 {
            got += a.read(&mut buf[got..8])?;
        }
        raw.push(t.elapsed());
    }
    drop(a);
    let _ = echo.join();
    let raw = &raw[1000..];
    println!("## RPC round trip\n");
    println!("| what | n | p50 µs | p99 µs | ratio p50 |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| bare Unix socket echo (baseline) | {n} | {} | {} | 1.0× |",
        us(pct(raw, 0.5)),
        us(pct(raw, 0.99))
    );
    println!(
        "| `system.ping` through the daemon | {n} | {} | {} | {:.1}× |",
        us(pct(&rpc, 0.5)),
        us(pct(&rpc, 0.99)),
        pct(&rpc, 0.5).as_secs_f64() / pct(raw, 0.5).as_secs_f64()
    );
    d.stop();
    Ok(())
}
