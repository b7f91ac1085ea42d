//! Crash points for tests: `ALLOX_FAILPOINTS=name[,name…]` makes the
//! process kill itself with SIGKILL when it reaches a named point, exactly
//! as a `kill -9` at that step would. `name=sync` first makes the index
//! durable, as a later operation's Begin would have before a power cut.

use std::collections::HashSet;

/// Every failpoint in the store, in the order an operation reaches them.
pub const ALL: &[&str] = &[
    "agent_create.after_mkdir",
    "agent_create.before_commit",
    "agent_delete.after_commit",
    "agent_delete.after_rename",
    "session_create.after_subvolume",
    "session_create.before_commit",
    "session_delete.after_commit",
    "session_delete.after_rename",
    "checkpoint_create.after_journal",
    "checkpoint_create.after_snapshot",
    "checkpoint_create.after_commit",
    "checkpoint_delete.after_commit",
    "checkpoint_delete.after_rename",
    "rollback.after_journal",
    "rollback.after_snapshot",
    "rollback.after_exchange",
    "rollback.after_commit",
];

#[derive(Debug, Default, Clone)]
pub struct Failpoints {
    armed: HashSet<String>,
    sync_first: HashSet<String>,
}

impl Failpoints {
    /// Reads `ALLOX_FAILPOINTS`.
    pub fn from_env() -> Self {
        let mut armed = HashSet::new();
        let mut sync_first = HashSet::new();
        for item in std::env::var("ALLOX_FAILPOINTS")
            .unwrap_or_default()
            .split(',')
        {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            match item.split_once('=') {
                Some((name, "sync")) => {
                    sync_first.insert(name.to_string());
                    armed.insert(name.to_string());
                }
                _ => {
                    armed.insert(item.to_string());
                }
            }
        }
        for name in &armed {
            if !ALL.contains(&name.as_str()) {
                tracing::warn!(%name, "unknown failpoint armed");
            } else {
                tracing::warn!(%name, "failpoint armed: the process will kill itself there");
            }
        }
        Failpoints { armed, sync_first }
    }

    /// Whether `name` asks for a durable index before the crash.
    pub fn sync_first(&self, name: &str) -> bool {
        self.sync_first.contains(name)
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
