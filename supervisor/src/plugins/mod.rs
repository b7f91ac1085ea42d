//! The plugins compiled in: optional features over one core, each written
//! against the plugin API ([`crate::plugin_api`]) and nothing else of the
//! supervisor. The core's side (which load, their hooks, their routes) is
//! [`crate::plugin_host`]; docs/plugins.md explains how to write one.
//!
//! One plugin per module (`process_tree`, `network`, `share`, `monitor`,
//! `system_effects`),
//! with what they share: the record files of `records.rs` and the
//! start-to-stop holder of `slot.rs`.

pub mod defaults;
#[cfg(feature = "monitor")]
pub mod monitor;
#[cfg(feature = "network")]
pub mod network;
#[cfg(feature = "process-tree")]
pub mod process_tree;
#[cfg(any(feature = "network", feature = "share", feature = "monitor"))]
pub mod records;
#[cfg(feature = "share")]
pub mod share;
pub mod slot;
#[cfg(feature = "system-effects")]
pub mod system_effects;

use crate::plugin_api::Plugin;
use std::sync::Arc;

/// Every plugin compiled in, constructed (which does nothing yet), in a
/// fixed order.
// One push per feature: with none, the list is empty.
#[allow(clippy::vec_init_then_push)]
pub fn installed() -> Vec<Arc<dyn Plugin>> {
    // Each is a cargo feature of this crate (all by default); a build with
    // none has no plugin code, no BPF object and no plugin route.
    #[allow(unused_mut)]
    let mut v: Vec<Arc<dyn Plugin>> = Vec::new();
    #[cfg(feature = "process-tree")]
    v.push(Arc::new(process_tree::ProcessTree::new()));
    #[cfg(feature = "network")]
    v.push(Arc::new(network::Network::new()));
    #[cfg(feature = "share")]
    v.push(Arc::new(share::Share::new()));
    #[cfg(feature = "monitor")]
    v.push(Arc::new(monitor::Monitor::new()));
    #[cfg(feature = "system-effects")]
    v.push(Arc::new(system_effects::SystemEffects::new()));
    v
}

/// The names of the installed plugins.
pub fn installed_names() -> Vec<&'static str> {
    installed().iter().map(|p| p.manifest().name).collect()
}
