//! Fences: sessions (or whole agents) where no new run may start while a
//! rollback or a delete works on them.
//!
//! A fence is a guard: it lifts when the guard is dropped, on every path
//! out of the fenced operation, an error or a panic included.

use super::{RunError, Runs};
use std::collections::HashMap;
use std::sync::Mutex;

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
    /// Holders per scope; counts, so overlapping operations nest.
    held: Mutex<HashMap<FenceScope, u32>>,
}

/// New runs in a session (or agent) are refused while this lives.
#[must_use = "the fence lifts as soon as the guard is dropped"]
#[derive(Debug)]
pub struct Fence<'a> {
    fences: &'a Fences,
    scope: FenceScope,
}

impl Fences {
    /// Fences `scope` until the guard is dropped.
    pub fn hold(&self, scope: FenceScope) -> Fence<'_> {
        *self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(scope.clone())
            .or_insert(0) += 1;
        Fence {
            fences: self,
            scope,
        }
    }

    /// Whether runs may not start in session `s` of agent `a`: that
    /// session or the whole agent is fenced.
    pub fn is_fenced(&self, a: &str, s: &str) -> bool {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.contains_key(&FenceScope::session(a, s)) || held.contains_key(&FenceScope::agent(a))
    }
}

impl Drop for Fence<'_> {
    fn drop(&mut self) {
        let mut held = self.fences.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.scope) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.scope);
            }
        }
    }
}

impl Runs {
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

    /// Fails while session `s` of agent `a` is fenced.
    pub(super) fn check_fence(&self, a: &str, s: &str) -> Result<(), RunError> {
        if self.fences.is_fenced(a, s) {
            return Err(RunError::Fenced {
                agent: a.to_string(),
                session: s.to_string(),
            });
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
    fn a_session_named_like_a_wildcard_is_only_that_session() {
        let f = Fences::default();
        let _star = f.hold(FenceScope::session("a", "*"));
        assert!(f.is_fenced("a", "*"));
        assert!(!f.is_fenced("a", "s"));
    }
}
