//! Limits over time: a session's idle timeout (no request for it and no
//! CPU used by its processes for that long → paused, reason `idle`) and
//! its lifetime (→ its processes killed, the session expired: changes
//! refused until `session.update` gives it more time or it is deleted;
//! its files and checkpoints kept).
//!
//! The times are the store's (`ClockRecord`: the timeout, the lifetime and
//! when it started, when it expired, when it was last seen active), so a
//! restarted supervisor keeps the clocks; what ticks here is a check every
//! [`TICK`], reading each limited session's record and CPU time.

use crate::runs::FenceScope;
use crate::runs::Runs;
use allox_protocol::Request;
use allox_store::audit::Entry;
use allox_store::clock::now_ms;
use allox_store::index::ClockRecord;
use allox_store::Store;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

/// How often the clocks are checked: an idle pause or an expiry comes at
/// most this late.
pub const TICK: Duration = Duration::from_millis(250);

/// A last-active time is written to the store when it moved this much
/// since it was last written.
const PERSIST_AFTER_MS: u64 = 1000;

#[derive(Default)]
pub struct Clocks {
    /// The last request for each session (`agent/session`), ms.
    active: Mutex<HashMap<String, u64>>,
    /// Each limited session's CPU time (µs) and when it last moved (ms; 0:
    /// not since this supervisor started).
    cpu: Mutex<HashMap<String, (u64, u64)>>,
    /// Expired sessions, with what a refused change is told.
    expired: RwLock<HashMap<String, String>>,
}

/// `agent/session` of a request's target, when it names a session.
fn session_of(target: &str) -> Option<String> {
    let mut parts = target.split('/');
    let a = parts.next().filter(|a| !a.is_empty())?;
    let s = parts.next()?.split(':').next().filter(|s| !s.is_empty())?;
    Some(format!("{a}/{s}"))
}

fn why(key: &str, rec: &ClockRecord, at: u64) -> String {
    format!(
        "session {key} expired at {at} ms after the epoch (max_lifetime {} ms): give it more time with session.update {{max_lifetime_ms}} or delete it",
        rec.max_lifetime_ms.unwrap_or(0)
    )
}

impl Clocks {
    /// The clocks as the store holds them: sessions that expired, or whose
    /// lifetime ended while no supervisor ran, are refused from the first
    /// request on (the first check kills their processes and records the
    /// expiry).
    pub fn from_store(store: &Store) -> Clocks {
        let c = Clocks::default();
        let now = now_ms();
        for (a, s, rec) in store.clocks().unwrap_or_default() {
            match (rec.expired_ms, rec.expires_ms()) {
                (Some(_), _) => c.refresh(&a, &s, &rec),
                (None, Some(end)) if now >= end => c.refresh(
                    &a,
                    &s,
                    &ClockRecord {
                        expired_ms: Some(end),
                        ..rec
                    },
                ),
                _ => {}
            }
        }
        c
    }

    /// A request that changes a session (a start, a write, a turn, a
    /// checkpoint…): its idle clock starts again. Reads (`session.info`,
    /// `fs.read`, `process.list`…) do not keep a session awake: a
    /// dashboard that looks at it is not using it.
    pub fn seen(&self, req: &Request) {
        if !req.is_mutating() {
            return;
        }
        if let Some(k) = session_of(&req.target()) {
            let mut a = self.active.lock().unwrap_or_else(|e| e.into_inner());
            a.insert(k, now_ms());
        }
    }

    /// Why a change to the request's target is refused, if its session
    /// expired.
    pub fn expired_why(&self, target: &str) -> Option<String> {
        let k = session_of(target)?;
        let e = self.expired.read().unwrap_or_else(|e| e.into_inner());
        e.get(&k).cloned()
    }

    /// What a session's record says now (after `session.update`).
    pub fn refresh(&self, a: &str, s: &str, rec: &ClockRecord) {
        let k = format!("{a}/{s}");
        let mut e = self.expired.write().unwrap_or_else(|e| e.into_inner());
        match rec.expired_ms {
            Some(at) => {
                e.insert(k.clone(), why(&k, rec, at));
            }
            None => {
                e.remove(&k);
            }
        }
    }

    /// One check of every limited session: expiries first, then idle
    /// pauses. Runs on a blocking thread.
    pub fn tick(&self, store: &Store, runs: Option<&Arc<Runs>>) {
        let Ok(all) = store.clocks() else {
            return;
        };
        let now = now_ms();
        let mut seen = Vec::new();
        for (a, s, rec) in all {
            let k = format!("{a}/{s}");
            if rec.expired_ms.is_none() && rec.expires_ms().is_some_and(|end| now >= end) {
                // (Refused already, when it ended while no supervisor ran.)
                self.expire(store, runs, &a, &s, rec, now);
                continue;
            }
            self.refresh(&a, &s, &rec);
            if rec.expired_ms.is_some() {
                continue;
            }
            let (Some(idle), Some(runs)) = (rec.idle_timeout_ms, runs) else {
                continue;
            };
            let asked = {
                let active = self.active.lock().unwrap_or_else(|e| e.into_inner());
                active.get(&k).copied().unwrap_or(0)
            };
            if asked > rec.last_active_ms + PERSIST_AFTER_MS {
                seen.push((a.clone(), s.clone(), asked));
            }
            if runs.paused(&a, &s).is_some() {
                continue;
            }
            let usage = runs.session_cpu_us(&a, &s);
            let moved = {
                let mut cpu = self.cpu.lock().unwrap_or_else(|e| e.into_inner());
                let e = cpu.entry(k.clone()).or_insert((usage, 0));
                if e.0 != usage {
                    *e = (usage, now);
                }
                e.1
            };
            let last = rec
                .lifetime_from_ms
                .max(rec.last_active_ms)
                .max(asked)
                .max(moved);
            if now.saturating_sub(last) < idle {
                continue;
            }
            match runs.pause(&a, &s, false, "idle") {
                Ok(_) => audit(
                    store,
                    &k,
                    "session.idle",
                    format!("idle for {idle} ms: paused"),
                ),
                Err(e) => {
                    tracing::warn!(session = %k, error = %e.chain(), "cannot pause an idle session")
                }
            }
        }
        if !seen.is_empty() {
            if let Err(e) = store.touch_clocks(&seen) {
                tracing::warn!(error = %e.chain(), "cannot record when sessions were last active");
            }
        }
    }

    /// Ends session `a/s`'s lifetime: its processes (its context too)
    /// killed, the expiry written durably, changes refused from now on.
    fn expire(
        &self,
        store: &Store,
        runs: Option<&Arc<Runs>>,
        a: &str,
        s: &str,
        mut rec: ClockRecord,
        now: u64,
    ) {
        let k = format!("{a}/{s}");
        // Changes are refused from now, while its processes are killed.
        rec.expired_ms = Some(now);
        self.refresh(a, s, &rec);
        if let Some(runs) = runs {
            // Frozen processes die as well; the session is let go first so
            // that a later run is not born frozen.
            let _ = runs.resume(a, s);
            let dir = runs.cgroups().session_dir(a, s);
            let killed = runs.fenced(FenceScope::session(a, s), || {
                let n = if dir.is_dir() {
                    runs.kill_tree(&dir, false)?
                } else {
                    0
                };
                runs.end_context(a, s)?;
                Ok::<_, crate::runs::RunError>(n)
            });
            if let Err(e) = killed {
                tracing::error!(session = %k, error = %e.chain(), "cannot kill an expired session's processes");
            }
        }
        if let Err(e) = store.set_clock(a, s, &rec) {
            tracing::error!(session = %k, error = %e.chain(), "cannot record a session's expiry");
        }
        audit(
            store,
            &k,
            "session.expire",
            format!(
                "max_lifetime {} ms reached: processes killed, changes refused",
                rec.max_lifetime_ms.unwrap_or(0)
            ),
        );
        tracing::info!(session = %k, "session expired");
    }
}

fn audit(store: &Store, target: &str, action: &str, message: String) {
    let r = store.audit().append(Entry {
        request_id: 0,
        peer: "clock".into(),
        action: action.into(),
        target: target.into(),
        outcome: "ok".into(),
        message: Some(message),
    });
    if let Err(e) = r {
        tracing::error!(error = %allox_protocol::error_chain(&e), "cannot append audit record");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_names_its_session_or_none() {
        assert_eq!(session_of("a/s").as_deref(), Some("a/s"));
        assert_eq!(session_of("a/s/r").as_deref(), Some("a/s"));
        assert_eq!(session_of("a/s:d/f").as_deref(), Some("a/s"));
        assert_eq!(session_of("a/s/c->b/t").as_deref(), Some("a/s"));
        assert_eq!(session_of("a"), None);
        assert_eq!(session_of(""), None);
    }
}
