//! The checkpoint DAG of one session, drawn as a tree from parent links.
//!
//! Roots come first, oldest first. A checkpoint with one child continues on
//! the next line at the same depth, so a straight history stays a flat list;
//! where a checkpoint has several children (a rollback happened and work went
//! on from it), each child opens a branch with `├─` / `└─`:
//!
//! ```text
//! CHECKPOINT         CREATED              ORIGIN    PINNED  LABEL
//! base               2024-01-01 00:00:00  baseline
//! c1                 2024-01-01 00:01:00  turn
//! ├─ c2              2024-01-01 00:02:00  turn
//! └─ c3 * (current)  2024-01-01 00:03:00  manual    pinned  after rollback
//! ```
//!
//! Separate roots (a parent that was deleted, a recovered checkpoint) are
//! set apart by an empty line.

use super::table::{clean, Table};
use super::time::utc;
use allox_protocol::{CheckpointInfo, CheckpointListing};
use std::collections::HashMap;

/// Marks the checkpoint `current/` descends from.
pub const HEAD_MARK: &str = " * (current)";

/// The listing as a tree; see the module documentation.
pub fn checkpoint_tree(listing: &CheckpointListing) -> String {
    let nodes = &listing.checkpoints;
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    // The daemon lists oldest first already; keep its order among equals.
    order.sort_by_key(|&i| nodes[i].created_ms);

    let index: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, c)| (c.checkpoint_id.as_str(), i))
        .collect();
    let parent_of = |i: usize| {
        nodes[i]
            .parent
            .as_deref()
            .and_then(|p| index.get(p).copied())
            .filter(|&p| p != i)
    };
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut roots = Vec::new();
    for &i in &order {
        match parent_of(i) {
            Some(p) => children[p].push(i),
            None => roots.push(i),
        }
    }

    let mut table = Table::with_header(&["CHECKPOINT", "CREATED", "ORIGIN", "PINNED", "LABEL"]);
    let mut seen = vec![false; nodes.len()];
    // A cycle of parent links has no root: start one at its oldest member so
    // that every checkpoint is shown once.
    let mut first = true;
    for root in roots.into_iter().chain(order.iter().copied()) {
        if seen[root] {
            continue;
        }
        if !first {
            table.row(Vec::new());
        }
        first = false;
        // (node, text before its ID, text before lines under it)
        let mut stack = vec![(root, String::new(), String::new())];
        while let Some((i, lead, cont)) = stack.pop() {
            if std::mem::replace(&mut seen[i], true) {
                continue;
            }
            let orphan = nodes[i]
                .parent
                .as_deref()
                .is_some_and(|p| !index.contains_key(p));
            table.row(cells(&nodes[i], &lead, listing.head.as_deref(), orphan));
            let kids: Vec<usize> = children[i].iter().copied().filter(|&k| !seen[k]).collect();
            if let [only] = kids[..] {
                stack.push((only, cont.clone(), cont));
                continue;
            }
            for (n, &k) in kids.iter().enumerate().rev() {
                let last = n + 1 == kids.len();
                let (branch, under) = if last {
                    ("└─ ", "   ")
                } else {
                    ("├─ ", "│  ")
                };
                stack.push((k, format!("{cont}{branch}"), format!("{cont}{under}")));
            }
        }
    }

    let mut out = table.render();
    match listing.head.as_deref() {
        None => out.push_str("current/ descends from no checkpoint\n"),
        Some(h) if !index.contains_key(h) => {
            out.push_str(&format!(
                "current/ descends from {}, which is not listed\n",
                clean(h)
            ));
        }
        Some(_) => {}
    }
    out
}

fn cells(c: &CheckpointInfo, lead: &str, head: Option<&str>, orphan: bool) -> Vec<String> {
    let mut name = format!("{lead}{}", clean(&c.checkpoint_id));
    if head == Some(c.checkpoint_id.as_str()) {
        name.push_str(HEAD_MARK);
    }
    let mut label = c.label.as_deref().map(clean).unwrap_or_default();
    if let (true, Some(parent)) = (orphan, &c.parent) {
        if !label.is_empty() {
            label.push(' ');
        }
        label.push_str(&format!("(parent {} is gone)", clean(parent)));
    }
    if let Some(f) = &c.forked_from {
        if !label.is_empty() {
            label.push(' ');
        }
        let at = f.checkpoint_id.as_deref().unwrap_or("current");
        label.push_str(&format!(
            "(forked from {}/{}@{})",
            clean(&f.agent_id),
            clean(&f.session_id),
            clean(at)
        ));
    }
    vec![
        name,
        utc(c.created_ms),
        c.origin.as_str().to_owned(),
        if c.pinned { "pinned" } else { "" }.to_owned(),
        label,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::Origin;

    fn ckpt(id: &str, parent: Option<&str>, minute: u64) -> CheckpointInfo {
        CheckpointInfo {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: id.into(),
            parent: parent.map(Into::into),
            created_ms: 1_704_067_200_000 + minute * 60_000,
            origin: Origin::Manual,
            pinned: false,
            label: None,
            turn_id: None,
            forked_from: None,
        }
    }

    fn listing(head: Option<&str>, checkpoints: Vec<CheckpointInfo>) -> CheckpointListing {
        CheckpointListing {
            agent_id: "a".into(),
            session_id: "s".into(),
            head: head.map(Into::into),
            checkpoints,
        }
    }

    #[test]
    fn branches_after_a_rollback() {
        let mut c1 = ckpt("c1", None, 0);
        c1.origin = Origin::Baseline;
        let mut c3 = ckpt("c3", Some("c1"), 2);
        c3.pinned = true;
        c3.label = Some("after rollback".into());
        let l = listing(Some("c3"), vec![c1, ckpt("c2", Some("c1"), 1), c3]);
        assert_eq!(
            checkpoint_tree(&l),
            "\
CHECKPOINT         CREATED              ORIGIN    PINNED  LABEL
c1                 2024-01-01 00:00:00  baseline
├─ c2              2024-01-01 00:01:00  manual
└─ c3 * (current)  2024-01-01 00:02:00  manual    pinned  after rollback
"
        );
    }

    #[test]
    fn straight_history_stays_flat_and_branches_nest() {
        // c1 → c2 → {c3 → c4, c5}; head c5.
        let l = listing(
            Some("c5"),
            vec![
                ckpt("c1", None, 0),
                ckpt("c2", Some("c1"), 1),
                ckpt("c3", Some("c2"), 2),
                ckpt("c4", Some("c3"), 3),
                ckpt("c5", Some("c2"), 4),
            ],
        );
        let names: Vec<String> = checkpoint_tree(&l)
            .lines()
            .skip(1)
            .map(|line| line.split("  2024").next().unwrap().trim_end().to_owned())
            .collect();
        assert_eq!(names, ["c1", "c2", "├─ c3", "│  c4", "└─ c5 * (current)"]);
    }

    #[test]
    fn orphans_cycles_and_missing_head_are_all_shown() {
        let l = listing(
            Some("gone"),
            vec![
                ckpt("c1", None, 0),
                ckpt("o1", Some("deleted"), 1),
                ckpt("x", Some("y"), 2),
                ckpt("y", Some("x"), 3),
            ],
        );
        let text = checkpoint_tree(&l);
        for needle in [
            "\nc1 ",
            "\n\no1 ",
            "(parent deleted is gone)",
            "\n\nx ",
            "\ny ",
            "gone, which is not listed",
        ] {
            assert!(text.contains(needle), "{needle:?} in\n{text}");
        }
        assert_eq!(text.matches("2024-").count(), 4, "{text}");
        assert!(
            !text.contains("parent x") && !text.contains("parent y"),
            "{text}"
        );
    }

    #[test]
    fn no_head_is_said() {
        let text = checkpoint_tree(&listing(None, vec![ckpt("c1", None, 0)]));
        assert!(
            text.ends_with("current/ descends from no checkpoint\n"),
            "{text}"
        );
    }
}
