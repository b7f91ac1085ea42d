//! The walk of two trees side by side, iterative with an explicit stack.
//!
//! Each level of the stack is a directory present on one side or both,
//! with the sorted names of the part of it being compared. A directory
//! whose names do not fit the level's share of the budget is compared in
//! parts (by a keyed hash of the name), each part read anew; the walk
//! holds at most [`Limits::held_bytes`] of names over all its levels, and
//! at most [`tree::WINDOW`] levels open per side (deeper ones are closed
//! and reopened as `..` of their child on the way back up, see
//! [`crate::tree`]).

use super::contents::{self, Verdict};
use super::listing::Listing;
use super::names::{self, Names, Part, Read};
use super::{Hints, Limits};
use crate::btrfs::SUBVOL_ROOT_INO;
use crate::tree::{self, Dir, Ident, TreeError};
use allox_protocol::ChangeKind;
use rustix::fs::{self, AtFlags, FileType, Stat};
use rustix::io::Errno;
use std::collections::hash_map::RandomState;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// One side of a level: the directory and its names of the current part.
struct Side {
    dir: Dir,
    names: Names,
    at: usize,
}

impl Side {
    fn peek(&self) -> Option<(&OsStr, u64)> {
        (self.at < self.names.len()).then(|| (self.names.name(self.at), self.names.ino(self.at)))
    }
}

struct Level {
    a: Option<Side>,
    b: Option<Side>,
    /// Length of the walk's path above this level.
    parent_len: usize,
    /// Whether the hints hold here (not inside a nested subvolume).
    hinted: bool,
    part: u64,
    parts: u64,
}

impl Level {
    fn cost(&self) -> usize {
        self.a.as_ref().map_or(0, |s| s.names.cost())
            + self.b.as_ref().map_or(0, |s| s.names.cost())
    }
}

/// What comes next at a level, in name order.
enum Next {
    OnlyA,
    OnlyB,
    Both,
    End,
}

pub struct Walk<'a> {
    limits: &'a Limits,
    hints: Option<&'a Hints>,
    key: RandomState,
    stack: Vec<Level>,
    /// The path of the top level's directory, `/`-separated.
    path: Vec<u8>,
    held: usize,
    /// Content bytes that may still be read.
    budget: u64,
    /// What the trees' items say of the inodes the hints single out
    /// ([`Hints::items_alike`]), read a directory's at a time when first
    /// needed there.
    alike: Option<super::FastMap<u64, Option<bool>>>,
    /// The buffer of those searches.
    search: Option<crate::btrfs::TreeSearch>,
    pub out: Listing,
}

fn kind_of(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// Whether two directories differ in themselves, not in what they hold:
/// their mode, owner, and — where the inode was written since the trees
/// were one — extended attributes (an ACL: a default one sets the mode of
/// what is made in it), which `xattrs` compares.
fn dir_itself_differs(
    sa: &Stat,
    sb: &Stat,
    path: &[u8],
    xattrs: impl FnOnce() -> std::io::Result<Verdict>,
) -> Result<bool, TreeError> {
    if sa.st_mode != sb.st_mode || sa.st_uid != sb.st_uid || sa.st_gid != sb.st_gid {
        return Ok(true);
    }
    if sa.st_ino == sb.st_ino && (sa.st_ctime, sa.st_ctime_nsec) == (sb.st_ctime, sb.st_ctime_nsec)
    {
        return Ok(false);
    }
    let v = xattrs().map_err(|e| TreeError::Io {
        op: "read the attributes of",
        path: tree::show(path),
        source: e,
    })?;
    Ok(v != Verdict::Same)
}

fn size(st: &Stat) -> Option<u64> {
    (kind_of(st) != FileType::Directory).then_some(st.st_size as u64)
}

impl<'a> Walk<'a> {
    pub fn new(limits: &'a Limits, hints: Option<&'a Hints>) -> Walk<'a> {
        Walk {
            limits,
            hints,
            key: RandomState::new(),
            stack: Vec::new(),
            path: Vec::new(),
            held: 0,
            budget: limits.read_bytes,
            alike: None,
            search: None,
            out: Listing::new(limits.changes, limits.listed_bytes),
        }
    }

    /// Compares the trees below `a` and `b`.
    pub fn run(&mut self, a: Dir, b: Dir) -> Result<(), TreeError> {
        // The roots themselves, as any directory in them: a `chmod` of
        // the workspace's root is a change of the tree (`.`).
        let stat = |d: &Dir| fs::fstat(d.fd()).map_err(|e| TreeError::io("stat", b".", e));
        let (sa, sb) = (stat(&a)?, stat(&b)?);
        let root_changed = dir_itself_differs(&sa, &sb, b".", || {
            contents::fd_xattrs(a.fd(), b.fd(), &mut self.budget)
        })?;
        if root_changed {
            self.out.push(
                b".",
                ChangeKind::Modified,
                (None, None),
                [Some(sa.st_mode), Some(sb.st_mode)],
            );
        }
        let hinted = self.hints.is_some();
        self.enter(Some(a), Some(b), hinted, 0)?;
        while !self.stack.is_empty() {
            self.step()?;
        }
        Ok(())
    }

    /// The path of `name` in the top level's directory.
    fn child_path(&self, name: &OsStr) -> Vec<u8> {
        let mut p = Vec::with_capacity(self.path.len() + 1 + name.len());
        p.extend_from_slice(&self.path);
        if !p.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(name.as_bytes());
        p
    }

    /// Pushes a level for a directory (its path already in `self.path`).
    fn enter(
        &mut self,
        a: Option<Dir>,
        b: Option<Dir>,
        hinted: bool,
        parent_len: usize,
    ) -> Result<(), TreeError> {
        if self.stack.len() > self.limits.depth {
            return Err(TreeError::Limit {
                what: "directory depth",
                limit: self.limits.depth as u64,
                path: tree::show(&self.path),
            });
        }
        let mut level = Level {
            a: a.map(|dir| Side {
                dir,
                names: Names::default(),
                at: 0,
            }),
            b: b.map(|dir| Side {
                dir,
                names: Names::default(),
                at: 0,
            }),
            parent_len,
            hinted,
            part: 0,
            parts: 1,
        };
        self.plan(&mut level)?;
        self.held += level.cost();
        self.stack.push(level);
        // Keep at most WINDOW levels open: close the one that fell out,
        // on each side that the level below it goes on with (that side
        // reopens it as `..`). The root stays open.
        let n = self.stack.len();
        if n > tree::WINDOW + 1 {
            let (upper, lower) = self.stack.split_at_mut(n - tree::WINDOW);
            let (far, next) = (&mut upper[n - tree::WINDOW - 1], &lower[0]);
            if n - tree::WINDOW - 1 > 0 {
                if let (Some(s), Some(_)) = (far.a.as_mut(), next.a.as_ref()) {
                    s.dir.close();
                }
                if let (Some(s), Some(_)) = (far.b.as_mut(), next.b.as_ref()) {
                    s.dir.close();
                }
            }
        }
        Ok(())
    }

    /// Reads a level's names: all of them if they fit its share of the
    /// budget, else in as many parts as it takes.
    fn plan(&self, level: &mut Level) -> Result<(), TreeError> {
        let limit = self
            .limits
            .dir_bytes
            .min(self.limits.held_bytes.saturating_sub(self.held));
        let whole = Part {
            part: 0,
            parts: 1,
            key: &self.key,
        };
        let mut need = 0usize;
        let mut fits = true;
        for side in [level.a.as_mut(), level.b.as_mut()].into_iter().flatten() {
            let left = if fits { limit.saturating_sub(need) } else { 0 };
            match names::read(side.dir.fd(), whole, left, &self.path)? {
                Read::Fit(n) => {
                    need += n.cost();
                    side.names = n;
                }
                Read::Over { cost } => {
                    need += cost;
                    fits = false;
                }
            }
        }
        if fits {
            return Ok(());
        }
        // Parts of half the share each on average: a keyed hash makes one
        // part much larger than that only if the directory grows meanwhile.
        let parts = (2 * need).div_ceil(limit.max(1)).max(2) as u64;
        if parts > self.limits.parts as u64 || limit == 0 {
            return Err(TreeError::Limit {
                what: "the names held by the diff",
                limit: (self.limits.dir_bytes as u64).min(self.limits.held_bytes as u64),
                path: tree::show(&self.path),
            });
        }
        level.parts = parts;
        self.load(level, 0, limit)
    }

    /// Reads part `part` of a level's names.
    fn load(&self, level: &mut Level, part: u64, limit: usize) -> Result<(), TreeError> {
        let p = Part {
            part,
            parts: level.parts,
            key: &self.key,
        };
        level.part = part;
        let mut need = 0usize;
        for side in [level.a.as_mut(), level.b.as_mut()].into_iter().flatten() {
            side.names = Names::default();
            side.at = 0;
        }
        for side in [level.a.as_mut(), level.b.as_mut()].into_iter().flatten() {
            match names::read(side.dir.fd(), p, limit.saturating_sub(need), &self.path)? {
                Read::Fit(n) => {
                    need += n.cost();
                    side.names = n;
                }
                Read::Over { .. } => return Err(TreeError::changed(&self.path)),
            }
        }
        Ok(())
    }

    /// Takes one step: one name of the top level, or the end of a part
    /// or of the level.
    fn step(&mut self) -> Result<(), TreeError> {
        let top = self.stack.last().expect("walk is not empty");
        let next = match (
            top.a.as_ref().and_then(Side::peek),
            top.b.as_ref().and_then(Side::peek),
        ) {
            (Some((x, _)), Some((y, _))) => match x.cmp(y) {
                std::cmp::Ordering::Less => Next::OnlyA,
                std::cmp::Ordering::Greater => Next::OnlyB,
                std::cmp::Ordering::Equal => Next::Both,
            },
            (Some(_), None) => Next::OnlyA,
            (None, Some(_)) => Next::OnlyB,
            (None, None) => Next::End,
        };
        match next {
            Next::End => self.next_part_or_leave(),
            Next::OnlyA => self.one_side(true),
            Next::OnlyB => self.one_side(false),
            Next::Both => self.both(),
        }
    }

    fn next_part_or_leave(&mut self) -> Result<(), TreeError> {
        let mut top = self.stack.pop().expect("walk is not empty");
        self.held -= top.cost();
        if top.part + 1 < top.parts {
            let limit = self
                .limits
                .dir_bytes
                .min(self.limits.held_bytes.saturating_sub(self.held));
            let next = top.part + 1;
            self.load(&mut top, next, limit)?;
            self.held += top.cost();
            self.stack.push(top);
            return Ok(());
        }
        self.path.truncate(top.parent_len);
        // The level above is open again before this one goes.
        if let Some(up) = self.stack.last_mut() {
            for (parent, child) in [
                (up.a.as_mut(), top.a.as_ref()),
                (up.b.as_mut(), top.b.as_ref()),
            ] {
                if let (Some(p), Some(c)) = (parent, child) {
                    if !p.dir.is_open() {
                        p.dir.reopen_from(&c.dir, &self.path)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// `stat` of `name` in one side of the top level, not following it;
    /// `None` if it is gone (a live tree changes under the walk: an entry
    /// removed after the directory was read is taken as not there).
    fn stat(&self, a_side: bool, name: &OsStr) -> Result<Option<Stat>, TreeError> {
        let top = self.stack.last().expect("walk is not empty");
        let side = if a_side { &top.a } else { &top.b };
        let dir = side.as_ref().expect("side is present").dir.fd();
        match fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(TreeError::io("stat", &self.child_path(name), e)),
        }
    }

    /// Descends into the directory `name` (seen as `sa` / `sb`) on the
    /// sides given.
    fn descend(
        &mut self,
        name: &OsStr,
        sa: Option<&Stat>,
        sb: Option<&Stat>,
        hinted: bool,
    ) -> Result<(), TreeError> {
        let path = self.child_path(name);
        let top = self.stack.last().expect("walk is not empty");
        let open = |side: &Option<Side>, st: Option<&Stat>| -> Result<Option<Dir>, TreeError> {
            match (side, st) {
                (Some(s), Some(st)) => Ok(Some(s.dir.child(name, Ident::of(st), &path)?)),
                _ => Ok(None),
            }
        };
        let (da, db) = (open(&top.a, sa)?, open(&top.b, sb)?);
        let parent_len = self.path.len();
        self.path = path;
        self.enter(da, db, hinted, parent_len)
    }

    /// A name on one side only: added or deleted, with all below it.
    fn one_side(&mut self, a_side: bool) -> Result<(), TreeError> {
        let top = self.stack.last_mut().expect("walk is not empty");
        let side = if a_side {
            top.a.as_mut()
        } else {
            top.b.as_mut()
        };
        let side = side.expect("side is present");
        let name = side.names.name(side.at).to_os_string();
        let is_dir = side.names.is_dir(side.at);
        let ino = side.names.ino(side.at);
        side.at += 1;
        let hinted = top.hinted;
        if is_dir == Some(false) {
            let p = self.child_path(&name);
            if !self.out.lists(&p) {
                // Neither listed nor a directory to go into: counted as
                // its entry says, without a `stat` (in a tree written
                // meanwhile, one removed since its directory was read is
                // counted all the same).
                self.out.count(if a_side {
                    ChangeKind::Deleted
                } else {
                    ChangeKind::Added
                });
                return Ok(());
            }
            // Listed, on a read-only side whose item the hints read: its
            // size from there, without a `stat` (which reads the inode
            // from a tree no cache holds yet: about 20 µs in a new
            // snapshot).
            let item = self
                .hints
                .filter(|_| hinted)
                .and_then(|h| h.mode_size(!a_side, ino))
                .filter(|&(mode, _)| FileType::from_raw_mode(mode) != FileType::Directory);
            if let Some((mode, bytes)) = item {
                if a_side {
                    self.out.push(
                        &p,
                        ChangeKind::Deleted,
                        (Some(bytes), None),
                        [Some(mode), None],
                    );
                } else {
                    self.out.push(
                        &p,
                        ChangeKind::Added,
                        (None, Some(bytes)),
                        [None, Some(mode)],
                    );
                }
                return Ok(());
            }
        }
        match self.stat(a_side, &name)? {
            Some(st) => self.only(a_side, &name, &st, hinted),
            None => Ok(()),
        }
    }

    /// Reports `name`, seen as `st` on one side only.
    fn only(
        &mut self,
        a_side: bool,
        name: &OsStr,
        st: &Stat,
        hinted: bool,
    ) -> Result<(), TreeError> {
        let p = self.child_path(name);
        if a_side {
            self.out.push(
                &p,
                ChangeKind::Deleted,
                (size(st), None),
                [Some(st.st_mode), None],
            );
        } else {
            self.out.push(
                &p,
                ChangeKind::Added,
                (None, size(st)),
                [None, Some(st.st_mode)],
            );
        }
        if kind_of(st) == FileType::Directory {
            let (sa, sb) = if a_side {
                (Some(st), None)
            } else {
                (None, Some(st))
            };
            self.descend(name, sa, sb, hinted)?;
        }
        Ok(())
    }

    /// A name on both sides.
    fn both(&mut self) -> Result<(), TreeError> {
        let top = self.stack.last_mut().expect("walk is not empty");
        let (a, b) = (top.a.as_mut().unwrap(), top.b.as_mut().unwrap());
        let name = a.names.name(a.at).to_os_string();
        let (ia, ib) = (a.names.ino(a.at), b.names.ino(b.at));
        a.at += 1;
        b.at += 1;
        // A nested subvolume is another tree: the hints say nothing of
        // what is inside it. Its link reads as the subvolume's id in the
        // directory's entries, its root as inode 256 once opened.
        let nested = ia == SUBVOL_ROOT_INO
            || ib == SUBVOL_ROOT_INO
            || self
                .hints
                .is_some_and(|h| h.may_be_subvolume(ia) || h.may_be_subvolume(ib));
        let hinted = top.hinted && !nested;
        if ia == ib && !nested && top.hinted && self.hints.is_some_and(|h| !h.may_differ(ia)) {
            return Ok(());
        }
        let (sa, sb) = match (self.stat(true, &name)?, self.stat(false, &name)?) {
            (Some(sa), Some(sb)) => (sa, sb),
            (Some(sa), None) => return self.only(true, &name, &sa, hinted),
            (None, Some(sb)) => return self.only(false, &name, &sb, hinted),
            (None, None) => return Ok(()),
        };
        let (ka, kb) = (kind_of(&sa), kind_of(&sb));
        let p = self.child_path(&name);
        if ka != kb {
            self.out.push(
                &p,
                ChangeKind::TypeChanged,
                (size(&sa), size(&sb)),
                [Some(sa.st_mode), Some(sb.st_mode)],
            );
            if ka == FileType::Directory {
                self.descend(&name, Some(&sa), None, hinted)?;
            } else if kb == FileType::Directory {
                self.descend(&name, None, Some(&sb), hinted)?;
            }
            return Ok(());
        }
        if ka == FileType::Directory {
            let top = self.stack.last().expect("walk is not empty");
            let (da, db) = (
                top.a.as_ref().unwrap().dir.fd(),
                top.b.as_ref().unwrap().dir.fd(),
            );
            let budget = &mut self.budget;
            let changed =
                dir_itself_differs(&sa, &sb, &p, || contents::dir_xattrs(da, db, &name, budget))?;
            if changed {
                self.out.push(
                    &p,
                    ChangeKind::Modified,
                    (None, None),
                    [Some(sa.st_mode), Some(sb.st_mode)],
                );
            }
            return self.descend(&name, Some(&sa), Some(&sb), hinted);
        }
        let mut same_meta = sa.st_ino == sb.st_ino
            && sa.st_size == sb.st_size
            && sa.st_mode == sb.st_mode
            && sa.st_mtime == sb.st_mtime
            && sa.st_mtime_nsec == sb.st_mtime_nsec
            && sa.st_ctime == sb.st_ctime
            && sa.st_ctime_nsec == sb.st_ctime_nsec;
        // The same size and times, yet an item of the inode was written
        // since the trees were one, and its ctime is about when they
        // parted: a change within one tick of the clock that stamps the
        // times (bytes of the same length written over, an extended
        // attribute set) leaves them as they were. Its items in the two
        // trees tell; where they differ, or cannot tell, its bytes and
        // attributes are compared.
        let mut unlike = false;
        if same_meta && hinted {
            if let Some(h) = self
                .hints
                .filter(|h| h.touched(ia) && h.recent(sa.st_ctime))
            {
                // Compared by the hints already, or by the walk for
                // another file of this directory.
                let known = h.alike_verdict(ia).is_some()
                    || self.alike.as_ref().is_some_and(|m| m.contains_key(&ia));
                if !known {
                    // Asked for every file of this directory the hints
                    // single out, at once.
                    let top = self.stack.last().expect("walk is not empty");
                    let side = top.a.as_ref().unwrap();
                    let inos: Vec<u64> = (0..side.names.len())
                        .filter(|&i| side.names.is_dir(i) != Some(true))
                        .map(|i| side.names.ino(i))
                        .filter(|&i| h.touched(i))
                        .chain(std::iter::once(ia))
                        .collect();
                    let fd = side.dir.fd();
                    let search = self.search.get_or_insert_with(Default::default);
                    let read = h.items_alike(search, fd, inos).map_err(|e| {
                        let errno = Errno::from_raw_os_error(e.errno().unwrap_or(libc::EIO));
                        TreeError::io("search the trees for", &p, errno)
                    })?;
                    self.alike.get_or_insert_with(Default::default).extend(read);
                }
                let alike = h
                    .alike_verdict(ia)
                    .or_else(|| self.alike.as_ref().and_then(|m| m.get(&ia).copied()))
                    .flatten();
                unlike = alike != Some(true);
                same_meta = !unlike;
            }
        }
        // Whether the bytes were compared, where they were to be.
        let mut read = true;
        let changed = if same_meta {
            false
        } else if sa.st_mode != sb.st_mode
            || sa.st_size != sb.st_size
            || sa.st_uid != sb.st_uid
            || sa.st_gid != sb.st_gid
        {
            true
        } else if ka == FileType::Symlink {
            // Gone or no longer a link: changed while compared.
            let (ta, tb) = (
                self.link_target(true, &name, &p)?,
                self.link_target(false, &name, &p)?,
            );
            ta.is_none() || tb.is_none() || ta != tb
        } else if ka == FileType::RegularFile {
            let top = self.stack.last().expect("walk is not empty");
            let (da, db) = (
                top.a.as_ref().unwrap().dir.fd(),
                top.b.as_ref().unwrap().dir.fd(),
            );
            let read_error = |e| TreeError::Io {
                op: "read",
                path: tree::show(&p),
                source: e,
            };
            // Same bytes but a changed inode: its extended attributes may
            // be what changed.
            let inode_changed =
                unlike || (sa.st_ctime, sa.st_ctime_nsec) != (sb.st_ctime, sb.st_ctime_nsec);
            let v = contents::compare(da, db, &name, (&sa, &sb), inode_changed, &mut self.budget)
                .map_err(read_error)?;
            // Past the read budget a file whose metadata differs is
            // reported modified without reading, and said to be.
            read = v != Verdict::Unread;
            v != Verdict::Same
        } else {
            // Sockets, FIFOs, devices: only metadata to compare, never
            // opened.
            sa.st_rdev != sb.st_rdev
        };
        if changed {
            self.out.push_read(
                &p,
                ChangeKind::Modified,
                (size(&sa), size(&sb)),
                [Some(sa.st_mode), Some(sb.st_mode)],
                read,
            );
        }
        Ok(())
    }

    fn link_target(
        &self,
        a_side: bool,
        name: &OsStr,
        p: &[u8],
    ) -> Result<Option<Vec<u8>>, TreeError> {
        let top = self.stack.last().expect("walk is not empty");
        let side = if a_side { &top.a } else { &top.b };
        let dir = side.as_ref().expect("side is present").dir.fd();
        match fs::readlinkat(dir, name, Vec::new()) {
            Ok(c) => Ok(Some(c.into_bytes())),
            Err(Errno::NOENT | Errno::INVAL) => Ok(None),
            Err(e) => Err(TreeError::io("readlink", p, e)),
        }
    }
}
