//! The connections being served, so that a new client is never locked out
//! by idle ones: at the limit, the connection idle the longest (no request
//! in flight) is closed to make room; only when every connection is busy
//! is the new one refused.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Notify;

/// One connection as the registry sees it.
pub struct Slot {
    id: u64,
    /// Milliseconds since the registry started, at the last frame received.
    last_active: AtomicU64,
    /// Requests being answered.
    busy: AtomicUsize,
    /// Told to close to make room for a new client.
    pub evicted: Notify,
}

impl Slot {
    pub fn touch(&self, reg: &Registry) {
        self.last_active.store(reg.now_ms(), Ordering::Relaxed);
    }

    /// Counts a request in flight until the guard is dropped.
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Busy(self.clone())
    }
}

/// A request in flight on a connection.
pub struct Busy(Arc<Slot>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

pub struct Registry {
    limit: usize,
    started: Instant,
    next: AtomicU64,
    slots: Mutex<Vec<Arc<Slot>>>,
}

/// Removes its slot from the registry when the connection ends.
pub struct Registered {
    pub reg: Arc<Registry>,
    pub slot: Arc<Slot>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut v = self.reg.slots.lock().unwrap_or_else(|p| p.into_inner());
        v.retain(|s| s.id != self.slot.id);
    }
}

impl Registry {
    pub fn new(limit: usize) -> Arc<Registry> {
        Arc::new(Registry {
            limit: limit.max(1),
            started: Instant::now(),
            next: AtomicU64::new(1),
            slots: Mutex::new(Vec::new()),
        })
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Admits a new connection, closing the longest-idle one if the limit
    /// is reached; `None` when every connection is busy.
    pub fn admit(self: &Arc<Self>) -> Option<Registered> {
        let mut v = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() >= self.limit {
            let idle = v
                .iter()
                .enumerate()
                .filter(|(_, s)| s.busy.load(Ordering::SeqCst) == 0)
                .min_by_key(|(_, s)| s.last_active.load(Ordering::Relaxed))
                .map(|(i, _)| i)?;
            let gone = v.swap_remove(idle);
            gone.evicted.notify_one();
        }
        let slot = Arc::new(Slot {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            last_active: AtomicU64::new(self.now_ms()),
            busy: AtomicUsize::new(0),
            evicted: Notify::new(),
        });
        v.push(slot.clone());
        Some(Registered {
            reg: self.clone(),
            slot,
        })
    }

    /// Connections being served.
    pub fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_idle_goes_and_busy_ones_stay() {
        let reg = Registry::new(2);
        let a = reg.admit().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = reg.admit().unwrap();
        b.slot.touch(&reg);
        // At the limit: `a` is the longest idle and is told to go.
        let c = reg.admit().unwrap();
        assert_eq!(reg.len(), 2);
        let ids: Vec<u64> = reg.slots.lock().unwrap().iter().map(|s| s.id).collect();
        assert!(!ids.contains(&a.slot.id) && ids.contains(&b.slot.id) && ids.contains(&c.slot.id));
        // With every connection busy, a new one is refused.
        let _busy_b = b.slot.busy();
        let _busy_c = c.slot.busy();
        assert!(reg.admit().is_none());
        drop(_busy_c);
        let d = reg.admit().unwrap();
        let ids: Vec<u64> = reg.slots.lock().unwrap().iter().map(|s| s.id).collect();
        assert_eq!(ids.len(), 2);
        assert!(ids.contains(&b.slot.id) && ids.contains(&d.slot.id));
        // An evicted connection's end does not take another's slot.
        drop(a);
        drop(c);
        assert_eq!(reg.len(), 2);
    }
}
