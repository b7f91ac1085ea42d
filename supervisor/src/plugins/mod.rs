//! The plugins compiled in: optional features over one core, each written
//! against the plugin API ([`crate::plugin_api`]) and nothing else of the
//! supervisor. The core's side (which load, their hooks, their routes) is
//! [`crate::plugin_host`]; docs/plugins.md explains how to write one.
//!
//! One plugin per module (`process_tree`, `network`, `share`, `monitor`,
//! `system_effects`),
//! with what they share: the record files of `records.rs` and the
//! start-to-stop holder of `slot.rs`.

pub mod monitor;
pub mod network;
pub mod process_tree;
pub mod records;
pub mod share;
pub mod slot;
pub mod system_effects;

use crate::plugin_api::Plugin;
use std::sync::Arc;

/// Every plugin compiled in, constructed (which does nothing yet), in a
/// fixed order.
pub fn installed() -> Vec<Arc<dyn Plugin>> {
    vec![
        Arc::new(process_tree::ProcessTree::new()),
        Arc::new(network::Network::new()),
        Arc::new(share::Share::new()),
        Arc::new(monitor::Monitor::new()),
        Arc::new(system_effects::SystemEffects::new()),
    ]
}

/// The names of the installed plugins.
pub fn installed_names() -> Vec<&'static str> {
    installed().iter().map(|p| p.manifest().name).collect()
}
