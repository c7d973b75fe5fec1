//! Small hand-written SVG charts for the reports: AU against accelerator count, and the
//! data-wait time of every step over a run.

use std::fmt::Write;

/// A line chart with one series and an optional horizontal reference line.
#[derive(Debug, Clone)]
pub struct LineChart {
    /// Title above the plot.
    pub title: String,
    /// Label under the x axis.
    pub x_label: String,
    /// Label beside the y axis.
    pub y_label: String,
    /// The points, in x order.
    pub points: Vec<(f64, f64)>,
    /// A horizontal line (value, label), such as the pass threshold.
    pub reference: Option<(f64, String)>,
    /// Draw a marker at each point.
    pub markers: bool,
    /// Start the y axis at zero.
    pub y_from_zero: bool,
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 55.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" tick step giving about `target` ticks over `span`.
fn tick_step(span: f64, target: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / target;
    let magnitude = 10f64.powf(raw.log10().floor());
    let normalized = raw / magnitude;
    let nice = if normalized < 1.5 {
        1.0
    } else if normalized < 3.0 {
        2.0
    } else if normalized < 7.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

fn format_tick(value: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{value:.0}")
    } else {
        let decimals = (-step.log10().floor()) as usize;
        format!("{value:.decimals$}")
    }
}

impl LineChart {
    /// Renders the chart as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let finite: Vec<(f64, f64)> = self
            .points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        let (mut x_min, mut x_max) = finite
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), (x, _)| {
                (a.min(*x), b.max(*x))
            });
        let (mut y_min, mut y_max) = finite
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), (_, y)| {
                (a.min(*y), b.max(*y))
            });
        if let Some((r, _)) = &self.reference {
            y_min = y_min.min(*r);
            y_max = y_max.max(*r);
        }
        if !x_min.is_finite() {
            (x_min, x_max) = (0.0, 1.0);
        }
        if !y_min.is_finite() {
            (y_min, y_max) = (0.0, 1.0);
        }
        if self.y_from_zero {
            y_min = y_min.min(0.0);
        }
        if x_max <= x_min {
            x_max = x_min + 1.0;
        }
        if y_max <= y_min {
            y_max = y_min + 1.0;
        }
        y_max += (y_max - y_min) * 0.05;
        let plot_w = WIDTH - LEFT - RIGHT;
        let plot_h = HEIGHT - TOP - BOTTOM;
        let sx = |x: f64| LEFT + (x - x_min) / (x_max - x_min) * plot_w;
        let sy = |y: f64| TOP + plot_h - (y - y_min) / (y_max - y_min) * plot_h;

        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
            WIDTH / 2.0,
            escape(&self.title)
        );
        let y_step = tick_step(y_max - y_min, 6.0);
        let mut y = (y_min / y_step).ceil() * y_step;
        while y <= y_max + 1e-9 {
            let py = sy(y);
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + plot_w,
                LEFT - 6.0,
                py + 4.0,
                format_tick(y, y_step)
            );
            y += y_step;
        }
        let x_step = tick_step(x_max - x_min, 8.0);
        let mut x = (x_min / x_step).ceil() * x_step;
        while x <= x_max + 1e-9 {
            let px = sx(x);
            let _ = writeln!(
                svg,
                r#"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="black"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                TOP + plot_h,
                TOP + plot_h + 5.0,
                TOP + plot_h + 18.0,
                format_tick(x, x_step)
            );
            x += x_step;
        }
        let _ = writeln!(
            svg,
            r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>"#
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + plot_w / 2.0,
            HEIGHT - 12.0,
            escape(&self.x_label)
        );
        let _ = writeln!(
            svg,
            r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">{}</text>"#,
            TOP + plot_h / 2.0,
            TOP + plot_h / 2.0,
            escape(&self.y_label)
        );
        if let Some((value, label)) = &self.reference {
            let py = sy(*value);
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#d62728" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#d62728">{}</text>"##,
                LEFT + plot_w,
                LEFT + plot_w - 4.0,
                py - 5.0,
                escape(label)
            );
        }
        if !finite.is_empty() {
            let path: Vec<String> = finite
                .iter()
                .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
                .collect();
            let _ = writeln!(
                svg,
                r##"<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{}"/>"##,
                path.join(" ")
            );
            if self.markers {
                for (x, y) in &finite {
                    let _ = writeln!(
                        svg,
                        r##"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="#1f77b4"/>"##,
                        sx(*x),
                        sy(*y)
                    );
                }
            }
        }
        svg.push_str("</svg>\n");
        svg
    }
}

/// AU (percent) against the number of accelerators, with the pass threshold.
pub fn au_chart(title: &str, points: &[(usize, f64)], threshold_percent: f64) -> LineChart {
    // Where a count ran more than once (a search run, then its confirmation), the later
    // run is the one drawn: reverse, sort stably, keep the first of each count.
    let mut points: Vec<(f64, f64)> = points.iter().rev().map(|&(n, au)| (n as f64, au)).collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points.dedup_by(|a, b| a.0 == b.0);
    LineChart {
        title: title.to_string(),
        x_label: "emulated accelerators".into(),
        y_label: "AU (%)".into(),
        points,
        reference: Some((threshold_percent, format!("pass {threshold_percent:.0} %"))),
        markers: true,
        y_from_zero: true,
    }
}

/// The data-wait time of each step over a run.
pub fn wait_chart(title: &str, wait_ms: &[f64]) -> LineChart {
    LineChart {
        title: title.to_string(),
        x_label: "step (all epochs)".into(),
        y_label: "data wait per step (ms, mean over accelerators)".into(),
        points: wait_ms
            .iter()
            .enumerate()
            .map(|(i, &w)| ((i + 1) as f64, w))
            .collect(),
        reference: None,
        markers: wait_ms.len() <= 60,
        y_from_zero: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_every_point_and_the_threshold() {
        let chart = au_chart(
            "unet3d <h100>",
            &[(1, 99.0), (4, 95.5), (2, 98.0), (8, 60.0), (4, 93.0)],
            90.0,
        );
        let svg = chart.to_svg();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.contains("pass 90 %"));
        assert!(svg.contains("unet3d &lt;h100&gt;"));
        // Points are drawn in accelerator order.
        assert_eq!(
            chart.points.iter().map(|p| p.0).collect::<Vec<_>>(),
            vec![1.0, 2.0, 4.0, 8.0]
        );
        // The confirming run at 4 (listed last) is the one drawn.
        assert_eq!(chart.points[2].1, 93.0);
    }

    #[test]
    fn empty_and_flat_series_still_render() {
        let svg = wait_chart("empty", &[]).to_svg();
        assert!(svg.contains("</svg>") && !svg.contains("polyline"));
        let svg = wait_chart("flat", &[0.0; 100]).to_svg();
        assert!(svg.contains("polyline") && !svg.contains("NaN"));
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(100.0, 5.0), 20.0);
        assert_eq!(tick_step(1.0, 5.0), 0.2);
        assert_eq!(format_tick(0.4, 0.2), "0.4");
    }
}
