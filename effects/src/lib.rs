//! System effects: what an observed run changed outside its workspace.
//!
//! * [`collect`]: the collectors, one per domain, each capturing the
//!   machine's state as items (`key → value` text) at A and at B;
//!   [`collect::compare`] lists the differences.
//! * [`chain`]: the evidence chain, canonical JSON records (RFC 8785)
//!   `{seq, prev, kind, body_sha256}`, and its verifier.
//! * [`scope`]: the scope file (which domains are confirmed at S0/S1).
//! * [`observer`]: the observer's side of the protocol with the
//!   supervisor, run by the `allox-observe` executable.
//! * [`verify`]: the independent verifier of a closed evidence set, run
//!   by the `allox-system-effects-verify` executable; [`export`]: a set
//!   as one archive (`effects.export`).
//! * [`recover`]: protocol v3's workspace restore, run by the
//!   `allox-system-effects-recover` executable.
//!
//! docs/system-effects.md describes the whole feature.

pub mod chain;
pub mod collect;
pub mod export;
pub mod observer;
pub mod recover;
pub mod scope;
pub mod verify;
