//! `allox-init` as a library: what the binary's PID 1 and `supervise`
//! modes do, in pieces that can be tested without being PID 1.
//!
//! - [`container`]: `allox-init container`, a container's PID 1: its
//!   options, the supervisor's command, the cgroup v2 leaf;
//! - [`keeper`]: the loop that keeps the supervisor running, shared by
//!   the guest's and the container's PID 1;
//! - [`client`]: `allox`, the in-sandbox interface's client inside sandboxes
//!   (the same executable started under that name);
//! - [`guest`]: the guest's PID 1 — its settings from the kernel command
//!   line, the machine's set-up (mounts, `lo`, Ctrl-Alt-Del), the store
//!   disk, and how the supervisor child is started;
//! - [`limits`]: the guest's default session limits;
//! - [`supervise`]: the `supervise` command's flags and their conversion
//!   into the daemon's configuration.

pub mod client;
pub mod container;
pub mod guest;
pub mod keeper;
pub mod limits;
pub mod netconnect;
pub mod sandbox_call;
pub mod share;
pub mod supervise;
