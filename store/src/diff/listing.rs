//! The changes a diff answers with: every change counted, the first ones
//! in path order listed, as many as fit the count and byte limits.

use allox_protocol::{Change, ChangeKind};
use std::collections::BinaryHeap;

/// Bytes a listed change costs beside its path (its encoding, the empty
/// patch fields included).
const CHANGE_COST: usize = 32;

/// A listed change, its path as the tree holds it.
pub struct Listed {
    pub path: Vec<u8>,
    pub kind: ChangeKind,
    pub before: Option<u64>,
    pub after: Option<u64>,
    /// Its `st_mode` on each side (`from`, `to`), where the walk knew it.
    pub modes: [Option<u32>; 2],
    /// Listed modified without its bytes compared (the read budget ran
    /// out; its metadata moved).
    pub unread: bool,
}

impl Listed {
    /// The change as the protocol carries it (a path that is not UTF-8
    /// escaped, never lossy: two names never come out as one).
    pub fn change(&self) -> Change {
        let (path, escaped) = allox_protocol::path_from_bytes(&self.path);
        Change {
            path,
            escaped,
            unread: self.unread,
            kind: self.kind,
            size_before: self.before,
            size_after: self.after,
            patch: None,
            patch_truncated: false,
        }
    }
}

/// What a walk found.
pub struct Found {
    /// The changes listed, in path order.
    pub listed: Vec<Listed>,
    /// Whether some changes were left out of `listed`.
    pub truncated: bool,
    /// Every change, counted by kind.
    pub counts: [u64; 4],
    /// What `listed` costs of the answer, in bytes at most.
    pub bytes: usize,
}

impl Found {
    /// The listed changes, whether some were left out, and the counts.
    pub fn into_changes(self) -> (Vec<Change>, bool, [u64; 4]) {
        let changes = self.listed.iter().map(Listed::change).collect();
        (changes, self.truncated, self.counts)
    }
}

impl PartialEq for Listed {
    fn eq(&self, o: &Self) -> bool {
        self.path == o.path
    }
}
impl Eq for Listed {}
impl PartialOrd for Listed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Listed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.path.cmp(&o.path)
    }
}

pub struct Listing {
    /// The smallest paths seen so far; the largest on top.
    kept: BinaryHeap<Listed>,
    bytes: usize,
    /// The smallest path dropped: nothing at or past it is listed, so the
    /// listing stays a prefix of all the changes in path order.
    ceiling: Option<Vec<u8>>,
    pub counts: [u64; 4],
    max: usize,
    max_bytes: usize,
}

impl Listing {
    pub fn new(max: usize, max_bytes: usize) -> Listing {
        Listing {
            kept: BinaryHeap::new(),
            bytes: 0,
            ceiling: None,
            counts: [0; 4],
            max,
            max_bytes,
        }
    }

    /// Whether a change at `path` would be listed now (one at or past
    /// the smallest path dropped never is).
    pub fn lists(&self, path: &[u8]) -> bool {
        self.ceiling.as_deref().is_none_or(|c| path < c)
    }

    /// Counts a change that [`Listing::lists`] said is not listed.
    pub fn count(&mut self, kind: ChangeKind) {
        self.counts[kind as usize] += 1;
    }

    /// Counts a change and lists it, if it is within the listing's
    /// bounds: its sizes (`from`, `to`) and its `st_mode` on each side
    /// where known.
    pub fn push(
        &mut self,
        path: &[u8],
        kind: ChangeKind,
        sizes: (Option<u64>, Option<u64>),
        modes: [Option<u32>; 2],
    ) {
        self.push_read(path, kind, sizes, modes, true);
    }

    /// [`Listing::push`], saying whether the file's bytes were compared
    /// (`read`) where it is listed modified.
    pub fn push_read(
        &mut self,
        path: &[u8],
        kind: ChangeKind,
        (before, after): (Option<u64>, Option<u64>),
        modes: [Option<u32>; 2],
        read: bool,
    ) {
        self.counts[kind as usize] += 1;
        if self.ceiling.as_deref().is_some_and(|c| path >= c) {
            return;
        }
        self.bytes += path.len() + CHANGE_COST;
        self.kept.push(Listed {
            path: path.to_vec(),
            kind,
            before,
            after,
            modes,
            unread: !read,
        });
        while self.kept.len() > self.max || self.bytes > self.max_bytes {
            let Some(x) = self.kept.pop() else { break };
            self.bytes -= x.path.len() + CHANGE_COST;
            self.ceiling = Some(x.path);
        }
    }

    /// The listed changes in path order, and whether some were left out.
    pub fn finish(self) -> Found {
        let total: u64 = self.counts.iter().sum();
        let listed = self.kept.into_sorted_vec();
        Found {
            truncated: total > listed.len() as u64,
            listed,
            counts: self.counts,
            bytes: self.bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_is_a_prefix_in_path_order() {
        let mut l = Listing::new(3, 1 << 20);
        for p in ["e", "b", "d", "a", "c", "f"] {
            l.push(p.as_bytes(), ChangeKind::Added, (None, Some(1)), [None; 2]);
        }
        let (c, truncated, counts) = l.finish().into_changes();
        let paths: Vec<&str> = c.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, ["a", "b", "c"]);
        assert!(truncated);
        assert_eq!(counts[ChangeKind::Added as usize], 6);
    }

    #[test]
    fn long_paths_are_counted_not_listed_past_the_byte_limit() {
        let mut l = Listing::new(100, 200);
        l.push(b"a", ChangeKind::Modified, (Some(1), Some(2)), [None; 2]);
        // Too long to list: everything from it on is left out, so what is
        // listed stays a prefix.
        l.push(
            "b/".repeat(200).as_bytes(),
            ChangeKind::Added,
            (None, None),
            [None; 2],
        );
        l.push(b"c", ChangeKind::Added, (None, None), [None; 2]);
        l.push(b"0", ChangeKind::Deleted, (None, None), [None; 2]);
        let (c, truncated, counts) = l.finish().into_changes();
        let paths: Vec<&str> = c.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, ["0", "a"]);
        assert!(truncated);
        assert_eq!(counts.iter().sum::<u64>(), 4);
    }
}
