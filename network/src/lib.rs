//! Allox OS session network: the egress policy the broker applies to every
//! connection a sandbox asks for.

pub mod policy;

pub use policy::{
    check_egress, special, EgressError, Host, Layer, Policy, Rule, RuleError, Verdict,
};
pub mod broker;
pub mod diag;
pub mod http;
pub mod intercept;
pub mod own;
pub mod relay;
pub mod seal;
pub mod secrets;
pub mod stub;

/// The TLS library the broker intercepts with (its configuration types
/// cross this crate's API).
pub use rustls;
/// Its async streams.
pub use tokio_rustls;
