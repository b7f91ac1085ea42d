//! The QEMU backend: the command line of the guest (as scripts/run-vm.sh
//! boots it: the microvm machine, the PVH kernel, the control port on
//! virtio-serial, the store on virtio-blk), daemonized with its QMP socket,
//! and each operation as QMP commands.

use crate::backend::{Backend, RunState};
use crate::qmp::Qmp;
use crate::{VmConfig, VmError, VmPaths};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The QEMU backend (`qemu-system-x86_64`, or `binary`).
pub struct Qemu {
    pub binary: String,
    /// The program that relays a forward's connection (`alloxctl`, run as
    /// `alloxctl vm relay PORT`); without it a VM with forwards is refused.
    pub relay: Option<std::path::PathBuf>,
}

impl Default for Qemu {
    fn default() -> Self {
        Qemu {
            binary: "qemu-system-x86_64".into(),
            relay: None,
        }
    }
}

/// The accelerator to use and why: KVM only where an ordinary guest can
/// run (a PVM host's /dev/kvm cannot), decided from the facts, never from
/// a trial boot (an ordinary guest on PVM crashes while QEMU hangs).
pub fn pick_accel(asked: &str) -> Result<(&'static str, String), VmError> {
    match asked {
        "kvm" => return Ok(("kvm", "forced".into())),
        "tcg" => return Ok(("tcg", "forced".into())),
        "auto" => {}
        other => {
            return Err(VmError::Invalid(format!(
                "accel {other:?}: expected auto, kvm or tcg"
            )))
        }
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let virt = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    Ok(if !Path::new("/dev/kvm").exists() {
        ("tcg", "no /dev/kvm".into())
    } else if Path::new("/sys/module/kvm_pvm").exists() {
        (
            "tcg",
            "/dev/kvm is PVM (kvm_pvm loaded), which cannot run this guest".into(),
        )
    } else if !virt {
        ("tcg", "/dev/kvm present but the CPU has no vmx/svm".into())
    } else {
        ("kvm", "/dev/kvm present, CPU has vmx/svm, not PVM".into())
    })
}

/// The kernel command line: the console, the TSC settings TCG needs (see
/// scripts/run-vm.sh), the `allox.*` settings and anything appended.
pub fn kernel_cmdline(cfg: &VmConfig, accel: &str) -> String {
    let mut line = String::from("console=ttyS0 quiet panic=-1 rdinit=/init");
    if accel == "tcg" {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let khz = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("cpu MHz"))
            .and_then(|v| {
                v.trim_start_matches([' ', '\t', ':'])
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .map(|mhz| (mhz * 1000.0) as u64)
            .filter(|k| *k > 0);
        let hz = std::fs::read_to_string(cfg.kernel_dir.join("config"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("CONFIG_HZ=")?.trim().parse::<u64>().ok());
        if let Some(khz) = khz {
            line.push_str(&format!(" tsc_early_khz={khz} tsc=reliable"));
            if let Some(hz) = hz {
                line.push_str(&format!(" lpj={}", khz * 1000 / hz));
            }
        }
    }
    for s in &cfg.settings {
        line.push(' ');
        line.push_str(s);
    }
    if cfg.net_user.is_some() && !cfg.settings.iter().any(|s| s.starts_with("allox.net=")) {
        line.push_str(" allox.net=10.0.2.15/24,10.0.2.2");
    }
    if let Some(a) = &cfg.append {
        line.push(' ');
        line.push_str(a);
    }
    line
}

impl Qemu {
    /// QEMU's arguments for `cfg` (without the binary).
    pub fn args(
        &self,
        paths: &VmPaths,
        cfg: &VmConfig,
        incoming: bool,
    ) -> Result<Vec<String>, VmError> {
        let (accel, _) = pick_accel(&cfg.accel)?;
        let p = |x: &Path| x.display().to_string();
        let mut a: Vec<String> = [
            "-M".into(),
            format!("microvm,acpi=on,accel={accel}"),
            "-cpu".into(),
            if accel == "kvm" { "host" } else { "max" }.into(),
            "-smp".into(),
            cfg.cpus.to_string(),
            "-m".into(),
            format!("{}M", cfg.memory_mib),
            "-nodefaults".into(),
            "-no-user-config".into(),
            "-no-reboot".into(),
            "-display".into(),
            "none".into(),
            "-kernel".into(),
            p(&cfg.kernel_dir.join("vmlinux")),
            "-initrd".into(),
            p(&cfg.initrd),
            "-append".into(),
            kernel_cmdline(cfg, accel),
            // The console is appended to, across restores.
            "-chardev".into(),
            format!("file,id=con,path={},append=on", p(&paths.console())),
            "-serial".into(),
            "chardev:con".into(),
            "-monitor".into(),
            "none".into(),
            "-chardev".into(),
            format!("socket,id=ctl,path={},server=on,wait=off", p(&paths.ctl())),
            "-device".into(),
            "virtio-serial-device,id=vser".into(),
            "-device".into(),
            "virtserialport,bus=vser.0,chardev=ctl,name=org.allox.ctl".into(),
            "-drive".into(),
            format!(
                "file={},if=none,id=store,format=raw,cache=writeback,discard=unmap",
                p(&paths.store())
            ),
            "-device".into(),
            "virtio-blk-device,drive=store,serial=allox-store".into(),
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", p(&paths.qmp())),
            "-daemonize".into(),
            "-pidfile".into(),
            p(&paths.pid()),
            // Its messages once daemonized (a migration that cannot be
            // loaded says why here), not /dev/null.
            "-D".into(),
            p(&paths.qemu_log()),
        ]
        .into();
        match &cfg.net_user {
            None => a.extend(["-nic".into(), "none".into()]),
            Some(forwards) => {
                // restrict=on: the guest reaches nothing but the forwards,
                // each a relay per connection to the host's 127.0.0.1 only
                // (as scripts/run-vm.sh --net user).
                let mut netdev = "user,id=up,net=10.0.2.0/24,host=10.0.2.2,restrict=on".to_string();
                for f in forwards {
                    let (addr, port, host) = crate::check_forward(f)?;
                    let relay = self.relay.as_deref().ok_or_else(|| {
                        VmError::Invalid(format!(
                            "forward {f}: this manager has no relay program (alloxctl runs as one)"
                        ))
                    })?;
                    let relay = p(relay);
                    if relay.contains([',', ' ']) {
                        return Err(VmError::Invalid(format!(
                            "the relay program's path {relay:?} has a comma or a space, which QEMU's -netdev cannot carry"
                        )));
                    }
                    netdev.push_str(&format!(
                        ",guestfwd=tcp:{addr}:{port}-cmd:{relay} vm relay {host}"
                    ));
                }
                a.extend([
                    "-netdev".into(),
                    netdev,
                    "-device".into(),
                    "virtio-net-device,netdev=up".into(),
                ]);
            }
        }
        if incoming {
            a.extend(["-S".into(), "-incoming".into(), "defer".into()]);
        }
        Ok(a)
    }

    fn qmp(&self, paths: &VmPaths) -> Result<Qmp, VmError> {
        Ok(Qmp::connect(&paths.qmp(), Duration::from_secs(5))?)
    }

    /// Waits for the migration this side runs to end: `Ok` once it
    /// completed, the reason once it failed.
    fn wait_migration(q: &mut Qmp, what: &str) -> Result<(), VmError> {
        loop {
            let m = q.execute("query-migrate", None)?;
            match m.get("status").and_then(Value::as_str).unwrap_or("none") {
                "completed" => return Ok(()),
                "failed" | "cancelled" => {
                    let why = m
                        .get("error-desc")
                        .and_then(Value::as_str)
                        .unwrap_or("no reason given");
                    return Err(VmError::Backend(format!("{what} failed: {why}")));
                }
                _ => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
}

/// `path` quoted for the shell QEMU runs an `exec:` migration with.
fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

impl Backend for Qemu {
    fn name(&self) -> &'static str {
        "qemu"
    }

    fn launch(&self, paths: &VmPaths, cfg: &VmConfig, incoming: bool) -> Result<u32, VmError> {
        let args = self.args(paths, cfg, incoming)?;
        let _ = std::fs::remove_file(paths.pid());
        let log = std::fs::File::create(paths.qemu_start_log())?;
        // With -daemonize the first process exits once the VM is set up
        // (its sockets listen): its status is whether that worked.
        let st = Command::new(&self.binary)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .status()
            .map_err(|e| VmError::Backend(format!("cannot run {}: {e}", self.binary)))?;
        if !st.success() {
            let log = std::fs::read_to_string(paths.qemu_start_log()).unwrap_or_default();
            return Err(VmError::Backend(format!(
                "{} exited {st}: {}",
                self.binary,
                log.trim()
            )));
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(pid) = std::fs::read_to_string(paths.pid())
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            {
                return Ok(pid);
            }
            if Instant::now() > deadline {
                return Err(VmError::Backend(format!(
                    "QEMU wrote no pid file {}",
                    paths.pid().display()
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn status(&self, paths: &VmPaths) -> Result<RunState, VmError> {
        let s = self.qmp(paths)?.execute("query-status", None)?;
        Ok(
            match s.get("status").and_then(Value::as_str).unwrap_or("") {
                "running" => RunState::Running,
                "paused" | "postmigrate" | "prelaunch" | "suspended" | "finish-migrate" => {
                    RunState::Paused
                }
                "inmigrate" | "restore-vm" => RunState::Loading,
                _ => RunState::Other,
            },
        )
    }

    fn pause(&self, paths: &VmPaths) -> Result<(), VmError> {
        self.qmp(paths)?.execute("stop", None)?;
        Ok(())
    }

    fn resume(&self, paths: &VmPaths) -> Result<(), VmError> {
        self.qmp(paths)?.execute("cont", None)?;
        Ok(())
    }

    fn save(&self, paths: &VmPaths, state: &Path) -> Result<(), VmError> {
        let mut q = self.qmp(paths)?;
        // The default bandwidth cap (32 MiB/s) is for live migration over
        // a network; a paused guest to a local file goes as fast as it can.
        q.execute(
            "migrate-set-parameters",
            Some(json!({ "max-bandwidth": 64u64 << 30 })),
        )?;
        q.execute(
            "migrate",
            Some(json!({ "uri": format!("exec:cat > {}", shell_quote(state)) })),
        )?;
        Self::wait_migration(&mut q, "saving the guest's memory")
    }

    fn load(&self, paths: &VmPaths, state: &Path) -> Result<(), VmError> {
        let mut q = self.qmp(paths)?;
        q.execute(
            "migrate-incoming",
            Some(json!({ "uri": format!("exec:cat {}", shell_quote(state)) })),
        )?;
        loop {
            let s = q.execute("query-status", None)?;
            match s.get("status").and_then(Value::as_str).unwrap_or("") {
                "inmigrate" => std::thread::sleep(Duration::from_millis(5)),
                "paused" | "prelaunch" => return Ok(()),
                other => {
                    return Err(VmError::Backend(format!(
                        "loading the guest's memory left QEMU {other}"
                    )))
                }
            }
        }
    }

    fn power_button(&self, paths: &VmPaths) -> Result<(), VmError> {
        self.qmp(paths)?.execute("system_powerdown", None)?;
        Ok(())
    }

    fn control_port_busy(&self, paths: &VmPaths) -> Result<bool, VmError> {
        let devs = self.qmp(paths)?.execute("query-chardev", None)?;
        let ctl = devs
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d.get("label").and_then(Value::as_str) == Some("ctl"));
        // A socket chardev without a client is named "disconnected:…".
        Ok(ctl
            .and_then(|d| d.get("filename").and_then(Value::as_str))
            .is_some_and(|f| !f.starts_with("disconnected:")))
    }
}
