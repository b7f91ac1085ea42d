//! Crash points for tests: `ALLOX_FAILPOINTS=name[,name…]` makes the
//! process kill itself with SIGKILL when it reaches a named point, exactly
//! as a `kill -9` or a power cut at that step would.

use std::collections::HashSet;

/// Every failpoint in the store, in the order an operation reaches them.
pub const ALL: &[&str] = &[
    "agent_create.after_mkdir",
    "agent_create.before_commit",
    "agent_delete.after_rename",
    "agent_delete.after_commit",
    "session_create.after_subvolume",
    "session_create.before_commit",
    "session_delete.after_rename",
    "session_delete.after_commit",
    "checkpoint_create.after_journal",
    "checkpoint_create.after_snapshot",
    "checkpoint_create.after_commit",
    "checkpoint_delete.after_rename",
    "checkpoint_delete.after_commit",
    "rollback.after_journal",
    "rollback.after_snapshot",
    "rollback.after_exchange",
    "rollback.after_commit",
];

#[derive(Debug, Default, Clone)]
pub struct Failpoints {
    armed: HashSet<String>,
}

impl Failpoints {
    /// Reads `ALLOX_FAILPOINTS`.
    pub fn from_env() -> Self {
        let armed: HashSet<String> = std::env::var("ALLOX_FAILPOINTS")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        for name in &armed {
            if !ALL.contains(&name.as_str()) {
                tracing::warn!(%name, "unknown failpoint armed");
            } else {
                tracing::warn!(%name, "failpoint armed: the process will kill itself there");
            }
        }
        Failpoints { armed }
    }

    /// Dies with SIGKILL if `name` is armed.
    pub fn hit(&self, name: &str) {
        debug_assert!(ALL.contains(&name), "undeclared failpoint {name}");
        if self.armed.contains(name) {
            tracing::error!(%name, "failpoint reached: killing the process");
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::KILL,
            );
        }
    }
}
