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
            workspace: dir.join(format!("{label}-workspace")),
            agent: None,
            none: dir.join(format!("{label}-agent-empty")).join("shared"),
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
        let agent = dir.join(format!("{label}-agent"));
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
    let d = r?;
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
/// `dir MODE`, `link TARGET`, or its type.
pub fn describe(p: &Path, budget: &mut u64) -> String {
    let Ok(md) = std::fs::symlink_metadata(p) else {
        return "missing".into();
    };
    let ft = md.file_type();
    if ft.is_symlink() {
        return match std::fs::read_link(p) {
            Ok(t) => format!("link {}", t.display()),
            Err(_) => "link ?".into(),
        };
    }
    if ft.is_dir() {
        use std::os::unix::fs::PermissionsExt;
        return format!("dir {:o}", md.permissions().mode() & 0o7777);
    }
    if !ft.is_file() {
        return "special".into();
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = md.permissions().mode() & 0o7777;
    if md.len() == 0 {
        // Nothing to read: the hash of no bytes.
        return format!("file {:o} 0 {EMPTY_SHA256}", mode);
    }
    if md.len() > *budget {
        return format!("file {:o} {} {UNHASHED}", mode, md.len());
    }
    *budget -= md.len();
    match hash_file(p) {
        Ok(h) => format!("file {:o} {} {h}", mode, md.len()),
        Err(e) => format!("file {:o} {} unreadable: {e}", mode, md.len()),
    }
}

/// [`describe`] of an entry of a tree that does not change (a snapshot),
/// whose `st_mode` (and, for a file, size) the diff already read: a
/// directory, an empty file or a special file is described without a
/// `stat` (which reads the inode from a tree no cache holds yet: about
/// 20 µs in a new snapshot); anything else as `describe` does.
pub fn describe_known(p: &Path, mode: Option<u32>, size: Option<u64>, budget: &mut u64) -> String {
    let Some(mode) = mode else {
        return describe(p, budget);
    };
    let perm = mode & 0o7777;
    match mode & libc::S_IFMT {
        libc::S_IFDIR => format!("dir {perm:o}"),
        libc::S_IFREG if size == Some(0) => format!("file {perm:o} 0 {EMPTY_SHA256}"),
        libc::S_IFREG | libc::S_IFLNK => describe(p, budget),
        _ => "special".into(),
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
        && (description.ends_with(&format!(" {UNHASHED}")) || description.contains(" unreadable: "))
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
    /// `describe` describes it; a directory, an empty file or a special
    /// file without reading the path at all (the one asked for here is
    /// gone), anything else from the path.
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
