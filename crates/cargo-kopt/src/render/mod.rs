//! Tables of the evaluation commands, for people.

pub mod search;

use std::io::Write;

use anstyle::{AnsiColor, Style};
use kopt_engine::protocol::{Ceilings, DeviceInfo};

use crate::table::Table;
use kopt_loop::eval::{BenchFile, Verified};

/// A value as one line of JSON on standard output (`--message-format json`).
pub fn print_json<T: serde::Serialize>(v: &T) {
    let mut out = anstream::stdout();
    let _ = writeln!(out, "{}", serde_json::to_string(v).expect("serialises"));
}

fn style(c: AnsiColor) -> Style {
    Style::new().fg_color(Some(c.into()))
}

/// A path as people read it: relative to the current folder when it is below it.
fn shown(p: &std::path::Path) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|d| p.strip_prefix(d).ok().map(|r| r.display().to_string()))
        .unwrap_or_else(|| p.display().to_string())
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.filter(|x| x.is_finite())
        .map(f)
        .unwrap_or_else(|| "–".into())
}

/// A time in a µs column: as is below a millisecond, in its own unit above
/// (`412.3 ms`), where six-digit microseconds would not read.
fn time_cell(us: f64) -> String {
    if us.abs() >= 1e3 {
        kopt_engine::stats::duration_text(us)
    } else {
        format!("{us:.2}")
    }
}

/// A percentage of a roof: one decimal, and `<0.1%` for a kernel too slow to show in it
/// (a naive kernel of hundreds of milliseconds is not at 0.0%).
fn pct_cell(x: f64) -> String {
    if x > 0.0 && x < 0.05 {
        "<0.1%".to_string()
    } else {
        format!("{x:.1}%")
    }
}

fn device_line(d: &DeviceInfo, c: Option<&Ceilings>) -> String {
    let ceil = match c {
        Some(c) => format!(
            "copy {:.0} GB/s, bf16 matmul {}",
            c.copy_gbs,
            opt(c.matmul_bf16_tflops, |v| format!("{v:.0} TFLOP/s"))
        ),
        None => "ceilings not measured".into(),
    };
    format!(
        "{} ({}, {} SMs, driver API {}.{}): {ceil}",
        d.name,
        d.arch,
        d.multiprocessors,
        d.driver_api / 1000,
        (d.driver_api % 1000) / 10
    )
}

pub fn devices(list: &[(DeviceInfo, Ceilings)]) {
    let mut t = Table::new(&[
        "#",
        "name",
        "arch",
        "SMs",
        "L2",
        "memory",
        "copy GB/s",
        "bf16 TF/s",
        "f16 TF/s",
        "f32 TF/s",
    ]);
    for (d, c) in list {
        t.row(vec![
            (d.ordinal.to_string(), Style::new()),
            (d.name.clone(), Style::new().bold()),
            (d.arch.clone(), Style::new()),
            (d.multiprocessors.to_string(), Style::new()),
            (format!("{} MiB", d.l2_bytes >> 20), Style::new()),
            (format!("{} GiB", d.memory_bytes >> 30), Style::new()),
            (format!("{:.0}", c.copy_gbs), Style::new()),
            (
                opt(c.matmul_bf16_tflops, |v| format!("{v:.0}")),
                Style::new(),
            ),
            (
                opt(c.matmul_f16_tflops, |v| format!("{v:.0}")),
                Style::new(),
            ),
            (
                opt(c.matmul_f32_tflops, |v| format!("{v:.1}")),
                Style::new(),
            ),
        ]);
    }
    let mut out = anstream::stdout();
    let _ = write!(out, "{}", t.render());
    if let Some((_, c)) = list.first() {
        let _ = writeln!(out, "{}", c.method);
    }
}

pub fn verify(v: &Verified) {
    let mut out = anstream::stdout();
    let several = v.devices.len() > 1;
    if several {
        // Each variant's % of copy bandwidth is against its own GPU's ceilings.
        for d in &v.devices {
            let _ = writeln!(
                out,
                "GPU {}: {} ({}, {} SMs)",
                d.ordinal, d.name, d.arch, d.multiprocessors
            );
        }
    } else if let Some(d) = v.devices.first() {
        let _ = writeln!(out, "{}", device_line(d, v.ceilings.as_ref()));
    }
    let _ = writeln!(out);
    if v.outcomes.is_empty() {
        let _ = writeln!(out, "no accepted variant to verify");
        return;
    }
    for o in &v.outcomes {
        // An entry for the whole architecture says which device vouched for it here.
        let on = match (&o.device, o.key == o.arch) {
            (Some(d), true) => format!(", verified on {d}"),
            _ => String::new(),
        };
        let head = format!(
            "{}/{} ({}{on}){}",
            o.kernel,
            o.variant,
            o.key,
            match o.gpu {
                Some(gpu) if several => format!(" on GPU {gpu}"),
                _ => String::new(),
            }
        );
        if let Some(why) = &o.skipped {
            let _ = writeln!(
                out,
                "{}skipped{:#} {head}: {why}",
                style(AnsiColor::Yellow),
                style(AnsiColor::Yellow)
            );
            continue;
        }
        let Some(v) = &o.verdict else { continue };
        let ok = o.passed();
        let (word, st) = if ok {
            ("passed", style(AnsiColor::Green))
        } else {
            ("FAILED", style(AnsiColor::Red).bold())
        };
        let _ = writeln!(
            out,
            "{st}{word}{st:#} {head}: {}{}",
            o.loaded,
            if o.cached { " (cached)" } else { "" }
        );
        if let Some(k) = &o.kept_ptx {
            let _ = writeln!(
                out,
                "  kept its PTX as {} ({})",
                k.file,
                k.record.describe()
            );
        }
        let mut t = Table::new(&[
            "shape",
            "reference µs",
            "variant µs",
            "speedup",
            "% copy bw",
            "max rel err",
            "spread",
            "timing",
        ]);
        for s in &v.shapes {
            t.row(vec![
                (
                    s.shape.clone(),
                    if s.held_out {
                        Style::new().dimmed()
                    } else {
                        Style::new()
                    },
                ),
                (opt(s.reference_us, time_cell), Style::new()),
                (opt(s.candidate_us, time_cell), Style::new()),
                (opt(s.speedup, |x| format!("{x:.2}x")), Style::new()),
                (opt(s.copy_bandwidth_pct, pct_cell), Style::new()),
                (format!("{:.1e}", s.max_rel_error), Style::new()),
                (
                    opt(s.spread, |x| format!("{:.1}%", 100.0 * x)),
                    Style::new(),
                ),
                (
                    s.method.clone().unwrap_or_else(|| "checked only".into()),
                    Style::new().dimmed(),
                ),
            ]);
        }
        let _ = write!(out, "{}", indent(&t.render()));
        for f in &v.failures {
            let _ = writeln!(
                out,
                "  {}{}{:#}{}: {}",
                style(AnsiColor::Red),
                f.fence.name(),
                style(AnsiColor::Red),
                f.shape
                    .as_ref()
                    .map(|s| format!(" [{s}]"))
                    .unwrap_or_default(),
                f.message
            );
        }
        for n in &v.notes {
            let _ = writeln!(out, "  note: {n}");
        }
        for o in &v.outliers {
            let _ = writeln!(
                out,
                "  outlier: {} took {:.2} µs where the other shapes predict {:.2} µs",
                o.shape, o.measured_us, o.expected_us
            );
        }
        if !o.sanitizer_shapes.is_empty() {
            let _ = writeln!(
                out,
                "  compute-sanitizer on {}:",
                o.sanitizer_shapes.join(", ")
            );
        }
        for s in &o.sanitizer {
            let excerpt = match s {
                kopt_engine::sanitizer::SanitizerResult::Errors { excerpt, .. } => {
                    format!("\n{excerpt}")
                }
                _ => String::new(),
            };
            let _ = writeln!(out, "  compute-sanitizer: {}{excerpt}", s.describe());
        }
        let _ = writeln!(out);
    }
}

pub fn bench(file: &BenchFile) {
    let rows = &file.rows;
    let mut out = anstream::stdout();
    let _ = writeln!(
        out,
        "{}\n",
        device_line(&file.device, file.ceilings.as_ref())
    );
    let mut t = Table::new(&[
        "kernel",
        "shape",
        "active",
        "reference µs",
        "active µs",
        "speedup",
        "% copy bw",
        "% same-size copy",
        "% peak FLOP/s",
        "spread",
    ]);
    for r in rows {
        let sp = r.speedup.unwrap_or(1.0);
        let st = if r.problem.is_some() {
            style(AnsiColor::Red)
        } else if sp > 1.03 {
            style(AnsiColor::Green)
        } else {
            Style::new()
        };
        t.row(vec![
            (r.kernel.clone(), Style::new().bold()),
            (r.shape.clone(), Style::new()),
            (r.active.clone(), Style::new()),
            (opt(r.reference_us, time_cell), Style::new()),
            (opt(r.active_us, time_cell), Style::new()),
            (opt(r.speedup, |x| format!("{x:.2}x")), st),
            (opt(r.copy_bandwidth_pct, pct_cell), Style::new()),
            (opt(r.same_size_copy_pct, pct_cell), Style::new()),
            (opt(r.flops_pct, |x| format!("{x:.2}%")), Style::new()),
            (
                opt(r.spread, |x| format!("{:.1}%", 100.0 * x)),
                Style::new(),
            ),
        ]);
    }
    let _ = write!(out, "{}", t.render());
    for r in rows.iter().filter(|r| r.problem.is_some()) {
        let _ = writeln!(
            out,
            "{}{} [{}]: {}{:#}",
            style(AnsiColor::Red),
            r.kernel,
            r.shape,
            r.problem.as_deref().unwrap_or(""),
            style(AnsiColor::Red)
        );
    }
    let _ = write!(out, "{}", bench_methods(rows));
    let weighted = file.weighted();
    if !weighted.is_empty() {
        let _ = writeln!(
            out,
            "\nin the captured program (each captured shape's time per launch times its launches):"
        );
        let mut t = Table::new(&["kernel", "launches", "reference", "active", "speedup"]);
        for w in &weighted {
            t.row(vec![
                (w.kernel.clone(), Style::new().bold()),
                (w.launches.to_string(), Style::new()),
                (time_cell(w.reference_ms * 1e3), Style::new()),
                (time_cell(w.active_ms * 1e3), Style::new()),
                (format!("{:.2}x", w.speedup()), Style::new()),
            ]);
        }
        let _ = write!(out, "{}", t.render());
    }
    if let Some(m) = file.memory_bound_summary() {
        let _ = writeln!(out, "{}", m.describe());
    }
    match &file.same_size_copy {
        Some(c) if c.starts_with("not measured") => {
            let _ = writeln!(out, "% same-size copy: {c}");
        }
        Some(c) => {
            let _ = writeln!(
                out,
                "% same-size copy: the time of {c}, over the active version's"
            );
        }
        None => {}
    }
}

/// The timing line under the bench table: the method when every row was timed alike, else
/// each method with the rows it timed (a slow kernel is timed launch by launch, and says
/// so).
fn bench_methods(rows: &[kopt_report::BenchRow]) -> String {
    let mut methods: Vec<(&str, Vec<String>)> = Vec::new();
    for r in rows {
        let Some(m) = r.method.as_deref() else {
            continue;
        };
        let row = format!("{} [{}]", r.kernel, r.shape);
        match methods.iter_mut().find(|(x, _)| *x == m) {
            Some((_, rs)) => rs.push(row),
            None => methods.push((m, vec![row])),
        }
    }
    let bw = "% copy bw: ideal bytes / time against the measured device-to-device copy";
    match methods.as_slice() {
        [] => String::new(),
        [(m, _)] => format!("timing: median per launch ({m}); {bw}\n"),
        several => {
            let mut text = format!("timing: median per launch, by method; {bw}\n");
            for (m, rs) in several {
                text.push_str(&format!("  {m}: {}\n", rs.join(", ")));
            }
            text
        }
    }
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("  {l}\n")).collect()
}

pub fn optimize(r: &kopt_loop::optimize::RunResult) {
    use kopt_agent::run::Stop;
    let (run_id, results) = (&r.run, &r.kernels);
    // Which GPU ran a kernel matters only when there were several.
    let several = results.iter().any(|r| r.device != results[0].device);
    let mut headers = vec![
        "kernel", "rounds", "accepted", "rejected", "best", "stopped", "pending", "noise",
        "tokens", "cost",
    ];
    if several {
        headers.push("gpu");
    }
    let mut t = Table::new(&headers);
    for r in results {
        let (stop, st) = match &r.stop {
            Stop::Rounds => ("rounds done".to_string(), Style::new()),
            Stop::Budget { which } => (format!("budget ({which})"), Style::new()),
            Stop::Escalated { reason, .. } => {
                (format!("escalated: {reason}"), style(AnsiColor::Yellow))
            }
            Stop::Backend { error } => (format!("agent failed: {error}"), style(AnsiColor::Red)),
            Stop::AgentDone { .. } => ("agent has no more proposals".to_string(), Style::new()),
        };
        let mut row = vec![
            (r.kernel.clone(), Style::new().bold()),
            (r.rounds.to_string(), Style::new()),
            (r.accepted.to_string(), style(AnsiColor::Green)),
            (r.rejected.to_string(), Style::new()),
            (opt(r.best_speedup, |b| format!("{b:.2}x")), Style::new()),
            (stop, st),
            (
                r.pending.clone().unwrap_or_else(|| {
                    if r.pending_refused.is_some() {
                        "refused (see JSON)".into()
                    } else {
                        "–".into()
                    }
                }),
                Style::new(),
            ),
            (
                // How far the starting version's time moved between two jobs.
                opt(r.noise.as_ref().map(|n| n.largest()), |n| {
                    format!("±{:.1}%", 100.0 * n)
                }),
                Style::new(),
            ),
            (r.tokens.to_string(), Style::new()),
            (format!("${:.2}", r.dollars), Style::new()),
        ];
        if several {
            row.push((r.device.to_string(), Style::new()));
        }
        t.row(row);
    }
    let mut out = anstream::stdout();
    let _ = write!(out, "{}", t.render());
    if results.len() > 1 {
        let _ = writeln!(
            out,
            "the run: {} candidate(s), {} token(s), ${:.2}",
            r.spent.candidates, r.spent.tokens, r.spent.dollars
        );
    }
    for e in results.iter().filter_map(|r| r.escalation.as_ref()) {
        let _ = writeln!(out, "escalation note: {}", shown(&r.dir.join(e)));
    }
    let _ = writeln!(
        out,
        "run {run_id}: journal and recorded sessions in {}/; review the winners with `cargo kopt review`",
        shown(&r.dir)
    );
}

/// `check`'s compile fence for people: the compiler, one row per version and architecture
/// (ptxas' figures of the entry, warnings, how the compile compares with the variant's
/// evidence), then the notes; or the one line that says why nothing was compiled.
/// Problems are `check`'s own list, printed after it.
pub fn compile_check(c: &kopt_workspace::compile_check::CompileCheck) -> String {
    use crate::style::{red, yellow};
    use kopt_workspace::compile_check::CompileCheck;
    let mut out = String::new();
    match c {
        CompileCheck::Skipped { reason, .. } => {
            out.push_str(&format!(
                "{}compile fence skipped{:#}: {reason}\n",
                yellow(),
                yellow()
            ));
        }
        CompileCheck::Ran {
            nvrtc,
            cuda_headers,
            include_dirs,
            versions,
            notes,
            ..
        } => {
            out.push_str(&format!(
                "compiled with NVRTC {nvrtc}{}; CUDA headers from {}\n",
                cuda_headers
                    .as_ref()
                    .map(|h| format!(" (CUDA headers {h})"))
                    .unwrap_or_default(),
                if include_dirs.is_empty() {
                    "nowhere (no toolkit found: set CUDA_HOME)".to_string()
                } else {
                    include_dirs.join(", ")
                }
            ));
            let mut t = Table::new(&[
                "kernel",
                "version",
                "arch",
                "entry",
                "registers",
                "spills (B)",
                "stack (B)",
                "smem (B)",
                "warnings",
                "vs evidence",
            ]);
            let plain = Style::new();
            for v in versions {
                let dash = || ("-".to_string(), plain);
                let mut row = vec![
                    (v.kernel.clone(), plain),
                    (v.version.clone(), plain),
                    (v.arch.clone(), plain),
                    (v.entry.clone(), plain),
                ];
                match &v.resources {
                    None => {
                        let what = v.failure.as_ref().map_or("failed", |f| f.kind.text());
                        row.push((what.to_string(), red()));
                        row.extend([dash(), dash(), dash(), dash(), dash()]);
                    }
                    Some(r) => {
                        let spills = if r.spill_stores == 0 && r.spill_loads == 0 {
                            ("0".to_string(), plain)
                        } else {
                            (
                                format!("{} st / {} ld", r.spill_stores, r.spill_loads),
                                red(),
                            )
                        };
                        row.push((r.registers.to_string(), plain));
                        row.push(spills);
                        row.push((r.stack_bytes.to_string(), plain));
                        row.push((r.shared_bytes.to_string(), plain));
                        row.push(if v.warning_count > 0 {
                            (v.warning_count.to_string(), yellow())
                        } else {
                            ("0".to_string(), plain)
                        });
                        row.push(match v.evidence {
                            None => dash(),
                            Some(m) => (
                                m.text().to_string(),
                                match m {
                                    kopt_engine::precompile::Match::Same
                                    | kopt_engine::precompile::Match::RegistersSame => plain,
                                    _ => yellow(),
                                },
                            ),
                        });
                    }
                }
                t.row(row);
            }
            out.push_str(&t.render());
            for n in notes {
                // A note's later lines (a compiler's warnings) indented under it.
                let n = n.replace('\n', "\n  ");
                out.push_str(&format!("{}note{:#}: {n}\n", yellow(), yellow()));
            }
        }
    }
    out
}

/// `profile --program`: where a captured program's kernel time goes, then the captured
/// shapes no declared shape covers.
pub fn program_time(
    runs: &[kopt_spec::capture::CaptureRun],
    shares: &[kopt_loop::captured::TimeShare],
    uncovered: &[kopt_loop::captured::Uncovered],
) {
    let mut out = anstream::stdout();
    let m = &runs[0].manifest;
    let launches: u64 = shares.iter().map(|s| s.launches).sum();
    let total_us: f64 = shares.iter().map(|s| s.total_us).sum();
    let _ = writeln!(
        out,
        "{} on {} ({}): {} process(es), {launches} launches of annotated kernels, {} of GPU time (sampled)\n",
        m.program,
        m.device,
        m.arch,
        runs.len(),
        time_cell(total_us)
    );
    let mut t = Table::new(&[
        "kernel",
        "share",
        "GPU time",
        "launches",
        "shapes",
        "mean µs",
        "costliest shape",
        "ran",
    ]);
    for s in shares {
        t.row(vec![
            (s.kernel.clone(), Style::new().bold()),
            (format!("{:.1}%", s.share_pct), Style::new()),
            (time_cell(s.total_us), Style::new()),
            (s.launches.to_string(), Style::new()),
            (s.cases.to_string(), Style::new()),
            (
                if s.launches > 0 && s.total_us > 0.0 {
                    format!("{:.2}", s.total_us / s.launches as f64)
                } else {
                    "–".into()
                },
                Style::new(),
            ),
            (
                s.top_case
                    .as_ref()
                    .map(|(c, p)| format!("{c} ({p:.0}%)"))
                    .unwrap_or_default(),
                Style::new(),
            ),
            (
                s.versions
                    .iter()
                    .map(|(v, n)| format!("{v} x{n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                Style::new(),
            ),
        ]);
    }
    let _ = write!(out, "{}", t.render());
    for u in uncovered {
        let _ = writeln!(
            out,
            "{}`{}` ran {} ({} launches), which no declared shape covers: {}{:#}",
            crate::style::dim(),
            u.kernel,
            u.case,
            u.launches,
            u.annotation,
            crate::style::dim()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_of_milliseconds_read_in_milliseconds() {
        assert_eq!(time_cell(34.456), "34.46");
        assert_eq!(time_cell(412_345.0), "412.3 ms");
        assert_eq!(time_cell(2_500_000.0), "2.50 s");
        assert_eq!(pct_cell(0.008), "<0.1%");
        assert_eq!(pct_cell(0.05), "0.1%");
        assert_eq!(pct_cell(0.0), "0.0%");
        assert_eq!(pct_cell(87.26), "87.3%");
    }

    #[test]
    fn the_bench_names_each_timing_method_with_its_rows() {
        let row = |shape: &str, method: &str| kopt_report::BenchRow {
            package: "p".into(),
            kernel: "softmax".into(),
            shape: shape.into(),
            active: "reference".into(),
            reference_us: Some(1.0),
            active_us: Some(1.0),
            speedup: Some(1.0),
            copy_bandwidth_pct: None,
            reference_copy_bandwidth_pct: None,
            flops_pct: None,
            spread: None,
            method: Some(method.into()),
            cached: false,
            problem: None,
            bytes: None,
            same_size_copy_us: None,
            same_size_copy_pct: None,
            launches: None,
        };
        let graph = "graph of 32 launches over 1 input set(s), L2 cold";
        let alone = "each launch timed alone between events over 1 input set(s), L2 cold";
        let one = bench_methods(&[row("a", graph), row("b", graph)]);
        assert!(
            one.starts_with(&format!("timing: median per launch ({graph});")),
            "{one}"
        );
        let two = bench_methods(&[row("a", graph), row("big", alone), row("b", graph)]);
        assert!(
            two.contains(&format!("  {graph}: softmax [a], softmax [b]\n")),
            "{two}"
        );
        assert!(
            two.contains(&format!("  {alone}: softmax [big]\n")),
            "{two}"
        );
    }
}
