//! Scans end to end: started over HTTP through the local Functions host (`tablescan host`),
//! executed by the real handler binary on Azurite, their results read back by the test's own
//! clients (`support::raw`), never by tablescan's parser. One module per behaviour:
//! - `copy/`: copy and count scans, exact to the byte;
//! - `delete_and_filter`: delete, and `filter`/`select` inside every key range;
//! - `backups/`: export and import (format, races, verification before writing, faults);
//! - `enqueue`: rows to the user's own queue;
//! - `expire/`: TTL for Table Storage, ETag-checked deletes, dry runs;
//! - `cancel`: a cancelled scan of each driver that writes stops writing, its counters final;
//! - `index/`: secondary indexes and lookups;
//! - `keyless/`: Entra ID credentials on an OAuth Azurite;
//! - `faults`, `chaos`: the fault suite (kills, duplicates, storage faults, hostile input);
//! - `rate_limit`: `maxRequestsPerSecond` held against the proxy's count;
//! - `secrets_in_logs`: no credential in any log line (in a process of its own, see there);
//! - `lab/`: the development tools (demo, bench, simulator), so they cannot rot.

#[path = "../support/mod.rs"]
mod support;

mod backups;
mod cancel;
mod chaos;
mod copy;
mod delete_and_filter;
mod enqueue;
mod expire;
mod faults;
mod index;
mod keyless;
mod lab;
mod pacing;
mod rate_limit;
mod run;
mod schedules;
mod secrets_in_logs;
