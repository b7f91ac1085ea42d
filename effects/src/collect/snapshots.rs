//! Who made each difference of a tree (`workspace`, `shared`) between A
//! and B, from the filesystem watcher's events ([`super::fanotify`]).
//!
//! The rule, per difference of [`super::tree`] captures of the directory
//! `root`:
//!
//! 1. The events considered are those whose path is the difference's own
//!    (`root` joined with its key; the root itself for `.`). Events on
//!    other paths, below or above, are not counted.
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
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    // The last event on each key.
    let mut last: HashMap<String, &FsEvent> = HashMap::new();
    for ev in events {
        let Some(p) = ev.path() else { continue };
        if let Some(k) = key_of(&root, &p) {
            last.insert(k, ev);
        }
    }
    diffs
        .iter()
        .map(|d| {
            let who = match last.get(&d.key) {
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
