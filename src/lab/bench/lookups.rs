//! Lookups on the index `prefix-index` built (issue 29): values present in the table and values
//! absent from it, each looked up through `POST /api/lookups` (every page of it) and found by a
//! filtered full scan of the same table (one client following the continuations of
//! `$filter=<property> eq <value>`), side by side: storage requests per lookup and latency.
//!
//! Invariant: figures are only reported when every lookup returned exactly the rows the
//! filtered full scan of the same value found (by keys), and none for an absent value.

use std::collections::BTreeSet;
use std::time::Instant;

use serde::Serialize;
use serde_json::{json, Value};

use crate::storage::azure_table::AzureTableStore;
use crate::storage::{odata, Filter, Query, TableStore, MAX_TAKE};

use super::variant::INDEXED_PROPERTY;

/// Values of each kind looked up: present ones taken from the table's first page, absent ones
/// that no generated row holds (the generator's `Authors` are `author0` … `author996`).
pub const SAMPLES: usize = 16;
/// Pages one lookup may take before the bench gives up on it.
const MAX_PAGES: usize = 1000;

/// Latency and requests of one kind of lookup over its samples.
#[derive(Debug, Clone, Serialize)]
pub struct LookupStats {
    pub samples: usize,
    pub requests_per_lookup: f64,
    pub rows_per_lookup: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// The lookups measured on one built index.
#[derive(Debug, Clone, Serialize)]
pub struct LookupReport {
    /// Key ranges of the index.
    pub ranges: u64,
    /// Through the index: calls of `POST /api/lookups` (all pages), requests as each answer's
    /// `storageRequests` sums them (blob reads and table queries).
    pub index_present: LookupStats,
    pub index_absent: LookupStats,
    /// One client's filtered query of the whole table, following its continuations.
    pub scan_present: LookupStats,
    pub scan_absent: LookupStats,
}

/// One lookup or scan: its requests, its rows' keys, its wall time.
struct Sample {
    requests: u64,
    keys: BTreeSet<(String, String)>,
    ms: f64,
}

/// Where the index is and what it indexes.
pub struct Target<'a> {
    /// The local host's base URL (`http://…`).
    pub base: &'a str,
    pub container: &'a str,
    pub prefix: &'a str,
    pub source: &'a str,
}

/// Looks up [`SAMPLES`] present and [`SAMPLES`] absent values both ways and checks they agree.
pub async fn measure(store: &AzureTableStore, target: &Target<'_>) -> Result<LookupReport, String> {
    let client = reqwest::Client::new();
    let present = present_values(store, target.source).await?;
    let absent: Vec<String> = (0..SAMPLES).map(|i| format!("nobody{i}")).collect();
    let mut ranges = 0;
    let mut kinds = Vec::new();
    for values in [&present, &absent] {
        let (mut index, mut scan) = (Vec::new(), Vec::new());
        for value in values {
            let (found, answer) = lookup(&client, target, value).await?;
            let full = full_scan(store, target.source, value).await?;
            if found.keys != full.keys {
                return Err(format!(
                    "lookup of {value:?}: {} rows, the filtered full scan found {}",
                    found.keys.len(),
                    full.keys.len()
                ));
            }
            ranges = answer["ranges"].as_u64().unwrap_or(0);
            index.push(found);
            scan.push(full);
        }
        kinds.push((stats(&index), stats(&scan)));
    }
    if kinds[0].0.rows_per_lookup == 0.0 {
        return Err("no lookup of a present value found a row".into());
    }
    let [(index_present, scan_present), (index_absent, scan_absent)] =
        <[_; 2]>::try_from(kinds).expect("two kinds");
    Ok(LookupReport {
        ranges,
        index_present,
        index_absent,
        scan_present,
        scan_absent,
    })
}

/// Up to [`SAMPLES`] distinct values of the indexed property, from the table's first page.
async fn present_values(store: &AzureTableStore, table: &str) -> Result<Vec<String>, String> {
    let query = Query {
        select: Some(vec![INDEXED_PROPERTY.to_string()]),
        top: Some(MAX_TAKE),
        ..Query::default()
    };
    let page = store
        .query_page(table, &query)
        .await
        .map_err(|e| format!("reading values of {table}: {e}"))?;
    let mut values = BTreeSet::new();
    for row in &page.entities {
        if let Some(Ok(v)) = row
            .properties
            .get(INDEXED_PROPERTY)
            .map(|v| serde_json::from_str::<String>(v.get()))
        {
            values.insert(v);
        }
    }
    Ok(values.into_iter().take(SAMPLES).collect())
}

/// Every page of `POST /api/lookups` for the string `value`; the first answer too.
async fn lookup(
    client: &reqwest::Client,
    target: &Target<'_>,
    value: &str,
) -> Result<(Sample, Value), String> {
    let literal = format!("'{}'", value.replace('\'', "''"));
    let started = Instant::now();
    let mut body = json!({"sourceContainer": target.container,
        "sourcePrefix": target.prefix, "value": literal});
    let (mut requests, mut keys, mut first) = (0u64, BTreeSet::new(), None);
    for _ in 0..MAX_PAGES {
        let response = client
            .post(format!("{}/api/lookups", target.base))
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("POST /api/lookups: {e}"))?;
        let status = response.status();
        let answer: Value = response
            .json()
            .await
            .map_err(|e| format!("POST /api/lookups reply: {e}"))?;
        if !status.is_success() {
            return Err(format!("POST /api/lookups {literal}: {status} {answer}"));
        }
        requests += answer["storageRequests"].as_u64().unwrap_or(0);
        for row in answer["rows"].as_array().into_iter().flatten() {
            let key = |k: &str| row[k].as_str().unwrap_or_default().to_string();
            keys.insert((key("PartitionKey"), key("RowKey")));
        }
        let token = answer["continuationToken"].clone();
        first.get_or_insert(answer);
        match token {
            Value::String(_) => body["continuationToken"] = token,
            _ => {
                let ms = started.elapsed().as_secs_f64() * 1000.0;
                let sample = Sample { requests, keys, ms };
                return Ok((sample, first.unwrap_or_default()));
            }
        }
    }
    Err(format!(
        "the lookup of {literal} took over {MAX_PAGES} pages"
    ))
}

/// One client's `$filter=<property> eq '<value>'` over the whole table, every page.
async fn full_scan(store: &AzureTableStore, table: &str, value: &str) -> Result<Sample, String> {
    let text = format!("{INDEXED_PROPERTY} eq '{}'", value.replace('\'', "''"));
    let expr = odata::parse(&text).map_err(|e| format!("{text}: {e}"))?;
    let started = Instant::now();
    let mut query = Query {
        filter: Some(Filter::Where(expr)),
        top: Some(MAX_TAKE),
        ..Query::default()
    };
    let (mut requests, mut keys) = (0u64, BTreeSet::new());
    // Bounded by the table: a page per 1,000 rows at the most, whatever the service does.
    for _ in 0..MAX_PAGES * 100 {
        let page = store
            .query_page(table, &query)
            .await
            .map_err(|e| format!("the filtered full scan of {table}: {e}"))?;
        requests += 1;
        keys.extend(
            page.entities
                .into_iter()
                .map(|e| (e.partition_key, e.row_key)),
        );
        match page.continuation {
            Some(next) => query.continuation = Some(next),
            None => {
                let ms = started.elapsed().as_secs_f64() * 1000.0;
                return Ok(Sample { requests, keys, ms });
            }
        }
    }
    Err(format!("the filtered full scan of {table} did not end"))
}

fn stats(samples: &[Sample]) -> LookupStats {
    let n = samples.len().max(1) as f64;
    let mut ms: Vec<f64> = samples.iter().map(|s| s.ms).collect();
    ms.sort_by(f64::total_cmp);
    LookupStats {
        samples: samples.len(),
        requests_per_lookup: samples.iter().map(|s| s.requests).sum::<u64>() as f64 / n,
        rows_per_lookup: samples.iter().map(|s| s.keys.len()).sum::<usize>() as f64 / n,
        p50_ms: percentile(&ms, 0.50),
        p99_ms: percentile(&ms, 0.99),
    }
}

/// The nearest-rank percentile of sorted `values` (0 for none).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The lookup lines of the report.
pub fn render(name: &str, r: &LookupReport, rows: u64) -> String {
    use std::fmt::Write;
    let mut s = format!(
        "\nLookups on {name}'s index ({} ranges; {SAMPLES} values of each kind; Azurite):\n",
        r.ranges
    );
    let _ = writeln!(
        s,
        "{:<36}{:>16}{:>12}{:>10}{:>10}",
        "how", "requests/lookup", "rows/lookup", "p50 ms", "p99 ms"
    );
    for (how, x) in [
        ("index, present value", &r.index_present),
        ("filtered full scan, present value", &r.scan_present),
        ("index, absent value", &r.index_absent),
        ("filtered full scan, absent value", &r.scan_absent),
    ] {
        let _ = writeln!(
            s,
            "{how:<36}{:>16.1}{:>12.1}{:>10.1}{:>10.1}",
            x.requests_per_lookup, x.rows_per_lookup, x.p50_ms, x.p99_ms
        );
    }
    let azure = rows.div_ceil(u64::from(MAX_TAKE)) as f64;
    let _ = writeln!(
        s,
        "requests, index ÷ filtered full scan, as measured here: present {:.2} ×, absent {:.2} ×; \
         ÷ a full scan on Azure (a query per 1,000 rows, {azure:.0} here; computed): present {:.2} ×, absent {:.2} ×",
        r.index_present.requests_per_lookup / r.scan_present.requests_per_lookup.max(1.0),
        r.index_absent.requests_per_lookup / r.scan_absent.requests_per_lookup.max(1.0),
        r.index_present.requests_per_lookup / azure,
        r.index_absent.requests_per_lookup / azure,
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=16).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 8.0);
        assert_eq!(percentile(&v, 0.99), 16.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
    }
}
