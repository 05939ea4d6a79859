//! `cargo kopt review`: each pending variant in turn, with its rationale, figures,
//! verification evidence, what it replaces and a coloured source diff; one key decides.
//!
//! Keys: `a` accept, `r` reject, `s` skip (also Enter), `d` toggle the full diff and
//! snapshot texts, `q` quit (also Escape, Ctrl-C, end of input). On a terminal a key is
//! read without Enter; otherwise each line of standard input is one key (scripts).

use std::io::{self, BufRead, Write};

use anstyle::{AnsiColor, Style};
use kopt_store::cases::{CaseLibrary, Status};
use kopt_store::pending::PendingVariant;
use kopt_store::review::{self, DiffLine, ReviewItem};
use serde::Serialize;

use cargo_kopt::style::{bold, cyan, dim, green, yellow};
use kopt_workspace::gather::Gathered;
use kopt_workspace::store::{self, describe_replaced, kernel_of};

/// Diff lines shown before `d` is pressed.
pub const DIFF_PREVIEW_LINES: usize = 60;

/// Where keys come from.
pub trait KeySource {
    /// The next key, `None` at the end of input.
    fn next_key(&mut self) -> io::Result<Option<char>>;
}

/// Single keys from the terminal, without Enter (raw mode while reading).
pub struct TerminalKeys(pub console::Term);

impl KeySource for TerminalKeys {
    fn next_key(&mut self) -> io::Result<Option<char>> {
        use console::Key;
        // Raw keys, so that Ctrl-C ends the review like `q` (every decision already
        // taken is complete on disk) instead of killing the process.
        match self.0.read_key_raw() {
            Ok(Key::Char(c)) => Ok(Some(c)),
            Ok(Key::Enter) => Ok(Some('\n')),
            Ok(Key::Escape) | Ok(Key::CtrlC) => Ok(None),
            Ok(_) => Ok(Some('?')),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// One key per line of a reader (its first character; an empty line is Enter).
pub struct LineKeys<R>(pub R);

impl<R: BufRead> KeySource for LineKeys<R> {
    fn next_key(&mut self) -> io::Result<Option<char>> {
        let mut line = String::new();
        if self.0.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        Ok(Some(line.trim().chars().next().unwrap_or('\n')))
    }
}

/// What a review session did.
#[derive(Debug, Default, Serialize)]
pub struct ReviewSummary {
    pub accepted: Vec<String>,
    pub rejected: Vec<String>,
    pub skipped: Vec<String>,
    /// Cases recorded in the library.
    pub cases: Vec<String>,
    pub quit: bool,
}

/// Not bold, unlike `style::red`: a refusal in the review is not the command's error.
fn red() -> Style {
    Style::new().fg_color(Some(AnsiColor::Red.into()))
}

/// Reviews the pending variants `chosen`, reading keys from `keys` and writing to `out`
/// (which decides about colour: pass an `anstream` stream).
pub fn run(
    g: &Gathered,
    chosen: Vec<PendingVariant>,
    keys: &mut dyn KeySource,
    out: &mut dyn Write,
    mut lib: Option<&mut CaseLibrary>,
) -> io::Result<ReviewSummary> {
    let kopt = store::kopt_dir(g);
    let total = chosen.len();
    let mut summary = ReviewSummary::default();
    for (i, p) in chosen.into_iter().enumerate() {
        let label = format!("{} {} `{}`", p.meta.kernel, p.meta.arch, p.meta.variant);
        let Some(k) = kernel_of(g, &p) else {
            writeln!(
                out,
                "{}{} ({}): no #[kopt::kernel] of that name any more; reject it with `cargo kopt reject {} --arch {}`{:#}",
                yellow(),
                p.label(),
                p.meta.variant,
                p.meta.kernel,
                p.meta.arch,
                yellow()
            )?;
            summary.skipped.push(label);
            continue;
        };
        let t = store::target(k);
        let item = review::prepare(&t, &kopt, p);
        let mut expanded = false;
        render(out, &item, i + 1, total, expanded)?;
        loop {
            let accept_hint = if item.plan.is_ok() {
                format!("{}[a]{:#}ccept", bold(), bold())
            } else {
                format!("{}[a]ccept (unavailable){:#}", dim(), dim())
            };
            write!(
                out,
                "\n{accept_hint}  {b}[r]{b:#}eject  {b}[s]{b:#}kip  {b}[d]{b:#} {}  {b}[q]{b:#}uit > ",
                if expanded { "short diff" } else { "full diff" },
                b = bold()
            )?;
            out.flush()?;
            let key = keys.next_key()?;
            writeln!(out)?;
            match key {
                Some('a') => match &item.plan {
                    Ok(plan) => match kopt_store::accept::apply_accept(&t, &kopt, plan) {
                        Ok(done) => {
                            writeln!(
                                out,
                                "{}accepted{:#} `{}` for {}: wrote {} and {}",
                                green(),
                                green(),
                                done.variant,
                                done.arch,
                                done.folder,
                                done.lock
                            )?;
                            if let Some(l) = lib.as_deref_mut() {
                                record(
                                    &mut summary,
                                    g,
                                    k,
                                    &plan.pending,
                                    Status::Accepted,
                                    l,
                                    out,
                                )?;
                            }
                            summary.accepted.push(label);
                            break;
                        }
                        Err(e) => writeln!(out, "{}cannot accept{:#}: {e}", red(), red())?,
                    },
                    Err(e) => writeln!(out, "{}cannot accept{:#}: {e}", red(), red())?,
                },
                Some('r') => {
                    if let Some(l) = lib.as_deref_mut() {
                        record(&mut summary, g, k, &item.pending, Status::Rejected, l, out)?;
                    }
                    match kopt_store::accept::reject(
                        &kopt,
                        &item.pending,
                        Some("rejected in review"),
                    ) {
                        Ok(r) => {
                            writeln!(
                                out,
                                "{}rejected{:#} `{}` for {} (kept in {})",
                                yellow(),
                                yellow(),
                                r.variant,
                                r.arch,
                                r.kept_in.display()
                            )?;
                            summary.rejected.push(label);
                            break;
                        }
                        Err(e) => writeln!(out, "{}cannot reject{:#}: {e}", red(), red())?,
                    }
                }
                Some('s') | Some('\n') | Some(' ') => {
                    writeln!(out, "skipped: it stays pending")?;
                    summary.skipped.push(label);
                    break;
                }
                Some('d') => {
                    expanded = !expanded;
                    render(out, &item, i + 1, total, expanded)?;
                }
                Some('q') | None => {
                    summary.quit = true;
                    return Ok(summary);
                }
                Some(other) => writeln!(
                    out,
                    "`{}` is not a key here: a accept, r reject, s skip, d diff, q quit",
                    other.escape_default()
                )?,
            }
        }
    }
    Ok(summary)
}

fn record(
    summary: &mut ReviewSummary,
    g: &Gathered,
    k: &kopt_workspace::gather::Kernel,
    p: &PendingVariant,
    status: Status,
    lib: &mut CaseLibrary,
    out: &mut dyn Write,
) -> io::Result<()> {
    match store::record_case(g, k, p, status, lib) {
        Ok(id) => summary.cases.push(id),
        Err(e) => writeln!(
            out,
            "{}warning{:#}: not recorded in the case library: {e}",
            yellow(),
            yellow()
        )?,
    }
    Ok(())
}

/// Renders one pending variant for review.
pub fn render(
    out: &mut dyn Write,
    item: &ReviewItem,
    index: usize,
    total: usize,
    expanded: bool,
) -> io::Result<()> {
    let p = &item.pending;
    let m = &p.meta;
    let r = &p.rationale;
    let rule = "━".repeat(78);
    writeln!(out, "{}{rule}{:#}", dim(), dim())?;
    writeln!(
        out,
        "{b}[{index}/{total}] {} · {} · {} · pending `{}`{b:#}",
        m.package,
        m.kernel,
        m.arch,
        m.variant,
        b = bold()
    )?;
    writeln!(
        out,
        "{}run {} · {} · verified by {} · region {}{:#}",
        dim(),
        m.run_id,
        m.created_at,
        match m.verified_by {
            kopt_spec::files::VerifiedBy::Kopt => "kopt",
            kopt_spec::files::VerifiedBy::Manual => "a person (manual)",
        },
        m.region
            .as_deref()
            .map_or("every shape".to_string(), |x| format!("`{x}`")),
        dim()
    )?;
    if let Some(b) = &m.baseline {
        writeln!(
            out,
            "{}had to beat `{}`, accepted for {} when the run started{:#}",
            dim(),
            b.variant,
            m.arch,
            dim()
        )?;
    }
    writeln!(out, "\n{}", r.summary)?;

    heading(out, &format!("Diagnosis: {}", r.diagnosis.bottleneck))?;
    writeln!(out, "{}", r.diagnosis.explanation)?;
    for e in &r.diagnosis.evidence {
        writeln!(out, "  - {e}")?;
    }
    if let Some(c) = &r.diagnosis.confidence {
        writeln!(
            out,
            "  confidence {:.2} from past cases: {}",
            c.score,
            if c.cases.is_empty() {
                "none".into()
            } else {
                c.cases.join(", ")
            }
        )?;
    }
    if let Some(s) = &r.snapshots {
        heading(out, "Bottleneck snapshot, before → after")?;
        writeln!(
            out,
            "{} → {}",
            s.before.classification,
            s.after
                .as_ref()
                .map_or("not measured", |a| a.classification.as_str())
        )?;
        let mut names: Vec<&String> = s.before.metrics.keys().collect();
        if let Some(a) = &s.after {
            names.extend(a.metrics.keys());
        }
        names.sort();
        names.dedup();
        for n in names {
            let show = |v: Option<&f64>| v.map_or("–".to_string(), |v| v.to_string());
            writeln!(
                out,
                "  {n:<32} {:>10} → {:<10}",
                show(s.before.metrics.get(n)),
                show(s.after.as_ref().and_then(|a| a.metrics.get(n)))
            )?;
        }
        if expanded {
            writeln!(out, "{}", s.before.text)?;
            if let Some(a) = &s.after {
                writeln!(out, "--\n{}", a.text)?;
            }
        }
    }
    heading(out, "Changes")?;
    for (i, c) in r.changes.iter().enumerate() {
        writeln!(
            out,
            "  {}. {b}{}{b:#}\n     {}",
            i + 1,
            c.what,
            c.why,
            b = bold()
        )?;
    }
    heading(out, "Risks, and how verification covered them")?;
    for x in &r.risks {
        writeln!(
            out,
            "  - {}\n    {}covered by:{:#} {}",
            x.risk,
            dim(),
            dim(),
            x.covered_by
        )?;
    }
    heading(out, "Figures per shape (before → after)")?;
    let mut table = cargo_kopt::table::Table::new(&[
        "shape",
        "before µs",
        "after µs",
        "speedup",
        "% copy bw",
        "registers",
        "occupancy",
    ]);
    for f in &r.figures {
        let speed = f.speedup();
        let style = if speed >= 1.0 { green() } else { red() };
        table.row(vec![
            (
                f.shape
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                Style::new(),
            ),
            (format!("{:.2}", f.reference_us), Style::new()),
            (format!("{:.2}", f.variant_us), Style::new()),
            (format!("{speed:.2}x"), style),
            (
                f.copy_bandwidth_pct
                    .map_or("–".into(), |v| format!("{v:.1}%")),
                Style::new(),
            ),
            (
                f.registers.map_or("–".into(), |v| v.to_string()),
                Style::new(),
            ),
            (
                f.occupancy_pct.map_or("–".into(), |v| format!("{v:.0}%")),
                Style::new(),
            ),
        ]);
    }
    for line in table.render().lines() {
        writeln!(out, "  {line}")?;
    }
    heading(out, "Verification")?;
    writeln!(out, "{}", r.verification.method)?;
    for o in &r.verification.outputs {
        writeln!(
            out,
            "  {}: rtol {:e}, atol {:e}; max abs error {:.3e}, max rel error {:.3e}",
            o.buffer, o.rtol, o.atol, o.max_abs_error, o.max_rel_error
        )?;
    }
    writeln!(
        out,
        "  seeds: {}",
        r.verification
            .seeds
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    for f in &m.evidence.fences {
        let (mark, style) = if f.passed {
            ("✓", green())
        } else {
            ("✗", red())
        };
        writeln!(out, "  {style}{mark}{style:#} {}: {}", f.name, f.detail)?;
    }
    writeln!(
        out,
        "  shapes checked: {}",
        m.evidence.shapes_checked.join("; ")
    )?;
    if !m.evidence.held_out_shapes.is_empty() {
        writeln!(
            out,
            "  held-out shapes: {}",
            m.evidence.held_out_shapes.join("; ")
        )?;
    }
    let pv = &r.provenance;
    writeln!(
        out,
        "{}proposed by {} · measured on {} (driver {}) · {}{}{}{:#}",
        dim(),
        pv.agent,
        pv.device,
        pv.driver,
        pv.date,
        pv.budget
            .as_ref()
            .and_then(|b| b.describe())
            .map(|b| format!(" · budget used: {b}"))
            .unwrap_or_default(),
        pv.session
            .as_ref()
            .map(|s| format!(" · session {s}"))
            .unwrap_or_default(),
        dim()
    )?;

    match &item.plan {
        Ok(plan) => {
            if plan.replaces.is_empty() {
                // What stays behind it is in the notes.
                let what = match plan.keeps.is_empty() {
                    true => format!("nothing: the reference runs on {} today", plan.entry.key()),
                    false => "no entry".to_string(),
                };
                writeln!(out, "\n{}Replaces:{:#} {what}", bold(), bold())?;
            } else {
                writeln!(
                    out,
                    "\n{}Replaces the accepted variant(s) for {}:{:#}",
                    yellow().bold(),
                    plan.entry.key(),
                    yellow().bold()
                )?;
                for x in &plan.replaces {
                    writeln!(out, "  {}", describe_replaced(x))?;
                    if let Some(s) = &x.summary {
                        writeln!(out, "    {}{s}{:#}", dim(), dim())?;
                    }
                }
            }
            for n in &plan.notes {
                writeln!(out, "{}note{:#}: {n}", yellow(), yellow())?;
            }
            render_region_map(out, plan)?;
        }
        Err(e) => writeln!(
            out,
            "\n{}Cannot be accepted:{:#} {e}",
            red().bold(),
            red().bold()
        )?,
    }
    render_diff(out, &item.diff, expanded)
}

/// Which version runs on each declared shape before and after the accept, and on the
/// held-out shapes where that changes (the unchanged ones are counted).
fn render_region_map(out: &mut dyn Write, plan: &kopt_store::accept::AcceptPlan) -> io::Result<()> {
    heading(
        out,
        &format!(
            "Which version runs where on {}, before → after",
            plan.entry.key()
        ),
    )?;
    // A held-out shape's label says so (`(held out: ...)`).
    let mut table = cargo_kopt::table::Table::new(&["shape", "before", "after"]);
    let mut unchanged_held_out = 0;
    for row in &plan.region_map {
        let changed = row.before != row.after;
        if row.held_out && !changed {
            unchanged_held_out += 1;
            continue;
        }
        let after = if changed { green() } else { Style::new() };
        table.row(vec![
            (row.shape.clone(), Style::new()),
            (row.before.clone(), Style::new()),
            (row.after.clone(), after),
        ]);
    }
    for line in table.render().lines() {
        writeln!(out, "  {line}")?;
    }
    if unchanged_held_out > 0 {
        writeln!(
            out,
            "  {}{unchanged_held_out} held-out shape(s) keep the version they run today{:#}",
            dim(),
            dim()
        )?;
    }
    Ok(())
}

fn heading(out: &mut dyn Write, title: &str) -> io::Result<()> {
    writeln!(out, "\n{b}{title}{b:#}", b = bold())
}

/// The diff, coloured; the first [`DIFF_PREVIEW_LINES`] lines unless `full`.
pub fn render_diff(out: &mut dyn Write, d: &review::SourceDiff, full: bool) -> io::Result<()> {
    writeln!(
        out,
        "\n{b}Source diff{b:#} (+{} −{} lines)",
        d.added,
        d.removed,
        b = bold()
    )?;
    writeln!(out, "{}--- {}{:#}", red(), d.old_label, red())?;
    writeln!(out, "{}+++ {}{:#}", green(), d.new_label, green())?;
    let limit = if full { usize::MAX } else { DIFF_PREVIEW_LINES };
    for line in d.lines.iter().take(limit) {
        match line {
            DiffLine::Hunk(h) => writeln!(out, "{}{h}{:#}", cyan(), cyan())?,
            DiffLine::Context(t) => writeln!(out, " {t}")?,
            DiffLine::Removed(t) => writeln!(out, "{}-{t}{:#}", red(), red())?,
            DiffLine::Added(t) => writeln!(out, "{}+{t}{:#}", green(), green())?,
        }
    }
    if d.lines.len() > limit {
        writeln!(
            out,
            "{}… {} more diff lines: press d for the full diff{:#}",
            dim(),
            d.lines.len() - limit,
            dim()
        )?;
    }
    Ok(())
}
