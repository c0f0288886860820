//! Per-function invocation statistics (count, failures, longest and total duration), kept by the
//! queue listeners so a benchmark can report the longest single invocation without parsing logs.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// Figures of one function's queue-triggered invocations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FunctionStats {
    pub invocations: u64,
    pub failed: u64,
    pub longest: Duration,
    pub total: Duration,
}

/// Shared by every listener of a host; cheap to update (one short lock per invocation).
#[derive(Debug, Default)]
pub struct InvocationStats {
    by_function: Mutex<BTreeMap<String, FunctionStats>>,
}

impl InvocationStats {
    pub fn record(&self, function: &str, elapsed: Duration, succeeded: bool) {
        let mut map = self.by_function.lock().unwrap();
        let s = map.entry(function.to_string()).or_default();
        s.invocations += 1;
        s.failed += u64::from(!succeeded);
        s.longest = s.longest.max(elapsed);
        s.total += elapsed;
    }

    pub fn snapshot(&self) -> BTreeMap<String, FunctionStats> {
        self.by_function.lock().unwrap().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_count_failures_and_longest() {
        let stats = InvocationStats::default();
        stats.record("A", Duration::from_millis(5), true);
        stats.record("A", Duration::from_millis(9), false);
        stats.record("B", Duration::from_millis(1), true);
        let s = stats.snapshot();
        assert_eq!(
            s["A"],
            FunctionStats {
                invocations: 2,
                failed: 1,
                longest: Duration::from_millis(9),
                total: Duration::from_millis(14)
            }
        );
        assert_eq!(s["B"].invocations, 1);
    }
}
