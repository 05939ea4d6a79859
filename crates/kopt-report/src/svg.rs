//! Hand-written SVG charts: grouped bars, a roofline plot and line charts.
//!
//! Colours come from CSS classes (`s0`..`s7` for series, `ref` and `var` for reference
//! and variant) defined in the page's style sheet, so the charts follow the page's light
//! or dark scheme; every chart has a `<title>`, a `<desc>` and an `aria-label`.

use std::fmt::Write;

/// XML/HTML text escaping.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// A compact rendering of a tick or value: `0.01`, `2.5`, `140`, `12k`, `3M`.
pub fn num(v: f64) -> String {
    let a = v.abs();
    let (x, suffix) = if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e4 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let ax = x.abs();
    let s = if ax == 0.0 {
        "0".to_string()
    } else if ax >= 100.0 {
        format!("{x:.0}")
    } else if ax >= 10.0 {
        format!("{x:.1}")
    } else if ax >= 1.0 {
        format!("{x:.2}")
    } else {
        // Two significant digits below one.
        let d = (-ax.log10().floor()) as usize + 1;
        format!("{x:.d$}")
    };
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    format!("{s}{suffix}")
}

/// An axis scale onto [0, 1].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    Linear {
        lo: f64,
        hi: f64,
    },
    /// Decades: `lo` and `hi` are powers of ten.
    Log {
        lo: f64,
        hi: f64,
    },
}

impl Scale {
    /// From zero to a round number at or above `max`.
    pub fn linear_from_zero(max: f64) -> Scale {
        let max = if max > 0.0 { max } else { 1.0 };
        let step = nice_step(max / 5.0);
        Scale::Linear {
            lo: 0.0,
            hi: (max / step).ceil() * step,
        }
    }

    /// The whole decades enclosing `[min, max]` (both positive).
    pub fn log_enclosing(min: f64, max: f64) -> Scale {
        let lo = 10f64.powf(min.log10().floor());
        let mut hi = 10f64.powf(max.log10().ceil());
        if hi <= lo {
            hi = lo * 10.0;
        }
        Scale::Log { lo, hi }
    }

    pub fn frac(&self, v: f64) -> f64 {
        match *self {
            Scale::Linear { lo, hi } => (v - lo) / (hi - lo),
            Scale::Log { lo, hi } => {
                (v.max(lo * 1e-3).log10() - lo.log10()) / (hi.log10() - lo.log10())
            }
        }
    }

    pub fn ticks(&self) -> Vec<f64> {
        match *self {
            Scale::Linear { lo, hi } => {
                let step = nice_step((hi - lo) / 5.0);
                let mut t = Vec::new();
                let mut i = (lo / step).ceil() as i64;
                while (i as f64) * step <= hi + step * 1e-9 {
                    t.push(i as f64 * step);
                    i += 1;
                }
                t
            }
            Scale::Log { lo, hi } => {
                let (a, b) = (lo.log10().round() as i32, hi.log10().round() as i32);
                // At most about 8 labelled decades.
                let every = ((b - a) as usize).div_ceil(8).max(1);
                (a..=b)
                    .filter(|e| ((e - a) as usize).is_multiple_of(every))
                    .map(|e| 10f64.powi(e))
                    .collect()
            }
        }
    }

    pub fn is_log(&self) -> bool {
        matches!(self, Scale::Log { .. })
    }
}

/// 1, 2 or 5 times a power of ten, at or above `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    p * if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    }
}

/// A plot area inside an SVG of `width` x `height`, with margins for the axes.
struct Frame {
    width: f64,
    height: f64,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
}

impl Frame {
    fn x(&self, f: f64) -> f64 {
        self.left + f * (self.width - self.left - self.right)
    }
    fn y(&self, f: f64) -> f64 {
        self.height - self.bottom - f * (self.height - self.top - self.bottom)
    }
    fn plot_w(&self) -> f64 {
        self.width - self.left - self.right
    }
}

fn open(out: &mut String, f: &Frame, id: &str, title: &str, desc: &str) {
    let _ = writeln!(
        out,
        r#"<svg id="{id}" class="chart" role="img" aria-label="{t}" viewBox="0 0 {w} {h}" width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">"#,
        id = esc(id),
        t = esc(title),
        w = f.width,
        h = f.height
    );
    let _ = writeln!(out, "<title>{}</title>", esc(title));
    let _ = writeln!(out, "<desc>{}</desc>", esc(desc));
}

/// The y axis (grid lines, ticks, labels, title) and the x axis line.
fn y_axis(out: &mut String, f: &Frame, s: Scale, label: &str) {
    out.push_str("<g class=\"axis\">\n");
    for t in s.ticks() {
        let y = f.y(s.frac(t));
        let _ = writeln!(
            out,
            r#"<line class="grid" x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            f.left,
            f.width - f.right,
            f.left - 6.0,
            y + 4.0,
            num(t)
        );
    }
    let _ = writeln!(
        out,
        r#"<line class="frame" x1="{l}" y1="{t}" x2="{l}" y2="{b}"/><line class="frame" x1="{l}" y1="{b}" x2="{r}" y2="{b}"/>"#,
        l = f.left,
        t = f.top,
        b = f.height - f.bottom,
        r = f.width - f.right
    );
    let cy = (f.top + f.height - f.bottom) / 2.0;
    let _ = writeln!(
        out,
        r#"<text class="label" transform="translate(14 {cy:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        esc(label)
    );
    out.push_str("</g>\n");
}

/// Ticks, labels and title of a numeric x axis.
fn x_axis(out: &mut String, f: &Frame, s: Scale, label: &str) {
    out.push_str("<g class=\"axis\">\n");
    let b = f.height - f.bottom;
    for t in s.ticks() {
        let x = f.x(s.frac(t));
        let _ = writeln!(
            out,
            r#"<line class="grid" x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{b:.1}"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            f.top,
            b + 16.0,
            num(t)
        );
    }
    let _ = writeln!(
        out,
        r#"<text class="label" x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        f.left + f.plot_w() / 2.0,
        f.height - 8.0,
        esc(label)
    );
    out.push_str("</g>\n");
}

/// A legend row at the top right: (text, class, marker) where marker is `rect`, `line`,
/// `dash`, `dot` or `ring`.
fn legend(out: &mut String, f: &Frame, items: &[(String, String, &str)]) {
    out.push_str("<g class=\"legend\">\n");
    let mut x = f.left;
    let y = 14.0;
    for (text, class, marker) in items {
        let sw = match *marker {
            "rect" => format!(
                r#"<rect class="{class}" x="{x:.1}" y="{:.1}" width="12" height="10"/>"#,
                y - 9.0
            ),
            "line" => format!(
                r#"<line class="{class} line" x1="{x:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}"/>"#,
                y - 4.0,
                x + 14.0,
                y - 4.0
            ),
            "dash" => format!(
                r#"<line class="{class} line dashed" x1="{x:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}"/>"#,
                y - 4.0,
                x + 14.0,
                y - 4.0
            ),
            "ring" => format!(
                r#"<circle class="{class} ring" cx="{:.1}" cy="{:.1}" r="4"/>"#,
                x + 6.0,
                y - 4.0
            ),
            _ => format!(
                r#"<circle class="{class}" cx="{:.1}" cy="{:.1}" r="4"/>"#,
                x + 6.0,
                y - 4.0
            ),
        };
        let _ = writeln!(
            out,
            r#"{sw}<text x="{:.1}" y="{y:.1}">{}</text>"#,
            x + 18.0,
            esc(text)
        );
        x += 26.0 + 6.2 * text.chars().count() as f64;
    }
    out.push_str("</g>\n");
}

/// One group of bars: a category label and one value per series.
pub struct BarGroup {
    pub label: String,
    pub values: Vec<Option<f64>>,
}

/// Grouped vertical bars (e.g. reference against variant time per shape). The y scale is
/// logarithmic when the values span more than a factor of 30, linear from zero otherwise;
/// each bar carries its value. `series`: (name, CSS class).
pub fn grouped_bars(
    id: &str,
    title: &str,
    desc: &str,
    y_label: &str,
    series: &[(&str, &str)],
    groups: &[BarGroup],
) -> String {
    let vals: Vec<f64> = groups
        .iter()
        .flat_map(|g| g.values.iter().flatten().copied())
        .filter(|v| *v > 0.0)
        .collect();
    let max = vals.iter().copied().fold(0.0, f64::max);
    let min = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let scale = if min.is_finite() && max / min > 30.0 {
        Scale::log_enclosing(min, max)
    } else {
        Scale::linear_from_zero(max * 1.08)
    };
    let lines: Vec<Vec<String>> = groups.iter().map(|g| wrap(&g.label, 18)).collect();
    let label_lines = lines.iter().map(Vec::len).max().unwrap_or(1) as f64;
    let f = Frame {
        width: (90.0 + 128.0 * groups.len() as f64).max(360.0),
        height: 250.0 + 13.0 * label_lines,
        left: 62.0,
        right: 12.0,
        top: 28.0,
        bottom: 40.0 + 13.0 * label_lines,
    };
    let mut out = String::new();
    open(&mut out, &f, id, title, desc);
    y_axis(&mut out, &f, scale, y_label);
    let items: Vec<(String, String, &str)> = series
        .iter()
        .map(|(n, c)| (n.to_string(), c.to_string(), "rect"))
        .collect();
    legend(&mut out, &f, &items);
    let slot = f.plot_w() / groups.len().max(1) as f64;
    let bar_w = (slot * 0.7 / series.len().max(1) as f64).min(44.0);
    let base = f.y(0.0);
    out.push_str("<g class=\"bars\">\n");
    for (gi, g) in groups.iter().enumerate() {
        let cx = f.left + slot * (gi as f64 + 0.5);
        let x0 = cx - bar_w * series.len() as f64 / 2.0;
        for (si, v) in g.values.iter().enumerate() {
            let x = x0 + bar_w * si as f64;
            let class = series.get(si).map_or("s0", |s| s.1);
            let name = series.get(si).map_or("", |s| s.0);
            match v {
                Some(v) if *v > 0.0 => {
                    let y = f.y(scale.frac(*v).clamp(0.0, 1.0));
                    let _ = writeln!(
                        out,
                        r#"<rect class="{class}" x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}"><title>{}: {} {}</title></rect><text class="value" x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                        bar_w - 2.0,
                        (base - y).max(0.5),
                        esc(&g.label),
                        esc(name),
                        num(*v),
                        x + (bar_w - 2.0) / 2.0,
                        y - 3.0,
                        num(*v)
                    );
                }
                _ => {
                    let _ = writeln!(
                        out,
                        r#"<text class="value" x="{:.1}" y="{:.1}" text-anchor="middle">n/a</text>"#,
                        x + (bar_w - 2.0) / 2.0,
                        base - 3.0
                    );
                }
            }
        }
        for (li, l) in lines[gi].iter().enumerate() {
            let _ = writeln!(
                out,
                r#"<text class="cat" x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                base + 15.0 + 13.0 * li as f64,
                esc(l)
            );
        }
    }
    out.push_str("</g>\n");
    if scale.is_log() {
        let _ = writeln!(
            out,
            r#"<text class="note" x="{:.1}" y="{:.1}" text-anchor="end">log scale</text>"#,
            f.width - f.right,
            f.top - 4.0
        );
    }
    out.push_str("</svg>\n");
    out
}

/// Splits a label at spaces into lines of about `width` characters.
fn wrap(s: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for w in s.split_whitespace() {
        match lines.last_mut() {
            Some(l) if l.len() + 1 + w.len() <= width => {
                l.push(' ');
                l.push_str(w);
            }
            _ => lines.push(w.to_string()),
        }
    }
    if lines.is_empty() {
        lines.push(String::new());
    }
    lines
}

/// A point of the roofline plot.
pub struct RoofPoint {
    /// For the tooltip: kernel, shape, version.
    pub label: String,
    /// FLOP per byte.
    pub intensity: f64,
    pub gflops: f64,
    /// Series class (one per kernel).
    pub class: String,
    /// The reference (hollow) or the active version (filled).
    pub reference: bool,
}

/// The ceilings of a roofline plot, as measured on the device.
pub struct Roof<'a> {
    pub copy_gbs: f64,
    pub peak_gflops: f64,
    /// E.g. `bf16 matrix peak`.
    pub peak_label: &'a str,
}

/// Log-log roofline: arithmetic intensity against achieved GFLOP/s, under the bandwidth
/// slope (`copy_gbs` x intensity) and the flat matrix peak. A reference point and the
/// active version's point of the same shape share an intensity and are joined by a line.
/// `kernels`: legend entries (name, class).
pub fn roofline(
    id: &str,
    title: &str,
    desc: &str,
    roof: &Roof,
    points: &[RoofPoint],
    kernels: &[(String, String)],
) -> String {
    let Roof {
        copy_gbs,
        peak_gflops,
        peak_label,
    } = *roof;
    let ridge = peak_gflops / copy_gbs;
    let min_i = points.iter().map(|p| p.intensity).fold(ridge, f64::min);
    let max_i = points
        .iter()
        .map(|p| p.intensity)
        .fold(ridge * 10.0, f64::max);
    let min_g = points.iter().map(|p| p.gflops).fold(peak_gflops, f64::min);
    let x = Scale::log_enclosing(min_i, max_i);
    let y = Scale::log_enclosing(min_g, peak_gflops * 1.5);
    let f = Frame {
        width: 620.0,
        height: 420.0,
        left: 62.0,
        right: 16.0,
        top: 28.0,
        bottom: 44.0,
    };
    let mut out = String::new();
    open(&mut out, &f, id, title, desc);
    y_axis(&mut out, &f, y, "achieved GFLOP/s");
    x_axis(&mut out, &f, x, "arithmetic intensity (FLOP/byte)");
    let mut items: Vec<(String, String, &str)> = kernels
        .iter()
        .map(|(n, c)| (n.clone(), c.clone(), "dot"))
        .collect();
    items.push(("reference".into(), "s-none".into(), "ring"));
    legend(&mut out, &f, &items);
    let (Scale::Log { lo: xlo, hi: xhi }, Scale::Log { hi: yhi, .. }) = (x, y) else {
        unreachable!("log_enclosing returns log scales")
    };
    // The roof: bandwidth slope up to the ridge, then the peak, clipped to the plot.
    let start = xlo.max(y.ticks()[0] / copy_gbs);
    let pts = [
        (start, copy_gbs * start),
        (ridge, peak_gflops),
        (xhi, peak_gflops),
    ];
    let path: Vec<String> = pts
        .iter()
        .map(|(i, g)| format!("{:.1},{:.1}", f.x(x.frac(*i)), f.y(y.frac(g.min(yhi)))))
        .collect();
    let _ = writeln!(
        out,
        r#"<polyline class="roof" points="{}"><title>roof: {} GB/s copy bandwidth, {} GFLOP/s {}</title></polyline>"#,
        path.join(" "),
        num(copy_gbs),
        num(peak_gflops),
        esc(peak_label)
    );
    let _ = writeln!(
        out,
        r#"<text class="note" x="{:.1}" y="{:.1}" text-anchor="end">{} ({} TFLOP/s)</text>"#,
        f.width - f.right - 4.0,
        f.y(y.frac(peak_gflops)) - 5.0,
        esc(peak_label),
        num(peak_gflops / 1e3)
    );
    let slope_at = (start * ridge).sqrt();
    let _ = writeln!(
        out,
        r#"<text class="note" x="{:.1}" y="{:.1}">copy {} GB/s</text>"#,
        f.x(x.frac(slope_at)) + 6.0,
        f.y(y.frac(copy_gbs * slope_at)) + 14.0,
        num(copy_gbs)
    );
    // Joins first, so the markers are drawn over them.
    out.push_str("<g class=\"points\">\n");
    for p in points.iter().filter(|p| p.reference) {
        if let Some(a) = points
            .iter()
            .find(|a| !a.reference && a.class == p.class && a.intensity == p.intensity)
        {
            let _ = writeln!(
                out,
                r#"<line class="{} join" x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}"/>"#,
                p.class,
                f.x(x.frac(p.intensity)),
                f.y(y.frac(p.gflops)),
                f.x(x.frac(a.intensity)),
                f.y(y.frac(a.gflops))
            );
        }
    }
    for p in points {
        let _ = writeln!(
            out,
            r#"<circle class="{}{}" cx="{:.1}" cy="{:.1}" r="5"><title>{}: {} FLOP/B, {} GFLOP/s</title></circle>"#,
            p.class,
            if p.reference { " ring" } else { "" },
            f.x(x.frac(p.intensity)),
            f.y(y.frac(p.gflops)),
            esc(&p.label),
            num(p.intensity),
            num(p.gflops)
        );
    }
    out.push_str("</g>\n</svg>\n");
    out
}

/// A series of a line chart.
pub struct Line {
    pub name: String,
    pub class: String,
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

/// A line chart of steps (best-so-far curves hold their value until the next point),
/// with an optional horizontal reference line (value, label).
pub fn step_lines(
    id: &str,
    title: &str,
    desc: &str,
    x_label: &str,
    y_label: &str,
    lines: &[Line],
    hline: Option<(f64, &str)>,
) -> String {
    let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let ys: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .chain(hline.map(|h| h.0))
        .collect();
    let max_x = xs.fold(1.0, f64::max);
    let (min_y, max_y) = ys
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(a, b), v| (a.min(*v), b.max(*v)));
    // Long runs on a log axis, so the first evaluations (where seeds matter) show.
    let x = if max_x >= 50.0 {
        Scale::log_enclosing(1.0, max_x)
    } else {
        Scale::linear_from_zero(max_x)
    };
    let y = if min_y.is_finite() && min_y > 0.0 && max_y / min_y > 20.0 {
        Scale::log_enclosing(min_y, max_y)
    } else {
        let lo = if min_y.is_finite() { min_y } else { 0.0 };
        let span = (max_y - lo).max(1e-9);
        let step = nice_step(span / 5.0);
        Scale::Linear {
            lo: (lo / step).floor() * step,
            hi: (max_y / step).ceil() * step,
        }
    };
    let f = Frame {
        width: 620.0,
        height: 380.0,
        left: 62.0,
        right: 16.0,
        top: 44.0,
        bottom: 44.0,
    };
    let mut out = String::new();
    open(&mut out, &f, id, title, desc);
    y_axis(&mut out, &f, y, y_label);
    x_axis(&mut out, &f, x, x_label);
    let items: Vec<(String, String, &str)> = lines
        .iter()
        .map(|l| {
            (
                l.name.clone(),
                l.class.clone(),
                if l.dashed { "dash" } else { "line" },
            )
        })
        .collect();
    // Legends of many series take two rows.
    let (first, second) = items.split_at(items.len().min(4));
    legend(&mut out, &f, first);
    if !second.is_empty() {
        out.push_str("<g transform=\"translate(0 16)\">\n");
        legend(&mut out, &f, second);
        out.push_str("</g>\n");
    }
    if let Some((v, label)) = hline {
        let yy = f.y(y.frac(v));
        let _ = writeln!(
            out,
            r#"<line class="target" x1="{:.1}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}"/><text class="note" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            f.left,
            f.width - f.right,
            f.width - f.right - 4.0,
            yy - 5.0,
            esc(label)
        );
    }
    for l in lines {
        let mut d = String::new();
        let mut prev: Option<f64> = None;
        for (px, py) in &l.points {
            let (sx, sy) = (f.x(x.frac(*px)), f.y(y.frac(*py)));
            match prev {
                None => {
                    let _ = write!(d, "M{sx:.1},{sy:.1}");
                }
                Some(_) => {
                    let _ = write!(d, " H{sx:.1} V{sy:.1}");
                }
            }
            prev = Some(sy);
        }
        let _ = writeln!(
            out,
            r#"<path class="{} line{}" d="{d}"><title>{}</title></path>"#,
            l.class,
            if l.dashed { " dashed" } else { "" },
            esc(&l.name)
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_compact() {
        assert_eq!(num(0.0123), "0.012");
        assert_eq!(num(1.0), "1");
        assert_eq!(num(2.5), "2.5");
        assert_eq!(num(140.0), "140");
        assert_eq!(num(12_000.0), "12k");
        assert_eq!(num(3_000_000.0), "3M");
    }

    #[test]
    fn scales_have_round_ticks() {
        assert_eq!(
            Scale::linear_from_zero(9.3).ticks(),
            vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        );
        let l = Scale::log_enclosing(0.03, 250.0);
        assert_eq!(
            l,
            Scale::Log {
                lo: 0.01,
                hi: 1000.0
            }
        );
        assert_eq!(l.ticks(), vec![0.01, 0.1, 1.0, 10.0, 100.0, 1000.0]);
        assert!((l.frac(1.0) - 0.4).abs() < 1e-12);
    }

    #[test]
    fn labels_wrap_at_spaces() {
        assert_eq!(
            wrap("batch=8 kv_heads=8 q_heads=32 seq_len=1024", 18),
            vec!["batch=8 kv_heads=8", "q_heads=32", "seq_len=1024"]
        );
    }
}
