//! The Allox OS supervisor: the composition of the workspace store
//! (`allox-store`) and the sandbox (`allox-sandbox`) behind the control
//! server — dispatch, runs, files, plugins, the daemon.
//!
//! From the top down: `daemon` starts everything; `serial`, `server`,
//! `peer` and `sandbox_api` (the in-sandbox interface) take requests in; `supervisor` admits and audits
//! them and `dispatch` answers them (the protocol's request table decides
//! where each goes); `files`, `runs` and `plugin_host` do the work;
//! `plugins` stand on `plugin_api` alone. `tests/tests/architecture.rs`
//! checks that no module imports one above it.

pub mod clocks;
pub mod daemon;
pub mod dispatch;
pub mod error;
pub mod files;
pub mod panic;
pub(crate) mod passed;
pub mod peer;
pub mod plugin_api;
pub mod plugin_host;
pub mod plugins;
pub mod ports;
pub mod ratelimit;
pub mod resumed;
pub mod runs;
pub mod sandbox_api;
pub mod serial;
pub mod server;
pub mod supervisor;
pub mod transfer;
