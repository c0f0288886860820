//! CPU time and peak memory of the handler processes, read from `/proc` (Linux; elsewhere the
//! figures are reported as unavailable).

use std::collections::BTreeMap;

use crate::lab::host::RunningHost;

/// CPU time and peak memory of the handler processes, from their own accounting in `/proc`.
/// Handlers can restart, so every PID ever seen is kept with its latest reading.
#[derive(Debug, Default)]
pub(super) struct HandlerSampler {
    /// PID → (CPU nanoseconds when first seen during the scan, latest CPU nanoseconds).
    cpu: BTreeMap<u32, (u64, u64)>,
    pub(super) peak_rss: u64,
    available: bool,
}

/// `/proc/<pid>/stat` reports CPU time in USER_HZ ticks, which Linux fixes at 100 per second
/// for user space on every architecture.
const TICKS_PER_SECOND: u64 = 100;

/// CPU time of a process in nanoseconds. Prefers the scheduler's per-thread accounting
/// (`/proc/<pid>/task/*/schedstat`, nanosecond resolution): `/proc/<pid>/stat` counts in 10 ms
/// ticks, too coarse for a small scan, which could then appear to use no CPU at all. The handler's
/// runtime threads live as long as the process, so summing its live threads is complete enough.
fn cpu_nanos(pid: u32) -> Option<u64> {
    let from_schedstat = || -> Option<u64> {
        let mut total = 0u64;
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
            let text = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            total += text.split_whitespace().next()?.parse::<u64>().ok()?;
        }
        Some(total)
    };
    from_schedstat().or_else(|| cpu_ticks(pid).map(|t| t * (1_000_000_000 / TICKS_PER_SECOND)))
}

fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; fields are counted after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, i.e. 12th and 13th after the name.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

fn peak_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl HandlerSampler {
    pub(super) fn sample(&mut self, host: &RunningHost) {
        for pid in host.handler_pids().into_iter().flatten() {
            if let Some(nanos) = cpu_nanos(pid) {
                self.available = true;
                let entry = self.cpu.entry(pid).or_insert((nanos, nanos));
                entry.1 = entry.1.max(nanos);
            }
            if let Some(rss) = peak_rss_bytes(pid) {
                self.peak_rss = self.peak_rss.max(rss);
            }
        }
    }

    /// CPU milliseconds used since each process was first sampled. The first sample is taken
    /// just before the scan starts, so handler start-up is excluded; a handler started during the
    /// scan counts from its first sample.
    pub(super) fn cpu_ms(&self) -> Option<f64> {
        self.available
            .then(|| self.cpu.values().map(|(a, b)| b - a).sum::<u64>() as f64 / 1_000_000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process_accounting() {
        let pid = std::process::id();
        assert!(cpu_ticks(pid).is_some());
        assert!(peak_rss_bytes(pid).unwrap() > 1024 * 1024);
    }
}
