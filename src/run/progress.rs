//! What a run or a watch shows while a scan works, from the status documents it reads: on a
//! terminal an indicatif bar on stderr (rows scanned and written, rate, pending work items,
//! elapsed time, and an ETA once the pending work drains), otherwise one plain line per status
//! read, with no control codes.
//!
//! Invariants: nothing here reads storage (each figure comes from the status document of the
//! last read, so showing progress costs nothing beyond the reads the caller makes); the plain
//! lines hold printable ASCII only; rates come from the last [`WINDOW`] of this process's
//! readings, so a resumed scan's rate is today's, not its average since it started.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The span of readings rates and the ETA are computed over.
const WINDOW: Duration = Duration::from_secs(30);

/// How progress is shown.
enum Display {
    Bar(ProgressBar),
    Lines,
    Nothing,
}

/// One status reading.
#[derive(Debug, Clone, Copy)]
struct Reading {
    at: Instant,
    rows: u64,
    messages: u64,
    pending: u64,
}

/// The progress display of one scan.
pub struct Progress {
    display: Display,
    readings: VecDeque<Reading>,
}

impl Progress {
    /// A bar when stderr is a terminal, plain lines otherwise; nothing when `quiet`.
    pub fn new(quiet: bool) -> Self {
        let display = if quiet {
            Display::Nothing
        } else if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new_spinner();
            let style = ProgressStyle::with_template("{spinner} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            Display::Bar(bar)
        } else {
            Display::Lines
        };
        Progress {
            display,
            readings: VecDeque::new(),
        }
    }

    /// Shows a status document just read.
    pub fn update(&mut self, status: &Value) {
        let figure = |name: &str| status.get(name).and_then(Value::as_u64).unwrap_or(0);
        let now = Instant::now();
        self.readings.push_back(Reading {
            at: now,
            rows: figure("rowsScanned"),
            messages: figure("messagesProcessed"),
            pending: figure("pendingWorkItems"),
        });
        while self
            .readings
            .front()
            .is_some_and(|r| now.duration_since(r.at) > WINDOW)
            && self.readings.len() > 2
        {
            self.readings.pop_front();
        }
        let line = self.line(status);
        match &self.display {
            Display::Bar(bar) => bar.set_message(line),
            Display::Lines => eprintln!("tablescan: {line}"),
            Display::Nothing => {}
        }
    }

    /// Prints `line` on stderr without breaking the bar.
    pub fn say(&self, line: &str) {
        match &self.display {
            Display::Bar(bar) => bar.suspend(|| eprintln!("{line}")),
            _ => {
                let _ = writeln!(std::io::stderr(), "{line}");
            }
        }
    }

    /// Ends the bar (its last state stays on screen).
    pub fn finish(&self) {
        if let Display::Bar(bar) = &self.display {
            bar.finish();
        }
    }

    /// `scan ID running: 12,000 rows scanned, 11,000 written, 850 rows/s, 12 work items
    /// pending, 1,234 requests, elapsed 0:01:12, ETA 0:00:40`.
    fn line(&self, status: &Value) -> String {
        let text = |name: &str| status.get(name).and_then(Value::as_str).unwrap_or("?");
        let figure = |name: &str| status.get(name).and_then(Value::as_u64).unwrap_or(0);
        let mut line = format!(
            "scan {} {}: {} rows scanned, {} written",
            text("id"),
            text("state"),
            thousands(figure("rowsScanned")),
            thousands(figure("rowsWritten")),
        );
        if let Some(rate) = self.rate(|r| r.rows) {
            line += &format!(", {} rows/s", thousands(rate.round() as u64));
        }
        line += &format!(
            ", {} work items pending, {} requests",
            thousands(figure("pendingWorkItems")),
            thousands(figure("storageRequests")),
        );
        if let Some(elapsed) = elapsed(status) {
            line += &format!(", elapsed {}", clock(elapsed));
        }
        if let Some(eta) = self.eta() {
            line += &format!(", ETA {}", clock(eta));
        }
        line
    }

    /// The change per second of `figure` over the window, once two readings are apart.
    fn rate(&self, figure: impl Fn(&Reading) -> u64) -> Option<f64> {
        let (first, last) = (self.readings.front()?, self.readings.back()?);
        let seconds = last.at.duration_since(first.at).as_secs_f64();
        (seconds >= 1.0).then(|| figure(last).saturating_sub(figure(first)) as f64 / seconds)
    }

    /// Pending work items over the rate work items finish, only while the pending work is
    /// draining (fewer pending than at the start of the window): while discovery still adds
    /// work, a table's size is unknown (the Table service keeps no row count), so no ETA is
    /// estimable.
    fn eta(&self) -> Option<Duration> {
        let (first, last) = (self.readings.front()?, self.readings.back()?);
        if last.pending >= first.pending || last.pending == 0 {
            return None;
        }
        let per_second = self.rate(|r| r.messages)?;
        (per_second > 0.0).then(|| Duration::from_secs_f64(last.pending as f64 / per_second))
    }
}

/// Time since the scan's `startedAt` (to `completedAt` once ended).
fn elapsed(status: &Value) -> Option<Duration> {
    let time = |name: &str| {
        let text = status.get(name)?.as_str()?;
        OffsetDateTime::parse(text, &Rfc3339).ok()
    };
    let end = time("completedAt").unwrap_or_else(OffsetDateTime::now_utc);
    (end - time("startedAt")?).try_into().ok()
}

/// `H:MM:SS`.
pub fn clock(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The one-line account of an ended scan.
pub fn summary(status: &Value) -> String {
    let text = |name: &str| status.get(name).and_then(Value::as_str).unwrap_or("?");
    let figure = |name: &str| status.get(name).and_then(Value::as_u64).unwrap_or(0);
    let mut line = format!(
        "scan {} {}: {} rows scanned, {} matched, {} written, {} storage requests",
        text("id"),
        text("state"),
        thousands(figure("rowsScanned")),
        thousands(figure("rowsMatched")),
        thousands(figure("rowsWritten")),
        thousands(figure("storageRequests")),
    );
    if let Some(elapsed) = elapsed(status) {
        line += &format!(" in {}", clock(elapsed));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_as_people_write_them() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(clock(Duration::from_secs(3725)), "1:02:05");
    }

    #[test]
    fn an_eta_only_while_the_pending_work_drains() {
        let start = Instant::now();
        let reading = |s: u64, messages: u64, pending: u64| Reading {
            at: start + Duration::from_secs(s),
            rows: 0,
            messages,
            pending,
        };
        let mut p = Progress {
            display: Display::Nothing,
            readings: [reading(0, 0, 10), reading(10, 50, 20)].into(),
        };
        assert_eq!(p.eta(), None, "growing");
        p.readings = [reading(0, 0, 20), reading(10, 50, 10)].into();
        assert_eq!(p.eta(), Some(Duration::from_secs(2)));
        let line = p.line(&serde_json::json!({"id": "x", "state": "running", "rowsScanned": 1500}));
        assert!(
            line.contains("1,500 rows scanned") && line.contains("ETA 0:00:02"),
            "{line}"
        );
        assert!(line.bytes().all(|b| (0x20..0x7f).contains(&b)), "{line}");
    }
}
