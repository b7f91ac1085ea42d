//! Crash points for tests: `ALLOX_FAILPOINTS=item[,item…]`, each item a
//! point's name with an optional action:
//!
//! - `name`: the process kills itself with SIGKILL there, exactly as a
//!   `kill -9` at that step would;
//! - `name=sync`: the same, after making the index durable, as a later
//!   operation's Begin would have before a power cut;
//! - `name=panic` or `name=panic:N`: the thread panics there, the first N
//!   times the point is reached (once without N), as a bug in that step
//!   would; the request fails and the process lives on;
//! - `name=delay:MS`: the thread sleeps there MS milliseconds, each time,
//!   as a slow disk would (for tests of what overlaps that step).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

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
    "session_fork.after_journal",
    "session_fork.after_baseline",
    "session_fork.after_current",
    "session_fork.after_commit",
    "session_import.after_journal",
    "session_import.after_current",
    "session_import.after_rename",
    "session_import.after_commit",
    "session_import_since.after_journal",
    "session_import_since.after_checkpoints",
    "session_import_since.after_exchange",
    "session_import_since.after_commit",
];

/// Points in the turn's requests (for tests of what overlaps them: no
/// crash there leaves anything to recover).
pub const TURNS: &[&str] = &["turn_begin.before_lock"];

/// Points in an import's reading (for tests of what overlaps them): a
/// stream received, before it is checked.
pub const IMPORTS: &[&str] = &["session_import.before_check"];

/// Points of `store.check` and of the removal of trashed trees (for tests
/// of a check beside deletes).
pub const CHECKS: &[&str] = &["check.after_wait", "reaper.before_remove"];

/// The supervisor's points before each installed plugin starts (a panic
/// there counts as that plugin failing to start); not the store's.
pub const PLUGIN_STARTS: &[&str] = &[
    "plugin_start.process-tree",
    "plugin_start.network",
    "plugin_start.share",
    "plugin_start.monitor",
    "plugin_start.system-effects",
];

/// The supervisor's points in the file API.
pub const FILES: &[&str] = &["fs_write.before_commit"];

/// The supervisor's points after each step of a run's start, in order
/// (`runs/start.rs`): after them, in turn, what the services attach to the
/// run (the in-sandbox interface's listener) exists; its cgroup exists;
/// the plugins have heard of it; its sandbox exists; its stdio is ready.
/// A panic at one fails that start, which must leave none of them.
pub const RUN_STARTS: &[&str] = &[
    "run_start.after_attach",
    "run_start.after_cgroup",
    "run_start.after_plugins",
    "run_start.after_spawn",
    "run_start.after_stdio",
];

/// The supervisor's points in an observed run's end (`runs/end.rs`): its
/// cgroup frozen with what is left listed; everything killed, the cgroup
/// empty and frozen, before the observer is told.
pub const RUN_ENDS: &[&str] = &["run_end.after_freeze", "run_end.after_kill"];

/// The supervisor's points in its own start: after the store is mounted
/// (its control ports already answer Hello), before it is opened.
pub const DAEMON_STARTS: &[&str] = &["daemon.before_store_open"];

/// The system-effects plugin's points in a protocol v3 run's recovery,
/// around the store's `rollback.*` ones: B's records durable and the
/// session fenced; the workspace restored by the recover tool (C is then
/// the observer's to capture).
pub const RECOVERY: &[&str] = &["effects_v3.after_fence", "effects_v3.after_restore"];

/// Whether `name` is a declared point.
fn declared(name: &str) -> bool {
    ALL.contains(&name)
        || PLUGIN_STARTS.contains(&name)
        || FILES.contains(&name)
        || RUN_STARTS.contains(&name)
        || RUN_ENDS.contains(&name)
        || RECOVERY.contains(&name)
        || DAEMON_STARTS.contains(&name)
        || TURNS.contains(&name)
        || IMPORTS.contains(&name)
        || CHECKS.contains(&name)
}

/// What an armed point does.
#[derive(Debug, Clone)]
enum Action {
    Kill,
    /// Panics while hits are left.
    Panic(Arc<AtomicU32>),
    /// Sleeps, each time; counts the times it was reached.
    Delay(std::time::Duration, Arc<AtomicU32>),
}

#[derive(Debug, Default, Clone)]
pub struct Failpoints {
    armed: HashMap<String, Action>,
    sync_first: HashSet<String>,
}

impl Failpoints {
    /// Reads `ALLOX_FAILPOINTS`.
    pub fn from_env() -> Self {
        Self::parse(&std::env::var("ALLOX_FAILPOINTS").unwrap_or_default())
    }

    /// Parses the `ALLOX_FAILPOINTS` syntax.
    pub fn parse(spec: &str) -> Self {
        let mut fp = Failpoints::default();
        for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, action) = match item.split_once('=') {
                Some((name, "sync")) => {
                    fp.sync_first.insert(name.to_string());
                    (name, Action::Kill)
                }
                Some((name, how)) if how == "panic" || how.starts_with("panic:") => {
                    let times = match how.strip_prefix("panic:") {
                        None => 1,
                        Some(n) => n.parse().unwrap_or_else(|_| {
                            tracing::warn!(%item, "failpoint count is not a number; panicking once");
                            1
                        }),
                    };
                    (name, Action::Panic(Arc::new(AtomicU32::new(times))))
                }
                Some((name, how)) if how.starts_with("delay:") => {
                    let ms = how["delay:".len()..].parse().unwrap_or_else(|_| {
                        tracing::warn!(%item, "failpoint delay is not a number; 1,000 ms");
                        1000
                    });
                    (
                        name,
                        Action::Delay(
                            std::time::Duration::from_millis(ms),
                            Arc::new(AtomicU32::new(0)),
                        ),
                    )
                }
                Some((name, how)) => {
                    tracing::warn!(%name, %how, "unknown failpoint action; killing there");
                    (name, Action::Kill)
                }
                None => (item, Action::Kill),
            };
            if !declared(name) {
                tracing::warn!(%name, "unknown failpoint armed");
            } else {
                tracing::warn!(%name, ?action, "failpoint armed");
            }
            fp.armed.insert(name.to_string(), action);
        }
        fp
    }

    /// How many times the delay armed at `name` was reached (by any clone
    /// of these failpoints): a test waits for a thread to be inside the
    /// window the delay opens.
    pub fn reached(&self, name: &str) -> u32 {
        match self.armed.get(name) {
            Some(Action::Delay(_, n)) => n.load(Ordering::SeqCst),
            _ => 0,
        }
    }

    /// Whether `name` asks for a durable index before the crash.
    pub fn sync_first(&self, name: &str) -> bool {
        self.sync_first.contains(name)
    }

    /// Dies with SIGKILL, or panics, if `name` is armed.
    pub fn hit(&self, name: &str) {
        debug_assert!(declared(name), "undeclared failpoint {name}");
        match self.armed.get(name) {
            None => {}
            Some(Action::Kill) => {
                tracing::error!(%name, "failpoint reached: killing the process");
                let _ = rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::KILL,
                );
            }
            Some(Action::Delay(d, reached)) => {
                tracing::warn!(%name, ?d, "failpoint reached: sleeping");
                reached.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(*d);
            }
            Some(Action::Panic(left)) => {
                let fire = left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
                if fire {
                    tracing::error!(%name, "failpoint reached: panicking");
                    panic!("failpoint {name} reached");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_point_fires_the_given_number_of_times() {
        let fp = Failpoints::parse("rollback.after_snapshot=panic:2, rollback.after_journal=panic");
        let fires = |name: &str| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fp.hit(name))).is_err()
        };
        assert!(fires("rollback.after_snapshot"));
        assert!(fires("rollback.after_snapshot"));
        assert!(!fires("rollback.after_snapshot"));
        assert!(fires("rollback.after_journal"));
        assert!(!fires("rollback.after_journal"));
        assert!(!fires("rollback.after_exchange"));
    }

    #[test]
    fn sync_arms_a_kill_after_a_durable_index() {
        let fp = Failpoints::parse("rollback.after_exchange=sync");
        assert!(fp.sync_first("rollback.after_exchange"));
        assert!(matches!(
            fp.armed.get("rollback.after_exchange"),
            Some(Action::Kill)
        ));
        assert!(!fp.sync_first("rollback.after_commit"));
    }
}
