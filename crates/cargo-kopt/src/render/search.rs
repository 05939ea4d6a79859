//! `cargo kopt search` and `cargo kopt search-bench`, for people.

use std::collections::BTreeMap;

use kopt_loop::search::{BenchReport, SearchReport};

use crate::style::bold;

fn plain() -> anstyle::Style {
    anstyle::Style::new()
}

fn shapes_cell(m: &BTreeMap<String, f64>) -> String {
    m.iter()
        .map(|(s, us)| format!("{s}: {us:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `cargo kopt search`, for people.
pub fn render_search(r: &SearchReport) {
    use std::io::Write;
    let mut out = anstream::stdout();
    let _ = writeln!(
        out,
        "{}/{} on {} ({}): {} search{}, seed {}",
        r.package,
        r.kernel,
        r.device.name,
        r.device.arch,
        r.strategy,
        if r.seeded { ", seeded" } else { "" },
        r.seed
    );
    let _ = writeln!(
        out,
        "space: {} valid of {} ({}; pruned: {} by constraints, {} by geometry, {} by device limits, {} by register caps)",
        r.space.valid,
        r.space.raw,
        r.space.axes.join(", "),
        r.space.pruned.constraints,
        r.space.pruned.geometry,
        r.space.pruned.device_limits,
        r.space.pruned.registers
    );
    if let Some(h) = &r.hints {
        let _ = writeln!(out, "snapshot: {}", h.describe());
    }
    if let Some(m) = &r.matrix {
        let _ = writeln!(out, "seed matrix ({}):", m.source);
        for row in &m.rows {
            let _ = writeln!(
                out,
                "  {:<28} prefer {:?} (priority {:.2}): {}",
                row.axis, row.prefer, row.priority, row.reason
            );
        }
    }
    let _ = writeln!(
        out,
        "{}: {} points ({} from the journal, {} compile failures, {} rejected) in {:.1} s, {:.1} evaluations/s",
        r.stop,
        r.evaluations,
        r.replayed,
        r.compile_failures,
        r.failures,
        r.seconds,
        r.evaluations_per_second
    );
    for d in &r.dropped {
        let _ = writeln!(out, "{d}");
    }
    for (label, why) in r.interesting.iter().take(5) {
        let _ = writeln!(out, "kept as interesting: {label}: {why}");
    }
    let _ = writeln!(out);
    match &r.best {
        Some(b) => {
            let verified = match &r.best_verified {
                Some(v) if v.accepted => {
                    "verified in full (held-out shapes, default timing, every fence)".to_string()
                }
                Some(v) => format!("FAILED the full verification: {}", v.summary()),
                None => "not verified in full (--no-verify)".to_string(),
            };
            let _ = writeln!(
                out,
                "{}best{:#}: {} ({:.2}x the reference, geometric mean over shapes): {verified}",
                bold(),
                bold(),
                b.label,
                b.speedup
            );
            if let Some(p) = &r.pending {
                let _ = writeln!(
                    out,
                    "saved as a pending variant: {p} (`cargo kopt review` to accept it)"
                );
            }
        }
        None => {
            let _ = writeln!(out, "no point passed");
        }
    }
    let mut t = crate::table::Table::new(&[
        "shape",
        "best configuration",
        "µs",
        "reference µs",
        "speedup",
        "full verification",
    ]);
    for s in &r.per_shape {
        t.row(vec![
            (s.shape.clone(), plain()),
            (s.label.clone(), bold()),
            (format!("{:.2}", s.us), plain()),
            (
                s.reference_us
                    .map(|x| format!("{x:.2}"))
                    .unwrap_or_else(|| "–".into()),
                plain(),
            ),
            (
                s.reference_us
                    .map(|x| format!("{:.2}x", x / s.us))
                    .unwrap_or_else(|| "–".into()),
                plain(),
            ),
            (s.verified.clone().unwrap_or_else(|| "–".into()), plain()),
        ]);
    }
    let _ = write!(out, "{}", t.render());
    let _ = writeln!(out);
    let mut t = crate::table::Table::new(&["#", "configuration", "speedup", "per shape µs"]);
    for (i, p) in r.leaderboard.iter().enumerate() {
        t.row(vec![
            ((i + 1).to_string(), plain()),
            (p.label.clone(), if i == 0 { bold() } else { plain() }),
            (format!("{:.2}x", p.speedup), plain()),
            (shapes_cell(&p.shapes_us), plain()),
        ]);
    }
    let _ = write!(out, "{}", t.render());
    let _ = writeln!(
        out,
        "\nrun {} (journal: {}); resume it with `cargo kopt search {} --strategy {} --seed {}{} --resume {}`",
        r.run_id,
        r.journal.join("journal.jsonl").display(),
        r.kernel,
        r.strategy,
        r.seed,
        if r.seeded { " --seeded" } else { "" },
        r.run_id
    );
}

fn med(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "not reached".into())
}

/// `cargo kopt search-bench`, for people.
pub fn render_bench(r: &BenchReport) {
    use std::io::Write;
    let mut out = anstream::stdout();
    let l = &r.landscape;
    let _ = writeln!(
        out,
        "{}/{} on {} ({})",
        r.package, r.kernel, r.device.name, r.device.arch
    );
    let _ = writeln!(
        out,
        "space: {} valid points of {} ({})",
        r.space.valid,
        r.space.raw,
        r.space.axes.join(", ")
    );
    let _ = writeln!(
        out,
        "exhaustive: {} points ({} passed) in {:.1} s = {:.1} evaluations/s (compile on CPU threads, check, time; no cache)",
        l.evaluated, l.passed, r.exhaustive_seconds, r.exhaustive_evaluations_per_second
    );
    let _ = writeln!(
        out,
        "best: {} (cost {:.4}, {:.2}x the reference); median point cost {:.4}; best is {:.2}x faster than the median point; {} point(s) within {:.0}% of the best",
        l.best_label.as_deref().unwrap_or("–"),
        l.best_cost.unwrap_or(f64::NAN),
        1.0 / l.best_cost.unwrap_or(f64::NAN),
        l.median_cost.unwrap_or(f64::NAN),
        l.best_over_median.unwrap_or(f64::NAN),
        l.near_best,
        100.0 * r.target
    );
    let _ = writeln!(
        out,
        "per evaluation: {} ms on the worker ({}); NVRTC {:.1} ms per point on the compile threads",
        r.worker_ms_per_evaluation.values().sum::<f64>().round(),
        r.worker_ms_per_evaluation
            .iter()
            .map(|(k, v)| format!("{k} {v:.1}"))
            .collect::<Vec<_>>()
            .join(", "),
        r.compile_ms_per_point
    );
    let _ = writeln!(out, "seed snapshot (the reference): {}", r.hints.describe());
    let _ = writeln!(out);
    let mut t = crate::table::Table::new(&[
        "strategy",
        "seeded",
        "median evaluations to within target",
        "median seconds",
        "evaluations/s",
        "reached",
    ]);
    for row in &r.rows {
        t.row(vec![
            (row.strategy.to_string(), bold()),
            (if row.seeded { "yes" } else { "no" }.into(), plain()),
            (med(row.median_evaluations, |v| format!("{v:.1}")), plain()),
            (med(row.median_seconds, |v| format!("{v:.2}")), plain()),
            (format!("{:.1}", row.evaluations_per_second), plain()),
            (format!("{}/{}", row.reached, row.seeds), plain()),
        ]);
    }
    let _ = write!(out, "{}", t.render());
    let _ = writeln!(
        out,
        "target: within {:.0}% of the exhaustive best; medians over {} seed(s) (exhaustive: one run, it does not draw); seconds: {}",
        100.0 * r.target,
        r.rows.iter().map(|x| x.seeds).max().unwrap_or(0),
        r.seconds_are
    );
}
