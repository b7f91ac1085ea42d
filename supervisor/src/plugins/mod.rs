//! Plugins (Plugin API v1): optional features over one core.
//!
//! "Installed" is compiled in ([`installed`]); "enabled" is a daemon flag
//! (`--plugin NAME`, repeatable). Only enabled plugins load, in the order
//! the flags give; each declares the API version it is written against
//! (checked), its name, the plugins it conflicts with and the actions it
//! serves ([`Manifest`]). Per run, each contributes a command prefix,
//! environment, mounts into the sandbox and metadata ([`Contribution`]),
//! which the core merges ([`merge`]), refusing conflicts by naming both
//! plugins. They start in load order and stop in the reverse order, also
//! when one fails to start ([`Plugins`]).
//!
//! One concern per file: the API in `api.rs`, errors in `error.rs`, the
//! merge in `merge.rs`, the registry in `registry.rs`, and each plugin in
//! a file of its own (`process_tree.rs`). docs/plugins.md explains how to
//! write one.

mod api;
mod error;
pub mod merge;
pub mod monitor;
pub mod network;
pub mod process_tree;
pub mod records;
mod registry;
pub mod share;
pub mod slot;
#[cfg(test)]
mod tests;

pub use api::{
    ContextGuard, Contribution, Core, Manifest, MonitorSettings, NetworkSettings, Plugin,
    RouteContext, RouteFuture, RunEnded, RunRef, SessionNetwork, SessionRef, Settings, API_VERSION,
};
pub use error::{Cause, PluginError};
pub use registry::{Plugins, Running};

use std::sync::Arc;

/// The actions the core hands to the plugin that serves them (a plugin's
/// routes must be among them); every other action the core answers itself.
pub const ROUTABLE: &[&str] = &[
    "process.events",
    "process.tree",
    "network.policy.set",
    "network.policy.get",
    "network.audit",
    "share.list",
    "share.agent.set",
    "share.session.set",
    "monitor.ingest",
    "monitor.records",
    "monitor.summary",
    "monitor.timeline",
];

/// Every plugin compiled in, constructed (which does nothing yet), in a
/// fixed order.
pub fn installed() -> Vec<Arc<dyn Plugin>> {
    vec![
        Arc::new(process_tree::ProcessTree::new()),
        Arc::new(network::Network::new()),
        Arc::new(share::Share::new()),
        Arc::new(monitor::Monitor::new()),
    ]
}

/// The names of the installed plugins.
pub fn installed_names() -> Vec<&'static str> {
    installed().iter().map(|p| p.manifest().name).collect()
}
