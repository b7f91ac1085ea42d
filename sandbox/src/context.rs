//! A session's context, as the supervisor holds it: the control socket of
//! the session's context process ([`crate::zygote`]) and its pidfd.
//!
//! [`Context::start`] starts the process and waits for its root to be
//! built; [`Context::spawn`] asks it for a run (pipes, the run's cgroup and
//! detached mounts of the workspace and binds go along) and returns what
//! `process.start` needs, the run's PID 1 being a child of the caller.
//! Dropping a `Context` kills the process and reaps it.

use super::spawn::{self, Spawned};
use super::spec::{ContextReply, ContextSpec, SandboxSpec};
use super::{wire, SandboxError};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::mount::OpenTreeFlags;
use rustix::process::{WaitId, WaitIdOptions};
use std::path::Path;
use std::time::Duration;

/// How long an answer of the context may take before it counts as hung.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Context {
    control: OwnedFd,
    pidfd: OwnedFd,
    pid: i32,
}

fn pipe() -> Result<(OwnedFd, OwnedFd), SandboxError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SandboxError::sys("pipe", e))
}

/// A detached copy of the mount at `path` (not of mounts below it), the
/// way `mount --bind` copies it; `path` is in the caller's mount namespace.
fn detached(path: &Path) -> Result<OwnedFd, SandboxError> {
    rustix::mount::open_tree(
        rustix::fs::CWD,
        path,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(|e| SandboxError::Path {
        op: "open_tree",
        path: path.to_path_buf(),
        source: e.into(),
    })
}

impl Context {
    /// Starts the context process `init_exe` (an open handle to the
    /// supervisor's own binary) in `cgroup` and waits until the session's
    /// root is built.
    pub fn start(
        init_exe: &OwnedFd,
        cgroup: &OwnedFd,
        spec: &ContextSpec,
    ) -> Result<Context, SandboxError> {
        let (ours, theirs) = wire::pair().map_err(|e| SandboxError::sys("socketpair", e))?;
        rustix::net::sockopt::set_socket_timeout(
            &ours,
            rustix::net::sockopt::Timeout::Recv,
            Some(ANSWER_TIMEOUT),
        )
        .map_err(|e| SandboxError::sys("socket timeout", e))?;
        let (pid, pidfd) = spawn::spawn_context(init_exe, cgroup, &theirs, spec.isolate_network)?;
        drop(theirs);
        // From here a failure drops it: killed and reaped.
        let ctx = Context {
            control: ours,
            pidfd,
            pid,
        };
        let bytes = postcard::to_stdvec(spec)
            .map_err(|e| SandboxError::sys("encode the context spec", std::io::Error::other(e)))?;
        wire::send(ctx.control.as_fd(), &bytes, &[]).map_err(SandboxError::Gone)?;
        match ctx.answer()? {
            (ContextReply::Ready, _) => Ok(ctx),
            (ContextReply::Failed(why), _) => Err(SandboxError::Refused(why)),
            (other, _) => Err(SandboxError::Gone(std::io::Error::other(format!(
                "unexpected answer {other:?}"
            )))),
        }
    }

    /// PID of the context process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// A pidfd of the context process (its namespaces are the session's).
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// Whether the context process still runs (if it ended, this reaps it).
    pub fn is_alive(&self) -> bool {
        matches!(
            rustix::process::waitid(
                WaitId::PidFd(self.pidfd.as_fd()),
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
            ),
            Ok(None)
        )
    }

    /// Starts a run of `spec` in `cgroup`. A [`SandboxError::Refused`]
    /// leaves the context usable; any other error means it is not.
    pub fn spawn(&self, spec: &SandboxSpec, cgroup: &OwnedFd) -> Result<Spawned, SandboxError> {
        let bytes = postcard::to_stdvec(spec)
            .map_err(|e| SandboxError::sys("encode spec", std::io::Error::other(e)))?;
        let (stdin_r, stdin_w) = pipe()?;
        let (stdout_r, stdout_w) = pipe()?;
        let (stderr_r, stderr_w) = pipe()?;
        let (status_r, status_w) = pipe()?;
        let session = detached(&spec.session)?;
        let shared = detached(&spec.shared)?;
        let binds = spec
            .binds
            .iter()
            .map(|b| detached(&b.src))
            .collect::<Result<Vec<_>, _>>()?;
        let mut fds: Vec<BorrowedFd<'_>> = vec![
            stdin_r.as_fd(),
            stdout_w.as_fd(),
            stderr_w.as_fd(),
            status_w.as_fd(),
            cgroup.as_fd(),
            session.as_fd(),
            shared.as_fd(),
        ];
        fds.extend(binds.iter().map(|b| b.as_fd()));
        wire::send(self.control.as_fd(), &bytes, &fds).map_err(SandboxError::Gone)?;
        drop(fds);
        drop((
            stdin_r, stdout_w, stderr_w, status_w, session, shared, binds,
        ));
        match self.answer()? {
            (ContextReply::Started { pid }, Some(pidfd)) => Ok(Spawned {
                pid,
                pidfd,
                stdin: stdin_w,
                stdout: stdout_r,
                stderr: stderr_r,
                status: status_r,
            }),
            (ContextReply::Failed(why), _) => Err(SandboxError::Refused(why)),
            (other, _) => Err(SandboxError::Gone(std::io::Error::other(format!(
                "unexpected answer {other:?}"
            )))),
        }
    }

    /// The next answer, with the descriptor it carries.
    fn answer(&self) -> Result<(ContextReply, Option<OwnedFd>), SandboxError> {
        let mut buf = Vec::new();
        let fds = wire::recv(self.control.as_fd(), &mut buf)
            .map_err(SandboxError::Gone)?
            .ok_or_else(|| SandboxError::Gone(std::io::ErrorKind::UnexpectedEof.into()))?;
        let reply =
            postcard::from_bytes(&buf).map_err(|e| SandboxError::Gone(std::io::Error::other(e)))?;
        Ok((reply, fds.into_iter().next()))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let _ = rustix::process::pidfd_send_signal(&self.pidfd, rustix::process::Signal::KILL);
        let _ = rustix::process::waitid(WaitId::PidFd(self.pidfd.as_fd()), WaitIdOptions::EXITED);
    }
}
