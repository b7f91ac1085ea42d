//! Allox as a container: the OCI image `rootfs-builder oci` makes, run
//! under podman with `allox-init container` as its PID 1 on a loop device,
//! driven from the host with `alloxctl` over the bind-mounted socket and
//! with curl through a gateway container that has no privilege — the
//! shape of the Kubernetes pod in deploy/k8s, without the VM.
//!
//! This host's cgroups are hybrid, so the container is given a cgroup2
//! subtree of the host's as `--cgroup-root` (no controllers: limits are
//! `unsupported`); the pure-v2 path is the VM test's
//! (`vm::guest_container_mode_on_pure_cgroup_v2_...`).

use allox_integration::container::{self, free_port, podman, Container, LoopDev, Spec, TAG};
use allox_integration::{alloxctl, which};
use allox_store::index::Index;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const READY: Duration = Duration::from_secs(60);

fn ctl(c: &Container, args: &[&str]) -> String {
    let (code, out, err) = alloxctl(&c.socket(), args);
    assert_eq!(
        code,
        0,
        "alloxctl {args:?}: {err}\ncontainer:\n{}",
        c.logs()
    );
    String::from_utf8_lossy(&out).into_owned()
}

fn ctl_fails(c: &Container, args: &[&str]) -> String {
    let (code, out, err) = alloxctl(&c.socket(), args);
    assert_ne!(
        code,
        0,
        "alloxctl {args:?} should fail: {}",
        String::from_utf8_lossy(&out)
    );
    err
}

/// Mounts `dev` on the host, returns what `f` finds, unmounts.
fn on_host<T>(dev: &Path, f: impl FnOnce(&Path) -> T) -> T {
    let mnt = tempfile::tempdir_in("/var/tmp").unwrap();
    let st = Command::new("mount")
        .arg(dev)
        .arg(mnt.path())
        .status()
        .unwrap();
    assert!(st.success(), "the store does not mount on the host");
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(mnt.path())));
    let _ = Command::new("umount").arg(mnt.path()).status();
    out.unwrap_or_else(|p| std::panic::resume_unwind(p))
}

#[test]
fn the_image_is_the_same_bytes_twice_inspectable_and_loadable() {
    if !container::require("container::the_image_is_the_same_bytes_twice_inspectable_and_loadable")
    {
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::create_dir_all(dir.path().join("a")).unwrap();
    std::fs::create_dir_all(dir.path().join("b")).unwrap();
    let a = container::build(&dir.path().join("a"), TAG);
    let b = container::build(&dir.path().join("b"), TAG);
    println!("{}", a.stdout);
    assert_eq!(a.digest, b.digest, "two builds, two digests");
    assert!(
        std::fs::read(&a.archive).unwrap() == std::fs::read(&b.archive).unwrap(),
        "two builds, two archives"
    );
    // skopeo reads the layout: the digest printed is the manifest's.
    let out = Command::new("skopeo")
        .arg("inspect")
        .arg(format!("oci:{}:{TAG}", a.layout.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["Digest"], a.digest.as_str(), "{v}");
    assert_eq!(v["Os"], "linux");
    let out = Command::new("skopeo")
        .args(["inspect", "--config"])
        .arg(format!("oci:{}:{TAG}", a.layout.display()))
        .output()
        .unwrap();
    let cfg: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        cfg["config"]["Entrypoint"],
        serde_json::json!(["/init", "container"]),
        "{cfg}"
    );
    // podman takes the archive and names the image by its tag; its digest
    // is the one printed.
    let img = container::image();
    let out = podman(&["image", "inspect", TAG, "--format", "{{.Digest}}"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), img.digest);
    // What the image holds: alloxctl, mkfs.btrfs that runs (its libraries
    // are there), the sandbox user.
    let out = container::podman_run(&[
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "/bin/sh",
        TAG,
        "-c",
        "mkfs.btrfs --version && alloxctl --version && grep ^sandbox: /etc/passwd",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("mkfs.btrfs, part of btrfs-progs"), "{text}");
    assert!(text.contains("alloxctl"), "{text}");
    assert!(text.contains("sandbox:x:10000:10000"), "{text}");
}

#[test]
fn a_container_serves_agents_and_the_gateway_then_stops_in_order_and_its_store_carries_over() {
    let test = "container::a_container_serves_agents_and_the_gateway_then_stops_in_order";
    if !container::require(test) {
        return;
    }
    assert!(
        which("curl").is_some(),
        "curl is needed (apt-get install curl)"
    );
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let dev = LoopDev::blank(dir.path(), "store.img", 1024);
    let run_dir = dir.path().join("run");
    let c = Container::start(&Spec {
        name: "allox-test-serve",
        store: Some(&dev.dev),
        run_dir: &run_dir,
        env: &[],
        args: &[
            "--format-blank",
            "--stop-timeout",
            "20",
            "--allow-uid",
            "65532",
            "--process-tracker",
            "ebpf",
        ],
    });
    c.wait_ready(READY);
    assert!(c
        .logs()
        .contains("formatting the blank store device /dev/allox-store"));

    // Agents, sessions, a sandboxed run, checkpoint, diff, rollback.
    ctl(&c, &["agent", "create", "a"]);
    ctl(&c, &["session", "create", "a", "s"]);
    let out = ctl(
        &c,
        &[
            "exec",
            "a",
            "s",
            "--",
            "sh",
            "-c",
            "echo one > f; cat f; id -u",
        ],
    );
    assert_eq!(out, "one\n10000\n");
    ctl(&c, &["checkpoint", "create", "a", "s", "c1"]);
    ctl(&c, &["exec", "a", "s", "--", "sh", "-c", "echo two > f"]);
    let diff = ctl(&c, &["diff", "a", "s", "c1", "current"]);
    assert!(diff.contains(" M f"), "{diff}");
    ctl(&c, &["rollback", "a", "s", "c1"]);
    assert_eq!(ctl(&c, &["exec", "a", "s", "--", "cat", "f"]), "one\n");

    // The process tracker, loaded inside the container, saw the runs.
    let deadline = Instant::now() + Duration::from_secs(20);
    let tree = loop {
        let t = ctl(&c, &["ps", "a", "s", "--tree"]);
        if t.contains("/usr/bin/sh") || Instant::now() > deadline {
            break t;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        tree.contains("init") && tree.contains("/usr/bin/sh"),
        "{tree}"
    );

    // Runs live in the cgroup given, and a kill empties it.
    let run = ctl(&c, &["start", "a", "s", "--", "sleep", "600"]);
    let run = run.trim();
    let procs = c.cgroup.join(format!("allox/a/s/run-{run}/cgroup.procs"));
    let held = std::fs::read_to_string(&procs).unwrap_or_default();
    assert!(!held.trim().is_empty(), "no process in {}", procs.display());
    ctl(&c, &["kill", "a", "s", run]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&procs).is_ok_and(|p| !p.trim().is_empty()) {
        assert!(Instant::now() < deadline, "the run's cgroup is not empty");
        std::thread::sleep(Duration::from_millis(50));
    }
    // This cgroup2 subtree offers no controllers: a limit says so.
    let err = ctl_fails(&c, &["limit", "a", "s", "--pids-max", "64"]);
    assert!(err.contains("unsupported") && err.contains("pids"), "{err}");

    // The gateway as its own container with no privilege (uid 65532, read-
    // only root, no capabilities), its token from the environment, as the
    // pod's second container.
    let token = "0123456789abcdef".repeat(4);
    let port = free_port();
    let gw_name = "allox-test-serve-gw";
    let _ = podman(&["rm", "-f", gw_name]);
    let listen = format!("127.0.0.1:{port}");
    let run_mount = format!("{}:/run/allox", run_dir.display());
    let token_env = format!("ALLOX_GATEWAY_TOKEN={token}");
    let out = container::podman_run(&[
        "-d",
        "--name",
        gw_name,
        "--network",
        "host",
        "--user",
        "65532:65532",
        "--read-only",
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
        "-v",
        &run_mount,
        "-e",
        &token_env,
        "--entrypoint",
        "/usr/bin/alloxctl",
        TAG,
        "--socket",
        "/run/allox/ctl.sock",
        "gateway",
        "--listen",
        &listen,
        "--token-env",
        "ALLOX_GATEWAY_TOKEN",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    struct Remove(&'static str);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = podman(&["rm", "-f", "-t", "0", self.0]);
        }
    }
    let _gw = Remove(gw_name);
    let t0 = Instant::now();
    while std::net::TcpStream::connect(&listen).is_err() {
        let logs = podman(&["logs", gw_name]);
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the gateway container did not listen: {}",
            String::from_utf8_lossy(&logs.stderr)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = format!("http://{listen}/v1/rpc");
    let curl = |auth: Option<&str>, body: &str| {
        let mut cmd = Command::new("curl");
        cmd.args([
            "-sS",
            &url,
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
        ]);
        if let Some(t) = auth {
            cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        let out = cmd.args(["-w", "\n%{http_code}"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (json, code) = text.rsplit_once('\n').unwrap();
        (code.to_string(), json.to_string())
    };
    // The seed's four calls, as the design document gives them.
    for body in [
        r#"{"action":"agent.create","params":{"agent_id":"agent-a"}}"#,
        r#"{"action":"session.create","params":{"agent_id":"agent-a","session_id":"session-1"}}"#,
        r#"{"action":"checkpoint.create","params":{"agent_id":"agent-a","session_id":"session-1","checkpoint_id":"clean"}}"#,
        r#"{"action":"session.rollback","params":{"agent_id":"agent-a","session_id":"session-1","checkpoint_id":"clean"}}"#,
    ] {
        let (code, json) = curl(Some(&token), body);
        assert_eq!(code, "200", "{body}: {json}");
        assert!(json.contains("\"result\""), "{json}");
        let (code, json) = curl(None, body);
        assert_eq!(code, "401", "{body} without the token: {json}");
        let (code, _) = curl(Some(&"f".repeat(64)), body);
        assert_eq!(code, "401", "{body} with another token");
    }
    drop(_gw);

    // A stop with a run still going: in order, in time, exit 0.
    ctl(&c, &["start", "a", "s", "--", "sleep", "600"]);
    let (code, took) = c.stop(30);
    let logs = c.logs();
    println!("podman stop: exit {code} in {took:?}");
    assert_eq!(code, 0, "{logs}");
    // The run ended first (an observed one's evidence closed while its
    // session's context lives), then what is left of the sessions.
    assert!(logs.contains("runs ended runs=1"), "{logs}");
    assert!(logs.contains("sessions' processes killed"), "{logs}");
    assert!(logs.contains("store unmounted"), "{logs}");
    assert!(!logs.contains("did not stop in time"), "{logs}");

    // The device on the host: a whole store, no operation half done.
    on_host(&dev.dev, |m| {
        let root = m.join("allox");
        let pending = Index::open(&root.join("state/index.redb"))
            .expect("open the index")
            .pending()
            .expect("read the journal");
        assert!(
            pending.is_empty(),
            "incomplete journal entries: {pending:?}"
        );
        assert!(root
            .join("agents/a/workspace/sessions/s/checkpoints/c1")
            .is_dir());
        assert!(root
            .join("agents/agent-a/workspace/sessions/session-1/checkpoints/clean")
            .is_dir());
    });
    drop(c);

    // A new container on the same device (no --format-blank) sees it all.
    let c = Container::start(&Spec {
        name: "allox-test-serve-2",
        store: Some(&dev.dev),
        run_dir: &run_dir,
        env: &[],
        args: &[],
    });
    c.wait_ready(READY);
    assert!(!c.logs().contains("formatting"), "{}", c.logs());
    let agents = ctl(&c, &["--json", "agent", "list"]);
    assert!(
        agents.contains("\"a\"") && agents.contains("\"agent-a\""),
        "{agents}"
    );
    assert_eq!(ctl(&c, &["exec", "a", "s", "--", "cat", "f"]), "one\n");
    let cks = ctl(&c, &["checkpoint", "list", "agent-a", "session-1"]);
    assert!(cks.contains("clean"), "{cks}");
    ctl(&c, &["check"]);
    assert_eq!(c.stop(30).0, 0, "{}", c.logs());
}

#[test]
fn a_supervisor_killed_mid_checkpoint_is_restarted_and_the_store_recovers() {
    let test = "container::a_supervisor_killed_mid_checkpoint_is_restarted_and_the_store_recovers";
    if !container::require(test) {
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let dev = LoopDev::blank(dir.path(), "store.img", 1024);
    let c = Container::start(&Spec {
        name: "allox-test-failpoint",
        store: Some(&dev.dev),
        run_dir: &dir.path().join("run"),
        // The first supervisor kills itself after the snapshot of its
        // first checkpoint.create, before the journal's end.
        env: &[("ALLOX_FAILPOINTS", "checkpoint_create.after_snapshot")],
        args: &["--format-blank"],
    });
    c.wait_ready(READY);
    ctl(&c, &["agent", "create", "a"]);
    ctl(&c, &["session", "create", "a", "s"]);
    ctl(&c, &["exec", "a", "s", "--", "sh", "-c", "echo kept > f"]);
    let info = |c: &Container| -> u64 {
        let v: serde_json::Value =
            serde_json::from_str(&ctl(c, &["--json", "info"])).expect("info as JSON");
        v["supervisor_pid"]
            .as_u64()
            .unwrap_or_else(|| panic!("{v}"))
    };
    let before = info(&c);
    ctl_fails(&c, &["checkpoint", "create", "a", "s", "c1"]);
    // PID 1 restarts it; the new one recovers the store from the journal.
    c.wait_ready(READY);
    let after = info(&c);
    assert_ne!(before, after, "not restarted:\n{}", c.logs());
    let logs = c.logs();
    assert!(
        logs.contains("arming failpoints checkpoint_create.after_snapshot"),
        "{logs}"
    );
    assert!(logs.contains("restarting the supervisor"), "{logs}");
    assert_eq!(ctl(&c, &["exec", "a", "s", "--", "cat", "f"]), "kept\n");
    let v: serde_json::Value =
        serde_json::from_str(&ctl(&c, &["--json", "checkpoint", "list", "a", "s"])).unwrap();
    let ids: Vec<&str> = v["checkpoints"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .filter_map(|c| c["checkpoint_id"].as_str())
        .collect();
    assert!(
        ids.is_empty() || ids == ["c1"],
        "half-made checkpoint: {ids:?}"
    );
    // The index matches the subvolumes; a new checkpoint works.
    ctl(&c, &["check"]);
    ctl(&c, &["checkpoint", "create", "a", "s", "c2"]);
    assert_eq!(c.stop(30).0, 0, "{}", c.logs());
}

#[test]
fn stores_it_must_not_use_are_refused_with_their_message_and_left_untouched() {
    let test =
        "container::stores_it_must_not_use_are_refused_with_their_message_and_left_untouched";
    if !container::require(test) {
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let run_dir = dir.path().join("run");
    let refused = |name: &str, dev: Option<&Path>, args: &[&str]| -> String {
        let c = Container::start(&Spec {
            name,
            store: dev,
            run_dir: &run_dir,
            env: &[],
            args,
        });
        let code = c.wait_exit(Duration::from_secs(30));
        let logs = c.logs();
        assert_eq!(code, 1, "{logs}");
        logs
    };
    // An ext4 filesystem, even with --format-blank.
    let ext4 = LoopDev::blank(dir.path(), "ext4.img", 64);
    let st = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&ext4.dev)
        .status()
        .unwrap();
    assert!(st.success());
    let before = ext4.digest();
    let logs = refused("allox-test-ext4", Some(&ext4.dev), &["--format-blank"]);
    assert!(
        logs.contains(
            "the store device /dev/allox-store holds no Btrfs filesystem (and is not blank); refusing to touch it"
        ),
        "{logs}"
    );
    assert_eq!(ext4.digest(), before, "the ext4 device was changed");
    // A blank device without --format-blank.
    let blank = LoopDev::blank(dir.path(), "blank.img", 64);
    let before = blank.digest();
    let logs = refused("allox-test-blank", Some(&blank.dev), &[]);
    assert!(
        logs.contains(
            "the store device /dev/allox-store is blank; pass --format-blank to format it"
        ),
        "{logs}"
    );
    assert_eq!(blank.digest(), before, "the blank device was changed");
    // No device at all.
    let logs = refused("allox-test-nodev", None, &[]);
    assert!(
        logs.contains("the store device /dev/allox-store does not exist"),
        "{logs}"
    );
    // An option the container sets itself, refused before the device is
    // looked at.
    let logs = refused(
        "allox-test-root",
        Some(&blank.dev),
        &["--root", "/elsewhere"],
    );
    assert!(logs.contains("--root is set by the container"), "{logs}");
    assert_eq!(blank.digest(), before);
    // Each said it in one line and nothing else went wrong.
    assert_eq!(logs.lines().count(), 1, "{logs}");
}
