//! `session.pause` and `session.resume`: a session's processes, and its
//! context's, frozen by their cgroups (`cgroup.freeze` on the session's and
//! the context's directories, which freezes every run below), and let go
//! again. A paused session keeps its proxy and in-sandbox listeners (they
//! are the supervisor's) and uses no CPU.
//!
//! What is paused is known here, and kept with the session's cgroup (its
//! extended attribute [`PAUSE_XATTR`]: it lives exactly as long as the
//! freeze does), so a supervisor started again finds a session an earlier
//! one paused — since when, why, and whether it is held — by its cgroup
//! (`cgroup.freeze` reads 1): held, it stays so until the host resumes it;
//! otherwise the next request that needs it resumes it.

use super::{RunError, Runs};
use allox_protocol::PauseInfo;
use allox_sandbox::cgroup::CgroupError;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// How long a freeze may take before the pause is given up (and undone).
pub const PAUSE_BOUND: Duration = Duration::from_secs(5);

/// The extended attribute of a paused session's cgroup directory that
/// holds its [`PauseInfo`] as JSON (`trusted.`: only the supervisor, with
/// `CAP_SYS_ADMIN`, may write it).
pub const PAUSE_XATTR: &str = "trusted.allox.pause";

/// The paused sessions, by `agent/session/`.
#[derive(Default)]
pub struct Paused(Mutex<HashMap<String, PauseInfo>>);

fn key(a: &str, s: &str) -> String {
    format!("{a}/{s}/")
}

impl Runs {
    /// The session's cgroup directories that a pause freezes: the
    /// session's (its runs) and its context's, where they exist.
    fn pause_dirs(&self, a: &str, s: &str) -> Vec<PathBuf> {
        [
            self.cgroups.session_dir(a, s),
            self.cgroups.context_dir(a, s),
        ]
        .into_iter()
        .filter(|d| d.is_dir())
        .collect()
    }

    /// Freezes every process of session `a/s` and waits until they are
    /// (at most [`PAUSE_BOUND`]: past it, nothing stays frozen and the
    /// pause fails). Pausing a paused session changes only `hold`.
    pub fn pause(&self, a: &str, s: &str, hold: bool, reason: &str) -> Result<PauseInfo, RunError> {
        {
            let mut paused = self.paused.0.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(p) = paused.get_mut(&key(a, s)) {
                p.hold = hold;
                self.keep_pause(a, s, p);
                return Ok(p.clone());
            }
        }
        // The freeze is waited for without the table's lock: another
        // session's requests look it up meanwhile.
        // The cgroup a new session's first run would make, made now so that
        // a run started while paused starts frozen.
        self.cgroups
            .ensure_session(a, s, &self.cfg.limits)
            .map_err(RunError::Cgroup)?;
        let info = || PauseInfo {
            since_ms: allox_store::clock::now_ms(),
            reason: reason.into(),
            hold,
        };
        let dirs = self.pause_dirs(a, s);
        for (i, d) in dirs.iter().enumerate() {
            match self.cgroups.freeze(d, PAUSE_BOUND) {
                Ok(()) => {}
                // A resume while the freeze was awaited thawed the session:
                // it wins, as below.
                Err(CgroupError::FreezeWithdrawn { .. }) => {
                    for d in &dirs[..i] {
                        let _ = self.cgroups.thaw(d);
                    }
                    tracing::info!(agent = a, session = s, "pause overtaken by a resume");
                    return Ok(info());
                }
                Err(source) => {
                    for d in &dirs[..=i] {
                        let _ = self.cgroups.thaw(d);
                    }
                    return Err(RunError::Pause {
                        agent: a.into(),
                        session: s.into(),
                        source,
                    });
                }
            }
        }
        let info = info();
        let mut paused = self.paused.0.lock().unwrap_or_else(|e| e.into_inner());
        // A resume that came while the freeze was awaited (it found the
        // session frozen and thawed it) wins: the session runs, and is not
        // recorded as paused.
        if self.frozen_before(a, s).is_none() {
            tracing::info!(agent = a, session = s, "pause overtaken by a resume");
            return Ok(info);
        }
        self.keep_pause(a, s, &info);
        paused.insert(key(a, s), info.clone());
        tracing::info!(agent = a, session = s, hold, "session paused");
        Ok(info)
    }

    /// Lets session `a/s` run again; `NotPaused` if it was not.
    pub fn resume(&self, a: &str, s: &str) -> Result<PauseInfo, RunError> {
        let mut paused = self.paused.0.lock().unwrap_or_else(|e| e.into_inner());
        let was = paused
            .remove(&key(a, s))
            .or_else(|| self.frozen_before(a, s));
        let Some(was) = was else {
            return Err(RunError::NotPaused {
                agent: a.into(),
                session: s.into(),
            });
        };
        for d in self.pause_dirs(a, s) {
            self.cgroups.thaw(&d).map_err(RunError::Cgroup)?;
        }
        match rustix::fs::removexattr(self.cgroups.session_dir(a, s), PAUSE_XATTR) {
            Ok(()) | Err(rustix::io::Errno::NODATA) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => {
                tracing::warn!(agent = a, session = s, error = %e, "cannot forget the pause kept with the session's cgroup")
            }
        }
        tracing::info!(agent = a, session = s, "session resumed");
        Ok(was)
    }

    /// Whether session `a/s` is paused, and since when and why.
    pub fn paused(&self, a: &str, s: &str) -> Option<PauseInfo> {
        let paused = self.paused.0.lock().unwrap_or_else(|e| e.into_inner());
        paused
            .get(&key(a, s))
            .cloned()
            .or_else(|| self.frozen_before(a, s))
    }

    /// Before a request that needs session `a/s` to run: resumes it if it
    /// is paused, or refuses (`Held`) if it was paused with `hold`. One
    /// small file read when it is not paused.
    pub fn wake(&self, a: &str, s: &str) -> Result<(), RunError> {
        let Some(p) = self.paused(a, s) else {
            return Ok(());
        };
        if p.hold {
            return Err(RunError::Held {
                agent: a.into(),
                session: s.into(),
                since_ms: p.since_ms,
            });
        }
        match self.resume(a, s) {
            Ok(_) | Err(RunError::NotPaused { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Whether this supervisor paused session `a/s` (no file read: what
    /// the metrics count at each scrape).
    pub fn is_paused(&self, a: &str, s: &str) -> bool {
        let paused = self.paused.0.lock().unwrap_or_else(|e| e.into_inner());
        paused.contains_key(&key(a, s))
    }

    /// A session paused by an earlier supervisor (or by this one): its
    /// cgroup says so, and what was kept with it says since when, why and
    /// whether it is held.
    fn frozen_before(&self, a: &str, s: &str) -> Option<PauseInfo> {
        let dir = self.cgroups.session_dir(a, s);
        let f = std::fs::read_to_string(dir.join("cgroup.freeze")).ok()?;
        if f.trim() != "1" {
            return None;
        }
        let mut buf = [0u8; 1024];
        let kept = rustix::fs::getxattr(&dir, PAUSE_XATTR, &mut buf[..])
            .ok()
            .and_then(|n| serde_json::from_slice::<PauseInfo>(&buf[..n]).ok());
        Some(kept.unwrap_or_else(|| PauseInfo {
            since_ms: 0,
            reason: "earlier supervisor".into(),
            hold: false,
        }))
    }

    /// Keeps `info` with the session's cgroup, for a supervisor started
    /// again; a failure is logged (the pause holds, the next supervisor
    /// would not know its hold).
    fn keep_pause(&self, a: &str, s: &str, info: &PauseInfo) {
        let dir = self.cgroups.session_dir(a, s);
        let kept = serde_json::to_vec(info)
            .map_err(|e| e.to_string())
            .and_then(|v| {
                rustix::fs::setxattr(&dir, PAUSE_XATTR, &v, rustix::fs::XattrFlags::empty())
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = kept {
            tracing::warn!(agent = a, session = s, error = %e, "cannot keep the pause with the session's cgroup: a supervisor started again would not know its hold");
        }
    }

    /// Forgets what is kept of a deleted session (or of every session of
    /// a deleted agent): its pause, and its runs kept finished — a session
    /// made again under its name starts with neither.
    pub fn forget(&self, a: &str, s: Option<&str>) {
        let prefix = match s {
            Some(s) => key(a, s),
            None => format!("{a}/"),
        };
        self.paused
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| !k.starts_with(&prefix));
        self.finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget(&prefix);
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| !k.starts_with(&prefix));
    }
}

impl Runs {
    /// CPU time the session's processes and its context have used, µs
    /// (`usage_usec` of their cgroups' `cpu.stat`, which cgroup v2 keeps
    /// without the cpu controller).
    pub fn session_cpu_us(&self, a: &str, s: &str) -> u64 {
        self.pause_dirs(a, s)
            .iter()
            .filter_map(|d| std::fs::read_to_string(d.join("cpu.stat")).ok())
            .filter_map(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
            .sum()
    }
}
