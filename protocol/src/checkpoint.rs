//! Checkpoints: read-only copies of a session's `current/`, and what
//! changed between two of them (`checkpoint.create|list|delete|pin`,
//! `checkpoint.diff`).

use crate::target::target;
use serde::{Deserialize, Serialize};

/// `checkpoint.diff`: what changed between two checkpoints of a session
/// (`current` names the session's `current/`).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointDiff {
    pub agent_id: String,
    pub session_id: String,
    pub from: String,
    pub to: String,
    /// Also answer each changed file's contents, as `git diff` shows
    /// them, in its change's `patch` (within the answer's bounds).
    #[serde(default)]
    pub patch: bool,
}

target!(CheckpointDiff, |r| format!(
    "{}/{}/{}..{}",
    r.agent_id, r.session_id, r.from, r.to
));

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRef {
    pub agent_id: String,
    pub session_id: String,
    pub checkpoint_id: String,
}

target!(CheckpointRef: agent_id, session_id, checkpoint_id);

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointCreate {
    pub agent_id: String,
    pub session_id: String,
    pub checkpoint_id: String,
    /// A pinned checkpoint cannot be deleted until it is unpinned.
    #[serde(default)]
    pub pinned: bool,
    /// Free text for people, at most 256 bytes.
    #[serde(default)]
    pub label: Option<String>,
}

target!(CheckpointCreate: agent_id, session_id, checkpoint_id);

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointPin {
    pub agent_id: String,
    pub session_id: String,
    pub checkpoint_id: String,
    pub pinned: bool,
}

target!(CheckpointPin: agent_id, session_id, checkpoint_id);

/// Why a checkpoint exists.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Asked for with `checkpoint.create`.
    Manual,
    /// Taken when the session was created.
    Baseline,
    /// Taken when a turn ended.
    Turn,
    /// Found on disk without an index entry and adopted at start-up.
    Recovered,
    /// The first checkpoint of a session made by `session.fork`.
    Fork,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Manual => "manual",
            Origin::Baseline => "baseline",
            Origin::Turn => "turn",
            Origin::Recovered => "recovered",
            Origin::Fork => "fork",
        }
    }
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct CheckpointInfo {
    pub agent_id: String,
    pub session_id: String,
    pub checkpoint_id: String,
    /// The checkpoint `current/` descended from when this one was taken.
    pub parent: Option<String>,
    pub created_ms: u64,
    pub origin: Origin,
    pub pinned: bool,
    pub label: Option<String>,
    /// The turn whose end took it (origin `turn`).
    pub turn_id: Option<String>,
    /// Where a forked session came from (its baseline, origin `fork`).
    #[serde(default)]
    pub forked_from: Option<Box<ForkPoint>>,
}

/// The session and checkpoint a session was forked from (`checkpoint_id`
/// `None`: its `current/` at the time of the fork).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct ForkPoint {
    pub agent_id: String,
    pub session_id: String,
    pub checkpoint_id: Option<String>,
    pub forked_ms: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct CheckpointListing {
    pub agent_id: String,
    pub session_id: String,
    /// The checkpoint `current/` descends from.
    pub head: Option<String>,
    /// Oldest first.
    pub checkpoints: Vec<CheckpointInfo>,
}

/// How a path differs.
#[derive(
    Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
    /// File, directory and symlink turned into one another.
    TypeChanged,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct Change {
    /// Relative to the workspace root, `/`-separated.
    pub path: String,
    pub kind: ChangeKind,
    pub size_before: Option<u64>,
    pub size_after: Option<u64>,
    /// With `checkpoint.diff {patch: true}`, for a regular file or a
    /// symlink: the change as `git diff` shows it — a `diff --git` line,
    /// mode lines, `--- a/PATH` / `+++ b/PATH` (`/dev/null` for a side
    /// that has none) and unified hunks with 3 lines of context; a symlink
    /// as the text of its target; for a binary file (a NUL byte in its
    /// first 8 KiB, or not UTF-8) the note `Binary files a/PATH and
    /// b/PATH differ`. None for directories and special files, and when
    /// the answer had no room left (see `patch_truncated`).
    #[serde(default)]
    pub patch: Option<String>,
    /// The patch is cut short (the hunks that are there well-formed, the
    /// rest left out) or left out, to keep the answer within its bounds.
    #[serde(default)]
    pub patch_truncated: bool,
    /// `path` is not the name as it is, which is not UTF-8: it is written
    /// with each byte that is not as `\xNN` and each `\` as `\\`
    /// ([`crate::path_from_bytes`]).
    #[serde(default)]
    pub escaped: bool,
    /// Listed `modified` without its bytes compared: its metadata moved,
    /// and the diff's read budget (256 MiB of contents) ran out before it.
    #[serde(default)]
    pub unread: bool,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct DiffListing {
    pub from: String,
    pub to: String,
    /// Sorted by path; at most 10,000 (see `truncated`).
    pub changes: Vec<Change>,
    pub truncated: bool,
    pub added: u64,
    pub modified: u64,
    pub deleted: u64,
    pub type_changed: u64,
    /// Some listed change's patch is cut short or left out (its own
    /// `patch_truncated` says which): the patches of one answer hold at
    /// most 512 KiB, 64 KiB per file.
    #[serde(default)]
    pub patch_truncated: bool,
}
