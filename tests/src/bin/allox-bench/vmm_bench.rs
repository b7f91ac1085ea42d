//! The VM manager (`alloxctl vm`) on a 512 MiB guest: pause and resume,
//! a snapshot (its time and size against the guest's memory), and a
//! restore to the guest's first answer against a cold boot of the same
//! image to its first answer, all in one run.

use crate::{ms, pct};
use allox_integration::vm::guest_image;
use allox_protocol::{AgentCreate, Request, SessionCreate};
use allox_vmm::manager::{hello, CreateSpec};
use allox_vmm::Manager;
use std::time::{Duration, Instant};

pub fn run(quick: bool) -> anyhow::Result<()> {
    let img = match guest_image() {
        Ok(i) => i,
        Err(what) => {
            println!("## The VM manager\n\nSKIPPED: needs {what}\n");
            return Ok(());
        }
    };
    let dir = tempfile::tempdir_in("/var/tmp")?;
    let m = Manager::qemu(dir.path().join("vms"));
    let e = |e: allox_vmm::VmError| anyhow::anyhow!("{e}");
    m.create(&CreateSpec {
        name: "bench".into(),
        kernel_dir: img.kernel_dir.clone(),
        initrd: img.initrd.clone(),
        memory_mib: 512,
        cpus: 2,
        settings: vec![],
        append: None,
        accel: "auto".into(),
        net_user: None,
        store_mib: 1024,
        store_from: None,
    })
    .map_err(e)?;
    let (accel, _) = allox_vmm::qemu::pick_accel("auto").map_err(e)?;
    let n_boot = if quick { 3 } else { 5 };
    let n_pause = if quick { 30 } else { 100 };
    let (mut cold, mut restore, mut load, mut disk) = (vec![], vec![], vec![], vec![]);
    let (mut pause, mut resume, mut resume_clock) = (vec![], vec![], vec![]);
    let (mut snap, mut state_mib, mut disk_mib) = (vec![], vec![], vec![]);
    let result = (|| -> anyhow::Result<()> {
        for i in 0..n_boot {
            // Cold: QEMU start to the control port's first answer.
            let t = Instant::now();
            m.start("bench", Duration::from_secs(120)).map_err(e)?;
            cold.push(t.elapsed());
            if i == 0 {
                // An agent's session and a run going on, in every snapshot.
                let (mut c, _) =
                    hello(&m.paths("bench").map_err(e)?, Duration::from_secs(30)).map_err(e)?;
                c.call(Request::AgentCreate(AgentCreate::new("a")))?
                    .map_err(anyhow::Error::msg)?;
                c.call(Request::SessionCreate(SessionCreate::new("a", "s")))?
                    .map_err(anyhow::Error::msg)?;
            }
            for _ in 0..n_pause / n_boot {
                let t = Instant::now();
                m.pause("bench").map_err(e)?;
                pause.push(t.elapsed());
                let t = Instant::now();
                m.resume("bench", false).map_err(e)?;
                resume.push(t.elapsed());
            }
            m.pause("bench").map_err(e)?;
            let t = Instant::now();
            m.resume("bench", true).map_err(e)?;
            resume_clock.push(t.elapsed());
            let t = Instant::now();
            let s = m.snapshot("bench", "s", true).map_err(e)?;
            snap.push(t.elapsed());
            state_mib.push(s.state_bytes as f64 / (1 << 20) as f64);
            disk_mib.push(s.disk_bytes as f64 / (1 << 20) as f64);
            m.kill("bench").map_err(e)?;
            // Restore: the disk copied in, QEMU started, the state loaded,
            // the guest resumed and its clock set (its first answer).
            let t = Instant::now();
            let r = m.restore("bench", "s").map_err(e)?;
            restore.push(t.elapsed());
            load.push(Duration::from_millis(r.load_ms));
            disk.push(Duration::from_millis(r.disk_ms));
            m.kill("bench").map_err(e)?;
        }
        Ok(())
    })();
    let _ = m.rm("bench", true);
    result?;
    let p50 = |v: &[Duration]| pct(v, 0.5);
    println!("## The VM manager ({accel}, 512 MiB guest)\n");
    println!(
        "`alloxctl vm`'s operations through the library, each as a whole (QMP connection included). \
         Cold boot: QEMU start to the guest's first answer on its control port. Restore: the snapshot's \
         disk copied in, QEMU started, the saved state loaded, the guest resumed, its clock set and \
         its first answer (`system.resumed`). {n_boot} boots and restores, {} pauses and resumes.\n",
        pause.len()
    );
    println!("| operation | p50 ms | p99 ms | goal |");
    println!("|---|---:|---:|---|");
    let row = |what: &str, v: &[Duration], goal: &str| {
        println!(
            "| {what} | {} | {} | {goal} |",
            ms(p50(v)),
            ms(pct(v, 0.99))
        );
    };
    row("pause (`stop`)", &pause, "≤ 20 ms");
    row("resume (`cont`)", &resume, "≤ 20 ms");
    row(
        "resume and set the guest's clock",
        &resume_clock,
        "(a new Hello and `system.resumed`)",
    );
    row("snapshot (guest stopped for it)", &snap, "≤ 2000 ms");
    row("cold boot to the first answer (baseline)", &cold, "");
    row("restore to the first answer", &restore, "≤ 0.5× cold boot");
    row("  of which the disk copied in", &disk, "");
    row("  of which QEMU started and the state loaded", &load, "");
    println!(
        "\nrestore / cold boot: {:.2}× (p50)\n",
        p50(&restore).as_secs_f64() / p50(&cold).as_secs_f64()
    );
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    println!("| snapshot size | MiB | of guest memory |");
    println!("|---|---:|---:|");
    println!(
        "| memory and devices (`state`) | {:.1} | {:.1}% |",
        avg(&state_mib),
        100.0 * avg(&state_mib) / 512.0
    );
    println!(
        "| store disk copy (allocated) | {:.1} | |\n",
        avg(&disk_mib)
    );
    Ok(())
}
