//! The operations of `alloxctl vm …`, each whole or not at all: a VM's
//! directory is made aside and renamed in; a snapshot is written aside and
//! exchanged with the one it replaces in one rename, so a crash or a fault
//! (QEMU killed, the disk full) leaves the previous one whole and no half
//! snapshot listed; a restore keeps the VM's disk until the guest runs.

use crate::backend::{Backend, RunState};
use crate::disk::{allocated, copy_image, CopyKind};
use crate::{check_name, now_ms, sync_dir, write_atomic, VmConfig, VmError, VmPaths};
use allox_client::Client;
use allox_protocol::{Request, Response};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What `vm create` is given.
#[derive(Debug, Clone)]
pub struct CreateSpec {
    pub name: String,
    pub kernel_dir: PathBuf,
    pub initrd: PathBuf,
    pub memory_mib: u32,
    pub cpus: u32,
    pub settings: Vec<String>,
    pub append: Option<String>,
    pub accel: String,
    /// QEMU's user networking with these forwards (`ADDR:PORT=HOSTPORT`),
    /// or no network device.
    pub net_user: Option<Vec<String>>,
    /// The size of a new store disk (formatted here, with mkfs.btrfs).
    pub store_mib: u64,
    /// Or an existing store image to start from (copied).
    pub store_from: Option<PathBuf>,
}

/// A VM as `vm list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct VmInfo {
    pub name: String,
    /// `running`, `paused`, `loading`, `stopped` or `other`.
    pub state: String,
    pub pid: Option<u32>,
    pub backend: String,
    pub dir: PathBuf,
    /// The control port's host socket: `alloxctl --vm NAME …` uses it.
    pub ctl_socket: PathBuf,
    pub memory_mib: u32,
    pub cpus: u32,
    pub snapshots: Vec<SnapshotInfo>,
}

/// A snapshot (`snapshot.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub name: String,
    pub created_ms: u64,
    /// The guest's memory and device state, in bytes.
    pub state_bytes: u64,
    /// What the store disk's copy takes on disk.
    pub disk_bytes: u64,
    /// How the disk was copied: `reflink` or `sparse`.
    pub disk_copy: CopyKind,
    pub guest_memory_mib: u32,
    /// How long the guest was stopped for it.
    pub took_ms: u64,
    /// Whether the guest ran before (it runs again after).
    pub was_running: bool,
}

/// The answer of `vm start`.
#[derive(Debug, Clone, Serialize)]
pub struct Started {
    pub name: String,
    pub pid: u32,
    /// From starting QEMU to the guest's first answer on its control port.
    pub ready_ms: u64,
}

/// The answer of `vm pause`, `vm resume`, `vm stop`, `vm kill`.
#[derive(Debug, Clone, Serialize)]
pub struct Done {
    pub name: String,
    pub op: &'static str,
    /// Whether anything changed (a paused VM paused again did not).
    pub changed: bool,
    /// How long the VMM took.
    pub us: u64,
    /// After a resume: how the guest's clock was set, if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock: Option<ClockSync>,
}

/// What the guest said to `system.resumed`, or why it was not asked.
#[derive(Debug, Clone, Serialize)]
pub struct ClockSync {
    pub set: bool,
    pub clock_step_ms: Option<i64>,
    pub reseeded: bool,
    pub instance: Option<String>,
    pub why_not: Option<String>,
}

/// The answer of `vm restore` and `vm clone`.
#[derive(Debug, Clone, Serialize)]
pub struct Restored {
    pub name: String,
    pub snapshot: String,
    pub from_vm: String,
    pub pid: u32,
    /// Copying the disk.
    pub disk_ms: u64,
    /// QEMU started and the state loaded.
    pub load_ms: u64,
    /// From starting QEMU to the guest's answer to `system.resumed`.
    pub ready_ms: u64,
    pub clock_step_ms: i64,
    pub reseeded: bool,
    /// The guest's new incarnation id (two clones never share one).
    pub instance: String,
}

/// The manager of the VMs under one directory.
pub struct Manager {
    root: PathBuf,
    backend: Box<dyn Backend>,
}

impl Manager {
    pub fn new(root: impl Into<PathBuf>, backend: Box<dyn Backend>) -> Manager {
        Manager {
            root: root.into(),
            backend,
        }
    }

    /// With QEMU.
    pub fn qemu(root: impl Into<PathBuf>) -> Manager {
        Manager::new(root, Box::<crate::qemu::Qemu>::default())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The files of VM `name` (which need not exist).
    pub fn paths(&self, name: &str) -> Result<VmPaths, VmError> {
        check_name("VM", name)?;
        Ok(VmPaths {
            dir: self.root.join(name),
        })
    }

    /// The files of VM `name`, which exists.
    fn existing(&self, name: &str) -> Result<(VmPaths, VmConfig), VmError> {
        let p = self.paths(name)?;
        if p.dir.join(CLONING).exists() && !self.sweep_clone(&p)? {
            return Err(VmError::Conflict(format!(
                "VM {name:?} is being cloned by another vm command: wait for it to end"
            )));
        }
        let cfg = read_config(&p.config()).map_err(|e| match e {
            VmError::Io(e) if e.kind() == std::io::ErrorKind::NotFound => VmError::NotFound(
                format!("no VM {name:?} under {} (vm list)", self.root.display()),
            ),
            e => e,
        })?;
        Ok((p, cfg))
    }

    /// Removes a clone that a `vm clone` stopped half-way left (its
    /// QEMU killed), unless a command still holds it: whether it was
    /// removed (or was gone).
    fn sweep_clone(&self, p: &VmPaths) -> Result<bool, VmError> {
        let f = match std::fs::OpenOptions::new()
            .write(true)
            .open(p.dir.join(".lock"))
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if !p.dir.join(CLONING).exists() {
                    return Ok(true);
                }
                std::fs::File::create(p.dir.join(".lock"))?
            }
            Err(e) => return Err(e.into()),
        };
        if !lock_soon(&f)? {
            return Ok(false);
        }
        if !p.dir.join(CLONING).exists() {
            return Ok(true);
        }
        if let Some(pid) = self.pid(p) {
            self.kill_pid(p, pid);
        }
        let gone = self.root.join(format!(
            ".{}.removing",
            p.dir.file_name().unwrap_or_default().to_string_lossy()
        ));
        let _ = std::fs::remove_dir_all(&gone);
        std::fs::rename(&p.dir, &gone)?;
        sync_dir(&self.root)?;
        std::fs::remove_dir_all(&gone)?;
        Ok(true)
    }

    /// The control port's socket of VM `name` (what a command stopped
    /// half-way left settled first, if no command holds the VM).
    pub fn socket(&self, name: &str) -> Result<PathBuf, VmError> {
        let (p, _) = self.existing(name)?;
        self.try_settle(&p);
        Ok(p.ctl())
    }

    pub fn create(&self, spec: &CreateSpec) -> Result<VmInfo, VmError> {
        check_name("VM", &spec.name)?;
        let vmlinux = spec.kernel_dir.join("vmlinux");
        if !vmlinux.is_file() {
            return Err(VmError::Invalid(format!(
                "kernel {} not found (--kernel-dir: the output of kernel/build.sh)",
                vmlinux.display()
            )));
        }
        if !spec.initrd.is_file() {
            return Err(VmError::Invalid(format!(
                "initrd {} not found (scripts/build-guest.sh makes it)",
                spec.initrd.display()
            )));
        }
        if !(128..=1 << 20).contains(&spec.memory_mib) {
            return Err(VmError::Invalid(format!(
                "memory {} MiB: expected 128 MiB to 1 TiB",
                spec.memory_mib
            )));
        }
        if !(1..=64).contains(&spec.cpus) {
            return Err(VmError::Invalid(format!(
                "cpus {}: expected 1 to 64",
                spec.cpus
            )));
        }
        for s in &spec.settings {
            if !s.starts_with("allox.") || !s.contains('=') || s.contains(char::is_whitespace) {
                return Err(VmError::Invalid(format!(
                    "setting {s:?}: expected allox.KEY=VALUE without spaces"
                )));
            }
        }
        crate::qemu::pick_accel(&spec.accel)?;
        if let Some(forwards) = &spec.net_user {
            crate::check_forwards(forwards)?;
        }
        std::fs::create_dir_all(&self.root)?;
        let paths = self.paths(&spec.name)?;
        if paths.dir.exists() {
            return Err(VmError::Conflict(format!(
                "VM {:?} exists ({}); vm rm it first or pick another name",
                spec.name,
                paths.dir.display()
            )));
        }
        let cfg = VmConfig {
            name: spec.name.clone(),
            kernel_dir: spec.kernel_dir.canonicalize()?,
            initrd: spec.initrd.canonicalize()?,
            memory_mib: spec.memory_mib,
            cpus: spec.cpus,
            settings: spec.settings.clone(),
            append: spec.append.clone(),
            accel: spec.accel.clone(),
            net_user: spec.net_user.clone(),
            created_ms: now_ms(),
        };
        // Made aside, renamed in: a VM is listed whole or not at all.
        let tmp = VmPaths {
            dir: self.root.join(format!(".{}.creating", spec.name)),
        };
        let _ = std::fs::remove_dir_all(&tmp.dir);
        std::fs::create_dir(&tmp.dir)?;
        let made = (|| -> Result<(), VmError> {
            match &spec.store_from {
                Some(from) => {
                    copy_image(from, &tmp.store()).map_err(|e| {
                        VmError::Invalid(format!("store image {}: {e}", from.display()))
                    })?;
                }
                None => {
                    if spec.store_mib < 256 {
                        return Err(VmError::Invalid(format!(
                            "store size {} MiB: at least 256 MiB (Btrfs)",
                            spec.store_mib
                        )));
                    }
                    let f = std::fs::File::create(tmp.store())?;
                    f.set_len(spec.store_mib << 20)?;
                    f.sync_all()?;
                    format_store(&tmp.store())?;
                }
            }
            std::fs::create_dir(tmp.snapshots())?;
            write_atomic(&tmp.config(), &serde_json::to_vec_pretty(&cfg).unwrap())?;
            Ok(())
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&tmp.dir);
            return Err(e);
        }
        std::fs::rename(&tmp.dir, &paths.dir)?;
        sync_dir(&self.root)?;
        self.info(&spec.name)
    }

    /// QEMU's process id, if it lives (a pid file of a QEMU that died, or
    /// whose number went to another process, is none).
    pub fn pid(&self, paths: &VmPaths) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(paths.pid())
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let qmp = paths.qmp().display().to_string();
        let ours = cmdline
            .split(|b| *b == 0)
            .any(|a| String::from_utf8_lossy(a).contains(&qmp));
        (ours && live(pid)).then_some(pid)
    }

    fn state_of(&self, paths: &VmPaths) -> Result<(Option<u32>, &'static str), VmError> {
        let Some(pid) = self.pid(paths) else {
            return Ok((None, "stopped"));
        };
        let st = match self.backend.status(paths)? {
            RunState::Running => "running",
            RunState::Paused => "paused",
            RunState::Loading => "loading",
            RunState::Other => "other",
        };
        Ok((Some(pid), st))
    }

    /// `running`, `paused`, `loading`, `stopped` or `other`.
    pub fn state(&self, name: &str) -> Result<&'static str, VmError> {
        let (p, _) = self.existing(name)?;
        Ok(self.state_of(&p)?.1)
    }

    pub fn info(&self, name: &str) -> Result<VmInfo, VmError> {
        let (p, cfg) = self.existing(name)?;
        self.try_settle(&p);
        let (pid, state) = self.state_of(&p)?;
        Ok(VmInfo {
            name: cfg.name.clone(),
            state: state.into(),
            pid,
            backend: self.backend.name().into(),
            ctl_socket: p.ctl(),
            dir: p.dir.clone(),
            memory_mib: cfg.memory_mib,
            cpus: cfg.cpus,
            snapshots: self.snapshots(&p)?,
        })
    }

    /// Every VM, by name.
    pub fn list(&self) -> Result<Vec<VmInfo>, VmError> {
        let mut names: Vec<String> = match std::fs::read_dir(&self.root) {
            Ok(d) => d
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| !n.starts_with('.') && check_name("VM", n).is_ok())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        names.sort();
        // A clone being made is not listed until its guest runs; one a
        // stopped command left is removed on the way.
        names.retain(|n| {
            self.paths(n).is_ok_and(|p| {
                p.config().is_file()
                    && !(p.dir.join(CLONING).exists() && self.sweep_clone(&p).is_ok())
            })
        });
        names.iter().map(|n| self.info(n)).collect()
    }

    /// The VM's snapshots, by name: the whole ones (a half-written one is
    /// hidden under a dot name, and removed by the next snapshot).
    fn snapshots(&self, p: &VmPaths) -> Result<Vec<SnapshotInfo>, VmError> {
        let mut out = Vec::new();
        let Ok(dir) = std::fs::read_dir(p.snapshots()) else {
            return Ok(out);
        };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            if let Ok(b) = std::fs::read(e.path().join("snapshot.json")) {
                if let Ok(s) = serde_json::from_slice::<SnapshotInfo>(&b) {
                    out.push(s);
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Holds VM `name` for one command that changes it (a start, a
    /// snapshot, a restore, a removal): another such command of it, from
    /// any process, is refused while this one lasts (two snapshots at once
    /// took each other's working directory). Then settles what a restore
    /// that was stopped half-way left ([`Manager::settle_restore`]).
    fn hold(&self, p: &VmPaths, name: &str) -> Result<std::fs::File, VmError> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(p.dir.join(".lock"))?;
        if !lock_soon(&f)? {
            return Err(VmError::Conflict(format!(
                "VM {name:?} is busy with another vm command (a start, a snapshot, a restore or a removal): wait for it to end"
            )));
        }
        self.settle(p)?;
        Ok(f)
    }

    /// [`Manager::settle`], if no command holds the VM now (a command
    /// that only reads it, or reaches its guest, does this on its way).
    fn try_settle(&self, p: &VmPaths) {
        let Ok(f) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(p.dir.join(".lock"))
        else {
            return;
        };
        if rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok() {
            // Failing, it is tried again by the next command.
            let _ = self.settle(p);
        }
    }

    /// Settles what a command of the VM stopped half-way left: a restore
    /// ([`Manager::settle_restore`]), and a snapshot that paused the guest
    /// (resumed; its partial directory removed).
    fn settle(&self, p: &VmPaths) -> Result<(), VmError> {
        self.settle_restore(p)?;
        let paused_by_snapshot = std::fs::read_dir(p.snapshots())
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                e.file_name().to_string_lossy().starts_with('.')
                    && e.path().join(PAUSED_BY_SNAPSHOT).exists()
            });
        if paused_by_snapshot
            && self.pid(p).is_some()
            && self.backend.status(p).ok() == Some(RunState::Paused)
        {
            self.backend.resume(p)?;
        }
        clear_partial(p);
        Ok(())
    }

    /// A restore stopped half-way (its command interrupted or killed)
    /// left the snapshot's disk as the VM's and the VM's own aside: the
    /// own one is put back (the QEMU left loading the snapshot's state
    /// killed first), unless the restored guest runs, when the restore
    /// had done all but its cleanup. (Before, the next start booted the
    /// snapshot's disk, and the next restore renamed over the VM's own.)
    fn settle_restore(&self, p: &VmPaths) -> Result<(), VmError> {
        let kept = p.dir.join("store.img.before-restore");
        let _ = std::fs::remove_file(p.dir.join("store.img.restoring"));
        if !kept.exists() {
            return Ok(());
        }
        if let Some(pid) = self.pid(p) {
            if self.backend.status(p).ok() == Some(RunState::Running) {
                std::fs::remove_file(&kept)?;
                return Ok(());
            }
            self.kill_pid(p, pid);
        }
        std::fs::rename(&kept, p.store())?;
        sync_dir(&p.dir)?;
        Ok(())
    }

    fn must_be_stopped(&self, p: &VmPaths, name: &str, to: &str) -> Result<(), VmError> {
        match self.pid(p) {
            Some(pid) => Err(VmError::Conflict(format!(
                "VM {name:?} is running (QEMU pid {pid}): vm stop or vm kill it before you {to}"
            ))),
            None => Ok(()),
        }
    }

    fn must_run(&self, p: &VmPaths, name: &str) -> Result<RunState, VmError> {
        if self.pid(p).is_none() {
            return Err(VmError::Conflict(format!(
                "VM {name:?} is not running (vm start or vm restore it)"
            )));
        }
        self.backend.status(p)
    }

    /// Boots the VM and waits for its control port's first answer.
    pub fn start(&self, name: &str, timeout: Duration) -> Result<Started, VmError> {
        let (p, cfg) = self.existing(name)?;
        let _held = self.hold(&p, name)?;
        self.must_be_stopped(&p, name, "start it again")?;
        clear_sockets(&p);
        let t0 = Instant::now();
        let pid = self.backend.launch(&p, &cfg, false)?;
        match hello_via(&p, &self.backend.control(&p), timeout) {
            Ok(_) => Ok(Started {
                name: name.into(),
                pid,
                ready_ms: t0.elapsed().as_millis() as u64,
            }),
            Err(e) => {
                self.kill_pid(&p, pid);
                Err(with_console(&p, e))
            }
        }
    }

    /// The guest's orderly shutdown: `system.shutdown` over the control
    /// port (the supervisor stops in order, PID 1 unmounts the store and
    /// powers off), then waits for QEMU to end. A guest that does not take
    /// the request (hung, or paused) gets the ACPI power button, which only
    /// a kernel with an ACPI button driver acts on (the guest's own has
    /// none: then `vm kill` is what is left).
    pub fn stop(&self, name: &str, timeout: Duration) -> Result<Done, VmError> {
        let (p, _) = self.existing(name)?;
        let t0 = Instant::now();
        let Some(pid) = self.pid(&p) else {
            return Ok(done(name, "stop", false, t0, None));
        };
        // A host that just let go is noticed by QEMU a moment later.
        let free_by = Instant::now() + Duration::from_secs(2).min(timeout);
        while self.backend.control_port_busy(&p)? && Instant::now() < free_by {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.backend.control_port_busy(&p)? {
            return Err(VmError::Conflict(format!(
                "a host holds VM {name:?}'s control port, over which its orderly shutdown goes: \
                 close that client (or alloxctl --vm {name} shutdown through it), or vm kill it"
            )));
        }
        let mut asked = false;
        if self.backend.status(&p)? == RunState::Running {
            if let Ok((mut c, _)) =
                hello_via(&p, &self.backend.control(&p), Duration::from_secs(10))
            {
                asked = matches!(
                    c.call(Request::Shutdown(allox_protocol::Shutdown {})),
                    Ok(Ok(Response::Stopping(_)))
                );
            }
        }
        if !asked {
            self.backend.power_button(&p)?;
        }
        if wait_gone(pid, timeout) {
            let _ = std::fs::remove_file(p.pid());
            clear_sockets(&p);
            return Ok(done(name, "stop", true, t0, None));
        }
        Err(VmError::Conflict(format!(
            "VM {name:?} did not stop within {} s{} (vm kill cuts its power)",
            timeout.as_secs(),
            if asked {
                ""
            } else {
                ": it did not take system.shutdown, and its kernel does not act on the power button"
            }
        )))
    }

    /// Cuts the power: SIGKILL to QEMU.
    pub fn kill(&self, name: &str) -> Result<Done, VmError> {
        let (p, _) = self.existing(name)?;
        let t0 = Instant::now();
        let Some(pid) = self.pid(&p) else {
            return Ok(done(name, "kill", false, t0, None));
        };
        self.kill_pid(&p, pid);
        Ok(done(name, "kill", true, t0, None))
    }

    fn kill_pid(&self, p: &VmPaths, pid: u32) {
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        wait_gone(pid, Duration::from_secs(10));
        let _ = std::fs::remove_file(p.pid());
        clear_sockets(p);
    }

    pub fn pause(&self, name: &str) -> Result<Done, VmError> {
        let (p, _) = self.existing(name)?;
        if self.must_run(&p, name)? != RunState::Running {
            return Ok(done(name, "pause", false, Instant::now(), None));
        }
        let t0 = Instant::now();
        self.backend.pause(&p)?;
        Ok(done(name, "pause", true, t0, None))
    }

    /// Lets a paused guest run again, then (with `clock`) sets its wall
    /// clock from the host's, if no host holds its control port.
    pub fn resume(&self, name: &str, clock: bool) -> Result<Done, VmError> {
        let (p, _) = self.existing(name)?;
        if self.must_run(&p, name)? == RunState::Running {
            return Ok(done(name, "resume", false, Instant::now(), None));
        }
        let t0 = Instant::now();
        self.backend.resume(&p)?;
        let us = t0.elapsed().as_micros() as u64;
        let sync = clock.then(|| self.sync_clock(&p, false));
        Ok(Done {
            us,
            clock: sync,
            ..done(name, "resume", true, t0, None)
        })
    }

    /// `system.resumed` to the guest, unless a host holds its port (the
    /// guest's clock is then set by the next resume or restore).
    fn sync_clock(&self, p: &VmPaths, seed: bool) -> ClockSync {
        let not = |why: String| ClockSync {
            set: false,
            clock_step_ms: None,
            reseeded: false,
            instance: None,
            why_not: Some(why),
        };
        match self.backend.control_port_busy(p) {
            Ok(false) => {}
            Ok(true) => return not("a host holds the control port".into()),
            Err(e) => return not(e.to_string()),
        }
        match resumed(p, &self.backend.control(p), seed, Duration::from_secs(30)) {
            Ok(r) => ClockSync {
                set: true,
                clock_step_ms: Some(r.clock_step_ms),
                reseeded: r.reseeded,
                instance: Some(r.instance),
                why_not: None,
            },
            Err(e) => not(e.to_string()),
        }
    }

    /// Saves the guest (memory, devices, the store disk at the same
    /// instant) as snapshot `snap` of VM `name`.
    pub fn snapshot(&self, name: &str, snap: &str, replace: bool) -> Result<SnapshotInfo, VmError> {
        let (p, cfg) = self.existing(name)?;
        check_name("snapshot", snap)?;
        let _held = self.hold(&p, name)?;
        let was = self.must_run(&p, name)?;
        let target = p.snapshot(snap);
        if target.exists() && !replace {
            return Err(VmError::Conflict(format!(
                "VM {name:?} has a snapshot {snap:?} (--replace to replace it)"
            )));
        }
        std::fs::create_dir_all(p.snapshots())?;
        clear_partial(&p);
        let tmp = p.snapshots().join(format!(".{snap}.partial"));
        std::fs::create_dir(&tmp)?;
        let t0 = Instant::now();
        let was_running = was == RunState::Running;
        let mut written = (|| -> Result<SnapshotInfo, VmError> {
            if was_running {
                // Said before the pause: a snapshot stopped half-way
                // (its command interrupted or killed) left the guest
                // paused for ever before; the next command of the VM
                // finds this and resumes it ([`Manager::settle`]).
                std::fs::write(tmp.join(PAUSED_BY_SNAPSHOT), b"")?;
                self.backend.pause(&p)?;
            }
            let state = tmp.join("state");
            self.backend.save(&p, &state)?;
            std::fs::File::open(&state)?.sync_all()?;
            let disk_copy = copy_image(&p.store(), &tmp.join("store.img"))?;
            let took_ms = t0.elapsed().as_millis() as u64;
            write_atomic(
                &tmp.join("vm.json"),
                &serde_json::to_vec_pretty(&cfg).unwrap(),
            )?;
            let info = SnapshotInfo {
                name: snap.into(),
                created_ms: now_ms(),
                state_bytes: std::fs::metadata(&state)?.len(),
                disk_bytes: allocated(&tmp.join("store.img")),
                disk_copy,
                guest_memory_mib: cfg.memory_mib,
                took_ms,
                was_running,
            };
            write_atomic(
                &tmp.join("snapshot.json"),
                &serde_json::to_vec_pretty(&info).unwrap(),
            )?;
            sync_dir(&tmp)?;
            Ok(info)
        })();
        if was_running && self.pid(&p).is_some() {
            // The guest goes on whatever became of its snapshot.
            if let Err(e) = self.backend.resume(&p) {
                written = written.and(Err(e));
            }
        }
        let info = match written {
            Ok(i) => i,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                let why = if self.pid(&p).is_none() {
                    format!("{e} (QEMU is gone: vm restore the VM from a snapshot it has)")
                } else {
                    e.to_string()
                };
                return Err(VmError::Backend(format!(
                    "snapshot {snap:?} of VM {name:?} not made: {why}; the VM's other snapshots are untouched"
                )));
            }
        };
        // In: one rename, or one exchange with the snapshot it replaces.
        if target.exists() {
            rustix::fs::renameat_with(
                rustix::fs::CWD,
                &tmp,
                rustix::fs::CWD,
                &target,
                rustix::fs::RenameFlags::EXCHANGE,
            )
            .map_err(std::io::Error::from)?;
            sync_dir(&p.snapshots())?;
            let _ = std::fs::remove_dir_all(&tmp);
        } else {
            std::fs::rename(&tmp, &target)?;
            sync_dir(&p.snapshots())?;
        }
        if was_running {
            let _ = self.sync_clock(&p, false);
        }
        Ok(info)
    }

    pub fn snapshot_delete(&self, name: &str, snap: &str) -> Result<Done, VmError> {
        let (p, _) = self.existing(name)?;
        check_name("snapshot", snap)?;
        let dir = p.snapshot(snap);
        if !dir.join("snapshot.json").is_file() {
            return Err(VmError::NotFound(format!(
                "VM {name:?} has no snapshot {snap:?}"
            )));
        }
        let t0 = Instant::now();
        // Out of the listing first, then away.
        let gone = p.snapshots().join(format!(".{snap}.deleting"));
        std::fs::rename(&dir, &gone)?;
        sync_dir(&p.snapshots())?;
        std::fs::remove_dir_all(&gone)?;
        Ok(done(name, "snapshot-delete", true, t0, None))
    }

    /// Starts VM `name` (stopped) from its snapshot `snap`.
    pub fn restore(&self, name: &str, snap: &str) -> Result<Restored, VmError> {
        let (p, _) = self.existing(name)?;
        let _held = self.hold(&p, name)?;
        self.must_be_stopped(&p, name, "restore it")?;
        self.restore_from(&p, name, name, snap)
    }

    /// A new VM `new` restored from snapshot `snap` of VM `from`, which
    /// goes on as it was (running or not).
    pub fn clone_vm(&self, from: &str, snap: &str, new: &str) -> Result<Restored, VmError> {
        let (src, _) = self.existing(from)?;
        check_name("snapshot", snap)?;
        let snapdir = src.snapshot(snap);
        let mut cfg = read_config(&snapdir.join("vm.json"))
            .map_err(|_| VmError::NotFound(format!("VM {from:?} has no snapshot {snap:?}")))?;
        let p = self.paths(new)?;
        if p.dir.join(CLONING).exists() && !self.sweep_clone(&p)? {
            return Err(VmError::Conflict(format!(
                "VM {new:?} is being cloned by another vm command: wait for it to end"
            )));
        }
        if p.dir.exists() {
            return Err(VmError::Conflict(format!(
                "VM {new:?} exists; a clone needs a new name"
            )));
        }
        cfg.name = new.into();
        cfg.created_ms = now_ms();
        let tmp = self.root.join(format!(".{new}.creating"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir(&tmp)?;
        std::fs::create_dir(tmp.join("snapshots"))?;
        write_atomic(
            &tmp.join("vm.json"),
            &serde_json::to_vec_pretty(&cfg).unwrap(),
        )?;
        // Marked as being cloned, and held (the lock moves with the
        // directory), until its guest runs: a clone stopped half-way (the
        // command interrupted) is never listed, and the next command that
        // meets it kills its QEMU and removes it.
        std::fs::File::create(tmp.join(CLONING))?;
        let held = std::fs::File::create(tmp.join(".lock"))?;
        rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| VmError::Io(e.into()))?;
        if let Err(e) = std::fs::rename(&tmp, &p.dir) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(if p.dir.exists() {
                VmError::Conflict(format!("VM {new:?} exists; a clone needs a new name"))
            } else {
                e.into()
            });
        }
        sync_dir(&self.root)?;
        let made = self.restore_from(&p, new, from, snap).and_then(|r| {
            std::fs::remove_file(p.dir.join(CLONING))?;
            sync_dir(&p.dir)?;
            Ok(r)
        });
        if made.is_err() {
            // No half clone listed.
            if let Some(pid) = self.pid(&p) {
                self.kill_pid(&p, pid);
            }
            let _ = std::fs::remove_dir_all(&p.dir);
        }
        drop(held);
        made
    }

    fn restore_from(
        &self,
        p: &VmPaths,
        name: &str,
        from: &str,
        snap: &str,
    ) -> Result<Restored, VmError> {
        check_name("snapshot", snap)?;
        let src = self.paths(from)?;
        let snapdir = src.snapshot(snap);
        if !snapdir.join("snapshot.json").is_file() {
            return Err(VmError::NotFound(format!(
                "VM {from:?} has no snapshot {snap:?} (vm list shows them)"
            )));
        }
        let mut cfg = read_config(&snapdir.join("vm.json"))?;
        cfg.name = name.into();
        // The disk: the snapshot's copy in, the VM's own kept aside until
        // the guest runs.
        let t0 = Instant::now();
        let incoming = p.dir.join("store.img.restoring");
        let kept = p.dir.join("store.img.before-restore");
        let _ = std::fs::remove_file(&incoming);
        copy_image(&snapdir.join("store.img"), &incoming)?;
        let had = p.store().exists();
        if had {
            std::fs::rename(p.store(), &kept)?;
        }
        std::fs::rename(&incoming, p.store())?;
        sync_dir(&p.dir)?;
        let disk_ms = t0.elapsed().as_millis() as u64;
        let put_back = || {
            if had {
                let _ = std::fs::rename(&kept, p.store());
            }
        };
        clear_sockets(p);
        let t1 = Instant::now();
        let pid = match self.backend.launch(p, &cfg, true) {
            Ok(pid) => pid,
            Err(e) => {
                put_back();
                return Err(e);
            }
        };
        let fail = |e: VmError| {
            self.kill_pid(p, pid);
            put_back();
            with_console(p, e)
        };
        self.backend.load(p, &snapdir.join("state")).map_err(fail)?;
        let load_ms = t1.elapsed().as_millis() as u64;
        self.backend.resume(p).map_err(fail)?;
        let r =
            resumed(p, &self.backend.control(p), true, Duration::from_secs(60)).map_err(fail)?;
        let ready_ms = t1.elapsed().as_millis() as u64;
        if had {
            let _ = std::fs::remove_file(&kept);
        }
        Ok(Restored {
            name: name.into(),
            snapshot: snap.into(),
            from_vm: from.into(),
            pid,
            disk_ms,
            load_ms,
            ready_ms,
            clock_step_ms: r.clock_step_ms,
            reseeded: r.reseeded,
            instance: r.instance,
        })
    }

    /// Removes the VM and everything of it (its QEMU killed first with
    /// `force`).
    pub fn rm(&self, name: &str, force: bool) -> Result<Done, VmError> {
        let (p, _) = self.existing(name)?;
        let _held = self.hold(&p, name)?;
        let t0 = Instant::now();
        if let Some(pid) = self.pid(&p) {
            if !force {
                return Err(VmError::Conflict(format!(
                    "VM {name:?} is running (QEMU pid {pid}): vm stop it first, or --force"
                )));
            }
            self.kill_pid(&p, pid);
        }
        let gone = self.root.join(format!(".{name}.removing"));
        let _ = std::fs::remove_dir_all(&gone);
        std::fs::rename(&p.dir, &gone)?;
        sync_dir(&self.root)?;
        std::fs::remove_dir_all(&gone)?;
        Ok(done(name, "rm", true, t0, None))
    }
}

fn done(
    name: &str,
    op: &'static str,
    changed: bool,
    t0: Instant,
    clock: Option<ClockSync>,
) -> Done {
    Done {
        name: name.into(),
        op,
        changed,
        us: t0.elapsed().as_micros() as u64,
        clock,
    }
}

fn read_config(path: &Path) -> Result<VmConfig, VmError> {
    let b = std::fs::read(path)?;
    serde_json::from_slice(&b)
        .map_err(|e| VmError::Invalid(format!("{}: not a VM's configuration: {e}", path.display())))
}

/// Formats a blank store image as the guest's store (Btrfs, labelled as
/// `rootfs-builder store-image --format` does).
fn format_store(img: &Path) -> Result<(), VmError> {
    let out = std::process::Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-L", "allox-store"])
        .arg(img)
        .output()
        .map_err(|e| {
            VmError::Invalid(format!(
                "cannot run mkfs.btrfs to format the store disk ({e}): apt-get install btrfs-progs"
            ))
        })?;
    if !out.status.success() {
        return Err(VmError::Backend(format!(
            "mkfs.btrfs {}: {}",
            img.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

fn clear_sockets(p: &VmPaths) {
    let _ = std::fs::remove_file(p.ctl());
    let _ = std::fs::remove_file(p.qmp());
}

/// Removes what a snapshot interrupted by a crash left (hidden names).
/// Takes the exclusive lock of a VM's `.lock` file `f`, waiting up to
/// half a second for it: whether it was taken. A command holds it for its
/// whole length; a moment's hold is a copy of the descriptor that a
/// process forked meanwhile (by another thread) keeps until its `exec`.
fn lock_soon(f: &std::fs::File) -> Result<bool, VmError> {
    for _ in 0..50 {
        match rustix::fs::flock(f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::WOULDBLOCK) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(VmError::Io(e.into())),
        }
    }
    Ok(false)
}

/// In a snapshot's partial directory: the snapshot paused the guest.
const PAUSED_BY_SNAPSHOT: &str = "paused-by-snapshot";

/// In a VM's directory: `vm clone` is making it, and it is not listed
/// until its guest runs.
const CLONING: &str = ".cloning";

fn clear_partial(p: &VmPaths) {
    for e in std::fs::read_dir(p.snapshots())
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name().to_string_lossy().starts_with('.') {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Whether process `pid` ended within `timeout`.
/// Whether process `pid` exists and is not a zombie (one not reaped yet
/// is gone as far as a VM goes).
fn live(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if !live(pid) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn with_console(p: &VmPaths, e: VmError) -> VmError {
    let console = std::fs::read_to_string(p.console()).unwrap_or_default();
    let qemu = std::fs::read_to_string(p.qemu_log()).unwrap_or_default();
    let tail = |s: &str| {
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    };
    VmError::Backend(format!(
        "{e}\n--- QEMU ({}):\n{}\n--- console ({}):\n{}",
        p.qemu_log().display(),
        tail(&qemu),
        p.console().display(),
        tail(&console)
    ))
}

/// Connects to the guest's control port and says Hello, again on a new
/// connection when no Welcome comes within 5 s (a host on a serial port
/// must: docs/guest.md), until `timeout`.
pub fn hello(p: &VmPaths, timeout: Duration) -> Result<(Client, Duration), VmError> {
    let serial = crate::transport::ControlTransport::Serial { socket: p.ctl() };
    hello_via(p, &serial, timeout)
}

/// [`hello`] over `transport`.
pub fn hello_via(
    p: &VmPaths,
    transport: &crate::transport::ControlTransport,
    timeout: Duration,
) -> Result<(Client, Duration), VmError> {
    let t0 = Instant::now();
    let mut last = String::from("no connection");
    let pid: Option<u32> = std::fs::read_to_string(p.pid())
        .ok()
        .and_then(|s| s.trim().parse().ok());
    while t0.elapsed() < timeout {
        if let Some(pid) = pid {
            if !live(pid) {
                return Err(VmError::Guest(format!(
                    "QEMU (pid {pid}) ended before the guest answered"
                )));
            }
        }
        match transport.connect(Duration::from_secs(5)) {
            Ok(stream) => {
                stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
                match Client::handshake(stream) {
                    Ok(mut c) => {
                        c.set_timeout(Some(Duration::from_secs(60))).ok();
                        return Ok((c, t0.elapsed()));
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let on = match transport {
        crate::transport::ControlTransport::Serial { socket } => socket.display().to_string(),
        crate::transport::ControlTransport::HybridVsock { socket, port } => {
            format!("vsock port {port} behind {}", socket.display())
        }
    };
    Err(VmError::Guest(format!(
        "no answer on {on} within {} s ({last})",
        timeout.as_secs()
    )))
}

/// `system.resumed` with the host's clock (and with `seed`, 32 random
/// bytes) over the control port.
pub fn resumed(
    p: &VmPaths,
    transport: &crate::transport::ControlTransport,
    seed: bool,
    timeout: Duration,
) -> Result<allox_protocol::Resumed, VmError> {
    let (mut c, _) = hello_via(p, transport, timeout)?;
    let mut bytes = Vec::new();
    if seed {
        bytes = vec![0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| VmError::Backend(format!("host random: {e}")))?;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let req = Request::SystemResumed(allox_protocol::SystemResumed {
        realtime_ns: now.as_nanos() as u64,
        seed: bytes.into(),
    });
    match c.call(req) {
        Ok(Ok(Response::Resumed(r))) => Ok(r),
        Ok(Ok(other)) => Err(VmError::Guest(format!(
            "system.resumed answered {}",
            other.kind()
        ))),
        Ok(Err(body)) => Err(VmError::Guest(format!(
            "system.resumed refused: {}: {}",
            body.code.as_str(),
            body.message
        ))),
        Err(e) => Err(VmError::Guest(format!(
            "system.resumed: {}",
            allox_client::error_chain(&e)
        ))),
    }
}

#[cfg(test)]
mod tests {
    //! The manager's bookkeeping over a fake VMM (a process that stands in
    //! for QEMU): what a failure leaves. The real QEMU is driven by the
    //! VM tests (tests/tests/vm/manager.rs).

    use super::*;
    use std::collections::HashMap;
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Inner {
        vms: Mutex<HashMap<PathBuf, (Child, RunState)>>,
        fail_save: AtomicBool,
        fail_load: AtomicBool,
        saved: std::sync::atomic::AtomicU64,
    }

    #[derive(Clone, Default)]
    struct Fake(Arc<Inner>);

    impl Drop for Inner {
        fn drop(&mut self) {
            for (_, (mut c, _)) in self.vms.lock().unwrap().drain() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    impl Fake {
        fn set(&self, p: &VmPaths, st: RunState) {
            self.0.vms.lock().unwrap().get_mut(&p.dir).unwrap().1 = st;
        }
    }

    impl Backend for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn launch(&self, p: &VmPaths, _: &VmConfig, incoming: bool) -> Result<u32, VmError> {
            // A shell waiting on a pipe, with the QMP path in its command
            // line as QEMU has it.
            let child = Command::new("sh")
                .args(["-c", "read x"])
                .arg(p.qmp())
                .stdin(Stdio::piped())
                .spawn()?;
            let pid = child.id();
            // As QEMU writes its pid file once it is set up: here once the
            // shell runs (its command line is the QMP path's).
            let qmp = p.qmp().display().to_string();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&qmp))
            {
                assert!(Instant::now() < deadline, "the fake VMM did not start");
                std::thread::sleep(Duration::from_millis(1));
            }
            std::fs::write(p.pid(), pid.to_string())?;
            let st = if incoming {
                RunState::Loading
            } else {
                RunState::Running
            };
            if let Some((mut old, _)) = self
                .0
                .vms
                .lock()
                .unwrap()
                .insert(p.dir.clone(), (child, st))
            {
                let _ = old.kill();
                let _ = old.wait();
            }
            Ok(pid)
        }
        fn status(&self, p: &VmPaths) -> Result<RunState, VmError> {
            Ok(self.0.vms.lock().unwrap()[&p.dir].1)
        }
        fn pause(&self, p: &VmPaths) -> Result<(), VmError> {
            self.set(p, RunState::Paused);
            Ok(())
        }
        fn resume(&self, p: &VmPaths) -> Result<(), VmError> {
            self.set(p, RunState::Running);
            Ok(())
        }
        fn save(&self, _: &VmPaths, state: &Path) -> Result<(), VmError> {
            if self.0.fail_save.load(Ordering::SeqCst) {
                std::fs::write(state, b"half")?;
                return Err(VmError::Backend("No space left on device".into()));
            }
            let n = self.0.saved.fetch_add(1, Ordering::SeqCst);
            std::fs::write(state, format!("state {n}"))?;
            Ok(())
        }
        fn load(&self, p: &VmPaths, _: &Path) -> Result<(), VmError> {
            if self.0.fail_load.load(Ordering::SeqCst) {
                return Err(VmError::Backend(
                    "the state does not fit this machine".into(),
                ));
            }
            self.set(p, RunState::Paused);
            Ok(())
        }
        fn power_button(&self, _: &VmPaths) -> Result<(), VmError> {
            Ok(())
        }
        fn control_port_busy(&self, _: &VmPaths) -> Result<bool, VmError> {
            Ok(true)
        }
    }

    /// A manager over the fake, and VM `v` made and "running".
    fn setup(dir: &Path) -> (Manager, Fake, VmPaths) {
        let kdir = dir.join("kernel");
        std::fs::create_dir(&kdir).unwrap();
        std::fs::write(kdir.join("vmlinux"), b"k").unwrap();
        std::fs::write(dir.join("initrd"), b"i").unwrap();
        std::fs::write(dir.join("store.img"), b"disk one").unwrap();
        let fake = Fake::default();
        let m = Manager::new(dir.join("vms"), Box::new(fake.clone()));
        m.create(&CreateSpec {
            name: "v".into(),
            kernel_dir: kdir,
            initrd: dir.join("initrd"),
            memory_mib: 256,
            cpus: 1,
            settings: vec!["allox.log=debug".into()],
            append: None,
            accel: "tcg".into(),
            net_user: Some(vec!["10.0.2.100:80=8094".into()]),
            store_mib: 0,
            store_from: Some(dir.join("store.img")),
        })
        .unwrap();
        let (p, cfg) = m.existing("v").unwrap();
        fake.launch(&p, &cfg, false).unwrap();
        (m, fake, p)
    }

    #[test]
    fn a_failed_snapshot_leaves_the_one_it_would_replace_and_the_guest_running() {
        let d = tempfile::tempdir().unwrap();
        let (m, fake, p) = setup(d.path());
        let one = m.snapshot("v", "one", false).unwrap();
        assert!(one.was_running);
        let first = std::fs::read(p.snapshot("one").join("state")).unwrap();
        let e = m.snapshot("v", "one", false).unwrap_err();
        assert!(e.to_string().contains("--replace"), "{e}");
        fake.0.fail_save.store(true, Ordering::SeqCst);
        let e = m.snapshot("v", "one", true).unwrap_err();
        assert!(
            e.to_string().contains("not made") && e.to_string().contains("No space"),
            "{e}"
        );
        assert_eq!(
            std::fs::read(p.snapshot("one").join("state")).unwrap(),
            first
        );
        let names: Vec<_> = std::fs::read_dir(p.snapshots())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["one"], "a half snapshot left");
        assert_eq!(
            fake.status(&p).unwrap(),
            RunState::Running,
            "the guest stays paused"
        );
        // Replaced when it works: the new one whole, in one exchange.
        fake.0.fail_save.store(false, Ordering::SeqCst);
        m.snapshot("v", "one", true).unwrap();
        assert_ne!(
            std::fs::read(p.snapshot("one").join("state")).unwrap(),
            first
        );
        assert_eq!(m.info("v").unwrap().snapshots.len(), 1);
        // A paused guest stays paused.
        m.pause("v").unwrap();
        let two = m.snapshot("v", "two", false).unwrap();
        assert!(!two.was_running);
        assert_eq!(m.state("v").unwrap(), "paused");
        m.snapshot_delete("v", "two").unwrap();
        assert!(matches!(
            m.snapshot_delete("v", "two"),
            Err(VmError::NotFound(_))
        ));
    }

    #[test]
    fn a_failed_restore_puts_the_vms_own_disk_back_and_a_failed_clone_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let (m, fake, p) = setup(d.path());
        m.snapshot("v", "one", false).unwrap();
        // Running: neither restore nor rm without --force.
        assert!(matches!(m.restore("v", "one"), Err(VmError::Conflict(_))));
        assert!(matches!(m.rm("v", false), Err(VmError::Conflict(_))));
        m.kill("v").unwrap();
        assert_eq!(m.state("v").unwrap(), "stopped");
        assert!(matches!(
            m.snapshot("v", "x", false),
            Err(VmError::Conflict(_))
        ));
        std::fs::write(p.store(), b"disk two").unwrap();
        fake.0.fail_load.store(true, Ordering::SeqCst);
        let e = m.restore("v", "one").unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        assert_eq!(std::fs::read(p.store()).unwrap(), b"disk two");
        assert_eq!(
            m.state("v").unwrap(),
            "stopped",
            "the VMM of a failed restore lives"
        );
        let left = disks_aside(&p);
        assert!(left.is_empty(), "{left:?}");
        let e = m.clone_vm("v", "one", "w").unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        let vms: Vec<String> = m.list().unwrap().into_iter().map(|v| v.name).collect();
        assert_eq!(vms, ["v"]);
        assert!(std::fs::read_dir(m.root()).unwrap().count() == 1);
        assert!(matches!(
            m.clone_vm("v", "nope", "w"),
            Err(VmError::NotFound(_))
        ));
        assert!(matches!(
            m.clone_vm("v", "one", "v"),
            Err(VmError::Conflict(_))
        ));
        m.rm("v", false).unwrap();
        assert!(m.list().unwrap().is_empty());
    }

    /// A clone whose command was stopped half-way (its guest loaded and
    /// never resumed, or its disk not yet there) is not listed; while its
    /// command lives, commands of it are refused as busy; once that
    /// command is gone, the next one that meets it kills its QEMU and
    /// removes it (it was listed `stopped` with no disk, or `paused` for
    /// ever).
    #[test]
    fn a_clone_stopped_half_way_is_never_listed_and_goes_with_its_qemu() {
        let d = tempfile::tempdir().unwrap();
        let (m, fake, _p) = setup(d.path());
        m.snapshot("v", "one", false).unwrap();
        // What a `vm clone v one w` killed after its QEMU started leaves.
        let w = m.paths("w").unwrap();
        std::fs::create_dir_all(w.snapshots()).unwrap();
        let (_, cfg) = m.existing("v").unwrap();
        std::fs::write(w.config(), serde_json::to_vec(&cfg).unwrap()).unwrap();
        std::fs::write(w.dir.join(CLONING), b"").unwrap();
        let pid = fake.launch(&w, &cfg, true).unwrap();
        // Its command still holds it.
        let held = std::fs::File::create(w.dir.join(".lock")).unwrap();
        rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();
        let names = |m: &Manager| -> Vec<String> {
            m.list().unwrap().into_iter().map(|v| v.name).collect()
        };
        assert_eq!(names(&m), ["v"]);
        let e = m.info("w").unwrap_err();
        assert!(e.to_string().contains("being cloned"), "{e}");
        assert!(live(pid));
        // Its command gone: the next one removes it, its QEMU first.
        drop(held);
        assert_eq!(names(&m), ["v"]);
        wait_gone(pid, Duration::from_secs(10));
        assert!(!live(pid), "the half clone's QEMU lives");
        assert!(!w.dir.exists());
        assert!(matches!(m.info("w"), Err(VmError::NotFound(_))));
        // The name is free: a clone to it goes as far as its guest's load.
        fake.0.fail_load.store(true, Ordering::SeqCst);
        let e = m.clone_vm("v", "one", "w").unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        assert!(!w.dir.exists());
    }

    /// The disks beside the VM's own (`store.img.*`).
    fn disks_aside(p: &VmPaths) -> Vec<String> {
        std::fs::read_dir(&p.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("store.img."))
            .collect()
    }

    /// A snapshot stopped half-way once it had paused the guest: the next
    /// command that reaches the VM resumes it (it stayed paused for ever,
    /// every request to its guest hanging) and drops the partial copy; a
    /// guest paused by `vm pause` stays paused.
    #[test]
    fn a_snapshot_stopped_half_way_does_not_leave_the_guest_paused() {
        let d = tempfile::tempdir().unwrap();
        let (m, _fake, p) = setup(d.path());
        m.pause("v").unwrap();
        std::fs::create_dir_all(p.snapshots().join(".s.partial")).unwrap();
        assert_eq!(m.state("v").unwrap(), "paused");
        m.socket("v").unwrap();
        assert_eq!(m.state("v").unwrap(), "paused", "a pause of the user's");
        std::fs::create_dir_all(p.snapshots().join(".s.partial")).unwrap();
        std::fs::write(
            p.snapshots().join(".s.partial").join(PAUSED_BY_SNAPSHOT),
            b"",
        )
        .unwrap();
        m.socket("v").unwrap();
        assert_eq!(m.state("v").unwrap(), "running");
        assert!(!p.snapshots().join(".s.partial").exists());
    }

    /// A restore stopped half-way (its command killed once the disks were
    /// swapped): the next command that changes the VM puts its own disk
    /// back, and the next restore cannot rename over it. Meanwhile,
    /// another command of the same VM is refused, naming why.
    #[test]
    fn a_restore_stopped_half_way_gives_the_vm_its_own_disk_back() {
        let d = tempfile::tempdir().unwrap();
        let (m, _fake, p) = setup(d.path());
        m.snapshot("v", "one", false).unwrap();
        m.kill("v").unwrap();
        // What the killed restore left: the snapshot's disk in, the VM's
        // own aside, a copy half-made.
        std::fs::write(p.dir.join("store.img.before-restore"), b"own disk").unwrap();
        std::fs::write(p.store(), b"the snapshot's disk").unwrap();
        std::fs::write(p.dir.join("store.img.restoring"), b"half").unwrap();
        // Another command holds the VM: refused, naming why.
        let busy = std::fs::File::open(p.dir.join(".lock"))
            .or_else(|_| std::fs::File::create(p.dir.join(".lock")))
            .unwrap();
        rustix::fs::flock(&busy, rustix::fs::FlockOperation::LockExclusive).unwrap();
        let e = m.start("v", Duration::from_secs(5)).unwrap_err();
        assert!(
            matches!(&e, VmError::Conflict(m) if m.contains("busy")),
            "{e}"
        );
        assert_eq!(std::fs::read(p.store()).unwrap(), b"the snapshot's disk");
        drop(busy);
        // (The fake guest never answers: the start fails after it settled.)
        let _ = m.start("v", Duration::from_millis(200));
        assert_eq!(std::fs::read(p.store()).unwrap(), b"own disk");
        let left = disks_aside(&p);
        assert!(left.is_empty(), "{left:?}");
    }
}
