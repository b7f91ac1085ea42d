//! Why plugins could not be loaded, started, or could not serve.

use allox_protocol::{ErrorBody, ErrorCode};
use thiserror::Error;

/// A boxed error of a plugin's own.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Error)]
pub enum PluginError {
    #[error("unknown plugin {name:?}; installed: {installed}")]
    Unknown { name: String, installed: String },
    #[error("plugin {name} is written for plugin API v{declared}; this supervisor implements v{supported}")]
    ApiVersion {
        name: &'static str,
        declared: u32,
        supported: u32,
    },
    #[error("plugins {first} and {second} cannot be loaded together ({by} declares the conflict)")]
    Declared {
        first: &'static str,
        second: &'static str,
        by: &'static str,
    },
    #[error("plugins {first} and {second} both contribute {what}")]
    Contributed {
        first: &'static str,
        second: &'static str,
        what: String,
    },
    #[error("plugin {plugin} claims route {route:?}, which is not an action the core hands to plugins ({routable})")]
    NotRoutable {
        plugin: &'static str,
        route: &'static str,
        routable: String,
    },
    #[error("plugin {plugin} contributes a mount the sandbox refuses")]
    Bind {
        plugin: &'static str,
        #[source]
        source: allox_sandbox::binds::BindError,
    },
    #[error("plugin {plugin}{} failed to start", alias_note(.alias))]
    Start {
        plugin: &'static str,
        alias: Option<&'static str>,
        #[source]
        source: Cause,
    },
    #[error("plugin {plugin}{} panicked while starting: {why}", alias_note(.alias))]
    StartPanicked {
        plugin: &'static str,
        alias: Option<&'static str>,
        why: String,
    },
    #[error("plugin {plugin} refused the run")]
    Run {
        plugin: &'static str,
        #[source]
        source: Cause,
    },
    #[error("{action} is served by the {plugin} plugin, which is not enabled; start the supervisor with --plugin {plugin}{}", alias_or(.alias))]
    NotEnabled {
        action: &'static str,
        plugin: &'static str,
        alias: Option<&'static str>,
    },
    /// A plugin's own answer to a request it refused.
    #[error("{}", .0.message)]
    Answered(ErrorBody),
    #[error("{action} is served by no installed plugin")]
    NoPlugin { action: &'static str },
    #[error("plugin {plugin} claims {action} but does not answer it")]
    NoHandler {
        plugin: &'static str,
        action: &'static str,
    },
}

fn alias_note(alias: &Option<&'static str>) -> String {
    alias.map(|a| format!(" ({a})")).unwrap_or_default()
}

fn alias_or(alias: &Option<&'static str>) -> String {
    alias.map(|a| format!(" (or {a})")).unwrap_or_default()
}

impl PluginError {
    pub fn code(&self) -> ErrorCode {
        match self {
            PluginError::Answered(b) => b.code,
            PluginError::Unknown { .. }
            | PluginError::ApiVersion { .. }
            | PluginError::Declared { .. }
            | PluginError::Contributed { .. }
            | PluginError::NotRoutable { .. }
            | PluginError::Bind { .. } => ErrorCode::InvalidRequest,
            PluginError::NotEnabled { .. } | PluginError::NoPlugin { .. } => ErrorCode::Unsupported,
            PluginError::Start { .. }
            | PluginError::StartPanicked { .. }
            | PluginError::Run { .. }
            | PluginError::NoHandler { .. } => ErrorCode::Internal,
        }
    }

    /// The error as the client sees it.
    pub fn to_body(&self) -> ErrorBody {
        ErrorBody::new(self.code(), allox_protocol::error_chain(self))
    }
}
