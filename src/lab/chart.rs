//! The lab's SVG line charts: one palette, one plot [`Area`] with its scales, and the two layouts
//! the lab draws. Written by hand: a few fixed elements, where a plotting crate would bring a font
//! and raster stack the lab has no use for.
//!
//! - [`progress`]: one plot with grid lines and the legend on its right (`tablescan bench`: rows
//!   over time per variant, counts dashed);
//! - [`panels`]: plots stacked with tick labels and one legend below them (`tablescan simulate`:
//!   rows copied and instances over time per scenario).
//!
//! A series' colour is its position's in [`PALETTE`], so a scenario has one colour in every panel.

use std::fmt::Write;

/// Line colours in order of use (matplotlib's "tab10").
pub const PALETTE: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#7f7f7f", "#bcbd22",
];

/// The colour of the `i`th series.
pub fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// One line: its label, whether it is dashed, and its (x, y) points.
pub struct Series {
    pub label: String,
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

/// The largest x (`axis` 0) or y (`axis` 1) over every series' points, at least `floor`.
pub fn max_over(series: &[Series], axis: usize, floor: f64) -> f64 {
    series
        .iter()
        .flat_map(|s| {
            s.points
                .iter()
                .map(move |p| if axis == 0 { p.0 } else { p.1 })
        })
        .fold(floor, f64::max)
}

/// A plot rectangle and the largest values its axes show (both from 0).
struct Area {
    left: f64,
    top: f64,
    width: f64,
    height: f64,
    max_x: f64,
    max_y: f64,
}

impl Area {
    fn x(&self, v: f64) -> f64 {
        self.left + v / self.max_x * self.width
    }

    fn y(&self, v: f64) -> f64 {
        self.top + self.height - v / self.max_y * self.height
    }

    /// `series` as a polyline, with a `<title>` (the hover text) when given.
    fn polyline(&self, svg: &mut String, i: usize, stroke_width: &str, s: &Series, title: bool) {
        let points: Vec<String> = s
            .points
            .iter()
            .map(|(a, b)| format!("{:.1},{:.1}", self.x(*a), self.y(*b)))
            .collect();
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="{stroke_width}"{} points="{}""#,
            color(i),
            dash(s),
            points.join(" ")
        );
        let _ = match title {
            true => writeln!(svg, "><title>{}</title></polyline>", s.label),
            false => writeln!(svg, "/>"),
        };
    }
}

fn dash(s: &Series) -> &'static str {
    if s.dashed {
        r#" stroke-dasharray="6 4""#
    } else {
        ""
    }
}

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 480.0;
/// [`progress`]'s margins around the plot; the legend sits in the right one.
const LEFT: f64 = 80.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// One plot of `series` over x from 0 to their longest (at least 1) and y from 0 to `max_y`,
/// six labelled grid lines per axis, `x_title` under it and a legend on its right.
pub fn progress(title: &str, x_title: &str, max_y: f64, series: &[Series]) -> String {
    let area = Area {
        left: LEFT,
        top: TOP,
        width: WIDTH - LEFT - RIGHT,
        height: HEIGHT - TOP - BOTTOM,
        max_x: max_over(series, 0, 1.0),
        max_y,
    };
    let (w, h) = (WIDTH, HEIGHT);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="22" font-size="15">{title}</text>"#
    );
    grid(&area, &mut s, x_title);
    for (i, line) in series.iter().enumerate() {
        area.polyline(&mut s, i, "2", line, false);
        let ly = TOP + 10.0 + i as f64 * 20.0;
        let lx = LEFT + area.width + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{}" stroke-width="2"{}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 25.0,
            color(i),
            dash(line),
            lx + 30.0,
            ly + 4.0,
            line.label,
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Six grid lines with labels on each axis, the frame, and the x axis title.
fn grid(a: &Area, s: &mut String, x_title: &str) {
    let (left, top, pw, ph) = (a.left, a.top, a.width, a.height);
    for i in 0..=5 {
        let f = i as f64 / 5.0;
        let (gx, gy) = (a.x(f * a.max_x), a.y(f * a.max_y));
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{:.0}</text>"##,
            left + pw,
            left - 6.0,
            gy + 4.0,
            f * a.max_y
        );
        let _ = writeln!(
            s,
            r##"<line x1="{gx:.1}" y1="{top}" x2="{gx:.1}" y2="{:.1}" stroke="#eee"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle">{:.0}</text>"##,
            top + ph,
            top + ph + 16.0,
            f * a.max_x
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{x_title}</text>"##,
        left + pw / 2.0,
        HEIGHT - 10.0
    );
}

/// One of [`panels`]' plots: x in seconds (shown in minutes), y shown divided by `y_scale`.
pub struct Panel<'a> {
    pub title: &'a str,
    pub y_unit: &'a str,
    pub y_scale: f64,
    pub series: Vec<Series>,
}

/// `panels` stacked under `title`, each 260 high with x from 0 to its longest series (at least
/// a minute), and one legend below them with the first panel's labels.
pub fn panels(title: &str, panels: &[Panel]) -> String {
    let legend = panels.first().map_or(&[][..], |p| &p.series[..]);
    let legend_top = 60.0 + 320.0 * panels.len() as f64 - 10.0;
    let total = legend_top + 10.0 + 16.0 * legend.len() as f64;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="900" height="{total}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="20" y="24" font-size="16" font-weight="bold">{title}</text>"#
    );
    for (k, p) in panels.iter().enumerate() {
        panel(&mut svg, 60.0 + 320.0 * k as f64, p);
    }
    for (i, s) in legend.iter().enumerate() {
        let yy = legend_top + 16.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="70" y="{}" width="12" height="3" fill="{}"/><text x="88" y="{yy}" font-size="12">{}</text>"#,
            yy - 5.0,
            color(i),
            s.label
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// One panel at `top`: title, frame, five tick labels per axis, one line per series.
fn panel(svg: &mut String, top: f64, p: &Panel) {
    let a = Area {
        left: 70.0,
        top,
        width: 760.0,
        height: 260.0,
        max_x: max_over(&p.series, 0, 60.0),
        max_y: max_over(&p.series, 1, 1.0),
    };
    let (left, width, height) = (a.left, a.width, a.height);
    let _ = writeln!(
        svg,
        r#"<text x="{left}" y="{}" font-size="14" font-weight="bold">{}</text>"#,
        top - 8.0,
        p.title
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{left}" y="{top}" width="{width}" height="{height}" fill="none" stroke="#999"/>"##
    );
    for i in 0..=4 {
        let v = a.max_y * i as f64 / 4.0;
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="10" text-anchor="end">{:.1}{}</text>"#,
            left - 4.0,
            a.y(v) + 3.0,
            v / p.y_scale,
            p.y_unit
        );
        let m = a.max_x * i as f64 / 4.0;
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="10" text-anchor="middle">{:.1} min</text>"#,
            a.x(m),
            top + height + 14.0,
            m / 60.0
        );
    }
    for (i, s) in p.series.iter().enumerate() {
        a.polyline(svg, i, "1.5", s, true);
    }
}
