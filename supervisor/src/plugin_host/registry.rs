//! The core's side: which plugins load ([`Plugins::load`]), starting them
//! in load order and stopping them in the reverse ([`Plugins::start`],
//! [`Plugins::stop`]), the merged contribution to each run, the per-run
//! hooks, and routing requests to the plugin the protocol's request table
//! gives them to.

use super::{merge, PluginHostError};
use crate::plugin_api::{
    ContextGuard, Contribution, Core, ObservedEnd, ObservedRun, Plugin, RouteContext, RunEnded,
    RunRef, SessionNetwork, SessionRef, Settings, API_VERSION,
};
use allox_protocol::sandbox_api::SandboxCaller;
use allox_protocol::{
    ErrorBody, InstalledPlugin, PluginInfo, PluginListing, Request, Response, Route, RunEffects,
};
use allox_store::failpoint::{self, Failpoints};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The run the start-up checks merge contributions for: a plugin's keys
/// must not depend on the run (a run of a `proxy` session gets them all).
const SAMPLE_RUN: RunRef<'static> = RunRef {
    agent: "agent",
    session: "session",
    run: "run",
    network: &SessionNetwork {
        mode: allox_protocol::NetworkMode::Proxy,
        agent: None,
        session: None,
    },
};

/// Started plugins; dropping it stops them, in the reverse load order.
#[must_use = "dropping it stops the plugins"]
pub struct Running(Arc<Plugins>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// The installed plugins and the loaded ones, in load order.
pub struct Plugins {
    installed: Vec<Arc<dyn Plugin>>,
    loaded: Vec<Arc<dyn Plugin>>,
    /// Action → the plugin the request table gives it to (loaded or not).
    owners: BTreeMap<&'static str, &'static str>,
    /// The plugins' actions in the table's order (as `plugin.list` shows
    /// them).
    in_order: Vec<&'static str>,
    /// Action → index in `loaded`, for the loaded owners.
    routes: BTreeMap<&'static str, usize>,
    /// Guest route (`plugin.call` from inside a sandbox) → index in `loaded`.
    sandbox_routes: BTreeMap<&'static str, usize>,
    /// How many of `loaded` (a prefix) are started.
    started: Mutex<usize>,
    system_dirs: Vec<PathBuf>,
    failpoints: Failpoints,
}

impl std::fmt::Debug for Plugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugins")
            .field("loaded", &self.names())
            .finish()
    }
}

impl Default for Plugins {
    fn default() -> Self {
        Plugins::none()
    }
}

impl Plugins {
    /// None installed, none loaded.
    pub fn none() -> Plugins {
        Plugins {
            installed: Vec::new(),
            loaded: Vec::new(),
            owners: BTreeMap::new(),
            in_order: Vec::new(),
            routes: BTreeMap::new(),
            sandbox_routes: BTreeMap::new(),
            started: Mutex::new(0),
            system_dirs: Vec::new(),
            failpoints: Failpoints::default(),
        }
    }

    /// Loads the `enabled` plugins (in that order, a name given twice
    /// counts once) among the `installed` ones: each must be installed and
    /// written for [`API_VERSION`]; no two may conflict, by declaration,
    /// guest route, or contribution (checked against the sandbox's own
    /// mounts and `system_dirs` too). Every plugin the request `table`
    /// (`Request::ROUTES`) gives an action to must be installed. Nothing
    /// is started yet.
    pub fn load(
        installed: Vec<Arc<dyn Plugin>>,
        enabled: &[String],
        table: &[(&'static str, Route)],
        system_dirs: &[PathBuf],
        failpoints: Failpoints,
    ) -> Result<Plugins, PluginHostError> {
        let mut owners = BTreeMap::new();
        let mut in_order = Vec::new();
        for &(action, route) in table {
            let Some(plugin) = route.plugin() else {
                continue;
            };
            // A plugin of the project this binary was built without: its
            // actions are refused as such.
            if !installed.iter().any(|p| p.manifest().name == plugin)
                && !crate::plugins::defaults::KNOWN.contains(&plugin)
            {
                return Err(PluginHostError::NoSuchOwner {
                    action,
                    plugin,
                    installed: names_or_none(&installed),
                });
            }
            owners.insert(action, plugin);
            in_order.push(action);
        }
        let mut loaded: Vec<Arc<dyn Plugin>> = Vec::new();
        for name in enabled {
            if loaded.iter().any(|p| p.manifest().name == name) {
                continue;
            }
            let Some(p) = installed.iter().find(|p| p.manifest().name == name) else {
                if let Some(&known) = crate::plugins::defaults::KNOWN.iter().find(|k| *k == name) {
                    return Err(PluginHostError::NotBuiltIn {
                        name: known,
                        installed: names_or_none(&installed),
                    });
                }
                return Err(PluginHostError::Unknown {
                    name: name.clone(),
                    installed: names_or_none(&installed),
                });
            };
            let m = p.manifest();
            if m.api_version != API_VERSION {
                return Err(PluginHostError::ApiVersion {
                    name: m.name,
                    declared: m.api_version,
                    supported: API_VERSION,
                });
            }
            for earlier in &loaded {
                let e = earlier.manifest();
                let by = if e.conflicts.contains(&m.name) {
                    Some(e.name)
                } else if m.conflicts.contains(&e.name) {
                    Some(m.name)
                } else {
                    None
                };
                if let Some(by) = by {
                    return Err(PluginHostError::Declared {
                        first: e.name,
                        second: m.name,
                        by,
                    });
                }
            }
            loaded.push(p.clone());
        }
        // An action goes to its owner when it is loaded, else to a loaded
        // plugin that stands in for the owner.
        let routes: BTreeMap<&'static str, usize> = owners
            .iter()
            .filter_map(|(&action, &owner)| {
                let i = loaded
                    .iter()
                    .position(|p| p.manifest().name == owner)
                    .or_else(|| {
                        loaded
                            .iter()
                            .position(|p| p.stands_in_for().contains(&owner))
                    })?;
                Some((action, i))
            })
            .collect();
        let mut sandbox_routes: BTreeMap<&'static str, usize> = BTreeMap::new();
        for (i, p) in loaded.iter().enumerate() {
            for &route in p.sandbox_routes() {
                if let Some(&j) = sandbox_routes.get(route) {
                    return Err(PluginHostError::Contributed {
                        first: loaded[j].manifest().name,
                        second: p.manifest().name,
                        what: format!("guest route {route}"),
                    });
                }
                sandbox_routes.insert(route, i);
            }
        }
        let me = Plugins {
            installed,
            loaded,
            owners,
            in_order,
            routes,
            sandbox_routes,
            started: Mutex::new(0),
            system_dirs: system_dirs.to_vec(),
            failpoints,
        };
        me.contributions(&SAMPLE_RUN)?;
        Ok(me)
    }

    /// Starts the loaded plugins in load order. When one fails (or
    /// panics), the ones started before it are stopped, in the reverse
    /// order, and its error is returned.
    pub fn start(&self, settings: &Settings) -> Result<(), PluginHostError> {
        for (k, p) in self.loaded.iter().enumerate() {
            let m = p.manifest();
            let point = format!("plugin_start.{}", m.name);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if failpoint::PLUGIN_STARTS.contains(&point.as_str()) {
                    self.failpoints.hit(&point);
                }
                p.start(settings)
            }));
            let err = match r {
                Ok(Ok(())) => {
                    *self.started.lock().unwrap_or_else(|e| e.into_inner()) = k + 1;
                    tracing::info!(plugin = m.name, "plugin started");
                    continue;
                }
                Ok(Err(e)) => e.into(),
                Err(panic) => PluginHostError::StartPanicked {
                    plugin: m.name,
                    alias: m.alias,
                    why: crate::panic::message(panic),
                },
            };
            tracing::error!(plugin = m.name, error = %allox_protocol::error_chain(&err), "plugin failed to start; stopping the ones before it");
            self.stop();
            return Err(err);
        }
        Ok(())
    }

    /// [`Plugins::start`], and a guard that stops them (in the reverse
    /// order) when it goes, on every path.
    pub fn start_guarded(
        self: &Arc<Self>,
        settings: &Settings,
    ) -> Result<Running, PluginHostError> {
        self.start(settings)?;
        Ok(Running(self.clone()))
    }

    /// Stops the started plugins in the reverse load order (once; later
    /// calls do nothing).
    pub fn stop(&self) {
        let n = std::mem::take(&mut *self.started.lock().unwrap_or_else(|e| e.into_inner()));
        for p in self.loaded[..n].iter().rev() {
            let name = p.manifest().name;
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.stop())).is_err() {
                tracing::error!(plugin = name, "plugin panicked while stopping");
            } else {
                tracing::info!(plugin = name, "plugin stopped");
            }
        }
    }

    /// The loaded plugins' names, in load order.
    pub fn names(&self) -> Vec<String> {
        self.loaded
            .iter()
            .map(|p| p.manifest().name.to_string())
            .collect()
    }

    /// Whether the plugin `name` is loaded.
    pub fn has(&self, name: &str) -> bool {
        self.loaded.iter().any(|p| p.manifest().name == name)
    }

    pub fn is_empty(&self) -> bool {
        self.loaded.is_empty()
    }

    /// The merged contribution of every loaded plugin to `run`.
    pub fn contributions(&self, run: &RunRef<'_>) -> Result<Contribution, PluginHostError> {
        let parts: Vec<_> = self
            .loaded
            .iter()
            .map(|p| (p.manifest().name, p.contribute(run)))
            .collect();
        merge::merge(&parts, &self.system_dirs)
    }

    /// Tells every plugin (in load order) that a run ended.
    pub fn run_ended(&self, run: &RunEnded<'_>) {
        for p in &self.loaded {
            p.run_ended(run);
        }
    }

    /// Calls every plugin's [`Plugin::before_run`] in load order; when one
    /// refuses, the ones before it hear [`Plugin::after_run`] (in the
    /// reverse order) and its error is returned.
    pub fn before_run(&self, run: &RunRef<'_>, cgroup_id: u64) -> Result<(), PluginHostError> {
        for (k, p) in self.loaded.iter().enumerate() {
            if let Err(e) = p.before_run(run, cgroup_id) {
                for q in self.loaded[..k].iter().rev() {
                    q.after_run(run);
                }
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// [`Plugin::after_run`], in the reverse load order.
    pub fn after_run(&self, run: &RunRef<'_>) {
        for p in self.loaded.iter().rev() {
            p.after_run(run);
        }
    }

    /// [`Plugin::session_context`], in load order; when one fails, what
    /// the ones before it returned is dropped (in the reverse order) and
    /// its error returned.
    pub fn session_context(
        &self,
        session: &SessionRef<'_>,
        context: rustix::fd::BorrowedFd<'_>,
    ) -> Result<Vec<ContextGuard>, PluginHostError> {
        let mut held = Vec::new();
        for p in &self.loaded {
            match p.session_context(session, context) {
                Ok(g) => held.extend(g),
                Err(e) => {
                    while let Some(g) = held.pop() {
                        drop(g);
                    }
                    return Err(e.into());
                }
            }
        }
        Ok(held)
    }

    /// Whether a loaded plugin observes runs.
    pub fn observes_runs(&self) -> bool {
        self.loaded.iter().any(|p| p.observes_runs())
    }

    /// [`Plugin::observe_begin`] of the plugins that observe runs.
    pub fn observe_begin(&self, run: &ObservedRun<'_>) -> Result<(), PluginHostError> {
        for p in self.loaded.iter().filter(|p| p.observes_runs()) {
            p.observe_begin(run)?;
        }
        Ok(())
    }

    /// [`Plugin::observe_end`]: the first plugin's effects.
    pub fn observe_end(
        &self,
        run: &RunRef<'_>,
        end: ObservedEnd,
        core: &dyn crate::plugin_api::RunCore,
    ) -> Option<RunEffects> {
        let mut out = None;
        for p in self.loaded.iter().filter(|p| p.observes_runs()) {
            let e = p.observe_end(run, end.clone(), core);
            if out.is_none() {
                out = e;
            }
        }
        out
    }

    /// [`Plugin::deleted`], in load order.
    pub fn deleted(&self, agent: &str, session: Option<&str>) {
        for p in &self.loaded {
            p.deleted(agent, session);
        }
    }

    /// [`Plugin::holds`]: the first fence a plugin holds on the session.
    pub fn holds(&self, agent: &str, session: &str) -> Option<String> {
        self.loaded.iter().find_map(|p| p.holds(agent, session))
    }

    /// [`Plugin::adopt_run`], in load order.
    pub fn adopt_run(&self, run: &RunRef<'_>, cgroup_id: u64) {
        for p in &self.loaded {
            p.adopt_run(run, cgroup_id);
        }
    }

    /// The loaded plugin the request table gives `action` to; when it is
    /// not loaded, the error names the plugin that would serve it.
    pub fn owner(&self, action: &'static str) -> Result<&Arc<dyn Plugin>, PluginHostError> {
        if let Some(&i) = self.routes.get(action) {
            return Ok(&self.loaded[i]);
        }
        let Some(&owner) = self.owners.get(action) else {
            return Err(PluginHostError::NotAPluginRoute { action });
        };
        let Some(m) = self
            .installed
            .iter()
            .map(|p| p.manifest())
            .find(|m| m.name == owner)
        else {
            return Err(PluginHostError::NotBuilt {
                action,
                plugin: owner,
            });
        };
        let alias = m.alias;
        Err(PluginHostError::NotEnabled {
            action,
            plugin: owner,
            alias,
        })
    }

    /// Answers a request through the plugin the request table gives its
    /// action to.
    pub async fn serve(
        &self,
        req: &Request,
        ctx: RouteContext<'_>,
    ) -> Result<Response, PluginHostError> {
        Ok(self.owner(req.action())?.serve(req, ctx).await?)
    }

    /// The actions plugin `name` answers: the request table's for it, or
    /// those it stands in for while their owner is not loaded.
    pub fn routes_of(&self, name: &str) -> Vec<String> {
        self.in_order
            .iter()
            .filter(|action| match self.routes.get(*action) {
                Some(&i) => self.loaded[i].manifest().name == name,
                None => self.owners.get(*action) == Some(&name),
            })
            .map(|action| action.to_string())
            .collect()
    }

    /// A `plugin.call` from inside a sandbox, answered by the loaded plugin
    /// that owns `route`; `None` when none does.
    pub fn sandbox_call(
        &self,
        core: &dyn Core,
        caller: &SandboxCaller,
        route: &str,
        params: &str,
    ) -> Option<Result<String, ErrorBody>> {
        let &i = self.sandbox_routes.get(route)?;
        Some(self.loaded[i].sandbox_call(core, caller, route, params))
    }

    /// The answer to `plugin.list`.
    pub fn listing(&self) -> PluginListing {
        PluginListing {
            loaded: self
                .loaded
                .iter()
                .map(|p| {
                    let m = p.manifest();
                    PluginInfo {
                        name: m.name.into(),
                        api_version: m.api_version,
                        routes: self.routes_of(m.name),
                        conflicts: m.conflicts.iter().map(|c| c.to_string()).collect(),
                    }
                })
                .collect(),
            installed: self
                .installed
                .iter()
                .map(|p| {
                    let m = p.manifest();
                    InstalledPlugin {
                        name: m.name.into(),
                        api_version: m.api_version,
                        enabled: self.loaded.iter().any(|l| l.manifest().name == m.name),
                        summary: m.summary.into(),
                    }
                })
                .collect(),
        }
    }
}

/// The installed plugins' names, for messages.
fn names_or_none(installed: &[Arc<dyn Plugin>]) -> String {
    let names: Vec<_> = installed.iter().map(|p| p.manifest().name).collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}
