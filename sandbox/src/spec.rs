//! What the supervisor tells the sandbox's PID 1, and what it answers.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// File descriptor of a session context's control socket (a
/// `SOCK_SEQPACKET` socket; one postcard message per packet).
pub const CONTROL_FD: i32 = 3;

/// Where things appear inside the sandbox.
pub const SESSION_MOUNT: &str = "/allox/session";
pub const SHARED_MOUNT: &str = "/allox/shared";
pub const WORKSPACE_MOUNT: &str = "/allox";

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SandboxSpec {
    /// Absolute path of the program inside the sandbox.
    pub program: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Absolute working directory inside the sandbox.
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    /// Host path of the session's `current/`.
    pub session: PathBuf,
    /// Host path of the agent's `shared/`.
    pub shared: PathBuf,
    /// Empty host directory on which the new root is assembled (inside the
    /// sandbox's own mount namespace).
    pub stage: PathBuf,
    /// Host directories bound read-only (symlinks are recreated as such).
    pub system_dirs: Vec<PathBuf>,
    pub hostname: String,
    /// A network namespace of its own with only loopback, instead of the
    /// VM's network.
    pub isolate_network: bool,
    /// Largest total size copied from the private /tmp to
    /// `current/.allox-tmp/` on normal exit; 0 turns the copy off.
    pub tmp_sync_cap: u64,
    /// Host files and directories made visible inside, mounted after
    /// everything else, in order (the guest interface's, then plugins').
    pub binds: Vec<Bind>,
    /// Run the program on a terminal of the run's own devpts, of this
    /// size, instead of pipes.
    pub pty: Option<TermSize>,
}

/// A terminal's size in characters.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermSize {
    pub rows: u16,
    pub cols: u16,
}

/// A host file or directory made visible inside the sandbox at `dst`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    /// Host path (file or directory; a Unix socket file works too).
    pub src: PathBuf,
    /// Absolute path inside the sandbox; parents are created on the
    /// sandbox's tmpfs root as needed (never on a bound host directory).
    pub dst: String,
    pub writable: bool,
}

/// What a session's context is built from: the part of a sandbox that all
/// runs of the session share (see [`crate::context`]). Sent once, as the
/// first message on the context's control socket.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ContextSpec {
    /// Empty host directory on which the root is assembled.
    pub stage: PathBuf,
    /// Host directories bound read-only (symlinks are recreated as such).
    pub system_dirs: Vec<PathBuf>,
    pub hostname: String,
    /// A network namespace of the session's own with only loopback.
    pub isolate_network: bool,
    /// The uid and gid the session's programs run as, which the sandbox's
    /// `/etc/passwd` and `/etc/group` name ([`crate::users`]).
    pub uid: u32,
    pub gid: u32,
    /// Host files and directories every run of the session sees, bound
    /// read-only (and nosuid, nodev) into the session's root once.
    pub binds: Vec<Bind>,
    /// Symbolic links made in the session's root: path inside, target.
    pub links: Vec<(String, String)>,
    /// Keep the next run's PID 1 made ahead (its PID, mount and IPC
    /// namespaces, `/proc`, `/dev/pts`, `/dev/shm` and `/tmp`), so that a
    /// run request only attaches the workspace and starts the program; a
    /// new one is made after each use (see [`crate::zygote`]).
    pub prepare_ahead: bool,
    /// Refuse the calls that share a file's extents (see
    /// [`crate::seccomp::filters_for`]).
    pub no_reflinks: bool,
}

/// The context's answer to its first message and to each run request.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum ContextReply {
    /// The session's root is built; runs may be requested.
    Ready,
    /// The run's PID 1 exists (its pidfd rides along); `pid` is in the
    /// supervisor's PID namespace.
    Started { pid: i32 },
    /// The request could not be served, and why.
    Failed(String),
}

/// What a run's PID 1 writes on its status pipe, one message after
/// another: [`InitStatus::ProgramStarted`] once the program's process
/// exists, then how the program ended, or why it never ran.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum InitStatus {
    /// The program's process exists: it has exec'd, or its exec failed
    /// (then [`InitStatus::ExecFailed`] follows). Not an end.
    ProgramStarted,
    Exited(i32),
    Signaled(i32),
    /// Building the sandbox failed at the named step.
    SetupFailed(String),
    /// `execve` of the program failed with this errno.
    ExecFailed(i32),
    /// A line for the end of the run's stderr: what the init could not do
    /// for the run after its program ended (its /tmp not kept whole). Not
    /// an end: the program's end follows.
    Note(String),
}
