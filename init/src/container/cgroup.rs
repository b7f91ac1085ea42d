//! The container's cgroup on v2: its processes moved to a leaf, the
//! controllers enabled for the rest.
//!
//! A container with its own cgroup namespace sees its cgroup as
//! `/sys/fs/cgroup`. Controllers can be enabled for the cgroups below it
//! (`allox/`, where the sessions go) only while it holds no process itself
//! (cgroup v2's "no internal processes" rule), so the container's PID 1
//! moves every process of it into [`super::LEAF`] first, then writes
//! `+pids +memory +cpu` (those offered) to its `cgroup.subtree_control`.
//! A process the runtime adds later (an exec, a probe) cannot join the
//! container's cgroup any more; runtimes then put it in PID 1's cgroup,
//! the leaf.
//!
//! The files are reached through [`Files`], so tests use a fake.

use std::io;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The controllers sessions use.
pub const CONTROLLERS: [&str; 3] = ["pids", "memory", "cpu"];

/// How many times the processes are moved before giving up (a runtime
/// adding processes while they move).
const ROUNDS: usize = 10;

#[derive(Debug, Error)]
pub enum CgroupError {
    #[error("no cgroup2 mount at /sys/fs/cgroup (the container's cgroups are v1: boot the guest with systemd.unified_cgroup_hierarchy=1, or pass --cgroup-root DIR naming a cgroup2 directory)")]
    NoV2,
    #[error("{} is read-only: the container must be privileged to manage its sessions' cgroups (or pass --cgroup-root DIR naming a writable cgroup2 directory)", .0.display())]
    ReadOnly(PathBuf),
    #[error("cannot {op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} holds a process of another PID namespace (listed as 0), which this container cannot move; the runtime must keep its own processes out of the container's cgroup", .0.display())]
    Foreign(PathBuf),
    #[error("processes keep arriving in {} while they are moved to {leaf} (last seen: {pids})", dir.display())]
    Busy {
        dir: PathBuf,
        leaf: &'static str,
        pids: String,
    },
}

/// The cgroup files, as the kernel has them or as a test fakes them.
pub trait Files {
    fn read(&self, path: &Path) -> io::Result<String>;
    fn write(&self, path: &Path, text: &str) -> io::Result<()>;
    fn mkdir(&self, path: &Path) -> io::Result<()>;
}

/// The kernel's.
pub struct Kernel;

impl Files for Kernel {
    fn read(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }
    fn write(&self, path: &Path, text: &str) -> io::Result<()> {
        std::fs::write(path, text)
    }
    fn mkdir(&self, path: &Path) -> io::Result<()> {
        match std::fs::create_dir(path) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            other => other,
        }
    }
}

/// What [`move_to_leaf`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// Processes moved to the leaf.
    pub processes: usize,
    /// Controllers now enabled below the container's cgroup.
    pub enabled: Vec<String>,
}

/// Moves every process of `dir` (the container's cgroup2 mount) into
/// `dir/leaf` and enables [`CONTROLLERS`] (those `dir` offers) for its
/// children.
pub fn move_to_leaf(fs: &dyn Files, dir: &Path, leaf: &'static str) -> Result<Moved, CgroupError> {
    let io_err = |op, path: &Path| {
        let path = path.to_path_buf();
        move |source: io::Error| CgroupError::Io { op, path, source }
    };
    let leaf_dir = dir.join(leaf);
    fs.mkdir(&leaf_dir).map_err(|e| {
        if e.raw_os_error() == Some(rustix::io::Errno::ROFS.raw_os_error()) {
            CgroupError::ReadOnly(dir.to_path_buf())
        } else {
            io_err("create", &leaf_dir)(e)
        }
    })?;
    let procs = dir.join("cgroup.procs");
    let leaf_procs = leaf_dir.join("cgroup.procs");
    let mut moved = 0;
    let mut round = 0;
    loop {
        let pids: Vec<String> = fs
            .read(&procs)
            .map_err(io_err("read", &procs))?
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if pids.is_empty() {
            break;
        }
        if pids.iter().any(|p| p == "0") {
            return Err(CgroupError::Foreign(dir.to_path_buf()));
        }
        round += 1;
        if round > ROUNDS {
            return Err(CgroupError::Busy {
                dir: dir.to_path_buf(),
                leaf,
                pids: pids.join(" "),
            });
        }
        for pid in pids {
            match fs.write(&leaf_procs, &pid) {
                Ok(()) => moved += 1,
                // Gone meanwhile.
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => {}
                Err(e) => return Err(io_err("move a process to", &leaf_procs)(e)),
            }
        }
    }
    let offered = fs
        .read(&dir.join("cgroup.controllers"))
        .map_err(io_err("read", &dir.join("cgroup.controllers")))?;
    let control = dir.join("cgroup.subtree_control");
    let mut enabled = Vec::new();
    for c in CONTROLLERS {
        if offered.split_whitespace().any(|o| o == c) {
            fs.write(&control, &format!("+{c}"))
                .map_err(io_err("enable a controller in", &control))?;
            enabled.push(c.to_string());
        }
    }
    Ok(Moved {
        processes: moved,
        enabled,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    /// A cgroup2 directory whose `cgroup.procs` empties as its processes
    /// are written to the leaf's, and that refuses controllers while it
    /// holds a process (as the kernel does).
    struct Fake {
        files: RefCell<BTreeMap<PathBuf, String>>,
        /// Processes the "runtime" adds after each read, a number of times.
        arrivals: RefCell<Vec<&'static str>>,
        read_only: bool,
    }

    impl Fake {
        fn new(procs: &str, controllers: &str) -> Fake {
            let mut files = BTreeMap::new();
            files.insert(PathBuf::from("/cg/cgroup.procs"), procs.to_string());
            files.insert(
                PathBuf::from("/cg/cgroup.controllers"),
                controllers.to_string(),
            );
            files.insert(PathBuf::from("/cg/cgroup.subtree_control"), String::new());
            Fake {
                files: RefCell::new(files),
                arrivals: RefCell::new(Vec::new()),
                read_only: false,
            }
        }
        fn get(&self, p: &str) -> String {
            self.files
                .borrow()
                .get(Path::new(p))
                .cloned()
                .unwrap_or_default()
        }
    }

    impl Files for Fake {
        fn read(&self, path: &Path) -> io::Result<String> {
            let text = self.files.borrow().get(path).cloned();
            if path == Path::new("/cg/cgroup.procs") {
                if let Some(p) = self.arrivals.borrow_mut().pop() {
                    let mut f = self.files.borrow_mut();
                    f.get_mut(path).unwrap().push_str(&format!("{p}\n"));
                }
            }
            text.ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
        fn write(&self, path: &Path, text: &str) -> io::Result<()> {
            let mut f = self.files.borrow_mut();
            if path == Path::new("/cg/allox-init/cgroup.procs") {
                let root = f.get_mut(Path::new("/cg/cgroup.procs")).unwrap();
                *root = root
                    .lines()
                    .filter(|l| *l != text)
                    .map(|l| format!("{l}\n"))
                    .collect();
                f.entry(path.to_path_buf())
                    .or_default()
                    .push_str(&format!("{text}\n"));
                return Ok(());
            }
            if path == Path::new("/cg/cgroup.subtree_control") {
                if !f[Path::new("/cg/cgroup.procs")].trim().is_empty() {
                    return Err(io::Error::from_raw_os_error(libc_ebusy()));
                }
                let s = f.get_mut(path).unwrap();
                s.push_str(text.trim_start_matches('+'));
                s.push(' ');
                return Ok(());
            }
            Err(io::Error::from(io::ErrorKind::PermissionDenied))
        }
        fn mkdir(&self, _: &Path) -> io::Result<()> {
            if self.read_only {
                return Err(io::Error::from_raw_os_error(
                    rustix::io::Errno::ROFS.raw_os_error(),
                ));
            }
            Ok(())
        }
    }

    fn libc_ebusy() -> i32 {
        rustix::io::Errno::BUSY.raw_os_error()
    }

    #[test]
    fn every_process_moves_to_the_leaf_before_the_controllers_are_enabled() {
        let fs = Fake::new("1\n7\n", "cpuset cpu io memory pids");
        fs.arrivals.borrow_mut().push("9");
        let m = move_to_leaf(&fs, Path::new("/cg"), "allox-init").unwrap();
        assert_eq!(m.processes, 3);
        assert_eq!(m.enabled, ["pids", "memory", "cpu"]);
        assert_eq!(fs.get("/cg/cgroup.procs").trim(), "");
        assert_eq!(fs.get("/cg/allox-init/cgroup.procs"), "1\n7\n9\n");
        assert_eq!(fs.get("/cg/cgroup.subtree_control"), "pids memory cpu ");
    }

    #[test]
    fn only_offered_controllers_are_enabled() {
        let fs = Fake::new("1\n", "pids");
        let m = move_to_leaf(&fs, Path::new("/cg"), "allox-init").unwrap();
        assert_eq!(m.enabled, ["pids"]);
    }

    #[test]
    fn a_read_only_cgroupfs_says_the_container_must_be_privileged() {
        let mut fs = Fake::new("1\n", "pids");
        fs.read_only = true;
        let e = move_to_leaf(&fs, Path::new("/cg"), "allox-init").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/cg is read-only: the container must be privileged"),
            "{e}"
        );
    }

    #[test]
    fn a_process_of_another_pid_namespace_is_named_not_moved_for_ever() {
        let fs = Fake::new("1\n0\n", "pids");
        let e = move_to_leaf(&fs, Path::new("/cg"), "allox-init").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/cg holds a process of another PID namespace (listed as 0)"),
            "{e}"
        );
    }

    #[test]
    fn processes_that_keep_arriving_are_named() {
        let fs = Fake::new("1\n", "pids");
        fs.arrivals.borrow_mut().extend([
            "20", "19", "18", "17", "16", "15", "14", "13", "12", "11", "10",
        ]);
        let e = move_to_leaf(&fs, Path::new("/cg"), "allox-init").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("processes keep arriving in /cg while they are moved to allox-init"),
            "{e}"
        );
    }
}
