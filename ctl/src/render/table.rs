//! Aligned plain-text tables.

/// Rows of cells printed in aligned columns, two spaces apart.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new() -> Self {
        Self::default()
    }

    /// A table whose first row is `header`.
    pub fn with_header(header: &[&str]) -> Self {
        let mut t = Table::new();
        t.row(header.iter().map(|h| h.to_string()).collect());
        t
    }

    /// Adds a row; cells should already be [`clean`].
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table, one line per row, without trailing spaces.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = Vec::new();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                let w = cell.chars().count();
                match widths.get_mut(i) {
                    Some(max) => *max = (*max).max(w),
                    None => widths.push(w),
                }
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                let pad = widths[i] - cell.chars().count();
                line.extend(std::iter::repeat_n(' ', pad));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Text from the daemon made safe for a terminal: control characters
/// (newlines, escapes) are shown escaped instead of acting.
pub fn clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || is_direction(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The marks that change the direction text is shown in (an agent's
/// file name shown backwards, or another name's text reordered).
fn is_direction(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A path as an answer gave it, for people: as [`clean`], and a `\\` of
/// a name that is as it is (`escaped` false) doubled, so that it never
/// reads as an escape: `a\\nb` (four characters) and `a\nb` (a newline
/// in it) come out apart, and `x\\xff` (UTF-8) apart from `x\xff` (the
/// byte 0xff: an escaped path, whose backslashes are doubled already).
pub fn clean_path(path: &str, escaped: bool) -> String {
    if escaped {
        return clean(path);
    }
    clean(&path.replace('\\', "\\\\"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_differ_are_shown_apart() {
        let shown: Vec<String> = [
            ("a\\nb", false),
            ("a\nb", false),
            ("x\\xff", false),
            ("x\\xff", true),
            ("ab\u{202e}c", false),
        ]
        .iter()
        .map(|(p, e)| clean_path(p, *e))
        .collect();
        assert_eq!(
            shown,
            ["a\\\\nb", "a\\nb", "x\\\\xff", "x\\xff", "ab\\u{202e}c"]
        );
    }

    #[test]
    fn columns_align_and_lines_are_trimmed() {
        let mut t = Table::with_header(&["A", "LONGER", "C"]);
        t.row(vec!["wide-cell".into(), "x".into(), String::new()]);
        t.row(vec!["├─ é".into(), "yy".into(), "z".into()]);
        assert_eq!(
            t.render(),
            "A          LONGER  C\n\
             wide-cell  x\n\
             ├─ é       yy      z\n"
        );
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(clean("a\nb\x1b[31m"), "a\\nb\\u{1b}[31m");
        assert_eq!(clean("plain-ü"), "plain-ü");
    }
}
