//! Per-session cgroups (v2): `<mount>/allox/<agent>/<session>/run-<id>/`.
//!
//! Every process a run starts lives in its run's cgroup, whatever it forks,
//! setsids or double-forks; a session is the subtree of its runs. Killing is
//! `cgroup.kill` (SIGKILL to the whole subtree, stopped and frozen processes
//! included) followed by waiting on `cgroup.events` for `populated 0`.
//! Limits (`pids.max`, `memory.max`, `cpu.max`) are set on the session
//! cgroup where the controllers are available; where they are not (the
//! development host's hybrid hierarchy has none of them), asking for one is
//! an `unsupported` error.
//!
//! The mount point is a parameter, so unit tests point it at a temp dir.

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{Mode, OFlags};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CgroupError {
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the {controller} controller is not available in {path} (cgroup.controllers has: {have})"
    )]
    Unsupported {
        controller: &'static str,
        path: PathBuf,
        have: String,
    },
    #[error("the cgroup subtree {} belongs to another daemon ({holder}): give this one its own with --cgroup-root DIR", .path.display())]
    InUse { path: PathBuf, holder: String },
    #[error("processes of {path} did not exit within {waited:?} after cgroup.kill")]
    KillTimeout { path: PathBuf, waited: Duration },
    #[error("{path} did not freeze within {waited:?} (cgroup.events never said `frozen 1`)")]
    FreezeTimeout { path: PathBuf, waited: Duration },
    #[error("the freeze of {path} was withdrawn (thawed) before it finished")]
    FreezeWithdrawn { path: PathBuf },
}

fn io_err(op: &'static str, path: &Path, source: io::Error) -> CgroupError {
    CgroupError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Prefix of a context's cgroup name below its agent's
/// ([`Cgroups::context_dir`]).
pub const CONTEXT_PREFIX: &str = ".context-";

/// Resource limits of a session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    pub pids_max: Option<u64>,
    pub memory_max: Option<u64>,
    /// `cpu.max` as (quota µs, period µs).
    pub cpu_max: Option<(u64, u64)>,
}

/// The most processes `pids.max` can hold back (the kernel's
/// `PID_MAX_LIMIT`).
pub const PIDS_MAX_LIMIT: u64 = 4 << 20;

/// The least `memory.max` a session may be given: under it not even a
/// run's cgroup and its init can be made (the kernel refuses the cgroup,
/// `ENOMEM`).
pub const MEMORY_MAX_LEAST: u64 = 8 << 20;

impl Limits {
    /// Why these limits cannot be a session's, naming the first that is
    /// not: one no run could start under, or past what the kernel takes.
    pub fn refused(&self) -> Option<String> {
        if let Some(n) = self.pids_max.filter(|&n| n == 0 || n > PIDS_MAX_LIMIT) {
            return Some(format!(
                "pids_max {n}: expected 1 to {PIDS_MAX_LIMIT} (the kernel's limit of process ids)"
            ));
        }
        if let Some(m) = self.memory_max.filter(|&m| m < MEMORY_MAX_LEAST) {
            return Some(format!(
                "memory_max {m}: at least {MEMORY_MAX_LEAST} bytes (8 MiB); no run starts under less"
            ));
        }
        None
    }
}

/// The `allox` subtree of a cgroup2 mount, owned by one daemon.
#[derive(Debug, Clone)]
pub struct Cgroups {
    base: PathBuf,
    /// The subtree's directory, locked (`flock`, exclusive) for as long as
    /// any clone lives: a daemon kills, adopts and removes every cgroup
    /// below its base, so no two may share one.
    _owner: std::sync::Arc<OwnedFd>,
}

impl Cgroups {
    /// Uses (and creates) `<mount>/allox`, enabling the controllers that
    /// the mount offers for the subtree. Fails with [`CgroupError::InUse`],
    /// naming the holder, while another daemon owns the subtree.
    pub fn open(mount: &Path) -> Result<Cgroups, CgroupError> {
        let base = mount.join("allox");
        std::fs::create_dir_all(&base).map_err(|e| io_err("create", &base, e))?;
        let owner = open_dir(&base)?;
        match rustix::fs::flock(&owner, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(CgroupError::InUse {
                    holder: holder_of(&owner, Path::new("/proc")),
                    path: base,
                })
            }
            Err(e) => return Err(io_err("lock", &base, e.into())),
        }
        let c = Cgroups {
            base,
            _owner: std::sync::Arc::new(owner),
        };
        // Best effort: a controller already enabled or not offered is fine.
        c.enable_controllers(mount);
        c.enable_controllers(&c.base);
        Ok(c)
    }

    fn enable_controllers(&self, dir: &Path) {
        let offered = read_trim(&dir.join("cgroup.controllers")).unwrap_or_default();
        for ctl in ["pids", "memory", "cpu"] {
            if offered.split_whitespace().any(|c| c == ctl) {
                let _ = std::fs::write(dir.join("cgroup.subtree_control"), format!("+{ctl}"));
            }
        }
    }

    pub fn base(&self) -> &Path {
        &self.base
    }

    pub fn agent_dir(&self, a: &str) -> PathBuf {
        self.base.join(a)
    }

    pub fn session_dir(&self, a: &str, s: &str) -> PathBuf {
        self.agent_dir(a).join(s)
    }

    pub fn run_dir(&self, a: &str, s: &str, run: &str) -> PathBuf {
        self.session_dir(a, s).join(format!("run-{run}"))
    }

    /// The cgroup of a session's context process: beside the session's,
    /// so that killing the session's processes (a rollback) leaves it, and
    /// killing the agent's takes it. Session ids never start with `.`, so
    /// the name cannot be a session's.
    pub fn context_dir(&self, a: &str, s: &str) -> PathBuf {
        self.agent_dir(a).join(format!("{CONTEXT_PREFIX}{s}"))
    }

    /// Creates (anew, if a context of an earlier supervisor or a dead one
    /// left it) the cgroup of a session's context and returns a directory handle for
    /// `CLONE_INTO_CGROUP`.
    pub fn create_context(&self, a: &str, s: &str) -> Result<OwnedFd, CgroupError> {
        let dir = self.context_dir(a, s);
        if let Err(e) = std::fs::create_dir(&dir) {
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(io_err("create", &dir, e));
            }
            // A new one: a process cloned into a cgroup that was killed
            // before may be killed too (the kernel compares kill counts of
            // the cgroup and of where the clone came from).
            self.kill(&dir, Duration::from_secs(10))?;
            self.remove(&dir)?;
            std::fs::create_dir(&dir).map_err(|e| io_err("create", &dir, e))?;
        }
        open_dir(&dir)
    }

    /// Creates the session's cgroup if needed; a new one gets `defaults`.
    pub fn ensure_session(&self, a: &str, s: &str, defaults: &Limits) -> Result<(), CgroupError> {
        let agent = self.agent_dir(a);
        let dir = self.session_dir(a, s);
        match std::fs::create_dir(&agent) {
            Ok(()) => self.enable_controllers(&agent),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("create", &agent, e)),
        }
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                self.enable_controllers(&dir);
                self.set_limits(a, s, defaults)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(io_err("create", &dir, e)),
        }
    }

    /// Fails with `Unsupported` unless every controller `limits` needs is
    /// offered to session cgroups.
    pub fn check_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        let offered = read_trim(&self.base.join("cgroup.controllers")).unwrap_or_default();
        for (wanted, controller) in [
            (limits.pids_max.is_some(), "pids"),
            (limits.memory_max.is_some(), "memory"),
            (limits.cpu_max.is_some(), "cpu"),
        ] {
            if wanted && !offered.split_whitespace().any(|c| c == controller) {
                return Err(CgroupError::Unsupported {
                    controller,
                    path: self.base.clone(),
                    have: if offered.is_empty() {
                        "nothing".into()
                    } else {
                        offered.clone()
                    },
                });
            }
        }
        Ok(())
    }

    /// Writes the session's `pids.max`, `memory.max`, `cpu.max`.
    pub fn set_limits(&self, a: &str, s: &str, limits: &Limits) -> Result<(), CgroupError> {
        self.check_limits(limits)?;
        write_limits(&self.session_dir(a, s), limits)
    }

    /// The session's limits as its cgroup holds them: `pids.max`,
    /// `memory.max` and `cpu.max` where the controller is on and a limit
    /// is set (`max` is none; a `cpu.max` of `max PERIOD` keeps its
    /// period).
    pub fn limits(&self, a: &str, s: &str) -> Limits {
        let dir = self.session_dir(a, s);
        let num = |file: &str| {
            read_trim(&dir.join(file))
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
        };
        let cpu_max = read_trim(&dir.join("cpu.max")).ok().and_then(|v| {
            let mut it = v.split_whitespace();
            let (q, p) = (it.next()?, it.next()?.parse::<u64>().ok()?);
            match q {
                "max" if p == 100_000 => None,
                "max" => Some((u64::MAX, p)),
                q => Some((q.parse().ok()?, p)),
            }
        });
        Limits {
            pids_max: num("pids.max"),
            memory_max: num("memory.max"),
            cpu_max,
        }
    }

    /// Writes limits on the whole `allox` subtree: what all sessions
    /// together may take, so that the supervisor and the kernel keep the
    /// rest whatever the sessions do.
    pub fn set_total_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        let parent = self.base.parent().unwrap_or(&self.base);
        let enabled = read_trim(&parent.join("cgroup.subtree_control")).unwrap_or_default();
        for (wanted, controller) in [
            (limits.pids_max.is_some(), "pids"),
            (limits.memory_max.is_some(), "memory"),
            (limits.cpu_max.is_some(), "cpu"),
        ] {
            if wanted && !enabled.split_whitespace().any(|c| c == controller) {
                return Err(CgroupError::Unsupported {
                    controller,
                    path: parent.to_path_buf(),
                    have: if enabled.is_empty() {
                        "nothing".into()
                    } else {
                        enabled.clone()
                    },
                });
            }
        }
        write_limits(&self.base, limits)
    }

    /// Parses `cpu.max` as written by a client: `"QUOTA PERIOD"` or
    /// `"max PERIOD"` (µs); the period defaults to 100000.
    pub fn parse_cpu_max(text: &str) -> Option<(u64, u64)> {
        let mut it = text.split_whitespace();
        let q = match it.next()? {
            "max" => u64::MAX,
            n => n.parse().ok().filter(|&n| n > 0)?,
        };
        let p = match it.next() {
            Some(n) => n
                .parse()
                .ok()
                .filter(|&n: &u64| (1000..=1_000_000).contains(&n))?,
            None => 100_000,
        };
        it.next().is_none().then_some((q, p))
    }

    /// Creates a run's cgroup and returns a directory handle for
    /// `CLONE_INTO_CGROUP`.
    pub fn create_run(&self, a: &str, s: &str, run: &str) -> Result<OwnedFd, CgroupError> {
        let dir = self.run_dir(a, s, run);
        std::fs::create_dir(&dir).map_err(|e| io_err("create", &dir, e))?;
        open_dir(&dir)
    }

    /// PIDs in a cgroup and all cgroups below it.
    pub fn procs(&self, dir: &Path) -> Vec<i32> {
        let mut out = Vec::new();
        collect_procs(dir, &mut out);
        out
    }

    /// Runs (by id) with a cgroup in this session, live or not yet removed.
    pub fn runs(&self, a: &str, s: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.session_dir(a, s))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix("run-"))
                    .map(String::from)
            })
            .collect();
        v.sort();
        v
    }

    /// Whether any process is in `dir` or below.
    pub fn populated(&self, dir: &Path) -> bool {
        match read_trim(&dir.join("cgroup.events")) {
            Ok(ev) => ev.lines().any(|l| l.trim() == "populated 1"),
            Err(_) => false,
        }
    }

    /// Whether `cgroup.events` says `populated 0` (a file that cannot be
    /// read says nothing: `false`).
    pub fn is_empty(&self, dir: &Path) -> bool {
        read_trim(&dir.join("cgroup.events"))
            .is_ok_and(|ev| ev.lines().any(|l| l.trim() == "populated 0"))
    }

    /// SIGKILLs everything in `dir` and below, then waits until it is empty.
    /// Returns how many processes there were.
    pub fn kill(&self, dir: &Path, timeout: Duration) -> Result<u32, CgroupError> {
        if !dir.exists() {
            return Ok(0);
        }
        let n = self.procs(dir).len() as u32;
        let kill = dir.join("cgroup.kill");
        std::fs::write(&kill, "1").map_err(|e| io_err("write", &kill, e))?;
        self.wait_empty(dir, timeout)?;
        Ok(n)
    }

    /// Sends `signal` to every process in `dir` and below but the
    /// sandboxes' PID 1s (each a child of a process outside `dir`), as
    /// `cgroup.kill` reaches every process with SIGKILL: the subtree is
    /// frozen while its processes are listed and signalled, so none forks
    /// out of the count, and thawed after (unless it was frozen before);
    /// each process is reached through a pidfd opened while it is listed.
    /// Returns how many were signalled.
    pub fn signal(&self, dir: &Path, signal: rustix::process::Signal) -> Result<u32, CgroupError> {
        let _frozen = Frozen::new(dir);
        let listed: std::collections::HashSet<i32> = self.procs(dir).into_iter().collect();
        let mut fds = Vec::new();
        for &pid in &listed {
            let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|st| {
                    // `pid (comm) state ppid …`: comm may hold anything.
                    let rest = &st[st.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<i32>().ok()
                });
            if !parent.is_some_and(|pp| listed.contains(&pp)) {
                continue;
            }
            let Some(p) = rustix::process::Pid::from_raw(pid) else {
                continue;
            };
            if let Ok(fd) = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) {
                fds.push((pid, fd));
            }
        }
        // A pid listed, then reused by a process elsewhere before its pidfd
        // was opened, is no longer in the subtree: it is left alone.
        let still: std::collections::HashSet<i32> = self.procs(dir).into_iter().collect();
        let mut n = 0;
        for (pid, fd) in fds {
            if still.contains(&pid) && rustix::process::pidfd_send_signal(&fd, signal).is_ok() {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Waits for `populated 0`, woken by the kernel's notification on
    /// `cgroup.events`, and reading the file again after short, growing
    /// pauses: the kernel sends at most one notification per file every
    /// 10 ms, so a cgroup whose processes started a moment ago would
    /// otherwise be seen empty up to 10 ms late.
    pub fn wait_empty(&self, dir: &Path, timeout: Duration) -> Result<(), CgroupError> {
        let events = dir.join("cgroup.events");
        let fd = match rustix::fs::open(&events, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(()),
            Err(e) => return Err(io_err("open", &events, e.into())),
        };
        let start = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            if !self.populated(dir) {
                return Ok(());
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(CgroupError::KillTimeout {
                    path: dir.to_path_buf(),
                    waited: timeout,
                });
            }
            poll_pri(&fd, left.min(pause));
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Freezes `dir` (`cgroup.freeze`) and waits, woken by the kernel's
    /// notification on `cgroup.events`, until it says `frozen 1`: every
    /// task of it stopped (a task in a system call stops at its end). Past
    /// `timeout` it is an error, and the cgroup is left asked to freeze; a
    /// thaw meanwhile (`cgroup.freeze` back to 0, by another thread) ends
    /// the wait at once, `FreezeWithdrawn`.
    pub fn freeze(&self, dir: &Path, timeout: Duration) -> Result<(), CgroupError> {
        let file = dir.join("cgroup.freeze");
        std::fs::write(&file, "1").map_err(|e| io_err("write", &file, e))?;
        let withdrawn = || read_trim(&file).is_ok_and(|v| v == "0");
        match self.wait_event(dir, "frozen 1", timeout, &withdrawn) {
            Ok(()) => Ok(()),
            Err(_) if withdrawn() => Err(CgroupError::FreezeWithdrawn {
                path: dir.to_path_buf(),
            }),
            // Removed under the wait (its `cgroup.events` no longer
            // reads): not a freeze that took too long.
            Err(_) if !dir.join("cgroup.events").exists() => Err(io_err(
                "freeze",
                dir,
                io::Error::new(io::ErrorKind::NotFound, "the cgroup was removed meanwhile"),
            )),
            Err(waited) => Err(CgroupError::FreezeTimeout {
                path: dir.to_path_buf(),
                waited,
            }),
        }
    }

    /// Lets `dir`'s tasks run again.
    pub fn thaw(&self, dir: &Path) -> Result<(), CgroupError> {
        let file = dir.join("cgroup.freeze");
        std::fs::write(&file, "0").map_err(|e| io_err("write", &file, e))
    }

    /// Whether `cgroup.events` says `frozen 1`.
    pub fn is_frozen(&self, dir: &Path) -> bool {
        read_trim(&dir.join("cgroup.events"))
            .map(|ev| ev.lines().any(|l| l.trim() == "frozen 1"))
            .unwrap_or(false)
    }

    /// Waits until `cgroup.events` has the line `want`, woken by the
    /// kernel's notifications; given up as soon as `stop` says so. The
    /// time waited if it never came.
    fn wait_event(
        &self,
        dir: &Path,
        want: &str,
        timeout: Duration,
        stop: &dyn Fn() -> bool,
    ) -> Result<(), Duration> {
        let events = dir.join("cgroup.events");
        let fd = rustix::fs::open(&events, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|_| Duration::ZERO)?;
        let start = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            let ev = read_trim(&events).map_err(|_| start.elapsed())?;
            if ev.lines().any(|l| l.trim() == want) {
                return Ok(());
            }
            if stop() {
                return Err(start.elapsed());
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(timeout);
            }
            poll_pri(&fd, left.min(pause));
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Removes the empty cgroup `dir` and any empty children.
    pub fn remove(&self, dir: &Path) -> Result<(), CgroupError> {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    self.remove(&e.path())?;
                }
            }
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("remove", dir, e)),
        }
    }
}

fn collect_procs(dir: &Path, out: &mut Vec<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                collect_procs(&e.path(), out);
            }
        }
    }
}

/// A cgroup subtree frozen (`cgroup.freeze`) for as long as this lives,
/// thawed on every path; nothing is done to one that was frozen already,
/// or where freezing is not offered.
struct Frozen(Option<PathBuf>);

impl Frozen {
    fn new(dir: &Path) -> Frozen {
        let file = dir.join("cgroup.freeze");
        if read_trim(&file).ok().as_deref() != Some("0") || std::fs::write(&file, "1").is_err() {
            return Frozen(None);
        }
        // Frozen once `cgroup.events` says so (a task in the middle of a
        // system call stops at its end); a second at most.
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            let ev = read_trim(&dir.join("cgroup.events")).unwrap_or_default();
            if ev.lines().any(|l| l.trim() == "frozen 1") {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Frozen(Some(file))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Some(f) = &self.0 {
            let _ = std::fs::write(f, "0");
        }
    }
}

/// Who holds the `flock` on the open directory `dir`: the process named
/// in `<proc>/locks` for its inode, with its command line.
fn holder_of(dir: &OwnedFd, proc: &Path) -> String {
    let unknown = || "a process that holds its lock".to_string();
    let Ok(st) = rustix::fs::fstat(dir) else {
        return unknown();
    };
    let (major, minor) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    let wanted = format!("{major:02x}:{minor:02x}:{}", st.st_ino);
    let locks = std::fs::read_to_string(proc.join("locks")).unwrap_or_default();
    let pid = locks.lines().find_map(|l| {
        // `1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF`
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 6 && f[1] == "FLOCK" && f[5] == wanted).then(|| f[4].to_string())
    });
    let Some(pid) = pid else {
        return unknown();
    };
    let cmd = std::fs::read(proc.join(&pid).join("cmdline")).unwrap_or_default();
    let cmd: Vec<String> = cmd
        .split(|&c| c == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    if cmd.is_empty() {
        format!("pid {pid}")
    } else {
        format!("pid {pid}: {}", cmd.join(" "))
    }
}

/// Writes `pids.max`, `memory.max` and `cpu.max` of the cgroup at `dir`.
fn write_limits(dir: &Path, limits: &Limits) -> Result<(), CgroupError> {
    let set = |file: &str, value: String| {
        let p = dir.join(file);
        std::fs::write(&p, value).map_err(|e| io_err("write", &p, e))
    };
    if let Some(n) = limits.pids_max {
        set("pids.max", n.to_string())?;
    }
    if let Some(n) = limits.memory_max {
        set("memory.max", n.to_string())?;
    }
    if let Some((quota, period)) = limits.cpu_max {
        let q = if quota == u64::MAX {
            "max".to_string()
        } else {
            quota.to_string()
        };
        set("cpu.max", format!("{q} {period}"))?;
    }
    Ok(())
}

fn read_trim(p: &Path) -> io::Result<String> {
    Ok(std::fs::read_to_string(p)?.trim().to_string())
}

/// A directory handle on the cgroup `dir` (for `CLONE_INTO_CGROUP`).
/// Whether the cgroup2 file system that holds `path` is mounted with
/// `favordynmods`: then moving a process between cgroups does not wait
/// for an RCU grace period (milliseconds on an idle machine), which a run
/// made ahead needs to be worth it (see [`crate::zygote`]).
pub fn favors_dynmods(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    favors_dynmods_in(&info, path)
}

fn favors_dynmods_in(mountinfo: &str, path: &Path) -> bool {
    // "id parent major:minor root mount-point options [optional…] - type
    // source super-options"
    mountinfo
        .lines()
        .filter_map(|l| {
            let (head, tail) = l.split_once(" - ")?;
            let point = head.split(' ').nth(4)?;
            let mut t = tail.split(' ');
            let (fstype, _source, opts) = (t.next()?, t.next()?, t.next().unwrap_or(""));
            (fstype == "cgroup2" && path.starts_with(point)).then_some((point.len(), opts))
        })
        .max_by_key(|(len, _)| *len)
        .is_some_and(|(_, opts)| opts.split(',').any(|o| o == "favordynmods"))
}

/// The cgroup subtree of `mount` ([`Cgroups::open`]'s) when it still
/// holds processes and no daemon holds it: runs an earlier supervisor of a
/// store left there, which a daemon started with another `--cgroup-root`
/// would neither see nor kill.
pub fn left_runs(mount: &Path) -> Option<PathBuf> {
    let base = mount.join("allox");
    let dir = open_dir(&base).ok()?;
    // Held: another daemon's, with its own runs.
    rustix::fs::flock(&dir, rustix::fs::FlockOperation::NonBlockingLockExclusive).ok()?;
    let events = std::fs::read_to_string(base.join("cgroup.events")).ok()?;
    events
        .lines()
        .any(|l| l.trim() == "populated 1")
        .then_some(base)
}

fn open_dir(dir: &Path) -> Result<OwnedFd, CgroupError> {
    rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err("open", dir, e.into()))
}

/// Waits for a priority event (cgroup.events changed) or the timeout.
fn poll_pri(fd: &impl AsFd, timeout: Duration) {
    let mut fds = [rustix::event::PollFd::new(
        fd,
        rustix::event::PollFlags::PRI,
    )];
    let ts = rustix::event::Timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    let _ = rustix::event::poll(&mut fds, Some(&ts));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn favordynmods_is_read_from_the_mount_that_holds_the_path() {
        let info = "\
25 30 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw
31 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
40 25 0:30 / /sys/fs/cgroup rw shared:11 - cgroup2 cgroup2 rw,nsdelegate,favordynmods
";
        let at = |p: &str| favors_dynmods_in(info, Path::new(p));
        assert!(at("/sys/fs/cgroup/allox"));
        assert!(!at("/sys/fs/cgroup/unified/allox"));
        assert!(!at("/sys/kernel"));
        assert!(!favors_dynmods_in("", Path::new("/sys/fs/cgroup")));
    }

    #[test]
    fn layout_and_missing_controllers() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("cgroup.controllers"), "hugetlb\n").unwrap();
        let c = Cgroups::open(d.path()).unwrap();
        assert_eq!(c.run_dir("a", "s", "7"), d.path().join("allox/a/s/run-7"));
        c.ensure_session("a", "s", &Limits::default()).unwrap();
        std::fs::write(c.base().join("cgroup.controllers"), "hugetlb").unwrap();
        let e = c
            .set_limits(
                "a",
                "s",
                &Limits {
                    pids_max: Some(10),
                    ..Limits::default()
                },
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("pids") && e.contains("hugetlb"), "{e}");
        std::fs::write(c.base().join("cgroup.controllers"), "pids memory cpu").unwrap();
        let l = Limits {
            pids_max: Some(10),
            memory_max: Some(1 << 30),
            cpu_max: Some((50_000, 100_000)),
        };
        c.set_limits("a", "s", &l).unwrap();
        let s = c.session_dir("a", "s");
        assert_eq!(std::fs::read_to_string(s.join("pids.max")).unwrap(), "10");
        assert_eq!(
            std::fs::read_to_string(s.join("cpu.max")).unwrap(),
            "50000 100000"
        );
        assert_eq!(Cgroups::parse_cpu_max("max"), Some((u64::MAX, 100_000)));
        assert_eq!(
            Cgroups::parse_cpu_max("20000 50000"),
            Some((20_000, 50_000))
        );
        assert_eq!(Cgroups::parse_cpu_max("0"), None);
        assert_eq!(Cgroups::parse_cpu_max("1 2 3"), None);
    }

    #[test]
    fn a_subtree_has_one_owner_named_to_the_next() {
        let d = tempfile::tempdir().unwrap();
        let first = Cgroups::open(d.path()).unwrap();
        let again = first.clone();
        let e = Cgroups::open(d.path()).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, CgroupError::InUse { .. }), "{text}");
        // This process holds it: named with its pid and command line.
        let me = format!("pid {}:", std::process::id());
        assert!(
            text.contains(&me) && text.contains("--cgroup-root"),
            "{text}"
        );
        drop(first);
        assert!(Cgroups::open(d.path()).is_err(), "a clone still owns it");
        drop(again);
        Cgroups::open(d.path()).expect("free once every clone is gone");
    }

    #[test]
    fn procs_are_collected_from_the_subtree() {
        let d = tempfile::tempdir().unwrap();
        let c = Cgroups::open(d.path()).unwrap();
        let s = c.session_dir("a", "s");
        std::fs::create_dir_all(s.join("run-1")).unwrap();
        std::fs::create_dir_all(s.join("run-2")).unwrap();
        std::fs::write(s.join("run-1/cgroup.procs"), "10\n11\n").unwrap();
        std::fs::write(s.join("run-2/cgroup.procs"), "12\n").unwrap();
        let mut p = c.procs(&s);
        p.sort();
        assert_eq!(p, [10, 11, 12]);
        assert_eq!(c.runs("a", "s"), ["1", "2"]);
        std::fs::write(s.join("run-1/cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        assert!(c.populated(&s.join("run-1")));
        assert!(!c.populated(&s.join("run-2")));
        // Empty only when the kernel says so: an unreadable file is not.
        assert!(!c.is_empty(&s.join("run-1")));
        assert!(!c.is_empty(&s.join("run-2")));
        std::fs::write(s.join("run-2/cgroup.events"), "populated 0\nfrozen 1\n").unwrap();
        assert!(c.is_empty(&s.join("run-2")));
    }
}
