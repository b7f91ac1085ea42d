//! The sessions the plugin has fenced, durable: one file per fenced
//! session, `state/effects/fences/<agent>/<session>.json`, written beside
//! and renamed over (and the directory synced) before the fence is said to
//! be up; read back at every start.
//!
//! Runs still being observed are durable too: a `pending` file in the
//! run's evidence directory from before the observer starts until its
//! evidence is closed. A supervisor that starts and finds one was stopped
//! in the middle of the protocol: that session is fenced.

use allox_protocol::EffectsFence;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The name of a run's pending marker.
pub const PENDING: &str = "pending";

pub struct Fences {
    dir: PathBuf,
    held: Mutex<BTreeMap<(String, String), EffectsFence>>,
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Writes `bytes` to `path` durably (beside it, synced, renamed over, the
/// directory synced).
pub fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_whole(path, bytes, true)
}

/// Writes `path` whole (a file beside it renamed into place) without
/// syncing it: made durable by the next commit of the filesystem's
/// transaction, which the caller waits for.
///
/// For the `pending` marker: written before the observer is told
/// `Begin`, in the run's evidence directory, where the observer's A
/// makes its read-only snapshot of the session's workspace: a Btrfs
/// snapshot is made by a commit of the whole filesystem's transaction,
/// which holds this rename (a commit waits for the transactions before
/// it), and A is sealed only once its snapshot is made. After a power cut
/// the marker exists (its bytes may not, as a file's data is written back
/// on its own: an empty marker is read as one that names no observer and
/// no cgroup, which a power cut has ended anyway).
pub fn write_for_the_next_commit(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_whole(path, bytes, false)
}

/// `bytes` into a file (0600) beside `path`, renamed over it; the file
/// and then the directory synced when `durably`.
fn write_whole(path: &Path, bytes: &[u8], durably: bool) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    if durably {
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if durably {
        sync_dir(dir)?;
    }
    Ok(())
}

impl Fences {
    /// Reads the fences under `dir` (`state/effects/fences`).
    pub fn load(dir: &Path) -> std::io::Result<Fences> {
        std::fs::create_dir_all(dir)?;
        let mut held = BTreeMap::new();
        for agent in std::fs::read_dir(dir)?.flatten() {
            let Ok(rd) = std::fs::read_dir(agent.path()) else {
                continue;
            };
            for f in rd.flatten() {
                let p = f.path();
                if p.extension().and_then(|e| e.to_str()) != Some("json") {
                    continue;
                }
                match std::fs::read(&p).map_err(|e| e.to_string()).and_then(|b| {
                    serde_json::from_slice::<EffectsFence>(&b).map_err(|e| e.to_string())
                }) {
                    Ok(fence) => {
                        held.insert((fence.agent_id.clone(), fence.session_id.clone()), fence);
                    }
                    Err(e) => {
                        // Unreadable is not lifted: the session stays fenced.
                        let agent = agent.file_name().to_string_lossy().into_owned();
                        let session = p
                            .file_stem()
                            .map(|s| s.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        tracing::error!(file = %p.display(), error = %e, "a fence file cannot be read; the session stays fenced");
                        held.insert(
                            (agent.clone(), session.clone()),
                            EffectsFence {
                                agent_id: agent,
                                session_id: session,
                                run_id: String::new(),
                                reason: format!("its fence file cannot be read ({e})"),
                                evidence_root: String::new(),
                                fenced_ms: 0,
                            },
                        );
                    }
                }
            }
        }
        Ok(Fences {
            dir: dir.to_path_buf(),
            held: Mutex::new(held),
        })
    }

    fn file(&self, a: &str, s: &str) -> PathBuf {
        self.dir.join(a).join(format!("{s}.json"))
    }

    /// Fences `fence`'s session, durably (a later fence of the same
    /// session replaces an earlier one: its run is the newer fault).
    pub fn fence(&self, fence: EffectsFence) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(&fence).map_err(std::io::Error::other)?;
        let key = (fence.agent_id.clone(), fence.session_id.clone());
        // In memory first: a failure to write keeps the session fenced
        // for this supervisor's life at least.
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, fence.clone());
        write_durably(&self.file(&fence.agent_id, &fence.session_id), &bytes)
    }

    /// The fence on `a/s`, if any.
    pub fn get(&self, a: &str, s: &str) -> Option<EffectsFence> {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(a.to_string(), s.to_string()))
            .cloned()
    }

    /// Every fence (of agent `a` when given).
    pub fn list(&self, a: Option<&str>) -> Vec<EffectsFence> {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|f| a.is_none_or(|a| f.agent_id == a))
            .cloned()
            .collect()
    }

    /// Lifts the fence on `a/s` (durably).
    pub fn lift(&self, a: &str, s: &str) -> std::io::Result<()> {
        let p = self.file(a, s);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if let Some(d) = p.parent() {
            let _ = sync_dir(d);
        }
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(a.to_string(), s.to_string()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_for_the_next_commit_is_whole_where_it_is_made_and_leaves_nothing_beside_it() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("run").join("pending");
        write_for_the_next_commit(&p, b"{\"started_ms\":1}").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"{\"started_ms\":1}");
        write_for_the_next_commit(&p, b"{}").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"{}");
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["pending"], "only the marker is left");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the marker is the supervisor's alone");
    }

    fn fence(a: &str, s: &str, run: &str) -> EffectsFence {
        EffectsFence {
            agent_id: a.into(),
            session_id: s.into(),
            run_id: run.into(),
            reason: "test".into(),
            evidence_root: "ab".repeat(32),
            fenced_ms: 1,
        }
    }

    #[test]
    fn fences_outlive_the_process_and_lift_only_theirs() {
        let d = tempfile::tempdir().unwrap();
        let f = Fences::load(d.path()).unwrap();
        f.fence(fence("a", "s1", "r1")).unwrap();
        f.fence(fence("a", "s2", "r2")).unwrap();
        f.fence(fence("b", "s1", "r3")).unwrap();
        drop(f);
        let f = Fences::load(d.path()).unwrap();
        assert_eq!(f.get("a", "s1").unwrap().run_id, "r1");
        assert_eq!(f.list(Some("a")).len(), 2);
        f.lift("a", "s1").unwrap();
        let f = Fences::load(d.path()).unwrap();
        assert!(f.get("a", "s1").is_none());
        assert!(f.get("a", "s2").is_some() && f.get("b", "s1").is_some());
    }

    #[test]
    fn an_unreadable_fence_file_keeps_its_session_fenced() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a")).unwrap();
        std::fs::write(d.path().join("a").join("s.json"), b"{torn").unwrap();
        let f = Fences::load(d.path()).unwrap();
        let got = f.get("a", "s").unwrap();
        assert!(got.reason.contains("cannot be read"), "{}", got.reason);
    }
}
