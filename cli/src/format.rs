//! Human-readable output: byte sizes, durations, aligned tables.

/// `1536` → `1.5 KiB`; below 1 KiB, plain bytes.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// `used` as a share of `total`, e.g. `12.5%` (`-` when total is 0).
pub fn percent(used: u64, total: u64) -> String {
    if total == 0 {
        return "-".into();
    }
    format!("{:.1}%", used as f64 * 100.0 / total as f64)
}

/// Milliseconds as `850ms`, `3.2s`, `4m10s`.
pub fn millis(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        _ => format!("{}m{}s", ms / 60_000, (ms % 60_000) / 1000),
    }
}

/// A table of left-aligned columns separated by two spaces; the header row first.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Self {
            rows: vec![header.into_iter().map(Into::into).collect()],
        }
    }

    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    pub fn render(&self) -> String {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..cols)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for r in &self.rows {
            let mut line = String::new();
            for (c, cell) in r.iter().enumerate() {
                if c > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                if c + 1 < r.len() {
                    let pad = widths[c].saturating_sub(cell.chars().count());
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_read_well() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(1 << 30), "1.0 GiB");
        assert_eq!(percent(1, 4), "25.0%");
        assert_eq!(percent(1, 0), "-");
        assert_eq!(millis(850), "850ms");
        assert_eq!(millis(3200), "3.2s");
        assert_eq!(millis(250_000), "4m10s");
    }

    #[test]
    fn tables_align() {
        let mut t = Table::new(["A", "LONGER"]);
        t.row(["xyz", "1"]);
        assert_eq!(t.render(), "A    LONGER\nxyz  1\n");
    }
}
