//! Why a request failed, mapped once to what the client sees.

use crate::plugins::PluginError;
use crate::runs::RunError;
use crate::tracker::TrackerError;
use allox_protocol::{ErrorBody, ErrorCode};
use allox_store::StoreError;
use thiserror::Error;

/// Why a request failed: the store's, the runs', the tracker's error, or
/// the dispatch's own.
#[derive(Debug, Error)]
pub enum RequestError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Runs(#[from] RunError),
    #[error(transparent)]
    Tracker(#[from] TrackerError),
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error(transparent)]
    Files(crate::files::FilesError),
    #[error("{action} refused: {why}")]
    Refused { action: &'static str, why: String },
    #[error(
        "{action} failed: the supervisor hit a bug ({why}); the operation was undone or finished, as store.check shows"
    )]
    Panicked { action: &'static str, why: String },
    #[error(
        "follow streams events, which only the binary protocol carries; page with cursor instead"
    )]
    FollowNeedsStream,
    #[error("subscriber gone")]
    SubscriberGone,
    #[error("process actions are answered asynchronously")]
    Asynchronous,
    #[error("not a process request")]
    NotProcess,
    #[error("network mode {0} needs the network plugin: start the daemon with --plugin network")]
    NetworkNeedsPlugin(allox_protocol::NetworkMode),
    #[error("egress {list} list: {source}")]
    EgressRule {
        list: &'static str,
        #[source]
        source: allox_network::RuleError,
    },
}

impl RequestError {
    pub fn code(&self) -> ErrorCode {
        match self {
            RequestError::Store(e) => e.code(),
            RequestError::Runs(e) => e.code(),
            RequestError::Tracker(e) => e.code(),
            RequestError::Plugin(e) => e.code(),
            RequestError::Files(e) => e.code(),
            RequestError::Refused { .. } | RequestError::SubscriberGone => ErrorCode::Unavailable,
            RequestError::FollowNeedsStream | RequestError::EgressRule { .. } => {
                ErrorCode::InvalidRequest
            }
            RequestError::NetworkNeedsPlugin(_) => ErrorCode::Unsupported,
            RequestError::Asynchronous => ErrorCode::Unsupported,
            RequestError::Panicked { .. } | RequestError::NotProcess => ErrorCode::Internal,
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
            _ => ErrorBody::new(self.code(), self.chain()),
        }
    }
}
