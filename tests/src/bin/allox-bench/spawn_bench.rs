//! Sandboxed spawn and session kill, for `allox-bench`.

use allox_integration::{cgroup2_mount, workspace_bin, BtrfsFs, Daemon};
use allox_protocol::{ProcessStart, Request, Response, SessionCreate};
use allox_store::failpoint::Failpoints;
use allox_store::Store;
use allox_supervisor::runs::{Runs, RunsConfig, SessionPaths};
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{pct, us_or_ms};

/// The bubblewrap command line compared against, the same as before.
const BWRAP: [&str; 11] = [
    "--unshare-pid",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--ro-bind",
    "/",
    "/",
    "--tmpfs",
    "/tmp",
    "/bin/true",
];

/// New mount, PID and IPC namespaces (what a run gets of its own), a
/// fork into them and `/bin/true`: util-linux's `unshare`.
const UNSHARE: [&str; 5] = ["--mount", "--pid", "--ipc", "--fork", "/bin/true"];

pub(crate) fn start(argv: &[&str], wait: bool) -> ProcessStart {
    ProcessStart {
        agent_id: "bench".into(),
        session_id: "s".into(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::new(),
        cwd: None,
        stdin: Some(Default::default()),
        timeout_ms: None,
        wait,
        stream: false,
        pty: None,
        trace: None,
        on_disconnect: Default::default(),
        recovery: None,
    }
}

/// A daemon of `exe` for this benchmark, named `name`: its store, cgroup
/// root and stage of its own, its socket `NAME.sock` in the scratch
/// directory; `prepared`: its `--prepared-runs`.
pub(crate) fn daemon(
    fs: &BtrfsFs,
    cg_root: &std::path::Path,
    exe: &std::path::Path,
    name: &str,
    prepared: &str,
) -> anyhow::Result<Daemon> {
    let root = fs.path().join(format!("{name}-daemon"));
    std::fs::create_dir(&root)?;
    let cg = cg_root.join(name);
    std::fs::create_dir_all(&cg)?;
    let stage = fs.scratch().join(format!("{name}-stage"));
    Ok(Daemon::start_exe(
        exe,
        &root,
        &fs.scratch().join(format!("{name}.sock")),
        &[],
        &[
            "--cgroup-root",
            &cg.display().to_string(),
            "--sandbox-stage",
            &stage.display().to_string(),
            "--prepared-runs",
            prepared,
        ],
        None,
    ))
}

/// Agent `bench` and its session `s`, which the runs of [`start`] use.
pub(crate) fn bench_session(c: &mut allox_ctl::client::Client) -> anyhow::Result<()> {
    c.call(Request::AgentCreate(allox_protocol::AgentCreate::new(
        "bench",
    )))?
    .map_err(anyhow::Error::msg)?;
    c.call(Request::SessionCreate(SessionCreate::new("bench", "s")))?
        .map_err(anyhow::Error::msg)?;
    Ok(())
}

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let mount = cgroup2_mount().ok_or_else(|| anyhow::anyhow!("no cgroup2 mount"))?;
    let cg_root = mount.join(format!("allox-bench-{}", std::process::id()));
    std::fs::create_dir_all(&cg_root)?;
    let result = bench(fs, &cg_root, quick);
    let _ = std::fs::write(cg_root.join("cgroup.kill"), "1");
    std::thread::sleep(Duration::from_millis(200));
    allox_integration::remove_cgroup_tree(&cg_root);
    result
}

fn bench(fs: &BtrfsFs, cg_root: &std::path::Path, quick: bool) -> anyhow::Result<()> {
    let n = if quick { 100 } else { 1000 };
    let root = fs.path().join("spawn-store");
    std::fs::create_dir(&root)?;
    let store = Store::open(&root, Failpoints::default())?;
    store.agent_create("bench")?;
    let info = store.session_create("bench", "s")?;
    let exe = workspace_bin("allox-init");
    let mut rc = RunsConfig::new(
        cg_root.to_path_buf(),
        exe.clone(),
        fs.scratch().join("stage"),
    );
    rc.prepare_runs = true;
    let runs = Arc::new(Runs::new(rc)?);
    // The baseline: each run's PID 1 made when the run is asked for.
    let fresh_cg = cg_root.join("fresh");
    std::fs::create_dir_all(&fresh_cg)?;
    let mut rc = RunsConfig::new(fresh_cg, exe, fs.scratch().join("stage-fresh"));
    rc.prepare_runs = false;
    let fresh_runs = Arc::new(Runs::new(rc)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let paths = || SessionPaths {
        current: info.current.clone().into(),
        shared: store.layout().shared("bench"),
        network: Default::default(),
    };
    // Library: process.start with wait, /bin/true; the next run made
    // ahead, and (alternating) made when asked for.
    let mut lib = Vec::new();
    let mut lib_fresh = Vec::new();
    for i in 0..n + 20 {
        for (runs, out) in [(&runs, &mut lib), (&fresh_runs, &mut lib_fresh)] {
            let t = Instant::now();
            let r = rt.block_on(runs.start(&start(&["/bin/true"], true), paths(), None));
            let el = t.elapsed();
            match r {
                Ok(Response::Exited(x)) if x.exit_code == Some(0) => {}
                other => anyhow::bail!("sandboxed /bin/true failed: {other:?}"),
            }
            if i >= 20 {
                out.push(el);
            }
        }
    }
    // Baselines in the same run.
    let mut plain = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        Command::new("/bin/true").status()?;
        plain.push(t.elapsed());
    }
    // The namespaces a run needs and nothing else (no mounts, cgroup,
    // filter or supervisor): the floor of any sandbox that makes them.
    let mut unshare = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let ok = Command::new("unshare").args(UNSHARE).status()?.success();
        unshare.push(t.elapsed());
        anyhow::ensure!(ok, "unshare failed");
    }
    let mut bwrap = Vec::new();
    let have_bwrap = allox_integration::which("bwrap").is_some();
    if have_bwrap {
        for _ in 0..n {
            let t = Instant::now();
            let ok = Command::new("bwrap").args(BWRAP).status()?.success();
            bwrap.push(t.elapsed());
            anyhow::ensure!(ok, "bwrap failed");
        }
    }
    // End to end over the RPC, through the real daemon.
    let exe = workspace_bin("allox-init");
    let d = daemon(fs, cg_root, &exe, "spawn", "always")?;
    // The same daemon without runs made ahead.
    let fd = daemon(fs, cg_root, &exe, "spawn-fresh", "never")?;
    let mut c = d.client();
    let mut fc = fd.client();
    for c in [&mut c, &mut fc] {
        bench_session(c)?;
    }
    let mut e2e = Vec::new();
    let mut e2e_fresh = Vec::new();
    for i in 0..n + 20 {
        for (c, out) in [(&mut c, &mut e2e), (&mut fc, &mut e2e_fresh)] {
            let t = Instant::now();
            let r = c.call(Request::ProcessStart(start(&["/bin/true"], true)))?;
            let el = t.elapsed();
            anyhow::ensure!(
                matches!(r, Ok(Response::Exited(ref x)) if x.exit_code == Some(0)),
                "{r:?}"
            );
            if i >= 20 {
                out.push(el);
            }
        }
    }
    // As an agent calls it: a pause between commands (the time it thinks),
    // in which a run made ahead is ready.
    let gap = Duration::from_millis(20);
    let spaced = n / 5;
    let mut e2e_gap = Vec::new();
    let mut e2e_gap_fresh = Vec::new();
    for i in 0..spaced + 5 {
        for (c, out) in [(&mut c, &mut e2e_gap), (&mut fc, &mut e2e_gap_fresh)] {
            std::thread::sleep(gap);
            let t = Instant::now();
            let r = c.call(Request::ProcessStart(start(&["/bin/true"], true)))?;
            let el = t.elapsed();
            anyhow::ensure!(
                matches!(r, Ok(Response::Exited(ref x)) if x.exit_code == Some(0)),
                "{r:?}"
            );
            if i >= 5 {
                out.push(el);
            }
        }
    }
    // Whole commands as a user types them, alternating so that both see
    // the same machine.
    let ctl = workspace_bin("alloxctl");
    let sock = fs.scratch().join("spawn.sock");
    let fsock = fs.scratch().join("spawn-fresh.sock");
    let mut ctl_exec = Vec::new();
    let mut ctl_exec_fresh = Vec::new();
    let mut ctl_ping = Vec::new();
    let mut bwrap_cmd = Vec::new();
    for i in 0..n + 5 {
        let t = Instant::now();
        let ok = Command::new(&ctl)
            .arg("--socket")
            .arg(&sock)
            .args(["exec", "bench", "s", "--", "/bin/true"])
            .status()?
            .success();
        let el = t.elapsed();
        anyhow::ensure!(ok, "alloxctl exec failed");
        let t = Instant::now();
        let ok = Command::new(&ctl)
            .arg("--socket")
            .arg(&fsock)
            .args(["exec", "bench", "s", "--", "/bin/true"])
            .status()?
            .success();
        if i >= 5 {
            ctl_exec_fresh.push(t.elapsed());
        }
        anyhow::ensure!(ok, "alloxctl exec (no run made ahead) failed");
        let t = Instant::now();
        let ok = Command::new(&ctl)
            .arg("--socket")
            .arg(&sock)
            .arg("ping")
            .stdout(std::process::Stdio::null())
            .status()?
            .success();
        let el_ping = t.elapsed();
        anyhow::ensure!(ok, "alloxctl ping failed");
        if i >= 5 {
            ctl_exec.push(el);
            ctl_ping.push(el_ping);
        }
        if have_bwrap {
            let t = Instant::now();
            let ok = Command::new("bwrap").args(BWRAP).status()?.success();
            anyhow::ensure!(ok, "bwrap failed");
            if i >= 5 {
                bwrap_cmd.push(t.elapsed());
            }
        }
    }
    d.stop();
    fd.stop();

    println!("## Sandboxed spawn\n");
    println!("`/bin/true` from start to exit status, {n} times each, in one run.\n");
    println!("| what | p50 | p99 | p50 / plain spawn |");
    println!("|---|---:|---:|---:|");
    let row = |name: &str, v: &[Duration]| {
        println!(
            "| {name} | {} | {} | {:.1}× |",
            us_or_ms(pct(v, 0.5)),
            us_or_ms(pct(v, 0.99)),
            pct(v, 0.5).as_secs_f64() / pct(&plain, 0.5).as_secs_f64()
        );
    };
    row("plain spawn (`std::process::Command`, posix_spawn)", &plain);
    row(
        "`unshare --mount --pid --ipc --fork` (the namespaces alone)",
        &unshare,
    );
    if have_bwrap {
        row(
            "`bwrap --unshare-pid --dev /dev --proc /proc --ro-bind / / --tmpfs /tmp`",
            &bwrap,
        );
    }
    row(
        "Allox sandbox, library (`Runs::start`, wait), PID 1 made when asked (`prepare_runs` off)",
        &lib_fresh,
    );
    row(
        "Allox sandbox, library (`Runs::start`, wait), the next run made ahead",
        &lib,
    );
    row(
        "Allox sandbox, `process.start` with wait over the socket, `--prepared-runs never`",
        &e2e_fresh,
    );
    row(
        "Allox sandbox, `process.start` with wait over the socket, the next run made ahead",
        &e2e,
    );
    println!();
    println!(
        "With a pause of {} ms before each start (as an agent calls it), {spaced} each, alternating:\n",
        gap.as_millis()
    );
    println!("| what | p50 | p99 | p50 / plain spawn |");
    println!("|---|---:|---:|---:|");
    row(
        "`process.start` with wait, `--prepared-runs never`",
        &e2e_gap_fresh,
    );
    row(
        "`process.start` with wait, the next run made ahead",
        &e2e_gap,
    );
    println!();
    let p50 = |v: &[Duration]| pct(v, 0.5).as_secs_f64();
    println!(
        "Made ahead ÷ made when asked, p50: library {:.2}, `process.start` {:.2}, `process.start` after a pause {:.2}, `alloxctl exec` {:.2}.\n",
        p50(&lib) / p50(&lib_fresh),
        p50(&e2e) / p50(&e2e_fresh),
        p50(&e2e_gap) / p50(&e2e_gap_fresh),
        p50(&ctl_exec) / p50(&ctl_exec_fresh),
    );
    if have_bwrap {
        println!(
            "Ratios of p50: library / bwrap {:.2}, `process.start` / bwrap {:.2}, `process.start` / plain spawn {:.2}, `process.start` / namespaces alone {:.2}; after a pause, `process.start` / bwrap {:.2}, / plain spawn {:.2}.\n",
            p50(&lib) / p50(&bwrap),
            p50(&e2e) / p50(&bwrap),
            p50(&e2e) / p50(&plain),
            p50(&e2e) / p50(&unshare),
            p50(&e2e_gap) / p50(&bwrap),
            p50(&e2e_gap) / p50(&plain),
        );
    }
    println!("## Whole commands\n");
    println!("Each a new process started by the benchmark, from spawn to exit, {n} times each, alternating.\n");
    println!("| command | p50 | p99 | p50 / bwrap |");
    println!("|---|---:|---:|---:|");
    let whole = |name: &str, v: &[Duration]| {
        let ratio = if bwrap_cmd.is_empty() {
            "–".to_string()
        } else {
            format!(
                "{:.2}×",
                pct(v, 0.5).as_secs_f64() / pct(&bwrap_cmd, 0.5).as_secs_f64()
            )
        };
        println!(
            "| {name} | {} | {} | {ratio} |",
            us_or_ms(pct(v, 0.5)),
            us_or_ms(pct(v, 0.99)),
        );
    };
    if have_bwrap {
        whole(
            "`bwrap --unshare-pid --dev /dev --proc /proc --ro-bind / / --tmpfs /tmp /bin/true`",
            &bwrap_cmd,
        );
    }
    whole(
        "`alloxctl exec bench s -- /bin/true`, daemon with `--prepared-runs never`",
        &ctl_exec_fresh,
    );
    whole(
        "`alloxctl exec bench s -- /bin/true`, the next run made ahead",
        &ctl_exec,
    );
    whole("`alloxctl ping`", &ctl_ping);
    println!();

    // Killing a session of N processes.
    println!("## Session kill\n");
    println!(
        "A run forks N `sleep`s; time of `cgroup.kill` until `populated 0`. Baseline in the same"
    );
    println!(
        "run: the same N `sleep`s started by the benchmark itself, outside any sandbox, each sent"
    );
    println!(
        "SIGKILL with kill(2) and waited for (the kernel's own cost of ending N processes).\n"
    );
    println!("| processes | reps | session kill p50 | session kill p99 | kill(2) and wait p50 | kill(2) and wait p99 | session kill / kill(2) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for procs in [10usize, 100, 1000] {
        let reps = if quick {
            3
        } else if procs >= 1000 {
            10
        } else {
            20
        };
        let (mut v, mut base) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let script = format!("for i in $(seq {procs}); do sleep 1000 & done; wait");
            rt.block_on(runs.start(&start(&["/bin/sh", "-c", &script], false), paths(), None))?;
            let t0 = Instant::now();
            while runs.live("bench", "s") < procs + 1 {
                anyhow::ensure!(
                    t0.elapsed() < Duration::from_secs(60),
                    "processes did not start"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            let dir = runs.cgroups().session_dir("bench", "s");
            let t = Instant::now();
            runs.kill_tree(&dir, false)?;
            v.push(t.elapsed());
            base.push(kill_plain(procs)?);
        }
        let (p50, b50) = (pct(&v, 0.5), pct(&base, 0.5));
        println!(
            "| {procs} | {reps} | {} | {} | {} | {} | {:.2}× |",
            us_or_ms(p50),
            us_or_ms(pct(&v, 0.99)),
            us_or_ms(b50),
            us_or_ms(pct(&base, 0.99)),
            p50.as_secs_f64() / b50.as_secs_f64()
        );
    }
    println!();
    Ok(())
}

/// Starts `n` `sleep`s as children, lets them settle, then times SIGKILL
/// to each and the wait for all of them.
fn kill_plain(n: usize) -> anyhow::Result<Duration> {
    let mut kids = (0..n)
        .map(|_| {
            Command::new("sleep")
                .arg("1000")
                .stdin(std::process::Stdio::null())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    for k in &mut kids {
        k.kill()?;
    }
    for k in &mut kids {
        k.wait()?;
    }
    Ok(t.elapsed())
}
