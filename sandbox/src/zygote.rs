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
//!
//! **The next run made ahead** ([`ContextSpec::prepare_ahead`]): after
//! `Ready`, and after each run it serves, the context clones the next
//! run's PID 1 at once, in the context's own cgroup. That PID 1 makes
//! what no request decides — its PID, mount and IPC namespaces, its
//! `/proc`, `/dev/pts`, `/dev/shm` and `/tmp` — and waits on a socket of
//! its own. A run request then moves it into the run's cgroup, hands it
//! the request and its descriptors, and answers at once; the PID 1
//! attaches the workspace and starts the program as any other. It is a
//! copy of the context made before the run that uses it was asked for,
//! and after the run before it was handed its own: nothing of one run
//! (its files in `/tmp`, its SysV objects, its descriptors, environment,
//! signal dispositions or processes) can reach the next, which shares
//! nothing with it but what every run of the session shares.
//! An unused one waits until the supervisor kills it (an exit of its own
//! would leave the supervisor a zombie it cannot name), or until the
//! supervisor is gone.

use super::spawn::{self, Forked};
use super::spec::{ContextReply, ContextSpec, SandboxSpec, CONTROL_FD};
use super::{init, seccomp, sys, wire};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::io::Errno;

/// The next run's PID 1, made ahead: the context's end of its socket, its
/// PID (in the supervisor's PID namespace) and pidfd.
struct Spare {
    sock: OwnedFd,
    pid: i32,
    pidfd: OwnedFd,
}

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
    let filter = match seccomp::filters_for(spec.no_reflinks) {
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
    // The capability bounding set, emptied once here and inherited by
    // every process this context makes (eighty system calls less per run).
    // It limits only what an execve may grant: this process keeps the
    // capabilities it has, which its clones and each PID 1's mounts need.
    if let Err(e) = caps::clear(None, caps::CapSet::Bounding) {
        fail(&sock, format!("empty the capability bounding set: {e}"));
    }
    if answer(sock.as_fd(), &ContextReply::Ready, None).is_err() {
        std::process::exit(1);
    }
    // The supervisor, whose end an unused PID 1 made ahead waits for.
    let parent = spec
        .prepare_ahead
        .then(|| {
            rustix::process::pidfd_open(
                rustix::process::getppid()?,
                rustix::process::PidfdFlags::empty(),
            )
            .ok()
        })
        .flatten();
    let mut spare = parent.as_ref().and_then(|p| make_spare(p.as_fd(), &filter));
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
        let sent = match serve(&buf, fds, &filter, &mut spare) {
            Ok((pid, pidfd, held)) => {
                let sent = answer(
                    sock.as_fd(),
                    &ContextReply::Started { pid },
                    Some(pidfd.as_fd()),
                );
                // The context's copies of the run's descriptors close once
                // the supervisor has its answer.
                drop(held);
                sent
            }
            Err(why) => answer(sock.as_fd(), &ContextReply::Failed(why), None),
        };
        if sent.is_err() {
            std::process::exit(1);
        }
        // The next one, while the run just started goes on.
        if spare.is_none() {
            spare = parent.as_ref().and_then(|p| make_spare(p.as_fd(), &filter));
        }
    }
}

/// Clones the next run's PID 1 (see the module's doc); None if it cannot
/// be made now (the next run is then cloned at its request).
fn make_spare(parent: BorrowedFd<'_>, filter: &seccomp::Filters) -> Option<Spare> {
    let (ours, theirs) = wire::pair().ok()?;
    match spawn::clone_run(None) {
        Ok(Forked::Child) => {
            drop(ours);
            spare(theirs, parent, filter)
        }
        Ok(Forked::Parent { pid, pidfd }) => Some(Spare {
            sock: ours,
            pid,
            pidfd,
        }),
        Err(_) => None,
    }
}

/// A run's PID 1 made ahead: its own mounts now, then its run, when one
/// is asked for. Never returns.
fn spare(sock: OwnedFd, parent: BorrowedFd<'_>, filter: &seccomp::Filters) -> ! {
    // Nothing of the context: its control socket, an earlier PID 1's socket.
    let _ = sys::close_all_above_stdio_except(&[sock.as_fd(), parent]);
    let own = init::own_mounts();
    let mut buf = Vec::new();
    if let Ok(Some(fds)) = wire::recv(sock.as_fd(), &mut buf) {
        drop(sock);
        // The context checked both before it handed them on.
        let run = decode_spec(&buf).and_then(|spec| run_fds(&spec, fds).map(|f| (spec, f)));
        if let Ok((spec, (fds, cgroup))) = run {
            drop(cgroup);
            init::run(spec, fds, filter, own)
        }
        std::process::exit(1);
    }
    // Never used: the context is gone. Wait for the supervisor's kill, or
    // for the supervisor's own end.
    let mut p = [rustix::event::PollFd::new(
        &parent,
        rustix::event::PollFlags::IN,
    )];
    while matches!(rustix::event::poll(&mut p, None), Err(Errno::INTR) | Ok(0)) {}
    std::process::exit(0)
}

/// Whether the process of `pidfd` has ended.
fn ended(pidfd: &OwnedFd) -> bool {
    let mut p = [rustix::event::PollFd::new(
        pidfd,
        rustix::event::PollFlags::IN,
    )];
    rustix::event::poll(&mut p, Some(&rustix::time::Timespec::default())).is_ok_and(|n| n > 0)
}

/// Moves the process `pid` into the cgroup of the directory `cgroup`.
fn move_into(cgroup: BorrowedFd<'_>, pid: i32) -> Result<(), String> {
    let procs = rustix::fs::openat(
        cgroup,
        "cgroup.procs",
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| format!("open the run's cgroup.procs: {e}"))?;
    rustix::io::write(&procs, pid.to_string().as_bytes())
        .map(drop)
        .map_err(|e| format!("move the run's PID 1 into its cgroup: {e}"))
}

/// A run request's spec.
fn decode_spec(bytes: &[u8]) -> Result<SandboxSpec, String> {
    postcard::from_bytes(bytes).map_err(|e| format!("decode the run's spec: {e}"))
}

/// How many descriptors a run of `spec` comes with after its binds'
/// mounts: the supervisor's ends of its pipes (or, a terminal run, of its
/// status pipe), for its PID 1 to keep ([`crate::KEPT_FDS`]).
pub(crate) fn kept_count(spec: &SandboxSpec) -> usize {
    if spec.pty.is_some() {
        1
    } else {
        3
    }
}

/// Whether `n` descriptors are what a run of `spec` comes with.
fn count_fds(spec: &SandboxSpec, n: usize) -> Result<(), String> {
    let want = RUN_FDS + spec.binds.len() + kept_count(spec);
    if n != want {
        return Err(format!(
            "{n} descriptors for a run with {} binds (want {want})",
            spec.binds.len()
        ));
    }
    Ok(())
}

/// A run request's descriptors, as many as its spec asks for; the run's
/// cgroup apart.
fn run_fds(spec: &SandboxSpec, mut fds: Vec<OwnedFd>) -> Result<(init::RunFds, OwnedFd), String> {
    count_fds(spec, fds.len())?;
    let kept = fds.split_off(RUN_FDS + spec.binds.len());
    let binds = fds.split_off(RUN_FDS);
    let [stdin, stdout, stderr, status, cgroup, session, shared]: [OwnedFd; RUN_FDS] =
        fds.try_into().map_err(|_| "descriptors".to_string())?;
    let fds = init::RunFds {
        stdin,
        stdout,
        stderr,
        status,
        session,
        shared,
        binds,
        kept,
    };
    Ok((fds, cgroup))
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

/// What the context holds of a run it started until it has answered.
type Held = Option<(init::RunFds, OwnedFd)>;

/// One run request: returns the run's PID 1 (PID and pidfd), or why not.
/// In the run's PID 1 itself it never returns.
fn serve(
    bytes: &[u8],
    fds: Vec<OwnedFd>,
    filter: &seccomp::Filters,
    spare: &mut Option<Spare>,
) -> Result<(i32, OwnedFd, Held), String> {
    let spec = decode_spec(bytes)?;
    count_fds(&spec, fds.len())?;
    init::prepare_binds(&spec.binds, &fds[RUN_FDS..RUN_FDS + spec.binds.len()])
        .map_err(|e| e.chain())?;
    let cgroup = fds[4].as_fd();
    if let Some(sp) = spare.take().filter(|sp| !ended(&sp.pidfd)) {
        // In the run's cgroup before anything of the run reaches it: from
        // here a kill of the run's cgroup takes it.
        if let Err(why) = move_into(cgroup, sp.pid) {
            *spare = Some(sp);
            return Err(why);
        }
        let all: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        if wire::send(sp.sock.as_fd(), bytes, &all).is_ok() {
            return Ok((sp.pid, sp.pidfd, None));
        }
        // It ended just now, in the run's cgroup: the run is made anew.
    }
    let (fds, cgroup) = run_fds(&spec, fds)?;
    match spawn::clone_run(Some(cgroup.as_fd())) {
        Ok(Forked::Child) => {
            drop(cgroup);
            init::run(spec, fds, filter, init::own_mounts())
        }
        Ok(Forked::Parent { pid, pidfd }) => Ok((pid, pidfd, Some((fds, cgroup)))),
        Err(e) => Err(e.chain()),
    }
}
