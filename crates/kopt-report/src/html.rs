//! The page: sections in a fixed order, each a chart and its table, or a line saying
//! why it is empty.

use std::fmt::Write;

use kopt_spec::files::Rationale;
use kopt_spec::search_bench::{self, Row};
use kopt_store::pending::PendingVariant;

use crate::input::{BenchFile, BenchRow, Report, SearchBenchFile};
use crate::svg::{self, esc, num, BarGroup, Line, RoofPoint};

const STYLE: &str = r#"
:root { color-scheme: light dark; --bg: #ffffff; --fg: #1d2330; --muted: #5b6475; --rule: #d5dae3;
  --grid: #e7eaf0; --card: #f6f7f9; --ok: #1a7f37; --bad: #c62828;
  --ref: #6c8ebf; --var: #e69f00; --c0: #0072b2; --c1: #d55e00; --c2: #009e73; --c3: #cc79a7;
  --c4: #56b4e9; --c5: #8c6d31; --c6: #7b52ab; --c7: #3a3a3a; }
@media (prefers-color-scheme: dark) { :root { --bg: #14171c; --fg: #e6e9ef; --muted: #a0a8b8;
  --rule: #3a404c; --grid: #262b33; --card: #1c2027; --ok: #56d364; --bad: #ff7b72; --c7: #c9c9c9; } }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1260px; padding: 16px 20px 40px; background: var(--bg); color: var(--fg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
h1 { font-size: 22px; margin: 4px 0; } h2 { font-size: 18px; margin: 26px 0 6px; border-bottom: 1px solid var(--rule); padding-bottom: 3px; }
h3 { font-size: 15px; margin: 14px 0 4px; } p, ul { margin: 4px 0; } .muted, .empty { color: var(--muted); }
.empty { font-style: italic; } code { font-size: 12.5px; }
.grid2 { display: flex; flex-wrap: wrap; gap: 12px 20px; align-items: flex-start; }
figure { margin: 0; } figcaption { color: var(--muted); font-size: 12.5px; max-width: 620px; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 12.5px; }
th, td { border-bottom: 1px solid var(--rule); padding: 3px 8px; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; } th { background: var(--card); }
.pass { color: var(--ok); font-weight: 600; } .fail { color: var(--bad); font-weight: 600; }
.card { background: var(--card); border: 1px solid var(--rule); border-radius: 6px; padding: 8px 12px; margin: 10px 0; }
svg.chart { max-width: 100%; height: auto; font-size: 11px; }
svg text { fill: var(--fg); } svg .axis text, svg text.cat, svg text.note { fill: var(--muted); }
svg .grid { stroke: var(--grid); } svg .frame { stroke: var(--muted); }
svg text.value { font-size: 10px; } svg text.label { font-size: 12px; fill: var(--fg); }
.ref { fill: var(--ref); } .var { fill: var(--var); }
.s0 { fill: var(--c0); stroke: var(--c0); } .s1 { fill: var(--c1); stroke: var(--c1); } .s2 { fill: var(--c2); stroke: var(--c2); }
.s3 { fill: var(--c3); stroke: var(--c3); } .s4 { fill: var(--c4); stroke: var(--c4); } .s5 { fill: var(--c5); stroke: var(--c5); }
.s6 { fill: var(--c6); stroke: var(--c6); } .s7 { fill: var(--c7); stroke: var(--c7); }
.s-none { stroke: var(--muted); }
svg .ring { fill: var(--bg); stroke-width: 2; } svg .line { fill: none; stroke-width: 2.2; } svg .dashed { stroke-dasharray: 6 4; }
svg .join { stroke-width: 1.2; stroke-dasharray: 2 3; fill: none; }
svg .roof { fill: none; stroke: var(--fg); stroke-width: 2; } svg .target { stroke: var(--muted); stroke-dasharray: 3 3; }
"#;

/// Renders the report as one HTML document.
pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>",
        esc(&r.title)
    );
    let _ = writeln!(o, "<header>\n<h1>{}</h1>", esc(&r.title));
    if let Some(g) = &r.generated {
        let _ = writeln!(o, "<p class=\"muted\">Generated {}</p>", esc(g));
    }
    device_line(&mut o, r);
    if r.sources.is_empty() {
        o.push_str("<p class=\"empty\">No input was read.</p>\n");
    } else {
        o.push_str("<p class=\"muted\">Read from:</p>\n<ul class=\"muted\">\n");
        for s in &r.sources {
            let _ = writeln!(o, "<li><code>{}</code></li>", esc(s));
        }
        o.push_str("</ul>\n");
    }
    o.push_str("</header>\n");
    performance(&mut o, r.bench.as_ref());
    roofline(&mut o, r.bench.as_ref());
    convergence(&mut o, &r.search_benches);
    evidence(&mut o, r);
    o.push_str("</body>\n</html>\n");
    o
}

fn device_line(o: &mut String, r: &Report) {
    let Some(b) = &r.bench else { return };
    let d = &b.device;
    let mut line = format!(
        "{} ({}, {} SMs, driver API {}.{})",
        d.name,
        d.arch,
        d.multiprocessors,
        d.driver_api / 1000,
        d.driver_api % 1000 / 10
    );
    if let Some(c) = &b.ceilings {
        let _ = write!(line, ": measured copy bandwidth {} GB/s", num(c.copy_gbs));
        if let Some(p) = c.matmul_peak_tflops() {
            let _ = write!(line, ", matrix peak {} TFLOP/s", num(p));
        }
    }
    let _ = writeln!(o, "<p><strong>Device:</strong> {}</p>", esc(&line));
    if let Some(c) = &b.ceilings {
        let _ = writeln!(o, "<p class=\"muted\">Ceilings: {}</p>", esc(&c.method));
    }
}

fn empty(o: &mut String, why: &str) {
    let _ = writeln!(o, "<p class=\"empty\">{}</p>", esc(why));
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "n/a".into())
}

/// The kernels of the bench rows, in order of first appearance.
fn kernels(rows: &[BenchRow]) -> Vec<(&str, &str)> {
    let mut ks: Vec<(&str, &str)> = Vec::new();
    for r in rows {
        if !ks.contains(&(r.package.as_str(), r.kernel.as_str())) {
            ks.push((&r.package, &r.kernel));
        }
    }
    ks
}

fn performance(o: &mut String, bench: Option<&BenchFile>) {
    o.push_str("<section id=\"performance\">\n<h2>Reference against the active version, per kernel and shape</h2>\n");
    let Some(b) = bench else {
        empty(o, "Empty: no bench file was given. Measure with `cargo kopt bench --message-format json > bench.json` on the GPU and pass `--bench bench.json`.");
        o.push_str("</section>\n");
        return;
    };
    if b.rows.is_empty() {
        empty(
            o,
            "Empty: the bench file has no rows (no kernel was measured).",
        );
        o.push_str("</section>\n");
        return;
    }
    let method = b.rows.iter().find_map(|r| r.method.as_deref());
    let _ = writeln!(
        o,
        "<p class=\"muted\">Median time per launch{}. % of roofline: the larger of the share of the measured copy bandwidth (`bw`: ideal bytes over time) and the share of the matrix peak (`peak`: declared FLOPs over time).</p>",
        method.map(|m| format!(" (e.g. {})", esc(m))).unwrap_or_default()
    );
    if let Some(c) = &b.same_size_copy {
        let _ = writeln!(
            o,
            "<p class=\"muted\">% same-size copy: the time of one launch that copies the shape's ideal bytes, over the active version's; it counts the launch and latency a small shape cannot avoid ({}).</p>",
            esc(c)
        );
    }
    if let Some(m) = b.memory_bound_summary() {
        let _ = writeln!(
            o,
            "<p><strong>{}.</strong></p>",
            esc(&capitalise(&m.describe()))
        );
    }
    o.push_str("<div class=\"grid2\">\n");
    for (pkg, k) in kernels(&b.rows) {
        let rows: Vec<&BenchRow> = b
            .rows
            .iter()
            .filter(|r| r.package == pkg && r.kernel == k)
            .collect();
        let groups: Vec<BarGroup> = rows
            .iter()
            .map(|r| BarGroup {
                label: if r.active == "reference" {
                    r.shape.clone()
                } else {
                    format!("{} ({})", r.shape, r.active)
                },
                values: vec![r.reference_us, r.active_us],
            })
            .collect();
        let _ = writeln!(o, "<figure>\n<h3>{}</h3>", esc(k));
        o.push_str(&svg::grouped_bars(
            &format!("bars-{pkg}-{k}"),
            &format!("{k}: reference and active version, µs per launch"),
            &format!(
                "Grouped bars for each declared shape of {k} ({pkg}): the reference's median time and the active version's, in microseconds (lower is faster)."
            ),
            "µs per launch",
            &[("reference", "ref"), ("active version", "var")],
            &groups,
        ));
        o.push_str("</figure>\n");
    }
    o.push_str("</div>\n<table>\n<tr><th>kernel</th><th>shape</th><th>active</th><th>reference µs</th><th>active µs</th><th>speedup</th><th>% copy bw</th><th>% same-size copy</th><th>% peak FLOP/s</th><th>% of roofline</th><th>spread</th><th>status</th></tr>\n");
    for (pkg, k) in kernels(&b.rows) {
        for r in b.rows.iter().filter(|r| r.package == pkg && r.kernel == k) {
            let roof = r
                .roofline_pct()
                .map(|(p, by)| format!("{p:.1}% {by}"))
                .unwrap_or_else(|| "n/a".into());
            let status = match &r.problem {
                Some(p) => format!("<span class=\"fail\">failed</span>: {}", esc(p)),
                None => "<span class=\"pass\">passed</span>".into(),
            };
            let _ = writeln!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{status}</td></tr>",
                esc(&r.kernel),
                esc(&r.shape),
                esc(&r.active),
                opt(r.reference_us, |v| format!("{v:.2}")),
                opt(r.active_us, |v| format!("{v:.2}")),
                opt(r.speedup, |v| format!("{v:.2}x")),
                opt(r.copy_bandwidth_pct, |v| format!("{v:.1}%")),
                opt(r.same_size_copy_pct, |v| format!("{v:.1}%")),
                opt(r.flops_pct, |v| format!("{v:.3}%")),
                roof,
                opt(r.spread, |v| format!("{:.1}%", v * 100.0)),
            );
        }
    }
    o.push_str("</table>\n</section>\n");
}

fn roofline(o: &mut String, bench: Option<&BenchFile>) {
    o.push_str("<section id=\"roofline\">\n<h2>Roofline</h2>\n");
    let Some(b) = bench else {
        empty(o, "Empty: the roofline needs the bench file (`--bench`), which carries the measured ceilings and each shape's share of them.");
        o.push_str("</section>\n");
        return;
    };
    let Some(c) = &b.ceilings else {
        empty(o, "Empty: the bench file has no measured ceilings (the device's copy bandwidth and matrix peak could not be measured); `cargo kopt devices --refresh` measures them.");
        o.push_str("</section>\n");
        return;
    };
    let Some(peak_tflops) = c.matmul_peak_tflops() else {
        empty(o, "Empty: no matrix peak was measured on this device (cuBLAS did not run), so there is no compute roof.");
        o.push_str("</section>\n");
        return;
    };
    let peak = peak_tflops * 1e3;
    let ks = kernels(&b.rows);
    let mut points = Vec::new();
    let mut unplaced = Vec::new();
    for r in &b.rows {
        let class = format!(
            "s{}",
            ks.iter()
                .position(|k| *k == (r.package.as_str(), r.kernel.as_str()))
                .unwrap_or(0)
                % 8
        );
        // Intensity and FLOP/s from the shares of the two ceilings: FLOP/s = flops% x peak,
        // bytes/s = copy% x bandwidth.
        match (r.flops_pct, r.copy_bandwidth_pct, r.active_us) {
            (Some(f), Some(bw), Some(t)) if f > 0.0 && bw > 0.0 => {
                let gflops = f / 100.0 * peak;
                let intensity = gflops / (bw / 100.0 * c.copy_gbs);
                if let Some(rt) = r.reference_us.filter(|_| r.active != "reference") {
                    points.push(RoofPoint {
                        label: format!("{} {} reference", r.kernel, r.shape),
                        intensity,
                        gflops: gflops * t / rt,
                        class: class.clone(),
                        reference: true,
                    });
                }
                points.push(RoofPoint {
                    label: format!("{} {} {}", r.kernel, r.shape, r.active),
                    intensity,
                    gflops,
                    class,
                    reference: false,
                });
            }
            _ => unplaced.push(format!("{} {}", r.kernel, r.shape)),
        }
    }
    if points.is_empty() {
        empty(o, "Empty: no bench row has both a FLOP share and a bandwidth share (the kernels declare no `flops` expression, or no time was measured).");
        o.push_str("</section>\n");
        return;
    }
    let legend: Vec<(String, String)> = ks
        .iter()
        .enumerate()
        .map(|(i, k)| (k.1.to_string(), format!("s{}", i % 8)))
        .collect();
    let peak_label = if Some(peak_tflops) == c.matmul_bf16_tflops {
        "bf16 matrix peak"
    } else if Some(peak_tflops) == c.matmul_f16_tflops {
        "f16 matrix peak"
    } else {
        "f32 matrix peak"
    };
    o.push_str("<figure>\n");
    o.push_str(&svg::roofline(
        "roofline-chart",
        &format!("Roofline on {}", b.device.name),
        "Log-log plot of arithmetic intensity (FLOP per byte) against achieved GFLOP/s for each kernel and shape, under the measured copy-bandwidth slope and the measured matrix peak. Filled markers: the active version; rings: the reference where a variant is active.",
        &svg::Roof {
            copy_gbs: c.copy_gbs,
            peak_gflops: peak,
            peak_label,
        },
        &points,
        &legend,
    ));
    let _ = writeln!(
        o,
        "<figcaption>Ceilings measured on the device: copy {} GB/s, {} {} TFLOP/s (cuBLAS). Intensity is the spec's declared FLOPs over its ideal bytes; filled markers are the active version, rings the reference it replaces, joined by a dotted line.</figcaption>\n</figure>",
        num(c.copy_gbs),
        peak_label,
        num(peak_tflops)
    );
    if !unplaced.is_empty() {
        empty(
            o,
            &format!(
                "Not placed (no FLOP or bandwidth share): {}.",
                unplaced.join(", ")
            ),
        );
    }
    o.push_str("</section>\n");
}

const STRATEGIES: [&str; 4] = ["exhaustive", "random", "hill", "evolution"];

fn strategy_name(r: &Row) -> String {
    format!("{}{}", r.strategy, if r.seeded { " (seeded)" } else { "" })
}

/// The median over trials of the best cost after each evaluation, relative to `best`.
/// A trial stops at the target (or its budget) and keeps its last best afterwards.
fn median_curve(r: &Row, best: f64) -> Vec<(f64, f64)> {
    let n = r
        .trials
        .iter()
        .map(|t| t.best_so_far.len())
        .max()
        .unwrap_or(0);
    let mut curve = Vec::new();
    for i in 0..n {
        let mut v: Vec<f64> = r
            .trials
            .iter()
            .filter_map(|t| {
                t.best_so_far
                    .get(i)
                    .or(t.best_so_far.last())
                    .copied()
                    .flatten()
            })
            .map(|c| c / best)
            .collect();
        // Until more than half of the trials have a passing point, the median is unknown.
        if v.len() * 2 > r.trials.len() {
            if let Some(m) = search_bench::median(&mut v) {
                curve.push(((i + 1) as f64, m));
            }
        }
    }
    curve
}

fn convergence(o: &mut String, files: &[SearchBenchFile]) {
    o.push_str("<section id=\"convergence\">\n<h2>Search convergence</h2>\n");
    if files.is_empty() {
        empty(o, "Empty: no search benchmark was given. Measure with `cargo kopt search-bench KERNEL --json-out search-bench.json` on the GPU and pass `--search-bench search-bench.json` (once per kernel).");
        o.push_str("</section>\n");
        return;
    }
    for (fi, s) in files.iter().enumerate() {
        let l = &s.landscape;
        let _ = writeln!(o, "<h3>{} on {}</h3>", esc(&s.kernel), esc(&s.device.name));
        let _ = writeln!(
            o,
            "<p>{} valid points, {} evaluated, {} passed; best <code>{}</code>{}; {} points within {}% of it; exhaustive run {} evaluations/s. {}</p>",
            l.valid,
            l.evaluated,
            l.passed,
            esc(l.best_label.as_deref().unwrap_or("none")),
            l.best_over_median
                .map(|m| format!(", {m:.2}x faster than the median point"))
                .unwrap_or_default(),
            l.near_best,
            num(s.target * 100.0),
            num(s.exhaustive_evaluations_per_second),
            esc(&format!("Seconds: {}.", s.seconds_are))
        );
        let best = l.best_cost.filter(|b| *b > 0.0);
        // Every curve runs to the longest one: a trial that stopped holds its last best.
        let longest = s
            .rows
            .iter()
            .flat_map(|r| r.trials.iter().map(|t| t.best_so_far.len()))
            .max()
            .unwrap_or(0);
        let lines: Vec<Line> = s
            .rows
            .iter()
            .filter_map(|r| {
                let mut points = median_curve(r, best?);
                if let Some(&(x, y)) = points.last() {
                    if (x as usize) < longest {
                        points.push((longest as f64, y));
                    }
                }
                let idx = STRATEGIES
                    .iter()
                    .position(|k| *k == r.strategy.to_string())
                    .unwrap_or(7);
                (!points.is_empty()).then(|| Line {
                    name: strategy_name(r),
                    class: format!("s{idx}"),
                    dashed: !r.seeded,
                    points,
                })
            })
            .collect();
        if lines.is_empty() {
            empty(o, "No convergence curve: the file has no per-evaluation costs (it was written by a kopt older than the report, or no point passed); the table has its medians.");
        } else {
            o.push_str("<figure>\n");
            o.push_str(&svg::step_lines(
                &format!("convergence-{fi}-{}", s.kernel),
                &format!("{}: best cost so far against evaluations", s.kernel),
                "Line chart: for each strategy, seeded (solid) and unseeded (dashed), the median over seeds of the best cost found so far divided by the exhaustive best, against the number of evaluations. The dotted line is the convergence target.",
                "evaluations",
                "best so far / exhaustive best",
                &lines,
                Some((1.0 + s.target, &format!("target: within {}%", num(s.target * 100.0)))),
            ));
            let _ = writeln!(o, "<figcaption>Median over seeds of the best cost so far (the weighted geometric mean of point time over reference time) over the exhaustive run's best; each trial stops at the target and holds its last best afterwards.</figcaption>\n</figure>");
        }
        o.push_str("<table>\n<tr><th>strategy</th><th>seeds reaching the target</th><th>median evaluations</th><th>median seconds</th><th>evaluations/s</th></tr>\n");
        for r in &s.rows {
            let _ = writeln!(
                o,
                "<tr><td>{}</td><td class=\"n\">{} of {}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(&strategy_name(r)),
                r.reached,
                r.seeds,
                opt(r.median_evaluations, num),
                opt(r.median_seconds, |v| format!("{v:.2}")),
                num(r.evaluations_per_second)
            );
        }
        o.push_str("</table>\n");
    }
    o.push_str("</section>\n");
}

fn evidence(o: &mut String, r: &Report) {
    o.push_str(
        "<section id=\"evidence\">\n<h2>Verification evidence</h2>\n<h3>Committed variants</h3>\n",
    );
    if r.committed.is_empty() {
        empty(
            o,
            "None: no crate has a variant folder with a rationale.json under kopt/<kernel>/.",
        );
    }
    for c in &r.committed {
        let accepted = if c.accepted_for.is_empty() {
            "not in kopt.lock (kept on disk)".to_string()
        } else {
            format!("accepted for {}", c.accepted_for.join(", "))
        };
        let id = format!("committed-{}-{}-{}", c.package, c.kernel, c.variant);
        let _ = writeln!(
            o,
            "<div class=\"card\" id=\"{}\">\n<h3>{} / {} <span class=\"muted\">({}; {})</span></h3>",
            esc(&id),
            esc(&c.kernel),
            esc(&c.variant),
            esc(&c.package),
            esc(&accepted)
        );
        match &c.rationale {
            Ok(rat) => rationale(o, &id, rat),
            Err(e) => empty(o, &format!("The rationale cannot be read: {e}")),
        }
        o.push_str("</div>\n");
    }
    o.push_str("<h3>Pending variants</h3>\n");
    if r.pending.is_empty() && r.pending_broken.is_empty() {
        empty(
            o,
            "None: no pending area was given (`--pending DIR`), or it holds no variant.",
        );
    }
    for p in &r.pending {
        pending(o, p);
    }
    for (path, e) in &r.pending_broken {
        empty(o, &format!("{} cannot be read: {e}", path.display()));
    }
    o.push_str("</section>\n");
}

fn pending(o: &mut String, p: &PendingVariant) {
    let m = &p.meta;
    let id = format!("pending-{}-{}-{}", m.package, m.kernel, m.arch);
    let _ = writeln!(
        o,
        "<div class=\"card\" id=\"{}\">\n<h3>{} / {} <span class=\"muted\">({}, {}; pending from run {})</span></h3>",
        esc(&id),
        esc(&m.kernel),
        esc(&m.variant),
        esc(&m.package),
        esc(&m.arch),
        esc(&m.run_id)
    );
    let e = &m.evidence;
    o.push_str("<table>\n<tr><th>fence</th><th>verdict</th><th>detail</th></tr>\n");
    for f in &e.fences {
        let _ = writeln!(
            o,
            "<tr><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
            esc(&f.name),
            if f.passed { "pass" } else { "fail" },
            if f.passed { "passed" } else { "failed" },
            esc(&f.detail)
        );
    }
    o.push_str("</table>\n");
    let sanitizer = e.fences.iter().find(|f| f.name == "sanitizer");
    let _ = writeln!(
        o,
        "<p><strong>compute-sanitizer:</strong> {}</p>",
        match sanitizer {
            Some(f) if f.passed => format!("passed ({})", esc(&f.detail)),
            Some(f) => format!("<span class=\"fail\">failed</span>: {}", esc(&f.detail)),
            None => "not recorded among the fences of this variant".into(),
        }
    );
    let _ = writeln!(
        o,
        "<p><strong>Shapes checked:</strong> {}<br><strong>Held-out shapes:</strong> {}</p>",
        esc(&list_or_none(&e.shapes_checked)),
        esc(&list_or_none(&e.held_out_shapes))
    );
    rationale(o, &id, &p.rationale);
    o.push_str("</div>\n");
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// The claim, method, errors against tolerances and the recorded per-shape figures.
fn rationale(o: &mut String, id: &str, r: &Rationale) {
    let pv = &r.provenance;
    let _ = writeln!(o, "<p>{}</p>", esc(&r.summary));
    if let Some(c) = &r.claim {
        let _ = writeln!(
            o,
            "<p><strong>Verified by:</strong> {}; <strong>region:</strong> <code>{}</code></p>",
            match c.verified_by {
                kopt_spec::files::VerifiedBy::Kopt => "kopt's engine",
                kopt_spec::files::VerifiedBy::Manual => "a person (`cargo kopt pin`)",
            },
            esc(c.region.as_deref().unwrap_or("every shape"))
        );
    }
    let _ = writeln!(
        o,
        "<p><strong>Method:</strong> {}</p>\n<p class=\"muted\">Proposed by {} on {} (driver {}), {}; {} input seed(s).</p>",
        esc(&r.verification.method),
        esc(&pv.agent),
        esc(&pv.device),
        esc(&pv.driver),
        esc(&pv.date),
        r.verification.seeds.len()
    );
    o.push_str("<table>\n<tr><th>output</th><th>rtol</th><th>atol</th><th>max abs error</th><th>max rel error</th><th>within tolerance (from the maxima)</th></tr>\n");
    for c in &r.verification.outputs {
        // The engine's criterion is per element: |a - b| <= atol + rtol |b|. The largest
        // absolute error within atol, or the largest relative one within rtol, proves it
        // for every element; otherwise the maxima (of different elements) cannot tell.
        let ok = c.max_abs_error <= c.atol || c.max_rel_error <= c.rtol;
        let _ = writeln!(
            o,
            "<tr><td>{}</td><td class=\"n\">{:e}</td><td class=\"n\">{:e}</td><td class=\"n\">{:.3e}</td><td class=\"n\">{:.3e}</td><td class=\"{}\">{}</td></tr>",
            esc(&c.buffer),
            c.rtol,
            c.atol,
            c.max_abs_error,
            c.max_rel_error,
            if ok { "pass" } else { "muted" },
            if ok {
                "yes"
            } else {
                "not shown by the maxima alone"
            }
        );
    }
    o.push_str("</table>\n");
    if r.figures.is_empty() {
        empty(o, "No per-shape figures were recorded.");
        return;
    }
    let shape = |f: &kopt_spec::files::ShapeFigures| {
        f.shape
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    o.push_str("<div class=\"grid2\">\n<table>\n<tr><th>shape</th><th>reference µs</th><th>variant µs</th><th>speedup</th><th>% copy bw</th><th>registers</th><th>occupancy</th></tr>\n");
    for f in &r.figures {
        let _ = writeln!(
            o,
            "<tr><td>{}</td><td class=\"n\">{:.2}</td><td class=\"n\">{:.2}</td><td class=\"n\">{:.2}x</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(&shape(f)),
            f.reference_us,
            f.variant_us,
            f.speedup(),
            opt(f.copy_bandwidth_pct, |v| format!("{v:.1}%")),
            f.registers.map(|v| v.to_string()).unwrap_or_else(|| "n/a".into()),
            opt(f.occupancy_pct, |v| format!("{v:.0}%")),
        );
    }
    o.push_str("</table>\n");
    let groups: Vec<BarGroup> = r
        .figures
        .iter()
        .map(|f| BarGroup {
            label: shape(f),
            values: vec![Some(f.reference_us), Some(f.variant_us)],
        })
        .collect();
    o.push_str("<figure>\n");
    o.push_str(&svg::grouped_bars(
        &format!("bars-{id}"),
        &format!("{} / {}: times recorded at verification, µs", r.kernel, r.variant),
        &format!(
            "Grouped bars for each shape in the rationale of {} / {}: the reference's time and the variant's, in microseconds, as recorded when it was verified.",
            r.kernel, r.variant
        ),
        "µs per launch",
        &[("reference", "ref"), ("variant", "var")],
        &groups,
    ));
    o.push_str("</figure>\n</div>\n");
}

/// The sections without data, each with what would fill it (for the command's summary).
pub fn gaps(r: &Report) -> Vec<String> {
    let mut g = Vec::new();
    match &r.bench {
        None => {
            g.push(
                "per-shape timings: no --bench file (`cargo kopt bench --message-format json`)"
                    .to_string(),
            );
            g.push("roofline: no --bench file".to_string());
        }
        Some(b) if b.ceilings.is_none() => {
            g.push("roofline: the bench file has no measured ceilings".to_string())
        }
        Some(_) => {}
    }
    if r.search_benches.is_empty() {
        g.push("convergence: no --search-bench file (`cargo kopt search-bench KERNEL --json-out FILE`)".to_string());
    }
    if r.committed.is_empty() {
        g.push("committed variants: none with a rationale.json".to_string());
    }
    if r.pending.is_empty() {
        g.push("pending variants: none".to_string());
    }
    g
}
