//! Output: aligned text tables with sizes in binary units and ages, or JSON (`-o json`). Data goes to
//! stdout; diagnostics to stderr.

use std::io::Write;

use anyhow::Result;

/// The reader of llamactl's stdout went away (`llamactl cache ls | head`): the one broken pipe that
/// ends a command quietly with success. A broken pipe anywhere else — a worker's socket closing
/// under a run — is an error like any other.
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// llamactl's stdout: a broken pipe on it is marked [`StdoutClosed`].
pub struct Stdout(std::io::StdoutLock<'static>);

/// Locks stdout for a command's output.
pub fn stdout() -> Stdout {
    Stdout(std::io::stdout().lock())
}

fn mark(e: std::io::Error) -> std::io::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::io::Error::new(std::io::ErrorKind::BrokenPipe, StdoutClosed)
    } else {
        e
    }
}

impl Write for Stdout {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.write(b).map_err(mark)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush().map_err(mark)
    }
}

/// Whether `e` is stdout's reader going away (see [`StdoutClosed`]).
pub fn is_stdout_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<StdoutClosed>()
            || c.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .is_some_and(|inner| inner.is::<StdoutClosed>())
    })
}
use clap::ValueEnum;
use serde::Serialize;

/// `-o table|json`.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputMode {
    /// Aligned columns for people.
    #[default]
    Table,
    /// The API's JSON, pretty-printed.
    Json,
}

/// Writes `value` as pretty JSON and a newline.
pub fn json<T: Serialize>(out: &mut dyn Write, value: &T) -> Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)?;
    Ok(())
}

/// A table: a header row and data rows, columns padded to the widest cell.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names.
    pub fn new(headers: &[&str]) -> Table {
        Table { rows: vec![headers.iter().map(|h| h.to_string()).collect()] }
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<String>) -> &mut Table {
        self.rows.push(cells);
        self
    }

    /// Writes the table (the last column is not padded).
    pub fn write(&self, out: &mut dyn Write) -> Result<()> {
        let n = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..n)
            .map(|c| self.rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
            .collect();
        for r in &self.rows {
            let mut line = String::new();
            for (c, cell) in r.iter().enumerate() {
                if c + 1 == r.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(widths[c] - cell.chars().count() + 2));
                }
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// `1536` → `1.5 KiB`; below 1 KiB, plain bytes (`512 B`).
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// Parses `512`, `4K`, `1.5M`, `2GiB`, `3g` (binary units) into bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let mul: u64 = match unit.trim().to_ascii_lowercase().trim_end_matches("ib").trim_end_matches('b') {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => return None,
    };
    let r = v * mul as f64;
    (r.is_finite() && r >= 0.0 && r < u64::MAX as f64).then_some(r as u64)
}

/// The age of an instant (ms since the epoch) relative to `now_ms`: `45s`, `12m`, `3h`, `2d`.
pub fn age(then_ms: u64, now_ms: u64) -> String {
    let s = now_ms.saturating_sub(then_ms) / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86_399 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// A duration in seconds: `42s`, `5m 3s`, `2h 10m`, `3d 4h`.
pub fn duration(secs: u64) -> String {
    match secs {
        0..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m {}s", secs / 60, secs % 60),
        3600..=86_399 => format!("{}h {}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d {}h", secs / 86_400, secs % 86_400 / 3600),
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {

    /// Only stdout's own broken pipe ends a command quietly; one from a worker's socket (the kill
    /// tests saw runs exit 0 when the write to a killed worker failed with EPIPE) is an error.
    #[test]
    fn only_stdouts_broken_pipe_is_quiet() {
        let stdout_err = anyhow::Error::from(mark(std::io::Error::from(std::io::ErrorKind::BrokenPipe)));
        assert!(is_stdout_closed(&stdout_err.context("writing a token")));
        let socket_err = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(!is_stdout_closed(&socket_err.context("worker 127.0.0.1:1 failed")));
        let other = anyhow::Error::from(mark(std::io::Error::from(std::io::ErrorKind::Other)));
        assert!(!is_stdout_closed(&other));
    }

    use super::*;

    #[test]
    fn sizes_ages_and_tables() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(5 << 30), "5.0 GiB");
        assert_eq!(parse_size("4K"), Some(4096));
        assert_eq!(parse_size("1.5M"), Some(1_572_864));
        assert_eq!(parse_size("2GiB"), Some(2 << 30));
        assert_eq!(parse_size("100"), Some(100));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("3X"), None);
        assert_eq!(age(1_000, 46_000), "45s");
        assert_eq!(age(0, 3_600_000 * 5), "5h");
        assert_eq!(age(10_000, 0), "0s");
        assert_eq!(duration(3725), "1h 2m");
        let mut t = Table::new(&["A", "LONG HEADER", "C"]);
        t.row(vec!["xxxx".into(), "y".into(), "z".into()]);
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "A     LONG HEADER  C\nxxxx  y            z\n");
    }
}
