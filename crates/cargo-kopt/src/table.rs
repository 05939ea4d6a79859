//! Plain-text tables: aligned columns, a header rule, optional styles per cell.

use anstyle::Style;

pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<(String, Style)>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<(String, Style)>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let n = self.header.len();
        let mut width = vec![0; n];
        for (i, h) in self.header.iter().enumerate() {
            width[i] = h.chars().count();
        }
        for r in &self.rows {
            for (i, (c, _)) in r.iter().enumerate().take(n) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let bold = Style::new().bold();
        let mut out = String::new();
        let line = |cells: Vec<(String, Style)>, out: &mut String| {
            let last = cells.len().saturating_sub(1);
            for (i, (c, style)) in cells.into_iter().enumerate() {
                let pad = if i == last {
                    0
                } else {
                    width[i] - c.chars().count() + 2
                };
                out.push_str(&format!("{style}{c}{style:#}{}", " ".repeat(pad)));
            }
            out.push('\n');
        };
        line(
            self.header.iter().map(|h| (h.clone(), bold)).collect(),
            &mut out,
        );
        line(
            width
                .iter()
                .map(|w| ("─".repeat(*w), Style::new()))
                .collect(),
            &mut out,
        );
        for r in &self.rows {
            line(r.clone(), &mut out);
        }
        out
    }
}
