//! The seam between the in-sandbox interface and the plugins: a `plugin.call`
//! goes to whatever [`SandboxRoutes`] the daemon installed; a route no plugin
//! owns is `not_found`.

use crate::plugin_api::Core;
use crate::plugin_host::Plugins;
use allox_protocol::{sandbox_api::SandboxCaller, ErrorBody};

/// What a route's owner made of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteOutcome {
    /// No plugin owns the route.
    NotOwned,
    /// The answer (JSON text), or the error the caller gets.
    Answered(Result<String, ErrorBody>),
}

/// The plugin routes reachable from inside sandboxes.
///
/// `call` runs on a blocking thread (a plugin may block), with what the
/// core lends plugins (`core`: the supervisor); the caller's
/// identity is the listener's, never anything the caller sent, and a
/// plugin must act for that caller only.
pub trait SandboxRoutes: Send + Sync {
    fn call(
        &self,
        core: &dyn Core,
        caller: &SandboxCaller,
        route: &str,
        params: &str,
    ) -> RouteOutcome;
}

/// No plugin routes: every call is `not_found`.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoRoutes;

impl SandboxRoutes for NoRoutes {
    fn call(&self, _: &dyn Core, _: &SandboxCaller, _: &str, _: &str) -> RouteOutcome {
        RouteOutcome::NotOwned
    }
}

/// The loaded plugins' guest routes: a `plugin.call` from inside a sandbox
/// goes to the plugin that owns the route.
impl SandboxRoutes for Plugins {
    fn call(
        &self,
        core: &dyn Core,
        caller: &SandboxCaller,
        route: &str,
        params: &str,
    ) -> RouteOutcome {
        match self.sandbox_call(core, caller, route, params) {
            Some(answer) => RouteOutcome::Answered(answer),
            None => RouteOutcome::NotOwned,
        }
    }
}
