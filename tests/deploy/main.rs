//! What is deployed, held against the code:
//! - `package`: the deployable zip, read back by other readers, and run under the local host;
//! - `function_defs`: function.json / host.json / local settings against the SchemaStore schemas
//!   and the function catalog, and the folder `tablescan stage` assembles;
//! - `infra`: the Flex Consumption Bicep template (`infra/`), parsed with a real grammar.

#[path = "../support/mod.rs"]
mod support;

mod function_defs;
mod infra;
mod package;
