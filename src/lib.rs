//! tablescan: parallel scans of Azure Table Storage, run as an Azure Functions custom handler.
//!
//! Layers, from the inside out:
//! - [`scan`]: the pure scan algorithm (prefix discovery and serial paging) over a table interface;
//! - [`storage`]: that interface, its Azure adapters, and an in-memory table for tests;
//! - [`app`]: the function app (custom-handler protocol, scan API, queue functions);
//! - [`host`]: a local stand-in for the Azure Functions host, for development and tests;
//! - [`azurite`]: starting the Azurite storage emulator for tests, demo and benchmark;
//! - [`simulate`]: a virtual-time simulation of a copy on a Consumption plan around the real app.
//!
//! [`retry`] is the one retry loop (backoff, attempts, deadline) every layer uses.

pub mod app;
pub mod azurite;
pub mod bench;
pub mod cli;
pub mod dataset;
pub mod demo;
pub mod host;
pub mod proxy;
pub mod retry;
pub mod scan;
pub mod simulate;
pub mod storage;
