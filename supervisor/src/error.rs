//! Why a request failed, mapped once to what the client sees.

use crate::files::FilesError;
use crate::plugin_api::PluginError;
use crate::plugin_host::PluginHostError;
use crate::runs::RunError;
use allox_protocol::{ErrorBody, ErrorCode, Route};
use allox_store::StoreError;
use thiserror::Error;

/// Why a request failed: the store's, the runs', the plugins', the file
/// API's error, or the dispatch's own.
#[derive(Debug, Error)]
pub enum RequestError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Runs(#[from] RunError),
    #[error(transparent)]
    Plugin(#[from] PluginHostError),
    #[error(transparent)]
    Files(FilesError),
    #[error("{action} refused: {why}")]
    Refused { action: &'static str, why: String },
    #[error(
        "{action} failed: the supervisor hit a bug ({why}); the operation was undone or finished, as store.check shows"
    )]
    Panicked { action: &'static str, why: String },
    /// A request reached the path the request table does not give it (a
    /// bug of the caller in the supervisor).
    #[error("{action} is served as {route:?} by the request table, not here")]
    Misrouted { action: &'static str, route: Route },
    #[error("network mode {0} needs the network plugin: start the daemon with --plugin network")]
    NetworkNeedsPlugin(allox_protocol::NetworkMode),
    #[error(transparent)]
    Egress(#[from] allox_network::EgressError),
    #[error("metrics are off: the daemon was started with --no-metrics")]
    MetricsOff,
    /// A session's export or import refused, and why.
    #[error("{why}")]
    Transfer { code: ErrorCode, why: String },
    /// A session's port refused (`port.*`), and why.
    #[error("{why}")]
    Port { code: ErrorCode, why: String },
    /// The machine's own settings refused (`system.resumed`), and why.
    #[error("{why}")]
    Machine { code: ErrorCode, why: String },
}

impl From<ErrorBody> for RequestError {
    fn from(e: ErrorBody) -> RequestError {
        RequestError::Port {
            code: e.code,
            why: e.message,
        }
    }
}

impl From<PluginError> for RequestError {
    fn from(e: PluginError) -> RequestError {
        RequestError::Plugin(PluginHostError::Plugin(e))
    }
}

impl From<FilesError> for RequestError {
    fn from(e: FilesError) -> RequestError {
        match e {
            // Errors of the store and the runs keep their own words.
            FilesError::Store(e) => RequestError::Store(e),
            FilesError::Runs(e) => RequestError::Runs(e),
            e => RequestError::Files(e),
        }
    }
}

impl RequestError {
    pub fn code(&self) -> ErrorCode {
        match self {
            RequestError::Store(e) => e.code(),
            RequestError::Runs(e) => e.code(),
            RequestError::Plugin(e) => e.code(),
            RequestError::Files(e) => e.code(),
            RequestError::Refused { .. } => ErrorCode::Unavailable,
            RequestError::Transfer { code, .. }
            | RequestError::Port { code, .. }
            | RequestError::Machine { code, .. } => *code,
            RequestError::Egress(_) => ErrorCode::InvalidRequest,
            RequestError::NetworkNeedsPlugin(_) | RequestError::MetricsOff => {
                ErrorCode::Unsupported
            }
            RequestError::Panicked { .. } | RequestError::Misrouted { .. } => ErrorCode::Internal,
        }
    }

    /// The whole error chain, once.
    pub fn chain(&self) -> String {
        allox_protocol::error_chain(self)
    }

    /// The error as the client sees it.
    pub fn to_body(&self) -> ErrorBody {
        match self {
            // The store words a full disk its own way.
            RequestError::Store(e) => e.to_body(),
            RequestError::Plugin(e) => e.to_body(),
            _ => ErrorBody::new(self.code(), self.chain()),
        }
    }
}
