//! The Allox OS control protocol, shared by the guest supervisor and the host.
//!
//! # Wire format
//!
//! A connection is a byte stream (a Unix socket, or a virtio-serial port that
//! has no message boundaries and may be reopened mid-frame). Each message is:
//!
//! ```text
//! postcard(message) ──COBS──► bytes without 0x00 ──► bytes ‖ 0x00
//! ```
//!
//! * The zero byte ends a frame. A reader that joins mid-stream, or that sees
//!   a torn or garbled frame, drops everything up to the next zero and goes
//!   on: it resynchronises after at most one bad frame.
//! * A frame (the COBS bytes between two delimiters) is at most
//!   [`MAX_FRAME`] = 1 MiB. The reader enforces the limit while it
//!   accumulates, before any allocation grows past it; a longer frame is
//!   discarded up to its delimiter and reported as oversized.
//! * The payload is [`postcard`] (varints for integers, length-prefixed UTF-8
//!   strings, enum variants as a varint index in declaration order). Decoding
//!   is strict: trailing bytes, unknown variant indexes, overlong or
//!   non-canonical varints and invalid UTF-8 are errors, never panics. A
//!   payload is accepted only if re-encoding it gives the same bytes.
//! * New request and response variants are only ever appended, so existing
//!   indexes keep their meaning; golden byte vectors in the tests pin them.
//!
//! # Conversation
//!
//! The client's first frame is [`ClientFrame::Hello`] with
//! [`PROTOCOL_VERSION`], its build identity and a conversation number it
//! chose at random. The server answers [`ServerFrame::Welcome`] echoing the
//! number, or [`ServerFrame::Refused`] with `version_mismatch` and closes.
//! Then the client sends any number of [`ClientFrame::Request`]s, each with
//! a `request_id` of its choosing (starting at a random value), without
//! waiting for answers; every answer ([`ServerFrame::Response`]) and stream
//! event ([`ServerFrame::Event`]) carries the conversation and the
//! `request_id` it belongs to. Answers may come in any order.
//!
//! On a serial port, which outlives its hosts, a new Hello ends the
//! previous conversation: its requests still running are cancelled where
//! they can be (waits, streams) and their answers are dropped, and a host
//! ignores every frame stamped with a conversation that is not its own, so
//! an answer never reaches a host that did not ask. Version 2 added the
//! conversation number; version 1 peers are refused.
//!
//! # JSON form
//!
//! The same requests have the JSON form `{"action": "agent.create",
//! "params": {...}}` (see [`json`]), answered by `{"result": {...}}` or
//! `{"error": {"code": "...", "message": "..."}}`.
//!
//! # The in-sandbox interface
//!
//! Programs inside a sandbox speak a separate, smaller schema over the
//! same framing ([`sandbox_api`]); host actions are not part of it.

pub mod agent;
pub mod audit;
pub mod bytes;
pub mod checkpoint;
pub mod codec;
pub mod effects;
pub mod effects_report;
pub mod error;
pub mod files;
pub mod frame;
pub mod id;
pub mod json;
pub mod message;
pub mod monitor;
pub mod network;
pub mod openapi;
pub mod ports;
pub mod process;
pub mod process_tree;
pub mod sandbox_api;
pub mod session;
pub mod share;
pub mod system;
pub mod target;
pub mod turn;

pub use agent::*;
pub use audit::*;
pub use bytes::Bytes;
pub use checkpoint::*;
pub use codec::{decode, encode, DecodeError};
pub use effects::*;
pub use error::{error_chain, ErrorBody, ErrorCode};
pub use files::*;
pub use frame::{FrameError, FrameReader, MAX_FRAME};
pub use id::{validate_checkpoint_id, validate_id, IdError, MAX_ID_LEN};
pub use message::*;
pub use monitor::*;
pub use network::*;
pub use ports::*;
pub use process::*;
pub use process_tree::*;
pub use session::*;
pub use share::*;
pub use system::*;
pub use turn::*;

/// Version of the wire protocol; both sides must agree exactly.
pub const PROTOCOL_VERSION: u32 = 2;

/// Build identity of this crate, sent in `Hello`.
pub fn build_identity() -> String {
    format!("allox {}", env!("CARGO_PKG_VERSION"))
}
