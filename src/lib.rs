//! tablescan: parallel scans of Azure Table Storage, run as an Azure Functions custom handler.
//!
//! What ships to Azure (`cargo build --release --no-default-features`), from the inside out:
//! - [`scan`]: the pure scan algorithm (prefix discovery and serial paging) over a table interface;
//! - [`index`]: the secondary index's pure parts (typed values, hash, aligned cuckoo filters,
//!   segment and staging files);
//! - [`storage`]: that interface and its Azure adapters;
//! - [`app`]: the function app (custom-handler protocol, scan API, queue functions);
//! - [`deploy`]: `stage` and `package`, which turn this binary into a function app;
//! - [`cli`]: the `tablescan` command.
//!
//! [`retry`] is the one retry loop (backoff, attempts, deadline) every layer uses; [`redact`]
//! hides credentials in every log line and error message; [`clock`] is where the app's time of
//! day comes from (the system's, or one a test or the simulator moves).
//!
//! `lab` (the default feature) holds every development tool, and nothing shipped uses it: the
//! local Functions host, Azurite, test data, the demo, the benchmark, the storage proxy, the
//! simulator, the in-memory stores and their commands (see `lab/mod.rs`).

pub mod app;
pub mod cli;
pub mod clock;
pub mod cron;
pub mod deploy;
pub mod index;
#[cfg(feature = "lab")]
pub mod lab;
pub mod redact;
pub mod retry;
pub mod run;
pub mod scan;
pub mod storage;
