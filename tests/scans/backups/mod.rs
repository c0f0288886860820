//! Backups: export (table → Blob Storage) and import (export → table), end to end through the
//! local Functions host and the real handler on Azurite. One file per behaviour:
//! - `export_import`: the documented format, filters, restores equal to the source, empty exports;
//! - `races`: two exports into one prefix, cancelled and foreign manifests, forged poison, an item
//!   killed on its last delivery;
//! - `verify`: an import checks every part before writing a row, and its memory stays bounded;
//! - `faults`: both under handler crashes, duplicated messages and storage faults, corrupted parts.

mod export_import;
mod faults;
mod races;
mod verify;
