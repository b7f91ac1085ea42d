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
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
