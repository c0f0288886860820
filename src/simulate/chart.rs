//! A dependency-free SVG chart: rows copied over time (top) and instances over time (bottom),
//! one line per scenario, every figure labelled as simulated.

use std::fmt::Write;

use super::ScenarioResult;

/// One line: its label, colour and (x seconds, y) points.
type Series<'a> = (String, &'a str, Vec<(f64, f64)>);

const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#7f7f7f", "#bcbd22",
];

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
    format!("{rows} {} on {}{varied} ({end})", r.variant, r.plan)
}

/// One panel: lines of (x seconds, y) per scenario.
fn panel(svg: &mut String, top: f64, title: &str, y_unit: &str, y_scale: f64, series: &[Series]) {
    let (left, width, height) = (70.0, 760.0, 260.0);
    let max_x = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.0))
        .fold(60.0f64, f64::max);
    let max_y = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.1))
        .fold(1.0f64, f64::max);
    let x = |v: f64| left + v / max_x * width;
    let y = |v: f64| top + height - v / max_y * height;
    let _ = writeln!(
        svg,
        r#"<text x="{left}" y="{}" font-size="14" font-weight="bold">{title}</text>"#,
        top - 8.0
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{left}" y="{top}" width="{width}" height="{height}" fill="none" stroke="#999"/>"##
    );
    for i in 0..=4 {
        let v = max_y * i as f64 / 4.0;
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="10" text-anchor="end">{:.1}{y_unit}</text>"#,
            left - 4.0,
            y(v) + 3.0,
            v / y_scale
        );
        let m = max_x * i as f64 / 4.0;
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="10" text-anchor="middle">{:.1} min</text>"#,
            x(m),
            top + height + 14.0,
            m / 60.0
        );
    }
    for (name, color, points) in series {
        let path: Vec<String> = points
            .iter()
            .map(|(a, b)| format!("{:.1},{:.1}", x(*a), y(*b)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"><title>{name}</title></polyline>"#,
            path.join(" ")
        );
    }
}

/// The whole chart.
pub fn render(results: &[ScenarioResult]) -> String {
    let mut svg = String::new();
    let legend_height = 16.0 * results.len() as f64;
    let total = 700.0 + legend_height;
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="900" height="{total}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="20" y="24" font-size="16" font-weight="bold">SIMULATED table copy on Azure Functions Consumption / Flex Consumption (model, not measurements)</text>"#
    );
    let rows: Vec<Series> = results
        .iter()
        .enumerate()
        .map(|(i, r)| {
            (
                label(r),
                COLORS[i % COLORS.len()],
                r.rows_over_time
                    .iter()
                    .map(|(t, n)| (*t, *n as f64))
                    .collect(),
            )
        })
        .collect();
    panel(&mut svg, 60.0, "Rows copied (simulated)", "M", 1e6, &rows);
    let instances: Vec<Series> = results
        .iter()
        .enumerate()
        .map(|(i, r)| {
            // A step line that runs on to the end of the scenario.
            let mut points = Vec::new();
            let mut last = 0.0;
            for (t, n) in &r.instances_over_time {
                points.push((*t, last));
                points.push((*t, *n as f64));
                last = *n as f64;
            }
            points.push((r.duration_seconds, last));
            (label(r), COLORS[i % COLORS.len()], points)
        })
        .collect();
    panel(
        &mut svg,
        380.0,
        "Instances (simulated)",
        "",
        1.0,
        &instances,
    );
    for (i, r) in results.iter().enumerate() {
        let yy = 690.0 + 16.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="70" y="{}" width="12" height="3" fill="{}"/><text x="88" y="{yy}" font-size="12">{}</text>"#,
            yy - 5.0,
            COLORS[i % COLORS.len()],
            label(r)
        );
    }
    svg.push_str("</svg>\n");
    svg
}
