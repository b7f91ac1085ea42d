//! Why a run could not be started, waited for, written to or killed, each
//! mapped to one protocol error code.

use super::validate::Refused;
use crate::plugin_host::PluginHostError;
use allox_protocol::{ErrorBody, ErrorCode, IdError};
use allox_sandbox::cgroup::CgroupError;
use allox_sandbox::SandboxError;
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RunError {
    /// The supervisor's own settings (`--sandbox-uid`, `--sandbox-gid`).
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    InvalidId(#[from] IdError),
    /// What the client asked to run is refused before anything starts.
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("cwd {0:?} is not a directory in the session")]
    NoCwd(String),
    /// `process.start`'s `trace` context is malformed.
    #[error("trace: {0}")]
    BadTrace(String),
    #[error("process.start's recovery (system-effects protocol v3) needs --plugin system-effects, which this daemon does not run")]
    RecoveryUnobserved,
    /// `on_disconnect: kill` without `wait` and `stream`: no connection
    /// follows the run, so none going away could kill it.
    #[error("on_disconnect \"kill\" needs wait and stream: the run is killed when the connection that follows it closes, and without both none does")]
    KillNeedsStream,
    #[error("signal {0} is not a signal this supervisor sends")]
    NoSuchSignal(i32),
    #[error("SIGSTOP would stop the sandbox's init, not the program; send SIGTSTP")]
    SigStop,
    #[error("this supervisor runs without process support (--no-processes)")]
    NoProcesses,
    #[error("resource limits need process support (--no-processes is set)")]
    LimitsNeedProcesses,
    #[error("run {agent}/{session}/{run} does not exist")]
    NoSuchRun {
        agent: String,
        session: String,
        run: String,
    },
    #[error(
        "run {agent}/{session}/{run} does not exist (finished runs are kept {} s, the newest {max_runs} of them)",
        .keep_for.as_secs()
    )]
    NotKept {
        agent: String,
        session: String,
        run: String,
        keep_for: Duration,
        max_runs: usize,
    },
    #[error("run {agent}/{session}/{run} does not exist here: if it ran, it ended before this daemon started, and a finished run is not kept across a restart")]
    EndedBeforeRestart {
        agent: String,
        session: String,
        run: String,
    },
    #[error("session {agent}/{session} is being rolled back or deleted")]
    Fenced { agent: String, session: String },
    /// Its whole agent is being deleted (a session being made in it was
    /// told the session, which never existed, was being deleted).
    #[error("agent {agent} is being deleted")]
    AgentFenced { agent: String },
    #[error(
        "session {agent}/{session} is paused with hold (since {since_ms} ms after the epoch): resume it with session.resume"
    )]
    Held {
        agent: String,
        session: String,
        since_ms: u64,
    },
    #[error("session {agent}/{session} is not paused")]
    NotPaused { agent: String, session: String },
    #[error("cannot pause session {agent}/{session}")]
    Pause {
        agent: String,
        session: String,
        #[source]
        source: CgroupError,
    },
    #[error("standard input of run {0} is closed")]
    StdinClosed(String),
    #[error("run {run} has ended ({how}): it has no input to write to")]
    StdinEnded { run: String, how: String },
    #[error("the program does not read its input")]
    StdinNotRead,
    #[error("cannot write")]
    StdinWrite(#[source] std::io::Error),
    #[error("run {0} has no terminal: it was not started with `pty`")]
    NoTerminal(String),
    #[error("run {0} has ended: its terminal is gone")]
    TerminalGone(String),
    #[error("cannot resize the terminal")]
    Resize(#[source] std::io::Error),
    #[error("run {0} is still running")]
    StillRunning(String),
    #[error("the run is still going after {} ms", .0.as_millis())]
    StillGoing(Duration),
    #[error("the run's monitor stopped")]
    MonitorStopped,
    /// A plugin refused the run, or the plugins' contributions to it
    /// clash.
    #[error("run not started")]
    Plugin(#[source] PluginHostError),
    #[error("cannot start the sandbox")]
    Spawn(#[source] SandboxError),
    /// The run's processes could not be made: a process limit is reached.
    #[error("cannot start the run: {why}; no process could be made for it (kill some of the session's processes, or raise the limit: session.update pids_max)")]
    PidsLimit { why: String },
    /// A cgroup operation: creating, killing, removing.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("default session limits")]
    DefaultLimits(#[source] CgroupError),
    #[error("limits of all sessions together")]
    TotalLimits(#[source] CgroupError),
    #[error("cannot apply the session's limits")]
    SessionLimits(#[source] CgroupError),
    #[error("{op} {}", .path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("pipe")]
    Pipe(#[source] std::io::Error),
    #[error("dup")]
    Dup(#[source] rustix::io::Errno),
    #[error("a blocking task of the supervisor failed")]
    Task(#[from] tokio::task::JoinError),
    /// A service attached to every run (the in-sandbox interface) could not
    /// make what the run needs.
    #[error("cannot prepare the run's in-sandbox interface")]
    Attach(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Settings that would leave sandboxed programs privileged.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error(
        "{flag} 0: sandboxed programs must not run as root; \
         give an unprivileged {what} (the default is 10000)"
    )]
    Root {
        flag: &'static str,
        what: &'static str,
    },
    #[error(
        "{flag} {}: the kernel reads {what} -1 as \"unchanged\", \
         so sandboxed programs would stay root; give an unprivileged {what}",
        u32::MAX
    )]
    Unchanged {
        flag: &'static str,
        what: &'static str,
    },
}

fn cgroup_code(e: &CgroupError) -> ErrorCode {
    match e {
        CgroupError::Unsupported { .. } => ErrorCode::Unsupported,
        // Processes that outlive `cgroup.kill` for a while: retrying later
        // may work.
        CgroupError::KillTimeout { .. } | CgroupError::FreezeTimeout { .. } => {
            ErrorCode::Unavailable
        }
        CgroupError::InUse { .. } | CgroupError::FreezeWithdrawn { .. } => ErrorCode::Conflict,
        CgroupError::Io { .. } => ErrorCode::Internal,
    }
}

impl RunError {
    pub fn code(&self) -> ErrorCode {
        use RunError::*;
        match self {
            InvalidId(_) | Refused(_) | NoCwd(_) | BadTrace(_) | RecoveryUnobserved
            | KillNeedsStream | NoSuchSignal(_) => ErrorCode::InvalidRequest,
            NoSuchRun { .. } | NotKept { .. } | EndedBeforeRestart { .. } => ErrorCode::NotFound,
            Fenced { .. }
            | AgentFenced { .. }
            | Held { .. }
            | NotPaused { .. }
            | StdinClosed(_)
            | StdinEnded { .. }
            | StdinWrite(_)
            | TerminalGone(_) => ErrorCode::Conflict,
            Pause { source, .. } => match source {
                CgroupError::FreezeTimeout { .. } => ErrorCode::Unavailable,
                e => cgroup_code(e),
            },
            NoTerminal(_) => ErrorCode::InvalidRequest,
            SigStop | NoProcesses | LimitsNeedProcesses => ErrorCode::Unsupported,
            StdinNotRead | StillRunning(_) | StillGoing(_) | PidsLimit { .. } => {
                ErrorCode::Unavailable
            }
            Spawn(e) => match e.errno() {
                Some(libc::EAGAIN) => ErrorCode::Unavailable,
                Some(libc::ENOSYS) | Some(libc::EINVAL) => ErrorCode::Unsupported,
                _ => ErrorCode::Internal,
            },
            Cgroup(e) | DefaultLimits(e) | TotalLimits(e) => cgroup_code(e),
            // Limits the kernel refuses for this session's state (a
            // memory.max below what it uses) clash with that state.
            SessionLimits(e) => match e {
                CgroupError::Unsupported { .. } => ErrorCode::Unsupported,
                _ => ErrorCode::Conflict,
            },
            // A plugin's own answer keeps its code (an observed run
            // holding its session: `conflict`).
            Plugin(PluginHostError::Plugin(e)) => e.code(),
            Config(_)
            | MonitorStopped
            | Plugin(_)
            | Io { .. }
            | Pipe(_)
            | Dup(_)
            | Resize(_)
            | Task(_)
            | Attach(_) => ErrorCode::Internal,
        }
    }

    /// The whole error chain, once.
    pub fn chain(&self) -> String {
        allox_protocol::error_chain(self)
    }

    /// The error as the client sees it.
    pub fn to_body(&self) -> ErrorBody {
        ErrorBody::new(self.code(), self.chain())
    }
}

impl From<RunError> for ErrorBody {
    fn from(e: RunError) -> ErrorBody {
        e.to_body()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_kill_is_a_timeout_or_internal_never_a_conflict() {
        let timeout = RunError::from(CgroupError::KillTimeout {
            path: "/sys/fs/cgroup/allox/a/s".into(),
            waited: Duration::from_secs(10),
        });
        assert_eq!(timeout.code(), ErrorCode::Unavailable);
        let io = RunError::from(CgroupError::Io {
            op: "write",
            path: "/sys/fs/cgroup/allox/a/s/cgroup.kill".into(),
            source: std::io::Error::from_raw_os_error(libc::EACCES),
        });
        assert_eq!(io.code(), ErrorCode::Internal);
        // The cause reaches the client once, after what failed.
        let body = io.to_body();
        assert!(
            body.message
                .starts_with("write /sys/fs/cgroup/allox/a/s/cgroup.kill: "),
            "{}",
            body.message
        );
    }

    #[test]
    fn refusals_keep_their_words_and_codes() {
        let e = RunError::from(Refused::NotInPath(
            "no-such-program".into(),
            super::super::validate::PATH.into(),
        ));
        assert_eq!(e.code(), ErrorCode::InvalidRequest);
        assert!(e.to_body().message.contains("no-such-program"));
        let e = RunError::Fenced {
            agent: "a".into(),
            session: "s".into(),
        };
        assert_eq!(
            e.to_body(),
            ErrorBody::new(
                ErrorCode::Conflict,
                "session a/s is being rolled back or deleted"
            )
        );
        let e = RunError::NotKept {
            agent: "a".into(),
            session: "s".into(),
            run: "r".into(),
            keep_for: Duration::from_secs(600),
            max_runs: 10_000,
        };
        assert_eq!(e.code(), ErrorCode::NotFound);
        assert_eq!(
            e.to_string(),
            "run a/s/r does not exist (finished runs are kept 600 s, the newest 10000 of them)"
        );
    }
}
