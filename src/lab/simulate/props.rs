//! The simulated tables' properties (index and count scenarios only), computed from a row's
//! keys and position, so 35 million rows carry them without storing them:
//!
//! - [`DISTINCT`] (`Id`): `<PartitionKey>/<RowKey>`, a different value on every row (like a
//!   package id with its version);
//! - [`THOUSAND`] (`Authors`): one of [`THOUSAND_VALUES`] values, `author-NNN`, drawn per row by
//!   a fixed hash of its position (so every key range holds hundreds of them).
//!
//! The oracle of a lookup (the rows holding a value, from these definitions and the table's
//! keys, never from an index) is `index::rows_with`.

use serde_json::json;

use crate::storage::{Entity, Filter};

/// A property with a different value on every row.
pub const DISTINCT: &str = "Id";
/// A property with about [`THOUSAND_VALUES`] distinct values.
pub const THOUSAND: &str = "Authors";
pub const THOUSAND_VALUES: u64 = 1000;

/// The author number of global row `row` (splitmix64 of its position).
pub fn author(row: u64) -> u64 {
    let mut z = row.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) % THOUSAND_VALUES
}

pub fn author_value(n: u64) -> String {
    format!("author-{n:03}")
}

/// Sets the simulated properties on `entity` (global row `row`) that `select` asks for (all
/// of them without a select).
pub fn add(entity: &mut Entity, row: u64, select: Option<&[String]>) {
    let wanted = |name: &str| select.map_or(true, |s| s.iter().any(|p| p == name));
    if wanted(DISTINCT) {
        let id = format!("{}/{}", entity.partition_key, entity.row_key);
        entity.properties.insert(DISTINCT, json!(id));
    }
    if wanted(THOUSAND) {
        entity
            .properties
            .insert(THOUSAND, json!(author_value(author(row))));
    }
}

/// Whether `filter` has a condition on non-key properties.
pub fn has_where(filter: &Filter) -> bool {
    match filter {
        Filter::Where(_) => true,
        Filter::And(parts) | Filter::Or(parts) => parts.iter().any(has_where),
        Filter::Compare(..) => false,
    }
}
