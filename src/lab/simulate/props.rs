//! The simulated tables' properties (index and count scenarios only), computed from a row's
//! keys and position, so 35 million rows carry them without storing them:
//!
//! - [`DISTINCT`] (`Id`): `<PartitionKey>/<RowKey>`, a different value on every row (like a
//!   package id with its version);
//! - [`THOUSAND`] (`Authors`): one of [`THOUSAND_VALUES`] values, `author-NNN`, drawn per row by
//!   a fixed hash of its position (so every key range holds hundreds of them).
//!
//! [`rows_with`] is the oracle of a lookup: the rows holding a value, found from these
//! definitions and the table's keys, never from an index.

use serde_json::json;

use crate::storage::{Entity, Filter};

use super::data::SyntheticTable;

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

/// The keys of the rows of `table` whose `property` is the string `value`, in key order.
pub fn rows_with(table: &SyntheticTable, property: &str, value: &str) -> Vec<(String, String)> {
    let keys = |row: u64| {
        let e = table.entity(row);
        (e.partition_key, e.row_key)
    };
    match property {
        DISTINCT => value
            .rsplit_once('/')
            .and_then(|(pk, rk)| table.row_of(pk, rk))
            .map(keys)
            .into_iter()
            .collect(),
        THOUSAND => (0..table.total_rows())
            .filter(|&row| author_value(author(row)) == value)
            .map(keys)
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{odata, Query};

    /// A query with a condition on a simulated property returns exactly the oracle's rows.
    #[test]
    fn a_property_condition_returns_the_oracles_rows() {
        let table = super::super::data::nuget_like(3_000, 14.0, 3).with_properties();
        for (property, row) in [(THOUSAND, 17u64), (DISTINCT, 2_500)] {
            let mut e = table.entity(row);
            add(&mut e, row, None);
            let value: String =
                serde_json::from_str(e.properties.get(property).unwrap().get()).unwrap();
            let expected = rows_with(&table, property, &value);
            assert!(expected.contains(&(e.partition_key.clone(), e.row_key.clone())));
            let expr = odata::parse(&format!("{property} eq '{value}'")).unwrap();
            let mut found = Vec::new();
            let mut query = Query {
                filter: Some(Filter::Where(expr)),
                ..Query::default()
            };
            loop {
                let page = table.query(&query).unwrap();
                found.extend(
                    page.entities
                        .into_iter()
                        .map(|e| (e.partition_key, e.row_key)),
                );
                match page.continuation {
                    Some(c) => query.continuation = Some(c),
                    None => break,
                }
            }
            assert_eq!(found, expected, "{property} = {value}");
        }
        assert_eq!(author(5), author(5));
        assert!(rows_with(&table, DISTINCT, "nothing/00.0.0").is_empty());
    }
}
