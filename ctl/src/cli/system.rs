//! The daemon as a whole: `shutdown` and `audit` (`ping`, `info`,
//! `plugins` and `check` take nothing and are mapped where they are
//! declared).

use super::Action;
use allox_protocol::{AuditList, Request};
use clap::Args;

/// `alloxctl shutdown`.
#[derive(Args, Debug)]
pub struct ShutdownArgs {
    /// Give up waiting after this many seconds (exit 1); the stop goes
    /// on.
    #[arg(long, value_name = "S", default_value_t = 60)]
    pub wait_s: u64,
}

impl ShutdownArgs {
    pub fn action(self) -> Action {
        Action::Shutdown(std::time::Duration::from_secs(self.wait_s))
    }
}

/// `alloxctl audit`.
#[derive(Args, Debug)]
pub struct AuditArgs {
    /// The oldest records after this sequence number instead.
    #[arg(long, value_name = "SEQ", conflicts_with = "before")]
    pub after: Option<u64>,
    /// The newest records before this sequence number.
    #[arg(long, value_name = "SEQ")]
    pub before: Option<u64>,
    /// At most this many records (the daemon's default is 100).
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,
}

impl AuditArgs {
    pub fn request(self) -> Request {
        Request::AuditList(AuditList {
            after_seq: self.after,
            before_seq: self.before,
            limit: self.limit,
        })
    }
}
