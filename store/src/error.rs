//! Errors of store operations, each mapped to one protocol error code.

use crate::audit::AuditError;
use crate::btrfs::BtrfsError;
use crate::index::IndexError;
use crate::tree::TreeError;
use allox_protocol::{ErrorBody, ErrorCode, IdError};
use std::io;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error(transparent)]
    InvalidId(#[from] IdError),
    #[error("{0}")]
    Invalid(String),
    #[error("{0} does not exist")]
    NotFound(String),
    #[error("{0} already exists")]
    Exists(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("a failed change could not be undone; the store refuses changes until the supervisor restarts")]
    Fenced,
    #[error("only {free_mib} MiB free, at least {need_mib} MiB are kept in reserve")]
    NoSpace { free_mib: u64, need_mib: u64 },
    #[error("the store is read-only ({0}); fix that and restart the supervisor")]
    ReadOnly(String),
    #[error("store root {path} is unusable: {why}")]
    Root { path: String, why: String },
    #[error("disk quota")]
    Quota(#[source] BtrfsError),
    #[error("subvolume operation failed")]
    Btrfs(#[from] BtrfsError),
    #[error("index")]
    Index(#[from] IndexError),
    #[error("audit log")]
    Audit(#[from] AuditError),
    #[error(transparent)]
    Tree(#[from] TreeError),
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
}

impl StoreError {
    pub fn io(op: &'static str, path: &std::path::Path, source: io::Error) -> Self {
        StoreError::Io {
            op,
            path: path.display().to_string(),
            source,
        }
    }

    /// Whether the root cause is a full disk.
    pub fn is_no_space(&self) -> bool {
        if matches!(self, StoreError::NoSpace { .. }) {
            return true;
        }
        if let StoreError::Index(ie) = self {
            if let Some(e) = ie.os_error() {
                return matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT));
            }
        }
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cur {
            if let Some(io) = e.downcast_ref::<io::Error>() {
                if io.raw_os_error() == Some(libc::ENOSPC)
                    || io.raw_os_error() == Some(libc::EDQUOT)
                {
                    return true;
                }
            }
            cur = e.source();
        }
        false
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::InvalidId(_) | StoreError::Invalid(_) => ErrorCode::InvalidRequest,
            StoreError::NotFound(_) => ErrorCode::NotFound,
            StoreError::Exists(_) | StoreError::Conflict(_) => ErrorCode::Conflict,
            StoreError::Unsupported(_) | StoreError::Tree(TreeError::Limit { .. }) => {
                ErrorCode::Unsupported
            }
            StoreError::Tree(TreeError::Changed { .. }) => ErrorCode::Conflict,
            _ if self.is_no_space() => ErrorCode::Unavailable,
            StoreError::Fenced | StoreError::ReadOnly(_) => ErrorCode::Unavailable,
            StoreError::Index(ie) if ie.needs_reopen() || matches!(ie, IndexError::Closed) => {
                ErrorCode::Unavailable
            }
            StoreError::Root { .. } => ErrorCode::Unavailable,
            _ => ErrorCode::Internal,
        }
    }

    /// The whole error chain, once.
    pub fn chain(&self) -> String {
        allox_protocol::error_chain(self)
    }

    pub fn to_body(&self) -> ErrorBody {
        let mut msg = self.chain();
        if self.is_no_space() {
            msg = format!("the store is out of space; free space and retry ({msg})");
        }
        ErrorBody::new(self.code(), msg)
    }
}

impl From<redb::Error> for StoreError {
    fn from(e: redb::Error) -> Self {
        StoreError::Index(IndexError::Db(e))
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
