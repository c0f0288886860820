//! The function app in-process (its router called with `oneshot`, as the Functions host would):
//! - `inprocess`: protocol handling, API validation, and the work-item life cycle on the
//!   in-memory store, queue messages delivered by a test pump (duplicates included);
//! - `ended`: work that meets an ended scan, on Azurite;
//! - `lost_answers`: conditional writes whose answer is lost (the adapter retried them), on
//!   Azurite through the fault proxy;
//! - `status`: the read side (`GET /api/scans/{id}`, `GET /api/scans`) on Azurite;
//! - `retention`: ended scans cleaned up after their retention, on Azurite;
//! - `validation`: bad requests of every driver refused naming the field, nothing written;
//! - `hostile_params`: query parameters given twice, destination queues named after the app's
//!   own, a destination queue deleted under an enqueue (issue 38);
//! - `request_guards`: a connection aliasing the app's own account, through the local host;
//! - `scan/`: the scan engine (in memory, bounded steps, adversarial keys on Azurite);
//! - `storage/`: the storage adapters on Azurite (tables, queues, blobs, records, the proxy);
//! - `unrecorded`: a root delivered before its scan's record exists (a slow start);
//! - `golden_formats`: every stored and queued format against its golden copy (`tests/golden/`).

#[path = "../support/mod.rs"]
mod support;

mod ended;
mod golden_formats;
mod hostile_params;
mod inprocess;
mod lost_answers;
mod request_guards;
mod retention;
mod scan;
mod schedule_rows;
mod schedules;
mod status;
mod storage;
mod unrecorded;
mod validation;
