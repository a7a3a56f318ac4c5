//! Plain-text tables in Markdown pipe syntax, padded so they read well in a
//! terminal and paste unchanged into docs/benchmarks.md.
//!
//! What must hold: every row has as many cells as the header (asserted);
//! numeric columns are right-aligned.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

#[derive(Debug, Clone)]
pub struct Table {
    headers: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Columns as (header, alignment).
    pub fn new(columns: &[(&str, Align)]) -> Table {
        Table {
            headers: columns.iter().map(|(h, _)| h.to_string()).collect(),
            align: columns.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<String>) {
        assert_eq!(
            row.len(),
            self.headers.len(),
            "row width must match the header"
        );
        self.rows.push(row);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.headers.len())
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].chars().count())
                    .chain([self.headers[c].chars().count(), 3])
                    .max()
                    .unwrap_or(3)
            })
            .collect();
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for (c, cell) in cells.iter().enumerate() {
                let pad = widths[c] - cell.chars().count();
                match self.align[c] {
                    Align::Left => s.push_str(&format!(" {cell}{} |", " ".repeat(pad))),
                    Align::Right => s.push_str(&format!(" {}{cell} |", " ".repeat(pad))),
                }
            }
            s.push('\n');
            s
        };
        let mut out = line(&self.headers);
        out.push('|');
        for (c, w) in widths.iter().enumerate() {
            match self.align[c] {
                Align::Left => out.push_str(&format!(" {} |", "-".repeat(*w))),
                Align::Right => out.push_str(&format!(" {}: |", "-".repeat(w - 1))),
            }
        }
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }
}

/// Formats with thousands separators: 1234567 -> "1,234,567".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// A float with one decimal (latencies, like the seed's "35441.0").
pub fn fixed1(v: f64) -> String {
    format!("{v:.1}")
}

/// A float rounded to an integer.
pub fn fixed0(v: f64) -> String {
    format!("{v:.0}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_aligned_markdown() {
        let mut t = Table::new(&[("Operation", Align::Left), ("Throughput", Align::Right)]);
        t.push(vec!["put".into(), "366".into()]);
        t.push(vec!["get".into(), "1024".into()]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "| Operation | Throughput |");
        assert_eq!(lines[1], "| --------- | ---------: |");
        assert_eq!(lines[2], "| put       |        366 |");
        assert_eq!(lines[3], "| get       |       1024 |");
    }

    #[test]
    #[should_panic(expected = "row width")]
    fn wrong_width_rows_are_a_bug() {
        let mut t = Table::new(&[("a", Align::Left)]);
        t.push(vec!["1".into(), "2".into()]);
    }

    #[test]
    fn number_formats() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(31_101_750_491), "31,101,750,491");
        assert_eq!(fixed1(35441.04), "35441.0");
        assert_eq!(fixed0(365.6), "366");
    }
}
