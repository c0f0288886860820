//! The lab: every development tool around the handler, none of it shipped. Compiled only with
//! the `lab` feature (on by default, so `cargo run --release -- demo` and `cargo test` work as
//! they are); what ships is built with `--no-default-features` and holds none of this.
//!
//! Invariant: code outside `lab` never names anything in it, except `crate::cli` (which adds
//! [`cli::LabCommand`] to the shipped commands) and `#[cfg(all(test, feature = "lab"))]` unit
//! tests that run the app over [`memory`] stores.
//!
//! - [`host`]: a local stand-in for the Azure Functions host (`tablescan host`);
//! - [`azurite`]: starting the Azurite storage emulator for tests, demo and benchmark;
//! - [`memory`]: in-memory table, queue and blob stores for unit and in-process tests;
//! - [`dataset`]: generated test tables; [`demo`]: the demo (`tablescan demo`);
//! - [`bench`]: the benchmark (`tablescan bench`), through [`proxy`], the counting,
//!   fault-injecting storage proxy;
//! - [`simulate`]: a virtual-time simulation of a copy on a Consumption plan around the real app;
//! - [`chart`]: the SVG line charts `bench` and `simulate` draw;
//! - [`cli`]: the commands above (`list`, `host`, `demo`, `bench`, `simulate`).

pub mod azurite;
pub mod bench;
pub mod chart;
pub mod cli;
pub mod dataset;
pub mod demo;
pub mod host;
pub mod memory;
pub mod proxy;
pub mod simulate;
