//! The VM manager (`alloxctl vm`): a guest paused and resumed, saved and
//! restored after its power was cut, cloned twice, and snapshots that fail
//! half-way (QEMU killed, the disk full) — driven as a user drives it,
//! through `alloxctl`, with the guest's own answers checked over its
//! control port.

use super::{ck, ok, processes, run, sh, start};
use allox_ctl::client::Client;
use allox_integration::vm::{require_vm, GuestImage};
use allox_protocol::*;
use allox_vmm::VmPaths;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The VMs of one test, under a directory of their own; every one of
/// them is killed and removed when the test ends, whatever happened.
pub(super) struct Vms {
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl Vms {
    pub(super) fn new(root: Option<PathBuf>) -> Vms {
        let dir = tempfile::Builder::new()
            .prefix("allox-vms-")
            .tempdir_in("/var/tmp")
            .expect("temp dir");
        Vms {
            root: root.unwrap_or_else(|| dir.path().join("vms")),
            _dir: dir,
        }
    }

    /// `alloxctl --vm-dir ROOT ARGS`: status, stdout, stderr.
    fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(allox_integration::workspace_bin("alloxctl"))
            .arg("--vm-dir")
            .arg(&self.root)
            .args(args)
            .output()
            .expect("run alloxctl");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `alloxctl --json vm ARGS`, which must succeed: its JSON.
    pub(super) fn vm(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json", "vm"];
        all.extend_from_slice(args);
        let (st, out, err) = self.ctl(&all);
        assert_eq!(st, 0, "alloxctl vm {args:?} failed: {err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    /// `alloxctl vm ARGS`, which must fail: its stderr.
    fn vm_fails(&self, args: &[&str]) -> String {
        let mut all = vec!["vm"];
        all.extend_from_slice(args);
        let (st, out, err) = self.ctl(&all);
        assert_ne!(st, 0, "alloxctl vm {args:?} succeeded: {out}");
        err
    }

    fn create(&self, img: &GuestImage, name: &str) {
        self.create_with(img, name, &[]);
    }

    /// `vm create NAME` of the guest image, 512 MiB, with `more` arguments.
    pub(super) fn create_with(&self, img: &GuestImage, name: &str, more: &[&str]) {
        let (k, i) = (
            img.kernel_dir.display().to_string(),
            img.initrd.display().to_string(),
        );
        let mut args = vec![
            "create",
            name,
            "--kernel-dir",
            &k,
            "--initrd",
            &i,
            "--memory",
            "512",
        ];
        args.extend_from_slice(more);
        self.vm(&args);
    }

    pub(super) fn paths(&self, name: &str) -> VmPaths {
        VmPaths {
            dir: self.root.join(name),
        }
    }

    /// A client of VM `name`'s guest.
    pub(super) fn client(&self, name: &str) -> Client {
        allox_vmm::manager::hello(&self.paths(name), Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("VM {name}: {e}"))
            .0
    }

    fn snapshots(&self, name: &str) -> Vec<String> {
        let l = self.vm(&["list"]);
        let v = l
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("VM {name} not listed: {l}"));
        v["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect()
    }

    /// What is left in the VM's snapshot directory besides whole
    /// snapshots (a half-written one).
    fn leftovers(&self, name: &str) -> Vec<String> {
        std::fs::read_dir(self.paths(name).snapshots())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect()
    }
}

impl Drop for Vms {
    fn drop(&mut self) {
        let names: Vec<String> = std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        for n in names {
            let _ = self.ctl(&["vm", "rm", "--force", &n]);
        }
    }
}

/// A terminal run of session `a/s` (not waited for): its id.
fn start_pty(c: &mut Client, script: &str) -> String {
    let Request::ProcessStart(mut p) = run("a", "s", script, false) else {
        unreachable!()
    };
    p.pty = Some(PtySize {
        rows: 24,
        cols: 80,
        term: None,
    });
    match ok(c, Request::ProcessStart(p)) {
        Response::Started(r) => r.run_id,
        other => panic!("{other:?}"),
    }
}

/// A checkpoint of `a/s`: its time.
fn checkpoint(c: &mut Client, id: &str) -> u64 {
    match ok(c, ck("a", "s", id)) {
        Response::Checkpoint(i) => i.created_ms,
        other => panic!("{other:?}"),
    }
}

/// The ids of `a/s`'s live runs.
fn runs(c: &mut Client) -> Vec<String> {
    processes(c, "a", "s")
        .into_iter()
        .filter_map(|p| p.run_id)
        .collect()
}

fn now_ms() -> u64 {
    allox_vmm::now_ms()
}

/// Attaches to terminal run `run` and returns the first output that comes
/// after attaching (the run goes on writing), then lets go.
fn attach_and_read(c: Client, run: &str) -> String {
    let mut c = c;
    let closer = c.closer().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let req = Request::ProcessAttach(ProcessAttach {
        agent_id: "a".into(),
        session_id: "s".into(),
        run_id: run.into(),
        replay: Some(false),
    });
    let t = std::thread::spawn(move || {
        let _ = c.call_with_events(req, |e| {
            if let Event::Output(o) = e {
                let _ = tx.send(o.data.0);
            }
        });
    });
    let got = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("no output from the terminal run after attaching");
    let _ = closer.shutdown(std::net::Shutdown::Both);
    t.join().unwrap();
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn vm_manager_pause_snapshot_restore_and_clone() {
    let Some(img) = require_vm("vm_manager_pause_snapshot_restore_and_clone") else {
        return;
    };
    let vms = Vms::new(None);
    vms.create(&img, "g");
    // A bad name, a missing kernel: refused, naming what is wrong; nothing made.
    assert!(vms
        .vm_fails(&["create", "../x"])
        .contains("VM name \"../x\""));
    let err = vms.vm_fails(&[
        "create",
        "h",
        "--kernel-dir",
        "/nonexistent",
        "--initrd",
        "/nonexistent",
    ]);
    assert!(err.contains("/nonexistent/vmlinux not found"), "{err}");
    assert!(vms
        .vm_fails(&[
            "create",
            "g",
            "--kernel-dir",
            &img.kernel_dir.display().to_string(),
            "--initrd",
            &img.initrd.display().to_string()
        ])
        .contains("exists"));
    // Forwards QEMU would refuse at every start: refused at create.
    let k = img.kernel_dir.display().to_string();
    let i = img.initrd.display().to_string();
    for (forward, why) in [
        ("10.0.2.2:80=8080", "the gateway's"),
        ("10.0.2.100:0=8080", "port 0"),
    ] {
        let err = vms.vm_fails(&[
            "create",
            "fw",
            "--kernel-dir",
            &k,
            "--initrd",
            &i,
            "--net-user",
            "--forward",
            forward,
        ]);
        assert!(err.contains(why), "{err}");
    }
    // Options the guest's supervisor refuses: it says so and the guest
    // powers off, at once, not restarting it for ever while `start` waits
    // its whole timeout.
    vms.create_with(&img, "bad", &["allox.args=--no-such-flag"]);
    let t0 = Instant::now();
    let err = vms.vm_fails(&["start", "bad", "--timeout", "300"]);
    assert!(
        err.contains("ended before the guest answered")
            && err.contains("--no-such-flag")
            && err.contains("not restarting it")
            && !err.contains("restarting the supervisor in"),
        "{err}"
    );
    eprintln!("a refused supervisor: said in {:?}", t0.elapsed());
    vms.vm(&["rm", "bad"]);
    let started = vms.vm(&["start", "g"]);
    eprintln!("cold boot to the first answer: {} ms", started["ready_ms"]);
    assert!(vms.vm_fails(&["start", "g"]).contains("is running"));
    assert!(vms
        .vm_fails(&["restore", "g", "nope"])
        .contains("is running"));

    let mut c = vms.client("g");
    ok(
        &mut c,
        Request::AgentCreate(AgentCreate::new("a".to_string())),
    );
    ok(&mut c, Request::SessionCreate(SessionCreate::new("a", "s")));
    let sleeper = start(&mut c, "a", "s", "exec sleep 100000");
    let ticker = start_pty(
        &mut c,
        "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done",
    );
    let mut last_ms = 0;
    for i in 0..100 {
        last_ms = checkpoint(&mut c, &format!("c{i}"));
    }

    // Paused: a request waits (it is not lost), and is answered after the
    // resume; a caller who would not wait is told `unavailable`.
    vms.vm(&["pause", "g"]);
    let paused = vms.vm(&["list"]);
    assert_eq!(paused[0]["state"], "paused", "{paused}");
    let (st, _, err) = vms.ctl(&["--vm", "g", "--if-running", "ping"]);
    assert_eq!(st, 1);
    assert!(
        err.contains("unavailable") && err.contains("paused"),
        "{err}"
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let r = c.call(Request::Ping(Ping {}));
        tx.send(matches!(r, Ok(Ok(Response::Pong(_))))).unwrap();
        c
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "a paused guest answered"
    );
    let resumed = vms.vm(&["resume", "g"]);
    // The waiting host holds the control port: the clock is left to it.
    assert_eq!(resumed["clock"]["set"], false, "{resumed}");
    assert!(
        rx.recv_timeout(Duration::from_secs(30)).unwrap(),
        "the ping after the resume"
    );
    let mut c = waiter.join().unwrap();
    assert!(runs(&mut c).contains(&sleeper));
    drop(c);

    // Snapshot, power cut, restore after a while: the runs go on, the
    // terminal can be attached again, the checkpoints are all there, the
    // clock is the host's.
    let snap = vms.vm(&["snapshot", "g", "one"]);
    eprintln!("snapshot: {snap}");
    assert_eq!(snap["guest_memory_mib"], 512);
    assert!(vms
        .vm_fails(&["snapshot", "g", "one"])
        .contains("--replace"));
    vms.vm(&["kill", "g"]);
    assert_eq!(vms.vm(&["list"])[0]["state"], "stopped");
    assert!(vms.vm_fails(&["pause", "g"]).contains("not running"));
    // The time passes that a restored guest must not lose.
    std::thread::sleep(Duration::from_secs(3));
    let before = now_ms();
    let r = vms.vm(&["restore", "g", "one"]);
    eprintln!("restore: {r}");
    assert_eq!(r["reseeded"], true);
    let step = r["clock_step_ms"].as_i64().unwrap();
    assert!(
        step >= 2500,
        "the guest's clock moved only {step} ms after 3 s"
    );
    let mut c = vms.client("g");
    let live = runs(&mut c);
    assert!(
        live.contains(&sleeper) && live.contains(&ticker),
        "{live:?}"
    );
    let t = checkpoint(&mut c, "after");
    let after = now_ms();
    assert!(
        t > last_ms,
        "checkpoint after the restore at {t}, before it {last_ms}"
    );
    assert!(
        t + 1000 >= before && t <= after + 1000,
        "the guest's clock {t} is not the host's ({before}..{after})"
    );
    match ok(
        &mut c,
        Request::CheckpointList(SessionRef {
            agent_id: "a".into(),
            session_id: "s".into(),
        }),
    ) {
        Response::Checkpoints(l) => {
            for i in 0..100 {
                let id = format!("c{i}");
                assert!(
                    l.checkpoints.iter().any(|c| c.checkpoint_id == id),
                    "{id} lost"
                );
            }
        }
        other => panic!("{other:?}"),
    }
    drop(c);
    let out = attach_and_read(vms.client("g"), &ticker);
    assert!(out.contains("tick"), "{out:?}");
    let mut c = vms.client("g");
    ok(
        &mut c,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: Some(sleeper.clone()),
            signal: None,
        }),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while runs(&mut c).contains(&sleeper) {
        assert!(Instant::now() < deadline, "the restored run was not killed");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(c);
    let (st, out, err) = vms.ctl(&["--vm", "g", "check"]);
    assert_eq!(st, 0, "alloxctl check after the restore: {out}{err}");

    // Two clones of one snapshot: their own disk, control port, random
    // bytes, ids.
    vms.vm(&["snapshot", "g", "base"]);
    let a = vms.vm(&["clone", "g", "base", "k1"]);
    let b = vms.vm(&["clone", "g", "base", "k2"]);
    assert_ne!(a["instance"], b["instance"]);
    let mut seen = Vec::new();
    for k in ["k1", "k2"] {
        let mut c = vms.client(k);
        let bytes = sh(
            &mut c,
            "a",
            "s",
            "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'",
        );
        let id = start(&mut c, "a", "s", "true");
        sh(&mut c, "a", "s", &format!("echo {k} > who"));
        seen.push((bytes, id, sh(&mut c, "a", "s", "cat who")));
    }
    eprintln!("clones: {seen:?}");
    assert_ne!(
        seen[0].0, seen[1].0,
        "the clones' random bytes are the same"
    );
    assert_ne!(seen[0].1, seen[1].1, "the clones made the same run id");
    assert_eq!((seen[0].2.trim(), seen[1].2.trim()), ("k1", "k2"));
    // The source goes on, with neither clone's file.
    let mut c = vms.client("g");
    assert_eq!(
        sh(&mut c, "a", "s", "cat who 2>/dev/null || echo none").trim(),
        "none"
    );
    drop(c);
    // Its orderly stop goes over the control port: not while a host holds it.
    let held = vms.client("k2");
    assert!(vms
        .vm_fails(&["stop", "k2"])
        .contains("holds VM \"k2\"'s control port"));
    drop(held);
    vms.vm(&["stop", "k2"]);
    assert!(
        std::fs::read_to_string(vms.paths("k2").console())
            .unwrap()
            .contains("store unmounted"),
        "k2 did not stop in order"
    );
    assert_eq!(vms.vm(&["rm", "k2"])["changed"], true);
    assert!(vms.vm_fails(&["rm", "k1"]).contains("--force"));
}

#[test]
fn vm_manager_a_failed_snapshot_leaves_the_previous_one() {
    let test = "vm_manager_a_failed_snapshot_leaves_the_previous_one";
    let Some(img) = require_vm(test) else {
        return;
    };
    // The VM's directory on a filesystem of its own, to fill.
    let mnt = tempfile::Builder::new()
        .prefix("allox-vms-full-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let _unmount = allox_integration::Tmpfs::mount(mnt.path(), 400, test);
    let vms = Vms::new(Some(mnt.path().join("vms")));
    vms.create(&img, "f");
    vms.vm(&["start", "f"]);
    let mut c = vms.client("f");
    ok(
        &mut c,
        Request::AgentCreate(AgentCreate::new("a".to_string())),
    );
    ok(&mut c, Request::SessionCreate(SessionCreate::new("a", "s")));
    sh(&mut c, "a", "s", "echo first > mark");
    drop(c);
    vms.vm(&["snapshot", "f", "good"]);

    // The disk full: everything but 8 MiB taken.
    let free = rustix::fs::statvfs(mnt.path()).unwrap();
    let left = free.f_bavail * free.f_frsize;
    let ballast = mnt.path().join("ballast");
    let f = std::fs::File::create(&ballast).unwrap();
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, left - (8 << 20)).unwrap();
    drop(f);
    let err = vms.vm_fails(&["snapshot", "f", "good", "--replace"]);
    assert!(err.contains("not made"), "{err}");
    assert_eq!(vms.snapshots("f"), ["good"]);
    assert!(vms.leftovers("f").is_empty(), "{:?}", vms.leftovers("f"));
    std::fs::remove_file(&ballast).unwrap();
    // The guest went on.
    let mut c = vms.client("f");
    sh(&mut c, "a", "s", "echo second > mark");
    drop(c);

    // QEMU killed while it writes the guest's memory.
    let p = vms.paths("f");
    let pid: i32 = std::fs::read_to_string(p.pid())
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let partial = p.snapshots().join(".good.partial").join("state");
    let killer = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !partial.exists() {
            assert!(Instant::now() < deadline, "no snapshot being written");
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::KILL,
        );
    });
    let err = vms.vm_fails(&["snapshot", "f", "good", "--replace"]);
    killer.join().unwrap();
    assert!(
        err.contains("not made") && err.contains("QEMU is gone"),
        "{err}"
    );
    assert_eq!(vms.snapshots("f"), ["good"]);
    assert!(vms.leftovers("f").is_empty(), "{:?}", vms.leftovers("f"));
    assert_eq!(vms.vm(&["list"])[0]["state"], "stopped");

    // The previous snapshot restores whole.
    vms.vm(&["restore", "f", "good"]);
    let mut c = vms.client("f");
    assert_eq!(sh(&mut c, "a", "s", "cat mark"), "first\n");
    drop(c);
    let (st, out, err) = vms.ctl(&["--vm", "f", "check"]);
    assert_eq!(st, 0, "{out}{err}");

    // A snapshot whose saved state is cut short: the restore fails with
    // QEMU's own reason, kept in qemu.log (a daemonized QEMU's messages
    // went to /dev/null: "QMP: Connection reset by peer" and an empty
    // log), and the VM is left on its own disk.
    vms.vm(&["snapshot", "f", "cut"]);
    vms.vm(&["stop", "f"]);
    let state = p.snapshot("cut").join("state");
    let len = std::fs::metadata(&state).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&state)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let err = vms.vm_fails(&["restore", "f", "cut"]);
    let log = std::fs::read_to_string(p.qemu_log()).unwrap();
    let reason = log
        .lines()
        .find(|l| l.starts_with("qemu-system"))
        .unwrap_or_else(|| panic!("no reason in qemu.log: {log:?}\n{err}"));
    assert!(err.contains(reason), "{err}");
    assert_eq!(vms.vm(&["list"])[0]["state"], "stopped");
    vms.vm(&["start", "f"]);
    let mut c = vms.client("f");
    assert_eq!(sh(&mut c, "a", "s", "cat mark"), "first\n");
}
