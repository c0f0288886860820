//! Keyless storage (Entra ID bearer tokens) against Azurite over https in OAuth mode:
//! - `app_service`: the App Service identity endpoint, identity-based app settings only;
//! - `credentials`: every other credential (client secret, workload identity, Azure CLI, IMDS).
//!
//! Fakes of the token sources: `tests/support/identity.rs`. That no credential reaches a log is
//! `tests/scans/secrets_in_logs.rs` (its own process: it sets `RUST_LOG=trace` for the whole process).

mod app_service;
mod credentials;
