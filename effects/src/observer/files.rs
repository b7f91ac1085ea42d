//! The `workspace` and `shared` domains: read-only Btrfs snapshots of the
//! session's `current/` and of its agent's workspace (which holds
//! `shared/`; not snapshotted at a point where `shared/` is empty) at A and
//! at B, compared by the store's diff, each changed file's contents hashed
//! on both sides for the evidence.
//!
//! A read-only snapshot cannot change after it is made, so the pair of
//! snapshots is the whole state of both trees at A and B; the diff (with
//! the Btrfs hints for `current/`, a walk for `shared/`) lists every path
//! that differs, in-place edits included, and the hashes make each listed
//! difference checkable from the evidence alone.

use crate::collect::{Capture, Difference};
use allox_protocol::{ChangeKind, EffectChangeKind};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The snapshots taken at one point.
#[derive(Debug)]
pub struct Snapshots {
    /// `<evidence>/<label>-workspace`.
    pub workspace: PathBuf,
    /// `<evidence>/<label>-agent`; `None` when the agent's `shared/` was
    /// empty (or missing) when looked at: an empty tree needs no snapshot
    /// (and its Btrfs commit) to be known.
    pub agent: Option<PathBuf>,
    /// Where [`Snapshots::shared`] points without an agent snapshot: a
    /// path that does not exist, which the diff takes for an empty tree.
    none: PathBuf,
}

/// The points a run's workspaces are snapshotted at, by label: A
/// (before), B (after), C (the check after B).
pub const POINTS: [&str; 3] = ["a", "b", "c"];

/// Where point `label`'s snapshot `what` is in an evidence directory:
/// `<label>-workspace`, `<label>-agent`, or `<label>-agent-empty` (the
/// stand-in for an agent workspace left unsnapshotted).
fn snapshot_path(dir: &Path, label: &str, what: Kept) -> PathBuf {
    dir.join(format!(
        "{label}-{}",
        match what {
            Kept::Workspace => "workspace",
            Kept::Agent => "agent",
            Kept::AgentEmpty => "agent-empty",
        }
    ))
}

#[derive(Clone, Copy)]
enum Kept {
    Workspace,
    Agent,
    AgentEmpty,
}

impl Snapshots {
    /// Snapshots `workspace` and, unless its `shared/` is empty,
    /// `agent_workspace` read-only into `dir` as `<label>-workspace` and
    /// `<label>-agent`.
    ///
    /// An empty `shared/` is read as such at one instant (an entry made
    /// after it was listed is made after this point, as one made after a
    /// snapshot would be), and later compared as an empty tree.
    pub fn take(
        dir: &Path,
        label: &str,
        workspace: &Path,
        agent_workspace: &Path,
    ) -> Result<Snapshots, String> {
        let mut s = Snapshots {
            workspace: snapshot_path(dir, label, Kept::Workspace),
            agent: None,
            none: snapshot_path(dir, label, Kept::AgentEmpty).join("shared"),
        };
        allox_store::btrfs::snapshot(workspace, &s.workspace, true).map_err(|e| {
            format!(
                "snapshot the session's workspace: {}",
                allox_protocol::error_chain(&e)
            )
        })?;
        let empty = match empty_or_missing(&agent_workspace.join("shared")) {
            Ok(e) => e,
            Err(e) => {
                let _ = allox_store::btrfs::delete_subvolume(&s.workspace);
                return Err(e);
            }
        };
        if empty {
            return Ok(s);
        }
        // One after the other: two snapshots asked for at once were slower
        // here than in turn (each waits for the other's commit).
        let agent = snapshot_path(dir, label, Kept::Agent);
        if let Err(e) = allox_store::btrfs::snapshot(agent_workspace, &agent, true) {
            let _ = allox_store::btrfs::delete_subvolume(&s.workspace);
            return Err(format!(
                "snapshot the agent's workspace: {}",
                allox_protocol::error_chain(&e)
            ));
        }
        s.agent = Some(agent);
        Ok(s)
    }

    /// The snapshot's `shared/` (a missing path, an empty tree, when the
    /// agent's workspace was not snapshotted).
    pub fn shared(&self) -> PathBuf {
        match &self.agent {
            Some(a) => a.join("shared"),
            None => self.none.clone(),
        }
    }

    /// Deletes the snapshots.
    pub fn remove(&self) {
        for p in std::iter::once(&self.workspace).chain(self.agent.as_ref()) {
            if let Err(e) = allox_store::btrfs::delete_subvolume(p) {
                eprintln!(
                    "allox-observe: cannot delete the snapshot {}: {e}",
                    p.display()
                );
            }
        }
    }
}

/// Deletes what an observer that did not end its run left in the run's
/// evidence directory `dir`: the snapshots of A, B and C (a copy of the
/// session's `current/` and of the agent's workspace each) and their
/// empty stand-ins. Call it once that observer is gone. What could not
/// be deleted, named.
pub fn remove_left(dir: &Path) -> Vec<String> {
    let mut failed = Vec::new();
    for label in POINTS {
        for kind in [Kept::Workspace, Kept::Agent] {
            let p = snapshot_path(dir, label, kind);
            if std::fs::symlink_metadata(&p).is_err() {
                continue;
            }
            let gone = match allox_store::btrfs::probe_subvolume(&p) {
                Ok(true) => allox_store::btrfs::delete_subvolume(&p).map_err(|e| e.to_string()),
                _ => std::fs::remove_dir_all(&p).map_err(|e| e.to_string()),
            };
            if let Err(e) = gone {
                failed.push(format!("{}: {e}", p.display()));
            }
        }
        let empty = snapshot_path(dir, label, Kept::AgentEmpty);
        if empty.exists() {
            if let Err(e) = std::fs::remove_dir_all(&empty) {
                failed.push(format!("{}: {e}", empty.display()));
            }
        }
    }
    failed
}

/// Whether `dir` has no entry or does not exist; an entry that is not a
/// directory, or one that cannot be listed, is not empty (it is
/// snapshotted and compared as it is).
fn empty_or_missing(dir: &Path) -> Result<bool, String> {
    match std::fs::read_dir(dir) {
        Ok(mut rd) => match rd.next() {
            None => Ok(true),
            Some(Ok(_)) => Ok(false),
            Some(Err(e)) => Err(format!("list {}: {e}", dir.display())),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(_) => Ok(false),
    }
}

/// Most changes listed per domain.
pub const MAX_LISTED: usize = 1000;

/// Most bytes of file contents hashed for one domain's listing, both
/// sides together (about half a second of sha256 here): a file larger
/// than what is left is described by its mode and size, unhashed (`-`), so
/// that a run cannot make its observer read without end (a thousand
/// sparse files of a terabyte cost it nothing to make).
pub const HASHED_BYTES: u64 = 1 << 30;

/// The differences between two trees, each file side given as `size
/// sha256`, and whether the listing was cut; or why the diff failed.
pub fn diff(a: &Path, b: &Path, btrfs: bool) -> Result<(Vec<Difference>, bool), String> {
    let method = if btrfs {
        allox_store::diff::DiffMethod::Btrfs
    } else {
        allox_store::diff::DiffMethod::Walk
    };
    let limits = allox_store::diff::Limits {
        changes: MAX_LISTED,
        ..Default::default()
    };
    let missing = |p: &Path| !p.exists();
    // A `shared/` that does not exist on one side is an empty tree there.
    let empty = tempdir_empty()?;
    let (pa, pb) = (
        if missing(a) { empty.as_path() } else { a },
        if missing(b) { empty.as_path() } else { b },
    );
    let r = allox_store::diff::compare(pa, pb, method, &limits, false)
        .map_err(|e| format!("diff {} and {}: {e}", a.display(), b.display()));
    let _ = std::fs::remove_dir(&empty);
    let mut d = r?;
    if missing(a) || missing(b) {
        // The stand-in's own mode and owner are not the tree's: of a
        // missing side, only what is in it.
        let keep: Vec<bool> = d.changes.iter().map(|c| c.path != ".").collect();
        let mut k = keep.iter();
        d.changes.retain(|_| *k.next().unwrap_or(&true));
        let mut k = keep.iter();
        d.modes.retain(|_| *k.next().unwrap_or(&true));
    }
    let mut budget = HASHED_BYTES;
    let out = d
        .changes
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let [ma, mb] = d.modes.get(i).copied().unwrap_or_default();
            let before = (c.kind != ChangeKind::Added)
                .then(|| describe_known(&pa.join(&c.path), ma, c.size_before, &mut budget));
            let after = (c.kind != ChangeKind::Deleted)
                .then(|| describe_known(&pb.join(&c.path), mb, c.size_after, &mut budget));
            let kind = match c.kind {
                ChangeKind::Added => EffectChangeKind::Added,
                ChangeKind::Deleted => EffectChangeKind::Removed,
                ChangeKind::Modified | ChangeKind::TypeChanged => EffectChangeKind::Modified,
            };
            Difference {
                key: c.path.clone(),
                kind,
                before,
                after,
            }
        })
        .collect();
    Ok((out, d.truncated))
}

fn tempdir_empty() -> Result<PathBuf, String> {
    let p = std::env::temp_dir().join(format!(
        "allox-observe-empty-{}-{}",
        std::process::id(),
        allox_store::clock::now_ms()
    ));
    match std::fs::create_dir(&p) {
        Ok(()) => Ok(p),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(p),
        Err(e) => Err(format!("create {}: {e}", p.display())),
    }
}

/// An entry as the evidence shows it: `file MODE SIZE SHA256` (or, past
/// `budget`, which the hashed bytes come out of, `file MODE SIZE -`),
/// `dir MODE`, `link TARGET`, or a special file's type and mode (`fifo
/// 644`, `socket 755`, `chardev 600 1:3`, `blockdev 660 7:0`); followed,
/// when it has extended attributes, by ` xattrs SHA256` of their names
/// and values ([`xattrs`]). What the diff of the two trees calls a change
/// shows in the description.
pub fn describe(p: &Path, budget: &mut u64) -> String {
    let Ok(md) = std::fs::symlink_metadata(p) else {
        return "missing".into();
    };
    use std::os::unix::fs::MetadataExt;
    let d = describe_stat(p, md.mode(), md.len(), md.rdev(), budget);
    d + &xattrs(p)
}

fn describe_stat(p: &Path, st_mode: u32, len: u64, rdev: u64, budget: &mut u64) -> String {
    let mode = st_mode & 0o7777;
    match st_mode & libc::S_IFMT {
        libc::S_IFLNK => match std::fs::read_link(p) {
            Ok(t) => format!("link {}", t.display()),
            Err(_) => "link ?".into(),
        },
        libc::S_IFDIR => format!("dir {mode:o}"),
        libc::S_IFREG if len == 0 => {
            // Nothing to read: the hash of no bytes.
            format!("file {mode:o} 0 {EMPTY_SHA256}")
        }
        libc::S_IFREG if len > *budget => format!("file {mode:o} {len} {UNHASHED}"),
        libc::S_IFREG => {
            *budget -= len;
            match hash_file(p) {
                Ok(h) => format!("file {mode:o} {len} {h}"),
                Err(e) => format!("file {mode:o} {len} unreadable: {e}"),
            }
        }
        kind => special(kind, mode, rdev),
    }
}

/// A special file's description: its type, its mode, a device's number.
fn special(kind: u32, mode: u32, rdev: u64) -> String {
    let dev = || format!("{}:{}", libc::major(rdev), libc::minor(rdev));
    match kind {
        libc::S_IFIFO => format!("fifo {mode:o}"),
        libc::S_IFSOCK => format!("socket {mode:o}"),
        libc::S_IFCHR => format!("chardev {mode:o} {}", dev()),
        libc::S_IFBLK => format!("blockdev {mode:o} {}", dev()),
        _ => format!("special {mode:o}"),
    }
}

/// ` xattrs SHA256` of `p`'s extended attributes (not followed through a
/// symlink; read as the store's diff reads them,
/// [`allox_store::diff::path_xattrs`]), each `name NUL value NUL` in name
/// order; empty when it has none or is gone (a gone path is described by
/// what else is known of it), ` xattrs ?` when they cannot be read.
pub fn xattrs(p: &Path) -> String {
    let list = match allox_store::diff::path_xattrs(p) {
        Ok(list) => list,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return String::new(),
        Err(_) => return " xattrs ?".into(),
    };
    if list.is_empty() {
        return String::new();
    }
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for (name, value) in &list {
        h.update(name);
        h.update([0]);
        h.update(value);
        h.update([0]);
    }
    format!(" xattrs {:x}", h.finalize())
}

/// [`describe`] of an entry of a tree that does not change (a snapshot),
/// whose `st_mode` (and, for a file, size) the diff already read: a
/// directory or an empty file is described without a `stat` (which reads
/// the inode from a tree no cache holds yet: about 20 µs in a new
/// snapshot), its extended attributes listed; anything else as
/// `describe` does.
pub fn describe_known(p: &Path, mode: Option<u32>, size: Option<u64>, budget: &mut u64) -> String {
    let Some(mode) = mode else {
        return describe(p, budget);
    };
    match mode & libc::S_IFMT {
        libc::S_IFDIR => describe_stat(p, mode, 0, 0, budget) + &xattrs(p),
        libc::S_IFREG if size == Some(0) => describe_stat(p, mode, 0, 0, budget) + &xattrs(p),
        // A device's number is read with the rest.
        _ => describe(p, budget),
    }
}

/// What stands for the hash of a file past the hashing budget (as in the
/// filesystem domain's walk, `collect::tree`).
pub const UNHASHED: &str = "-";

/// Whether a description names a file whose contents it does not give
/// (unhashed, or unreadable): two of them may be alike while the contents
/// differ.
pub fn contents_unknown(description: &str) -> bool {
    description.starts_with("file ")
        && (description.split(' ').nth(3) == Some(UNHASHED)
            || description.contains(" unreadable: "))
}

/// sha256 of no bytes.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn hash_file(p: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut f = std::fs::File::open(p)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(crate::chain::hex(&h.finalize()))
}

/// A capture of what the snapshots are (for the evidence at A): their
/// paths and Btrfs generations.
pub fn identity(s: &Snapshots) -> Capture {
    let mut c = Capture::new();
    for (k, p) in [
        ("workspace", Some(&s.workspace)),
        ("agent", s.agent.as_ref()),
    ] {
        let Some(p) = p else {
            c.insert(
                format!("snapshot {k}"),
                "none: shared/ was empty".to_string(),
            );
            continue;
        };
        match allox_store::btrfs::subvolume_id(p) {
            Ok(id) => c.insert(
                format!("snapshot {k}"),
                format!("{} subvolume {id}", p.display()),
            ),
            Err(e) => c.gap(format!("snapshot {k}: {e}")),
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    /// A budget that nothing here reaches.
    fn unlimited() -> u64 {
        u64::MAX
    }

    #[test]
    fn an_empty_file_is_described_with_the_hash_of_no_bytes() {
        assert_eq!(EMPTY_SHA256, crate::chain::hex(&Sha256::digest(b"")));
        let dir = std::env::temp_dir().join(format!("allox-describe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (empty, one) = (dir.join("empty"), dir.join("one"));
        std::fs::write(&empty, b"").unwrap();
        std::fs::write(&one, b"x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        for p in [&empty, &one] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o640)).unwrap();
        }
        assert_eq!(
            describe(&empty, &mut unlimited()),
            format!("file 640 0 {EMPTY_SHA256}")
        );
        let x = crate::chain::hex(&Sha256::digest(b"x"));
        assert_eq!(describe(&one, &mut unlimited()), format!("file 640 1 {x}"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// With the mode (and size) the diff read, an entry is described as
    /// `describe` describes it; a directory or an empty file without a
    /// `stat` (the one asked for here is gone), anything else from the
    /// path.
    #[test]
    fn an_entry_whose_mode_is_known_is_described_as_its_stat_would_be() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("allox-describe-known-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("empty"), b"").unwrap();
        std::fs::write(dir.join("one"), b"x").unwrap();
        std::os::unix::fs::symlink("one", dir.join("link")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        for name in ["sub", "empty", "one", "link", "fifo"] {
            let p = dir.join(name);
            let md = std::fs::symlink_metadata(&p).unwrap();
            let size = (!md.is_dir()).then_some(md.len());
            assert_eq!(
                describe_known(&p, Some(md.mode()), size, &mut unlimited()),
                describe(&p, &mut unlimited()),
                "{name}"
            );
            assert_eq!(
                describe_known(&p, None, size, &mut unlimited()),
                describe(&p, &mut unlimited()),
                "{name}"
            );
        }
        let gone = dir.join("gone");
        assert_eq!(describe(&gone, &mut unlimited()), "missing");
        let dir_mode = libc::S_IFDIR | 0o750;
        assert_eq!(
            describe_known(&gone, Some(dir_mode), None, &mut unlimited()),
            "dir 750"
        );
        let file_mode = libc::S_IFREG | 0o600;
        assert_eq!(
            describe_known(&gone, Some(file_mode), Some(0), &mut unlimited()),
            format!("file 600 0 {EMPTY_SHA256}")
        );
        assert_eq!(
            describe_known(&gone, Some(file_mode), Some(1), &mut unlimited()),
            "missing"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// What the store's diff calls a change shows in the description: a
    /// file's extended attributes (set, changed, removed), a special
    /// file's mode and type, a directory's attributes. (Before, both sides
    /// read alike, and the verifier refused the run's own evidence.)
    #[test]
    fn xattrs_and_a_special_file_s_mode_are_described() {
        let dir =
            std::env::temp_dir().join(format!("allox-describe-xattrs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let f = dir.join("f");
        std::fs::write(&f, b"data").unwrap();
        let plain = describe(&f, &mut unlimited());
        let set = |p: &Path, v: &[u8]| {
            rustix::fs::lsetxattr(p, "user.note", v, rustix::fs::XattrFlags::empty())
                .unwrap_or_else(|e| {
                    panic!(
                        "user xattrs on {}: {e} (the test needs a filesystem with user xattrs)",
                        p.display()
                    )
                })
        };
        set(&f, b"1");
        let one = describe(&f, &mut unlimited());
        set(&f, b"2");
        let two = describe(&f, &mut unlimited());
        assert!(one.starts_with(&plain) && one.contains(" xattrs "), "{one}");
        assert!(plain != one && one != two, "{plain} / {one} / {two}");
        rustix::fs::lremovexattr(&f, "user.note").unwrap();
        assert_eq!(describe(&f, &mut unlimited()), plain);
        // The contents stay known with attributes after the hash.
        assert!(!contents_unknown(&one));
        let mut none = 0;
        let unhashed = describe(&f, &mut none);
        set(&f, b"1");
        assert!(contents_unknown(&describe(&f, &mut none)), "{unhashed}");
        // A directory's attributes, through describe_known too.
        let sub = dir.join("sub");
        let before = describe(&sub, &mut unlimited());
        set(&sub, b"d");
        use std::os::unix::fs::MetadataExt;
        let mode = std::fs::symlink_metadata(&sub).unwrap().mode();
        let after = describe_known(&sub, Some(mode), None, &mut unlimited());
        assert!(
            before != after && after == describe(&sub, &mut unlimited()),
            "{before} / {after}"
        );
        // A FIFO's mode.
        let fifo = dir.join("p");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        rustix::fs::chmod(&fifo, rustix::fs::Mode::from_raw_mode(0o644)).unwrap();
        assert_eq!(describe(&fifo, &mut unlimited()), "fifo 644");
        rustix::fs::chmod(&fifo, rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
        assert_eq!(describe(&fifo, &mut unlimited()), "fifo 600");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The hashed bytes come out of the budget; a file larger than what
    /// is left is described by its mode and size without being read, and
    /// leaves the budget as it was.
    #[test]
    fn a_file_past_the_hashing_budget_is_described_unhashed() {
        use std::os::unix::fs::PermissionsExt;
        let dir =
            std::env::temp_dir().join(format!("allox-describe-budget-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (small, large) = (dir.join("small"), dir.join("large"));
        std::fs::write(&small, b"abc").unwrap();
        std::fs::write(&large, b"abcdefgh").unwrap();
        for p in [&small, &large] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let abc = crate::chain::hex(&Sha256::digest(b"abc"));
        let mut budget = 10;
        assert_eq!(describe(&small, &mut budget), format!("file 600 3 {abc}"));
        assert_eq!(budget, 7);
        let unhashed = describe(&large, &mut budget);
        assert_eq!(unhashed, "file 600 8 -");
        assert!(contents_unknown(&unhashed));
        assert!(!contents_unknown(&format!("file 600 3 {abc}")));
        assert_eq!(budget, 7, "an unhashed file costs nothing");
        assert_eq!(describe(&small, &mut budget), format!("file 600 3 {abc}"));
        assert_eq!(budget, 4);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
