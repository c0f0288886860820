//! The SVG chart of rows over time.

use super::report::BenchReport;

/// A line chart of rows copied (solid) or counted (dashed) over time, one line per variant.
pub fn render_svg(report: &BenchReport) -> String {
    use std::fmt::Write;
    const COLORS: [&str; 5] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];
    let (w, h) = (860.0, 480.0);
    let (left, right, top, bottom) = (80.0, 200.0, 40.0, 50.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let max_t = report
        .variants
        .iter()
        .flat_map(|v| v.progress.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let max_rows = report.rows.max(1) as f64;
    let x = |t: f64| left + t / max_t * pw;
    let y = |r: f64| top + ph - r / max_rows * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="22" font-size="15">Rows copied (solid) or counted (dashed) over time — {} rows, {} instance(s)</text>"#,
        report.rows, report.instances
    );
    for i in 0..=5 {
        let f = i as f64 / 5.0;
        let (gx, gy) = (x(f * max_t), y(f * max_rows));
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{:.0}</text>"##,
            left + pw,
            left - 6.0,
            gy + 4.0,
            f * max_rows
        );
        let _ = writeln!(
            s,
            r##"<line x1="{gx:.1}" y1="{top}" x2="{gx:.1}" y2="{:.1}" stroke="#eee"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle">{:.0}</text>"##,
            top + ph,
            top + ph + 16.0,
            f * max_t
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/><text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since POST /api/scans</text>"##,
        left + pw / 2.0,
        h - 10.0
    );
    for (i, v) in report.variants.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<String> = v
            .progress
            .iter()
            .map(|(t, r)| format!("{:.1},{:.1}", x(*t), y(*r as f64)))
            .collect();
        let dash = if v.name.ends_with("-count") {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
            points.join(" ")
        );
        let ly = top + 10.0 + i as f64 * 20.0;
        let lx = left + pw + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{} ({:.0} s)</text>"#,
            lx + 25.0,
            lx + 30.0,
            ly + 4.0,
            v.name,
            v.wall_seconds
        );
    }
    s.push_str("</svg>\n");
    s
}
