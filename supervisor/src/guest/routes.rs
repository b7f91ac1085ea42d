//! The seam between the guest interface and the plugins: a `plugin.call`
//! goes to whatever [`GuestRoutes`] the daemon installed; a route no plugin
//! owns is `not_found`.

use crate::plugin_api::Core;
use crate::plugin_host::Plugins;
use allox_protocol::{guest::GuestIdentity, ErrorBody};

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
pub trait GuestRoutes: Send + Sync {
    fn call(
        &self,
        core: &dyn Core,
        caller: &GuestIdentity,
        route: &str,
        params: &str,
    ) -> RouteOutcome;
}

/// No plugin routes: every call is `not_found`.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoRoutes;

impl GuestRoutes for NoRoutes {
    fn call(&self, _: &dyn Core, _: &GuestIdentity, _: &str, _: &str) -> RouteOutcome {
        RouteOutcome::NotOwned
    }
}

/// The loaded plugins' guest routes: a `plugin.call` from inside a sandbox
/// goes to the plugin that owns the route.
impl GuestRoutes for Plugins {
    fn call(
        &self,
        core: &dyn Core,
        caller: &GuestIdentity,
        route: &str,
        params: &str,
    ) -> RouteOutcome {
        match self.guest_call(core, caller, route, params) {
            Some(answer) => RouteOutcome::Answered(answer),
            None => RouteOutcome::NotOwned,
        }
    }
}
