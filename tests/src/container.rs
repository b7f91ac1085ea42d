//! The container image under podman: built by `rootfs-builder oci` from
//! this workspace's binaries, loaded with `podman load`, and run as a
//! container whose PID 1 is `allox-init container`, on a loop device as
//! its store, with its control socket in a host directory.
//!
//! podman runs it with runc: Debian's crun 1.8 refuses a hybrid cgroup
//! host whose unified hierarchy offers any controller ("cgroups in hybrid
//! mode not supported"), and this host's offers hugetlb. On such a host the
//! container gets a cgroup2 subtree of the host's as `--cgroup-root`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::workspace_bin;

/// The runtime podman is told to use (see the module's doc).
pub const RUNTIME: &str = "runc";
/// The tag the tests load the image under.
pub const TAG: &str = "localhost/allox:test";

/// What this machine lacks for the container tests, if anything.
pub fn missing() -> Option<String> {
    let mut miss: Vec<String> = crate::missing().into_iter().collect();
    for (cmd, pkg) in [
        ("podman", "podman"),
        (RUNTIME, "runc"),
        ("skopeo", "skopeo"),
        ("losetup", "mount"),
        ("strip", "binutils"),
        ("mkfs.ext4", "e2fsprogs"),
    ] {
        if crate::which(cmd).is_none() {
            miss.push(format!("{cmd} (apt-get install {pkg})"));
        }
    }
    if crate::cgroup2_mount().is_none() {
        miss.push("a cgroup2 mount".into());
    }
    (!miss.is_empty()).then(|| miss.join(", "))
}

/// True when the test can run; otherwise fails it or says it is skipped.
pub fn require(test: &str) -> bool {
    crate::needs(test, missing())
}

/// A built image: its layout directory, archive and digest.
#[derive(Debug, Clone)]
pub struct Image {
    pub layout: PathBuf,
    pub archive: PathBuf,
    /// `sha256:…` as `rootfs-builder oci` printed it.
    pub digest: String,
    /// Everything it printed.
    pub stdout: String,
}

/// `rootfs-builder`, built now if needed.
pub fn rootfs_builder() -> PathBuf {
    inputs().2.clone()
}

/// Stripped copies of this workspace's `allox-init` and `alloxctl` (the
/// image's inputs), made once per test process.
fn inputs() -> &'static (PathBuf, PathBuf, PathBuf) {
    static INPUTS: OnceLock<(PathBuf, PathBuf, PathBuf)> = OnceLock::new();
    INPUTS.get_or_init(|| {
        let init = workspace_bin("allox-init");
        let ctl = workspace_bin("alloxctl");
        let st = crate::cargo_command()
            .args(["build", "--quiet", "-p", "allox-rootfs-builder"])
            .status()
            .expect("run cargo");
        assert!(st.success(), "cannot build rootfs-builder");
        let dir = crate::artifacts_dir().join("container-inputs");
        std::fs::create_dir_all(&dir).unwrap();
        for (src, name) in [(&init, "allox-init"), (&ctl, "alloxctl")] {
            let st = Command::new("strip")
                .arg("-o")
                .arg(dir.join(name))
                .arg(src)
                .status()
                .expect("run strip");
            assert!(st.success(), "strip {}", src.display());
        }
        (
            dir.join("allox-init"),
            dir.join("alloxctl"),
            init.with_file_name("rootfs-builder"),
        )
    })
}

/// Builds the image into `dir` (layout `dir/oci`, archive `dir/oci.tar`).
pub fn build(dir: &Path, tag: &str) -> Image {
    let (init, ctl, builder) = inputs();
    let layout = dir.join("oci");
    let archive = dir.join("oci.tar");
    let out = Command::new(builder)
        .arg("oci")
        .arg("--init")
        .arg(init)
        .arg("--alloxctl")
        .arg(ctl)
        .arg("--out")
        .arg(&layout)
        .arg("--archive")
        .arg(&archive)
        .args(["--tag", tag])
        .env_remove("SOURCE_DATE_EPOCH")
        .output()
        .expect("run rootfs-builder oci");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "rootfs-builder oci failed: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let digest = stdout
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().next())
        .filter(|d| d.starts_with("sha256:") && d.len() == 71)
        .unwrap_or_else(|| panic!("no digest in {stdout:?}"))
        .to_string();
    Image {
        layout,
        archive,
        digest,
        stdout,
    }
}

/// The image built once per test process and loaded into podman as [`TAG`].
pub fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = crate::artifacts_dir().join("container-image");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let img = build(&dir, TAG);
        let out = podman(&["load", "-q", "-i", img.archive.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "podman load: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        img
    })
}

/// `podman ARGS`, its output collected.
pub fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run podman")
}

/// `podman --runtime RUNTIME run` with the limits this process may give
/// ([`ulimits`]) and then `args` (options, the image, its arguments).
pub fn podman_run(args: &[&str]) -> Output {
    let limits = ulimits();
    let mut all = vec!["--runtime", RUNTIME, "run"];
    all.extend(limits.iter().map(String::as_str));
    all.extend(args);
    podman(&all)
}

/// A loop device over a sparse file, detached and removed when dropped.
pub struct LoopDev {
    pub dev: PathBuf,
    pub file: PathBuf,
}

impl LoopDev {
    /// A blank device of `mb` MiB in `dir`, named `name`.
    pub fn blank(dir: &Path, name: &str, mb: u64) -> LoopDev {
        let file = dir.join(name);
        let f = std::fs::File::create(&file).expect("create the device's file");
        f.set_len(mb << 20).expect("size it");
        drop(f);
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&file)
            .output()
            .expect("run losetup");
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        LoopDev { dev, file }
    }

    /// The sha256 of the whole device, to show it untouched.
    pub fn digest(&self) -> String {
        let out = Command::new("sha256sum")
            .arg(&self.dev)
            .output()
            .expect("run sha256sum");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
        let _ = std::fs::remove_file(&self.file);
    }
}

/// The limits this process may give a container: podman's defaults are
/// above what this machine's session allows, and the runtime may not
/// raise them.
pub fn ulimits() -> Vec<String> {
    let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .unwrap_or(65_536)
        .min(65_536);
    let nproc = rustix::process::getrlimit(rustix::process::Resource::Nproc)
        .maximum
        .unwrap_or(32_768)
        .min(32_768);
    vec![
        "--ulimit".into(),
        format!("nofile={nofile}:{nofile}"),
        "--ulimit".into(),
        format!("nproc={nproc}:{nproc}"),
    ]
}

/// A container of the image: `allox-init container` as its PID 1.
pub struct Container {
    pub name: String,
    /// The host directory mounted at the container's `/run/allox`.
    pub run_dir: PathBuf,
    /// The host's cgroup2 directory given as `--cgroup-root`.
    pub cgroup: PathBuf,
}

/// How to start one.
pub struct Spec<'a> {
    pub name: &'a str,
    /// The store device, mounted at `/dev/allox-store`; none: no device.
    pub store: Option<&'a Path>,
    /// The host directory for `/run/allox` (the control socket).
    pub run_dir: &'a Path,
    /// Environment (`-e K=V`).
    pub env: &'a [(&'a str, &'a str)],
    /// `allox-init container` options after `--store`.
    pub args: &'a [&'a str],
}

impl Container {
    /// `podman run -d` of [`image`]: privileged (as in a Kata pod, where
    /// that is the VM's), the host's network, the store at
    /// `/dev/allox-store`, a fresh cgroup2 subtree as `--cgroup-root`.
    pub fn start(spec: &Spec) -> Container {
        image();
        let _ = podman(&["rm", "-f", spec.name]);
        let cg_mount = crate::cgroup2_mount().expect("a cgroup2 mount");
        let cgroup = cg_mount.join(format!("allox-test-{}", spec.name));
        crate::remove_cgroup_tree(&cgroup);
        std::fs::create_dir_all(&cgroup).expect("make the container's cgroup2 directory");
        std::fs::create_dir_all(spec.run_dir).unwrap();
        let mut args: Vec<String> = [
            "--runtime",
            RUNTIME,
            "run",
            "-d",
            "--name",
            spec.name,
            "--privileged",
            "--network",
            "host",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(ulimits());
        args.push("-v".into());
        args.push(format!("{}:/run/allox", spec.run_dir.display()));
        args.push("-v".into());
        args.push(format!("{}:/run/allox-cgroup", cgroup.display()));
        if let Some(dev) = spec.store {
            args.push("-v".into());
            args.push(format!("{}:/dev/allox-store", dev.display()));
        }
        for (k, v) in spec.env {
            args.push("-e".into());
            args.push(format!("{k}={v}"));
        }
        args.push(TAG.into());
        args.extend(
            [
                "--store",
                "/dev/allox-store",
                "--cgroup-root",
                "/run/allox-cgroup",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        args.extend(spec.args.iter().map(|s| s.to_string()));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = podman(&argv);
        assert!(
            out.status.success(),
            "podman run: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Container {
            name: spec.name.to_string(),
            run_dir: spec.run_dir.to_path_buf(),
            cgroup,
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.run_dir.join("ctl.sock")
    }

    /// Waits until the supervisor answers a ping on the socket.
    pub fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let (code, _, _) = crate::alloxctl(&self.socket(), &["ping"]);
            if code == 0 {
                return;
            }
            if let Some(code) = self.exit_code() {
                panic!(
                    "the container ended ({code}) before its supervisor answered:\n{}",
                    self.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no answer on {} in {timeout:?}:\n{}",
                self.socket().display(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its output so far (stdout and stderr).
    pub fn logs(&self) -> String {
        let out = podman(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// The exit status once it has ended.
    pub fn exit_code(&self) -> Option<i32> {
        let out = podman(&[
            "inspect",
            &self.name,
            "--format",
            "{{.State.Status}} {{.State.ExitCode}}",
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text.split_whitespace();
        match (it.next(), it.next()) {
            (Some("exited" | "stopped"), Some(code)) => code.parse().ok(),
            _ => None,
        }
    }

    /// Waits for it to end by itself.
    pub fn wait_exit(&self, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = self.exit_code() {
                return c;
            }
            assert!(
                Instant::now() < deadline,
                "still running after {timeout:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `podman stop -t GRACE`: its exit status and how long the stop took.
    pub fn stop(&self, grace: u64) -> (i32, Duration) {
        let t0 = Instant::now();
        let out = podman(&["stop", "-t", &grace.to_string(), &self.name]);
        let took = t0.elapsed();
        assert!(
            out.status.success(),
            "podman stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (self.exit_code().expect("stopped has a status"), took)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.name]);
        crate::remove_cgroup_tree(&self.cgroup);
    }
}

/// A port on 127.0.0.1 that nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}
