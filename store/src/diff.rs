//! `checkpoint.diff`: what changed between two trees of a session.
//!
//! Both trees are walked side by side through open directory handles
//! (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`), so a symlink is compared as a
//! link and never followed out of the snapshot. A snapshot keeps inode
//! numbers and times, so a file whose inode, size, mode, mtime and ctime
//! are the same on both sides is unchanged and its contents are not read;
//! only files whose metadata differs but whose size and mode do not are
//! read, to tell a real change from a touch. An entry on one side only
//! that is not a directory (by its directory entry) and would not be
//! listed (at or past the first path the listing dropped) is counted
//! without a `stat`.
//!
//! Between two subvolumes of the store the walk is pruned with what Btrfs
//! itself records ([`Hints`]): a snapshot shares every tree block with its
//! source until one side writes, and a written block carries the number of
//! the transaction that wrote it. So only items in blocks written since the
//! two trees last were one can differ; their inodes, and the directories
//! above them, are all the walk has to look at. An entry with the same
//! inode number on both sides and no such item is the same file, and is
//! passed over without a `stat`.
//!
//! The trees belong to an agent, so the walk is bounded whatever they hold
//! ([`Limits`]): it is iterative with an explicit stack, keeps a few
//! directory levels open ([`crate::tree`]), compares a huge directory in
//! parts, never opens anything but a regular file it has just seen (and
//! never blocks opening one), reads contents within a budget, skipping
//! holes, and lists only what fits one protocol frame. Where a tree is
//! deeper, or holds more names at once, than the limits allow, the diff
//! stops with an error that names the limit and the path (code
//! `unsupported`); a tree that changes under the walk in a way it cannot
//! follow gives `conflict`.
//!
//! Asked for patches, the diff then reads each listed file again and
//! answers its change as `git diff` shows it ([`patch`]), within the
//! answer's bounds.

mod contents;
pub use contents::{path_xattrs, Xattrs};
mod hunks;
mod listing;
mod names;
mod patch;
mod walk;

use super::{Result, Store, StoreError};
use crate::btrfs::{self, item, RootInfo, SearchKey, SUBVOL_ROOT_INO};
use crate::tree::Dir;
use allox_protocol::{validate_id, Change, ChangeKind, CheckpointDiff, DiffListing};
use rustix::fd::OwnedFd;
use rustix::fs::{self, Mode, OFlags};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The hints' sets and maps, keyed by inode numbers (which Btrfs hands
/// out, not the agent): hashed with `foldhash`, a few times faster than
/// the standard hasher on the tens of thousands of keys a large change
/// brings.
type FastSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Most changes listed in one answer (the counts cover all of them).
pub const MAX_CHANGES: usize = 10_000;

/// What one diff may cost; past any of them it stops, or lists less, as
/// each says.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Deepest directory level compared (the roots are level 0). Deeper:
    /// error.
    pub depth: usize,
    /// Bytes of names (both sides) one directory holds at once. A larger
    /// directory is compared in parts, each read anew.
    pub dir_bytes: usize,
    /// Bytes of names held at once over all the levels of the walk.
    pub held_bytes: usize,
    /// Most parts one directory is compared in. More: error.
    pub parts: usize,
    /// Bytes of file contents read in one diff. Past it, a file whose
    /// metadata differs is reported modified without being read.
    pub read_bytes: u64,
    /// Most changes listed (all are counted; `truncated` says some are not
    /// listed).
    pub changes: usize,
    /// Most bytes of paths listed, so that the answer fits one frame.
    pub listed_bytes: usize,
    /// Most inodes the Btrfs hints single out before the diff walks
    /// everything instead.
    pub hint_inodes: usize,
    /// Most bytes of patch text in one answer.
    pub patch_bytes: usize,
    /// Most bytes of one file's patch.
    pub patch_file_bytes: usize,
    /// Bytes of file contents read for the patches of one answer.
    pub patch_read_bytes: u64,
    /// Largest file (either side) whose lines are compared for a patch.
    pub patch_file_read: u64,
    /// Most bytes of the listing and its patches together: what one frame
    /// holds, less room for the rest of the answer and its framing.
    pub answer_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            depth: 4096,
            dir_bytes: 32 << 20,
            held_bytes: 64 << 20,
            parts: 64,
            read_bytes: 256 << 20,
            changes: MAX_CHANGES,
            listed_bytes: 512 << 10,
            hint_inodes: 1 << 18,
            patch_bytes: 512 << 10,
            patch_file_bytes: 64 << 10,
            patch_read_bytes: 64 << 20,
            patch_file_read: 4 << 20,
            answer_bytes: 960 << 10,
        }
    }
}

fn io(op: &'static str, p: &Path, e: rustix::io::Errno) -> StoreError {
    StoreError::io(op, p, e.into())
}

/// An inode as the changed blocks of one tree show it.
#[derive(Debug, Default)]
struct Known {
    /// From its inode item (`nlink`, at byte 40), when that was seen.
    nlink: Option<u32>,
    /// From its inode item (`ctime`, seconds at byte 124), when that was
    /// seen.
    ctime: Option<i64>,
    /// From its inode item (`transid` at byte 8: the transaction that last
    /// wrote the item), when that was seen.
    transid: Option<u64>,
    /// From its inode item: whether it is a file (not a directory) that
    /// was there when the trees parted (`generation`, at byte 0, the
    /// transaction that made the inode, no later than the parting).
    old_file: bool,
    /// The parents its reference items seen name.
    parents: Vec<u64>,
}

/// Where the walk must look, from the Btrfs trees of the two sides.
#[derive(Debug, Default)]
pub struct Hints {
    /// Inodes with an item in a tree block written since the trees were one.
    changed: FastSet<u64>,
    /// Directories above those inodes, on either side.
    above: FastSet<u64>,
    /// The two trees (`from`, `to`).
    trees: (u64, u64),
    /// When the trees became two (the creation of the copy made at that
    /// transaction), seconds since the epoch; 0 when not known.
    since_time: i64,
    /// The subvolumes either tree holds a link to (nested subvolumes):
    /// their files are in trees of their own, which only a walk compares.
    subvolumes: FastSet<u64>,
    /// What a read-only side's inode items in the changed blocks say of
    /// each inode (its mode and size), by side (`false` for `from`) and
    /// inode: a tree that cannot change answers as `stat` would, so a file
    /// on that side only is listed without one.
    modes: FastMap<(bool, u64), (u32, u64)>,
    /// What the two trees' items said of the files compared by them here
    /// ([`Hints::items_alike`]), so that the walk does not ask again.
    alike: FastMap<u64, Option<bool>>,
}

impl Hints {
    /// Whether an entry with inode `ino` on both sides may differ.
    fn may_differ(&self, ino: u64) -> bool {
        self.changed.contains(&ino) || self.above.contains(&ino)
    }

    /// Whether the two trees the hints were read from hold the same
    /// entries, without a walk: no inode of either changed since they were
    /// one, and neither holds a nested subvolume (whose files are in a tree
    /// of their own, which the hints do not read; a walk compares them).
    /// A workspace left as it was is then compared without listing a
    /// directory, however large its top directory is.
    fn same_trees(&self) -> bool {
        self.changed.is_empty() && self.subvolumes.is_empty()
    }

    /// Whether a directory entry naming inode `ino` may be a nested
    /// subvolume's link (its inode number is then the subvolume's id).
    fn may_be_subvolume(&self, ino: u64) -> bool {
        self.subvolumes.contains(&ino)
    }

    /// The mode and size of inode `ino` on the `to` side (else `from`),
    /// when that side is read-only and its item was in a changed block.
    fn mode_size(&self, to: bool, ino: u64) -> Option<(u32, u64)> {
        self.modes.get(&(to, ino)).copied()
    }

    /// Whether inode `ino` has an item in a tree block written since the
    /// trees were one (on either side).
    fn touched(&self, ino: u64) -> bool {
        self.changed.contains(&ino)
    }

    /// Whether a change made since the trees became two could have left
    /// an inode's ctime at `ctime` (seconds): a change stamps the time it
    /// is made at, to the clock's tick, so a ctime more than a second
    /// older than the trees' parting is not one (most inodes a tree block
    /// holds beside a changed one). Where that time is not known, any
    /// could be.
    fn recent(&self, ctime: i64) -> bool {
        self.since_time == 0 || ctime >= self.since_time - 1
    }

    /// What the two trees' items say of each inode of `inos` (files the
    /// hints single out):
    /// `Some(true)` when every item of it is the same in both, byte for
    /// byte, but for what moves without a change of the file (the inode
    /// item's last transaction, change counter and access time);
    /// `Some(false)` when an item differs (its bytes may still be the
    /// same: rewritten alike); `None` when the items cannot tell (too many
    /// of them, or a file written in place, `nodatacow`, whose extents
    /// stay as they were). Read in runs of nearby inodes, one search of
    /// each tree for each run (a run is about one tree block's inodes);
    /// directories are left out by the caller: their entries are items
    /// too, thousands of them. `fd` is any descriptor on the filesystem.
    fn items_alike(
        &self,
        search: &mut btrfs::TreeSearch,
        fd: &impl rustix::fd::AsFd,
        mut inos: Vec<u64>,
    ) -> std::result::Result<FastMap<u64, Option<bool>>, btrfs::BtrfsError> {
        use std::hash::{BuildHasher, Hash, Hasher};
        /// Past this many items on a side (a file of many extents), the
        /// bytes are compared instead.
        const MOST: u32 = 512;
        /// Inodes this far apart or nearer are read in one search.
        const GAP: u64 = 64;
        /// `struct btrfs_inode_item`: `transid` at 8, `flags` at 64,
        /// `sequence` at 72, `atime` at 112 (12 bytes).
        const NODATACOW: u64 = 1 << 1;
        #[derive(Default)]
        struct Side {
            hash: Option<std::collections::hash_map::DefaultHasher>,
            items: u32,
            nocow: bool,
        }
        let keyed = std::collections::hash_map::RandomState::new();
        inos.sort_unstable();
        inos.dedup();
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &i in &inos {
            match runs.last_mut() {
                Some((_, end)) if i - *end <= GAP => *end = i,
                _ => runs.push((i, i)),
            }
        }
        let mut sides: [FastMap<u64, Side>; 2] = [FastMap::default(), FastMap::default()];
        for (side, tree) in sides.iter_mut().zip([self.trees.0, self.trees.1]) {
            for &(lo, hi) in &runs {
                let mut key = SearchKey::object(tree, lo, 0..=255);
                key.max_objectid = hi;
                search.run(fd, key, |it| {
                    if inos.binary_search(&it.objectid).is_err() {
                        return;
                    }
                    let s = side.entry(it.objectid).or_default();
                    s.items += 1;
                    let h = s.hash.get_or_insert_with(|| keyed.build_hasher());
                    (it.kind, it.offset).hash(h);
                    if it.kind == item::INODE_ITEM && it.data.len() >= 124 {
                        let d = it.data;
                        s.nocow |=
                            u64::from_le_bytes(d[64..72].try_into().unwrap()) & NODATACOW != 0;
                        (&d[..8], &d[16..72], &d[80..112], &d[124..]).hash(h);
                    } else {
                        it.data.hash(h);
                    }
                })?;
            }
        }
        let [a, b] = sides;
        Ok(inos
            .into_iter()
            .map(|i| {
                let verdict = match (a.get(&i), b.get(&i)) {
                    (Some(x), Some(y))
                        if x.nocow || y.nocow || x.items > MOST || y.items > MOST =>
                    {
                        None
                    }
                    (Some(x), Some(y)) => Some(
                        x.items == y.items
                            && x.hash.as_ref().map(Hasher::finish)
                                == y.hash.as_ref().map(Hasher::finish),
                    ),
                    _ => Some(false),
                };
                (i, verdict)
            })
            .collect())
    }

    /// What the trees' items said of file `ino` when the hints compared
    /// them ([`Hints::items_alike`]'s verdict), if they did.
    fn alike_verdict(&self, ino: u64) -> Option<Option<bool>> {
        self.alike.get(&ino).copied()
    }

    /// How many inodes the hints single out.
    pub fn changed_inodes(&self) -> usize {
        self.changed.len()
    }

    /// [`Hints::read`] from two paths, knowing the deleted subvolumes in
    /// `departed` (as [`Store::departed`] lists them).
    pub fn read_paths(from: &Path, to: &Path, departed: &[RootInfo]) -> Result<Option<Hints>> {
        let cap = Limits::default().hint_inodes;
        Hints::read(&open_root(from)?, &open_root(to)?, from, to, cap, departed)
    }

    /// Reads the hints for two subvolumes of one filesystem, or `None` when
    /// their common history cannot be told or when they would single out
    /// more than `cap` inodes (the caller then walks it all). `departed`:
    /// deleted subvolumes the lines of descent may pass through.
    pub fn read(
        from: &OwnedFd,
        to: &OwnedFd,
        from_path: &Path,
        to_path: &Path,
        cap: usize,
        departed: &[RootInfo],
    ) -> Result<Option<Hints>> {
        let bt = |e: btrfs::BtrfsError| StoreError::from(e);
        for (fd, p) in [(from, from_path), (to, to_path)] {
            let st = fs::fstat(fd).map_err(|e| io("stat", p, e))?;
            if st.st_ino != SUBVOL_ROOT_INO {
                return Ok(None);
            }
        }
        // The hints are read from the filesystem's trees, which hold only
        // what has been written back: a tree still written to (`current`)
        // may have changes in the page cache (data, an `mmap`ed page) or
        // in inodes not yet written to the tree (a mode, a size). Those are
        // written back first, so that nothing changed before the diff
        // began can be passed over as unchanged.
        let sides = [(from, from_path), (to, to_path)];
        let mut read_only = [false; 2];
        for (r, (fd, p)) in read_only.iter_mut().zip(sides) {
            *r = btrfs::is_read_only(fd, p).map_err(bt)?;
        }
        for ((fd, p), r) in sides.into_iter().zip(read_only) {
            if !r {
                fs::syncfs(fd).map_err(|e| io("write back", p, e))?;
                break;
            }
        }
        let (a, b) = (
            btrfs::subvolume_id_of(from, from_path).map_err(bt)?,
            btrfs::subvolume_id_of(to, to_path).map_err(bt)?,
        );
        let roots = btrfs::subvolumes(from).map_err(bt)?;
        let Some(since) = diverged(&roots, departed, a, b) else {
            return Ok(None);
        };
        let since_time = roots
            .iter()
            .chain(departed)
            .filter(|r| r.otransid == since)
            .map(|r| r.otime as i64)
            .min()
            .unwrap_or(0);
        let mut h = Hints {
            trees: (a, b),
            since_time,
            ..Hints::default()
        };
        if a == b {
            return Ok(Some(h));
        }
        let mut search = btrfs::TreeSearch::default();
        // Nested subvolumes, from their references in the tree of tree
        // roots (a snapshot's copies of such links have none: they show
        // as empty directories): the directory holding each link is
        // singled out, so that the walk reaches the link and walks it.
        let mut links: FastSet<u64> = FastSet::default();
        for tree in [a, b] {
            let key = SearchKey::object(btrfs::ROOT_TREE_ID, tree, item::ROOT_REF..=item::ROOT_REF);
            search
                .run(from, key, |it| {
                    h.subvolumes.insert(it.offset);
                    if it.data.len() >= 8 {
                        links.insert(u64::from_le_bytes(it.data[..8].try_into().unwrap()));
                    }
                })
                .map_err(bt)?;
        }
        h.changed.extend(links.iter().copied());
        let mut over = false;
        // What the changed blocks already say of each inode (per tree): its
        // link count, its inode item's transaction and ctime, and the
        // parents its references name. An inode with one link and its one
        // reference seen needs no search of its own for its parent; any
        // other is searched.
        let mut known: FastMap<(u64, u64), Known> = FastMap::default();
        for (to, tree) in [(false, a), (true, b)] {
            let keep_modes = read_only[usize::from(to)];
            // The items come in key order: an inode's, one after another.
            let mut last = None;
            // A directory's entries (two items each) are nothing the hints
            // keep, and a large new directory holds thousands: a search
            // that ends among them goes on past them.
            let past_entries = |(o, t, _): (u64, u8, u64)| {
                (t == item::DIR_ITEM || t == item::DIR_INDEX).then_some((o, item::DIR_INDEX + 1, 0))
            };
            search
                .run_skipping(
                    from,
                    SearchKey::all(tree, since.saturating_add(1)),
                    past_entries,
                    |it| {
                        if last != Some(it.objectid) {
                            last = Some(it.objectid);
                            if h.changed.len() < cap {
                                h.changed.insert(it.objectid);
                            } else if !h.changed.contains(&it.objectid) {
                                over = true;
                            }
                            // Seen on this side (with no inode item: not known
                            // to be as it was).
                            known.entry((tree, it.objectid)).or_default();
                        }
                        let le64 = |d: &[u8]| u64::from_le_bytes(d[..8].try_into().unwrap());
                        match it.kind {
                            item::INODE_ITEM if it.data.len() >= 44 => {
                                let d = it.data;
                                let n = u32::from_le_bytes(d[40..44].try_into().unwrap());
                                let k = known.entry((tree, it.objectid)).or_default();
                                k.nlink = Some(n);
                                // `struct btrfs_inode_item`: `transid` at
                                // 8, `size` at 16, `mode` at 52, `ctime`
                                // at 124.
                                k.transid = Some(le64(&d[8..]));
                                k.old_file = d.len() >= 56
                                    && le64(d) <= since
                                    && u32::from_le_bytes(d[52..56].try_into().unwrap())
                                        & libc::S_IFMT
                                        != libc::S_IFDIR;
                                if d.len() >= 132 {
                                    k.ctime = Some(le64(&d[124..]) as i64);
                                }
                                if keep_modes && d.len() >= 56 {
                                    let mode = u32::from_le_bytes(d[52..56].try_into().unwrap());
                                    h.modes.insert((to, it.objectid), (mode, le64(&d[16..])));
                                }
                            }
                            item::INODE_REF => known
                                .entry((tree, it.objectid))
                                .or_default()
                                .parents
                                .push(it.offset),
                            item::INODE_EXTREF if it.data.len() >= 8 => known
                                .entry((tree, it.objectid))
                                .or_default()
                                .parents
                                .push(le64(it.data)),
                            _ => {}
                        }
                    },
                )
                .map_err(bt)?;
            if over {
                return Ok(None);
            }
        }
        // An inode whose items are in a written block only because a
        // change beside it was written (a new entry of its directory, a
        // file made next to it, its access time alone updated) did not
        // change: on each side where its items were written, its inode
        // item was last written at or before the trees' parting (the
        // item's own transaction number: a block written again for an item
        // beside it keeps the item's bytes), or says a ctime older than the
        // parting. Whatever changes a file (its bytes, size, mode, owner,
        // names, links, extended attributes) or a directory's entries
        // writes its inode item in that transaction and stamps its ctime
        // with the time of the change ([`Hints::recent`]); an access time
        // moves alone, writing the item but leaving the ctime. Not singled
        // out, such an inode is passed over without a `stat`, and the
        // directories above it are not listed for it: a run that read a
        // tree written minutes before, or made files beside a large
        // directory, is compared by what it changed.
        let recent = |ctime: i64| since_time == 0 || ctime >= since_time - 1;
        let as_at_parting = |k: &Known| {
            k.transid.is_some_and(|t| t <= since) || k.ctime.is_some_and(|c| !recent(c))
        };
        h.changed.retain(|ino| {
            links.contains(ino)
                || [a, b]
                    .into_iter()
                    .any(|tree| known.get(&(tree, *ino)).is_some_and(|k| !as_at_parting(k)))
        });
        // Files that were there when the trees parted and whose inode item
        // was written since, with a ctime too recent to tell (a file
        // written a moment before the parting, read after it: its access
        // time moved): their items in the two trees tell, all of them byte
        // for byte but for the inode item's transaction, change counter
        // and access time ([`Hints::items_alike`]); those alike are not
        // singled out. Files made since (their inode's own transaction
        // after the parting) are changes whatever their items say, and
        // are not searched for.
        let written: Vec<u64> = h
            .changed
            .iter()
            .copied()
            .filter(|ino| {
                !links.contains(ino)
                    && [a, b].into_iter().all(|tree| {
                        known
                            .get(&(tree, *ino))
                            .is_none_or(|k| k.old_file && k.transid.is_some())
                    })
            })
            .collect();
        if !written.is_empty() {
            let alike = h.items_alike(&mut search, from, written).map_err(bt)?;
            h.changed
                .retain(|ino| alike.get(ino).is_none_or(|&v| v != Some(true)));
            h.alike = alike;
        }
        for tree in [a, b] {
            // The changed inodes first, in inode order, so that a run of
            // them this tree holds no item of (files made on the other
            // side only: new inodes take numbers above every older one)
            // is passed over with one search; then the directories above.
            let mut first: Vec<u64> = h.changed.iter().copied().collect();
            first.sort_unstable_by(|x, y| y.cmp(x));
            let mut todo: Vec<u64> = Vec::new();
            let mut seen: FastSet<u64> = FastSet::default();
            // No item of this tree has an objectid above `.0` and below
            // `.1` (none above `.0` at all when `.1` is `None`).
            let mut clear: Option<(u64, Option<u64>)> = None;
            while let Some((ino, in_order)) = first
                .pop()
                .map(|i| (i, true))
                .or_else(|| todo.pop().map(|i| (i, false)))
            {
                if ino == SUBVOL_ROOT_INO || !seen.insert(ino) {
                    continue;
                }
                if in_order && clear.is_some_and(|(x, y)| ino > x && y.is_none_or(|y| ino < y)) {
                    continue;
                }
                let parents = match known.get(&(tree, ino)) {
                    Some(k) if k.nlink == Some(1) && k.parents.len() == 1 => vec![k.parents[0]],
                    _ => {
                        let (parents, next) = parents_of(&mut search, from, tree, ino)?;
                        if in_order {
                            clear = next.map(|next| (ino, next));
                        }
                        parents
                    }
                };
                for p in parents {
                    h.above.insert(p);
                    todo.push(p);
                }
                if h.above.len() + h.changed.len() > cap {
                    return Ok(None);
                }
            }
        }
        Ok(Some(h))
    }
}

/// Keys a search for an inode's references asks for at once: its
/// references come first, then its other items, then the next inode's.
const REFS_AT_ONCE: u32 = 8;

/// The parents that `ino`'s reference items in `tree` name, and, when the
/// search saw past them, what it says of the inodes after `ino`:
/// `Some(Some(y))`, none of those below `y` has an item (`y` is the next
/// objectid the tree holds); `Some(None)`, none at all. One search for
/// most inodes, where walking every key of the object took two.
fn parents_of(
    search: &mut btrfs::TreeSearch,
    fd: &OwnedFd,
    tree: u64,
    ino: u64,
) -> Result<(Vec<u64>, Option<Option<u64>>)> {
    let bt = |e: btrfs::BtrfsError| StoreError::from(e);
    let from_item = |it: &btrfs::Item<'_>, out: &mut Vec<u64>| {
        if it.kind == item::INODE_REF {
            out.push(it.offset);
        } else if it.data.len() >= 8 {
            out.push(u64::from_le_bytes(it.data[..8].try_into().unwrap()));
        }
    };
    let mut key = SearchKey::all(tree, 0);
    key.min_objectid = ino;
    key.min_type = u32::from(item::INODE_REF);
    let (mut parents, mut next, mut past_refs) = (Vec::new(), None, false);
    let got = search
        .first(fd, key, REFS_AT_ONCE, |it| {
            if it.objectid != ino {
                next.get_or_insert(it.objectid);
                past_refs = true;
            } else if it.kind > item::INODE_EXTREF {
                past_refs = true;
            } else if !past_refs {
                from_item(it, &mut parents);
            }
        })
        .map_err(bt)?;
    if got == 0 {
        // Nothing at or after the key: no reference, no inode above.
        return Ok((parents, Some(None)));
    }
    if !past_refs {
        // More references than one search holds (many hard links): all
        // of them, however many searches that takes.
        parents.clear();
        let key = SearchKey::object(tree, ino, item::INODE_REF..=item::INODE_EXTREF);
        search
            .run(fd, key, |it| from_item(it, &mut parents))
            .map_err(bt)?;
        return Ok((parents, None));
    }
    Ok((parents, next.map(Some)))
}

/// The uuids of the `departed` trees some subvolume in `living` descends
/// from: each one's line of descent followed up through `departed`. A
/// subvolume listed in `living` whose uuid is in `departed` is taken as
/// deleted (`btrfs::subvolumes` lists none, but a list read before a
/// deletion may): nothing living descends from it for being listed.
fn descended_from(
    living: &[RootInfo],
    departed: &[RootInfo],
) -> std::collections::HashSet<[u8; 16]> {
    let by_uuid: HashMap<[u8; 16], &RootInfo> = departed.iter().map(|d| (d.uuid, d)).collect();
    let mut reached = std::collections::HashSet::new();
    for r in living.iter().filter(|r| !by_uuid.contains_key(&r.uuid)) {
        let mut up = r.parent_uuid;
        while let Some(d) = by_uuid.get(&up) {
            if !reached.insert(up) {
                break;
            }
            up = d.parent_uuid;
        }
    }
    reached
}

/// The transaction after which two subvolumes can differ: both descend, by
/// snapshots, from one subvolume, and each took its copy of it in some
/// transaction. A snapshot is made while its transaction commits, so blocks
/// written in that transaction or before are shared with the source; every
/// later write to either lands in a block of a later transaction.
/// `None` when the two lines of descent do not meet in what the root tree
/// still records, with the deleted subvolumes in `departed` (which the
/// store keeps the lineage of: a session rolled back twice descends from a
/// tree that is gone) known by their uuid.
fn diverged(roots: &[RootInfo], departed: &[RootInfo], a: u64, b: u64) -> Option<u64> {
    let by_id: HashMap<u64, &RootInfo> = roots.iter().map(|r| (r.id, r)).collect();
    // The living first: a uuid the root tree still holds is that tree's.
    let mut by_uuid: HashMap<[u8; 16], &RootInfo> = HashMap::new();
    for r in roots.iter().chain(departed) {
        by_uuid.entry(r.uuid).or_insert(r);
    }
    // The line of descent: (uuid, the transaction it was copied from its
    // parent at), from the subvolume up.
    let line = |id: u64| -> Option<Vec<([u8; 16], u64)>> {
        let mut out = Vec::new();
        let mut r = *by_id.get(&id)?;
        loop {
            out.push((r.uuid, r.otransid));
            if r.parent_uuid == [0; 16] || out.len() > 4096 {
                return Some(out);
            }
            match by_uuid.get(&r.parent_uuid) {
                Some(p) => r = p,
                None => {
                    // A deleted parent of unknown lineage: known by uuid
                    // only.
                    out.push((r.parent_uuid, 0));
                    return Some(out);
                }
            }
        }
    };
    let (la, lb) = (line(a)?, line(b)?);
    for (j, (u, _)) in lb.iter().enumerate() {
        if let Some(i) = la.iter().position(|(v, _)| v == u) {
            let copy = |l: &[([u8; 16], u64)], k: usize| (k > 0).then(|| l[k - 1].1);
            return match (copy(&la, i), copy(&lb, j)) {
                (None, None) => Some(u64::MAX),
                (Some(x), None) | (None, Some(x)) => Some(x),
                (Some(x), Some(y)) => Some(x.min(y)),
            };
        }
    }
    None
}

fn open_root(p: &Path) -> Result<OwnedFd> {
    fs::open(
        p,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io("open", p, e))
}

/// How [`diff_trees`] finds the changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiffMethod {
    /// Compare every entry of both trees.
    Walk,
    /// Between two subvolumes of one Btrfs filesystem, look only where the
    /// filesystem says something was written (falls back to the walk when
    /// it cannot tell). Needs `CAP_SYS_ADMIN`.
    Btrfs,
}

/// Diffs two directory trees: the changes listed in path order, whether
/// some were left out, and the count of each kind.
pub fn diff_trees(
    from: &Path,
    to: &Path,
    method: DiffMethod,
) -> Result<(Vec<Change>, bool, [u64; 4])> {
    diff_trees_with(from, to, method, &Limits::default())
}

/// [`diff_trees`] within other limits.
pub fn diff_trees_with(
    from: &Path,
    to: &Path,
    method: DiffMethod,
    limits: &Limits,
) -> Result<(Vec<Change>, bool, [u64; 4])> {
    let d = compare(from, to, method, limits, false)?;
    Ok((d.changes, d.truncated, d.counts))
}

/// What a diff of two trees answers.
#[derive(Debug)]
pub struct Compared {
    /// The changes listed, in path order.
    pub changes: Vec<Change>,
    /// Some changes are not listed.
    pub truncated: bool,
    /// Every change, counted by [`ChangeKind`].
    pub counts: [u64; 4],
    /// Some listed change's patch is cut or left out.
    pub patch_truncated: bool,
    /// Each listed change's `st_mode` on each side (`from`, `to`), where
    /// the walk knew it (from a `stat`, or a read-only side's inode item).
    pub modes: Vec<[Option<u32>; 2]>,
}

/// Diffs two directory trees within `limits`, with each listed file's
/// patch when `patches` is set.
pub fn compare(
    from: &Path,
    to: &Path,
    method: DiffMethod,
    limits: &Limits,
    patches: bool,
) -> Result<Compared> {
    compare_knowing(from, to, method, &[], limits, patches)
}

/// [`compare`], the Btrfs hints knowing the deleted subvolumes in
/// `departed` (as the store keeps them: [`Store::departed`]).
pub fn compare_knowing(
    from: &Path,
    to: &Path,
    method: DiffMethod,
    departed: &[RootInfo],
    limits: &Limits,
    patches: bool,
) -> Result<Compared> {
    let (a, b) = (open_root(from)?, open_root(to)?);
    let hints = match method {
        DiffMethod::Walk => None,
        DiffMethod::Btrfs => Hints::read(&a, &b, from, to, limits.hint_inodes, departed)?,
    };
    if let Some(h) = &hints {
        if h.same_trees() {
            return Ok(Compared {
                changes: Vec::new(),
                truncated: false,
                counts: [0; 4],
                patch_truncated: false,
                modes: Vec::new(),
            });
        }
    }
    // The patches read the trees the walk saw, whatever is renamed over
    // their paths meanwhile.
    let dup = |fd: &OwnedFd, p: &Path| {
        rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(|e| io("duplicate", p, e))
    };
    let (pa, pb) = if patches {
        (Some(dup(&a, from)?), Some(dup(&b, to)?))
    } else {
        (None, None)
    };
    let da = Dir::from_fd(a, from.as_os_str().as_encoded_bytes())?;
    let db = Dir::from_fd(b, to.as_os_str().as_encoded_bytes())?;
    let mut w = walk::Walk::new(limits, hints.as_ref());
    w.run(da, db)?;
    let found = w.out.finish();
    let (truncated, counts) = (found.truncated, found.counts);
    let modes = found.listed.iter().map(|l| l.modes).collect();
    let (changes, patch_truncated) = match (&pa, &pb) {
        (Some(pa), Some(pb)) => patch::Patcher::new(pa, pb, &found, limits).run(&found)?,
        _ => (found.into_changes().0, false),
    };
    Ok(Compared {
        changes,
        truncated,
        counts,
        patch_truncated,
        modes,
    })
}

impl Store {
    /// Session `a/s`'s deleted trees the store kept the lineage of, as the
    /// diff's hints take them ([`compare_knowing`]): id 0 (a deleted
    /// subvolume has none), uuid, parent uuid, creating transaction and
    /// time. A record whose key is not a uuid is passed over.
    pub fn departed(&self, a: &str, s: &str) -> Result<Vec<RootInfo>> {
        Ok(self
            .index
            .departed(a, s)?
            .into_iter()
            .filter_map(|(k, r)| {
                Some(RootInfo {
                    id: 0,
                    uuid: uuid_from_hex(&k)?,
                    parent_uuid: r.parent_uuid,
                    received_uuid: [0; 16],
                    otransid: r.otransid,
                    otime: r.otime,
                })
            })
            .collect())
    }

    /// Keeps the lineage of `gone`, a tree of session `a/s` just deleted
    /// (read before it was), for [`Store::departed`]. Not durable by itself
    /// (lost, a diff through that tree walks both trees whole, as it did
    /// before), and never an error of the delete: a failure is logged.
    ///
    /// The records no subvolume of the filesystem descends from any more
    /// (a tree replaced by a rollback with no checkpoint made from it, the
    /// trees only it descended from) are forgotten in the same commit: no
    /// line of descent can pass through them again, and what is kept stays
    /// about as large as what the session keeps.
    pub(crate) fn keep_departed(&self, a: &str, s: &str, gone: &RootInfo) {
        let r = crate::rows::DepartedRecord {
            parent_uuid: gone.parent_uuid,
            otransid: gone.otransid,
            otime: gone.otime,
        };
        let key = uuid_hex(&gone.uuid);
        let stale = self.departed_behind(a, s, gone);
        let kept = self.index.write_quick(|w| {
            w.put_departed(a, s, &key, &r)?;
            for k in &stale {
                w.remove_departed(a, s, k)?;
            }
            Ok(())
        });
        if let Err(e) = kept {
            tracing::warn!(error = %e, agent = a, session = s,
                "cannot keep the lineage of a deleted tree; diffs through it walk both trees");
        }
    }

    /// Session `a/s`'s departed trees, `gone` with them, that no subvolume
    /// of the filesystem descends from (their keys). None when the
    /// subvolumes cannot be listed: a record kept too many costs a read.
    fn departed_behind(&self, a: &str, s: &str, gone: &RootInfo) -> Vec<String> {
        let Ok(mut departed) = self.departed(a, s) else {
            return Vec::new();
        };
        departed.push(gone.clone());
        let living = open_root(&self.layout.current(a, s))
            .ok()
            .and_then(|fd| btrfs::subvolumes(&fd).ok());
        let Some(living) = living else {
            return Vec::new();
        };
        let reached = descended_from(&living, &departed);
        departed
            .iter()
            .filter(|d| !reached.contains(&d.uuid))
            .map(|d| uuid_hex(&d.uuid))
            .collect()
    }

    fn tree_of(&self, a: &str, s: &str, name: &str) -> Result<PathBuf> {
        if name == "current" {
            return Ok(self.layout.current(a, s));
        }
        validate_id("checkpoint_id", name)?;
        self.index
            .checkpoint(a, s, name)?
            .ok_or_else(|| StoreError::NotFound(format!("checkpoint {a}/{s}/{name}")))?;
        Ok(self.layout.checkpoint(a, s, name))
    }

    pub fn checkpoint_diff(&self, p: &CheckpointDiff) -> Result<DiffListing> {
        let (a, s) = (p.agent_id.as_str(), p.session_id.as_str());
        self.need_session(a, s)?;
        let from = self.tree_of(a, s, &p.from)?;
        let to = self.tree_of(a, s, &p.to)?;
        // Each tree's subvolume as it is before the walk: a rollback puts
        // a new subvolume at `current/` and the old one is deleted in the
        // background, a deleted checkpoint goes; a walk of a tree going
        // meanwhile reads a part of it, which is never answered.
        let before = [tree_identity(&from), tree_identity(&to)];
        // The lineage of the session's deleted trees, so that the hints
        // still find where two trees parted after rollbacks.
        let departed = self.departed(a, s)?;
        let d = compare_knowing(
            &from,
            &to,
            DiffMethod::Btrfs,
            &departed,
            &Limits::default(),
            p.patch,
        );
        for ((path, name), was) in [(&from, &p.from), (&to, &p.to)].into_iter().zip(before) {
            if was.is_none() || tree_identity(path) != was {
                return Err(StoreError::TreeReplaced {
                    agent: a.into(),
                    session: s.into(),
                    tree: if name == "current" {
                        "current/".into()
                    } else {
                        format!("checkpoint {name}")
                    },
                });
            }
        }
        let d = d?;
        let c = d.counts;
        Ok(DiffListing {
            from: p.from.clone(),
            to: p.to.clone(),
            changes: d.changes,
            truncated: d.truncated,
            patch_truncated: d.patch_truncated,
            added: c[ChangeKind::Added as usize],
            modified: c[ChangeKind::Modified as usize],
            deleted: c[ChangeKind::Deleted as usize],
            type_changed: c[ChangeKind::TypeChanged as usize],
        })
    }
}

/// Which subvolume stands at `path` now: Btrfs gives each subvolume a
/// device number of its own, kept while the subvolume lives (`None`: none
/// stands there).
fn tree_identity(path: &Path) -> Option<u64> {
    fs::stat(path).ok().map(|st| st.st_dev)
}

/// A uuid as 32 lowercase hex digits.
fn uuid_hex(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

/// The uuid of [`uuid_hex`], or `None` for anything else.
fn uuid_from_hex(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(id: u64, uuid: u8, parent: u8, otransid: u64) -> RootInfo {
        RootInfo {
            id,
            uuid: [uuid; 16],
            parent_uuid: if parent == 0 { [0; 16] } else { [parent; 16] },
            received_uuid: [0; 16],
            otransid,
            otime: otransid * 10,
        }
    }

    /// The living trees after two rollbacks (below).
    fn after_two_rollbacks() -> Vec<RootInfo> {
        vec![
            root(2, 2, 1, 10), // c1
            root(3, 3, 1, 20), // c2
            root(5, 5, 4, 40), // c3
            root(6, 6, 3, 50), // current
        ]
    }

    /// Two rollbacks: c1 and c2 of tree 1 (gone), c3 of tree 4 (gone,
    /// made from c1), current 6 made from c2. Without the lineage the two
    /// lines end at different gone trees; with it they meet at tree 1,
    /// where c1 and c2 were copied at 10 and 20.
    #[test]
    fn lines_of_descent_meet_through_departed_trees() {
        let living = after_two_rollbacks();
        let departed = [root(0, 1, 0, 5), root(0, 4, 2, 30)];
        assert_eq!(diverged(&living, &[], 5, 6), None);
        assert_eq!(diverged(&living, &departed, 5, 6), Some(10));
        assert_eq!(diverged(&living, &departed, 6, 5), Some(10));
        // c3 and c1: c3's line passes c1 itself, copied into tree 4 at 30.
        assert_eq!(diverged(&living, &departed, 5, 2), Some(30));
        // A departed record never stands for a living tree of its uuid.
        let stale = [root(0, 3, 9, 1)];
        assert_eq!(diverged(&living, &stale, 6, 3), Some(50));
    }

    /// Which departed trees are still on a line of descent: tree 4 (gone)
    /// has c3 below it, tree 1 (gone) c1 and c2; tree 7 (gone) had only
    /// tree 8 below it (gone too, and still listed while Btrfs drops it),
    /// and tree 9 (gone) nothing.
    #[test]
    fn departed_trees_nothing_descends_from_are_found() {
        let mut living = after_two_rollbacks();
        living.push(root(8, 8, 7, 60)); // deleted, not dropped yet
        let departed = [
            root(0, 1, 0, 5),
            root(0, 4, 2, 30),
            root(0, 7, 3, 55),
            root(0, 8, 7, 60),
            root(0, 9, 6, 70),
        ];
        // 7, 8 and 9: nothing living below them (tree 8, still listed, is
        // one of the departed), listed or not.
        let found = |living: &[RootInfo], departed: &[RootInfo]| {
            let mut got: Vec<u8> = descended_from(living, departed)
                .iter()
                .map(|u| u[0])
                .collect();
            got.sort();
            got
        };
        for listed in [&living[..], &living[..4]] {
            assert_eq!(found(listed, &departed), [1, 4]);
        }
        // Tree 8 taken as living (it is not among the departed): 7 kept.
        assert_eq!(found(&living, &departed[..3]), [1, 4, 7]);
        assert!(descended_from(&living, &[]).is_empty());
    }

    #[test]
    fn a_uuid_reads_back_from_its_hex() {
        let u = [
            0x00, 0x01, 0xab, 0xff, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0,
            0xb0, 0xc0,
        ];
        assert_eq!(uuid_from_hex(&uuid_hex(&u)), Some(u));
        assert_eq!(uuid_from_hex("xyz"), None);
        assert_eq!(uuid_from_hex(&"g".repeat(32)), None);
    }
}
