//! A session's context (`allox-init session-context`): the process that
//! holds the namespaces a session's runs share and makes each run's PID 1.
//!
//! Started by the supervisor in its own mount, UTS and IPC namespaces (and
//! network namespace, when isolated), in a cgroup of its own, with a
//! `SOCK_SEQPACKET` control socket on fd 3. It reads a [`ContextSpec`],
//! builds the session's root once ([`init::build_context_root`]), answers
//! [`ContextReply::Ready`], then serves requests one at a time: a
//! [`SandboxSpec`] with, as `SCM_RIGHTS`, the program's stdin, stdout and
//! stderr, the status pipe, the run's cgroup, detached mounts of the
//! session's `current/` and the agent's `shared/`, and one per bind. For
//! each it clones the run's PID 1 ([`spawn::clone_run`]) and answers
//! [`ContextReply::Started`] with its pidfd. It ends at end of stream on
//! the socket: when the supervisor closes it, or dies.
//!
//! Single-threaded, so each run is a plain copy of it (no exec per run);
//! it stays root, not dumpable, and never runs anything a run asked for:
//! the program is started by the run's PID 1, in the run's namespaces.

use super::spawn::{self, Forked};
use super::spec::{ContextReply, ContextSpec, SandboxSpec, CONTROL_FD};
use super::{init, seccomp, sys, wire};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};

/// Descriptors before the binds' in a run request.
pub(crate) const RUN_FDS: usize = 7;

/// Entry point; never returns.
pub fn run() -> ! {
    // Root-owned and not dumpable: no other process of this uid without
    // CAP_SYS_PTRACE may read its memory or ptrace it; the runs it makes
    // inherit that, and the program's exec makes a new, dumpable image.
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    let sock = sys::inherited_fd(CONTROL_FD);
    // Descriptors received later land at 3 and above, never on 0-2.
    sys::stdio_to_null();
    // The supervisor is exempt from the OOM killer; what runs in a sandbox
    // must not be, and goes first (inherited by every run).
    let _ = std::fs::write("/proc/self/oom_score_adj", "500");
    let mut buf = Vec::new();
    let spec: ContextSpec = match wire::recv(sock.as_fd(), &mut buf) {
        Ok(Some(_)) => match postcard::from_bytes(&buf) {
            Ok(s) => s,
            Err(e) => fail(&sock, format!("decode the context spec: {e}")),
        },
        _ => std::process::exit(1),
    };
    // Built once; every run's program installs a copy.
    let filter = match seccomp::filters() {
        Ok(f) => f,
        Err(e) => fail(&sock, e.to_string()),
    };
    if let Err(e) = init::build_context_root(&spec) {
        fail(&sock, e.chain());
    }
    // Each run's PID 1 inherits them (a few dozen system calls less per
    // run); here they pass signals to no one, so only SIGKILL or the end
    // of the control socket ends the context.
    init::forward_signals();
    if answer(sock.as_fd(), &ContextReply::Ready, None).is_err() {
        std::process::exit(1);
    }
    loop {
        let fds = match wire::recv(sock.as_fd(), &mut buf) {
            Ok(Some(fds)) => fds,
            // The supervisor closed its end, or is gone.
            Ok(None) => std::process::exit(0),
            Err(e) => {
                let _ = answer(
                    sock.as_fd(),
                    &ContextReply::Failed(format!("receive: {e}")),
                    None,
                );
                continue;
            }
        };
        let sent = match serve(&buf, fds, &filter) {
            Ok((pid, pidfd)) => answer(
                sock.as_fd(),
                &ContextReply::Started { pid },
                Some(pidfd.as_fd()),
            ),
            Err(why) => answer(sock.as_fd(), &ContextReply::Failed(why), None),
        };
        if sent.is_err() {
            std::process::exit(1);
        }
    }
}

fn fail(sock: &OwnedFd, why: String) -> ! {
    let _ = answer(sock.as_fd(), &ContextReply::Failed(why), None);
    std::process::exit(1)
}

fn answer(
    sock: BorrowedFd<'_>,
    r: &ContextReply,
    fd: Option<BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let bytes = postcard::to_stdvec(r).map_err(std::io::Error::other)?;
    wire::send(sock, &bytes, fd.as_slice())
}

/// One run request: returns the run's PID 1 (PID and pidfd), or why not.
/// In the run's PID 1 itself it never returns.
fn serve(
    bytes: &[u8],
    mut fds: Vec<OwnedFd>,
    filter: &seccomp::Filters,
) -> Result<(i32, OwnedFd), String> {
    let spec: SandboxSpec =
        postcard::from_bytes(bytes).map_err(|e| format!("decode the run's spec: {e}"))?;
    if fds.len() != RUN_FDS + spec.binds.len() {
        return Err(format!(
            "{} descriptors for a run with {} binds (want {})",
            fds.len(),
            spec.binds.len(),
            RUN_FDS + spec.binds.len()
        ));
    }
    let binds = fds.split_off(RUN_FDS);
    let [stdin, stdout, stderr, status, cgroup, session, shared]: [OwnedFd; RUN_FDS] =
        fds.try_into().map_err(|_| "descriptors".to_string())?;
    init::prepare_binds(&spec.binds, &binds).map_err(|e| e.chain())?;
    match spawn::clone_run(cgroup.as_fd()) {
        Ok(Forked::Child) => {
            drop(cgroup);
            let fds = init::RunFds {
                stdin,
                stdout,
                stderr,
                status,
                session,
                shared,
                binds,
            };
            init::run(spec, fds, filter)
        }
        // The context's copies of the run's descriptors close here.
        Ok(Forked::Parent { pid, pidfd }) => Ok((pid, pidfd)),
        Err(e) => Err(e.chain()),
    }
}
