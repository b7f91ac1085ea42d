//! The process tracker's cost: sandboxed fork+exec of `/bin/true` with the
//! tracker off and on, side by side in one run; the programs' in-kernel
//! time per event from the kernel's BPF statistics; load-and-attach time.

use crate::{pct, us_or_ms};
use allox_integration::{cgroup2_mount, workspace_bin, BtrfsFs};
use allox_protocol::Response;
use allox_store::failpoint::Failpoints;
use allox_store::Store;
use allox_supervisor::plugin_api::{Plugin, Settings};
use allox_supervisor::plugin_host::Plugins;
use allox_supervisor::plugins::process_tree::ProcessTree;
use allox_supervisor::runs::{Runs, RunsConfig, SessionPaths};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        println!("## Process tracker\n\nSKIPPED: needs a kernel with BTF\n");
        return Ok(());
    }
    let mount = cgroup2_mount().ok_or_else(|| anyhow::anyhow!("no cgroup2 mount"))?;
    let cg = mount.join(format!("allox-bench-tracker-{}", std::process::id()));
    std::fs::create_dir_all(&cg)?;
    let r = bench(fs, &cg, quick);
    let _ = std::fs::write(cg.join("cgroup.kill"), "1");
    std::thread::sleep(Duration::from_millis(200));
    allox_integration::remove_cgroup_tree(&cg);
    r
}

fn bench(fs: &BtrfsFs, cg: &std::path::Path, quick: bool) -> anyhow::Result<()> {
    let n = if quick { 200 } else { 2000 };
    // Load and attach, 5 times.
    let mut loads = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let tr = allox_ebpf_probes::Tracker::load().map_err(|e| anyhow::anyhow!("{e}"))?;
        loads.push(t.elapsed());
        drop(tr);
    }
    let root = fs.path().join("tracker-store");
    std::fs::create_dir(&root)?;
    let store = Store::open(&root, Failpoints::default())?;
    store.agent_create("bench")?;
    let info = store.session_create("bench", "s")?;
    let exe = workspace_bin("allox-init");
    let off_cfg = RunsConfig::new(cg.join("off"), exe.clone(), fs.scratch().join("stage-off"));
    std::fs::create_dir_all(cg.join("off"))?;
    std::fs::create_dir_all(cg.join("on"))?;
    let off = Arc::new(Runs::new(off_cfg)?);
    let stats = allox_ebpf_probes::enable_stats().map_err(|e| anyhow::anyhow!("{e}"))?;
    let state = fs.scratch().join("tracker-state");
    std::fs::create_dir_all(&state)?;
    // The tracker as the daemon runs it: the process-tree plugin.
    let plugin = Arc::new(ProcessTree::new());
    let plugins = Arc::new(Plugins::load(
        vec![plugin.clone() as Arc<dyn Plugin>],
        &[allox_supervisor::plugins::process_tree::NAME.to_string()],
        // Only its routes: the others' plugins are not installed here.
        &allox_protocol::Request::ROUTES
            .iter()
            .copied()
            .filter(|(_, r)| r.plugin() == Some(allox_supervisor::plugins::process_tree::NAME))
            .collect::<Vec<_>>(),
        &[],
        Failpoints::default(),
    )?);
    let _running = plugins.start_guarded(&Settings {
        state_dir: state.clone(),
        process_events_max: 10_000_000,
        monitor: Default::default(),
        network: Default::default(),
        audit: Default::default(),
        effects: Default::default(),
        metrics: Default::default(),
        store: None,
    })?;
    let tracker = plugin.tracker()?;
    let mut on_cfg = RunsConfig::new(cg.join("on"), exe, fs.scratch().join("stage-on"));
    on_cfg.plugins = plugins.clone();
    let on = Arc::new(Runs::new(on_cfg)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let paths = || SessionPaths {
        current: info.current.clone().into(),
        shared: store.layout().shared("bench"),
        network: Default::default(),
    };
    let req = allox_integration::process_start("bench", "s", &["/bin/true"]);
    let once = |runs: &Arc<Runs>| -> anyhow::Result<Duration> {
        let t = Instant::now();
        match rt.block_on(runs.start(&req, paths(), None)) {
            Ok(Response::Exited(x)) if x.exit_code == Some(0) => Ok(t.elapsed()),
            other => anyhow::bail!("sandboxed /bin/true failed: {other:?}"),
        }
    };
    for _ in 0..20 {
        once(&off)?;
        once(&on)?;
    }
    let before = tracker.prog_stats();
    let (mut t_off, mut t_on) = (Vec::new(), Vec::new());
    // Alternating blocks of 50, so drift on the machine hits both.
    for _ in 0..n / 50 {
        for _ in 0..50 {
            t_off.push(once(&off)?);
        }
        for _ in 0..50 {
            t_on.push(once(&on)?);
        }
    }
    let after = tracker.prog_stats();
    drop(stats);
    std::thread::sleep(Duration::from_millis(200));
    tracker.drain_once();
    let recorded = tracker.store.query(
        &allox_protocol::ProcessEvents {
            limit: Some(10_000),
            ..Default::default()
        },
        0,
    )?;
    println!("## Process tracker\n");
    println!("Sandboxed fork+exec of `/bin/true` to its exit status through the library, {n} each, tracker off and on in alternating blocks of 50 (after 20 warm-up runs each).\n");
    println!("| what | n | p50 | p99 | ratio (p50) |");
    println!("|---|---:|---:|---:|---:|");
    let base = pct(&t_off, 0.5).as_secs_f64();
    for (what, v) in [("tracker off (baseline)", &t_off), ("tracker on", &t_on)] {
        println!(
            "| {what} | {} | {} | {} | {:.3}× |",
            v.len(),
            us_or_ms(pct(v, 0.5)),
            us_or_ms(pct(v, 0.99)),
            pct(v, 0.5).as_secs_f64() / base
        );
    }
    println!("\nIn-kernel time per program run (BPF statistics, `kernel.bpf_stats_enabled`), over the tracker-on runs and everything else the machine did meanwhile:\n");
    println!("| program | runs | total | per run |");
    println!("|---|---:|---:|---:|");
    for a in &after {
        let b = before.iter().find(|b| b.name == a.name);
        let runs = a.run_count - b.map_or(0, |b| b.run_count);
        let ns = a.run_time_ns - b.map_or(0, |b| b.run_time_ns);
        println!(
            "| `{}` | {runs} | {} | {:.2} µs |",
            a.name,
            us_or_ms(Duration::from_nanos(ns)),
            if runs > 0 {
                ns as f64 / runs as f64 / 1000.0
            } else {
                0.0
            }
        );
    }
    println!(
        "\nLoad and attach (`Tracker::load`, 5 times): p50 {}, max {}. Events recorded in the store: {}; lost in the kernel: {}.\n",
        us_or_ms(pct(&loads, 0.5)),
        us_or_ms(*loads.iter().max().unwrap_or(&Duration::ZERO)),
        recorded.events.len(),
        tracker.lost()
    );
    Ok(())
}
