//! Why the sandbox's root, or a run's mounts and terminal, could not be
//! made. The context and a run's PID 1 have no log of their own: they send
//! [`InitError::chain`] to the supervisor, which shows it as it is.

use rustix::io::Errno;
use std::io;
use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub(crate) enum InitError {
    /// A mount, remount or detach of the sandbox's own (`mount proc`,
    /// `remount / read-only`, ...).
    #[error("{what}")]
    Mount {
        what: &'static str,
        #[source]
        source: Errno,
    },
    /// A bind of a host path (a system directory, a device node, a file
    /// of the user database, a spec's bind).
    #[error("bind {}", .src.display())]
    BindMount {
        src: PathBuf,
        #[source]
        source: Errno,
    },
    /// The read-only remount that follows a bind.
    #[error("remount {} read-only", .dst.display())]
    RemountReadOnly {
        dst: PathBuf,
        #[source]
        source: Errno,
    },
    /// `mount_setattr` making a bound tree read-only below its top.
    #[error("mount_setattr {}", .dst.display())]
    ReadOnlyTree {
        dst: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Attaching a detached mount the supervisor sent (the session's
    /// files, `shared/`, a bind).
    #[error("attach {dst}")]
    Attach {
        dst: String,
        #[source]
        source: Errno,
    },
    /// The remount that gives an attached mount its flags.
    #[error("remount {dst}")]
    Remount {
        dst: String,
        #[source]
        source: Errno,
    },
    /// A step of the switch to the new root (`pivot_root`, ...).
    #[error("{step}")]
    SwitchRoot {
        step: &'static str,
        #[source]
        source: Errno,
    },
    #[error("sethostname")]
    Hostname(#[source] Errno),
    #[error("bring up lo")]
    Loopback(#[source] io::Error),
    /// A file, directory or link on the root tmpfs (`mkdir`, `create`,
    /// `symlink`, ...).
    #[error("{op} {}", .path.display())]
    File {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Reading a system directory's symbolic link.
    #[error("readlink")]
    Readlink(#[source] io::Error),
    /// A link of the spec cannot go where it says.
    #[error("link {dst:?}")]
    Link {
        dst: String,
        #[source]
        why: TargetError,
    },
    /// A bind of the spec cannot go where it says.
    #[error("bind {dst:?}")]
    Bind {
        dst: String,
        #[source]
        why: BindProblem,
    },
    /// A step of making a terminal run's terminal (`unlockpt`, ...).
    #[error("{step}")]
    Terminal {
        step: &'static str,
        #[source]
        source: io::Error,
    },
    /// The program's process could not be cloned.
    #[error("fork")]
    Fork,
}

impl InitError {
    /// The message with its sources, as the supervisor is sent it.
    pub(crate) fn chain(&self) -> String {
        crate::chain(self)
    }
}

/// Why a path may not take a bind or a link inside the sandbox.
#[derive(Debug, Error)]
pub(crate) enum TargetError {
    #[error("must be an absolute path without . or .. or a trailing /")]
    NotNormal,
    #[error("/, /proc, /dev, /tmp and the workspace are the sandbox's own")]
    Reserved,
}

/// Why a bind's mount point cannot be made on the root tmpfs.
#[derive(Debug, Error)]
pub(crate) enum BindProblem {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("stat the source")]
    StatSource(#[source] io::Error),
    /// On the way to it, a symbolic link or a mount.
    #[error("{} is a symlink or another file system", .0.display())]
    NotOnRoot(PathBuf),
    #[error("{} is not a directory", .0.display())]
    NotDirectory(PathBuf),
    /// A file over a directory, or a directory over a file.
    #[error("a file must be bound on a file, a directory on a directory")]
    KindMismatch,
    #[error("stat {}", .path.display())]
    Stat {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the supervisor is sent is the text it has always been: the
    /// step, then each cause after `: `.
    #[test]
    fn the_supervisor_is_sent_each_step_and_its_cause() {
        let perm = Errno::PERM;
        let cases = [
            (
                InitError::Mount {
                    what: "mount proc",
                    source: perm,
                },
                format!("mount proc: {perm}"),
            ),
            (
                InitError::BindMount {
                    src: "/dev/null".into(),
                    source: perm,
                },
                format!("bind /dev/null: {perm}"),
            ),
            (
                InitError::RemountReadOnly {
                    dst: "/r/usr".into(),
                    source: perm,
                },
                format!("remount /r/usr read-only: {perm}"),
            ),
            (
                InitError::Attach {
                    dst: "/allox/session".into(),
                    source: perm,
                },
                format!("attach /allox/session: {perm}"),
            ),
            (
                InitError::File {
                    op: "mkdir",
                    path: "/r/proc".into(),
                    source: perm.into(),
                },
                format!("mkdir /r/proc: {perm}"),
            ),
            (
                InitError::Link {
                    dst: "/proc/x".into(),
                    why: TargetError::Reserved,
                },
                "link \"/proc/x\": /, /proc, /dev, /tmp and the workspace are the sandbox's own"
                    .into(),
            ),
            (
                InitError::Bind {
                    dst: "a/../b".into(),
                    why: TargetError::NotNormal.into(),
                },
                "bind \"a/../b\": must be an absolute path without . or .. or a trailing /".into(),
            ),
            (
                InitError::Bind {
                    dst: "/opt/x".into(),
                    why: BindProblem::Stat {
                        path: "/opt".into(),
                        source: perm.into(),
                    },
                },
                format!("bind \"/opt/x\": stat /opt: {perm}"),
            ),
            (
                InitError::Bind {
                    dst: "/opt/x".into(),
                    why: BindProblem::NotOnRoot("/opt".into()),
                },
                "bind \"/opt/x\": /opt is a symlink or another file system".into(),
            ),
            (
                InitError::Terminal {
                    step: "unlockpt",
                    source: perm.into(),
                },
                format!("unlockpt: {perm}"),
            ),
            (InitError::Fork, "fork".into()),
        ];
        for (e, want) in cases {
            assert_eq!(e.chain(), want);
        }
    }
}
