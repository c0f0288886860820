//! The scan engine (`tablescan::scan`), the distributed prefix scan itself:
//! - `memory`: on the in-memory table: the blog's worked example, edge cases, termination, and
//!   property tests against a filtered, sorted copy of the table;
//! - `budget`: no parameters and no paging make one step unbounded;
//! - `azurite`: property tests with adversarial keys on Azurite, and the `list` CLI.
//!
//! Shared fixtures: `tests/support/scan.rs`.

mod azurite;
mod budget;
mod memory;
