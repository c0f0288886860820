//! tablescan: parallel scans of Azure Table Storage, run as an Azure Functions custom handler.
//!
//! Layers, from the inside out:
//! - [`scan`]: the pure scan algorithm (prefix discovery and serial paging) over a table interface;
//! - [`storage`]: that interface and its Azure adapters (plus in-memory stores with `lab`);
//! - [`app`]: the function app (custom-handler protocol, scan API, queue functions, `stage`).
//!
//! [`retry`] is the one retry loop (backoff, attempts, deadline) every layer uses; [`redact`]
//! hides credentials in every log line and error message.
//!
//! That is what ships to Azure (`cargo build --release --no-default-features`). The default
//! `lab` feature adds the development tools around it:
//! - `host`: a local stand-in for the Azure Functions host, for development and tests;
//! - `azurite`: starting the Azurite storage emulator for tests, demo and benchmark;
//! - `dataset`, `demo`, `bench`, `proxy`: test data, the demo, the benchmark and the counting,
//!   fault-injecting storage proxy;
//! - `simulate`: a virtual-time simulation of a copy on a Consumption plan around the real app.

pub mod app;
#[cfg(feature = "lab")]
pub mod azurite;
#[cfg(feature = "lab")]
pub mod bench;
pub mod cli;
#[cfg(feature = "lab")]
pub mod dataset;
#[cfg(feature = "lab")]
pub mod demo;
#[cfg(feature = "lab")]
pub mod host;
#[cfg(feature = "lab")]
pub mod proxy;
pub mod redact;
pub mod retry;
pub mod scan;
#[cfg(feature = "lab")]
pub mod simulate;
pub mod storage;
