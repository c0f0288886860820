//! The Markdown report of a simulation run: every scenario with the floor the storage account's
//! limits alone impose beside it, the goals of issue 15 checked against tablescan's rows, and
//! the Flex sensitivity rows against their baseline. Every figure is labelled SIMULATED.

use std::fmt::Write;

use crate::lab::chart::{self, Panel, Series};

use super::enqueue::EnqueueFigures;
use super::index::IndexFigures;
use super::model::Model;
use super::summary::ScenarioResult;

/// Issue 15's goals: (rows, plan, seconds at most).
const GOALS: [(u64, &str, f64); 4] = [
    (3_558_594, "consumption", 150.0),
    (35_000_000, "consumption", 600.0),
    (3_558_594, "flex", 60.0),
    (35_000_000, "flex", 300.0),
];

pub(super) fn minutes(seconds: f64) -> String {
    format!("{:.0}:{:02.0}", (seconds / 60.0).floor(), seconds % 60.0)
}

pub(super) fn rows(n: u64) -> String {
    if n >= 1_000_000 {
        format!("{:.2}M", n as f64 / 1e6)
    } else {
        n.to_string()
    }
}

fn peaks(r: &ScenarioResult) -> String {
    let by_function: Vec<String> = r
        .peak_instances
        .iter()
        .filter(|(k, _)| **k != "app")
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    if by_function.is_empty() {
        r.max_instances.to_string()
    } else {
        format!("{} ({})", r.max_instances, by_function.join(", "))
    }
}

pub(super) fn duration(r: &ScenarioResult) -> String {
    if r.completed {
        format!(
            "{} ({:.0} s)",
            minutes(r.duration_seconds),
            r.duration_seconds
        )
    } else {
        format!("did not finish ({:.0} s simulated)", r.duration_seconds)
    }
}

/// The whole report.
pub fn render(results: &[ScenarioResult], model: &Model, seed: u64) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# SIMULATED results of `tablescan simulate` (seed {seed})\n\n\
         Every figure below is SIMULATED by tablescan's cloud model (docs/simulator.md), not \
         measured on Azure. Storage limits of the model: {:.0} requests/s per account, {:.0} \
         entities/s per partition. The floor is what the storage account's limits alone allow \
         any copy of the same table: max(minimum requests ÷ account rate, largest partition ÷ \
         partition rate); \"at its requests\" is this run's own request count at the account \
         rate.\n",
        model.account_requests_per_sec, model.partition_entities_per_sec
    );
    goals(&mut md, results);
    enqueue_section(&mut md, results, model.queue_messages_per_sec);
    index_section(&mut md, results);
    all_rows(&mut md, results);
    sensitivity(&mut md, results);
    md
}

/// `scenario`'s legend: rows, variant, plan, what was varied, and how it ended.
fn label(r: &ScenarioResult) -> String {
    let rows = if r.rows >= 1_000_000 {
        format!("{:.1}M", r.rows as f64 / 1e6)
    } else {
        format!("{}", r.rows)
    };
    let end = if r.completed {
        format!("{:.1} min", r.duration_seconds / 60.0)
    } else {
        "did not finish".into()
    };
    let varied = r.label.as_ref().map_or(String::new(), |l| format!(", {l}"));
    let enqueue = r.enqueue.as_ref().map_or(String::new(), |e| {
        format!(" enqueue ({} rows a message)", e.rows_per_message)
    });
    format!(
        "{rows} {}{enqueue} on {}{varied} ({end})",
        r.variant, r.plan
    )
}

/// The SVG chart: rows copied over time (top) and instances over time (bottom), one line per
/// scenario, every figure labelled as simulated.
pub fn chart(results: &[ScenarioResult]) -> String {
    let line = |r: &ScenarioResult, points| Series {
        label: label(r),
        dashed: false,
        points,
    };
    let rows = results
        .iter()
        .map(|r| {
            let points = r.rows_over_time.iter().map(|(t, n)| (*t, *n as f64));
            line(r, points.collect())
        })
        .collect();
    let instances = results
        .iter()
        .map(|r| {
            // A step line that runs on to the end of the scenario.
            let mut points = Vec::new();
            let mut last = 0.0;
            for (t, n) in &r.instances_over_time {
                points.push((*t, last));
                points.push((*t, *n as f64));
                last = *n as f64;
            }
            points.push((r.duration_seconds, last));
            line(r, points)
        })
        .collect();
    let panels = [
        Panel {
            title: "Rows copied (simulated)",
            y_unit: "M",
            y_scale: 1e6,
            series: rows,
        },
        Panel {
            title: "Instances (simulated)",
            y_unit: "",
            y_scale: 1.0,
            series: instances,
        },
    ];
    chart::panels(
        "SIMULATED table copy on Azure Functions Consumption / Flex Consumption (model, not measurements)",
        &panels,
    )
}

/// Issue 15's goals against tablescan's unlabelled rows.
fn goals(md: &mut String, results: &[ScenarioResult]) {
    let rows_of = |n: u64, plan: &str| {
        results.iter().find(|r| {
            r.variant == "prefix"
                && r.enqueue.is_none()
                && r.label.is_none()
                && r.rows == n
                && r.plan == plan
        })
    };
    let mut lines = Vec::new();
    for (n, plan, limit) in GOALS {
        let Some(r) = rows_of(n, plan) else { continue };
        let time_met = r.completed && r.copy_verified && r.duration_seconds <= limit;
        let mut checks = vec![format!(
            "time ≤ {}: {}",
            minutes(limit),
            if time_met { "met" } else { "NOT met" }
        )];
        if plan == "flex" {
            let within = r.account_throttled_requests == 0
                && (r.peak_requests_per_second as f64) <= r.floor.account_requests_per_second;
            checks.push(format!(
                "within the account's request rate: {}",
                if within { "yes" } else { "NO" }
            ));
            if let Some(c) = rows_of(n, "consumption") {
                let cheaper = r.estimated_cost_usd <= c.estimated_cost_usd;
                checks.push(format!(
                    "cost ≤ Consumption's (${:.4}): {}",
                    c.estimated_cost_usd,
                    if cheaper { "met" } else { "NOT met" }
                ));
            }
        }
        lines.push(format!(
            "| {} | {plan} | {} | {:.0} s ({}) | {:.0} s | {} |",
            rows(n),
            duration(r),
            r.floor.seconds,
            r.floor.binding,
            r.floor.run_requests_seconds,
            checks.join("; ")
        ));
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Goals at tablescan's defaults (SIMULATED)\n\n\
         | rows | plan | duration | storage floor | floor at its requests | goals |\n|---|---|---|---|---|---|"
    );
    for l in lines {
        let _ = writeln!(md, "{l}");
    }
    let _ = writeln!(md);
}

/// Every scenario, its floor beside it.
fn all_rows(md: &mut String, results: &[ScenarioResult]) {
    let _ = writeln!(
        md,
        "## Every scenario (SIMULATED)\n\n\
         | rows | variant | plan | varied | duration | storage floor | floor at its requests | \
         requests (table req / 1k rows) | peak req/s | account-throttled | max instances | \
         executions | cost (compute + executions + storage) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in results {
        let c = &r.cost;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.0} s | {:.0} s | {} ({:.0}) | {} | {} | {} | {} | ${:.4} ({:.4} + {:.4} + {:.4}{}) |",
            rows(r.rows),
            r.variant,
            r.plan,
            r.label.as_deref().unwrap_or("—"),
            duration(r),
            r.floor.seconds,
            r.floor.run_requests_seconds,
            r.requests,
            r.storage_requests_per_1000_rows,
            r.peak_requests_per_second,
            r.account_throttled_requests,
            peaks(r),
            r.executions,
            c.total_usd,
            c.compute_usd,
            c.executions_usd,
            c.table_transactions_usd + c.queue_operations_usd,
            if c.always_ready_baseline_usd > 0.0 {
                format!(" + baseline {:.4}", c.always_ready_baseline_usd)
            } else {
                String::new()
            }
        );
    }
    let _ = writeln!(md);
}

/// Labelled (sensitivity) rows against the unlabelled row of the same size and plan.
fn sensitivity(md: &mut String, results: &[ScenarioResult]) {
    let varied: Vec<&ScenarioResult> = results.iter().filter(|r| r.label.is_some()).collect();
    if varied.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Sensitivity (SIMULATED): one Flex parameter varied at a time\n\n\
         | rows | varied | duration | vs. baseline | max instances | cost |\n|---|---|---|---|---|---|"
    );
    for r in varied {
        let base = results.iter().find(|b| {
            b.label.is_none() && b.rows == r.rows && b.plan == r.plan && b.variant == r.variant
        });
        let delta = match base {
            Some(b) if b.completed && r.completed => {
                format!("{:+.0} s", r.duration_seconds - b.duration_seconds)
            }
            _ => "—".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {delta} | {} | ${:.4} |",
            rows(r.rows),
            r.label.as_deref().unwrap_or(""),
            duration(r),
            peaks(r),
            r.estimated_cost_usd
        );
    }
    let _ = writeln!(md);
}

/// The enqueue scenarios' section of the report: each run beside the queue's floor and its
/// requests against the minimum.
fn enqueue_section(md: &mut String, results: &[ScenarioResult], queue_rate: f64) {
    let runs: Vec<(&ScenarioResult, &EnqueueFigures)> = results
        .iter()
        .filter_map(|r| Some((r, r.enqueue.as_ref()?)))
        .collect();
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Enqueue scans (SIMULATED)\n\n\
         One queue takes {:.0} messages/s; puts beyond it answer 503 and are retried. The queue \
         floor is the fewest messages at that rate; the minimum requests are one query per 1,000 \
         rows read plus one put per message (goal ≤ 1.10 ×).\n\n\
         | rows | plan | rows a message | duration | queue floor | messages (minimum) | \
         puts refused (503) | duplicate rows | requests admitted ÷ minimum | every attempt ÷ \
         minimum | every row on the queue |\n|---|---|---|---|---|---|---|---|---|---|---|",
        queue_rate
    );
    for (r, e) in runs {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.0} s | {} ({}) | {} | {} | {:.3} × | {:.3} × | {} |",
            rows(r.rows),
            r.plan,
            e.rows_per_message,
            duration(r),
            e.queue_floor_seconds,
            e.messages,
            e.minimum_messages,
            e.refused_puts,
            e.duplicate_rows,
            e.admitted_ratio_to_minimum,
            e.ratio_to_minimum,
            if r.copy_verified { "yes" } else { "NO" },
        );
    }
    let _ = writeln!(md);
}

/// The index builds and their counts: requests by kind, the build's ratio to the count (goal
/// ≤ 1.2 ×), and the lookups checked against the table's data.
fn index_section(md: &mut String, results: &[ScenarioResult]) {
    let runs: Vec<(&ScenarioResult, &IndexFigures)> = results
        .iter()
        .filter_map(|r| Some((r, r.index.as_ref()?)))
        .collect();
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Index builds beside a count of the same table (SIMULATED)\n\n\
         Every request, every attempt. Queries are the source's and the bookkeeping's; point \
         reads and batches are bookkeeping. The goal: a build within 1.2 × the requests of the \
         count.\n\n\
         | rows | plan | scan | duration | executions (failed) | requests (per 1,000 rows) | \
         ÷ count | queries | point reads, batches | queue puts, gets, deletes, updates | blob writes, reads, lists, admin | \
         lookups checked: rows (missing) | verified |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for (r, f) in runs {
        let (t, b) = (&f.requests.tables_and_queues, &f.requests.blobs);
        let scan = match &f.property {
            Some(p) if f.driver == "index" => format!("index of {p}"),
            _ => "count".to_string(),
        };
        let lookups: Vec<String> = f
            .lookups
            .iter()
            .map(|l| format!("{} ({})", l.expected_rows, l.missing_rows))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {scan} | {} | {} ({}) | {} ({:.2}) | {} | {} | {}, {} | {}, {}, {}, {} | {}, {}, {}, {} | {} | {} |",
            rows(r.rows),
            r.plan,
            duration(r),
            r.executions,
            f.failed_executions,
            f.requests.total,
            f.requests.total as f64 * 1000.0 / r.rows as f64,
            f.ratio_to_count.map_or("—".into(), |x| format!("{x:.3} ×")),
            t.query,
            t.point_read,
            t.batch,
            t.queue_put,
            t.queue_get,
            t.queue_delete,
            t.queue_update,
            b.write,
            b.read,
            b.list,
            b.admin,
            if lookups.is_empty() { "—".into() } else { lookups.join(", ") },
            if r.copy_verified { "yes" } else { "NO" },
        );
    }
    let _ = writeln!(md);
}
