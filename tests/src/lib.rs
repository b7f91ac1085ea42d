//! Fixtures for tests that need the real thing: root, a loop-backed Btrfs
//! filesystem made for the test and removed after it, and the real
//! `allox-init` daemon binary.
//!
//! A test that lacks what it needs calls [`require`], which either fails
//! (when `ALLOX_REQUIRE_PRIVILEGED=1`, as `scripts/test.sh` sets) or prints
//! `SKIPPED <test>: needs <what>` straight to the terminal, uncaptured.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What this machine lacks for privileged tests, if anything.
pub fn missing() -> Option<String> {
    let mut miss = Vec::new();
    if !rustix::process::geteuid().is_root() {
        miss.push("root");
    }
    if which("mkfs.btrfs").is_none() {
        miss.push("mkfs.btrfs (apt-get install btrfs-progs)");
    }
    if !Path::new("/dev/loop-control").exists() {
        miss.push("loop devices (/dev/loop-control)");
    }
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs.contains("btrfs") && !Path::new("/sys/module/btrfs").exists() {
        // Mounting may still load the module; only note it.
        let _ = Command::new("modprobe").arg("btrfs").status();
        let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
        if !fs.contains("btrfs") {
            miss.push("the btrfs kernel module");
        }
    }
    (!miss.is_empty()).then(|| miss.join(", "))
}

/// Returns false (and says so) when the test cannot run here: it needs
/// root, loop devices and Btrfs ([`missing`]).
pub fn require(test: &str) -> bool {
    needs(test, missing())
}

/// The one rule for a test that lacks what it needs (`missing` names it):
/// under `ALLOX_REQUIRE_PRIVILEGED=1` (as `scripts/test.sh` sets) the test
/// fails; otherwise it prints `SKIPPED <test>: needs <what>` past the
/// harness's capture and returns false. True when nothing is missing.
pub fn needs(test: &str, missing: Option<String>) -> bool {
    let Some(what) = missing else {
        watchdog::watch_this_test(test);
        return true;
    };
    if std::env::var("ALLOX_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        panic!("{test} needs {what}, which this machine lacks");
    }
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: needs {what}");
    false
}

pub fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(cmd))
            .find(|c| c.is_file())
    })
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.stdin(Stdio::null()).output()?;
    anyhow::ensure!(
        out.status.success(),
        "{:?} failed: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A Btrfs filesystem on a sparse file, mounted for one test.
/// A tmpfs of `size_mb` MiB mounted on a directory for a test, unmounted
/// (lazily, whatever still holds it) when dropped.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts it on `dir`, which exists; panics naming `what` if the
    /// mount fails.
    pub fn mount(dir: &Path, size_mb: u64, what: &str) -> Tmpfs {
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size_mb}m"),
                "allox-test",
            ])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(st.success(), "{what}: mount a tmpfs on {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

pub struct BtrfsFs {
    dir: tempfile::TempDir,
    mnt: PathBuf,
}

impl BtrfsFs {
    /// Makes and mounts a filesystem of `size_mb` MiB (at least 256).
    pub fn new(size_mb: u64) -> anyhow::Result<BtrfsFs> {
        let dir = tempfile::Builder::new()
            .prefix("allox-btrfs-")
            .tempdir_in("/var/tmp")?;
        let img = dir.path().join("fs.img");
        let f = std::fs::File::create(&img)?;
        f.set_len(size_mb.max(256) << 20)?;
        drop(f);
        run(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&img))?;
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt)?;
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mnt))?;
        Ok(BtrfsFs { dir, mnt })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// A scratch directory beside the mount, outside the filesystem.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// The filesystem's image file (in the scratch directory), every byte
    /// the store wrote to its disk.
    pub fn image(&self) -> PathBuf {
        self.dir.path().join("fs.img")
    }
}

impl Drop for BtrfsFs {
    fn drop(&mut self) {
        for _ in 0..50 {
            let ok = Command::new("umount")
                .arg(&self.mnt)
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

/// How many subvolumes of the Btrfs filesystem holding `path` are
/// deleted but not yet dropped (`btrfs subvolume list -d`).
pub fn deleted_subvolumes(path: &Path) -> usize {
    let out = Command::new("btrfs")
        .args(["subvolume", "list", "-d"])
        .arg(path)
        .output()
        .expect("run btrfs subvolume list");
    assert!(
        out.status.success(),
        "btrfs subvolume list -d {}: {out:?}",
        path.display()
    );
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// Waits up to `limit` for every deleted subvolume of the filesystem
/// holding `path` to be dropped; whether they were.
pub fn deleted_subvolumes_dropped(path: &Path, limit: Duration) -> bool {
    let t = std::time::Instant::now();
    loop {
        if deleted_subvolumes(path) == 0 {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Where tests keep what a person may want to look at afterwards
/// (`target/test-artifacts/`), made if needed.
pub fn artifacts_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<triple>/<profile>/deps/<test>: the first `target` above.
    let target = exe
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "target"))
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    let dir = target.join("test-artifacts");
    std::fs::create_dir_all(&dir).expect("make target/test-artifacts");
    dir
}

/// `cargo`, as the test was built by, for a build the test needs, in the
/// environment the test command's own cargo runs in: without the
/// `RUSTC_BOOTSTRAP` that scripts/test-runner.sh sets for the test binary
/// alone, and without the variables cargo sets for the test it runs
/// ([`is_cargo_run_variable`]). A build script that names a variable
/// (`rerun-if-env-changed`) is run again, and its crate and every crate
/// above it rebuilt, whenever the variable differs from the last build's
/// (ring names `CARGO_MANIFEST_DIR` and `CARGO_PKG_NAME`): a build from a
/// test that saw them rebuilt ring, rustls, the network crate, the
/// supervisor and allox-init, and the test command's next cargo rebuilt
/// them again, 13–18 s each time.
pub fn cargo_command() -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    if std::env::var_os(RUNNER_SET_BOOTSTRAP).is_some() {
        cmd.env_remove("RUSTC_BOOTSTRAP")
            .env_remove(RUNNER_SET_BOOTSTRAP);
    }
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(is_cargo_run_variable) {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Whether `name` is one of the variables cargo sets for a program it
/// runs (`cargo test`, `cargo run`): the package's and the target's
/// (`CARGO_PKG_*`, `CARGO_MANIFEST_*`, `CARGO_CRATE_NAME`, …), not the
/// ones that configure cargo itself (`CARGO`, `CARGO_HOME`,
/// `CARGO_TARGET_DIR`, `CARGO_TARGET_<TRIPLE>_RUNNER`, `CARGO_TERM_*`).
fn is_cargo_run_variable(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_MANIFEST_")
        || matches!(
            name,
            "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
                | "OUT_DIR"
        )
}

/// Set by scripts/test-runner.sh when the `RUSTC_BOOTSTRAP` of the test
/// binary is its own (the environment had none).
const RUNNER_SET_BOOTSTRAP: &str = "ALLOX_TEST_RUNNER_BOOTSTRAP";

/// Path of a binary of this workspace, brought up to date first (once per
/// test process), so a test never drives a stale daemon.
pub fn workspace_bin(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test> or target/<profile>/<bin> → target/<profile>/<name>
    let mut dir = exe.parent().expect("binary has a directory").to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let built = BUILT.get_or_init(|| {
        let profile = dir.file_name().and_then(|s| s.to_str()).unwrap_or("debug");
        let mut cmd = cargo_command();
        cmd.args([
            "build",
            "--quiet",
            "-p",
            "allox-init",
            "-p",
            "allox-ctl",
            "-p",
            "allox-effects",
        ]);
        if profile == "release" {
            cmd.arg("--release");
        }
        match cmd.status() {
            Ok(s) if s.success() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    if let Err(e) = built {
        panic!("cannot build the workspace binaries ({e}); run `cargo build --workspace`");
    }
    // Another build of the daemon (one without plugins: scripts/test.sh
    // runs the core tests on it too).
    if name == "allox-init" {
        if let Some(p) = std::env::var_os(INIT_BIN_ENV) {
            return PathBuf::from(p);
        }
    }
    dir.join(name)
}

/// Names an `allox-init` the tests run instead of the workspace's.
pub const INIT_BIN_ENV: &str = "ALLOX_INIT_BIN";

/// Where `scripts/test.sh` puts the `allox-init` built without plugins
/// (`--no-default-features`), relative to the workspace.
pub const NO_PLUGINS_INIT: &str = "target/no-plugins/allox-init";

/// How long a daemon may take to stop after SIGTERM (it stops in well
/// under a second: its answers flushed, its store synced), unless
/// [`STOP_LIMIT_ENV`] gives other seconds.
pub const STOP_LIMIT: Duration = Duration::from_secs(60);
pub const STOP_LIMIT_ENV: &str = "ALLOX_TEST_STOP_SECS";

fn stop_limit() -> Duration {
    watchdog::secs_from_env(STOP_LIMIT_ENV, STOP_LIMIT)
}

/// `child`'s exit status once it has ended, if that is within `limit`
/// (waited for on its pidfd); `None` if it still runs.
pub fn wait_for_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    if let Ok(Some(st)) = child.try_wait() {
        return Some(st);
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32)?;
    let Ok(fd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
        // No pidfd to wait on with a bound (descriptors run out): as before.
        return child.wait().ok();
    };
    let until = Instant::now() + limit;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let t = Timespec::try_from(left).unwrap_or(Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        });
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        match poll(&mut fds, Some(&t)) {
            Ok(n) if n > 0 => return child.wait().ok(),
            Err(rustix::io::Errno::INTR) => continue,
            _ => return None,
        }
    }
}

/// The stop signal of the `i`th start in a test of signals at any moment
/// of a start: SIGINT for one in four once the process said it is
/// ready (before that a signal does what the process inherited, and a
/// shell's background job inherits SIGINT ignored), SIGTERM otherwise.
pub fn stop_signal_for(i: u32) -> rustix::process::Signal {
    if i % 4 == 3 {
        rustix::process::Signal::INT
    } else {
        rustix::process::Signal::TERM
    }
}

/// Sends `signal` to `child` (`what`, for the messages) and checks that
/// it ends within 20 s, cleanly or by that signal itself (one that came
/// before its handlers); one that runs on is shown, killed, and fails
/// the test.
pub fn signal_stops(child: &mut Child, signal: rustix::process::Signal, what: &str) {
    use std::os::unix::process::ExitStatusExt;
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("a pid");
    rustix::process::kill_process(pid, signal).expect("kill");
    let Some(st) = wait_for_exit(child, Duration::from_secs(20)) else {
        let state = watchdog::describe_process(pid.as_raw_nonzero().get());
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what} did not stop within 20 s of {signal:?}:\n{state}");
    };
    assert!(
        st.success() || st.signal() == Some(signal.as_raw()),
        "{what}: {st:?} after {signal:?}"
    );
}

/// The real daemon, `allox-init supervise`, on a store root.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub root: PathBuf,
    /// The cgroup subtree given to it when the test named none (removed
    /// at the end if nothing runs in it).
    pub cgroup: Option<PathBuf>,
}

/// A cgroup subtree of its own for a daemon on `root` when `args` name
/// none and the daemon runs processes: a daemon owns its subtree, so
/// tests at once never share one (nor the host's default). The same for
/// every daemon started on one root, so a restarted daemon finds its runs.
fn own_cgroup(root: &Path, args: &[&str]) -> Option<PathBuf> {
    if args
        .iter()
        .any(|a| *a == "--cgroup-root" || *a == "--no-processes")
    {
        return None;
    }
    let mut h: u64 = 0xcbf29ce484222325;
    for b in root.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100000001b3);
    }
    let dir = cgroup2_mount()?.join(format!("allox-test-{h:016x}"));
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir)
}

/// `exe supervise` on the store `root`, listening on `socket`, with
/// `cgroup` as its cgroup root if given, its standard input closed: the
/// command every test's daemon starts from.
pub fn supervise_command(exe: &Path, root: &Path, socket: &Path, cgroup: Option<&Path>) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg("supervise")
        .arg("--root")
        .arg(root)
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .stdin(Stdio::null());
    if let Some(c) = cgroup {
        cmd.arg("--cgroup-root").arg(c);
    }
    cmd
}

impl Daemon {
    /// Starts the daemon with extra environment (e.g. `ALLOX_FAILPOINTS`)
    /// and extra arguments, and waits until its socket answers.
    pub fn start(root: &Path, socket: &Path, env: &[(&str, &str)], args: &[&str]) -> Daemon {
        Daemon::start_logging(root, socket, env, args, None)
    }

    /// [`Daemon::start`] with its standard error (its log) into `log`.
    pub fn start_logging(
        root: &Path,
        socket: &Path,
        env: &[(&str, &str)],
        args: &[&str],
        log: Option<std::fs::File>,
    ) -> Daemon {
        Daemon::start_exe(&workspace_bin("allox-init"), root, socket, env, args, log)
    }

    /// [`Daemon::start_logging`] of the `allox-init` at `exe` (another
    /// build of it).
    pub fn start_exe(
        exe: &Path,
        root: &Path,
        socket: &Path,
        env: &[(&str, &str)],
        args: &[&str],
        log: Option<std::fs::File>,
    ) -> Daemon {
        let cgroup = own_cgroup(root, args);
        let mut cmd = supervise_command(exe, root, socket, cgroup.as_deref());
        cmd.args(args).env("ALLOX_LOG", "warn");
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some(f) = log {
            cmd.stderr(f);
        }
        let mut child = cmd.spawn().expect("spawn allox-init");
        let t0 = Instant::now();
        loop {
            if UnixStream::connect(socket).is_ok() {
                break;
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!("allox-init exited before serving: {st}");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "daemon did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon {
            child,
            socket: socket.to_path_buf(),
            root: root.to_path_buf(),
            cgroup,
        }
    }

    /// On a new Btrfs store of 512 MiB, its socket in the scratch
    /// directory beside the mount; `None` (the test skipped) when this
    /// machine lacks what it needs ([`require`]).
    pub fn on_new_store(test: &str, args: &[&str]) -> Option<(BtrfsFs, Daemon)> {
        if !require(test) {
            return None;
        }
        std::fs::create_dir_all("/var/tmp").ok();
        let fs = BtrfsFs::new(512).expect("make btrfs");
        let root = fs.path().join("store");
        std::fs::create_dir(&root).unwrap();
        let sock = fs.scratch().join("ctl.sock");
        let d = Daemon::start(&root, &sock, &[], args);
        Some((fs, d))
    }

    pub fn client(&self) -> allox_ctl::client::Client {
        allox_ctl::client::Client::connect(&self.socket).expect("connect to daemon")
    }

    /// Waits for the daemon to die by itself (a failpoint) and returns how.
    pub fn wait_killed(mut self) -> std::process::ExitStatus {
        let st = self.child.wait().expect("wait daemon");
        let _ = std::fs::remove_file(&self.socket);
        std::mem::forget(self);
        st
    }

    /// SIGTERM and wait.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.term()
    }

    /// SIGTERM and wait, keeping the handle.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.term()
    }

    /// SIGTERM, and the daemon's end awaited for [`STOP_LIMIT`]; one that
    /// has not stopped by then is shown ([`watchdog::describe_process`]),
    /// killed, and the test fails.
    fn term(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id() as i32;
        if let Some(p) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
        }
        if let Some(st) = wait_for_exit(&mut self.child, stop_limit()) {
            return st;
        }
        let what = watchdog::describe_tree(pid);
        let _ = self.child.kill();
        let st = self.child.wait();
        let msg = format!(
            "the daemon (pid {pid}) did not stop within {} s of SIGTERM; killed ({st:?}); what it was doing:\n{what}",
            stop_limit().as_secs()
        );
        if std::thread::panicking() {
            let _ = writeln!(std::io::stderr(), "{msg}");
        } else {
            panic!("{msg}");
        }
        self.child.wait().expect("wait daemon")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.term();
        }
        // Runs left for a successor stay; an empty subtree goes.
        if let Some(c) = &self.cgroup {
            let ev = std::fs::read_to_string(c.join("cgroup.events")).unwrap_or_default();
            if !ev.contains("populated 1") {
                remove_cgroup_tree(c);
            }
        }
    }
}

/// The gateway's token for the daemon at `socket`, as a script gets it
/// (`alloxctl token`).
pub fn gateway_token(socket: &Path) -> String {
    let out = Command::new(workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(socket)
        .arg("token")
        .output()
        .expect("run alloxctl token");
    assert!(out.status.success(), "alloxctl token: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `alloxctl gateway` in front of a daemon's socket, on a free loopback
/// port unless `args` give `--listen`.
pub struct Gateway {
    pub child: Child,
    pub addr: std::net::SocketAddr,
    /// `--metrics-listen`'s address, when `args` gave one.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Everything it wrote to stderr (its first lines, then more as it runs).
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
    /// Notified each time a line is added to `log`.
    logged: std::sync::Arc<std::sync::Condvar>,
}

impl Gateway {
    /// Starts it and waits until it says where it listens.
    pub fn start(socket: &Path, args: &[&str]) -> Gateway {
        use std::io::BufRead;
        let mut cmd = Command::new(workspace_bin("alloxctl"));
        cmd.arg("--socket").arg(socket).arg("gateway");
        if !args.contains(&"--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        let mut child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn alloxctl gateway");
        let mut lines = std::io::BufReader::new(child.stderr.take().expect("piped"));
        let mut first = String::new();
        let _ = lines.read_line(&mut first);
        let addr = first
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|a| a.parse().ok());
        let Some(addr) = addr else {
            let _ = child.kill();
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut lines, &mut rest);
            panic!("alloxctl gateway did not start: {first}{rest}");
        };
        // The second line names the token file; a third, the metrics
        // address.
        let _ = lines.read_line(&mut first);
        let mut metrics_addr = None;
        if args.contains(&"--metrics-listen") {
            let mut line = String::new();
            let _ = lines.read_line(&mut line);
            metrics_addr = line
                .split("http://")
                .nth(1)
                .and_then(|rest| rest.split('/').next())
                .and_then(|a| a.parse().ok());
            assert!(metrics_addr.is_some(), "no metrics address in {line:?}");
            first.push_str(&line);
        }
        let log = std::sync::Arc::new(std::sync::Mutex::new(first));
        let logged = std::sync::Arc::new(std::sync::Condvar::new());
        let (sink, told) = (log.clone(), logged.clone());
        std::thread::spawn(move || {
            for line in lines.lines().map_while(Result::ok) {
                let mut l = sink.lock().unwrap_or_else(|p| p.into_inner());
                l.push_str(&line);
                l.push('\n');
                told.notify_all();
            }
        });
        Gateway {
            child,
            addr,
            metrics_addr,
            log,
            logged,
        }
    }

    /// Its log once `done` says it holds what is awaited (the gateway
    /// writes a request's line before it answers, but the line reaches
    /// this process's reader a moment later); after `limit` without it,
    /// the log as it is, for the caller's assertions to show.
    pub fn log_once(&self, done: impl Fn(&str) -> bool, limit: Duration) -> String {
        let l = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let (l, _) = self
            .logged
            .wait_timeout_while(l, limit, |l| !done(l))
            .unwrap_or_else(|p| p.into_inner());
        l.clone()
    }

    /// `http://ADDR/v1/rpc`.
    pub fn url(&self) -> String {
        format!("http://{}/v1/rpc", self.addr)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `n` small files in a directory tree under `dir`.
pub fn populate(dir: &Path, n: usize) -> std::io::Result<()> {
    for i in 0..n {
        let sub = dir.join(format!("d{:03}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir_all(&sub)?;
        }
        std::fs::write(sub.join(format!("f{i}")), format!("file {i}\n"))?;
    }
    Ok(())
}

/// A byte-exact description of a tree: every path with its type, mode,
/// size and content hash, sorted.
pub fn tree_digest(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, p: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(p) else { return };
        for e in rd.flatten() {
            let path = e.path();
            let rel = path
                .strip_prefix(base)
                .unwrap_or(&path)
                .display()
                .to_string();
            let Ok(md) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            use std::os::unix::fs::PermissionsExt;
            let mode = md.permissions().mode();
            if md.is_dir() {
                out.push(format!("d {rel} {mode:o}"));
                walk(base, &path, out);
            } else if md.file_type().is_symlink() {
                let t = std::fs::read_link(&path).unwrap_or_default();
                out.push(format!("l {rel} -> {}", t.display()));
            } else {
                let data = std::fs::read(&path).unwrap_or_default();
                let mut h: u64 = 0xcbf29ce484222325;
                for b in &data {
                    h = (h ^ u64::from(*b)).wrapping_mul(0x100000001b3);
                }
                out.push(format!("f {rel} {mode:o} {} {h:016x}", data.len()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// The cgroup2 mount of this host, if any.
pub fn cgroup2_mount() -> Option<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.subtree_control").exists())
}

/// A `process.start` of `argv` in session `a`/`s` that waits for the end,
/// with empty stdin, no extra environment and no timeout.
pub fn process_start(a: &str, s: &str, argv: &[&str]) -> allox_protocol::ProcessStart {
    allox_protocol::ProcessStart {
        agent_id: a.into(),
        session_id: s.into(),
        argv: argv.iter().map(|x| x.to_string()).collect(),
        env: Default::default(),
        cwd: None,
        stdin: Some(Default::default()),
        timeout_ms: None,
        wait: true,
        stream: false,
        pty: None,
        trace: None,
        on_disconnect: Default::default(),
        recovery: None,
    }
}

/// One request to the daemon over a new connection; a broken transport
/// fails the test.
pub fn call(
    d: &ProcDaemon,
    r: allox_protocol::Request,
) -> Result<allox_protocol::Response, allox_protocol::ErrorBody> {
    d.daemon.client().call(r).expect("transport")
}

/// Makes each (agent, session) pair, the agents as needed.
pub fn make_sessions(d: &ProcDaemon, pairs: &[(&str, &str)]) {
    use allox_protocol::{AgentCreate, Request, SessionCreate};
    let mut c = d.daemon.client();
    for (a, s) in pairs {
        let _ = c.call(Request::AgentCreate(AgentCreate::new(*a)));
        c.call(Request::SessionCreate(SessionCreate::new(*a, *s)))
            .expect("transport")
            .expect("session.create");
    }
}

/// A daemon with process support, on its own Btrfs store and under its own
/// cgroup (so tests running at once never touch each other's processes).
pub struct ProcDaemon {
    pub daemon: Daemon,
    pub cgroup: PathBuf,
    pub fs: BtrfsFs,
    /// Where its log goes (appended to across restarts), and the
    /// environment it was started with, when a test asked for them.
    pub log: Option<(PathBuf, Vec<(String, String)>)>,
}

impl ProcDaemon {
    pub fn start(name: &str, extra: &[&str]) -> ProcDaemon {
        ProcDaemon::start_on(name, extra, 1024)
    }

    /// [`ProcDaemon::start`] on a store of `size_mb` MiB.
    pub fn start_on(name: &str, extra: &[&str], size_mb: u64) -> ProcDaemon {
        Self::start_full(name, &[], extra, size_mb, None)
    }

    /// Starts it with extra environment (e.g. `ALLOX_FAILPOINTS`).
    pub fn start_with_env(name: &str, env: &[(&str, &str)], extra: &[&str]) -> ProcDaemon {
        Self::start_full(name, env, extra, 1024, None)
    }

    /// Starts the `allox-init` at `exe` (another build of it).
    pub fn start_exe(name: &str, exe: &Path, extra: &[&str]) -> ProcDaemon {
        Self::start_full(name, &[], extra, 1024, Some(exe))
    }

    /// Starts it with extra environment, its log (standard error) going
    /// to `log`, as every restart's will.
    pub fn start_logged(
        name: &str,
        env: &[(&str, &str)],
        extra: &[&str],
        log: &Path,
    ) -> ProcDaemon {
        let mut d = Self::start_full_logged(name, env, extra, 1024, None, Some(log));
        d.log = Some((
            log.to_path_buf(),
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ));
        d
    }

    fn start_full(
        name: &str,
        env: &[(&str, &str)],
        extra: &[&str],
        size_mb: u64,
        exe: Option<&Path>,
    ) -> ProcDaemon {
        Self::start_full_logged(name, env, extra, size_mb, exe, None)
    }

    fn append_to(log: &Path) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("open the daemon's log")
    }

    fn start_full_logged(
        name: &str,
        env: &[(&str, &str)],
        extra: &[&str],
        size_mb: u64,
        exe: Option<&Path>,
        log: Option<&Path>,
    ) -> ProcDaemon {
        std::fs::create_dir_all("/var/tmp").ok();
        let fs = BtrfsFs::new(size_mb).expect("make btrfs");
        let root = fs.path().join("store");
        std::fs::create_dir(&root).unwrap();
        let mount = cgroup2_mount().expect("cgroup2 mount");
        let cgroup = mount.join(format!("allox-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&cgroup).unwrap();
        let stage = fs.scratch().join("stage");
        let sock = fs.scratch().join("ctl.sock");
        let mut args = vec![
            "--cgroup-root".to_string(),
            cgroup.display().to_string(),
            "--sandbox-stage".to_string(),
            stage.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let log = log.map(Self::append_to);
        let exe = exe
            .map(Path::to_path_buf)
            .unwrap_or_else(|| workspace_bin("allox-init"));
        let daemon = Daemon::start_exe(&exe, &root, &sock, env, &args, log);
        ProcDaemon {
            daemon,
            cgroup,
            fs,
            log: None,
        }
    }

    /// Restarts the daemon process (its runs keep going).
    pub fn restart(&mut self, extra: &[&str]) {
        self.restart_after(extra, false);
    }

    /// The daemon killed outright (`SIGKILL`: a crash), then started again
    /// as [`ProcDaemon::restart`] does.
    pub fn restart_after_crash(&mut self, extra: &[&str]) {
        self.restart_after(extra, true);
    }

    fn restart_after(&mut self, extra: &[&str], crash: bool) {
        let root = self.daemon.root.clone();
        let sock = self.daemon.socket.clone();
        let stage = self.fs.scratch().join("stage");
        let mut args = vec![
            "--cgroup-root".to_string(),
            self.cgroup.display().to_string(),
            "--sandbox-stage".to_string(),
            stage.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        if crash {
            let _ = self.daemon.child.kill();
            let _ = self.daemon.child.wait();
            let _ = std::fs::remove_file(&self.daemon.socket);
        } else {
            self.daemon.terminate();
        }
        self.daemon = match &self.log {
            Some((log, env)) => {
                let env: Vec<(&str, &str)> =
                    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                Daemon::start_logging(&root, &sock, &env, &args, Some(Self::append_to(log)))
            }
            None => Daemon::start(&root, &sock, &[], &args),
        };
    }
}

impl Drop for ProcDaemon {
    fn drop(&mut self) {
        // Kill whatever is left, then remove the test's cgroups.
        let _ = std::fs::write(self.cgroup.join("cgroup.kill"), "1");
        for _ in 0..100 {
            let ev = std::fs::read_to_string(self.cgroup.join("cgroup.events")).unwrap_or_default();
            if !ev.contains("populated 1") {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        remove_cgroup_tree(&self.cgroup);
    }
}
/// Removes a cgroup and every cgroup below it, deepest first (they must
/// be empty of processes).
pub fn remove_cgroup_tree(p: &Path) {
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            remove_cgroup_tree(&e.path());
        }
    }
    let _ = std::fs::remove_dir(p);
}

pub mod container;
pub mod http;
pub mod sandbox_api_raw;
pub mod vm;
pub mod watchdog;

/// Fills the filesystem `dir` is on, as a session's own files would:
/// 8 MiB files, then 4 KiB ones, until a write is refused (at most 200
/// big ones: a disk that never fills fails the test). The files written
/// (and the one refused), to be removed to free the space again.
pub fn fill_disk(dir: &Path) -> Vec<PathBuf> {
    let big = vec![7u8; 8 << 20];
    let mut written = Vec::new();
    loop {
        let f = dir.join(format!("fill{}", written.len()));
        let full = std::fs::write(&f, &big).is_err();
        written.push(f);
        if full {
            break;
        }
        assert!(
            written.len() < 200,
            "{}: the disk never filled",
            dir.display()
        );
    }
    for j in 0..100_000 {
        let f = dir.join(format!("small{j}"));
        let full = std::fs::write(&f, [1u8; 4096]).is_err();
        written.push(f);
        if full {
            break;
        }
    }
    written
}

/// An HTTP server on the host's loopback answering each request with
/// `hello <path>` and closing; its address, and how many connections it
/// has accepted.
pub fn hello_server() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = l.local_addr().expect("its address");
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).to_string();
                let path = head.split(' ').nth(1).unwrap_or("").to_string();
                let body = format!("hello {path}\n");
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    (addr, seen)
}

/// The sha256 (hex) of the file at `p`, as `sha256sum` prints it.
pub fn sha256sum(p: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(p)
        .output()
        .expect("run sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("sha256sum {}: no hash", p.display()))
        .to_string()
}

/// `--plugin system-effects` with the workspace's observer and verifier
/// pinned by their sha256 (what a release build fixes at build time).
pub fn effects_plugin_args() -> Vec<String> {
    let exe = workspace_bin("allox-observe");
    let vexe = workspace_bin("allox-system-effects-verify");
    let rexe = workspace_bin("allox-system-effects-recover");
    vec![
        "--plugin".into(),
        "system-effects".into(),
        "--system-effects-observer".into(),
        exe.display().to_string(),
        "--system-effects-observer-sha256".into(),
        sha256sum(&exe),
        "--system-effects-verifier".into(),
        vexe.display().to_string(),
        "--system-effects-verifier-sha256".into(),
        sha256sum(&vexe),
        "--system-effects-recover".into(),
        rexe.display().to_string(),
        "--system-effects-recover-sha256".into(),
        sha256sum(&rexe),
    ]
}

/// `alloxctl --socket SOCKET ARGS`: its exit status, stdout (bytes) and
/// stderr.
pub fn alloxctl(socket: &Path, args: &[&str]) -> (i32, Vec<u8>, String) {
    let out = std::process::Command::new(workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run alloxctl");
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `alloxctl --socket SOCKET ARGS` left running (a `--follow` or a
/// `watch`), and its stdout's lines. Should nothing come, it is killed
/// after 30 s, so reading ends (and the test fails) instead of hanging.
pub fn alloxctl_following(
    socket: &Path,
    args: &[&str],
) -> (
    std::process::Child,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run alloxctl");
    let pid = child.id().to_string();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(30));
        let _ = std::process::Command::new("kill").arg(&pid).status();
    });
    let lines = std::io::BufReader::new(child.stdout.take().expect("its stdout")).lines();
    (child, lines)
}

/// Headless Chromium from Debian (`chromium`); `test` names who needs it.
pub fn chromium(test: &str) -> PathBuf {
    which("chromium")
        .or_else(|| which("chromium-browser"))
        .unwrap_or_else(|| panic!("{test} needs Debian's chromium (scripts/deps.sh installs it)"))
}

/// Runs headless Chromium with `args`, its profile in `profile`. Nothing
/// leaves the machine: no name is resolved but those below `localhost`
/// (which Chromium itself takes for the loopback), and every request but
/// those to 127.0.0.1 and them goes to a proxy on a closed port: the
/// loopback is all a page can reach.
pub fn headless(test: &str, args: &[&str], profile: &Path) -> std::process::Output {
    Command::new(chromium(test))
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-default-browser-check",
            // No name leaves the machine: 127.0.0.1, and the names below
            // localhost (an exposed port's own host), which Chromium takes
            // for the loopback itself.
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE *.localhost",
            "--proxy-server=127.0.0.1:9",
            "--proxy-bypass-list=127.0.0.1;*.localhost",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("run chromium")
}

/// The `current/` directory of session `a/s`, as `session.list` names it.
pub fn session_current(d: &ProcDaemon, a: &str, s: &str) -> PathBuf {
    match call(
        d,
        allox_protocol::Request::SessionList(allox_protocol::AgentRef { agent_id: a.into() }),
    ) {
        Ok(allox_protocol::Response::Sessions(l)) => l
            .sessions
            .into_iter()
            .find(|x| x.session_id == s)
            .map(|x| PathBuf::from(x.current))
            .expect("the session"),
        other => panic!("{other:?}"),
    }
}

/// A bare repository `repo.git` under `dir` with one commit (`README`
/// holding `readme`), prepared for git's dumb HTTP protocol and readable
/// by every user, as a server would serve it.
pub fn bare_git_repo(dir: &Path, readme: &str) -> PathBuf {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let git = |args: &[&str], cwd: &Path| {
        let out = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t.test"])
            .args(args)
            .current_dir(cwd)
            .output()
            .expect("run git");
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    git(&["init", "-q", "-b", "main"], &work);
    std::fs::write(work.join("README"), readme).unwrap();
    git(&["add", "README"], &work);
    git(&["commit", "-q", "-m", "first"], &work);
    let bare = dir.join("repo.git");
    let (w, b) = (work.to_str().unwrap(), bare.to_str().unwrap());
    git(&["clone", "-q", "--bare", w, b], dir);
    git(&["update-server-info"], &bare);
    let out = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(dir)
        .output()
        .expect("run chmod");
    assert!(out.status.success(), "chmod: {out:?}");
    bare
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_from_a_test_sees_none_of_the_variables_cargo_set_for_the_test() {
        // cargo sets these for the test it runs, as for this one.
        for k in ["CARGO_MANIFEST_DIR", "CARGO_PKG_NAME"] {
            assert!(
                std::env::var_os(k).is_some(),
                "{k} is not set: this test must run under cargo test"
            );
        }
        let cmd = cargo_command();
        let removed: Vec<String> = cmd
            .get_envs()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        for k in ["CARGO_MANIFEST_DIR", "CARGO_PKG_NAME", "CARGO_PKG_VERSION"] {
            assert!(removed.iter().any(|r| r == k), "{k} kept: {removed:?}");
        }
        // What configures cargo itself stays.
        for k in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER",
            "CARGO_TERM_COLOR",
            "PATH",
        ] {
            assert!(!removed.iter().any(|r| r == k), "{k} removed");
            assert!(!is_cargo_run_variable(k), "{k}");
        }
        for k in [
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_MANIFEST_PATH",
            "CARGO_CRATE_NAME",
            "OUT_DIR",
        ] {
            assert!(is_cargo_run_variable(k), "{k}");
        }
    }
}
