//! The function app: custom-handler protocol, scan API and queue functions.

pub mod catalog;
pub mod stage;
