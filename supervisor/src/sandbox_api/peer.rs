//! Who may speak on a run's guest socket: a process of that run, and
//! nobody else.
//!
//! The socket file is bound into the run's sandbox only, but it is also
//! reached from the host through `/proc/<pid>/root/run/allox/guest/sock`
//! by anyone who may read that link: the run's programs are dumpable and
//! run as the sandbox's uid, so a host process with that uid can. So at
//! `accept` the peer is checked: the process that connected (the kernel's
//! `SO_PEERCRED`, taken at `connect`) must be in the run's cgroup or below
//! it, where every process the run starts lives and from which none can
//! move out. Anyone else — the sandbox's uid on the host, root on the
//! host, another run — gets one `Refused(unauthorized)` frame naming its
//! pid and uid, and is closed.
//!
//! A pid is a name that can be reused. The process is held by a pidfd
//! before its pid is looked up in the cgroup, and is checked to be alive
//! after: a live process keeps its pid, so the pid found in the cgroup
//! was the holder's. The pidfd is the kernel's own (`SO_PEERPIDFD`, Linux
//! 6.5 and later), which names the very process that connected; on older
//! kernels (the guest's 6.1) it is opened from the pid at `accept`, which
//! leaves the window between `connect` and `accept` in which the
//! connecting process would have to exit and its pid be taken by a new
//! process of the run.

use allox_sandbox::cgroup::Cgroups;
use rustix::fd::{AsFd, OwnedFd};

/// Why a peer is not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The kernel gave no pid or credentials for the connection.
    NoCredentials,
    /// The process that connected is gone.
    Gone { pid: i32, uid: u32 },
    /// The process is not in the run's cgroup.
    Outside { pid: i32, uid: u32 },
}

impl Refusal {
    /// What the peer is told (and the log says), naming it.
    pub fn message(&self, run: &str) -> String {
        match self {
            Refusal::NoCredentials => format!(
                "the kernel gave no credentials for this connection; only the processes of run {run} may use its guest socket"
            ),
            Refusal::Gone { pid, uid } => format!(
                "pid {pid} (uid {uid}) exited before its connection was checked; only the processes of run {run} may use its guest socket"
            ),
            Refusal::Outside { pid, uid } => format!(
                "pid {pid} (uid {uid}) is not a process of run {run}: only the run's own processes may use its guest socket"
            ),
        }
    }

    pub fn pid(&self) -> Option<i32> {
        match self {
            Refusal::NoCredentials => None,
            Refusal::Gone { pid, .. } | Refusal::Outside { pid, .. } => Some(*pid),
        }
    }

    pub fn uid(&self) -> Option<u32> {
        match self {
            Refusal::NoCredentials => None,
            Refusal::Gone { uid, .. } | Refusal::Outside { uid, .. } => Some(*uid),
        }
    }
}

/// The cgroup whose processes a listener serves.
#[derive(Debug, Clone)]
pub struct RunCgroup {
    pub cgroups: Cgroups,
    pub dir: std::path::PathBuf,
}

impl RunCgroup {
    /// Whether the peer of the connected socket `conn` is a process of
    /// this cgroup (or of one below it).
    pub fn check(&self, conn: impl AsFd) -> Result<(), Refusal> {
        let conn = conn.as_fd();
        let cred =
            rustix::net::sockopt::socket_peercred(conn).map_err(|_| Refusal::NoCredentials)?;
        let (pid, uid) = (cred.pid.as_raw_nonzero().get(), cred.uid.as_raw());
        let Some(holder) = peer_pidfd(conn, cred.pid) else {
            return Err(Refusal::Gone { pid, uid });
        };
        if !self.holds(pid) {
            return Err(Refusal::Outside { pid, uid });
        }
        // Alive now, so the pid found in the cgroup was still its.
        if exited(&holder) {
            return Err(Refusal::Gone { pid, uid });
        }
        Ok(())
    }

    fn holds(&self, pid: i32) -> bool {
        self.cgroups.procs(&self.dir).contains(&pid)
    }
}

/// The peer's pidfd: the kernel's (`SO_PEERPIDFD`), or one opened from its
/// pid where the kernel has no such option; `None` when it is gone.
fn peer_pidfd(conn: rustix::fd::BorrowedFd<'_>, pid: rustix::process::Pid) -> Option<OwnedFd> {
    use nix::errno::Errno;
    match nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerPidfd) {
        Ok(fd) => return Some(fd),
        // Linux before 6.5.
        Err(Errno::ENOPROTOOPT | Errno::EINVAL) => {}
        // The kernel knows the peer is gone.
        Err(_) => return None,
    }
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// Whether the process of `pidfd` has exited (its pidfd is readable).
fn exited(pidfd: &OwnedFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match poll(&mut fds, Some(&now)) {
        Ok(n) => n > 0,
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn cgroup(procs: &[i32]) -> (tempfile::TempDir, RunCgroup) {
        let t = tempfile::tempdir().unwrap();
        let cgroups = Cgroups::open(t.path()).unwrap();
        let dir = cgroups.run_dir("a", "s", "r1");
        std::fs::create_dir_all(dir.join("inner")).unwrap();
        std::fs::write(dir.join("cgroup.procs"), "").unwrap();
        let text: String = procs.iter().map(|p| format!("{p}\n")).collect();
        std::fs::write(dir.join("inner/cgroup.procs"), text).unwrap();
        (t, RunCgroup { cgroups, dir })
    }

    #[test]
    fn a_process_of_the_run_is_served_and_any_other_refused_by_pid_and_uid() {
        let me = std::process::id() as i32;
        let uid = rustix::process::geteuid().as_raw();
        let (a, _b) = UnixStream::pair().unwrap();
        // The peer (this very process) is in a cgroup below the run's.
        let (_t, run) = cgroup(&[1, me]);
        assert_eq!(run.check(&a), Ok(()));
        let (_t, other) = cgroup(&[1]);
        let refused = other.check(&a).unwrap_err();
        assert_eq!(refused, Refusal::Outside { pid: me, uid });
        let msg = refused.message("r1");
        assert!(
            msg.contains(&format!("pid {me} (uid {uid})")) && msg.contains("run r1"),
            "{msg}"
        );
    }
}
