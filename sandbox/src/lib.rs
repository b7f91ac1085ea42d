//! The sandbox every run executes in, built natively (no bubblewrap).
//!
//! Each session has a context ([`context`], [`zygote`]): a process of the
//! supervisor's own binary in the session's mount, UTS and IPC namespaces
//! (and network namespace, when isolated), which has built the session's
//! read-only root once. For each run the supervisor sends it the run's
//! [`SandboxSpec`] with pipes, the run's cgroup and detached mounts of the
//! workspace; it clones the run's PID 1 ([`init`]) into new PID, mount and
//! IPC namespaces, directly into the run's cgroup, as a child of the
//! supervisor, and hands back its pidfd. The run's PID 1 mounts its own
//! /proc, /tmp, /dev/pts, /dev/shm and the workspace, starts the program as
//! an unprivileged user with no capabilities, no_new_privs and a seccomp
//! filter, reaps everything in the namespace, and reports how the program
//! ended on a status pipe.
//!
//! [`cgroup`] places and limits a session's and a run's processes; [`sys`]
//! holds the raw system calls rustix does not wrap (also used by the
//! guest's PID 1 to bring up `lo`).

pub mod binds;
pub mod cgroup;
pub mod context;
mod init;
pub mod seccomp;
mod spawn;
pub mod spec;
pub mod sys;
pub mod tmp_sync;
pub mod usage;
pub mod users;
mod wire;
pub mod zygote;

/// Where a run's PID 1 keeps the supervisor's ends of the run's pipes (and
/// a terminal run's master side), close-on-exec, for as long as the run
/// lives: a supervisor that restarts takes them up again with
/// `pidfd_getfd`, so the run's output is read on (and a write to it never
/// meets a pipe without a reader: `SIGPIPE`), its exit status is known,
/// and its terminal stays.
pub struct KeptFds {
    pub stdout: i32,
    pub stderr: i32,
    pub status: i32,
    pub terminal: i32,
}

pub const KEPT_FDS: KeptFds = KeptFds {
    stdout: 100,
    stderr: 101,
    status: 102,
    terminal: 103,
};

pub use context::Context;
pub use spawn::{RunIo, Spawned, Terminal as PendingTerminal};
pub use spec::{Bind, ContextSpec, InitStatus, SandboxSpec, TermSize};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SandboxError {
    #[error("{op}")]
    Sys {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{op} {path}")]
    Path {
        op: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot build the seccomp filter: {0}")]
    Seccomp(String),
    /// The session's context answered that it cannot make this run.
    #[error("the session's context cannot make the run: {0}")]
    Refused(String),
    /// The session's context is gone or does not answer as it should.
    #[error("the session's context stopped answering")]
    Gone(#[source] std::io::Error),
}

impl SandboxError {
    /// The OS error number behind this failure, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            SandboxError::Sys { source, .. } | SandboxError::Path { source, .. } => {
                source.raw_os_error()
            }
            SandboxError::Seccomp(_) | SandboxError::Refused(_) | SandboxError::Gone(_) => None,
        }
    }

    pub fn sys(op: &'static str, e: impl Into<std::io::Error>) -> Self {
        SandboxError::Sys {
            op,
            source: e.into(),
        }
    }
}

impl SandboxError {
    /// The message with its sources, for a process that has no other way
    /// to report it (the context answering the supervisor).
    pub fn chain(&self) -> String {
        chain(self)
    }
}

/// An error's message followed by its sources', each after `: `.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(e) = src {
        s.push_str(&format!(": {e}"));
        src = e.source();
    }
    s
}
