//! Fences: sessions (or whole agents) where no new run may start while a
//! rollback or a delete works on them.
//!
//! A fence is a guard: it lifts when the guard is dropped, on every path
//! out of the fenced operation, an error or a panic included.

use std::collections::HashMap;
use std::sync::Mutex;

/// The session name that fences every session of an agent.
pub const WHOLE_AGENT: &str = "*";

#[derive(Debug, Default)]
pub struct Fences {
    /// Holders per (agent, session); counts, so overlapping operations
    /// nest.
    held: Mutex<HashMap<(String, String), u32>>,
}

/// New runs in a session (or agent) are refused while this lives.
#[must_use = "the fence lifts as soon as the guard is dropped"]
#[derive(Debug)]
pub struct Fence<'a> {
    fences: &'a Fences,
    key: (String, String),
}

impl Fences {
    /// Fences session `s` of agent `a` ([`WHOLE_AGENT`]: every session of
    /// it) until the guard is dropped.
    pub fn hold(&self, a: &str, s: &str) -> Fence<'_> {
        let key = (a.to_string(), s.to_string());
        *self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_insert(0) += 1;
        Fence { fences: self, key }
    }

    /// Whether runs may not start in session `s` of agent `a`.
    pub fn is_fenced(&self, a: &str, s: &str) -> bool {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.contains_key(&(a.to_string(), s.to_string()))
            || held.contains_key(&(a.to_string(), WHOLE_AGENT.to_string()))
    }
}

impl Drop for Fence<'_> {
    fn drop(&mut self) {
        let mut held = self.fences.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_lifts_when_its_operation_panics() {
        let f = Fences::default();
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _fence = f.hold("a", "s");
            assert!(f.is_fenced("a", "s"));
            panic!("the operation failed half-way");
        }));
        assert!(out.is_err());
        assert!(!f.is_fenced("a", "s"));
    }

    #[test]
    fn fences_nest_and_an_agent_fence_covers_its_sessions() {
        let f = Fences::default();
        let outer = f.hold("a", "s");
        let inner = f.hold("a", "s");
        drop(outer);
        assert!(f.is_fenced("a", "s"), "the inner holder still fences");
        drop(inner);
        assert!(!f.is_fenced("a", "s"));
        let agent = f.hold("a", WHOLE_AGENT);
        assert!(f.is_fenced("a", "s") && f.is_fenced("a", "t"));
        assert!(!f.is_fenced("b", "s"));
        drop(agent);
        assert!(!f.is_fenced("a", "t"));
    }
}
