//! `tablescan host`, the local stand-in for the Functions host, against the test handler
//! (`examples/test_handler.rs`), real processes and real sockets:
//! - `http`: HTTP triggers (forwarding, payload, proxying, readiness);
//! - `supervision`: restarts, giving up and recycling, function timeouts;
//! - `queue`: queue triggers on Azurite (payloads, retries and poison, timeouts, instances);
//! - `logs`: what reaches the host's log, as on its way to Application Insights.
//!
//! Helpers: `tests/support/host.rs`.

#[path = "../support/mod.rs"]
mod support;

mod http;
mod logs;
mod queue;
mod supervision;
mod timer;
