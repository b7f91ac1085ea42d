//! Strict postcard encoding and decoding of whole frames.

use crate::frame::{self, FrameError};
use serde::{de::DeserializeOwned, Serialize};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum DecodeError {
    #[error("malformed message")]
    Postcard(#[source] postcard::Error),
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    #[error("message is not in canonical form (overlong varint or similar)")]
    NonCanonical,
}

#[derive(Debug, Error)]
pub enum EncodeError {
    #[error("cannot encode message")]
    Postcard(#[source] postcard::Error),
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// Encodes a message into a complete frame, delimiter included.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, EncodeError> {
    let payload = postcard::to_stdvec(msg).map_err(EncodeError::Postcard)?;
    Ok(frame::frame(&payload)?)
}

/// Decodes one frame's payload (as produced by [`crate::FrameReader`]).
///
/// Refuses trailing bytes and anything that would not re-encode to the same
/// bytes, which covers overlong varints and other non-canonical forms.
pub fn decode<T: Serialize + DeserializeOwned>(payload: &[u8]) -> Result<T, DecodeError> {
    let (msg, rest) = postcard::take_from_bytes::<T>(payload).map_err(DecodeError::Postcard)?;
    if !rest.is_empty() {
        return Err(DecodeError::TrailingBytes(rest.len()));
    }
    match postcard::to_stdvec(&msg) {
        Ok(again) if again == payload => Ok(msg),
        _ => Err(DecodeError::NonCanonical),
    }
}
