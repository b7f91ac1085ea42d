//! Where everything lives under the store root.
//!
//! ```text
//! <root>/agents/<agent>/workspace/                  subvolume
//!                        ├── shared/
//!                        └── sessions/<session>/
//!                            ├── current/            subvolume
//!                            └── checkpoints/<ckpt>/ read-only subvolumes
//! <root>/state/                                      index, journal, audit
//! ```
//!
//! Names the store makes for itself (in-flight and trashed trees) start with
//! `.`, which no valid ID does, so they never collide with user names.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Layout { root: root.into() }
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn agents_dir(&self) -> PathBuf {
        self.root.join("agents")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.root.join("state")
    }
    pub fn agent_dir(&self, a: &str) -> PathBuf {
        self.agents_dir().join(a)
    }
    pub fn workspace(&self, a: &str) -> PathBuf {
        self.agent_dir(a).join("workspace")
    }
    pub fn shared(&self, a: &str) -> PathBuf {
        self.workspace(a).join("shared")
    }
    pub fn sessions_dir(&self, a: &str) -> PathBuf {
        self.workspace(a).join("sessions")
    }
    pub fn session_dir(&self, a: &str, s: &str) -> PathBuf {
        self.sessions_dir(a).join(s)
    }
    pub fn current(&self, a: &str, s: &str) -> PathBuf {
        self.session_dir(a, s).join("current")
    }
    pub fn checkpoints_dir(&self, a: &str, s: &str) -> PathBuf {
        self.session_dir(a, s).join("checkpoints")
    }
    pub fn checkpoint(&self, a: &str, s: &str, c: &str) -> PathBuf {
        self.checkpoints_dir(a, s).join(c)
    }
    /// The writable snapshot a rollback builds before swapping it in.
    pub fn rollback_tmp(&self, a: &str, s: &str, op: u64) -> PathBuf {
        self.session_dir(a, s).join(format!(".rollback-{op}"))
    }
    /// Where a deleted tree waits, in the same directory (and so the same
    /// subvolume) as the tree itself, for its removal.
    pub fn trash(dir: &Path, op: u64) -> PathBuf {
        dir.join(format!(".trash-{op}"))
    }
}
