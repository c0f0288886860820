//! Index builds in the simulator (issue 29): a build's storage requests by kind beside a count
//! scan of the same table, and the check that the built index has no false negatives.
//!
//! Invariants:
//! - **The oracle is the table's own data**: the rows holding a value come from the simulated
//!   properties' definitions (`rows_with`), never from an index. The index is read only
//!   by tablescan's real lookup API (`POST /api/lookups`, every page), as a client would.
//! - **The check does not count**: it runs after the run's figures were taken, so its
//!   requests are not in the build's.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::json;

use crate::storage::blob::BlobRequestCounts;
use crate::storage::request_counts::RequestCounts;

use super::api::call;
use super::cloud::Account;
use super::data::SyntheticTable;
use super::host::Execution;
use super::props;
use super::scenario::IndexDesign;

/// Most lookup calls one checked value may take (each reads up to 16 candidate ranges).
const MAX_LOOKUP_CALLS: usize = 100_000;

/// A run's storage requests by service and kind, every attempt (throttled ones too).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Breakdown {
    /// Tables and queues (`blob_*` are zero in them).
    pub tables_and_queues: RequestCounts,
    pub blobs: BlobRequestCounts,
    pub total: u64,
}

impl Breakdown {
    pub fn of(account: &Account) -> Self {
        let tables = account.table_counters.snapshot();
        let queues = account.queue_counters.snapshot();
        let blobs = account.blob_counters.snapshot();
        let sum = RequestCounts {
            query: tables.query,
            batch: tables.batch,
            point_read: tables.point_read,
            table_admin: tables.table_admin,
            queue_put: queues.queue_put,
            queue_get: queues.queue_get,
            queue_delete: queues.queue_delete,
            queue_update: queues.queue_update,
            queue_admin: queues.queue_admin,
        };
        Breakdown {
            tables_and_queues: sum,
            blobs,
            total: tables.table_total() + queues.queue_total() + blobs.total(),
        }
    }
}

/// An index build's or its comparison count's figures (simulated).
#[derive(Debug, Clone, Serialize)]
pub struct IndexFigures {
    /// `index` or `count`.
    pub driver: &'static str,
    /// The property indexed (index builds), or the one its build indexes (counts: the rows
    /// read carry it, priced as a keys-only read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub property: Option<String>,
    pub requests: Breakdown,
    /// The scan's status: `rowsWritten` of a build (rows indexed), `rowsMatched` of a count.
    pub rows: u64,
    /// Executions by function, and of those the ones that failed (their message ran again).
    pub executions: BTreeMap<&'static str, u64>,
    pub failed_executions: u64,
    /// This run's requests ÷ its count's (builds, when the count ran beside it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_to_count: Option<f64>,
    /// The lookups checked after a build.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lookups: Vec<LookupCheck>,
}

/// One value looked up after a build.
#[derive(Debug, Clone, Serialize)]
pub struct LookupCheck {
    pub value: String,
    /// Rows of the table holding the value (the oracle).
    pub expected_rows: usize,
    /// Of those, rows the lookup did not return (false negatives: must be 0).
    pub missing_rows: usize,
    /// Rows returned that do not hold the value (must be 0).
    pub wrong_rows: usize,
    pub calls: usize,
    /// `storageRequests` summed over the calls.
    pub storage_requests: u64,
}

impl IndexFigures {
    /// Whether every checked lookup returned exactly the value's rows (and `rows` is every row).
    pub fn verified(&self, total_rows: u64) -> bool {
        self.rows == total_rows
            && self
                .lookups
                .iter()
                .all(|l| l.missing_rows == 0 && l.wrong_rows == 0)
    }
}

impl IndexFigures {
    /// Counts `executions` by function.
    pub fn with_executions(mut self, executions: &[Execution]) -> Self {
        for e in executions {
            *self.executions.entry(e.function.name()).or_default() += 1;
            self.failed_executions += u64::from(!e.succeeded);
        }
        self
    }
}

/// The figures of a finished build or count (`requests` taken before this runs any request).
pub async fn figures(
    router: &axum::Router,
    requests: Breakdown,
    scan_id: &str,
    index: Option<&IndexDesign>,
    source: &SyntheticTable,
) -> Result<IndexFigures, String> {
    let (status, reply) = call(router, "GET", &format!("/api/scans/{scan_id}"), None).await?;
    if status != 200 {
        return Err(format!("the scan's status: {status} {reply}"));
    }
    let field = if index.is_some() {
        "rowsWritten"
    } else {
        "rowsMatched"
    };
    let mut figures = IndexFigures {
        driver: if index.is_some() { "index" } else { "count" },
        property: index.map(|i| i.property.clone()),
        requests,
        rows: reply[field].as_u64().unwrap_or(0),
        executions: BTreeMap::new(),
        failed_executions: 0,
        ratio_to_count: None,
        lookups: Vec::new(),
    };
    if let Some(design) = index {
        for value in sample_values(source, &design.property, design.check_values) {
            figures
                .lookups
                .push(check(router, design, source, &value).await?);
        }
    }
    Ok(figures)
}

/// `n` values of `property` taken from rows spread over the table, and one no row holds.
fn sample_values(source: &SyntheticTable, property: &str, n: usize) -> Vec<String> {
    let total = source.total_rows();
    let mut values: Vec<String> = (0..n as u64)
        .map(|k| {
            let row = (k * 2 + 1) * total / (2 * n as u64).max(1);
            let mut e = source.entity(row.min(total.saturating_sub(1)));
            props::add(&mut e, row, Some(&[property.to_string()]));
            e.properties
                .get(property)
                .and_then(|v| serde_json::from_str::<String>(v.get()).ok())
                .unwrap_or_default()
        })
        .collect();
    values.dedup();
    values.push("no-such-value".into());
    values
}

/// Looks `value` up through the API, every page, and compares the rows with the table's.
async fn check(
    router: &axum::Router,
    design: &IndexDesign,
    source: &SyntheticTable,
    value: &str,
) -> Result<LookupCheck, String> {
    let expected = rows_with(source, &design.property, value);
    let mut found = std::collections::HashSet::new();
    let mut result = LookupCheck {
        value: value.to_string(),
        expected_rows: expected.len(),
        missing_rows: 0,
        wrong_rows: 0,
        calls: 0,
        storage_requests: 0,
    };
    let mut token: Option<String> = None;
    loop {
        let mut body = json!({
            "sourceContainer": design.container, "sourcePrefix": design.prefix,
            "value": format!("'{}'", value.replace('\'', "''")),
        });
        if let Some(t) = &token {
            body["continuationToken"] = json!(t);
        }
        let (status, reply) = call(router, "POST", "/api/lookups", Some(&body)).await?;
        if status != 200 {
            return Err(format!("a lookup of {value:?}: {status} {reply}"));
        }
        result.calls += 1;
        result.storage_requests += reply["storageRequests"].as_u64().unwrap_or(0);
        for row in reply["rows"].as_array().into_iter().flatten() {
            let key = |k: &str| row[k].as_str().unwrap_or_default().to_string();
            if row[&design.property].as_str() != Some(value) {
                result.wrong_rows += 1;
            }
            found.insert((key("PartitionKey"), key("RowKey")));
        }
        token = reply["continuationToken"].as_str().map(str::to_string);
        if token.is_none() || result.calls >= MAX_LOOKUP_CALLS {
            break;
        }
    }
    result.missing_rows = expected.iter().filter(|k| !found.contains(*k)).count();
    Ok(result)
}

/// The keys of the rows of `table` whose `property` is the string `value`, in key order.
pub fn rows_with(table: &SyntheticTable, property: &str, value: &str) -> Vec<(String, String)> {
    let keys = |row: u64| {
        let e = table.entity(row);
        (e.partition_key, e.row_key)
    };
    match property {
        props::DISTINCT => value
            .rsplit_once('/')
            .and_then(|(pk, rk)| table.row_of(pk, rk))
            .map(keys)
            .into_iter()
            .collect(),
        props::THOUSAND => (0..table.total_rows())
            .filter(|&row| props::author_value(props::author(row)) == value)
            .map(keys)
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::simulate::props::{add, author, DISTINCT, THOUSAND};
    use crate::storage::Filter;
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
