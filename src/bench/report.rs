//! The run's figures and their text report: the tables and the goals the issue sets.

use std::collections::BTreeMap;

use serde::Serialize;

use super::requests::{per_1000, Minimum, Requests};

/// One variant's measured figures.
#[derive(Debug, Clone, Serialize)]
pub struct VariantResult {
    pub name: &'static str,
    pub wall_seconds: f64,
    pub rows_per_second: f64,
    /// All storage requests (handler and host, data, bookkeeping and queues) per 1,000 rows.
    pub requests_per_1000_rows: f64,
    pub requests_per_1000_rows_by_kind: BTreeMap<&'static str, f64>,
    pub minimum_requests_per_1000_rows: f64,
    /// Total requests ÷ minimum.
    pub ratio_to_minimum: f64,
    /// Data-table requests (source queries, destination batches, point reads) ÷ minimum.
    pub data_ratio_to_minimum: f64,
    /// Messages put on the queues per 1,000 rows.
    pub queue_messages_per_1000_rows: f64,
    /// Queue-triggered invocations the host made (its own count, retries and duplicates included).
    pub invocations: u64,
    pub invocations_by_function: BTreeMap<String, u64>,
    /// Work items committed (`messagesProcessed` in the scan status).
    pub messages_processed: i64,
    pub max_invocation_seconds: f64,
    pub handler_cpu_ms_per_1000_rows: Option<f64>,
    /// Handler CPU ÷ the storage requests the handler made: what one request costs it, which
    /// bounds the CPU per 1,000 rows from below at (requests per 1,000 rows) × this.
    pub handler_cpu_us_per_request: Option<f64>,
    pub handler_peak_rss_bytes: Option<u64>,
    pub rows: u64,
    pub requests: Requests,
    /// Copies: destination row count and checksum equal the source's; counts: the counted rows
    /// equal the source's row count. Figures are only reported for verified variants.
    pub verified: bool,
    /// (seconds since the POST, rows copied or counted) as sampled while running.
    pub progress: Vec<(f64, u64)>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub rows: u64,
    pub seed: u64,
    pub rows_per_key: f64,
    pub partition_keys: u64,
    pub instances: usize,
    pub minimum: Minimum,
    pub source_checksum: String,
    pub variants: Vec<VariantResult>,
}

/// The human-readable tables and the goals the issue sets.
pub fn render_table(report: &BenchReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let m = &report.minimum;
    let _ = writeln!(
        s,
        "\n{} rows, {} partition keys ({:.2} rows/key), seed {}, {} instance(s). Minimum: {} reads + {} batches \
         = {:.1} requests per 1,000 rows to copy, {:.1} to count.",
        report.rows,
        m.partition_keys,
        report.rows as f64 / m.partition_keys.max(1) as f64,
        report.seed,
        report.instances,
        m.reads,
        m.batches,
        per_1000(m.requests(true), report.rows),
        per_1000(m.requests(false), report.rows),
    );
    let _ = writeln!(
        s,
        "\n{:<15} {:>8} {:>8} {:>9} {:>8} {:>7} {:>6} {:>8} {:>7} {:>8} {:>9} {:>7} {:>8}",
        "variant",
        "wall s",
        "rows/s",
        "req/1k",
        "min/1k",
        "ratio",
        "data",
        "msgs/1k",
        "invoc",
        "max inv",
        "cpu ms/1k",
        "RSS MiB",
        "verified"
    );
    for v in &report.variants {
        let _ = writeln!(
            s,
            "{:<15} {:>8.1} {:>8.0} {:>9.1} {:>8.1} {:>7.3} {:>6.3} {:>8.1} {:>7} {:>7.2}s {:>9} {:>7} {:>8}",
            v.name,
            v.wall_seconds,
            v.rows_per_second,
            v.requests_per_1000_rows,
            v.minimum_requests_per_1000_rows,
            v.ratio_to_minimum,
            v.data_ratio_to_minimum,
            v.queue_messages_per_1000_rows,
            v.invocations,
            v.max_invocation_seconds,
            v.handler_cpu_ms_per_1000_rows
                .map(|c| format!("{c:.1}"))
                .unwrap_or_else(|| "n/a".into()),
            v.handler_peak_rss_bytes
                .map(|b| format!("{:.1}", b as f64 / 1048576.0))
                .unwrap_or_else(|| "n/a".into()),
            if v.verified { "yes" } else { "NO" }
        );
    }
    let _ = writeln!(
        s,
        "\nStorage requests per 1,000 rows by kind (query/batch/point = source and destination tables; \
         bk = bookkeeping: scans and work tables):"
    );
    let cols = [
        ("query", "query"),
        ("batch", "batch"),
        ("point_read", "point"),
        ("table_admin", "t.admin"),
        ("bookkeeping_point_read", "bk point"),
        ("bookkeeping_batch", "bk batch"),
        ("bookkeeping_query", "bk query"),
        ("queue_put", "q put"),
        ("queue_get", "q get"),
        ("queue_delete", "q del"),
        ("queue_update", "q upd"),
        ("queue_admin", "q admin"),
    ];
    let _ = write!(s, "{:<15}", "variant");
    for (_, label) in cols {
        let _ = write!(s, " {label:>8}");
    }
    let _ = writeln!(s);
    for v in &report.variants {
        let _ = write!(s, "{:<15}", v.name);
        for (key, _) in cols {
            let _ = write!(s, " {:>8.2}", v.requests_per_1000_rows_by_kind[key]);
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "\nratio = all requests (handler and host: data, bookkeeping, queues) / minimum; data = source \
         and destination requests only / minimum. invoc = queue-triggered invocations counted by the \
         host; max inv = longest single one. CPU and RSS are the handler processes' own accounting."
    );
    s.push_str(&goals(report));
    s
}

/// The goals, judged on the measured figures.
fn goals(report: &BenchReport) -> String {
    use std::fmt::Write;
    let mut s = String::from("\nGoals:\n");
    let find = |name: &str| report.variants.iter().find(|v| v.name == name);
    let mark = |ok: bool| if ok { "met   " } else { "MISSED" };
    if let Some(p) = find("prefix-copy") {
        let _ = writeln!(
            s,
            "  {} prefix-copy total requests ≤ 1.15 × minimum: {:.3} × (data tables alone: {:.3} ×)",
            mark(p.ratio_to_minimum <= 1.15),
            p.ratio_to_minimum,
            p.data_ratio_to_minimum
        );
        if let Some(r) = find("reference-copy") {
            let _ = writeln!(
                s,
                "  {} prefix-copy fewer requests than reference-copy: {:.1} vs {:.1} per 1,000 rows",
                mark(p.requests_per_1000_rows < r.requests_per_1000_rows),
                p.requests_per_1000_rows,
                r.requests_per_1000_rows
            );
        }
    }
    for v in report.variants.iter().filter(|v| v.name.ends_with("-copy")) {
        if let Some(cpu) = v.handler_cpu_ms_per_1000_rows {
            let _ = writeln!(
                s,
                "  {} {} handler CPU ≤ 5 ms per 1,000 rows: {cpu:.2} ms ({:.0} µs per request × {:.1} handler requests per 1,000 rows)",
                mark(cpu <= 5.0),
                v.name,
                v.handler_cpu_us_per_request.unwrap_or(f64::NAN),
                per_1000(v.requests.handler_made(), v.rows)
            );
        }
    }
    for v in &report.variants {
        if let Some(rss) = v.handler_peak_rss_bytes {
            let _ = writeln!(
                s,
                "  {} {} handler peak RSS ≤ 64 MiB: {:.1} MiB",
                mark(rss <= 64 * 1024 * 1024),
                v.name,
                rss as f64 / 1048576.0
            );
        }
    }
    let all = report.variants.iter().all(|v| v.verified);
    let _ = writeln!(
        s,
        "  {} every variant verified against the source ({} rows, checksum {})",
        mark(all),
        report.rows,
        report.source_checksum
    );
    s
}
