//! The store commands (`pending`, `review`, `accept`, `reject`, `merge`, `gc`, `cases`):
//! their arguments, flattened into `cargo kopt`'s command line, and their rendering, for
//! people (tables, colours through `anstream`) or as JSON.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anstyle::Style;
use cargo_kopt::style::{dim, green, red, yellow};
use clap::{Args, Subcommand};
use kopt_store::cases::{self, CaseLibrary, Status};

use crate::review::{self, LineKeys, TerminalKeys};
use cargo_kopt::render::print_json;
use cargo_kopt::table::Table;
use kopt_workspace::commands;
use kopt_workspace::gather::Gathered;
use kopt_workspace::store::{self, StoreCmdError};

/// `--cases PATH`.
#[derive(Args, Debug, Clone, Default)]
pub struct CasesPath {
    /// The case library (default: $KOPT_CASES, else <user data dir>/kopt/cases.sqlite).
    #[arg(long = "cases", value_name = "PATH")]
    pub path: Option<PathBuf>,
}

/// `--cases PATH` and `--no-cases`, for the commands that record decisions.
#[derive(Args, Debug, Clone, Default)]
pub struct CaseRecording {
    #[command(flatten)]
    pub library: CasesPath,
    /// Do not record the decisions in the case library.
    #[arg(long)]
    pub no_cases: bool,
}

#[derive(Subcommand, Debug)]
pub enum CasesCommand {
    /// List the cases: id, kind, diagnosis, outcome.
    List {
        /// Only this kind (softmax, norm, reduction, attention, gemm, ...).
        #[arg(long)]
        kind: Option<String>,
        /// Only accepted, rejected or failed cases.
        #[arg(long)]
        status: Option<String>,
    },
    /// Show one case in full.
    Show { id: String },
    /// The cases most similar to a kernel: by metrics, text, and/or a CUDA source file.
    Search {
        /// A metric of the kernel's bottleneck snapshot, NAME=VALUE (repeatable).
        #[arg(long = "metric", value_name = "NAME=VALUE")]
        metrics: Vec<String>,
        /// Words to match (diagnosis, structure, identifiers).
        #[arg(long)]
        text: Option<String>,
        /// A CUDA source: its structural summary and identifiers join the text.
        #[arg(long, value_name = "FILE")]
        source: Option<PathBuf>,
        /// Only cases of this kind.
        #[arg(long)]
        kind: Option<String>,
        /// How many cases.
        #[arg(short, default_value_t = 5)]
        k: usize,
    },
    /// Import cases: a .jsonl file (as `export` writes it), another case library (its
    /// .sqlite file; cases already here are not added twice), or a repository's committed
    /// kopt/ folders (each accepted variant becomes an accepted case).
    Import {
        path: PathBuf,
        /// The repository's name in case ids (default: its folder's name).
        #[arg(long)]
        repo_name: Option<String>,
    },
    /// Export every case as JSON lines, sorted by id.
    Export {
        /// Write to this file instead of standard output.
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
}

#[derive(Args)]
pub struct ReviewArgs {
    /// Only this kernel's pending variants.
    pub kernel: Option<String>,
    /// Only this architecture's.
    #[arg(long)]
    pub arch: Option<String>,
    #[command(flatten)]
    pub cases: CaseRecording,
}

#[derive(Args)]
pub struct AcceptArgs {
    pub kernel: Option<String>,
    /// Only this architecture's.
    #[arg(long)]
    pub arch: Option<String>,
    /// Every pending variant selected (of KERNEL, or of the workspace).
    #[arg(long)]
    pub all: bool,
    /// Accept under another variant name (when its own is taken).
    #[arg(long = "as", value_name = "NAME")]
    pub rename: Option<String>,
    /// Key the lock entry by the device the variant was measured on (`NVIDIA H200`), so
    /// that other devices of its architecture keep what they run; without it, the entry
    /// is for every device of the architecture.
    #[arg(long)]
    pub device_specific: bool,
    #[command(flatten)]
    pub cases: CaseRecording,
}

#[derive(Args)]
pub struct RejectArgs {
    pub kernel: Option<String>,
    /// Only this architecture's.
    #[arg(long)]
    pub arch: Option<String>,
    /// Every pending variant selected.
    #[arg(long)]
    pub all: bool,
    /// Why, for the run's journal.
    #[arg(long)]
    pub reason: Option<String>,
    #[command(flatten)]
    pub cases: CaseRecording,
}

#[derive(Args)]
pub struct MergeArgs {
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    #[command(flatten)]
    pub cases: CaseRecording,
}

#[derive(Args)]
pub struct CasesArgs {
    #[command(flatten)]
    pub library: CasesPath,
    #[command(subcommand)]
    pub command: CasesCommand,
}

fn usage(e: StoreCmdError) -> String {
    e.to_string()
}

/// Opens the library for recording decisions; a library that cannot be opened is a
/// warning, not a reason to leave a decision undone.
fn recording_library(rec: &CaseRecording) -> Option<CaseLibrary> {
    if rec.no_cases {
        return None;
    }
    let opened =
        cases::library_path(rec.library.path.as_deref()).and_then(|p| CaseLibrary::open(&p));
    match opened {
        Ok(l) => Some(l),
        Err(e) => {
            let _ = writeln!(
                anstream::stderr(),
                "{}warning{:#}: decisions will not be recorded in the case library: {e} (pass --cases PATH, or --no-cases)",
                yellow(),
                yellow()
            );
            None
        }
    }
}

// ---------------------------------------------------------------------------------------

/// `cargo kopt pending`.
pub fn pending(g: &Gathered, json: bool) -> ExitCode {
    let report = store::pending_report(g);
    if json {
        print_json(&report);
        return ExitCode::SUCCESS;
    }
    let mut out = anstream::stdout();
    if report.pending.is_empty() {
        let _ = writeln!(
            out,
            "no pending variant (the optimisation loop leaves its winners in {})",
            store::kopt_dir(g).pending_root().display()
        );
    } else {
        let mut t = Table::new(&[
            "crate", "kernel", "arch", "variant", "region", "speedup", "state", "run",
        ]);
        for p in &report.pending {
            let state = match p.status {
                "ready" if p.replaces.is_empty() => ("ready".to_string(), green()),
                "ready" => (
                    format!("ready, replaces {}", p.replaces.join(", ")),
                    yellow(),
                ),
                other => (other.to_string(), red()),
            };
            t.row(vec![
                (p.package.clone(), Style::new()),
                (p.kernel.clone(), Style::new().bold()),
                (p.arch.clone(), Style::new()),
                (p.variant.clone(), Style::new()),
                (
                    p.region.clone().unwrap_or_else(|| "every shape".into()),
                    Style::new(),
                ),
                (
                    p.speedup.map_or("–".into(), |(lo, hi)| {
                        if (hi - lo).abs() < 0.005 {
                            format!("{lo:.2}x")
                        } else {
                            format!("{lo:.2}-{hi:.2}x")
                        }
                    }),
                    Style::new(),
                ),
                state,
                (p.run_id.clone(), dim()),
            ]);
        }
        let _ = write!(out, "{}", t.render());
        for p in report.pending.iter().filter(|p| p.reason.is_some()) {
            let _ = writeln!(
                out,
                "{}{} {} `{}`: {}{:#}",
                yellow(),
                p.kernel,
                p.arch,
                p.variant,
                p.reason.as_deref().unwrap_or_default(),
                yellow()
            );
        }
        let _ = writeln!(out, "review them with `cargo kopt review`");
    }
    for (path, why) in &report.broken {
        let _ = writeln!(
            out,
            "{}unreadable{:#}: {} ({why}); delete the folder to drop it",
            red(),
            red(),
            path.display()
        );
    }
    ExitCode::SUCCESS
}

/// `cargo kopt gc [KERNEL...] [--delete]`: exit 1 when a folder could not be removed or a
/// kernel's lock file could not be read.
pub fn gc(g: &Gathered, kernels: &[String], delete: bool, json: bool) -> Result<ExitCode, String> {
    let report = store::gc(g, kernels, delete);
    let code = if report.failed() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    };
    if json {
        print_json(&report);
        return Ok(code);
    }
    let mut out = anstream::stdout();
    if report.folders.is_empty() {
        let _ = writeln!(
            out,
            "every variant folder is named by a lock entry: nothing to collect"
        );
    } else {
        let mut t = Table::new(&["crate", "kernel", "variant folder", "state"]);
        for f in &report.folders {
            let state = match f.action {
                "removed" => ("removed".to_string(), green()),
                "unreferenced" => ("no lock entry names it".to_string(), yellow()),
                "kept" => ("kept (see below)".to_string(), dim()),
                other => (other.to_string(), red()),
            };
            t.row(vec![
                (f.package.clone(), Style::new()),
                (f.folder.kernel.clone(), Style::new().bold()),
                (f.folder.folder.clone(), Style::new()),
                state,
            ]);
        }
        let _ = write!(out, "{}", t.render());
        for f in &report.folders {
            if let Some(why) = &f.folder.kept {
                let _ = writeln!(out, "{}kept{:#} {}: {why}", dim(), dim(), f.folder.folder);
            }
            if let Some(e) = &f.error {
                let _ = writeln!(out, "{}failed{:#} {}: {e}", red(), red(), f.folder.folder);
            }
        }
        let count = |a: &str| report.folders.iter().filter(|f| f.action == a).count();
        if delete {
            let _ = writeln!(
                out,
                "removed {} variant folder(s) no lock entry named (git keeps their history); kept {}",
                count("removed"),
                count("kept")
            );
        } else {
            let _ = writeln!(
                out,
                "{} variant folder(s) no lock entry names; `cargo kopt gc --delete` removes {} of them (git keeps their history)",
                report.folders.len(),
                count("unreferenced")
            );
        }
    }
    for s in &report.skipped {
        let _ = writeln!(out, "{}skipped{:#} {s}", red(), red());
    }
    Ok(code)
}

/// `cargo kopt review [KERNEL] [--arch A]`.
pub fn review(a: ReviewArgs, g: Gathered, json: bool) -> Result<ExitCode, String> {
    let (g, rec) = (&g, &a.cases);
    let chosen = match store::select_pending(g, a.kernel.as_deref(), a.arch.as_deref(), true) {
        Ok(c) => c,
        Err(StoreCmdError::Usage(m)) if m.starts_with("no pending variant") => {
            let _ = writeln!(anstream::stdout(), "{m}");
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(usage(e)),
    };
    let mut lib = recording_library(rec);
    let mut out = anstream::stdout();
    let interactive = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let summary = if interactive {
        let mut keys = TerminalKeys(console::Term::stdout());
        review::run(g, chosen, &mut keys, &mut out, lib.as_mut())
    } else {
        let stdin = std::io::stdin();
        let mut keys = LineKeys(stdin.lock());
        review::run(g, chosen, &mut keys, &mut out, lib.as_mut())
    }
    .map_err(|e| format!("review: {e}"))?;
    if json {
        print_json(&summary);
    } else {
        let _ = writeln!(
            out,
            "\n{} accepted, {} rejected, {} left pending{}",
            summary.accepted.len(),
            summary.rejected.len(),
            summary.skipped.len(),
            if summary.quit { " (quit)" } else { "" }
        );
        if !summary.accepted.is_empty() {
            let _ = writeln!(
                out,
                "commit the new files under kopt/; `cargo kopt check` verifies them"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `cargo kopt accept [KERNEL] [--arch A] [--all] [--as NAME] [--device-specific]`.
pub fn accept(a: AcceptArgs, g: Gathered, json: bool) -> Result<ExitCode, String> {
    let g = &g;
    let how = kopt_store::accept::AcceptAs {
        name: a.rename.as_deref(),
        device_specific: a.device_specific,
    };
    let chosen =
        store::select_pending(g, a.kernel.as_deref(), a.arch.as_deref(), a.all).map_err(usage)?;
    let decide = |lib: Option<&mut CaseLibrary>| store::accept_pending(g, &chosen, how, lib);
    decide_and_print(&a.cases, json, decide, |out, r| {
        let a = &r.accepted;
        for replaced in &r.replaced {
            let _ = writeln!(out, "{}replaces{:#} {replaced}", yellow(), yellow());
        }
        let _ = writeln!(
            out,
            "{}accepted{:#} `{}` for {} of {}{}: wrote {} and {}",
            green(),
            green(),
            a.variant,
            a.key,
            a.kernel,
            a.region
                .as_ref()
                .map(|x| format!(" where `{x}`"))
                .unwrap_or_default(),
            a.folder,
            a.lock
        );
        for n in &a.notes {
            let _ = writeln!(out, "{}note{:#}: {n}", yellow(), yellow());
        }
        if let Some(c) = &r.case {
            let _ = writeln!(out, "{}recorded as case {c}{:#}", dim(), dim());
        }
    })
}

/// `cargo kopt reject [KERNEL] [--arch A] [--all]`.
pub fn reject(a: RejectArgs, g: Gathered, json: bool) -> Result<ExitCode, String> {
    let g = &g;
    let chosen =
        store::select_pending(g, a.kernel.as_deref(), a.arch.as_deref(), a.all).map_err(usage)?;
    let reason = a.reason.as_deref();
    let decide = |lib: Option<&mut CaseLibrary>| store::reject_pending(g, &chosen, reason, lib);
    decide_and_print(&a.cases, json, decide, |out, r| {
        let x = &r.rejected;
        let _ = writeln!(
            out,
            "{}rejected{:#} `{}` for {} of {} (kept in {}){}",
            yellow(),
            yellow(),
            x.variant,
            x.arch,
            x.kernel,
            x.kept_in.display(),
            r.case
                .as_ref()
                .map(|c| format!("; negative case {c}"))
                .unwrap_or_default()
        );
    })
}

/// Runs `decide` (accept or reject the chosen pending variants) with the case library
/// `rec` asks for, and prints its reports: as JSON, or each through `render`.
fn decide_and_print<R: serde::Serialize>(
    rec: &CaseRecording,
    json: bool,
    decide: impl FnOnce(Option<&mut CaseLibrary>) -> Result<Vec<R>, StoreCmdError>,
    render: impl Fn(&mut dyn Write, &R),
) -> Result<ExitCode, String> {
    let mut lib = recording_library(rec);
    let reports = decide(lib.as_mut()).map_err(usage)?;
    if json {
        print_json(&reports);
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = anstream::stdout();
    for r in &reports {
        render(&mut out, r);
    }
    Ok(ExitCode::SUCCESS)
}

/// `cargo kopt revert KERNEL --to VARIANT [--arch A]`.
pub fn revert_to(
    g: &Gathered,
    kernel: &str,
    variant: &str,
    arch: Option<&str>,
    json: bool,
) -> Result<ExitCode, String> {
    let k = commands::find(g, kernel).map_err(|e| e.to_string())?;
    let r = store::revert_to(g, k, variant, arch).map_err(|e| e.to_string())?;
    if json {
        print_json(&r);
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = anstream::stdout();
    for x in &r.replaced {
        let _ = writeln!(
            out,
            "{}replaces{:#} {}",
            yellow(),
            yellow(),
            store::describe_replaced(x)
        );
    }
    let _ = writeln!(
        out,
        "{}: `{}` is the accepted variant for {} again{} ({})",
        r.kernel,
        r.variant,
        r.arch,
        r.region
            .as_ref()
            .map(|x| format!(" where `{x}`"))
            .unwrap_or_default(),
        r.lock
    );
    Ok(ExitCode::SUCCESS)
}

/// `cargo kopt merge DIR...`.
pub fn merge(a: MergeArgs, g: Gathered, json: bool) -> Result<ExitCode, String> {
    let (g, dirs, rec) = (&g, &a.dirs, &a.cases);
    let has_libraries = dirs
        .iter()
        .any(|d| !kopt_store::merge::case_libraries_in(d).is_empty());
    let mut library = if has_libraries {
        recording_library(rec)
    } else {
        None
    };
    let r = store::merge(g, dirs, library.as_mut()).map_err(usage)?;
    if json {
        print_json(&r);
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = anstream::stdout();
    let p = &r.pending;
    if !p.added.is_empty() || !p.unchanged.is_empty() {
        let mut t = Table::new(&["pending", "variant", "run", "from", ""]);
        for (m, what, st) in p
            .added
            .iter()
            .map(|m| (m, "added", green()))
            .chain(p.unchanged.iter().map(|m| (m, "already here", dim())))
        {
            t.row(vec![
                (m.label.clone(), Style::new().bold()),
                (m.variant.clone(), Style::new()),
                (m.run_id.clone(), Style::new()),
                (m.from.display().to_string(), Style::new()),
                (what.to_string(), st),
            ]);
        }
        let _ = write!(out, "{}", t.render());
    }
    let _ = writeln!(
        out,
        "{} pending variant(s) merged, {} already here; run folders: {} copied, {} already here",
        p.added.len(),
        p.unchanged.len(),
        p.runs_copied.len(),
        p.runs_present.len()
    );
    for (path, c) in &r.cases {
        let _ = writeln!(
            out,
            "cases from {}: {} added, {} updated, {} unchanged",
            path.display(),
            c.added,
            c.updated,
            c.unchanged
        );
    }
    for path in &r.cases_skipped {
        let _ = writeln!(
            out,
            "{}not imported{:#}: {} (without --no-cases, it goes into the case library)",
            yellow(),
            yellow(),
            path.display()
        );
    }
    if !p.added.is_empty() {
        let _ = writeln!(out, "review them with `cargo kopt review`");
    }
    Ok(ExitCode::SUCCESS)
}

/// `cargo kopt cases ...`: needs no workspace.
pub fn cases_command(path: &CasesPath, cmd: CasesCommand, json: bool) -> Result<ExitCode, String> {
    let file = cases::library_path(path.path.as_deref()).map_err(|e| e.to_string())?;
    let mut lib = CaseLibrary::open(&file).map_err(|e| e.to_string())?;
    let mut out = anstream::stdout();
    match cmd {
        CasesCommand::List { kind, status } => {
            let status = status
                .as_deref()
                .map(Status::parse)
                .transpose()
                .map_err(|e| e.to_string())?;
            let all = lib
                .list(kind.as_deref(), status)
                .map_err(|e| e.to_string())?;
            if json {
                print_json(&all);
                return Ok(ExitCode::SUCCESS);
            }
            if all.is_empty() {
                let _ = writeln!(
                    out,
                    "no case in {} (import some with `cargo kopt cases import`)",
                    lib.path()
                );
                return Ok(ExitCode::SUCCESS);
            }
            let mut t = Table::new(&["id", "kind", "diagnosis", "outcome", "speedup"]);
            for c in &all {
                let style = if c.is_negative() { yellow() } else { green() };
                t.row(vec![
                    (c.id.clone(), Style::new()),
                    (c.kind.clone(), Style::new()),
                    (c.diagnosis.bottleneck.clone(), Style::new()),
                    (
                        match &c.outcome.failure_class {
                            Some(f) => format!("{} ({f})", c.outcome.status.as_str()),
                            None => c.outcome.status.as_str().to_string(),
                        },
                        style,
                    ),
                    (
                        c.outcome.speedup.map_or("–".into(), |s| format!("{s:.2}x")),
                        Style::new(),
                    ),
                ]);
            }
            let _ = write!(out, "{}", t.render());
            let _ = writeln!(out, "{} case(s) in {}", all.len(), lib.path());
        }
        CasesCommand::Show { id } => {
            let c = lib.get(&id).map_err(|e| e.to_string())?.ok_or_else(|| {
                format!(
                    "no case `{id}` in {} (`cargo kopt cases list` lists them)",
                    lib.path()
                )
            })?;
            if json {
                print_json(&c);
                return Ok(ExitCode::SUCCESS);
            }
            let b = Style::new().bold();
            let _ = writeln!(out, "{b}{}{b:#}", c.id);
            let _ = writeln!(out, "kind: {}", c.kind);
            let _ = writeln!(
                out,
                "outcome: {}{}{}",
                c.outcome.status.as_str(),
                c.outcome
                    .failure_class
                    .as_ref()
                    .map(|f| format!(" ({f})"))
                    .unwrap_or_default(),
                c.outcome
                    .speedup
                    .map(|s| format!(", {s:.2}x"))
                    .unwrap_or_default()
            );
            let o = &c.origin;
            let _ = writeln!(
                out,
                "origin: {}",
                [
                    o.repo.clone(),
                    o.krate.clone(),
                    Some(o.kernel.clone()),
                    o.variant.clone(),
                    o.arch.clone()
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" / ")
            );
            let _ = writeln!(
                out,
                "\n{b}diagnosis{b:#}: {}\n{}",
                c.diagnosis.bottleneck, c.diagnosis.explanation
            );
            let _ = writeln!(out, "\n{b}change{b:#}:\n{}", c.change);
            let _ = writeln!(out, "\n{b}structure{b:#}: {}", c.features.structure);
            if !c.features.metrics.is_empty() {
                let _ = writeln!(out, "\n{b}metrics{b:#}:");
                for (k, v) in &c.features.metrics {
                    let _ = writeln!(out, "  {k:<32} {v}");
                }
            }
            let _ = writeln!(out, "\n{b}source tokens{b:#}: {}", c.features.source_tokens);
        }
        CasesCommand::Search {
            metrics,
            text,
            source,
            kind,
            k,
        } => {
            let q = store::case_query(&metrics, text, source.as_deref(), kind).map_err(usage)?;
            let found = lib.search(&q, k).map_err(|e| e.to_string())?;
            if json {
                print_json(&found);
                return Ok(ExitCode::SUCCESS);
            }
            if found.is_empty() {
                let _ = writeln!(out, "no similar case in {}", lib.path());
                return Ok(ExitCode::SUCCESS);
            }
            let mut t = Table::new(&["score", "metrics", "text", "id", "diagnosis", "outcome"]);
            for n in &found {
                let outcome = if n.negative {
                    (
                        format!("NEGATIVE: {}", n.case.outcome.status.as_str()),
                        yellow(),
                    )
                } else {
                    (
                        format!(
                            "accepted{}",
                            n.case
                                .outcome
                                .speedup
                                .map(|s| format!(" {s:.2}x"))
                                .unwrap_or_default()
                        ),
                        green(),
                    )
                };
                t.row(vec![
                    (format!("{:.3}", n.score), Style::new().bold()),
                    (format!("{:.3}", n.metric_similarity), Style::new()),
                    (format!("{:.3}", n.text_similarity), Style::new()),
                    (n.case.id.clone(), Style::new()),
                    (n.case.diagnosis.bottleneck.clone(), Style::new()),
                    outcome,
                ]);
            }
            let _ = write!(out, "{}", t.render());
        }
        CasesCommand::Import { path, repo_name } => {
            let (report, notes) = store::import_cases(&mut lib, &path, repo_name).map_err(usage)?;
            if json {
                print_json(&report);
                return Ok(ExitCode::SUCCESS);
            }
            for n in &notes {
                let _ = writeln!(out, "{}note{:#}: {n}", yellow(), yellow());
            }
            for s in &report.skipped {
                let _ = writeln!(out, "{}skipped{:#}: {s}", yellow(), yellow());
            }
            let _ = writeln!(
                out,
                "imported into {}: {} added, {} updated, {} unchanged",
                lib.path(),
                report.added,
                report.updated,
                report.unchanged
            );
        }
        CasesCommand::Export { out: file } => {
            let n = match &file {
                Some(f) => {
                    let mut buf = Vec::new();
                    let n = lib.export_jsonl(&mut buf).map_err(|e| e.to_string())?;
                    kopt_spec::files::write_atomic(f, &buf)
                        .map_err(|e| format!("{}: {e}", f.display()))?;
                    n
                }
                None => {
                    // Plain bytes: JSON lines must not be touched by colour handling.
                    let stdout = std::io::stdout();
                    let mut lock = stdout.lock();
                    lib.export_jsonl(&mut lock).map_err(|e| e.to_string())?
                }
            };
            if let Some(f) = file {
                let _ = writeln!(
                    anstream::stderr(),
                    "exported {n} case(s) to {}",
                    f.display()
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
