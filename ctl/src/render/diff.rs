//! `checkpoint.diff`: one line a change, like `git diff --stat`, then the
//! patches when the answer carries them, like `git diff`.

use super::process::clean_output;
use super::{clean, clean_path};
use allox_protocol::{ChangeKind as K, DiffListing};

pub(super) fn listing(d: &DiffListing) -> String {
    let mut out = String::new();
    let size = |s: Option<u64>| s.map(|n| n.to_string()).unwrap_or_else(|| "-".into());
    for c in &d.changes {
        let mark = match c.kind {
            K::Added => "A",
            K::Modified => "M",
            K::Deleted => "D",
            K::TypeChanged => "T",
        };
        out.push_str(&format!(
            " {mark} {} ({} -> {}){}\n",
            clean_path(&c.path, c.escaped),
            size(c.size_before),
            size(c.size_after),
            if c.unread {
                " not read: the diff's read budget ran out"
            } else {
                ""
            }
        ));
    }
    if d.truncated {
        out.push_str(" ... (more changes than listed)\n");
    }
    out.push_str(&format!(
        " {} -> {}: {} added, {} modified, {} deleted, {} type changed\n",
        clean(&d.from),
        clean(&d.to),
        d.added,
        d.modified,
        d.deleted,
        d.type_changed
    ));
    out.push_str(&patches(d));
    out
}

/// The patches, each as its text (control characters but tabs shown
/// escaped), and what was cut or left out.
fn patches(d: &DiffListing) -> String {
    let mut out = String::new();
    let mut left_out = 0;
    for c in &d.changes {
        match &c.patch {
            Some(p) => {
                if out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&clean_output(p));
                if !p.ends_with('\n') {
                    out.push('\n');
                }
                if c.patch_truncated {
                    out.push_str(&format!(
                        "... (the patch of {} is cut here to fit the answer)\n",
                        clean(&c.path)
                    ));
                }
            }
            None if c.patch_truncated => left_out += 1,
            None => {}
        }
    }
    if left_out > 0 {
        out.push_str(&format!(
            "\n... (no patch for {left_out} more changed file{}: an answer holds at most 512 KiB of patches)\n",
            if left_out == 1 { "" } else { "s" }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::Change;

    fn change(path: &str, patch: Option<&str>, cut: bool) -> Change {
        Change {
            path: path.into(),
            kind: K::Modified,
            size_before: Some(1),
            size_after: Some(2),
            patch: patch.map(str::to_owned),
            patch_truncated: cut,
            escaped: false,
            unread: false,
        }
    }

    #[test]
    fn patches_follow_the_summary_and_cuts_are_said() {
        let p = "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\x1b[31m\tc\n";
        let d = DiffListing {
            from: "x".into(),
            to: "current".into(),
            changes: vec![
                change("f", Some(p), false),
                change("g", Some("diff --git a/g b/g\n"), true),
                change("h", None, true),
                change("i", None, true),
            ],
            truncated: false,
            added: 0,
            modified: 4,
            deleted: 0,
            type_changed: 0,
            patch_truncated: true,
        };
        let out = listing(&d);
        assert_eq!(
            out,
            " M f (1 -> 2)\n M g (1 -> 2)\n M h (1 -> 2)\n M i (1 -> 2)\n \
             x -> current: 0 added, 4 modified, 0 deleted, 0 type changed\n\
             \n\
             diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\\u{1b}[31m\tc\n\
             diff --git a/g b/g\n\
             ... (the patch of g is cut here to fit the answer)\n\
             \n\
             ... (no patch for 2 more changed files: an answer holds at most 512 KiB of patches)\n"
        );
        // Without patches: the summary alone.
        let plain = DiffListing {
            changes: vec![change("f", None, false)],
            patch_truncated: false,
            ..d
        };
        assert!(listing(&plain).ends_with("0 type changed\n"));
    }
}
