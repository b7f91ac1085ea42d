//! Fences: sessions (or whole agents) where no new run may start, and no
//! file be written, while a rollback or a delete works on them.
//!
//! A fence is a guard: it lifts when the guard is dropped, on every path
//! out of the fenced operation, an error or a panic included. File writes
//! hold a writer's guard instead: a fence waits for the writers already in
//! a session to finish before it is up, and new ones are refused while it
//! is; so a write lands in the tree that is current when it returns, never
//! in one a rollback is replacing.

use super::{RunError, Runs};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};

/// What a fence covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FenceScope {
    /// One session of an agent.
    Session { agent: String, session: String },
    /// Every session of an agent.
    Agent(String),
}

impl FenceScope {
    pub fn session(agent: &str, session: &str) -> FenceScope {
        FenceScope::Session {
            agent: agent.to_string(),
            session: session.to_string(),
        }
    }

    pub fn agent(agent: &str) -> FenceScope {
        FenceScope::Agent(agent.to_string())
    }
}

#[derive(Debug, Default)]
pub struct Fences {
    state: Mutex<State>,
    /// Signalled when a session's last writer leaves.
    drained: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Holders per scope; counts, so overlapping operations nest.
    held: HashMap<FenceScope, u32>,
    /// File writes going on, per (agent, session).
    writers: HashMap<(String, String), u32>,
    /// Deletes going on: one of a session or an agent at a time.
    deleting: std::collections::HashSet<FenceScope>,
}

/// The turn of one delete of a session or an agent; the next delete of it
/// goes when this is dropped.
#[must_use = "the next delete goes as soon as the guard is dropped"]
#[derive(Debug)]
pub struct DeleteTurn<'a> {
    fences: &'a Fences,
    scope: FenceScope,
}

impl Drop for DeleteTurn<'_> {
    fn drop(&mut self) {
        let mut st = self.fences.state.lock().unwrap_or_else(|p| p.into_inner());
        st.deleting.remove(&self.scope);
        self.fences.drained.notify_all();
    }
}

impl State {
    fn fenced(&self, a: &str, s: &str) -> bool {
        self.held.contains_key(&FenceScope::session(a, s))
            || self.held.contains_key(&FenceScope::agent(a))
    }

    fn writers_in(&self, scope: &FenceScope) -> bool {
        self.writers.keys().any(|(a, s)| match scope {
            FenceScope::Session { agent, session } => a == agent && s == session,
            FenceScope::Agent(agent) => a == agent,
        })
    }
}

/// A file write going on in a session: fences wait for it.
#[must_use = "the write is over as soon as the guard is dropped"]
#[derive(Debug)]
pub struct Writer<'a> {
    fences: &'a Fences,
    key: (String, String),
}

/// New runs in a session (or agent) are refused while this lives.
#[must_use = "the fence lifts as soon as the guard is dropped"]
#[derive(Debug)]
pub struct Fence<'a> {
    fences: &'a Fences,
    scope: FenceScope,
}

impl Fences {
    /// Fences `scope` until the guard is dropped; returns once the file
    /// writes already going on in it are over (new ones are refused from
    /// the start).
    pub fn hold(&self, scope: FenceScope) -> Fence<'_> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *st.held.entry(scope.clone()).or_insert(0) += 1;
        while st.writers_in(&scope) {
            st = self.drained.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        Fence {
            fences: self,
            scope,
        }
    }

    /// Whether runs may not start in session `s` of agent `a`: that
    /// session or the whole agent is fenced.
    pub fn is_fenced(&self, a: &str, s: &str) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .fenced(a, s)
    }

    /// Why `a/s` is fenced: its whole agent being deleted (said as such: a
    /// session being made in it was told it was being deleted), or itself.
    pub fn refusal(&self, a: &str, s: &str) -> RunError {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.held.contains_key(&FenceScope::agent(a)) {
            return RunError::AgentFenced {
                agent: a.to_string(),
            };
        }
        RunError::Fenced {
            agent: a.to_string(),
            session: s.to_string(),
        }
    }

    /// A file write in session `s` of agent `a`; `None` while it is fenced.
    pub fn writing(&self, a: &str, s: &str) -> Option<Writer<'_>> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.fenced(a, s) {
            return None;
        }
        let key = (a.to_string(), s.to_string());
        *st.writers.entry(key.clone()).or_insert(0) += 1;
        Some(Writer { fences: self, key })
    }
}

impl Drop for Writer<'_> {
    fn drop(&mut self) {
        let mut st = self.fences.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = st.writers.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                st.writers.remove(&self.key);
                self.fences.drained.notify_all();
            }
        }
    }
}

impl Drop for Fence<'_> {
    fn drop(&mut self) {
        let mut st = self.fences.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = st.held.get_mut(&self.scope) {
            *n -= 1;
            if *n == 0 {
                st.held.remove(&self.scope);
            }
        }
    }
}

impl Runs {
    /// Waits for any other delete of `scope` (the same session, or the
    /// same agent) to end: two at once took each other's cgroups from
    /// under them and answered `internal`; the second now finds it gone.
    pub fn delete_turn(&self, scope: FenceScope) -> DeleteTurn<'_> {
        let f = &self.fences;
        let mut st = f.state.lock().unwrap_or_else(|p| p.into_inner());
        while st.deleting.contains(&scope) {
            st = f.drained.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.deleting.insert(scope.clone());
        DeleteTurn { fences: f, scope }
    }

    /// Refuses new runs in `scope` until the guard is dropped.
    pub fn fence(&self, scope: FenceScope) -> Fence<'_> {
        self.fences.hold(scope)
    }

    /// Runs `f` with new runs in `scope` refused; they are allowed again
    /// however `f` ends, a panic included.
    pub fn fenced<T>(&self, scope: FenceScope, f: impl FnOnce() -> T) -> T {
        let _fence = self.fence(scope);
        f()
    }

    /// A file write in session `s` of agent `a`, refused while it is
    /// fenced; a rollback or delete waits for it to be dropped.
    pub fn writing(&self, a: &str, s: &str) -> Result<Writer<'_>, RunError> {
        self.fences
            .writing(a, s)
            .ok_or_else(|| self.fences.refusal(a, s))
    }

    /// Fails while session `s` of agent `a` is fenced.
    pub(super) fn check_fence(&self, a: &str, s: &str) -> Result<(), RunError> {
        if self.fences.is_fenced(a, s) {
            return Err(self.fences.refusal(a, s));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_lifts_when_its_operation_panics() {
        let f = Fences::default();
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _fence = f.hold(FenceScope::session("a", "s"));
            assert!(f.is_fenced("a", "s"));
            panic!("the operation failed half-way");
        }));
        assert!(out.is_err());
        assert!(!f.is_fenced("a", "s"));
    }

    #[test]
    fn a_refusal_names_what_is_fenced() {
        let f = Fences::default();
        let agent = f.hold(FenceScope::agent("a"));
        assert_eq!(
            f.refusal("a", "new").to_string(),
            "agent a is being deleted"
        );
        drop(agent);
        let _s = f.hold(FenceScope::session("a", "s"));
        assert_eq!(
            f.refusal("a", "s").to_string(),
            "session a/s is being rolled back or deleted"
        );
    }

    #[test]
    fn fences_nest_and_an_agent_fence_covers_its_sessions() {
        let f = Fences::default();
        let outer = f.hold(FenceScope::session("a", "s"));
        let inner = f.hold(FenceScope::session("a", "s"));
        drop(outer);
        assert!(f.is_fenced("a", "s"), "the inner holder still fences");
        drop(inner);
        assert!(!f.is_fenced("a", "s"));
        let agent = f.hold(FenceScope::agent("a"));
        assert!(f.is_fenced("a", "s") && f.is_fenced("a", "t"));
        assert!(!f.is_fenced("b", "s"));
        drop(agent);
        assert!(!f.is_fenced("a", "t"));
    }

    #[test]
    fn a_fence_waits_for_writers_and_refuses_new_ones() {
        let f = std::sync::Arc::new(Fences::default());
        let w = f.writing("a", "s").unwrap();
        let other = f.writing("a", "t").unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let g = f.clone();
        let t = std::thread::spawn(move || {
            let _fence = g.hold(FenceScope::session("a", "s"));
            tx.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
        });
        // Up (new writers refused) but not yet returned: one is going on.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(f.writing("a", "s").is_none());
        assert!(rx.try_recv().is_err(), "the fence did not wait");
        drop(w);
        rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
        // Another session's writer was never waited for.
        drop(other);
        t.join().unwrap();
        assert!(f.writing("a", "s").is_some());
    }

    #[test]
    fn a_session_named_like_a_wildcard_is_only_that_session() {
        let f = Fences::default();
        let _star = f.hold(FenceScope::session("a", "*"));
        assert!(f.is_fenced("a", "*"));
        assert!(!f.is_fenced("a", "s"));
    }
}
