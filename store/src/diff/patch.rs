//! Patches: each listed change of a regular file or a symlink as
//! `git diff` shows it, read and written within the answer's bounds.
//!
//! The walk is done; each listed path is reached again from the two roots,
//! one name at a time ([`tree::open_dir_below`]), and a file is opened
//! with [`tree::open_regular`] against what `stat` has just seen: no
//! symlink is followed, no FIFO waited on. A live tree may have changed
//! since the walk; the patch shows what is there when it is read.
//!
//! Bounds ([`Limits`]): the patches of one answer hold at most
//! `patch_bytes`, and no more than what the listing leaves of
//! `answer_bytes`, so the answer fits one frame; one file's patch at most
//! `patch_file_bytes`. Patches go to the changes in path order until that
//! is spent; each one cut or left out says `patch_truncated`. At most
//! `patch_read_bytes` are read in all, and `patch_file_read` of a file:
//! past that a modified file shows its header only, an added or deleted
//! one its first lines, both marked cut.

use super::listing::{Found, Listed};
use super::{hunks, Limits};
use crate::tree::{self, TreeError};
use allox_protocol::{Change, ChangeKind};
use rustix::fd::OwnedFd;
use rustix::fs::{self, AtFlags, FileType};
use rustix::io::Errno;
use std::ffi::OsStr;
use std::fmt::Write;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

/// Bytes searched for a NUL to call a file binary (git looks at 8,000).
const SNIFF: usize = 8 << 10;

/// How long the lines of one file are compared before the diff settles
/// for a correct but longer answer.
const FILE_TIME: Duration = Duration::from_millis(500);

/// Mode git gives a symlink.
const LINK_MODE: u32 = 0o120000;

/// One side of a change as its patch shows it.
enum Side {
    /// Nothing to show: not there, a directory or a special file.
    Nothing,
    /// A regular file: its mode and its first bytes (all when `whole`).
    File {
        mode: u32,
        bytes: Vec<u8>,
        whole: bool,
    },
    /// A symlink: its target.
    Link(Vec<u8>),
    /// A regular file not read: the read budget is spent.
    Unread { mode: u32 },
}

impl Side {
    fn mode(&self) -> u32 {
        match self {
            Side::File { mode, .. } | Side::Unread { mode } => *mode,
            Side::Link(_) => LINK_MODE,
            Side::Nothing => 0,
        }
    }

    fn is_link(&self) -> bool {
        matches!(self, Side::Link(_))
    }

    /// The bytes shown, and whether they are all of them (`None`: not
    /// read).
    fn contents(&self) -> Option<(&[u8], bool)> {
        match self {
            Side::File { bytes, whole, .. } => Some((bytes, *whole)),
            Side::Link(t) => Some((t, true)),
            Side::Unread { .. } | Side::Nothing => None,
        }
    }
}

/// Whether bytes are shown as text: no NUL in the first [`SNIFF`] bytes,
/// and UTF-8 (a character cut at the end of a partial read aside).
fn is_text(bytes: &[u8], whole: bool) -> bool {
    if bytes[..bytes.len().min(SNIFF)].contains(&0) {
        return false;
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => true,
        Err(e) => !whole && e.error_len().is_none(),
    }
}

/// The text of `bytes` (checked by [`is_text`]); of a partial read, up to
/// its last newline.
fn text(bytes: &[u8], whole: bool) -> &str {
    let end = if whole {
        bytes.len()
    } else {
        bytes.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1)
    };
    std::str::from_utf8(&bytes[..end]).unwrap_or_default()
}

/// `prefix` + `path` as git writes a name: in double quotes with C escapes
/// when it holds a control character, a quote or a backslash (or is not
/// UTF-8: then every byte past ASCII in octal).
fn quoted(prefix: &str, path: &[u8]) -> String {
    let utf8 = std::str::from_utf8(path).is_ok();
    let special = |c: u8| c < 0x20 || c == 0x7f || c == b'"' || c == b'\\' || (!utf8 && c >= 0x80);
    if !path.iter().any(|&c| special(c)) {
        return format!("{prefix}{}", String::from_utf8_lossy(path));
    }
    let mut out = format!("\"{prefix}");
    let mut rest = path;
    while let Some((&c, tail)) = rest.split_first() {
        match c {
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            c if special(c) => {
                let _ = write!(out, "\\{c:03o}");
            }
            _ => {
                // A whole character: up to the next byte that is escaped.
                let n = rest.iter().position(|&c| special(c)).unwrap_or(rest.len());
                out.push_str(&String::from_utf8_lossy(&rest[..n]));
                rest = &rest[n..];
                continue;
            }
        }
        rest = tail;
    }
    out.push('"');
    out
}

/// Adds `piece` to `out` if it fits within `cap` bytes in all.
fn fits(out: &mut String, piece: &str, cap: usize) -> bool {
    if out.len() + piece.len() > cap {
        return false;
    }
    out.push_str(piece);
    true
}

/// Appends the patch that turns `old` into `new` (either may be
/// [`Side::Nothing`], not both; the same kind of thing when both are
/// there), within `cap` bytes in all. Whether it is whole.
fn one(out: &mut String, path: &[u8], old: &Side, new: &Side, cap: usize) -> bool {
    let (a, b) = (quoted("a/", path), quoted("b/", path));
    let (has_old, has_new) = (!matches!(old, Side::Nothing), !matches!(new, Side::Nothing));
    let mut head = format!("diff --git {a} {b}\n");
    match (has_old, has_new) {
        (false, _) => {
            let _ = writeln!(head, "new file mode {:06o}", new.mode());
        }
        (_, false) => {
            let _ = writeln!(head, "deleted file mode {:06o}", old.mode());
        }
        _ if old.mode() != new.mode() => {
            let _ = write!(
                head,
                "old mode {:06o}\nnew mode {:06o}\n",
                old.mode(),
                new.mode()
            );
        }
        _ => {}
    }
    if !fits(out, &head, cap) {
        return false;
    }
    let empty: (&[u8], bool) = (&[], true);
    let (Some((ob, ow)), Some((nb, nw))) = (
        if has_old { old.contents() } else { Some(empty) },
        if has_new { new.contents() } else { Some(empty) },
    ) else {
        // Not read.
        return false;
    };
    if ow && nw && ob == nb {
        return true;
    }
    let (a, b) = (
        if has_old { a.as_str() } else { "/dev/null" },
        if has_new { b.as_str() } else { "/dev/null" },
    );
    if !is_text(ob, ow) || !is_text(nb, nw) {
        return fits(out, &format!("Binary files {a} and {b} differ\n"), cap);
    }
    // Of a file changed on both sides, the lines can be compared only
    // whole; of an added or deleted one, its first lines are its first
    // hunk's.
    if has_old && has_new && !(ow && nw) {
        return false;
    }
    if !fits(out, &format!("--- {a}\n+++ {b}\n"), cap) {
        return false;
    }
    let room = cap - out.len();
    let all = hunks::write(
        out,
        text(ob, ow),
        text(nb, nw),
        room,
        Instant::now() + FILE_TIME,
    );
    all && ow && nw
}

/// Whether two sides are shown as one change rather than a deletion and
/// an addition: both files, or both symlinks.
fn same_kind(old: &Side, new: &Side) -> bool {
    !matches!(old, Side::Nothing) && !matches!(new, Side::Nothing) && old.is_link() == new.is_link()
}

/// Reads the patches of a walk's listed changes.
pub struct Patcher<'a> {
    limits: &'a Limits,
    from: &'a OwnedFd,
    to: &'a OwnedFd,
    /// Bytes of patch text still allowed.
    text_left: usize,
    /// Bytes of contents that may still be read.
    read_left: u64,
}

impl<'a> Patcher<'a> {
    /// Patches for `found`, a walk of the trees open as `from` and `to`.
    pub fn new(from: &'a OwnedFd, to: &'a OwnedFd, found: &Found, limits: &'a Limits) -> Self {
        Patcher {
            limits,
            from,
            to,
            text_left: limits
                .patch_bytes
                .min(limits.answer_bytes.saturating_sub(found.bytes)),
            read_left: limits.patch_read_bytes,
        }
    }

    /// The listed changes with their patches, and whether some patch is
    /// cut or left out.
    pub fn run(mut self, found: &Found) -> Result<(Vec<Change>, bool), TreeError> {
        let mut cut = false;
        let mut out = Vec::with_capacity(found.listed.len());
        for l in &found.listed {
            let mut c = l.change();
            self.patch(l, &mut c)?;
            cut |= c.patch_truncated;
            out.push(c);
        }
        Ok((out, cut))
    }

    fn patch(&mut self, l: &Listed, c: &mut Change) -> Result<(), TreeError> {
        // Directories have no size: they show no contents.
        let (in_old, in_new) = match l.kind {
            ChangeKind::Added => (false, l.after.is_some()),
            ChangeKind::Deleted => (l.before.is_some(), false),
            ChangeKind::Modified | ChangeKind::TypeChanged => {
                (l.before.is_some(), l.after.is_some())
            }
        };
        if !in_old && !in_new {
            return Ok(());
        }
        if self.text_left == 0 {
            c.patch_truncated = true;
            return Ok(());
        }
        let cap = self.text_left.min(self.limits.patch_file_bytes);
        // A file on both sides is compared whole, or only told binary or
        // not; of a file on one side, no more is read than its patch can
        // show.
        let (max, start) = match l.kind {
            ChangeKind::Modified => (self.limits.patch_file_read, SNIFF as u64),
            _ => {
                let max = self.limits.patch_file_read.min(cap as u64);
                (max, max)
            }
        };
        let old = if in_old {
            self.side(self.from, &l.path, max, start)?
        } else {
            Side::Nothing
        };
        let new = if in_new {
            self.side(self.to, &l.path, max, start)?
        } else {
            Side::Nothing
        };
        let mut text = String::new();
        let whole = match (&old, &new) {
            (Side::Nothing, Side::Nothing) => return Ok(()),
            (o, n) if same_kind(o, n) => one(&mut text, &l.path, o, n, cap),
            (o, n) => {
                // A deletion, then an addition.
                let mut whole = true;
                if !matches!(o, Side::Nothing) {
                    whole = one(&mut text, &l.path, o, &Side::Nothing, cap);
                }
                if whole && !matches!(n, Side::Nothing) {
                    whole = one(&mut text, &l.path, &Side::Nothing, n, cap);
                }
                whole
            }
        };
        self.text_left -= text.len();
        c.patch_truncated = !whole;
        c.patch = (!text.is_empty()).then_some(text);
        Ok(())
    }

    /// What `path` below `root` is now: a file of at most `max` bytes
    /// read whole, a larger one's first `start` bytes, within the read
    /// budget.
    fn side(
        &mut self,
        root: &OwnedFd,
        path: &[u8],
        max: u64,
        start: u64,
    ) -> Result<Side, TreeError> {
        let io = |op: &'static str| {
            move |source: std::io::Error| TreeError::Io {
                op,
                path: tree::show(path),
                source,
            }
        };
        let (parent, name) = match path.iter().rposition(|&c| c == b'/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&path[..0], path),
        };
        let Some(dir) = tree::open_dir_below(root, parent).map_err(io("open"))? else {
            return Ok(Side::Nothing);
        };
        let name = OsStr::from_bytes(name);
        let st = match fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(Side::Nothing),
            Err(e) => return Err(TreeError::io("stat", path, e)),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => match fs::readlinkat(&dir, name, Vec::new()) {
                Ok(t) => {
                    let t = t.into_bytes();
                    self.read_left = self.read_left.saturating_sub(t.len() as u64);
                    Ok(Side::Link(t))
                }
                // Gone, or no longer a link.
                Err(Errno::NOENT | Errno::INVAL) => Ok(Side::Nothing),
                Err(e) => Err(TreeError::io("readlink", path, e)),
            },
            FileType::RegularFile => {
                let mode = st.st_mode;
                let size = st.st_size as u64;
                let want = if size <= max { size } else { start.min(size) };
                if want > self.read_left {
                    return Ok(Side::Unread { mode });
                }
                let Some(f) = tree::open_regular(&dir, name, &st).map_err(io("open"))? else {
                    return Ok(Side::Nothing);
                };
                let bytes = read_start(&f, want as usize).map_err(io("read"))?;
                self.read_left -= bytes.len() as u64;
                Ok(Side::File {
                    mode,
                    bytes,
                    whole: size <= max,
                })
            }
            _ => Ok(Side::Nothing),
        }
    }
}

/// The first `n` bytes of a file (fewer if it ends first).
fn read_start(f: &OwnedFd, n: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    let mut got = 0;
    while got < n {
        match rustix::io::pread(f, &mut buf[got..], got as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::super::{compare, DiffMethod};
    use super::*;
    use allox_protocol::{DiffListing, Outcome, Response, ResponseEnvelope, ServerFrame};
    use std::os::unix::fs::{symlink, PermissionsExt};
    use std::path::Path;

    fn write(root: &Path, p: &str, data: &[u8]) {
        let p = root.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }

    fn trees() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        (t, a, b)
    }

    fn patched(a: &Path, b: &Path, limits: &Limits) -> super::super::Compared {
        compare(a, b, DiffMethod::Walk, limits, true).unwrap()
    }

    fn patch_of<'c>(d: &'c super::super::Compared, path: &str) -> &'c Change {
        d.changes.iter().find(|c| c.path == path).unwrap()
    }

    #[test]
    fn patches_show_text_binary_links_and_modes_as_git_does() {
        let (_t, a, b) = trees();
        write(&a, "src/edit.txt", b"one\ntwo\nthree\n");
        write(&b, "src/edit.txt", b"one\n2\nthree\n");
        write(&b, "new.txt", b"fresh\nno newline");
        write(&a, "gone.txt", b"bye\n");
        write(&a, "blob", b"\x00\x01");
        write(&b, "blob", b"\x00\x02");
        write(&b, "latin1", b"caf\xe9\n");
        write(&a, "mode", b"same\n");
        write(&b, "mode", b"same\n");
        std::fs::set_permissions(b.join("mode"), std::fs::Permissions::from_mode(0o755)).unwrap();
        write(&b, "empty", b"");
        write(&b, "tab\there", b"x\n");
        symlink("src/edit.txt", a.join("link")).unwrap();
        symlink("new.txt", b.join("link")).unwrap();
        write(&a, "to-link", b"was a file\n");
        symlink("target", b.join("to-link")).unwrap();
        std::fs::create_dir_all(b.join("dir")).unwrap();
        // A FIFO is never opened (nor waited on): no patch.
        rustix::fs::mknodat(
            rustix::fs::CWD,
            b.join("fifo"),
            FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let d = patched(&a, &b, &Limits::default());
        assert!(!d.patch_truncated);
        let p = |path| {
            patch_of(&d, path)
                .patch
                .as_deref()
                .unwrap_or("<none>")
                .to_owned()
        };
        assert_eq!(
            p("src/edit.txt"),
            "diff --git a/src/edit.txt b/src/edit.txt\n--- a/src/edit.txt\n+++ b/src/edit.txt\n\
             @@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n"
        );
        assert_eq!(
            p("new.txt"),
            "diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new.txt\n\
             @@ -0,0 +1,2 @@\n+fresh\n+no newline\n\\ No newline at end of file\n"
        );
        assert_eq!(
            p("gone.txt"),
            "diff --git a/gone.txt b/gone.txt\ndeleted file mode 100644\n--- a/gone.txt\n\
             +++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"
        );
        assert_eq!(
            p("blob"),
            "diff --git a/blob b/blob\nBinary files a/blob and b/blob differ\n"
        );
        assert_eq!(
            p("latin1"),
            "diff --git a/latin1 b/latin1\nnew file mode 100644\n\
             Binary files /dev/null and b/latin1 differ\n"
        );
        assert_eq!(
            p("mode"),
            "diff --git a/mode b/mode\nold mode 100644\nnew mode 100755\n"
        );
        assert_eq!(
            p("empty"),
            "diff --git a/empty b/empty\nnew file mode 100644\n"
        );
        assert!(p("tab\there").starts_with("diff --git \"a/tab\\there\" \"b/tab\\there\"\n"));
        assert_eq!(
            p("link"),
            "diff --git a/link b/link\n--- a/link\n+++ b/link\n@@ -1 +1 @@\n-src/edit.txt\n\
             \\ No newline at end of file\n+new.txt\n\\ No newline at end of file\n"
        );
        // A file turned into a symlink: a deletion, then an addition.
        assert_eq!(
            p("to-link"),
            "diff --git a/to-link b/to-link\ndeleted file mode 100644\n--- a/to-link\n\
             +++ /dev/null\n@@ -1 +0,0 @@\n-was a file\n\
             diff --git a/to-link b/to-link\nnew file mode 120000\n--- /dev/null\n\
             +++ b/to-link\n@@ -0,0 +1 @@\n+target\n\\ No newline at end of file\n"
        );
        assert_eq!(p("dir"), "<none>");
        assert_eq!(p("fifo"), "<none>");
        assert!(d.changes.iter().all(|c| !c.patch_truncated));
        // Without patches asked for, none.
        let plain = compare(&a, &b, DiffMethod::Walk, &Limits::default(), false).unwrap();
        assert!(plain.changes.iter().all(|c| c.patch.is_none()));
    }

    #[test]
    fn patches_stop_at_the_file_and_answer_bounds_in_path_order() {
        let (_t, a, b) = trees();
        let big: String = (0..5000).map(|i| format!("line {i}\n")).collect();
        write(&b, "a-huge", big.as_bytes());
        write(&a, "b-huge-edit", big.as_bytes());
        write(
            &b,
            "b-huge-edit",
            big.replace("line 7\n", "seven\n").as_bytes(),
        );
        for i in 0..50 {
            write(&b, &format!("f{i:02}"), format!("file {i}\n").as_bytes());
        }
        let limits = Limits {
            patch_bytes: 4096,
            patch_file_bytes: 1024,
            ..Limits::default()
        };
        let d = patched(&a, &b, &limits);
        assert!(d.patch_truncated);
        let total: usize = d
            .changes
            .iter()
            .filter_map(|c| c.patch.as_ref())
            .map(String::len)
            .sum();
        assert!(total <= 4096, "{total}");
        // The huge addition: its first lines, cut, whole lines only.
        let huge = patch_of(&d, "a-huge");
        let text = huge.patch.as_deref().unwrap();
        assert!(huge.patch_truncated && text.len() <= 1024 && text.len() > 900);
        let hunk = text.split_once("@@ -0,0 +1,").unwrap().1;
        let (n, lines) = hunk.split_once(" @@\n").unwrap();
        assert_eq!(lines.lines().count(), n.parse::<usize>().unwrap());
        assert!(big.starts_with(&lines.replace("\n+", "\n")[1..]));
        // The edit of a huge file is small and whole.
        let edit = patch_of(&d, "b-huge-edit");
        assert!(!edit.patch_truncated);
        assert!(edit.patch.as_deref().unwrap().contains("-line 7\n+seven\n"));
        // Then whole small patches, in path order, until the budget is
        // spent; the rest have none and say so.
        let small: Vec<&Change> = d
            .changes
            .iter()
            .filter(|c| c.path.starts_with('f'))
            .collect();
        let cut = small.iter().position(|c| c.patch.is_none()).unwrap();
        assert!(cut > 5, "{cut}");
        assert!(small[..cut]
            .iter()
            .all(|c| !c.patch_truncated || c.patch.is_some()));
        assert!(small[cut + 1..]
            .iter()
            .all(|c| c.patch.is_none() && c.patch_truncated));
        // A file too large to compare: its header only, cut.
        let small_read = Limits {
            patch_file_read: 1000,
            ..Limits::default()
        };
        let d = patched(&a, &b, &small_read);
        let edit = patch_of(&d, "b-huge-edit");
        assert_eq!(
            (edit.patch.as_deref(), edit.patch_truncated),
            (Some("diff --git a/b-huge-edit b/b-huge-edit\n"), true)
        );
        // Past the read budget: the same.
        let no_read = Limits {
            patch_read_bytes: 10,
            ..Limits::default()
        };
        let d = patched(&a, &b, &no_read);
        assert!(patch_of(&d, "b-huge-edit").patch_truncated);
        assert!(patch_of(&d, "f49").patch_truncated);
    }

    #[test]
    fn a_full_answer_with_patches_fits_one_frame() {
        let (_t, a, b) = trees();
        // Long paths, to fill the listing's share, and files whose patches
        // fill the rest.
        let dir = "d".repeat(200);
        for i in 0..3000 {
            write(&b, &format!("{dir}/{i:05}"), "x\n".repeat(300).as_bytes());
        }
        let d = patched(&a, &b, &Limits::default());
        assert!(d.truncated && d.patch_truncated);
        let listing = DiffListing {
            from: "f".repeat(64),
            to: "t".repeat(64),
            changes: d.changes,
            truncated: d.truncated,
            added: u64::MAX,
            modified: u64::MAX,
            deleted: u64::MAX,
            type_changed: u64::MAX,
            patch_truncated: d.patch_truncated,
        };
        let patches: usize = listing
            .changes
            .iter()
            .filter_map(|c| c.patch.as_ref())
            .map(String::len)
            .sum();
        assert!(patches > 400 << 10, "{patches}");
        let frame = allox_protocol::encode(&ServerFrame::Response(ResponseEnvelope {
            conversation: u64::MAX,
            request_id: u64::MAX,
            outcome: Outcome::Ok(Response::Diff(listing)),
        }))
        .expect("the answer fits one frame");
        assert!(frame.len() <= allox_protocol::MAX_FRAME, "{}", frame.len());
    }

    #[test]
    fn a_symlink_swapped_in_on_the_way_is_not_followed() {
        let (t, a, b) = trees();
        write(&a, "d/f", b"old\n");
        write(&b, "d/f", b"new\n");
        let d = patched(&a, &b, &Limits::default());
        assert!(patch_of(&d, "d/f").patch.is_some());
        // After the walk, `d` becomes a link to a directory outside with
        // an `f` of its own: the patch reads nothing through it.
        write(t.path(), "outside/f", b"secret\n");
        std::fs::remove_dir_all(b.join("d")).unwrap();
        symlink(t.path().join("outside"), b.join("d")).unwrap();
        let (fa, fb) = (
            rustix::fs::open(&a, rustix::fs::OFlags::DIRECTORY, rustix::fs::Mode::empty()).unwrap(),
            rustix::fs::open(&b, rustix::fs::OFlags::DIRECTORY, rustix::fs::Mode::empty()).unwrap(),
        );
        let found = Found {
            listed: vec![Listed {
                path: b"d/f".to_vec(),
                kind: ChangeKind::Modified,
                before: Some(4),
                after: Some(4),
                modes: [None, None],
                unread: false,
            }],
            truncated: false,
            counts: [0, 1, 0, 0],
            bytes: 0,
        };
        let limits = Limits::default();
        let (changes, _) = Patcher::new(&fa, &fb, &found, &limits).run(&found).unwrap();
        let p = changes[0].patch.as_deref().unwrap();
        assert!(!p.contains("secret"), "{p}");
        assert!(p.contains("-old\n"), "{p}");
    }

    #[test]
    fn names_are_quoted_as_git_quotes_them() {
        assert_eq!(quoted("a/", b"plain/name.rs"), "a/plain/name.rs");
        assert_eq!(quoted("a/", "caf\u{e9}".as_bytes()), "a/caf\u{e9}");
        assert_eq!(quoted("b/", b"x\"y\\z\n"), "\"b/x\\\"y\\\\z\\n\"");
        assert_eq!(quoted("a/", b"\x1b[1m\xff"), "\"a/\\033[1m\\377\"");
    }
}
