//! The audit log: one record per state-changing request, paged either
//! way (`audit.list`).

use crate::target::target;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct AuditList {
    /// The oldest records with a sequence number above this (paging
    /// forward).
    #[serde(default)]
    pub after_seq: Option<u64>,
    /// At most this many records (default 100, at most 10,000, and at most
    /// 512 KiB of them: the rest are on the next page).
    #[serde(default)]
    pub limit: Option<u32>,
    /// The newest records with a sequence number below this (paging back).
    /// With neither cursor, the newest records of all.
    #[serde(default)]
    pub before_seq: Option<u64>,
}

target!(AuditList);

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct AuditRecord {
    /// Position in the audit log, from 1, without gaps.
    pub seq: u64,
    pub time_ms: u64,
    pub request_id: u64,
    /// Who asked (`uid=0 pid=42`, `startup`, ...).
    pub peer: String,
    pub action: String,
    pub target: String,
    /// `begun` (written before the request is acted on), then `ok`, an
    /// error code, or `cancelled` (its connection ended before the answer).
    pub outcome: String,
    pub message: Option<String>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct AuditListing {
    /// Oldest first.
    pub records: Vec<AuditRecord>,
    /// Records whose checksum did not match and were skipped.
    pub corrupt: u64,
    /// Older records exist: ask again with `before_seq` set to this (the
    /// first listed record's sequence number).
    #[serde(default)]
    pub earlier: Option<u64>,
    /// Newer records exist: ask again with `after_seq` set to this (the
    /// last listed record's sequence number).
    #[serde(default)]
    pub later: Option<u64>,
}
