//! The Allox OS supervisor: the composition of the workspace store
//! (`allox-store`) and the sandbox (`allox-sandbox`) behind the control
//! server — dispatch, runs, plugins (the process tracker first), the daemon.

pub mod daemon;
pub mod dispatch;
pub mod error;
pub mod files;
pub mod guest;
pub mod network;
pub mod peer;
pub mod plugins;
pub mod ratelimit;
pub mod runs;
pub mod serial;
pub mod server;
pub mod supervisor;
pub mod tracker;
