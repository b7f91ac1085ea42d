//! Who made each difference of a tree (`workspace`, `shared`) between A
//! and B, from the filesystem watcher's events ([`super::fanotify`]).
//!
//! The rule, per difference of [`super::tree`] captures of the directory
//! `root`:
//!
//! 1. The events considered are those whose path is the difference's own
//!    (`root` joined with its key; the root itself for `.`), and those
//!    that moved or removed a directory above it (`mv d e` moves `d/f` to
//!    `e/f` with one event, on `d` and on `e`). Other events, below or
//!    above, are not counted.
//! 2. Among them the **last** one read decides: it is what left the entry
//!    as B found it.
//! 3. Its writer is **the run** when its pid is one of the run's
//!    (`run_pids`, from the run's history) or its cgroup, read when the
//!    event was read, is the run's own; **another session** (its agent,
//!    session and, if known, run) when its cgroup is a session's run or
//!    context in the daemon's layout; **unknown** otherwise: the writer
//!    was outside every sandbox, or gone before its cgroup could be read,
//!    or there is no event on that path at all (the watch was not running,
//!    overflowed, or the change was made through a path it does not
//!    report).
//!
//! An unknown attribution never turns into a guess: the evidence lists
//! it as unknown.

use super::fanotify::{CgroupMap, FsEvent, Owner};
use super::tree::escape_into;
use super::Difference;
use std::collections::{HashMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

/// Who made a difference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    /// The observed run.
    Run,
    /// A run (or the context process) of another session.
    Session(Owner),
    Unknown,
}

/// Each of `diffs` with who made it (see the module's documentation).
/// `root` is the live directory the captures were taken of (as the
/// watcher's paths show it), `run` the observed run's owner (its agent,
/// session and run), `cgroup_root` the daemon's `--cgroup-root`.
pub fn attribute(
    diffs: &[Difference],
    root: &Path,
    events: &[FsEvent],
    run_pids: &HashSet<u32>,
    run: &Owner,
    cgroup_root: &Path,
) -> Vec<(Difference, Who)> {
    let map = CgroupMap::new(cgroup_root);
    let deciders = Deciders::new(root, events);
    diffs
        .iter()
        .map(|d| {
            let who = match deciders.of(&d.key) {
                None => Who::Unknown,
                Some(ev) => {
                    let owner = ev
                        .cgroup
                        .as_deref()
                        .map(|c| map.owner(c))
                        .unwrap_or_default();
                    if run_pids.contains(&ev.pid) || (run.is_known() && owner == *run) {
                        Who::Run
                    } else if owner.session.is_some() {
                        Who::Session(owner)
                    } else {
                        Who::Unknown
                    }
                }
            };
            (d.clone(), who)
        })
        .collect()
}

/// The event that decides who made an entry (rules 1 and 2 of the
/// module's documentation), for each key of a capture of `root`.
pub struct Deciders<'a> {
    events: &'a [FsEvent],
    /// The last event on each key.
    last: HashMap<String, usize>,
    /// The last event that moved or removed each directory.
    moved: HashMap<String, usize>,
}

impl<'a> Deciders<'a> {
    /// `events` (in the order read) on the tree at `root` (as the
    /// watcher's paths show it).
    pub fn new(root: &Path, events: &'a [FsEvent]) -> Deciders<'a> {
        let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        let (mut last, mut moved) = (HashMap::new(), HashMap::new());
        for (i, ev) in events.iter().enumerate() {
            let Some(p) = ev.path() else { continue };
            let Some(k) = key_of(&root, &p) else { continue };
            if ev.mask & libc::FAN_ONDIR != 0
                && ev.mask & (libc::FAN_MOVED_FROM | libc::FAN_MOVED_TO | libc::FAN_DELETE) != 0
            {
                moved.insert(k.clone(), i);
            }
            last.insert(k, i);
        }
        Deciders {
            events,
            last,
            moved,
        }
    }

    /// The event that decides who made the entry `key`, if any.
    pub fn of(&self, key: &str) -> Option<&'a FsEvent> {
        let mut best = self.last.get(key).copied();
        if key != "." {
            // Each directory above it, the root's own `.` aside.
            let mut at = key;
            while let Some((up, _)) = at.rsplit_once('/') {
                if let Some(&i) = self.moved.get(up) {
                    best = best.max(Some(i));
                }
                at = up;
            }
        }
        best.map(|i| &self.events[i])
    }
}

/// `p`'s key in a capture of `root` (see [`super::tree`]), if below it.
fn key_of(root: &Path, p: &Path) -> Option<String> {
    let rest = p.strip_prefix(root).ok()?;
    let mut k = String::new();
    for c in rest.components() {
        let Component::Normal(s) = c else { return None };
        if !k.is_empty() {
            k.push('/');
        }
        escape_into(&mut k, s.as_bytes());
    }
    if k.is_empty() {
        k.push('.');
    }
    Some(k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::EffectChangeKind;
    use std::path::PathBuf;

    fn diff(key: &str) -> Difference {
        Difference {
            key: key.into(),
            kind: EffectChangeKind::Added,
            before: None,
            after: Some("file".into()),
        }
    }

    fn ev(pid: u32, dir: &str, name: &str, cgroup: Option<&str>) -> FsEvent {
        FsEvent {
            pid,
            mask: libc::FAN_CLOSE_WRITE,
            dir: Some(PathBuf::from(dir)),
            name: name.as_bytes().to_vec(),
            cgroup: cgroup.map(str::to_string),
        }
    }

    #[test]
    fn the_last_writer_on_the_same_path_decides() {
        let t = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(t.path()).unwrap();
        let cg = root.join("cg");
        let r = root.to_str().unwrap();
        let run = Owner {
            agent: Some("a".into()),
            session: Some("s1".into()),
            run: Some("r1".into()),
        };
        let pids: HashSet<u32> = [100].into();
        // The cgroup mount is unknown to CgroupMap::new here (a tempdir),
        // so only pids and unknown can come out; the session case is
        // covered with a real cgroup mount in tests/tests/effects_files.rs.
        let events = vec![
            ev(200, r, "x", None),
            ev(100, r, "x", None),
            ev(300, r, "y", None),
            ev(100, &format!("{r}/d"), "z", None),
            ev(100, "/elsewhere", "w", None),
        ];
        let got = attribute(
            &[diff("x"), diff("y"), diff("d/z"), diff("w"), diff("none")],
            &root,
            &events,
            &pids,
            &run,
            &cg,
        );
        let who: Vec<_> = got
            .iter()
            .map(|(d, w)| (d.key.as_str(), w.clone()))
            .collect();
        assert_eq!(
            who,
            vec![
                ("x", Who::Run),
                ("y", Who::Unknown),
                ("d/z", Who::Run),
                ("w", Who::Unknown),
                ("none", Who::Unknown)
            ]
        );
    }

    #[test]
    fn a_directory_moved_or_removed_above_an_entry_decides_after_its_own_events() {
        let t = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(t.path()).unwrap();
        let r = root.to_str().unwrap();
        let run = Owner::default();
        let pids: HashSet<u32> = [100].into();
        let dir_ev = |pid, name: &str, mask| FsEvent {
            mask: mask | libc::FAN_ONDIR,
            ..ev(pid, r, name, None)
        };
        // Another writer (200) wrote d/f; the run (100) then moved d to
        // e, which took d/f away and made e/f; then 300 wrote e/g after.
        let events = vec![
            ev(200, &format!("{r}/d"), "f", None),
            dir_ev(100, "d", libc::FAN_MOVED_FROM),
            dir_ev(100, "e", libc::FAN_MOVED_TO),
            ev(300, &format!("{r}/e"), "g", None),
            // A file event on a directory's name is no move of it.
            ev(200, r, "e", None),
        ];
        let got = attribute(
            &[diff("d/f"), diff("e/f"), diff("e/g")],
            &root,
            &events,
            &pids,
            &run,
            &root.join("cg"),
        );
        let who: Vec<_> = got
            .iter()
            .map(|(d, w)| (d.key.as_str(), w.clone()))
            .collect();
        assert_eq!(
            who,
            vec![("d/f", Who::Run), ("e/f", Who::Run), ("e/g", Who::Unknown)]
        );
    }

    #[test]
    fn keys_are_escaped_as_the_walk_escapes_them() {
        let root = Path::new("/r");
        assert_eq!(key_of(root, Path::new("/r")).as_deref(), Some("."));
        assert_eq!(
            key_of(root, Path::new("/r/a\tb/c")).as_deref(),
            Some("a\\x09b/c")
        );
        assert_eq!(key_of(root, Path::new("/s/a")), None);
    }
}
