//! The file API: a session's files (its `current/`), its agent's
//! `shared/`, or a checkpoint's (read-only), moved and read without a
//! process. Paths are relative to the scope's root and never leave it.

use crate::target::target;
use crate::Bytes;
use serde::{Deserialize, Serialize};

/// Where a path is relative to.
#[derive(
    Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum FsScope {
    /// The session's `current/` (or, with `checkpoint_id`, that
    /// checkpoint's tree, read-only).
    #[default]
    Session,
    /// The agent's `shared/`.
    Shared,
}

impl FsScope {
    pub fn as_str(self) -> &'static str {
        match self {
            FsScope::Session => "session",
            FsScope::Shared => "shared",
        }
    }
}

/// A file request's target as the audit names it: `agent/session:path`, or
/// `agent/session:shared:path`.
fn fs_target(a: &str, s: &str, scope: FsScope, path: &str) -> String {
    match scope {
        FsScope::Session => format!("{a}/{s}:{path}"),
        FsScope::Shared => format!("{a}/{s}:shared:{path}"),
    }
}

/// `fs.stat`: what is at a path (a symbolic link itself, not its target).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FsStat {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub scope: FsScope,
    /// Read the tree as it was at this checkpoint.
    #[serde(default)]
    pub checkpoint_id: Option<String>,
    pub path: String,
}

target!(FsStat, |r| fs_target(
    &r.agent_id,
    &r.session_id,
    r.scope,
    &r.path
));

/// `fs.list`: a directory's entries, sorted by path; with `depth` > 1, its
/// subdirectories' too (symbolic links are not followed).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FsList {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub scope: FsScope,
    #[serde(default)]
    pub checkpoint_id: Option<String>,
    /// `""` or `"."` for the scope's root.
    #[serde(default)]
    pub path: String,
    /// How many levels (default 1, at most 64).
    #[serde(default)]
    pub depth: Option<u32>,
}

target!(FsList, |r| fs_target(
    &r.agent_id,
    &r.session_id,
    r.scope,
    &r.path
));

/// `fs.read`: bytes of a file, from `offset`, at most `length` (and at most
/// [`FS_CHUNK`] in one answer: read on from `offset + data.len()` until
/// `eof`).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FsRead {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub scope: FsScope,
    #[serde(default)]
    pub checkpoint_id: Option<String>,
    pub path: String,
    #[serde(default)]
    pub offset: Option<u64>,
    #[serde(default)]
    pub length: Option<u64>,
}

target!(FsRead, |r| fs_target(
    &r.agent_id,
    &r.session_id,
    r.scope,
    &r.path
));

/// `fs.upload_local`: the whole file at `path` becomes the bytes of the
/// regular file whose descriptor comes with the request (`SCM_RIGHTS`
/// over the daemon's Unix socket, open for reading), from its start to
/// its end: written beside the target and renamed into place, as an
/// `fs.write` without `offset`. The daemon moves the bytes itself (a
/// reflink where both are on one Btrfs, else `copy_file_range`); over a
/// transport that cannot pass descriptors (the VM's control port) it is
/// refused `unsupported`, and the client sends the file in `fs.write`
/// chunks instead.
///
/// With `upload` (an id the client chooses, as `fs.write`'s) the request
/// is one chunk of an upload instead: the passed file's bytes from
/// `offset` (`length` of them, or to its end) are written at the same
/// offset of the upload's file beside the target, and the chunk marked
/// `commit` makes that file the target once every byte before it came.
/// A client that is still receiving a file (the gateway spooling a
/// request's body) passes each part as it has it. Chunks of one upload
/// may be sent in frames (`fs.write`) and passed alike.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FsUploadLocal {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub scope: FsScope,
    pub path: String,
    /// Whether a missing file may be made (default true).
    #[serde(default)]
    pub create: Option<bool>,
    /// The upload this chunk is of; none: the whole file at once.
    #[serde(default)]
    pub upload: Option<String>,
    /// Where the chunk begins, in the passed file and in the target
    /// (default 0; with `upload` only).
    #[serde(default)]
    pub offset: Option<u64>,
    /// How many bytes the chunk has (default: to the passed file's end;
    /// with `upload` only).
    #[serde(default)]
    pub length: Option<u64>,
    /// The last chunk: the upload becomes the target (with `upload`
    /// only).
    #[serde(default)]
    pub commit: bool,
}

impl FsUploadLocal {
    /// The whole of the passed file as `path`.
    pub fn whole(agent_id: &str, session_id: &str, scope: FsScope, path: &str) -> FsUploadLocal {
        FsUploadLocal {
            agent_id: agent_id.into(),
            session_id: session_id.into(),
            scope,
            path: path.into(),
            create: None,
            upload: None,
            offset: None,
            length: None,
            commit: false,
        }
    }
}

target!(FsUploadLocal, |r| fs_target(
    &r.agent_id,
    &r.session_id,
    r.scope,
    &r.path
));

/// `fs.download_local`: the daemon writes the regular file at `path` (of
/// `current/`, or of a checkpoint) into the regular file whose descriptor
/// comes with the request (open for writing, not appending), from its
/// start, and cuts it to the file's size. Refused `unsupported` where
/// descriptors cannot pass, as [`FsUploadLocal`].
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FsDownloadLocal {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub scope: FsScope,
    #[serde(default)]
    pub checkpoint_id: Option<String>,
    pub path: String,
}

target!(FsDownloadLocal, |r| fs_target(
    &r.agent_id,
    &r.session_id,
    r.scope,
    &r.path
));

impl crate::Request {
    /// Whether the request comes with a descriptor ([`FsUploadLocal`],
    /// [`FsDownloadLocal`], [`crate::PortConnect`]).
    pub fn passes_descriptor(&self) -> bool {
        matches!(
            self,
            crate::Request::FsUploadLocal(_)
                | crate::Request::FsDownloadLocal(_)
                | crate::Request::PortConnect(_)
        )
    }
}

/// How the bytes of an `fs.upload_local` or `fs.download_local` moved.
#[derive(
    Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum CopiedBy {
    /// The target shares the source's extents (one Btrfs, `FICLONE`).
    Reflink,
    /// The kernel copied them (`copy_file_range`).
    #[default]
    CopyFileRange,
    /// The kernel copied them through the page cache (`sendfile`), where
    /// it does not copy between the two filesystems.
    Sendfile,
}

/// The answer to `fs.upload_local` and `fs.download_local`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct FsCopied {
    pub path: String,
    pub size: u64,
    pub by: CopiedBy,
}

/// The most bytes one `fs.read` answers, and the most one `fs.write`
/// chunk should carry (a frame is at most 1 MiB).
pub const FS_CHUNK: u64 = 512 * 1024;

/// `fs.write`. Without `upload`: with no `offset`, `data` replaces the
/// whole file at once (written beside it, then renamed into place); with
/// an `offset`, `data` is written there in the file itself (`truncate`
/// cuts the file after it). With `upload` (an id the client chooses):
/// chunks are written at their `offset` into a file beside the target,
/// which replaces the target only with the chunk marked `commit`; an
/// upload left unfinished never touches the target, and its file is
/// removed at the daemon's next start.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FsWrite {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub scope: FsScope,
    pub path: String,
    #[serde(default)]
    pub data: Bytes,
    #[serde(default)]
    pub offset: Option<u64>,
    /// Make the file if it does not exist (default true).
    #[serde(default)]
    pub create: Option<bool>,
    #[serde(default)]
    pub truncate: bool,
    #[serde(default)]
    pub upload: Option<String>,
    #[serde(default)]
    pub commit: bool,
    /// With `upload`: drops that upload (its partial file and its record;
    /// `data` and `offset` are not read), so that it no longer counts
    /// against the session's budget of uploads under way. A client whose
    /// source failed half-way sends it.
    #[serde(default)]
    pub abort: bool,
}

target!(FsWrite, |r| fs_target(
    &r.agent_id,
    &r.session_id,
    r.scope,
    &r.path
));

impl FsWrite {
    /// The whole file `path` of session `a/s` becomes `data`.
    pub fn whole(a: &str, s: &str, path: &str, data: impl Into<Bytes>) -> FsWrite {
        FsWrite {
            agent_id: a.into(),
            session_id: s.into(),
            scope: FsScope::Session,
            path: path.into(),
            data: data.into(),
            offset: None,
            create: None,
            truncate: false,
            upload: None,
            commit: false,
            abort: false,
        }
    }
}

/// `fs.mkdir`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FsMkdir {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub scope: FsScope,
    pub path: String,
    /// Make missing parents too, and accept a directory already there.
    #[serde(default)]
    pub parents: bool,
}

target!(FsMkdir, |r| fs_target(
    &r.agent_id,
    &r.session_id,
    r.scope,
    &r.path
));

/// `fs.remove`: a file, a symbolic link, an empty directory, or with
/// `recursive` a whole tree.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FsRemove {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub scope: FsScope,
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
}

target!(FsRemove, |r| fs_target(
    &r.agent_id,
    &r.session_id,
    r.scope,
    &r.path
));

/// `fs.move`: renames `path` to `to` (in the same scope), replacing a file
/// there.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FsMove {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub scope: FsScope,
    pub path: String,
    pub to: String,
}

target!(FsMove, |r| fs_target(
    &r.agent_id,
    &r.session_id,
    r.scope,
    &r.path
));

/// `fs.watch`: changes below a directory of the session's files (or of
/// `shared/`), as stream events (binary protocol only) until the client
/// goes: first one `ready` once the watch is in place, then each change;
/// a rollback of the session is one `rolled_back`, after which the new
/// tree is watched.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FsWatch {
    pub agent_id: String,
    pub session_id: String,
    #[serde(default)]
    pub scope: FsScope,
    #[serde(default)]
    pub path: String,
    /// Its subdirectories too (and those made later).
    #[serde(default)]
    pub recursive: bool,
}

target!(FsWatch, |r| fs_target(
    &r.agent_id,
    &r.session_id,
    r.scope,
    &r.path
));

/// What happened at a path.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FsChange {
    /// The watch is in place: changes from now on are reported.
    Ready,
    Created,
    Modified,
    Removed,
    /// Renamed to `to` (both below the watched directory).
    Moved,
    /// The session was rolled back: its whole tree was replaced.
    RolledBack,
    /// The watch covers as many directories as one may (10,000): `path`,
    /// and any directory made after it, is not watched, and changes in
    /// them are not reported (sent once; watch a smaller tree).
    Incomplete,
}

/// One change an `fs.watch` reports.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct FsEvent {
    pub change: FsChange,
    /// Relative to the scope's root (`.` for `ready` and `rolled_back`).
    pub path: String,
    pub to: Option<String>,
    /// Whether it is a directory.
    pub dir: bool,
    /// `path` or `to` is not the name as it is, which is not UTF-8: both
    /// are written as [`crate::path_from_bytes`] writes such a name (as in
    /// `fs.list`: each byte that is not UTF-8 as `\xNN`, each `\` as `\\`).
    #[serde(default)]
    pub escaped: bool,
}

/// What kind of thing is at a path.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FsKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// One entry.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct FsEntry {
    /// Relative to the scope's root.
    pub path: String,
    pub kind: FsKind,
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Last modification, milliseconds since the Unix epoch.
    pub mtime_ms: u64,
    /// A symbolic link's target, as written.
    pub link: Option<String>,
    /// `path` (or `link`) is not the name as it is, which is not UTF-8:
    /// it is written with each byte that is not as `\xNN` and each `\` as
    /// `\\` ([`crate::path_from_bytes`]), names nothing to the file API, and
    /// such an entry cannot be copied out.
    #[serde(default)]
    pub escaped: bool,
}

/// A name of bytes as an answer carries it: as it is when it is UTF-8
/// (`false`); else escaped (`true`): each byte of it that is not UTF-8 as
/// `\xNN`, each `\` as `\\`, so that no two names come out the same (a
/// lossy conversion would give `x\xff` and `x\u{fffd}` one name).
pub fn path_from_bytes(b: &[u8]) -> (String, bool) {
    match std::str::from_utf8(b) {
        Ok(s) => (s.to_owned(), false),
        Err(_) => {
            let mut out = String::with_capacity(b.len() + 8);
            for chunk in b.utf8_chunks() {
                for c in chunk.valid().chars() {
                    if c == '\\' {
                        out.push_str("\\\\");
                    } else {
                        out.push(c);
                    }
                }
                for x in chunk.invalid() {
                    out.push_str(&format!("\\x{x:02x}"));
                }
            }
            (out, true)
        }
    }
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct FsListing {
    pub entries: Vec<FsEntry>,
    /// Whether the answer was cut at its limit (10,000 entries).
    pub truncated: bool,
}

/// The answer to `fs.read`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct FsData {
    pub path: String,
    pub offset: u64,
    pub data: Bytes,
    /// The file's size when it was read.
    pub size: u64,
    /// Whether `data` reaches the end of the file.
    pub eof: bool,
    /// The file's inode number: a file read in chunks whose number
    /// changes between them was replaced at its path meanwhile (the chunks
    /// are of two files), where one that only grew keeps it.
    #[serde(default)]
    pub inode: u64,
}

/// The answer to `fs.write`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct FsWritten {
    pub path: String,
    /// The file's size (an upload's: what it has so far).
    pub size: u64,
    /// Whether the target now has what was written (false for an upload's
    /// chunk before its `commit`).
    pub committed: bool,
}

#[cfg(test)]
mod tests {
    use super::path_from_bytes;

    #[test]
    fn a_name_that_is_not_utf8_is_escaped_so_no_two_names_are_one() {
        assert_eq!(path_from_bytes(b"a/b c\\d"), ("a/b c\\d".into(), false));
        assert_eq!(
            path_from_bytes("x\u{fffd}".as_bytes()),
            ("x\u{fffd}".into(), false)
        );
        assert_eq!(path_from_bytes(b"x\xff"), ("x\\xff".into(), true));
        assert_eq!(path_from_bytes(b"\\x\xfe"), ("\\\\x\\xfe".into(), true));
        // A name that is written as another's escape is not that name.
        assert_ne!(
            path_from_bytes(b"x\\xff\xfe").0,
            path_from_bytes(b"x\xff\xfe").0
        );
        assert!(!path_from_bytes("é\u{0}".as_bytes()).1);
        assert_eq!(path_from_bytes(b"\xc3").0, "\\xc3");
    }
}
