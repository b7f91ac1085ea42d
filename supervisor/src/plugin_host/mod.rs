//! The core's side of the plugins (Plugin API v1).
//!
//! "Installed" is compiled in ([`crate::plugins::installed`]); "enabled"
//! is a daemon flag (`--plugin NAME`, repeatable). Only enabled plugins
//! load, in the order the flags give; each declares the API version it is
//! written against (checked), its name and the plugins it conflicts with
//! ([`crate::plugin_api::Manifest`]). The actions a plugin serves are the
//! protocol's request table's to say (`Route::Plugin(NAME)`): a plugin the
//! table names that is not installed stops the daemon. Per run, each
//! plugin contributes a command prefix, environment, mounts into the
//! sandbox and metadata, which the core merges ([`merge`]), refusing
//! conflicts by naming both plugins. They start in load order and stop in
//! the reverse order, also when one fails to start ([`Plugins`]).

mod error;
pub mod merge;
mod registry;
#[cfg(test)]
mod tests;

pub use error::PluginHostError;
pub use registry::{Plugins, Running};
