//! A session's context, as the supervisor holds it: the control socket of
//! the session's context process ([`crate::zygote`]) and its pidfd.
//!
//! [`Context::start`] starts the process and waits for its root to be
//! built; [`Context::spawn`] asks it for a run (pipes, the run's cgroup and
//! detached mounts of the workspace and binds go along) and returns what
//! `process.start` needs, the run's PID 1 being a child of the caller.
//! Dropping a `Context` kills the process and reaps it.

use super::spawn::{self, RunIo, Spawned, Terminal};
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
    /// The context's cgroup, where the next run's PID 1 made ahead waits.
    cgroup: Option<OwnedFd>,
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
            cgroup: rustix::io::fcntl_dupfd_cloexec(cgroup, 0).ok(),
        };
        let bytes = postcard::to_stdvec(spec)
            .map_err(|e| SandboxError::sys("encode the context spec", std::io::Error::other(e)))?;
        wire::send(ctx.control.as_fd(), &bytes, &[]).map_err(|e| ctx.gone(e))?;
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
        // A terminal run gets, as its stdin, stdout and stderr until its
        // terminal exists, one end of a socket on which its PID 1 sends
        // the terminal's master side back (see `init::run`).
        let (ours, theirs) = match spec.pty {
            None => {
                let (stdin_r, stdin_w) = pipe()?;
                let (stdout_r, stdout_w) = pipe()?;
                let (stderr_r, stderr_w) = pipe()?;
                let ours = Ours::Pipes {
                    stdin: stdin_w,
                    stdout: stdout_r,
                    stderr: stderr_r,
                };
                (ours, [stdin_r, stdout_w, stderr_w])
            }
            Some(_) => {
                let (a, b) = wire::pair().map_err(|e| SandboxError::sys("socketpair", e))?;
                rustix::net::sockopt::set_socket_timeout(
                    &a,
                    rustix::net::sockopt::Timeout::Recv,
                    Some(ANSWER_TIMEOUT),
                )
                .map_err(|e| SandboxError::sys("socket timeout", e))?;
                let dup = |fd: &OwnedFd| {
                    rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(|e| SandboxError::sys("dup", e))
                };
                let (b1, b2) = (dup(&b)?, dup(&b)?);
                (Ours::Pty(a), [b, b1, b2])
            }
        };
        let (status_r, status_w) = pipe()?;
        // Our ends, for the run's PID 1 to keep (`crate::KEPT_FDS`).
        let dup = |fd: &OwnedFd| {
            rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(|e| SandboxError::sys("dup", e))
        };
        let kept = match &ours {
            Ours::Pipes { stdout, stderr, .. } => vec![dup(stdout)?, dup(stderr)?, dup(&status_r)?],
            Ours::Pty(_) => vec![dup(&status_r)?],
        };
        let session = detached(&spec.session)?;
        let shared = detached(&spec.shared)?;
        let binds = spec
            .binds
            .iter()
            .map(|b| detached(&b.src))
            .collect::<Result<Vec<_>, _>>()?;
        let mut fds: Vec<BorrowedFd<'_>> = vec![
            theirs[0].as_fd(),
            theirs[1].as_fd(),
            theirs[2].as_fd(),
            status_w.as_fd(),
            cgroup.as_fd(),
            session.as_fd(),
            shared.as_fd(),
        ];
        fds.extend(binds.iter().map(|b| b.as_fd()));
        fds.extend(kept.iter().map(|k| k.as_fd()));
        wire::send(self.control.as_fd(), &bytes, &fds).map_err(|e| self.gone(e))?;
        drop(fds);
        drop((theirs, status_w, session, shared, binds, kept));
        let (pid, pidfd) = match self.answer()? {
            (ContextReply::Started { pid }, Some(pidfd)) => (pid, pidfd),
            (ContextReply::Failed(why), _) => return Err(SandboxError::Refused(why)),
            (other, _) => {
                return Err(SandboxError::Gone(std::io::Error::other(format!(
                    "unexpected answer {other:?}"
                ))))
            }
        };
        let io = match ours {
            Ours::Pipes {
                stdin,
                stdout,
                stderr,
            } => RunIo::Pipes {
                stdin,
                stdout,
                stderr,
            },
            // The run exists from here: it is returned, so that it is
            // followed to its end, and its terminal received by the caller
            // (once the run may run: a run started frozen sends nothing).
            Ours::Pty(sock) => RunIo::Pty(Terminal(sock)),
        };
        Ok(Spawned {
            pid,
            pidfd,
            io,
            status: status_r,
        })
    }

    /// `e`, saying how the context process ended if it did: its socket
    /// closes as it exits, so it is waited for a moment.
    fn gone(&self, e: std::io::Error) -> SandboxError {
        let mut fds = [rustix::event::PollFd::new(
            &self.pidfd,
            rustix::event::PollFlags::IN,
        )];
        let waited = rustix::event::poll(
            &mut fds,
            Some(&rustix::time::Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            }),
        )
        .is_ok_and(|n| n > 0);
        let ended = waited
            .then(|| {
                rustix::process::waitid(
                    WaitId::PidFd(self.pidfd.as_fd()),
                    WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
                )
            })
            .and_then(|r| r.ok().flatten());
        let how = match ended {
            Some(s) => match (s.exit_status(), s.terminating_signal()) {
                (Some(code), _) => format!("exited with status {code}"),
                (_, Some(sig)) => format!("was killed by signal {sig}"),
                _ => "ended".to_string(),
            },
            None => return SandboxError::Gone(e),
        };
        SandboxError::Gone(std::io::Error::new(
            e.kind(),
            format!("{e}: the context process {} {how}", self.pid),
        ))
    }

    /// The next answer, with the descriptor it carries.
    fn answer(&self) -> Result<(ContextReply, Option<OwnedFd>), SandboxError> {
        let mut buf = Vec::new();
        let fds = wire::recv(self.control.as_fd(), &mut buf)
            .map_err(|e| self.gone(e))?
            .ok_or_else(|| self.gone(std::io::ErrorKind::UnexpectedEof.into()))?;
        let reply =
            postcard::from_bytes(&buf).map_err(|e| SandboxError::Gone(std::io::Error::other(e)))?;
        Ok((reply, fds.into_iter().next()))
    }
}

/// The supervisor's ends of a run's stdio while it is being made.
enum Ours {
    Pipes {
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
    },
    Pty(OwnedFd),
}

impl Drop for Context {
    fn drop(&mut self) {
        let _ = rustix::process::pidfd_send_signal(&self.pidfd, rustix::process::Signal::KILL);
        let _ = rustix::process::waitid(WaitId::PidFd(self.pidfd.as_fd()), WaitIdOptions::EXITED);
        // What is left in its cgroup is the next run's PID 1 made ahead (a
        // run's is moved out before it is used), a child of this process
        // that waits for this kill: killed and reaped here.
        if let Some(cg) = &self.cgroup {
            for pid in procs(cg) {
                let Ok(fd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
                else {
                    continue;
                };
                let _ = rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::KILL);
                let _ = rustix::process::waitid(WaitId::PidFd(fd.as_fd()), WaitIdOptions::EXITED);
            }
        }
    }
}

/// The processes in the cgroup of the directory `cgroup`.
fn procs(cgroup: &OwnedFd) -> Vec<rustix::process::Pid> {
    let Ok(f) = rustix::fs::openat(
        cgroup,
        "cgroup.procs",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) else {
        return Vec::new();
    };
    let mut text = String::new();
    let _ = std::io::Read::read_to_string(&mut std::fs::File::from(f), &mut text);
    text.lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
        .filter_map(rustix::process::Pid::from_raw)
        .collect()
}
