//! What a plugin says when it cannot start, refuses a run, or cannot
//! answer a request: the plugin API's own error, mapped once to what the
//! client sees ([`PluginError::code`]).

use allox_protocol::{ErrorBody, ErrorCode};
use allox_store::StoreError;
use thiserror::Error;

/// A boxed error of a plugin's own.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Error)]
pub enum PluginError {
    #[error("plugin {plugin}{} failed to start", alias_note(.alias))]
    Start {
        plugin: &'static str,
        alias: Option<&'static str>,
        #[source]
        source: Cause,
    },
    #[error("plugin {plugin} refused the run")]
    Run {
        plugin: &'static str,
        #[source]
        source: Cause,
    },
    /// A plugin's own answer to a request it refused.
    #[error("{}", .0.message)]
    Answered(ErrorBody),
    #[error("plugin {plugin} is given {action} by the request table but does not answer it")]
    NoHandler {
        plugin: &'static str,
        action: &'static str,
    },
    #[error(
        "follow streams events, which only the binary protocol carries; page with cursor instead"
    )]
    FollowNeedsStream,
    #[error("subscriber gone")]
    SubscriberGone,
    /// The store, as a route's handler reached it.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// ` (ALIAS)` when a plugin has an alias, for messages.
pub fn alias_note(alias: &Option<&'static str>) -> String {
    alias.map(|a| format!(" ({a})")).unwrap_or_default()
}

impl PluginError {
    pub fn code(&self) -> ErrorCode {
        match self {
            PluginError::Answered(b) => b.code,
            PluginError::Store(e) => e.code(),
            PluginError::FollowNeedsStream => ErrorCode::InvalidRequest,
            PluginError::SubscriberGone => ErrorCode::Unavailable,
            PluginError::Start { .. } | PluginError::Run { .. } | PluginError::NoHandler { .. } => {
                ErrorCode::Internal
            }
        }
    }

    /// The error as the client sees it.
    pub fn to_body(&self) -> ErrorBody {
        match self {
            // The store words a full disk its own way.
            PluginError::Store(e) => e.to_body(),
            _ => ErrorBody::new(self.code(), allox_protocol::error_chain(self)),
        }
    }
}

impl From<PluginError> for ErrorBody {
    fn from(e: PluginError) -> ErrorBody {
        e.to_body()
    }
}
