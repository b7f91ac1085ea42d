//! The Rust client of the Allox OS control socket, shared by `alloxctl`
//! and its HTTP gateway (the clients of that gateway, in other languages,
//! are in `clients/`).
//!
//! * [`client`]: a blocking client, one connection.
//! * [`reconnecting`]: the same, connected lazily and again after a failure.
//! * [`files`]: files between this machine and a session, in chunks.
//! * `fake` (tests, or the `fake` feature): a caller without a daemon.

pub mod client;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod files;
pub mod reconnecting;

pub use client::{error_chain, Answer, Caller, Client, ClientError};
pub use reconnecting::ReconnectingClient;
