//! When each request reached the proxy, for rate measurements (`tests/scans/rate_limit.rs`): off
//! until [`Timeline::start`], then one [`Stamp`] per request, marked if its path, query or body
//! contains one of the marks the caller gave (e.g. a row key, to tell one row's requests apart).

use std::sync::Mutex;
use std::time::Instant;

/// One request as the proxy received it.
#[derive(Debug, Clone)]
pub struct Stamp {
    pub at: Instant,
    /// The request's kind, as the proxy's counts name it (`query`, `batch`, `queue_put`, ...).
    pub kind: &'static str,
    /// The table, queue or container it addressed.
    pub resource: String,
    /// Whether its path, query or body contains one of the marks.
    pub marked: bool,
}

/// The requests received since [`Timeline::start`] (at most [`MAX_STAMPS`]).
#[derive(Debug, Default)]
pub struct Timeline {
    state: Mutex<Option<(Vec<String>, Vec<Stamp>)>>,
}

/// Most stamps kept (a bound on memory; later requests are not stamped).
pub const MAX_STAMPS: usize = 2_000_000;

impl Timeline {
    /// Starts stamping (dropping earlier stamps); `marks` are the strings that mark a request.
    pub fn start(&self, marks: &[&str]) {
        let marks = marks.iter().map(|m| m.to_string()).collect();
        *self.state.lock().unwrap() = Some((marks, Vec::new()));
    }

    /// The stamps so far.
    pub fn stamps(&self) -> Vec<Stamp> {
        self.state
            .lock()
            .unwrap()
            .as_ref()
            .map(|(_, stamps)| stamps.clone())
            .unwrap_or_default()
    }

    pub(super) fn record(&self, kind: &'static str, resource: &str, target: &str, body: &[u8]) {
        let mut state = self.state.lock().unwrap();
        let Some((marks, stamps)) = state.as_mut() else {
            return;
        };
        if stamps.len() >= MAX_STAMPS {
            return;
        }
        let body = String::from_utf8_lossy(body);
        let marked = marks
            .iter()
            .any(|m| target.contains(m.as_str()) || body.contains(m.as_str()));
        stamps.push(Stamp {
            at: Instant::now(),
            kind,
            resource: resource.to_string(),
            marked,
        });
    }
}
