//! Deployment tooling, shipped with the handler: what turns this binary into a function app.
//!
//! - [`stage`]: `tablescan stage`, a runnable function app folder (host.json, one folder per
//!   catalog function, the handler) from the definitions compiled into the binary;
//! - [`package`]: `tablescan package`, the deployable zip of that folder.
//!
//! Both read the function catalog ([`crate::app::catalog`]); nothing in `app` depends on them.

pub mod package;
pub mod stage;
