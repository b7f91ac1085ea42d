//! The hunks of a unified diff between two texts, as `diff -u` prints
//! them, within a size.
//!
//! Lines end at `\n` only (a `\r` is part of its line, as `diff` and
//! `git diff` take it); the last line of a text without a final newline is
//! followed by `\ No newline at end of file`. The lines are compared by
//! Myers' algorithm (the `similar` crate) with a deadline, past which the
//! diff is still correct but may be longer than the shortest one. Hunks
//! hold 3 lines of context and are merged when fewer than 7 lines lie
//! between them, as `diff -u` does.

use similar::{Algorithm, DiffTag};
use std::time::Instant;

/// Lines of context around each change.
pub const CONTEXT: usize = 3;

const NO_NEWLINE: &str = "\\ No newline at end of file\n";

/// Splits a text into its lines, each with its `\n` (the last may have
/// none).
fn lines(text: &str) -> Vec<&str> {
    text.split_inclusive('\n').collect()
}

/// A hunk range as `diff -u` writes it: `start,len`, `start` alone for one
/// line, and for none the line before it.
fn range(start: usize, len: usize) -> String {
    match len {
        1 => format!("{}", start + 1),
        0 => format!("{start},0"),
        _ => format!("{},{len}", start + 1),
    }
}

/// The hunk header of lines from `old_at` and `new_at`, `old_n` and
/// `new_n` of them.
fn header(old_at: usize, old_n: usize, new_at: usize, new_n: usize) -> String {
    format!(
        "@@ -{} +{} @@\n",
        range(old_at, old_n),
        range(new_at, new_n)
    )
}

/// The bytes a line takes in a hunk: its sign, itself, and the note when
/// it has no newline.
fn line_cost(line: &str) -> usize {
    1 + line.len()
        + if line.ends_with('\n') {
            0
        } else {
            1 + NO_NEWLINE.len()
        }
}

fn push_line(out: &mut String, sign: char, line: &str) {
    out.push(sign);
    out.push_str(line);
    if !line.ends_with('\n') {
        out.push('\n');
        out.push_str(NO_NEWLINE);
    }
}

/// Appends to `out` the hunks that turn `old` into `new`, adding at most
/// `cap` bytes. Returns whether they all fit; if not, `out` ends with the
/// hunks that fit, the last of them cut after its last line that did, its
/// header counting only the lines kept (so what is there is a well-formed
/// patch of the first changes).
pub fn write(out: &mut String, old: &str, new: &str, cap: usize, deadline: Instant) -> bool {
    let (a, b) = (lines(old), lines(new));
    let ops = similar::capture_diff_slices_deadline(Algorithm::Myers, &a, &b, Some(deadline));
    let start = out.len();
    for group in similar::group_diff_ops(ops, CONTEXT) {
        let Some(first) = group.first() else { continue };
        let (old_at, new_at) = (first.old_range().start, first.new_range().start);
        let mut body = String::new();
        let (mut old_n, mut new_n) = (0, 0);
        let mut full = true;
        'ops: for op in &group {
            let (tag, old_r, new_r) = op.as_tag_tuple();
            // Removed lines before added ones, as `diff -u` writes them.
            let (old_sign, new_sign) = match tag {
                DiffTag::Equal => (Some(' '), None),
                DiffTag::Delete => (Some('-'), None),
                DiffTag::Insert => (None, Some('+')),
                DiffTag::Replace => (Some('-'), Some('+')),
            };
            let (a, b) = (&a, &b);
            let olds = old_sign
                .into_iter()
                .flat_map(|s| old_r.clone().map(move |i| (s, a[i])));
            let news = new_sign
                .into_iter()
                .flat_map(|s| new_r.clone().map(move |i| (s, b[i])));
            for (sign, line) in olds.chain(news) {
                let (o, n) = match sign {
                    ' ' => (old_n + 1, new_n + 1),
                    '-' => (old_n + 1, new_n),
                    _ => (old_n, new_n + 1),
                };
                let head = header(old_at, o, new_at, n).len();
                if out.len() - start + head + body.len() + line_cost(line) > cap {
                    full = false;
                    break 'ops;
                }
                push_line(&mut body, sign, line);
                (old_n, new_n) = (o, n);
            }
        }
        if !body.is_empty() {
            out.push_str(&header(old_at, old_n, new_at, new_n));
            out.push_str(&body);
        }
        if !full {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn unified(old: &str, new: &str, cap: usize) -> (String, bool) {
        let mut out = String::new();
        let full = write(
            &mut out,
            old,
            new,
            cap,
            Instant::now() + Duration::from_secs(5),
        );
        (out, full)
    }

    fn numbered(n: usize) -> String {
        (1..=n).map(|i| format!("line {i}\n")).collect()
    }

    #[test]
    fn hunks_are_written_as_diff_u_writes_them() {
        let old = numbered(20);
        let new = old
            .replace("line 2\n", "line two\n")
            .replace("line 15\n", "")
            + "last";
        let (p, full) = unified(&old, &new, usize::MAX);
        assert!(full);
        assert_eq!(
            p,
            "@@ -1,5 +1,5 @@\n line 1\n-line 2\n+line two\n line 3\n line 4\n line 5\n\
             @@ -12,9 +12,9 @@\n line 12\n line 13\n line 14\n-line 15\n line 16\n line 17\n \
             line 18\n line 19\n line 20\n+last\n\\ No newline at end of file\n"
        );
        // An empty side: the range is 0,0.
        let (p, _) = unified("", "a\nb\n", usize::MAX);
        assert_eq!(p, "@@ -0,0 +1,2 @@\n+a\n+b\n");
        let (p, _) = unified("a\n", "", usize::MAX);
        assert_eq!(p, "@@ -1 +0,0 @@\n-a\n");
        // A carriage return is part of its line.
        let (p, _) = unified("a\rb\n", "a\rc\n", usize::MAX);
        assert_eq!(p, "@@ -1 +1 @@\n-a\rb\n+a\rc\n");
        assert_eq!(
            unified("same\n", "same\n", usize::MAX),
            (String::new(), true)
        );
    }

    #[test]
    fn a_cut_patch_keeps_whole_lines_and_true_counts() {
        let new = numbered(1000);
        let (whole, full) = unified("", &new, usize::MAX);
        assert!(full);
        for cap in [0, 10, 40, 100, 4096, whole.len() - 1] {
            let (p, full) = unified("", &new, cap);
            assert!(!full, "cap {cap}");
            assert!(p.len() <= cap, "{} > {cap}", p.len());
            if p.is_empty() {
                continue;
            }
            // The first lines of the whole patch, under a header that
            // counts them.
            let body = p.split_once('\n').unwrap().1;
            let n = body.lines().count();
            assert_eq!(p.lines().next().unwrap(), format!("@@ -0,0 +1,{n} @@"));
            assert!(whole.contains(body), "cap {cap}");
            assert!(body.ends_with('\n'));
        }
        let (p, full) = unified("", &new, whole.len());
        assert!(full && p == whole);
    }

    #[test]
    fn many_far_apart_changes_stop_at_the_cap() {
        let old = numbered(10_000);
        let new: String = old
            .lines()
            .enumerate()
            .map(|(i, l)| {
                if i % 100 == 50 {
                    format!("{l} changed\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        let (whole, _) = unified(&old, &new, usize::MAX);
        assert_eq!(whole.matches("@@ -").count(), 100);
        let (p, full) = unified(&old, &new, 1000);
        assert!(!full && p.len() <= 1000 && p.len() > 500);
        assert!(whole.starts_with(&p[..p.rfind("@@ -").unwrap()]));
        let ops = similar::capture_diff_slices(Algorithm::Myers, &lines(&old), &lines(&new));
        assert_eq!(
            ops.iter().filter(|o| o.tag() != DiffTag::Equal).count(),
            100
        );
    }
}
