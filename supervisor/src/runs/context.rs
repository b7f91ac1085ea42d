//! Session contexts: one per session that has run something, made on its
//! first run, kept across rollbacks (which kill the session's processes,
//! not its context), rebuilt on the next run when it died, and ended with
//! `session.delete` and `agent.delete`.
//!
//! A context's process lives in its own cgroup beside the session's
//! ([`Cgroups::context_dir`](allox_sandbox::cgroup::Cgroups::context_dir)).
//! Requests to one context go one at a time (its slot's lock), as the
//! context serves them.

use super::{RunError, Runs};
use crate::plugin_api::{ContextGuard, SessionNetwork, SessionRef};
use allox_protocol::NetworkMode;
use allox_sandbox::{Context, ContextSpec, SandboxError, SandboxSpec, Spawned};
use rustix::fd::OwnedFd;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A session's context, once made; `closed` once the session is gone (a
/// start that picked the slot up before cannot make a new one).
#[derive(Default)]
pub(super) struct Slot {
    ctx: Option<ContextWithGuards>,
    closed: bool,
}

/// A context and what the plugins hold for it; the plugins' part is
/// dropped first (in the reverse order of their load), then the context
/// is killed.
pub(super) struct ContextWithGuards {
    held: Vec<ContextGuard>,
    ctx: Context,
}

impl Drop for ContextWithGuards {
    fn drop(&mut self) {
        while let Some(g) = self.held.pop() {
            drop(g);
        }
    }
}

pub(super) type Slots = Mutex<HashMap<String, Arc<Mutex<Slot>>>>;

impl Runs {
    fn slot(&self, a: &str, s: &str) -> Arc<Mutex<Slot>> {
        self.contexts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(super::key(a, s, ""))
            .or_default()
            .clone()
    }

    /// Starts a run of `spec` in the cgroup `cg` through the session's
    /// context, making the context first if there is none (or it died).
    /// Blocking.
    pub(super) fn spawn_in_context(
        &self,
        a: &str,
        s: &str,
        network: &SessionNetwork,
        spec: &SandboxSpec,
        cg: &OwnedFd,
    ) -> Result<Spawned, RunError> {
        let slot = self.slot(a, s);
        let mut g = slot.lock().unwrap_or_else(|e| e.into_inner());
        // A delete ends the context under this lock, after its fence went
        // up: checked here, no context outlives its session.
        self.check_fence(a, s)?;
        if g.closed {
            return Err(RunError::Fenced {
                agent: a.to_string(),
                session: s.to_string(),
            });
        }
        if g.ctx.as_ref().is_some_and(|m| !m.ctx.is_alive()) {
            tracing::warn!(agent = %a, session = %s, "the session's context died; making a new one");
            g.ctx = None;
        }
        let ctx = match g.ctx.take() {
            Some(c) => c,
            None => self.make_context(a, s, network)?,
        };
        match ctx.ctx.spawn(spec, cg) {
            Ok(sp) => {
                g.ctx = Some(ctx);
                Ok(sp)
            }
            // The context is fine; this run is not: said as the limit it
            // met, if a process limit is reached (it was `internal`).
            Err(e @ SandboxError::Refused(_)) => {
                g.ctx = Some(ctx);
                Err(match self.pids_full(a, s) {
                    Some(why) => RunError::PidsLimit { why },
                    None => RunError::Spawn(e),
                })
            }
            Err(e) => {
                tracing::warn!(agent = %a, session = %s, error = %e.chain(), "the session's context failed; the next run makes a new one");
                drop(ctx);
                let _ = self.cgroups.remove(&self.cgroups.context_dir(a, s));
                Err(RunError::Spawn(e))
            }
        }
    }

    /// Which process limit session `a/s` is at, if one is: its own
    /// `pids.max`, or that of all sessions together (`--sessions-pids-max`).
    pub(super) fn pids_full(&self, a: &str, s: &str) -> Option<String> {
        let at_max = |dir: &std::path::Path| -> Option<u64> {
            let read = |f: &str| {
                std::fs::read_to_string(dir.join(f))
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            let (now, max) = (read("pids.current")?, read("pids.max")?);
            (now >= max).then_some(max)
        };
        if let Some(max) = at_max(&self.cgroups.session_dir(a, s)) {
            return Some(format!(
                "session {a}/{s} is at its pids.max ({max} processes)"
            ));
        }
        at_max(self.cgroups.base()).map(|max| {
            format!("all sessions together are at their pids.max ({max} processes, --sessions-pids-max)")
        })
    }

    /// The session's context, made now if it has none (or a dead one):
    /// its PID. An observed run's baseline sees the namespaces its sandbox
    /// will be made in. Blocking.
    pub(super) fn ensure_context(
        &self,
        a: &str,
        s: &str,
        network: &SessionNetwork,
    ) -> Result<i32, RunError> {
        self.context_of(a, s, network, false)
    }

    /// The session's context, made now if it has none, a dead one, or
    /// `renew` (the old one dropped: its process killed and reaped, its
    /// guards released).
    fn context_of(
        &self,
        a: &str,
        s: &str,
        network: &SessionNetwork,
        renew: bool,
    ) -> Result<i32, RunError> {
        let slot = self.slot(a, s);
        let mut g = slot.lock().unwrap_or_else(|e| e.into_inner());
        self.check_fence(a, s)?;
        if g.closed {
            return Err(RunError::Fenced {
                agent: a.to_string(),
                session: s.to_string(),
            });
        }
        if renew || g.ctx.as_ref().is_some_and(|m| !m.ctx.is_alive()) {
            g.ctx = None;
        }
        if g.ctx.is_none() {
            g.ctx = Some(self.make_context(a, s, network)?);
        }
        Ok(g.ctx.as_ref().map(|m| m.ctx.pid()).unwrap_or(0))
    }

    /// Whether a session of network mode `mode` has a network namespace
    /// of its own: `isolated` and `proxy` always, `disabled` as the daemon
    /// has it (`--sandbox-network`).
    pub(super) fn isolates(&self, mode: NetworkMode) -> bool {
        mode != NetworkMode::Disabled || self.cfg.isolate_network
    }

    fn make_context(
        &self,
        a: &str,
        s: &str,
        network: &SessionNetwork,
    ) -> Result<ContextWithGuards, RunError> {
        let cg = self.cgroups.create_context(a, s)?;
        let files = self.session_files();
        let spec = ContextSpec {
            stage: self.cfg.stage.clone(),
            system_dirs: self.cfg.system_dirs.clone(),
            hostname: "allox".into(),
            isolate_network: self.isolates(network.mode),
            uid: self.cfg.uid,
            gid: self.cfg.gid,
            binds: files.binds.clone(),
            links: files.links.clone(),
            prepare_ahead: self.cfg.prepare_runs && !self.cfg.plugins.observes_runs(),
            no_reflinks: self.cfg.no_reflinks,
        };
        let ctx = Context::start(&self.exe, &cg, &spec).map_err(|e| {
            let _ = self.cgroups.remove(&self.cgroups.context_dir(a, s));
            RunError::Spawn(e)
        })?;
        // Before any run: what the plugins set up in the session's
        // namespaces (the network plugin's proxy listener).
        let session = SessionRef {
            agent: a,
            session: s,
            network,
        };
        match self.cfg.plugins.session_context(&session, ctx.pidfd()) {
            Ok(held) => Ok(ContextWithGuards { held, ctx }),
            Err(e) => {
                drop(ctx);
                let _ = self.cgroups.remove(&self.cgroups.context_dir(a, s));
                Err(RunError::Plugin(e))
            }
        }
    }

    /// PID of the session's context process, if it has one.
    pub fn context_pid(&self, a: &str, s: &str) -> Option<i32> {
        self.with_context(a, s, |m| Some(m.ctx.pid()))
    }

    /// `f` of the session's context, if it has one (its slot held).
    fn with_context<T>(
        &self,
        a: &str,
        s: &str,
        f: impl FnOnce(&ContextWithGuards) -> Option<T>,
    ) -> Option<T> {
        let slot = self
            .contexts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&super::key(a, s, ""))
            .cloned()?;
        let g = slot.lock().unwrap_or_else(|e| e.into_inner());
        g.ctx.as_ref().and_then(f)
    }

    /// The PID of the session's live context process (its namespaces are
    /// the session's) and a descriptor of it, if it has one.
    pub fn context_pidfd(&self, a: &str, s: &str) -> Option<(i32, rustix::fd::OwnedFd)> {
        self.with_context(a, s, |m| {
            m.ctx.is_alive().then_some(())?;
            Some((m.ctx.pid(), m.ctx.pidfd().try_clone_to_owned().ok()?))
        })
    }

    /// Whether a session of network mode `mode` has a network namespace
    /// of its own (what its ports are on).
    pub fn has_own_network(&self, mode: NetworkMode) -> bool {
        self.isolates(mode)
    }

    /// Ends the session's context: its process killed and reaped, its
    /// cgroup removed. For `session.delete`, with the session fenced.
    /// Blocking.
    pub fn end_context(&self, a: &str, s: &str) -> Result<(), RunError> {
        let slot = self
            .contexts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&super::key(a, s, ""));
        if let Some(slot) = slot {
            let mut g = slot.lock().unwrap_or_else(|e| e.into_inner());
            g.closed = true;
            g.ctx = None;
        }
        // Also one left by an earlier supervisor.
        let dir = self.cgroups.context_dir(a, s);
        self.cgroups.kill(&dir, Duration::from_secs(10))?;
        self.cgroups.remove(&dir)?;
        Ok(())
    }

    /// Replaces the session's context with a new one, made as for a first
    /// run (the plugins' `session_context` heard again): the old one's
    /// process killed, everything in its cgroup killed. For system
    /// effects' `scrub_runtime`, while an observed run holds the session
    /// alone. Blocking. The new context's pid.
    pub fn renew_context(
        &self,
        a: &str,
        s: &str,
        network: &SessionNetwork,
    ) -> Result<i32, RunError> {
        self.context_of(a, s, network, true)
    }

    /// Ends every context of agent `a` (their cgroups go with the agent's).
    /// Blocking.
    pub fn end_contexts_of(&self, a: &str) {
        // Ids have no `/`: this prefix is the agent's sessions only.
        let prefix = format!("{a}/");
        let slots: Vec<Arc<Mutex<Slot>>> = {
            let mut map = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
            let keys: Vec<String> = map
                .keys()
                .filter(|k| k.starts_with(&prefix))
                .cloned()
                .collect();
            keys.iter().filter_map(|k| map.remove(k)).collect()
        };
        for slot in slots {
            let mut g = slot.lock().unwrap_or_else(|e| e.into_inner());
            g.closed = true;
            g.ctx = None;
        }
    }
}
