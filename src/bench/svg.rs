//! The SVG chart of rows over time: one line per variant, copies solid, counts dashed.

use std::fmt::Write;

use super::report::{BenchReport, VariantResult};

const COLORS: [&str; 5] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];
const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 480.0;
/// Margins around the plot area; the legend sits in the right one.
const LEFT: f64 = 80.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// A line chart of rows copied (solid) or counted (dashed) over time, one line per variant.
pub fn render_svg(report: &BenchReport) -> String {
    let plot = Plot::new(report);
    let (w, h, left) = (WIDTH, HEIGHT, LEFT);
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
    plot.grid(&mut s);
    for (i, v) in report.variants.iter().enumerate() {
        plot.variant_line(&mut s, i, v);
    }
    s.push_str("</svg>\n");
    s
}

/// The plot area and its scales: seconds on x (0 ..= the longest run, at least 1 s), rows on y.
struct Plot {
    width: f64,
    height: f64,
    max_t: f64,
    max_rows: f64,
}

impl Plot {
    fn new(report: &BenchReport) -> Plot {
        Plot {
            width: WIDTH - LEFT - RIGHT,
            height: HEIGHT - TOP - BOTTOM,
            max_t: report
                .variants
                .iter()
                .flat_map(|v| v.progress.iter().map(|p| p.0))
                .fold(1.0f64, f64::max),
            max_rows: report.rows.max(1) as f64,
        }
    }

    fn x(&self, t: f64) -> f64 {
        LEFT + t / self.max_t * self.width
    }

    fn y(&self, rows: f64) -> f64 {
        TOP + self.height - rows / self.max_rows * self.height
    }

    /// Six grid lines with labels on each axis, the frame, and the x axis title.
    fn grid(&self, s: &mut String) {
        let (left, top, pw, ph) = (LEFT, TOP, self.width, self.height);
        for i in 0..=5 {
            let f = i as f64 / 5.0;
            let (gx, gy) = (self.x(f * self.max_t), self.y(f * self.max_rows));
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{:.0}</text>"##,
                left + pw,
                left - 6.0,
                gy + 4.0,
                f * self.max_rows
            );
            let _ = writeln!(
                s,
                r##"<line x1="{gx:.1}" y1="{top}" x2="{gx:.1}" y2="{:.1}" stroke="#eee"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle">{:.0}</text>"##,
                top + ph,
                top + ph + 16.0,
                f * self.max_t
            );
        }
        let _ = writeln!(
            s,
            r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/><text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since POST /api/scans</text>"##,
            left + pw / 2.0,
            HEIGHT - 10.0
        );
    }

    /// Variant `i`'s progress line and its legend entry.
    fn variant_line(&self, s: &mut String, i: usize, v: &VariantResult) {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<String> = v
            .progress
            .iter()
            .map(|(t, r)| format!("{:.1},{:.1}", self.x(*t), self.y(*r as f64)))
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
        let ly = TOP + 10.0 + i as f64 * 20.0;
        let lx = LEFT + self.width + 15.0;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::tests::sample_report;

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
