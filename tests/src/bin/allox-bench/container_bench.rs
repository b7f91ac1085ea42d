//! Allox as a container under podman: the image (build time, size), the
//! time from `podman run` to the first answer on the control socket, and
//! `podman stop` with a run going; beside the same supervisor started as a
//! plain daemon on a host Btrfs mount, and podman starting the image's
//! `sleep` (the runtime's own floor), in the same run.

use crate::{pct, us_or_ms};
use allox_integration::container::{self, podman, Container, LoopDev, Spec, TAG};
use allox_integration::{alloxctl, workspace_bin, BtrfsFs};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn until_ping(socket: &std::path::Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while alloxctl(socket, &["ping"]).0 != 0 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "no answer on {}",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    if let Some(what) = container::missing() {
        println!("## Container mode (podman)\n\nSKIPPED: needs {what}\n");
        return Ok(());
    }
    let n = if quick { 3 } else { 10 };
    let dir = tempfile::tempdir_in("/var/tmp")?;
    let t0 = Instant::now();
    let img = container::build(dir.path(), TAG);
    let build = t0.elapsed();
    let img2 = container::build(&dir.path().join("again"), TAG);
    anyhow::ensure!(img.digest == img2.digest, "two builds, two digests");
    container::image();

    // Baseline 1: the runtime's floor: `podman run -d` of the image's
    // `sleep` until podman returns (the container started), then removed.
    let mut floor = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let out = container::podman_run(&[
            "-d",
            "--name",
            "allox-bench-floor",
            "--network",
            "host",
            "--entrypoint",
            "/usr/bin/sleep",
            TAG,
            "600",
        ]);
        floor.push(t.elapsed());
        anyhow::ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        podman(&["rm", "-f", "-t", "0", "allox-bench-floor"]);
    }
    // Baseline 2: the supervisor as a host daemon on a Btrfs directory.
    let mut host = Vec::new();
    for i in 0..n {
        let root = fs.path().join(format!("container-bench-{i}"));
        std::fs::create_dir_all(&root)?;
        let sock = dir.path().join(format!("host-{i}.sock"));
        let t = Instant::now();
        let mut d = Command::new(workspace_bin("allox-init"))
            .arg("supervise")
            .arg("--root")
            .arg(&root)
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .stderr(Stdio::null())
            .spawn()?;
        until_ping(&sock)?;
        host.push(t.elapsed());
        let _ = Command::new("kill").arg(d.id().to_string()).status();
        let _ = d.wait();
    }
    // The container: first start on a blank device (formatted), then
    // starts on the formatted store, each stopped with a run going.
    let dev = LoopDev::blank(dir.path(), "store.img", 1024);
    let run_dir = dir.path().join("run");
    let (mut first, mut ready, mut stop) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..=n {
        let args: &[&str] = if i == 0 { &["--format-blank"] } else { &[] };
        let t = Instant::now();
        let c = Container::start(&Spec {
            name: "allox-bench",
            store: Some(&dev.dev),
            run_dir: &run_dir,
            env: &[],
            args,
        });
        until_ping(&c.socket())?;
        if i == 0 {
            first.push(t.elapsed());
            alloxctl(&c.socket(), &["agent", "create", "a"]);
            alloxctl(&c.socket(), &["session", "create", "a", "s"]);
        } else {
            ready.push(t.elapsed());
        }
        alloxctl(&c.socket(), &["start", "a", "s", "--", "sleep", "600"]);
        let (code, took) = c.stop(30);
        anyhow::ensure!(code == 0, "exit {code}:\n{}", c.logs());
        stop.push(took);
    }
    println!(
        "## Container mode (podman {}, runc, privileged, host network)\n",
        podman_version()
    );
    println!(
        "Image: built in {:.1} s, {} (layer, gzip), the same digest twice ({}…).\n",
        build.as_secs_f64(),
        mib(std::fs::metadata(&img.archive)?.len()),
        &img.digest[..19]
    );
    println!("| what | n | p50 | p99 | vs host daemon |");
    println!("|---|---:|---:|---:|---:|");
    let h = pct(&host, 0.5).as_secs_f64();
    for (what, v) in [
        (
            "baseline: `allox-init supervise` on a host Btrfs directory → first answer",
            &host,
        ),
        (
            "baseline: `podman run -d` of the image's `sleep` until started (the runtime's floor)",
            &floor,
        ),
        (
            "`podman run` → first answer, store on a loop device",
            &ready,
        ),
        (
            "`podman run` → first answer, blank device formatted first",
            &first,
        ),
        ("`podman stop` with a run going → exit 0", &stop),
    ] {
        println!(
            "| {what} | {} | {} | {} | {:.1}× |",
            v.len(),
            us_or_ms(pct(v, 0.5)),
            us_or_ms(pct(v, 0.99)),
            pct(v, 0.5).as_secs_f64() / h
        );
    }
    println!();
    Ok(())
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / 1048576.0)
}

fn podman_version() -> String {
    let out = podman(&["--version"]);
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .last()
        .unwrap_or("?")
        .to_string()
}
