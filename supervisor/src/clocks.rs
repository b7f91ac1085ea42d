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
    /// Each limited session's CPU time (µs) and when it last moved (ms;
    /// when this supervisor first saw it, at first).
    cpu: Mutex<HashMap<String, (u64, u64)>>,
    /// Expired sessions, with what a refused change is told.
    expired: RwLock<HashMap<String, String>>,
    /// Requests in progress that follow a run of each session (a start
    /// that waits, a wait, an attach, logs followed): while one is, the
    /// session is in use.
    following: Mutex<HashMap<String, usize>>,
}

/// A request that follows a run, counted while it is in progress.
pub struct InUse<'a> {
    clocks: &'a Clocks,
    key: Option<String>,
}

impl Drop for InUse<'_> {
    fn drop(&mut self) {
        let Some(k) = self.key.take() else { return };
        {
            let mut f = self
                .clocks
                .following
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Some(n) = f.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    f.remove(&k);
                }
            }
        }
        // Its idle time counts from the request's end.
        let mut a = self.clocks.active.lock().unwrap_or_else(|e| e.into_inner());
        a.insert(k, now_ms());
    }
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

    /// `req`, while it is answered: a request that follows a run (a
    /// `process.start` that waits, `process.wait`, `process.attach`,
    /// `process.logs` that follows) keeps
    /// its session from being paused as idle, however long the run sleeps
    /// (the pause froze the run under its waiting client, for ever).
    pub fn in_use(&self, req: &Request) -> InUse<'_> {
        let follows = match req {
            Request::ProcessStart(p) => p.wait,
            Request::ProcessLogs(l) => l.follow,
            Request::ProcessWait(_) | Request::ProcessAttach(_) => true,
            _ => false,
        };
        let key = follows.then(|| session_of(&req.target())).flatten();
        if let Some(k) = &key {
            let mut f = self.following.lock().unwrap_or_else(|e| e.into_inner());
            *f.entry(k.clone()).or_default() += 1;
        }
        InUse { clocks: self, key }
    }

    /// Why a change to the request's target is refused, if its session
    /// expired.
    pub fn expired_why(&self, target: &str) -> Option<String> {
        let k = session_of(target)?;
        let e = self.expired.read().unwrap_or_else(|e| e.into_inner());
        e.get(&k).cloned()
    }

    /// Session `a/s` (every session of agent `a` when `s` is `None`) was
    /// deleted: a session made again under its name starts with clocks of
    /// its own, not the deleted one's expiry.
    pub fn forget(&self, a: &str, s: Option<&str>) {
        let gone = |k: &String| match s {
            Some(s) => *k == format!("{a}/{s}"),
            None => k.split_once('/').is_some_and(|(x, _)| x == a),
        };
        self.expired
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| !gone(k));
        self.active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| !gone(k));
        self.cpu
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| !gone(k));
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
        // An expiry kept for a session that no longer has a record (it was
        // deleted) goes.
        {
            let limited: std::collections::HashSet<String> =
                all.iter().map(|(a, s, _)| format!("{a}/{s}")).collect();
            self.expired
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|k, _| limited.contains(k));
        }
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
            let in_use = self
                .following
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&k);
            let asked = if in_use {
                now
            } else {
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
                // First seen by this supervisor: whether it computed
                // before is not known, so it counts as moving now (a
                // restart must not pause a session that computes).
                let e = cpu.entry(k.clone()).or_insert((usage, now));
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
            // As a requested pause: a delete waits for it, and one that
            // came first is seen.
            let Ok(_w) = runs.writing(&a, &s) else {
                continue;
            };
            if !matches!(store.index().session(&a, &s), Ok(Some(_))) {
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
        // Recorded first, and only over the record judged: a
        // `session.update` that gave it more time meanwhile stands (it
        // was written over by this stale record, its answer undone).
        rec = match store.expire_clock(a, s, &rec, now) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(session = %k, error = %e.chain(), "cannot record a session's expiry");
                rec.expired_ms = Some(now);
                rec
            }
        };
        // Changes are refused from now, while its processes are killed.
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
