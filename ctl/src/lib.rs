//! `alloxctl`: the host side of the Allox OS control protocol.
//!
//! * [`rpc`]: requests and answers in their JSON form.
//! * [`render`]: human output for every response.
//! * [`process`]: `exec`, `start` and `wait`, and their exit statuses.
//! * [`signal`]: signal numbers and names.
//! * [`cli`]: the command line.
//!
//! The client of the control socket is `allox-client` ([`client`],
//! [`reconnecting`], [`files`]), and the HTTP gateway, with its bearer
//! token, is `allox-gateway` ([`gateway`], [`token`]); both are named here
//! too, for the programs that use this crate.

pub mod cli;
pub mod effects;
pub mod foreground;
pub mod forward;
pub mod monitor;
pub mod process;
pub mod raw_mode;
pub mod render;
pub mod rpc;
pub mod shutdown;
pub mod signal;
pub mod top;
pub mod transfer;
pub mod tty;
pub mod vm;

pub use allox_client::{client, files, reconnecting};
pub use allox_client::{error_chain, Answer, Caller, Client, ClientError, ReconnectingClient};
pub use allox_gateway as gateway;
pub use allox_gateway::token;
pub use rpc::rpc_json;
