//! The function app: the custom-handler protocol, the scan API and the queue functions.
//!
//! Knows Azure Functions, not Azure Storage: it works through the storage traits.

pub mod body;
pub mod catalog;
pub mod config;
pub mod drivers;
pub mod error;
pub mod export_format;
pub mod functions;
pub mod handler;
pub mod index_files;
pub mod job;
pub mod layers;
pub mod messages;
pub mod observe;
pub mod pace;
pub mod protocol;
pub mod schedule;
pub mod server;
pub mod state;
pub mod tracking;
pub mod validate;
pub mod work;
