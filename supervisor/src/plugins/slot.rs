//! What a plugin holds between `start` and `stop`: empty before and
//! after, shared with the hooks and routes while it runs.

use std::sync::{Arc, Mutex};

pub struct Slot<T>(Mutex<Option<Arc<T>>>);

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot(Mutex::new(None))
    }
}

impl<T> Slot<T> {
    /// What `start` acquired, while the plugin runs.
    pub fn get(&self) -> Option<Arc<T>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `start` succeeded with `v`.
    pub fn fill(&self, v: T) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(v));
    }

    /// `stop`: what was held, dropped once its last user lets go.
    pub fn empty(&self) -> Option<Arc<T>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}
