//! Copy scans end to end through the local Functions host and the real handler on Azurite:
//! - `end_to_end`: copy and count scans are exact (rows, properties, counters); cancel and poison;
//! - `exact`: every value byte for byte, checked by an oracle independent of tablescan's parser;
//! - `redeployment`: a copy continues across every handler killed at once and a redeployment.
//!
//! Copies under faults (crashes, duplicates, storage faults) are in `tests/scans/faults.rs`.

mod end_to_end;
mod exact;
mod redeployment;
