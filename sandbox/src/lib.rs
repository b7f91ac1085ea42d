//! The sandbox every run executes in, built natively (no bubblewrap).
//!
//! The supervisor starts a run with one `clone3` into new PID, mount, IPC
//! and UTS namespaces, directly into the run's cgroup, keeping a pidfd; the
//! child at once re-executes the supervisor's own binary as the sandbox's
//! PID 1 ([`init`]), which reads its [`SandboxSpec`] from a pipe, builds a
//! minimal read-only root, starts the program as an unprivileged user with
//! no capabilities, no_new_privs and a seccomp filter, reaps everything in
//! the namespace, and reports how the program ended on a status pipe.
//!
//! [`cgroup`] places and limits a session's and a run's processes; [`sys`]
//! holds the raw system calls rustix does not wrap (also used by the
//! guest's PID 1 to bring up `lo`).

pub mod binds;
pub mod cgroup;
pub mod init;
pub mod seccomp;
mod spawn;
pub mod spec;
pub mod sys;
pub mod tmp_sync;

pub use spawn::{spawn, Spawned};
pub use spec::{Bind, InitStatus, SandboxSpec};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SandboxError {
    #[error("{op}")]
    Sys {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot build the seccomp filter: {0}")]
    Seccomp(String),
}

impl SandboxError {
    /// The OS error number behind this failure, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            SandboxError::Sys { source, .. } => source.raw_os_error(),
            SandboxError::Seccomp(_) => None,
        }
    }

    pub fn sys(op: &'static str, e: impl Into<std::io::Error>) -> Self {
        SandboxError::Sys {
            op,
            source: e.into(),
        }
    }
}
