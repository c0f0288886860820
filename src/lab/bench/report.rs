//! The run's figures and their text report: the tables and the goals the issue sets.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::lab::chart::{self, Series};

use super::floor::{Floor, FloorJob};
use super::requests::{per_1000, Minimum, Requests};
use super::variant::Job;

/// One variant's measured figures.
#[derive(Debug, Clone, Serialize)]
pub struct VariantResult {
    pub name: &'static str,
    /// What the variant does with the rows (sets its minimum and its floor).
    #[serde(skip)]
    pub job: Job,
    pub wall_seconds: f64,
    pub rows_per_second: f64,
    /// Table and blob requests in flight on average from the POST to the scan's end, as the
    /// variant's proxy saw them (the third floor pass sends its batches this many at a time).
    pub mean_in_flight: f64,
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
    /// Lookups on the index an index build made, beside filtered full scans.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lookups: Option<super::lookups::LookupReport>,
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
    /// Each job's data requests sent by a bare client (see `floor`), before and after the
    /// variants.
    pub floors: Vec<Floor>,
    pub variants: Vec<VariantResult>,
}

impl BenchReport {
    /// The mean over passes 1 and 2 (eight batches at a time) of a job's floor: (CPU µs per
    /// request, CPU ms per 1,000 rows).
    pub fn floor_of(&self, job: FloorJob) -> Option<(f64, f64)> {
        let passes: Vec<(f64, f64)> = self
            .floors
            .iter()
            .filter(|f| f.job == job && f.pass <= 2)
            .filter_map(|f| f.cpu_us_per_request.zip(f.cpu_ms_per_1000_rows))
            .collect();
        let n = passes.len() as f64;
        (!passes.is_empty()).then(|| {
            let (a, b) = passes
                .iter()
                .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
            (a / n, b / n)
        })
    }

    /// A variant's handler CPU per storage request ÷ its job's floor's (mean of passes 1, 2).
    pub fn cpu_ratio_to_floor(&self, variant: &VariantResult) -> Option<f64> {
        let (floor, _) = self.floor_of(FloorJob::of(variant.job))?;
        Some(variant.handler_cpu_us_per_request? / floor)
    }

    /// A variant's third-pass floor: its job's batches as many at a time as it had requests in
    /// flight, measured right after it.
    pub fn matched_floor_of(&self, variant: &str) -> Option<&Floor> {
        self.floors
            .iter()
            .find(|f| f.pass == 3 && f.variant == Some(variant) && f.cpu_us_per_request.is_some())
    }
}

/// The human-readable tables and the goals the issue sets.
pub fn render_table(report: &BenchReport) -> String {
    let mut s = summary(report);
    s.push_str(&figures_table(report));
    s.push_str(&floor_line(report));
    s.push_str(&requests_by_kind_table(report));
    s.push_str(
        "\nratio = all requests (handler and host: data, bookkeeping, queues) / minimum; data = source \
         and destination requests only / minimum. invoc = queue-triggered invocations counted by the \
         host; max inv = longest single one. CPU and RSS are the handler processes' own accounting.\n",
    );
    for v in &report.variants {
        if let Some(lookups) = &v.lookups {
            s.push_str(&super::lookups::render(v.name, lookups, report.rows));
        }
    }
    s.push_str(&goals(report));
    s
}

/// The dataset and the minimum number of requests.
fn summary(report: &BenchReport) -> String {
    let m = &report.minimum;
    format!(
        "\n{} rows, {} partition keys ({:.2} rows/key), seed {}, {} instance(s). Minimum: {} reads + {} batches \
         = {:.1} requests per 1,000 rows to copy or delete, {:.1} to count, {:.1} to export \
         (+ a part per read and a manifest), {:.1} to import.\n",
        report.rows,
        m.partition_keys,
        report.rows as f64 / m.partition_keys.max(1) as f64,
        report.seed,
        report.instances,
        m.reads,
        m.batches,
        per_1000(m.requests(Job::Copy), report.rows),
        per_1000(m.requests(Job::Count), report.rows),
        per_1000(m.requests(Job::Export), report.rows),
        per_1000(m.requests(Job::Import), report.rows),
    )
}

/// One row of figures per variant.
fn figures_table(report: &BenchReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
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
    s
}

/// The floors' figures, beside the variants'.
fn floor_line(report: &BenchReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    if !report.floors.is_empty() {
        s.push_str(
            "floors (a bare client sending each job's data requests: no host, queues or bookkeeping; \
             pass 1 before the variants, 2 after them, 3 right after each variant, as many at a time as it had in flight):\n",
        );
    }
    for f in &report.floors {
        let _ = writeln!(s, "  {}", floor_row(f));
    }
    s
}

/// One floor's figures (also printed as each floor ends).
pub(super) fn floor_row(f: &Floor) -> String {
    format!(
            "{:<7} pass {}{} ({:>3} at a time, {:5.1} in flight): {:.1} requests per 1,000 rows, {} µs CPU per request, {} ms CPU per 1,000 rows, {:.1} s",
            f.job.name(),
            f.pass,
            f.variant.map(|v| format!(" for {v}")).unwrap_or_default(),
            f.in_flight,
            f.mean_in_flight,
            per_1000(f.requests, f.rows.max(1)),
            f.cpu_us_per_request
                .map(|c| format!("{c:.0}"))
                .unwrap_or_else(|| "n/a".into()),
            f.cpu_ms_per_1000_rows
                .map(|c| format!("{c:.1}"))
                .unwrap_or_else(|| "n/a".into()),
            f.wall_seconds
        )
}

/// Columns of the by-kind table: (key in `requests_per_1000_rows_by_kind`, header).
const BY_KIND_COLUMNS: [(&str, &str); 15] = [
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
    ("blob_write", "blob w"),
    ("blob_read", "blob r"),
    ("blob_list", "blob ls"),
];

/// Requests per 1,000 rows by kind, one row per variant.
fn requests_by_kind_table(report: &BenchReport) -> String {
    use std::fmt::Write;
    let mut s = String::from(
        "\nStorage requests per 1,000 rows by kind (query/batch/point = source and destination tables; \
         bk = bookkeeping: scans and work tables; blob = an export's parts and manifest):\n",
    );
    let _ = write!(s, "{:<15}", "variant");
    for (_, label) in BY_KIND_COLUMNS {
        let _ = write!(s, " {label:>8}");
    }
    let _ = writeln!(s);
    for v in &report.variants {
        let _ = write!(s, "{:<15}", v.name);
        for (key, _) in BY_KIND_COLUMNS {
            let _ = write!(s, " {:>8.2}", v.requests_per_1000_rows_by_kind[key]);
        }
        let _ = writeln!(s);
    }
    s
}

/// The CPU goal of one variant: judged against its job's floor sent as many at a time as the
/// handler had in flight (pass 3) when there is one, and shown against the eight-at-a-time
/// floor (passes 1 and 2) as well.
fn cpu_goal(report: &BenchReport, v: &VariantResult) -> String {
    let mark = |ok: bool| if ok { "met   " } else { "MISSED" };
    let job = FloorJob::of(v.job);
    let (Some((floor, floor_ms)), Some(ratio), Some(cpu)) = (
        report.floor_of(job),
        report.cpu_ratio_to_floor(v),
        v.handler_cpu_us_per_request,
    ) else {
        return String::new();
    };
    let handler = format!(
        "{:.1} handler requests per 1,000 rows, {:.1} in flight; per 1,000 rows {} ms",
        per_1000(v.requests.handler_made(), v.rows),
        v.mean_in_flight,
        v.handler_cpu_ms_per_1000_rows
            .map(|c| format!("{c:.1}"))
            .unwrap_or_else(|| "n/a".into()),
    );
    let at_a_time = report
        .floors
        .iter()
        .find(|f| f.job == job && f.pass == 1)
        .map_or(0, |f| f.in_flight);
    let eight =
        format!("{ratio:.2} × ({cpu:.0} µs vs {floor:.0} µs; per 1,000 rows {floor_ms:.1} ms)");
    match report.matched_floor_of(v.name) {
        Some(m) => {
            let matched = m.cpu_us_per_request.unwrap_or(f64::NAN);
            let r = cpu / matched;
            format!(
                "  {} {} handler CPU per storage request ≤ 1.5 × the {} floor's at the same concurrency: {r:.2} × ({cpu:.0} µs vs {matched:.0} µs, the floor {} at a time, {:.1} in flight; {handler}); against passes 1 and 2 ({at_a_time} at a time): {eight}\n",
                mark(r <= 1.5),
                v.name,
                job.name(),
                m.in_flight,
                m.mean_in_flight,
            )
        }
        None => format!(
            "  {} {} handler CPU per storage request ≤ 1.5 × the {} floor's: {eight} ({handler})\n",
            mark(ratio <= 1.5),
            v.name,
            job.name(),
        ),
    }
}

/// The issue's goals, judged on the measured figures.
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
    for (name, per_message) in [
        ("prefix-enqueue", super::variant::ENQUEUE_ROWS_PER_MESSAGE),
        ("prefix-enqueue-1", 1),
    ] {
        if let Some(e) = find(name) {
            let _ = writeln!(
                s,
                "  {} {name} total requests ≤ 1.10 × minimum (a query per 1,000 rows, a put per {per_message} rows): {:.3} ×",
                mark(e.ratio_to_minimum <= 1.10),
                e.ratio_to_minimum
            );
        }
    }
    if let (Some(x), Some(c)) = (find("prefix-index"), find("prefix-count")) {
        let r = x.requests_per_1000_rows / c.requests_per_1000_rows;
        let _ = writeln!(
            s,
            "  {} prefix-index build requests ≤ 1.2 × prefix-count's: {r:.3} × ({:.1} vs {:.1} per 1,000 rows)",
            mark(r <= 1.2),
            x.requests_per_1000_rows,
            c.requests_per_1000_rows
        );
    }
    for v in &report.variants {
        s.push_str(&cpu_goal(report, v));
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

/// The SVG chart: rows copied (solid) or counted (dashed) over time, one line per variant.
pub fn render_svg(report: &BenchReport) -> String {
    let series: Vec<Series> = report
        .variants
        .iter()
        .map(|v| Series {
            label: format!("{} ({:.0} s)", v.name, v.wall_seconds),
            dashed: v.name.ends_with("-count"),
            points: v.progress.iter().map(|(t, r)| (*t, *r as f64)).collect(),
        })
        .collect();
    let title = format!(
        "Rows copied (solid) or counted (dashed) over time — {} rows, {} instance(s)",
        report.rows, report.instances
    );
    let max_rows = report.rows.max(1) as f64;
    chart::progress(&title, "seconds since POST /api/scans", max_rows, &series)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn variant(name: &'static str, requests: Requests, rows: u64) -> VariantResult {
        VariantResult {
            name,
            job: if name.ends_with("count") {
                Job::Count
            } else {
                Job::Copy
            },
            wall_seconds: 12.5,
            rows_per_second: rows as f64 / 12.5,
            mean_in_flight: 20.4,
            requests_per_1000_rows: per_1000(requests.total, rows),
            requests_per_1000_rows_by_kind: requests.per_1000(rows),
            minimum_requests_per_1000_rows: 11.0,
            ratio_to_minimum: 1.1,
            data_ratio_to_minimum: 1.01,
            queue_messages_per_1000_rows: 2.0,
            invocations: 7,
            invocations_by_function: BTreeMap::from([("PrefixScan".to_string(), 7)]),
            messages_processed: 7,
            max_invocation_seconds: 0.25,
            handler_cpu_ms_per_1000_rows: Some(3.0),
            handler_cpu_us_per_request: Some(250.0),
            handler_peak_rss_bytes: Some(80 * 1024 * 1024),
            rows,
            requests,
            verified: true,
            progress: vec![(0.0, 0), (6.0, rows / 2), (12.5, rows)],
            lookups: None,
        }
    }

    /// Two variants over 2,000 rows: prefix-copy (meets the request goal, misses the RSS goal)
    /// and prefix-count (no CPU figure).
    pub(crate) fn sample_report() -> BenchReport {
        let copy = Requests {
            total: 22,
            query: 2,
            batch: 20,
            ..Requests::default()
        };
        let mut count = variant("prefix-count", Requests::default(), 2000);
        count.handler_cpu_ms_per_1000_rows = None;
        BenchReport {
            rows: 2000,
            seed: 1,
            rows_per_key: 3.0,
            partition_keys: 500,
            instances: 1,
            minimum: Minimum::of(std::iter::repeat(4).take(500)),
            source_checksum: "c0ffee".into(),
            floors: vec![
                Floor {
                    job: FloorJob::Copy,
                    pass: 1,
                    variant: None,
                    in_flight: 8,
                    mean_in_flight: 7.5,
                    rows: 2000,
                    requests: 502,
                    wall_seconds: 3.0,
                    cpu_us_per_request: Some(180.0),
                    cpu_ms_per_1000_rows: Some(45.2),
                },
                Floor {
                    job: FloorJob::Copy,
                    pass: 2,
                    variant: None,
                    in_flight: 8,
                    mean_in_flight: 7.5,
                    rows: 2000,
                    requests: 502,
                    wall_seconds: 3.5,
                    cpu_us_per_request: Some(220.0),
                    cpu_ms_per_1000_rows: Some(55.2),
                },
                Floor {
                    job: FloorJob::Copy,
                    pass: 3,
                    variant: Some("prefix-copy"),
                    in_flight: 21,
                    mean_in_flight: 19.6,
                    rows: 2000,
                    requests: 502,
                    wall_seconds: 3.4,
                    cpu_us_per_request: Some(125.0),
                    cpu_ms_per_1000_rows: Some(31.4),
                },
            ],
            variants: vec![variant("prefix-copy", copy, 2000), count],
        }
    }

    #[test]
    fn table_shows_every_variant_and_judges_the_goals() {
        let text = render_table(&sample_report());
        assert!(
            text.contains("2000 rows, 500 partition keys (4.00 rows/key), seed 1, 1 instance(s). Minimum: 2 reads + 500 batches"),
            "{text}"
        );
        let row = text.lines().find(|l| l.starts_with("prefix-copy")).unwrap();
        assert!(
            row.contains("    12.5      160") && row.ends_with("yes"),
            "{row}"
        );
        let by_kind = text
            .lines()
            .filter(|l| l.starts_with("prefix-copy"))
            .nth(1)
            .unwrap();
        assert!(by_kind.contains("    1.00    10.00"), "{by_kind}");
        assert!(
            text.contains("met    prefix-copy total requests ≤ 1.15 × minimum: 1.100 ×"),
            "{text}"
        );
        assert!(
            text.contains("MISSED prefix-copy handler CPU per storage request ≤ 1.5 × the copy floor's at the same concurrency: 2.00 × (250 µs vs 125 µs, the floor 21 at a time, 19.6 in flight; 11.0 handler requests per 1,000 rows, 20.4 in flight; per 1,000 rows 3.0 ms); against passes 1 and 2 (8 at a time): 1.25 × (250 µs vs 200 µs; per 1,000 rows 50.2 ms)"),
            "{text}"
        );
        assert!(
            text.contains("  copy    pass 2 (  8 at a time,   7.5 in flight): 251.0 requests per 1,000 rows, 220 µs CPU per request, 55.2 ms CPU per 1,000 rows, 3.5 s"),
            "{text}"
        );
        assert!(
            text.contains("MISSED prefix-count handler peak RSS ≤ 64 MiB: 80.0 MiB"),
            "{text}"
        );
        assert!(
            text.contains(
                "met    every variant verified against the source (2000 rows, checksum c0ffee)"
            ),
            "{text}"
        );
    }

    #[test]
    fn one_line_per_variant_counts_dashed() {
        let svg = render_svg(&sample_report());
        assert!(
            svg.starts_with("<svg ") && svg.ends_with("</svg>\n"),
            "{svg}"
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(
            svg.matches(r#"stroke-dasharray="6 4""#).count(),
            2,
            "count line and its legend"
        );
        // The last point of each line is at the right edge (12.5 s) and the top (all rows).
        assert!(svg.contains("660.0,40.0\"/>"), "{svg}");
        assert!(svg.contains(">prefix-copy (12 s)</text>"), "{svg}");
    }
}
