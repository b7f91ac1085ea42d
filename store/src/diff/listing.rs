//! The changes a diff answers with: every change counted, the first ones
//! in path order listed, as many as fit the count and byte limits.

use allox_protocol::{Change, ChangeKind};
use std::collections::BinaryHeap;

/// Bytes a listed change costs beside its path (its encoding).
const CHANGE_COST: usize = 32;

struct Listed {
    path: Vec<u8>,
    kind: ChangeKind,
    before: Option<u64>,
    after: Option<u64>,
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

    pub fn push(&mut self, path: &[u8], kind: ChangeKind, before: Option<u64>, after: Option<u64>) {
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
        });
        while self.kept.len() > self.max || self.bytes > self.max_bytes {
            let Some(x) = self.kept.pop() else { break };
            self.bytes -= x.path.len() + CHANGE_COST;
            self.ceiling = Some(x.path);
        }
    }

    /// The listed changes in path order, and whether some were left out.
    pub fn finish(self) -> (Vec<Change>, bool, [u64; 4]) {
        let total: u64 = self.counts.iter().sum();
        let counts = self.counts;
        let changes: Vec<Change> = self
            .kept
            .into_sorted_vec()
            .into_iter()
            .map(|x| Change {
                path: String::from_utf8_lossy(&x.path).into_owned(),
                kind: x.kind,
                size_before: x.before,
                size_after: x.after,
            })
            .collect();
        let truncated = total > changes.len() as u64;
        (changes, truncated, counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_is_a_prefix_in_path_order() {
        let mut l = Listing::new(3, 1 << 20);
        for p in ["e", "b", "d", "a", "c", "f"] {
            l.push(p.as_bytes(), ChangeKind::Added, None, Some(1));
        }
        let (c, truncated, counts) = l.finish();
        let paths: Vec<&str> = c.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, ["a", "b", "c"]);
        assert!(truncated);
        assert_eq!(counts[ChangeKind::Added as usize], 6);
    }

    #[test]
    fn long_paths_are_counted_not_listed_past_the_byte_limit() {
        let mut l = Listing::new(100, 200);
        l.push(b"a", ChangeKind::Modified, Some(1), Some(2));
        // Too long to list: everything from it on is left out, so what is
        // listed stays a prefix.
        l.push("b/".repeat(200).as_bytes(), ChangeKind::Added, None, None);
        l.push(b"c", ChangeKind::Added, None, None);
        l.push(b"0", ChangeKind::Deleted, None, None);
        let (c, truncated, counts) = l.finish();
        let paths: Vec<&str> = c.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, ["0", "a"]);
        assert!(truncated);
        assert_eq!(counts.iter().sum::<u64>(), 4);
    }
}
