//! `cargo kopt`: glue between the command line and `cargo_kopt`'s library code.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anstyle::{AnsiColor, Style};
use cargo_kopt::commands::{self, Edit};
use cargo_kopt::gather::{self, Gathered, Selection};
use cargo_kopt::store_cli;
use cargo_kopt::table::Table;
use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "cargo", bin_name = "cargo", styles = clap::builder::Styles::styled())]
enum Cargo {
    /// Verified, explained CUDA kernel variants for the kernels of this workspace.
    Kopt(Cli),
}

#[derive(Args)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct Global {
    /// Path to Cargo.toml.
    #[arg(long, global = true, value_name = "PATH")]
    manifest_path: Option<PathBuf>,
    /// Package(s) to work on (default: every member that depends on kopt).
    #[arg(short, long = "package", global = true, value_name = "SPEC")]
    package: Vec<String>,
    /// Work on every workspace member (the default).
    #[arg(long, global = true)]
    workspace: bool,
    /// Members to leave out.
    #[arg(long, global = true, value_name = "SPEC")]
    exclude: Vec<String>,
    /// Output format.
    #[arg(long, global = true, value_enum, default_value_t = MessageFormat::Human)]
    message_format: MessageFormat,
    /// Colouring (NO_COLOR is honoured under `auto`).
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    color: ColorChoice,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MessageFormat {
    Human,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum ColorChoice {
    Auto,
    Always,
    Never,
}

#[derive(Subcommand)]
enum Command {
    /// List every annotated kernel with its shapes, tunables and accepted variants.
    List,
    /// Check, without a GPU, that every lock file and variant is intact and current.
    Check,
    /// Record a hand-made variant from kopt/<KERNEL>/<VARIANT>/ in the lock file
    /// (marked `verified_by = "manual"`: kopt's verification has not run on it).
    Pin {
        kernel: String,
        variant: String,
        /// Architecture, e.g. sm_90.
        #[arg(long)]
        arch: String,
        /// Only for launches where this condition over the scalar arguments holds.
        #[arg(long)]
        region: Option<String>,
    },
    /// Drop the accepted variant(s) of a kernel: the reference runs instead. With
    /// `--to VARIANT`, make an earlier variant (its folder still in kopt/KERNEL/) the
    /// accepted one again, if it was verified against today's reference and annotation.
    Revert {
        kernel: String,
        /// Only this architecture (default: all; with --to, the variant's own).
        #[arg(long)]
        arch: Option<String>,
        /// What runs afterwards: `reference` (the default) or an earlier variant.
        #[arg(long, value_name = "VARIANT|reference")]
        to: Option<String>,
    },
    // --- store commands (issue 4)
    /// List the pending variants (verified winners of optimisation runs) awaiting review.
    Pending,
    /// Review pending variants one by one: rationale, figures, evidence, what they
    /// replace, source diff. Keys: a accept, r reject, s skip, d full diff, q quit.
    Review {
        /// Only this kernel's pending variants.
        kernel: Option<String>,
        /// Only this architecture's.
        #[arg(long)]
        arch: Option<String>,
        #[command(flatten)]
        cases: store_cli::CaseRecording,
    },
    /// Accept pending variant(s) without review: writes kopt/KERNEL/VARIANT/ and the lock
    /// file, printing any accepted variant it replaces.
    Accept {
        kernel: Option<String>,
        /// Only this architecture's.
        #[arg(long)]
        arch: Option<String>,
        /// Every pending variant selected (of KERNEL, or of the workspace).
        #[arg(long)]
        all: bool,
        /// Accept under another variant name (when its own is taken).
        #[arg(long = "as", value_name = "NAME")]
        rename: Option<String>,
        #[command(flatten)]
        cases: store_cli::CaseRecording,
    },
    /// Reject pending variant(s): kept in their run's folder, and in the case library as
    /// negative cases.
    Reject {
        kernel: Option<String>,
        /// Only this architecture's.
        #[arg(long)]
        arch: Option<String>,
        /// Every pending variant selected.
        #[arg(long)]
        all: bool,
        /// Why, for the run's journal.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        cases: store_cli::CaseRecording,
    },
    /// The case library: past diagnoses and their outcomes (list, show, search, import,
    /// export).
    Cases {
        #[command(flatten)]
        library: store_cli::CasesPath,
        #[command(subcommand)]
        command: store_cli::CasesCommand,
    },
    // --- end of store commands (issue 4)
}

fn main() -> ExitCode {
    let Cargo::Kopt(cli) = Cargo::parse();
    match cli.global.color {
        ColorChoice::Always => anstream::ColorChoice::Always.write_global(),
        ColorChoice::Never => anstream::ColorChoice::Never.write_global(),
        ColorChoice::Auto => {}
    }
    match run(cli) {
        Ok(code) => code,
        Err(msg) => {
            let red = Style::new().fg_color(Some(AnsiColor::Red.into())).bold();
            let _ = writeln!(anstream::stderr(), "{red}error{red:#}: {msg}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    let g = &cli.global;
    let json = g.message_format == MessageFormat::Json;
    // The case library needs no workspace.
    let command = match cli.command {
        Command::Cases { library, command } => {
            return store_cli::cases_command(&library, command, json)
        }
        other => other,
    };
    let sel = Selection {
        manifest_path: g.manifest_path.clone(),
        packages: if g.workspace {
            Vec::new()
        } else {
            g.package.clone()
        },
        exclude: g.exclude.clone(),
    };
    let gathered = gather::gather(&sel).map_err(|e| e.to_string())?;
    match command {
        Command::List => {
            let listed = commands::list(&gathered);
            if json {
                print_json(&listed);
            } else {
                print_list(&gathered, &listed);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Check => {
            let problems = commands::check(&gathered);
            if json {
                print_json(&serde_json::json!({
                    "kernels": gathered.kernels.len(),
                    "ok": problems.is_empty(),
                    "problems": problems,
                }));
            } else {
                print_check(&gathered, &problems);
            }
            Ok(if problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Pin {
            kernel,
            variant,
            arch,
            region,
        } => {
            let k = commands::find(&gathered, &kernel).map_err(|e| e.to_string())?;
            let edit =
                commands::pin(k, &variant, &arch, region.as_deref()).map_err(|e| e.to_string())?;
            report_edit(&edit, json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Revert { kernel, arch, to } => match to.as_deref() {
            Some(variant) if variant != "reference" => {
                store_cli::revert_to(&gathered, &kernel, variant, arch.as_deref(), json)
            }
            _ => {
                let k = commands::find(&gathered, &kernel).map_err(|e| e.to_string())?;
                let edit = commands::revert(k, arch.as_deref()).map_err(|e| e.to_string())?;
                report_edit(&edit, json);
                Ok(ExitCode::SUCCESS)
            }
        },
        // --- store commands (issue 4)
        Command::Pending => Ok(store_cli::pending(&gathered, json)),
        Command::Review {
            kernel,
            arch,
            cases,
        } => store_cli::review(&gathered, kernel.as_deref(), arch.as_deref(), &cases, json),
        Command::Accept {
            kernel,
            arch,
            all,
            rename,
            cases,
        } => store_cli::accept(
            &gathered,
            kernel.as_deref(),
            arch.as_deref(),
            all,
            rename.as_deref(),
            &cases,
            json,
        ),
        Command::Reject {
            kernel,
            arch,
            all,
            reason,
            cases,
        } => store_cli::reject(
            &gathered,
            kernel.as_deref(),
            arch.as_deref(),
            all,
            reason.as_deref(),
            &cases,
            json,
        ),
        Command::Cases { .. } => unreachable!("handled before gathering"),
        // --- end of store commands (issue 4)
    }
}

fn print_json<T: serde::Serialize>(v: &T) {
    let mut out = anstream::stdout();
    let _ = writeln!(out, "{}", serde_json::to_string(v).expect("serialises"));
}

fn green() -> Style {
    Style::new().fg_color(Some(AnsiColor::Green.into()))
}
fn yellow() -> Style {
    Style::new().fg_color(Some(AnsiColor::Yellow.into()))
}
fn red() -> Style {
    Style::new().fg_color(Some(AnsiColor::Red.into())).bold()
}
fn dim() -> Style {
    Style::new().dimmed()
}

fn print_list(g: &Gathered, listed: &[commands::ListedKernel]) {
    let mut out = anstream::stdout();
    if listed.is_empty() {
        let _ = writeln!(
            out,
            "no #[kopt::kernel] found in {} package(s) that depend on kopt",
            g.packages.len()
        );
        return;
    }
    let mut t = Table::new(&[
        "crate",
        "kernel",
        "reference",
        "shapes",
        "tunables",
        "variants",
    ]);
    for k in listed {
        let variants = if k.variants.is_empty() {
            ("reference everywhere".to_string(), dim())
        } else {
            let any_bad = k.variants.iter().any(|v| v.status != "active");
            let text = k
                .variants
                .iter()
                .map(|v| {
                    let region = v
                        .region
                        .as_ref()
                        .map(|r| format!(" where {r}"))
                        .unwrap_or_default();
                    let status = if v.status == "active" {
                        String::new()
                    } else {
                        format!(" [{}]", v.status.to_uppercase())
                    };
                    format!("{}: {}{region}{status}", v.arch, v.variant)
                })
                .collect::<Vec<_>>()
                .join(", ");
            (text, if any_bad { red() } else { green() })
        };
        t.row(vec![
            (k.package.clone(), Style::new()),
            (k.kernel.clone(), Style::new().bold()),
            (format!("{} ({})", k.reference, k.entry), Style::new()),
            (k.shapes.len().to_string(), Style::new()),
            (
                if k.tunables.is_empty() {
                    "–".into()
                } else {
                    k.tunables.join(" ")
                },
                Style::new(),
            ),
            variants,
        ]);
    }
    let _ = write!(out, "{}", t.render());
    for k in listed {
        for v in k.variants.iter().filter(|v| v.status != "active") {
            let _ = writeln!(
                out,
                "{}{}/{} for {} is {}: {}{:#}",
                yellow(),
                k.kernel,
                v.variant,
                v.arch,
                v.status,
                v.reason.as_deref().unwrap_or(""),
                yellow()
            );
        }
    }
    if !g.errors.is_empty() {
        let _ = writeln!(
            out,
            "{}{} annotation(s) do not parse; `cargo kopt check` lists them{:#}",
            red(),
            g.errors.len(),
            red()
        );
    }
}

fn print_check(g: &Gathered, problems: &[kopt_spec::store::Problem]) {
    let mut out = anstream::stdout();
    let variants: usize = g.kernels.iter().map(|k| k.state.entries.len()).sum();
    if problems.is_empty() {
        let _ = writeln!(
            out,
            "{}ok{:#}: {} kernel(s), {} accepted variant(s): every lock file and variant is intact and current",
            green(),
            green(),
            g.kernels.len(),
            variants
        );
        return;
    }
    for p in problems {
        let _ = writeln!(
            out,
            "{}problem{:#}: {} ({})",
            red(),
            red(),
            p.problem,
            p.path
        );
        let _ = writeln!(out, "  {}fix{:#}: {}", green(), green(), p.fix);
    }
    let _ = writeln!(
        out,
        "{} problem(s) in {} kernel(s)",
        problems.len(),
        g.kernels.len()
    );
}

fn report_edit(edit: &Edit, json: bool) {
    if json {
        print_json(edit);
    } else {
        let _ = writeln!(
            anstream::stdout(),
            "{}: {} ({})",
            edit.kernel,
            edit.summary,
            edit.lock
        );
    }
}
