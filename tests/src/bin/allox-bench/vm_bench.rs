//! Guest boot: QEMU start to `Hello` answered over the control port and to
//! the first answer that needs the store, split into kernel → `/init`,
//! `/init` → control port ready and `/init` → supervisor ready (store open;
//! from the guest's own boot clock on its console), beside the same kernel
//! running a trivial init; idle memory of PID 1 and the supervisor; image
//! sizes.

use crate::{pct, us_or_ms};
use allox_integration::vm::{guest_image, store_image, Vm};
use allox_protocol::{AgentList, Request, Response, Shutdown, SystemInfoRequest};
use std::time::{Duration, Instant};

fn console_ms(console: &str, marker: &str, key: &str) -> Option<u64> {
    let line = console.lines().find(|l| l.contains(marker))?;
    let at = line.find(key)? + key.len();
    line[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .ok()
}

pub fn run(quick: bool) -> anyhow::Result<()> {
    let img = match guest_image() {
        Ok(i) => i,
        Err(what) => {
            println!("## Guest boot\n\nSKIPPED: needs {what}\n");
            return Ok(());
        }
    };
    let n = if quick { 3 } else { 5 };
    let (mut hello, mut to_init, mut to_ready, mut baseline) = (vec![], vec![], vec![], vec![]);
    let (mut first_answer, mut to_store) = (vec![], vec![]);
    let (mut init_rss, mut sup_rss) = (vec![], vec![]);
    for _ in 0..n {
        let dir = tempfile::tempdir_in("/var/tmp")?;
        let store = store_image(dir.path(), true);
        let mut vm = Vm::boot(&img, Some(&store), &[]);
        let (mut c, t) = vm.connect(Duration::from_secs(60));
        hello.push(t);
        // The host's first question that needs the store, asked at once.
        anyhow::ensure!(
            matches!(
                c.call(Request::AgentList(AgentList {})),
                Ok(Ok(Response::Agents(_)))
            ),
            "agent.list failed right after Hello"
        );
        first_answer.push(vm.started.elapsed());
        // Idle: a moment after start-up, before any work.
        std::thread::sleep(Duration::from_millis(500));
        if let Ok(Ok(Response::System(i))) = c.call(Request::SystemInfo(SystemInfoRequest {})) {
            init_rss.push(i.init_rss_kib);
            sup_rss.push(i.supervisor_rss_kib);
        }
        let _ = c.call(Request::Shutdown(Shutdown {}));
        anyhow::ensure!(
            vm.wait_exit(Duration::from_secs(60)).is_some(),
            "guest did not power off"
        );
        let console = vm.console();
        let started = console_ms(&console, "allox-init: started", "started (")
            .ok_or_else(|| anyhow::anyhow!("no start line on the console:\n{console}"))?;
        let ready = console_ms(&console, "control port ready", "boot_ms=")
            .ok_or_else(|| anyhow::anyhow!("no ready line on the console:\n{console}"))?;
        to_init.push(Duration::from_millis(started));
        to_ready.push(Duration::from_millis(ready.saturating_sub(started)));
        let opened = console_ms(&console, "supervisor ready", "boot_ms=").ok_or_else(|| {
            anyhow::anyhow!("no supervisor ready line on the console:\n{console}")
        })?;
        to_store.push(Duration::from_millis(opened.saturating_sub(started)));
        // Baseline: the same kernel and image with a trivial init that
        // exits at once (the kernel then panics and QEMU ends).
        let t0 = Instant::now();
        let mut vm = Vm::boot(&img, None, &["--append", "rdinit=/usr/bin/true"]);
        anyhow::ensure!(
            vm.wait_exit(Duration::from_secs(60)).is_some(),
            "baseline guest did not end"
        );
        baseline.push(t0.elapsed());
    }
    let accel = if std::path::Path::new("/sys/module/kvm_pvm").exists()
        || !std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .contains(" vmx")
    {
        "TCG"
    } else {
        "KVM"
    };
    println!("## Guest boot (`-M microvm`, PVH vmlinux, {accel}, 2 vCPUs, 1 GiB)\n");
    println!("| what | n | p50 | max |");
    println!("|---|---:|---:|---:|");
    let max = |v: &[Duration]| v.iter().max().copied().unwrap_or_default();
    for (what, v) in [
        ("QEMU start → `Hello` answered over virtio-serial", &hello),
        ("  of which: kernel → `/init` (guest boot clock)", &to_init),
        ("  of which: `/init` → control port ready", &to_ready),
        (
            "QEMU start → first answer that needs the store (`agent.list` asked right after `Hello`)",
            &first_answer,
        ),
        (
            "  of which: `/init` → supervisor ready (store mounted and open)",
            &to_store,
        ),
        (
            "baseline: QEMU start → trivial init (`rdinit=/usr/bin/true`) ran and QEMU ended",
            &baseline,
        ),
    ] {
        println!(
            "| {what} | {} | {} | {} |",
            v.len(),
            us_or_ms(pct(v, 0.5)),
            us_or_ms(max(v))
        );
    }
    let (h, b) = (pct(&hello, 0.5), pct(&baseline, 0.5));
    println!(
        "\n`Hello` against the baseline (p50): {:.2}×.",
        h.as_secs_f64() / b.as_secs_f64().max(1e-9)
    );
    let med = |v: &mut Vec<u64>| {
        v.sort();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let (i, s) = (med(&mut init_rss), med(&mut sup_rss));
    println!(
        "\nIdle resident memory (median): PID 1 {i} KiB, supervisor {s} KiB, together {:.1} MiB.\n",
        (i + s) as f64 / 1024.0
    );
    let size = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mib = |b: u64| format!("{:.2} MiB", b as f64 / 1048576.0);
    println!("| image | size |");
    println!("|---|---:|");
    println!(
        "| bzImage | {} |",
        mib(size(&img.kernel_dir.join("bzImage")))
    );
    println!(
        "| vmlinux (PVH, with BTF and debug info) | {} |",
        mib(size(&img.kernel_dir.join("vmlinux")))
    );
    println!(
        "| initramfs, default profile (gzip) | {} |",
        mib(size(&img.initrd))
    );
    if let Some(init) = img.initrd.parent().map(|d| d.join("allox-init")) {
        println!("| allox-init (static, stripped) | {} |", mib(size(&init)));
    }
    println!();
    transfer(&img, accel, quick)
}

/// A file through the VM's control port (virtio-serial) with `alloxctl
/// cp`, in and out, against `cp` of the same file on the host.
fn transfer(
    img: &allox_integration::vm::GuestImage,
    accel: &str,
    quick: bool,
) -> anyhow::Result<()> {
    use allox_ctl::files::{download, upload, Remote};
    let mib: u64 = if quick { 32 } else { 256 };
    let dir = tempfile::tempdir_in("/var/tmp")?;
    let store = store_image(dir.path(), true);
    let src = dir.path().join("src.bin");
    crate::random_file(&src, mib)?;
    let t = Instant::now();
    let st = std::process::Command::new("cp")
        .arg("--reflink=never")
        .arg(&src)
        .arg(dir.path().join("copy.bin"))
        .status()?;
    anyhow::ensure!(st.success(), "cp failed");
    let cp = t.elapsed();
    let mut vm = Vm::boot(img, Some(&store), &[]);
    let (mut c, _) = vm.connect(Duration::from_secs(60));
    c.call(Request::AgentCreate(allox_protocol::AgentCreate::new(
        "bench",
    )))?
    .map_err(anyhow::Error::msg)?;
    c.call(Request::SessionCreate(allox_protocol::SessionCreate::new(
        "bench", "s",
    )))?
    .map_err(anyhow::Error::msg)?;
    let remote = Remote::parse("bench/s:big.bin").ok_or_else(|| anyhow::anyhow!("remote"))?;
    let t = Instant::now();
    upload(&mut c, &src, &remote)?;
    let up = t.elapsed();
    let back = dir.path().join("back.bin");
    let t = Instant::now();
    download(&mut c, &remote, &back)?;
    let down = t.elapsed();
    anyhow::ensure!(
        std::fs::read(&back)? == std::fs::read(&src)?,
        "the file came back changed"
    );
    let _ = c.call(Request::Shutdown(Shutdown {}));
    let _ = vm.wait_exit(Duration::from_secs(60));
    let rate = |d: Duration| (mib << 20) as f64 / d.as_secs_f64() / 1e6;
    println!(
        "## Files through the VM's control port ({accel})
"
    );
    println!("{mib} MiB of random bytes, once each way, `alloxctl cp` over virtio-serial; baseline `cp --reflink=never` of the same file on the host.
");
    println!("| what | MB/s | of `cp` |");
    println!("|---|---:|---:|");
    for (what, d) in [
        ("`cp` on the host (baseline)", cp),
        ("upload into the guest", up),
        ("download from the guest", down),
    ] {
        println!(
            "| {what} | {:.1} | {:.1}% |",
            rate(d),
            100.0 * cp.as_secs_f64() / d.as_secs_f64()
        );
    }
    println!();
    Ok(())
}
