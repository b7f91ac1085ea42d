//! Why plugins could not be loaded or started, or a request could not
//! reach one: the core's side. A plugin's own error is the plugin API's
//! [`PluginError`], carried through unchanged.

use crate::plugin_api::{alias_note, PluginError};
use allox_protocol::{ErrorBody, ErrorCode};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PluginHostError {
    /// What the plugin itself said.
    #[error(transparent)]
    Plugin(#[from] PluginError),
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
    #[error("the request table gives {action} to plugin {plugin}, which is not installed (installed: {installed})")]
    NoSuchOwner {
        action: &'static str,
        plugin: &'static str,
        installed: String,
    },
    #[error("plugin {plugin} contributes a mount the sandbox refuses")]
    Bind {
        plugin: &'static str,
        #[source]
        source: allox_sandbox::binds::BindError,
    },
    #[error("plugin {plugin}{} panicked while starting: {why}", alias_note(.alias))]
    StartPanicked {
        plugin: &'static str,
        alias: Option<&'static str>,
        why: String,
    },
    #[error("{action} is served by the {plugin} plugin, which is not enabled; start the supervisor with --plugin {plugin}{}", alias_or(.alias))]
    NotEnabled {
        action: &'static str,
        plugin: &'static str,
        alias: Option<&'static str>,
    },
    #[error("{action} is served by plugin {plugin}, which this allox-init was built without (cargo feature {plugin} of allox-init)")]
    NotBuilt {
        action: &'static str,
        plugin: &'static str,
    },
    #[error("plugin {name} is not built into this allox-init (built in: {installed}); build it with its cargo feature: cargo build -p allox-init --features {name}")]
    NotBuiltIn {
        name: &'static str,
        installed: String,
    },
    #[error("{action} is served by the core, not by a plugin")]
    NotAPluginRoute { action: &'static str },
}

fn alias_or(alias: &Option<&'static str>) -> String {
    alias.map(|a| format!(" (or {a})")).unwrap_or_default()
}

impl PluginHostError {
    pub fn code(&self) -> ErrorCode {
        match self {
            PluginHostError::Plugin(e) => e.code(),
            PluginHostError::Unknown { .. }
            | PluginHostError::NotBuiltIn { .. }
            | PluginHostError::ApiVersion { .. }
            | PluginHostError::Declared { .. }
            | PluginHostError::Contributed { .. }
            | PluginHostError::NoSuchOwner { .. }
            | PluginHostError::Bind { .. } => ErrorCode::InvalidRequest,
            PluginHostError::NotEnabled { .. } | PluginHostError::NotBuilt { .. } => {
                ErrorCode::Unsupported
            }
            PluginHostError::StartPanicked { .. } | PluginHostError::NotAPluginRoute { .. } => {
                ErrorCode::Internal
            }
        }
    }

    /// The error as the client sees it.
    pub fn to_body(&self) -> ErrorBody {
        match self {
            PluginHostError::Plugin(e) => e.to_body(),
            _ => ErrorBody::new(self.code(), allox_protocol::error_chain(self)),
        }
    }
}
