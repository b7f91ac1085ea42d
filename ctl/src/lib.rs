//! `alloxctl`: the host side of the Allox OS control protocol.
//!
//! * [`client`]: a blocking client for the control socket.
//! * [`reconnecting`]: the same, connected lazily and again after a failure.
//! * [`rpc`]: requests and answers in their JSON form.
//! * [`gateway`]: that JSON form over HTTP, `POST /v1/rpc`, and files as
//!   raw bytes, `GET`/`PUT /v1/files/...`.
//! * [`token`]: the gateway's bearer token and its file.
//! * [`render`]: human output for every response.
//! * [`process`]: `exec`, `start` and `wait`, and their exit statuses.
//! * [`signal`]: signal numbers and names.
//! * [`cli`]: the command line.

pub mod cli;
pub mod client;
pub mod files;
pub mod foreground;
pub mod gateway;
pub mod monitor;
pub mod process;
pub mod reconnecting;
pub mod render;
pub mod rpc;
pub mod shutdown;
pub mod signal;
pub mod token;
pub mod top;
pub mod tty;

pub use client::{error_chain, Answer, Caller, Client, ClientError};
pub use reconnecting::ReconnectingClient;
pub use rpc::rpc_json;
