//! `allox-init container`: the supervisor as a container's PID 1 (a Kata
//! pod's container, or podman/crun for development).
//!
//! The container's rules are the guest's where they can be: the store is a
//! block device given to the container, mounted at the guest's path; a
//! blank device is formatted only with `--format-blank`, anything but
//! Btrfs is never touched; the supervisor is this same binary's
//! `supervise`, restarted when it dies; every orphan is reaped; SIGTERM
//! stops it in order within `--stop-timeout`. What differs: the process
//! exits 0 after the stop (never `reboot()`), nothing of the machine is set
//! up (the runtime did), and the cgroup is the container's: on cgroup v2 the
//! container's own processes move to a leaf ([`cgroup`]) so that the
//! controllers can be enabled for `allox/`; `--cgroup-root` names another
//! cgroup2 directory instead and leaves the container's alone.
//!
//! Every option after the container's own is a `supervise` option, checked
//! before anything is touched ([`ContainerArgs::plan`]).

pub mod cgroup;

use crate::guest::{GUEST_SOCKET, STORE_ROOT};
use crate::supervise::{Host, SuperviseArgs, SuperviseError};
use clap::Parser;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use thiserror::Error;

/// Where the container's processes go on cgroup v2, below the container's
/// cgroup, so that it may enable controllers for `allox/` beside it.
pub const LEAF: &str = "allox-init";

/// The flags of `allox-init container`.
#[derive(Debug, Clone, clap::Args)]
pub struct ContainerArgs {
    /// The store's block device (a Btrfs filesystem, or all zeros with
    /// --format-blank). Required.
    #[arg(long, value_name = "DEVICE")]
    pub store: Option<PathBuf>,
    /// Format the store device with Btrfs if it is blank (its first MiB
    /// all zeros); a device holding anything else is never touched.
    #[arg(long)]
    pub format_blank: bool,
    /// Seconds the supervisor gets to stop on SIGTERM (refuse new work,
    /// kill the sessions, flush the store) before what is left is killed.
    /// Keep it below the runtime's grace period.
    #[arg(long, value_name = "SECONDS", default_value_t = 20)]
    pub stop_timeout: u64,
    /// `allox-init supervise` options (all but --root, which is the
    /// store's): e.g. --listen unix:PATH, --allow-uid UID,
    /// --process-tracker ebpf, --cgroup-root DIR (a cgroup2 directory to
    /// use instead of the container's own). The container's own options
    /// may come among them.
    #[arg(
        value_name = "SUPERVISE OPTIONS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub supervise: Vec<OsString>,
}

/// A container that cannot start; each names the option or what is
/// missing.
#[derive(Debug, Error)]
pub enum ContainerError {
    #[error("--store {0}: expected an absolute path to the store's block device")]
    Store(PathBuf),
    #[error("--store DEVICE is required: the store's block device")]
    NoStore,
    #[error("{0} needs a value")]
    NoValue(&'static str),
    #[error("{0} is set by the container (the store is mounted at {STORE_ROOT}); drop it")]
    Fixed(&'static str),
    #[error("{0}")]
    Options(String),
    #[error(transparent)]
    Supervise(#[from] SuperviseError),
    #[error("--stop-timeout {0}: expected 1 to 3600 seconds")]
    StopTimeout(u64),
}

/// Where session cgroups go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupPlan {
    /// `--cgroup-root DIR`: used as it is.
    Given(PathBuf),
    /// The container's cgroup2 mount: its processes move to [`LEAF`] and
    /// the controllers are enabled below it.
    Leaf(PathBuf),
    /// `--no-processes`: none.
    None,
}

/// What the container will do, checked before it does any of it.
#[derive(Debug, Clone)]
pub struct Plan {
    pub store: PathBuf,
    pub format_blank: bool,
    pub stop_timeout: Duration,
    pub cgroup: CgroupPlan,
    /// The supervisor's options as given (the container adds the store
    /// root, the cgroup root and the limits).
    pub supervise: Vec<String>,
}

/// Only for parsing the `supervise` options on their own.
#[derive(Parser)]
#[command(name = "allox-init container", no_binary_name = true)]
struct OnlySupervise {
    #[command(flatten)]
    args: SuperviseArgs,
}

impl ContainerArgs {
    /// Checks every option (the `supervise` ones as `supervise` would) and
    /// says what the container will do.
    pub fn plan(mut self, host: &dyn Host) -> Result<Plan, ContainerError> {
        let mut supervise = Vec::with_capacity(self.supervise.len());
        let mut rest = std::mem::take(&mut self.supervise).into_iter();
        while let Some(a) = rest.next() {
            let a = a
                .into_string()
                .map_err(|a| ContainerError::Options(format!("{a:?}: not valid UTF-8")))?;
            for fixed in ["--root", "--under-init"] {
                if a == fixed || a.starts_with(&format!("{fixed}=")) {
                    return Err(ContainerError::Fixed(fixed));
                }
            }
            // The container's own options after a supervise option (clap
            // gave everything from the first unknown option on to
            // `supervise`).
            let (flag, inline) = match a.split_once('=') {
                Some((f, v)) => (f, Some(v.to_string())),
                None => (a.as_str(), None),
            };
            let mut value = |name: &'static str| match &inline {
                Some(v) => Ok(v.clone()),
                None => rest
                    .next()
                    .and_then(|v| v.into_string().ok())
                    .ok_or(ContainerError::NoValue(name)),
            };
            match flag {
                "--format-blank" if inline.is_none() => self.format_blank = true,
                "--store" => self.store = Some(PathBuf::from(value("--store")?)),
                "--stop-timeout" => {
                    let v = value("--stop-timeout")?;
                    self.stop_timeout = v.parse().map_err(|_| {
                        ContainerError::Options(format!(
                            "--stop-timeout {v:?}: expected a number of seconds"
                        ))
                    })?;
                }
                _ => supervise.push(a),
            }
        }
        let store = self.store.ok_or(ContainerError::NoStore)?;
        if !store.is_absolute() {
            return Err(ContainerError::Store(store));
        }
        if !(1..=3600).contains(&self.stop_timeout) {
            return Err(ContainerError::StopTimeout(self.stop_timeout));
        }
        let parsed = OnlySupervise::try_parse_from(
            ["--root", STORE_ROOT]
                .into_iter()
                .map(String::from)
                .chain(supervise.iter().cloned()),
        )
        .map_err(|e| ContainerError::Options(first_line(&e.to_string())))?
        .args;
        let cgroup = if parsed.no_processes {
            CgroupPlan::None
        } else if let Some(dir) = &parsed.cgroup_root {
            CgroupPlan::Given(dir.clone())
        } else {
            CgroupPlan::Leaf(
                host.cgroup2_mount()
                    .filter(|m| m == Path::new("/sys/fs/cgroup"))
                    .ok_or(cgroup::CgroupError::NoV2)
                    .map_err(|e| ContainerError::Options(e.to_string()))?,
            )
        };
        // Everything else `supervise` would refuse, refused now.
        let mut check = parsed.clone();
        if let CgroupPlan::Leaf(m) = &cgroup {
            check.cgroup_root = Some(m.clone());
        }
        check.into_config(host)?;
        Ok(Plan {
            store,
            format_blank: self.format_blank,
            stop_timeout: Duration::from_secs(self.stop_timeout),
            cgroup,
            supervise,
        })
    }
}

/// clap's message without its usage lines.
fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or(text);
    line.trim_start_matches("error: ").to_string()
}

impl Plan {
    /// The supervisor's command: `supervise` over the store's root, the
    /// control socket where the guest has it unless the options say
    /// otherwise, the cgroup root, and (on a v2 leaf) the guest's limits
    /// for a machine of `mem_total` bytes and `pid_max` process ids.
    pub fn command(&self, exe: &Path, mem_total: u64, pid_max: u64) -> Command {
        let mut cmd = Command::new(exe);
        cmd.arg("supervise").args(["--root", STORE_ROOT]);
        if !self
            .supervise
            .iter()
            .any(|a| a == "--listen" || a.starts_with("--listen="))
        {
            cmd.args(["--listen", &format!("unix:{GUEST_SOCKET}")]);
        }
        // `system.shutdown` ends the container (exit status 3 to this
        // process) and kills the sessions, as in the guest.
        cmd.arg("--under-init");
        if let CgroupPlan::Leaf(m) = &self.cgroup {
            cmd.arg("--cgroup-root").arg(m);
        }
        cmd.args(&self.supervise);
        if let CgroupPlan::Leaf(_) = self.cgroup {
            cmd.args(crate::limits::LimitSettings::default().args(
                mem_total,
                pid_max,
                &self.supervise,
            ));
        }
        cmd.env("NO_COLOR", "1");
        cmd
    }
}

#[cfg(test)]
mod tests;
