//! Error codes that reach a client.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The closed set of error codes a client can receive.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request is malformed: bad ID, bad parameter, bad frame.
    InvalidRequest,
    /// The named agent, session, checkpoint or run does not exist.
    NotFound,
    /// The request clashes with the current state (exists already, pinned,
    /// busy).
    Conflict,
    /// The peer may not do this.
    Unauthorized,
    /// The peer speaks another protocol version.
    VersionMismatch,
    /// The request is understood but this build or host cannot do it.
    Unsupported,
    /// A resource is exhausted or shutting down; retrying later may work.
    Unavailable,
    /// A bug or an unexpected failure of the host.
    Internal,
}

impl ErrorCode {
    /// Every code, in wire order.
    pub const ALL: [ErrorCode; 8] = [
        ErrorCode::InvalidRequest,
        ErrorCode::NotFound,
        ErrorCode::Conflict,
        ErrorCode::Unauthorized,
        ErrorCode::VersionMismatch,
        ErrorCode::Unsupported,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
    ];

    /// The snake_case name used in JSON and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::VersionMismatch => "version_mismatch",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
        }
    }

    /// The HTTP status the JSON gateway answers with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidRequest => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::NotFound => 404,
            ErrorCode::Conflict => 409,
            ErrorCode::VersionMismatch => 400,
            ErrorCode::Unsupported => 501,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error as the client sees it: a code and a message a person can act on.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }
}

impl fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ErrorBody {}

/// An error and its sources, joined with `": "`: the one way an error
/// chain is rendered, by the CLI and by the supervisor.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}
