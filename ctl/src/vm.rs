//! `alloxctl vm …` carried out by the VM manager (`allox-vmm`), and the
//! socket `--vm NAME` stands for.

use crate::cli::VmCommand;
use allox_vmm::manager::{CreateSpec, Done};
use allox_vmm::{Manager, VmError};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The control port's socket of VM `name`; with `if_running`, refused
/// `unavailable` while the VM is paused (or loading).
pub fn socket_of(root: &Path, name: &str, if_running: bool) -> Result<PathBuf, VmError> {
    let m = Manager::qemu(root);
    let socket = m.socket(name)?;
    if if_running {
        match m.state(name)? {
            "running" => {}
            "stopped" => {
                return Err(VmError::Unavailable(format!(
                    "VM {name:?} is not running (vm start or vm restore it)"
                )))
            }
            st => {
                return Err(VmError::Unavailable(format!(
                    "VM {name:?} is {st}: its guest cannot answer now (vm resume it, or leave out --if-running to wait)"
                )))
            }
        }
    }
    Ok(socket)
}

/// Carries out `cmd`; prints the answer (JSON with `json`) or the error.
/// Returns the exit status.
pub fn run(
    cmd: VmCommand,
    root: &Path,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    if let VmCommand::Relay { port } = cmd {
        return match allox_vmm::relay::relay(port) {
            Ok(()) => 0,
            Err(e) => {
                let _ = writeln!(err, "error: relay to 127.0.0.1:{port}: {e}");
                1
            }
        };
    }
    // Forwards are relayed by this program itself (`alloxctl vm relay`).
    let qemu = allox_vmm::qemu::Qemu {
        relay: std::env::current_exe().ok(),
        ..Default::default()
    };
    let m = Manager::new(root, Box::new(qemu));
    let r: Result<String, VmError> = (|| {
        use VmCommand as V;
        Ok(match cmd {
            V::Create {
                name,
                kernel_dir,
                initrd,
                memory,
                cpus,
                store_size,
                store_image,
                accel,
                append,
                net_user,
                forward,
                settings,
            } => {
                let i = m.create(&CreateSpec {
                    name,
                    kernel_dir,
                    initrd,
                    memory_mib: memory,
                    cpus,
                    settings,
                    append,
                    accel,
                    net_user: net_user.then_some(forward),
                    store_mib: store_size,
                    store_from: store_image,
                })?;
                show(json, &i, || {
                    format!("created VM {} in {}\n", i.name, i.dir.display())
                })
            }
            V::Start { name, timeout } => {
                let s = m.start(&name, Duration::from_secs(timeout))?;
                show(json, &s, || {
                    format!(
                        "VM {} started (QEMU pid {}), control port answered after {} ms\n",
                        s.name, s.pid, s.ready_ms
                    )
                })
            }
            V::Stop { name, timeout } => done(json, m.stop(&name, Duration::from_secs(timeout))?),
            V::Kill { name } => done(json, m.kill(&name)?),
            V::Pause { name } => done(json, m.pause(&name)?),
            V::Resume { name, no_clock } => done(json, m.resume(&name, !no_clock)?),
            V::Snapshot {
                name,
                snapshot,
                replace,
            } => {
                let s = m.snapshot(&name, &snapshot, replace)?;
                show(json, &s, || {
                    format!(
                        "snapshot {} of VM {name}: {} MiB of state, {} MiB of disk ({}), guest stopped {} ms\n",
                        s.name,
                        s.state_bytes >> 20,
                        s.disk_bytes >> 20,
                        if s.disk_copy == allox_vmm::disk::CopyKind::Reflink { "reflink" } else { "sparse copy" },
                        s.took_ms
                    )
                })
            }
            V::SnapshotRm { name, snapshot } => done(json, m.snapshot_delete(&name, &snapshot)?),
            V::Restore { name, snapshot } => {
                let r = m.restore(&name, &snapshot)?;
                restored(json, &r)
            }
            V::Clone {
                from,
                snapshot,
                name,
            } => {
                let r = m.clone_vm(&from, &snapshot, &name)?;
                restored(json, &r)
            }
            V::List => {
                let l = m.list()?;
                show(json, &l, || {
                    if l.is_empty() {
                        return format!("no VMs under {}\n", m.root().display());
                    }
                    let mut s = format!(
                        "{:<20} {:<8} {:>8} {:>6} {:>5}  SNAPSHOTS\n",
                        "NAME", "STATE", "PID", "MiB", "CPUS"
                    );
                    for v in &l {
                        let snaps: Vec<&str> =
                            v.snapshots.iter().map(|s| s.name.as_str()).collect();
                        s.push_str(&format!(
                            "{:<20} {:<8} {:>8} {:>6} {:>5}  {}\n",
                            v.name,
                            v.state,
                            v.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                            v.memory_mib,
                            v.cpus,
                            snaps.join(" ")
                        ));
                    }
                    s
                })
            }
            V::Rm { name, force } => done(json, m.rm(&name, force)?),
            V::Relay { .. } => unreachable!("answered above"),
        })
    })();
    match r {
        Ok(text) => {
            let _ = out.write_all(text.as_bytes());
            0
        }
        Err(e) => {
            let _ = writeln!(err, "error: {}: {e}", e.code());
            1
        }
    }
}

fn show<T: Serialize>(json: bool, v: &T, human: impl FnOnce() -> String) -> String {
    if json {
        format!("{:#}\n", serde_json::to_value(v).unwrap_or_default())
    } else {
        human()
    }
}

fn done(json: bool, d: Done) -> String {
    show(json, &d, || {
        let mut s = if d.changed {
            format!("VM {}: {} done in {} µs\n", d.name, d.op, d.us)
        } else {
            format!("VM {}: nothing to {} (already so)\n", d.name, d.op)
        };
        if let Some(c) = &d.clock {
            match (c.set, c.clock_step_ms, &c.why_not) {
                (true, Some(ms), _) => s.push_str(&format!("guest clock moved {ms} ms\n")),
                (_, _, Some(why)) => s.push_str(&format!("guest clock not set: {why}\n")),
                _ => {}
            }
        }
        s
    })
}

fn restored(json: bool, r: &allox_vmm::manager::Restored) -> String {
    show(json, r, || {
        format!(
            "VM {} restored from {}/{} (QEMU pid {}): state loaded in {} ms, guest answered after {} ms; clock moved {} ms, random pool {}, instance {}\n",
            r.name,
            r.from_vm,
            r.snapshot,
            r.pid,
            r.load_ms,
            r.ready_ms,
            r.clock_step_ms,
            if r.reseeded { "reseeded" } else { "not reseeded" },
            r.instance
        )
    })
}
