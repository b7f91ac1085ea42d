//! The in-sandbox interface: inside every sandbox, `/run/allox/guest.sock`,
//! served by the supervisor, through which a program asks for what its own
//! run may have (`whoami`, its session's turns, plugin routes).
//!
//! Each run gets its own listener ([`listener`]), a Unix socket (0666) in
//! a directory named after the run, inside a directory of the daemon's own
//! that only root may enter (0700); the run's directory is bound into that
//! run's sandbox (at [`RUN_DIR`]) and nowhere else, and
//! `/run/allox/guest.sock` links to the socket in it. The caller is
//! whoever that listener accepted: its identity is never read from what it
//! sends, so no secret is needed and no PID is looked up. The listener
//! closes, and its directory goes, when the run's sandbox is gone. A
//! restarted daemon listens again in the directories of the runs it
//! adopts, which those runs still see.
//!
//! The same directory holds the Python entry points (`turn.py`,
//! `whoami.py`), written once at start, which run the `allox` client;
//! they, the client and the link are put in each session's root once
//! ([`RunServices::session_files`]), not bound per run.

mod answer;
pub mod conversation;
pub mod listener;
pub mod peer;
pub mod routes;

pub use answer::{peer_label, SandboxApiContext};
pub use routes::{NoRoutes, RouteOutcome, SandboxRoutes};

use crate::runs::{Attachment, RunIdentity, RunServices, SessionFiles};
use crate::supervisor::Supervisor;
use allox_protocol::sandbox_api::{SandboxCaller, SANDBOX_API_SOCKET};
use allox_protocol::ErrorCode;
use allox_sandbox::cgroup::Cgroups;
use allox_sandbox::Bind;
use listener::RunListener;
use peer::RunCgroup;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use thiserror::Error;

/// The `allox` client inside every sandbox, and its directory (on `PATH`).
pub const CLIENT_DIR: &str = "/run/allox/bin";
pub const CLIENT: &str = crate::plugin_api::SANDBOX_CLIENT;

/// The Python entry points: name inside `/run/allox/`, and what they run.
pub const SHIMS: [(&str, &str); 2] = [("turn.py", "turn"), ("whoami.py", "whoami")];

/// Longest socket path the kernel takes (`sun_path` less its NUL).
const MAX_SOCKET_PATH: usize = 107;
/// Longest socket name: a run id (hex milliseconds and a counter) and `.sock`.
const MAX_SOCKET_NAME: usize = 32;

#[derive(Debug, Error)]
pub enum SandboxApiError {
    #[error("{op} {}", .path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{} exists and is not a directory of this user; remove it or start the daemon with another control socket",
        .0.display()
    )]
    NotOurs(PathBuf),
    #[error(
        "{} is too long for the runs' sockets (at most {} bytes); give a shorter control socket path",
        .0.display(), MAX_SOCKET_PATH - MAX_SOCKET_NAME - 1
    )]
    PathTooLong(PathBuf),
}

impl SandboxApiError {
    pub fn code(&self) -> ErrorCode {
        match self {
            SandboxApiError::Io { .. } => ErrorCode::Internal,
            SandboxApiError::NotOurs(_) | SandboxApiError::PathTooLong(_) => {
                ErrorCode::InvalidRequest
            }
        }
    }
}

/// The private directory of a daemon whose control socket is `socket`:
/// beside it, `<socket name>.guest`.
pub fn dir_for(socket: &Path) -> PathBuf {
    let mut name = socket.file_name().unwrap_or_default().to_os_string();
    name.push(".guest");
    socket.with_file_name(name)
}

/// The in-sandbox interface of one daemon.
pub struct SandboxApi {
    dir: PathBuf,
    /// The supervisor's own executable, bound in as the `allox` client.
    exe: PathBuf,
    /// The runs' cgroups: a listener serves its run's processes only.
    cgroups: Cgroups,
    ctx: Arc<SandboxApiContext>,
    /// Set when the daemon ends leaving runs for a successor: their
    /// directories stay.
    closing: Arc<AtomicBool>,
}

impl SandboxApi {
    /// Makes (or takes back, emptied) the private directory `dir` — 0700,
    /// of this user — and writes the Python entry points into it.
    pub fn new(
        dir: PathBuf,
        exe: PathBuf,
        cgroups: Cgroups,
        sup: Weak<Supervisor>,
        routes: Arc<dyn SandboxRoutes>,
    ) -> Result<SandboxApi, SandboxApiError> {
        if dir.as_os_str().len() > MAX_SOCKET_PATH - MAX_SOCKET_NAME - 1 {
            return Err(SandboxApiError::PathTooLong(dir));
        }
        prepare_dir(&dir)?;
        for (name, command) in SHIMS {
            let path = dir.join(name);
            crate::plugin_api::write_shim(&path, command).map_err(|source| {
                SandboxApiError::Io {
                    op: "write",
                    path,
                    source,
                }
            })?;
        }
        Ok(SandboxApi {
            dir,
            exe,
            cgroups,
            closing: Arc::new(AtomicBool::new(false)),
            ctx: Arc::new(SandboxApiContext {
                sup,
                routes,
                in_flight: answer::InFlight::default(),
            }),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// At the daemon's end: removes the directory and what is left in it,
    /// or, when runs are left running for a successor (`keep_runs`), all
    /// but their directories (emptied as their listeners close), which the
    /// successor listens in again.
    pub fn remove(&self, keep_runs: bool) {
        if !keep_runs {
            let _ = std::fs::remove_dir_all(&self.dir);
            return;
        }
        self.closing.store(true, Ordering::SeqCst);
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Inside the sandbox: the run's own directory, holding its socket, and
/// the socket's name in it; [`SANDBOX_API_SOCKET`] is a link to it, made in the
/// session's root. A directory (not the socket file) is bound so that a
/// restarted supervisor can listen again on a new socket in the same
/// directory, which the run still sees.
pub const RUN_DIR: &str = "/run/allox/guest";
const SOCKET_NAME: &str = "sock";
/// A run's directory: root's, entered (not listed) by the sandbox's user.
const RUN_DIR_MODE: u32 = 0o711;

/// What a run holds: its listener and its directory, both gone when it
/// is dropped.
struct RunSocket {
    listener: Option<RunListener>,
    dir: PathBuf,
    closing: Arc<AtomicBool>,
}

impl Drop for RunSocket {
    fn drop(&mut self) {
        drop(self.listener.take());
        if self.closing.load(Ordering::SeqCst) {
            return;
        }
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %self.dir.display(), error = %e, "cannot remove a run's guest directory");
            }
        }
    }
}

impl SandboxApi {
    fn identity(run: &RunIdentity) -> SandboxCaller {
        SandboxCaller {
            agent_id: run.agent.clone(),
            session_id: run.session.clone(),
            run_id: run.run.clone(),
        }
    }

    /// Listens on the socket in `dir` as `run`, for the processes of
    /// its cgroup.
    fn listen(&self, dir: &Path, run: &RunIdentity) -> Result<RunListener, SandboxApiError> {
        let path = dir.join(SOCKET_NAME);
        let cgroup = RunCgroup {
            cgroups: self.cgroups.clone(),
            dir: self.cgroups.run_dir(&run.agent, &run.session, &run.run),
        };
        RunListener::open(&path, Self::identity(run), cgroup, self.ctx.clone()).map_err(|source| {
            SandboxApiError::Io {
                op: "listen on",
                path,
                source,
            }
        })
    }
}

impl RunServices for SandboxApi {
    fn attach(
        &self,
        run: &RunIdentity,
    ) -> Result<Attachment, Box<dyn std::error::Error + Send + Sync>> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        // The sandbox's user needs to reach the socket in it, not to list
        // it.
        let dir = self.dir.join(&run.run);
        std::fs::DirBuilder::new()
            .mode(RUN_DIR_MODE)
            .create(&dir)
            .map_err(|source| SandboxApiError::Io {
                op: "create",
                path: dir.clone(),
                source,
            })?;
        // Whatever the umask took.
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(RUN_DIR_MODE));
        // From here the guard removes the directory, whatever fails.
        let mut held = RunSocket {
            listener: None,
            dir: dir.clone(),
            closing: self.closing.clone(),
        };
        held.listener = Some(self.listen(&dir, run)?);
        Ok(Attachment {
            binds: vec![Bind {
                src: dir,
                dst: RUN_DIR.into(),
                writable: false,
            }],
            path: vec![CLIENT_DIR.into()],
            guard: Box::new(held),
        })
    }

    fn session_files(&self) -> SessionFiles {
        let mut binds = vec![Bind {
            src: self.exe.clone(),
            dst: CLIENT.into(),
            writable: false,
        }];
        for (name, _) in SHIMS {
            binds.push(Bind {
                src: self.dir.join(name),
                dst: format!("/run/allox/{name}"),
                writable: false,
            });
        }
        let link = format!(
            "{}/{SOCKET_NAME}",
            RUN_DIR.rsplit('/').next().unwrap_or_default()
        );
        SessionFiles {
            binds,
            links: vec![(SANDBOX_API_SOCKET.into(), link)],
        }
    }

    fn reattach(&self, live: &[RunIdentity]) -> Vec<(RunIdentity, Box<dyn Send + Sync>)> {
        let mut held: Vec<(RunIdentity, Box<dyn Send + Sync>)> = Vec::new();
        for run in live {
            let dir = self.dir.join(&run.run);
            if !dir.is_dir() {
                continue;
            }
            let mut socket = RunSocket {
                listener: None,
                dir: dir.clone(),
                closing: self.closing.clone(),
            };
            match self.listen(&dir, run) {
                Ok(l) => {
                    socket.listener = Some(l);
                    held.push((run.clone(), Box::new(socket)));
                }
                Err(e) => {
                    tracing::warn!(run = %run.run, error = %e, "cannot listen again for a run left by an earlier supervisor");
                    // Dropping it removes the directory: the run's
                    // `allox` calls fail as for a run without one.
                }
            }
        }
        // The directories of runs that are gone.
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if e.file_type().is_ok_and(|t| t.is_dir())
                    && !held.iter().any(|(r, _)| r.run == name)
                {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        held
    }
}

/// `dir` as a directory of this user that nobody else may enter, empty.
fn prepare_dir(dir: &Path) -> Result<(), SandboxApiError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let io = |op, source| SandboxApiError::Io {
        op,
        path: dir.to_path_buf(),
        source,
    };
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("create", e)),
    }
    let md = std::fs::symlink_metadata(dir).map_err(|e| io("stat", e))?;
    if !md.is_dir() || md.uid() != rustix::process::geteuid().as_raw() {
        return Err(SandboxApiError::NotOurs(dir.to_path_buf()));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| io("chmod", e))?;
    // What an earlier daemon left: sockets nobody serves any more.
    for e in std::fs::read_dir(dir).map_err(|e| io("read", e))?.flatten() {
        let p = e.path();
        // A run's directory stays, emptied of its dead socket: the run
        // may have outlived the daemon, and sees this very directory
        // (see `RunServices::reattach`, which removes the others).
        let gone = match e.file_type() {
            // (An earlier daemon's may have been 0755.)
            Ok(t) if t.is_dir() => {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(RUN_DIR_MODE))
                    .and_then(|()| std::fs::read_dir(&p))
                    .and_then(|inner| {
                        inner.flatten().try_for_each(|f| match f.file_type() {
                            Ok(t) if t.is_dir() => std::fs::remove_dir_all(f.path()),
                            _ => std::fs::remove_file(f.path()),
                        })
                    })
            }
            _ => std::fs::remove_file(&p),
        };
        if let Err(source) = gone {
            return Err(SandboxApiError::Io {
                op: "remove",
                path: p,
                source,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup tree of its own in a temp dir (no processes in it).
    fn cgroups(t: &tempfile::TempDir) -> Cgroups {
        let mount = t.path().join("cgroup");
        std::fs::create_dir_all(&mount).unwrap();
        Cgroups::open(&mount).unwrap()
    }

    #[test]
    fn the_directory_is_made_private_and_emptied_but_for_runs_directories() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let dir = dir_for(&t.path().join("ctl.sock"));
        assert!(dir.ends_with("ctl.sock.guest"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.join("old.sock"), "").unwrap();
        // A run's directory, with the dead socket of an earlier daemon.
        std::fs::create_dir(dir.join("r1")).unwrap();
        std::fs::write(dir.join("r1/sock"), "").unwrap();
        let names = |dir: &Path| {
            let mut v: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        let svc = SandboxApi::new(
            dir.clone(),
            "/x".into(),
            cgroups(&t),
            Weak::new(),
            Arc::new(NoRoutes),
        )
        .unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert_eq!(names(&dir), ["r1", "turn.py", "whoami.py"]);
        assert!(names(&dir.join("r1")).is_empty());
        let mode = std::fs::metadata(dir.join("r1"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, RUN_DIR_MODE);
        let shim = std::fs::read_to_string(dir.join("turn.py")).unwrap();
        assert!(
            shim.contains(r#"os.execv("/run/allox/bin/allox", ["allox", "turn"] + sys.argv[1:])"#),
            "{shim}"
        );
        // Leaving runs to a successor keeps their directories only.
        svc.remove(true);
        assert_eq!(names(&dir), ["r1"]);
        svc.remove(false);
        assert!(!dir.exists());
    }

    #[test]
    fn a_file_in_the_way_is_refused_naming_it() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("g");
        std::fs::write(&dir, "").unwrap();
        let e = SandboxApi::new(
            dir,
            "/x".into(),
            cgroups(&t),
            Weak::new(),
            Arc::new(NoRoutes),
        )
        .err()
        .unwrap();
        assert!(matches!(e, SandboxApiError::NotOurs(_)), "{e}");
        let long = t.path().join("x".repeat(100));
        let e = SandboxApi::new(
            long,
            "/x".into(),
            cgroups(&t),
            Weak::new(),
            Arc::new(NoRoutes),
        )
        .err()
        .unwrap();
        assert!(matches!(e, SandboxApiError::PathTooLong(_)), "{e}");
    }
}
