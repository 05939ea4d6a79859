//! `cargo kopt`: glue between the command line and `cargo_kopt`'s library code.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anstyle::{AnsiColor, Style};
use cargo_kopt::commands::{self, Edit};
use cargo_kopt::gather::{self, Gathered, Selection};
use cargo_kopt::store_cli;
use cargo_kopt::style::{dim, green, red, yellow};
use cargo_kopt::table::Table;
use cargo_kopt::{eval, partition, render, search};
use clap::{Args, Parser, Subcommand, ValueEnum};
use kopt_engine::worker::WorkerKind;

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
    List {
        #[command(flatten)]
        partition: PartitionArg,
    },
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
    /// List the variant folders under kopt/KERNEL/ that no lock entry names (superseded
    /// variants, kept for `revert --to`); with --delete, remove them. Their history stays
    /// in git. A folder kopt never accepted (no claim in its rationale.json) is listed but
    /// kept.
    Gc {
        /// Only these kernels (default: every kernel of the selected packages).
        kernels: Vec<String>,
        /// Remove the folders listed (default: only list them).
        #[arg(long)]
        delete: bool,
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
    /// Bring back the work of other machines (the parts of a `--partition`ed run): the
    /// pending variants in each DIR (a target folder, its kopt/ folder, or a pending area
    /// copied back) join this workspace's, with their run folders; two different variants
    /// for one kernel and architecture are refused and nothing is merged. Case libraries
    /// at a DIR's root (cases.sqlite, cases.jsonl) are imported, each case once.
    Merge {
        #[arg(required = true, value_name = "DIR")]
        dirs: Vec<PathBuf>,
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
    // --- evaluation engine commands (issue 3)
    /// Re-verify every accepted variant on this GPU: numerics on fresh inputs, held-out
    /// shapes, anti-cheat checks, the performance watchdog, compute-sanitizer.
    Verify {
        /// Kernels to verify (default: all).
        kernels: Vec<String>,
        #[command(flatten)]
        eval: EvalArgs,
        /// Skip compute-sanitizer.
        #[arg(long)]
        no_sanitize: bool,
        /// One evaluation worker per GPU, variants verified across them: `all` or
        /// ordinals (`0,1`). Without it, the one GPU of `--device`.
        #[arg(long, value_name = "all|0,1,...", value_parser = clap::builder::ValueParser::new(|s: &str| s.parse::<kopt_engine::pool::DeviceSelection>()), conflicts_with = "device")]
        devices: Option<kopt_engine::pool::DeviceSelection>,
        #[command(flatten)]
        partition: PartitionArg,
    },
    /// Time the reference and the active variant of each kernel on each declared shape.
    Bench {
        kernels: Vec<String>,
        #[command(flatten)]
        eval: EvalArgs,
        #[command(flatten)]
        partition: PartitionArg,
    },
    /// List the GPUs with their measured ceilings.
    Devices {
        /// Measure the ceilings again instead of using the cached ones.
        #[arg(long)]
        refresh: bool,
    },
    // --- optimize (issue 7)
    /// Optimise kernels with an agent: propose, review, verify, feed back; verified
    /// winners are left as pending variants (`cargo kopt review`).
    Optimize {
        kernels: Vec<String>,
        /// heuristic (no model), openai:MODEL, anthropic:MODEL, cmd:PATH or replay:PATH.
        #[arg(long, env = "KOPT_AGENT", default_value = "heuristic")]
        agent: String,
        /// A second backend that critiques each proposal before verification.
        #[arg(long, env = "KOPT_REVIEWER")]
        reviewer: Option<String>,
        /// Each kernel's budget: rounds=N,candidates=N,minutes=N,tokens=N,dollars=N (any
        /// subset).
        #[arg(long)]
        budget: Option<String>,
        /// The whole run's budget, over all its kernels together:
        /// candidates=N,minutes=N,tokens=N,dollars=N (any subset; none by default). A
        /// kernel the run has no room left for does not start.
        #[arg(long, value_name = "LIMITS")]
        run_budget: Option<String>,
        /// Guidance from a person (resumes after an escalation).
        #[arg(long)]
        hint: Option<String>,
        /// The context's size limit, in tokens.
        #[arg(long, default_value_t = 60_000)]
        context_tokens: usize,
        /// The run's id: a new run with this id, or, where its journal exists, that run
        /// resumed (as `--resume`).
        #[arg(long)]
        run: Option<String>,
        /// Go on with a run that was stopped (killed, interrupted): kernels whose loop
        /// had finished are not run again; the others start where they started, the agent
        /// answered from the recorded session while the questions are the recorded ones,
        /// and recorded candidates answered from their verdicts in the journal. Give the
        /// run's kernels, agent, reviewer, hint, thresholds and --no-sanitize again; budgets
        /// may change.
        #[arg(long, value_name = "RUN_ID", conflicts_with = "run")]
        resume: Option<String>,
        /// Profile the reference without Nsight Compute (engine figures and the source).
        #[arg(long)]
        no_ncu: bool,
        /// Let a candidate become the best without compute-sanitizer's memcheck, racecheck,
        /// initcheck and synccheck (its evidence then says they were not run).
        #[arg(long)]
        no_sanitize: bool,
        /// Start from the reference even where a variant is accepted for the GPU's
        /// architecture (by default the loop starts from that variant, verified again, and
        /// a candidate must beat it).
        #[arg(long)]
        from_reference: bool,
        #[command(flatten)]
        win: WinArgs,
        /// One evaluation worker per GPU, kernels scheduled across them: `all` or
        /// ordinals (`0,1`). Without it, the one GPU of `--device`.
        #[arg(long, value_name = "all|0,1,...", value_parser = clap::builder::ValueParser::new(|s: &str| s.parse::<kopt_engine::pool::DeviceSelection>()), conflicts_with = "device")]
        devices: Option<kopt_engine::pool::DeviceSelection>,
        #[command(flatten)]
        partition: PartitionArg,
        #[command(flatten)]
        eval: EvalArgs,
    },
    // --- mcp (issue 8)
    /// Serve the verified loop as Model Context Protocol tools over stdio, for a coding
    /// agent to drive: list_kernels, get_context, profile, propose_variant, search,
    /// list_pending, explain_verdict. Winners become pending variants; nothing committed
    /// is written (`cargo kopt review` accepts).
    Mcp {
        /// The agent's name, recorded in the journal and the rationales as `mcp:NAME`.
        #[arg(long, default_value = "agent")]
        agent_name: String,
        /// Candidates verified at most in the session.
        #[arg(long, default_value_t = 24)]
        max_proposals: u32,
        /// Search evaluations at most in the session.
        #[arg(long, default_value_t = 200)]
        max_search_evals: usize,
        /// Largest candidate source or diff, in bytes.
        #[arg(long, default_value_t = 65536)]
        max_candidate_bytes: usize,
        /// Profile without Nsight Compute.
        #[arg(long)]
        no_ncu: bool,
        /// Start every kernel from the reference even where a variant is accepted for the
        /// GPU's architecture (by default the session starts from that variant, verified
        /// again, and a proposal must beat it).
        #[arg(long)]
        from_reference: bool,
        #[command(flatten)]
        win: WinArgs,
        #[command(flatten)]
        eval: EvalArgs,
    },
    // --- end of mcp (issue 8)
    /// Write one self-contained HTML report (SVG charts, no scripts): per kernel and
    /// shape the reference against the active version and its share of the roofline, a
    /// roofline plot, the search's convergence, and the verification evidence of the
    /// committed and pending variants. Sections without data say which file fills them.
    Report {
        /// The JSON of `cargo kopt bench --message-format json`.
        #[arg(long, value_name = "FILE")]
        bench: Option<PathBuf>,
        /// A file written by `cargo kopt search-bench KERNEL --json-out FILE` (repeat for
        /// several kernels).
        #[arg(long = "search-bench", value_name = "FILE")]
        search_bench: Vec<PathBuf>,
        /// A pending root holding <package>/<kernel>/<arch>/ folders (default: the
        /// workspace's <target>/kopt/pending).
        #[arg(long, value_name = "DIR")]
        pending: Option<PathBuf>,
        /// The report's title.
        #[arg(long)]
        title: Option<String>,
        /// A date or note shown as when the report was generated (no clock is read, so
        /// the same inputs give the same file).
        #[arg(long, value_name = "TEXT")]
        generated: Option<String>,
        /// Where to write the HTML (default: <target>/kopt/report.html).
        #[arg(short = 'o', long = "out", value_name = "FILE")]
        out: Option<PathBuf>,
    },
    // --- profile (issue 5)
    /// Profile one version of a kernel on one declared shape: the engine's figures,
    /// Nsight Compute (where `ncu` exists), PTX and SASS, and the source's structure,
    /// summarised as a bottleneck snapshot (classification, ranked findings with their
    /// evidence). Every raw artefact stays in <target>/kopt/runs/<run-id>/profile/KERNEL/.
    /// Exit code: 0 classified, 1 nothing could be measured (what is missing is named), 2
    /// error.
    Profile {
        kernel: String,
        /// A declared shape, by index or label (default: the first).
        #[arg(long, value_name = "INDEX|LABEL")]
        shape: Option<String>,
        /// A committed variant to profile (default: the reference).
        #[arg(long)]
        variant: Option<String>,
        /// GPU ordinal.
        #[arg(long, default_value_t = 0)]
        device: usize,
        /// Nsight Compute's `ncu` (default: PATH, $CUDA_HOME/bin, /usr/local/cuda/bin,
        /// /opt/nvidia/nsight-compute/*/).
        #[arg(long, value_name = "PATH", env = "KOPT_NCU")]
        ncu: Option<PathBuf>,
        /// Do not run Nsight Compute (wins over --ncu and KOPT_NCU).
        #[arg(long)]
        no_ncu: bool,
        /// Seconds an ncu run may take before it is stopped.
        #[arg(long, default_value_t = 600, value_name = "SECONDS")]
        ncu_timeout: u64,
        /// Architecture to compile PTX and SASS for when no GPU says (e.g. sm_90).
        #[arg(long)]
        arch: Option<String>,
        #[command(flatten)]
        library: store_cli::CasesPath,
        /// Take the confidence from the rules' margin, not from the case library.
        #[arg(long)]
        no_cases: bool,
        /// Measure again even when an identical evaluation is cached.
        #[arg(long)]
        no_cache: bool,
    },
    // --- end of profile (issue 5)
    // --- search (issue 6)
    /// Search a kernel's tunables, launch geometry and compile options on this GPU;
    /// prints the best verified configuration per shape and the leaderboard. Runs are
    /// journalled under target/kopt/runs/ and resume with --resume RUN_ID.
    Search {
        kernel: String,
        #[arg(long, value_enum, default_value_t = StrategyArg::Hill)]
        strategy: StrategyArg,
        /// Seed the search from the reference's bottleneck snapshot (the built-in
        /// heuristic's parameter matrix).
        #[arg(long)]
        seeded: bool,
        /// An agent's parameter matrix (JSON), instead of the heuristic's; implies --seeded.
        #[arg(long, value_name = "FILE")]
        matrix: Option<PathBuf>,
        /// A bottleneck snapshot instead of measuring the reference: `cargo kopt
        /// profile`'s snapshot.json (with Nsight Compute's achieved occupancy and its
        /// classification), or SnapshotHints JSON; implies --seeded.
        #[arg(long, value_name = "FILE")]
        hints: Option<PathBuf>,
        /// Points to evaluate at most (default: all for exhaustive, else min(100, valid)).
        #[arg(long, value_name = "N")]
        budget_evals: Option<usize>,
        /// Wall time at most, seconds.
        #[arg(long, value_name = "S")]
        budget_seconds: Option<f64>,
        /// The strategy's random seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Compile-option axes: `standard` (fast math where outputs are floating point,
        /// --extra-device-vectorization, --maxrregcount 32/64/128/255) or `none`.
        #[arg(long, value_enum, default_value_t = OptionsArg::Standard)]
        options: OptionsArg,
        /// Go on with an interrupted run (same kernel, strategy, seed and options).
        #[arg(long, value_name = "RUN_ID")]
        resume: Option<String>,
        /// Rounds an interesting point stays in the neighbourhood.
        #[arg(long, default_value_t = 8)]
        keep_rounds: usize,
        /// CPU threads compiling ahead (default: the cores, at most 16).
        #[arg(long)]
        threads: Option<usize>,
        /// Skip the full verification of the best points at the end.
        #[arg(long)]
        no_verify: bool,
        /// Save the best point as a pending variant (for `cargo kopt review`) when its
        /// full verification passes and it beats the reference by 3%.
        #[arg(long, conflicts_with = "no_verify")]
        save: bool,
        #[command(flatten)]
        eval: EvalArgs,
    },
    /// The convergence benchmark: an exhaustive run measured once, then each strategy with
    /// and without the profile seed over --seeds seeds: median evaluations and seconds to
    /// come within --target-pct of the best, evaluations per second.
    SearchBench {
        kernel: String,
        #[arg(long, default_value_t = 10)]
        seeds: u64,
        /// Within this many percent of the exhaustive best counts as converged.
        #[arg(long, default_value_t = 2.0)]
        target_pct: f64,
        /// Measure every trial again on the device (wall clock) instead of replaying the
        /// exhaustive run's measurements.
        #[arg(long)]
        live: bool,
        /// Include the compile-option axes in the space (default: the tunables only).
        #[arg(long)]
        with_options: bool,
        /// Strategies to compare (default: all).
        #[arg(long, value_enum, value_delimiter = ',')]
        strategies: Vec<StrategyArg>,
        #[arg(long)]
        threads: Option<usize>,
        /// Also write the report as JSON to FILE.
        #[arg(long, value_name = "FILE")]
        json_out: Option<PathBuf>,
        #[command(flatten)]
        eval: EvalArgs,
    },
    // --- end of search (issue 6)
    /// Print the evaluation job (checks only) of a kernel's shape, as the worker reads it:
    /// for running the worker by hand under a profiler or sanitizer.
    #[command(name = "__job", hide = true)]
    Job {
        kernel: String,
        /// The declared shape, by index or label.
        #[arg(long, default_value = "0", value_name = "INDEX|LABEL")]
        shape: String,
        /// A committed variant to use as the candidate (default: the reference).
        #[arg(long)]
        variant: Option<String>,
    },
    /// The evaluation worker (started by kopt itself).
    #[command(name = "__worker", hide = true)]
    Worker {
        #[arg(long, default_value_t = 0)]
        device: usize,
        #[arg(long)]
        fake: bool,
        #[arg(long)]
        oneshot: Option<PathBuf>,
        /// With --oneshot: write the report to this file instead of stdout.
        #[arg(long, requires = "oneshot")]
        report_file: Option<PathBuf>,
    },
}

// --- search (issue 6)
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StrategyArg {
    Exhaustive,
    Random,
    Hill,
    Evolution,
}

impl StrategyArg {
    fn kind(self) -> kopt_search::StrategyKind {
        use kopt_search::StrategyKind as K;
        match self {
            StrategyArg::Exhaustive => K::Exhaustive,
            StrategyArg::Random => K::Random,
            StrategyArg::Hill => K::Hill,
            StrategyArg::Evolution => K::Evolution,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OptionsArg {
    Standard,
    None,
}

impl OptionsArg {
    fn axes(self) -> kopt_search::OptionAxes {
        match self {
            OptionsArg::Standard => kopt_search::OptionAxes::standard(),
            OptionsArg::None => kopt_search::OptionAxes::none(),
        }
    }
}
// --- end of search (issue 6)

/// `--partition`: this machine's share of the kernels.
#[derive(Args, Clone)]
struct PartitionArg {
    /// Only this part of the workspace's kernels: `slice:M/N` (the M-th of every N in
    /// name order) or `hash:M/N` (by a fixed hash of `package::kernel`), M from 1.
    #[arg(long, value_name = "slice:M/N|hash:M/N", value_parser = clap::builder::ValueParser::new(|s: &str| s.parse::<cargo_kopt::partition::Partition>()))]
    partition: Option<cargo_kopt::partition::Partition>,
}

/// What a candidate must gain to be a new best, for `optimize` and `mcp`.
#[derive(Args, Clone)]
struct WinArgs {
    /// A candidate is a new best when it is faster than the best by more than this
    /// percentage on some shape...
    #[arg(long, value_name = "PCT", default_value_t = 3.0, value_parser = parse_gain_pct)]
    min_gain: f64,
    /// ... or not slower on any shape (beyond that shape's measured timing noise) and
    /// faster by more than this percentage in geometric mean over the shapes. Both are
    /// raised to twice the timing noise measured on the starting version, never lowered
    /// below it.
    #[arg(long, value_name = "PCT", default_value_t = 1.0, value_parser = parse_gain_pct)]
    min_uniform_gain: f64,
}

impl WinArgs {
    fn rules(&self) -> kopt_agent::run::Rules {
        kopt_agent::run::Rules {
            min_gain: self.min_gain / 100.0,
            min_uniform_gain: self.min_uniform_gain / 100.0,
            ..Default::default()
        }
    }
}

#[derive(Args, Clone)]
struct EvalArgs {
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Measure again even when an identical evaluation is cached.
    #[arg(long)]
    no_cache: bool,
    /// Tolerated slowdown against the best, percent.
    #[arg(long, default_value_t = 3.0)]
    threshold: f64,
    /// Seconds without progress after which a kernel counts as hung (a step whose
    /// launches the reference's measured time predicts to take longer is allowed ten
    /// times that prediction).
    #[arg(long, default_value_t = 30)]
    step_timeout: u64,
}

impl EvalArgs {
    fn settings(&self) -> eval::Settings {
        eval::Settings {
            threshold: self.threshold / 100.0,
            use_cache: !self.no_cache,
            device: self.device,
            ..eval::Settings::default()
        }
    }
}

fn main() -> ExitCode {
    let Cargo::Kopt(cli) = Cargo::parse();
    if let Command::Worker {
        device,
        fake,
        oneshot,
        report_file,
    } = &cli.command
    {
        let kind = if *fake {
            WorkerKind::Fake { device: *device }
        } else {
            WorkerKind::Cuda { device: *device }
        };
        let code = match oneshot {
            Some(job) => kopt_engine::worker::oneshot(kind, job, report_file.as_deref()),
            None => kopt_engine::worker::serve(kind),
        };
        return ExitCode::from(code as u8);
    }
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
    let mut gathered = gather::gather(&sel).map_err(|e| e.to_string())?;
    match command {
        Command::List { partition } => {
            partition::select(&mut gathered, partition.partition.as_ref());
            let listed = commands::list(&gathered);
            if json {
                print_json(&listed);
            } else {
                print_list(&gathered, &listed);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Check => {
            let commands::Checked {
                mut problems,
                notes: audit_notes,
            } = commands::check(&gathered);
            let compiled = cargo_kopt::compile_check::compile_check(&gathered);
            problems.extend(compiled.problems().iter().cloned());
            if json {
                print_json(&serde_json::json!({
                    "kernels": gathered.kernels.len(),
                    "ok": problems.is_empty(),
                    "problems": problems,
                    "notes": gathered.kernels.iter().flat_map(|k| k.notes.iter().map(move |n| format!("{}::{}: {n}", k.package, k.spec.name))).chain(audit_notes.iter().cloned()).collect::<Vec<_>>(),
                    "compile": compiled,
                }));
            } else {
                print_compile_check(&gathered, &compiled);
                print_audit_notes(&audit_notes);
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
        Command::Gc { kernels, delete } => {
            check_names(&gathered, &kernels)?;
            store_cli::gc(&gathered, &kernels, delete, json)
        }
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
        Command::Merge { dirs, cases } => store_cli::merge(&gathered, &dirs, &cases, json),
        Command::Cases { .. } => unreachable!("handled before gathering"),
        // --- end of store commands (issue 4)
        Command::Verify {
            kernels,
            eval: args,
            no_sanitize,
            devices,
            partition,
        } => {
            check_names(&gathered, &kernels)?;
            partition::select(&mut gathered, partition.partition.as_ref());
            let mut settings = args.settings();
            settings.sanitize = !no_sanitize;
            let mut pool = eval::pool(&gathered, &settings, devices.as_ref())?;
            for (_, engine) in pool.engines_mut() {
                engine.worker.step_timeout = std::time::Duration::from_secs(args.step_timeout);
            }
            let bar = progress_bar(json);
            let verified = eval::verify(&gathered, &kernels, &mut pool, &settings, &mut |m| {
                bar.say(m)
            })?;
            bar.finish_and_clear();
            let ok = verified.outcomes.iter().all(|o| o.passed());
            if json {
                print_json(&serde_json::json!({
                    "device": verified.devices.first(),
                    "devices": verified.devices,
                    "ceilings": verified.ceilings,
                    "ok": ok,
                    "variants": verified.outcomes,
                }));
            } else {
                render::verify(&verified);
            }
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Bench {
            kernels,
            eval: args,
            partition,
        } => {
            check_names(&gathered, &kernels)?;
            partition::select(&mut gathered, partition.partition.as_ref());
            let settings = args.settings();
            let mut engine = eval::engine(&gathered, &settings)?;
            engine.worker.step_timeout = std::time::Duration::from_secs(args.step_timeout);
            let bar = progress_bar(json);
            let file = eval::bench(&gathered, &kernels, &mut engine, &settings, &mut |m| {
                bar.say(m)
            })
            .map_err(|e| e.to_string())?;
            bar.finish_and_clear();
            let failed = file.rows.iter().any(|r| r.problem.is_some());
            if json {
                print_json(&file);
            } else {
                render::bench(&file);
            }
            Ok(if failed {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Devices { refresh } => {
            let settings = eval::Settings::default();
            let count = eval::device_count()?;
            let mut list = Vec::new();
            for d in 0..count {
                let mut engine = eval::engine(
                    &gathered,
                    &eval::Settings {
                        device: d,
                        ..settings.clone()
                    },
                )?;
                let info = engine.device().map_err(|e| e.to_string())?;
                let c = engine.ceilings(refresh).map_err(|e| e.to_string())?;
                list.push((info, c));
            }
            if json {
                print_json(
                    &list
                        .iter()
                        .map(|(d, c)| serde_json::json!({ "device": d, "ceilings": c }))
                        .collect::<Vec<_>>(),
                );
            } else {
                render::devices(&list);
            }
            Ok(ExitCode::SUCCESS)
        }
        // --- optimize (issue 7)
        Command::Optimize {
            kernels,
            agent,
            reviewer,
            budget,
            run_budget,
            hint,
            context_tokens,
            run,
            resume,
            no_ncu,
            no_sanitize,
            from_reference,
            win,
            devices,
            partition,
            eval: args,
        } => {
            check_names(&gathered, &kernels)?;
            partition::select(&mut gathered, partition.partition.as_ref());
            let opts = cargo_kopt::optimize::Options {
                kernels,
                agent,
                reviewer,
                budget: parse_budget(budget.as_deref())?,
                hint,
                context_tokens,
                settings: eval::Settings {
                    sanitize: !no_sanitize,
                    ..args.settings()
                },
                resume: resume.is_some(),
                run_id: run.or(resume),
                ncu: kopt_profile::collect::NcuChoice {
                    explicit: None,
                    disabled: no_ncu,
                    timeout: Some(std::time::Duration::from_secs(600)),
                },
                devices,
                step_timeout: std::time::Duration::from_secs(args.step_timeout),
                from_reference,
                rules: win.rules(),
                run_limits: parse_run_budget(run_budget.as_deref())?,
            };
            let bar = progress_bar(json);
            let r = cargo_kopt::optimize::optimize(&gathered, &opts, &mut |m| bar.say(m))?;
            bar.finish_and_clear();
            if json {
                print_json(&r);
            } else {
                render::optimize(&r);
            }
            Ok(ExitCode::SUCCESS)
        }
        // --- end of optimize (issue 7)
        // --- mcp (issue 8)
        Command::Mcp {
            agent_name,
            max_proposals,
            max_search_evals,
            max_candidate_bytes,
            no_ncu,
            from_reference,
            win,
            eval: args,
        } => {
            let rules = win.rules();
            let cfg = cargo_kopt::mcp::Config {
                agent: agent_name,
                limits: cargo_kopt::mcp::Limits {
                    max_proposals,
                    max_search_evals,
                    max_candidate_bytes,
                    min_gain: rules.min_gain,
                    min_uniform_gain: rules.min_uniform_gain,
                },
                settings: args.settings(),
                ncu: kopt_profile::collect::NcuChoice {
                    explicit: None,
                    disabled: no_ncu,
                    timeout: Some(std::time::Duration::from_secs(600)),
                },
                step_timeout: args.step_timeout,
                from_reference,
            };
            let server = cargo_kopt::mcp::KoptMcp::new(gathered, cfg)?;
            // Standard output carries the protocol: people read standard error.
            eprintln!(
                "cargo kopt mcp: serving over stdio; journal in {}/",
                server.run_dir().display()
            );
            cargo_kopt::mcp::serve_stdio(server)?;
            Ok(ExitCode::SUCCESS)
        }
        // --- end of mcp (issue 8)
        // --- search (issue 6)
        Command::Search {
            kernel,
            strategy,
            seeded,
            matrix,
            hints,
            budget_evals,
            budget_seconds,
            seed,
            options,
            resume,
            keep_rounds,
            threads,
            no_verify,
            save,
            eval: args,
        } => {
            let k = commands::find(&gathered, &kernel).map_err(|e| e.to_string())?;
            let o = search::SearchOptions {
                strategy: strategy.kind(),
                seeded,
                matrix,
                hints,
                budget_evals,
                budget_seconds,
                seed,
                options: options.axes(),
                resume,
                keep_rounds,
                threads,
                eval: args.settings(),
                step_timeout: args.step_timeout,
                no_verify,
                base: None,
                save: save.then(|| search::SaveWinner {
                    agent: "search".into(),
                    min_gain: 0.03,
                }),
            };
            let report = search::search(&gathered, k, &o, json)?;
            if json {
                print_json(&report);
            } else {
                search::render_search(&report);
            }
            Ok(if report.best.is_some() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::SearchBench {
            kernel,
            seeds,
            target_pct,
            live,
            with_options,
            strategies,
            threads,
            json_out,
            eval: args,
        } => {
            let k = commands::find(&gathered, &kernel).map_err(|e| e.to_string())?;
            let o = search::BenchOptions {
                seeds: seeds.max(1),
                target: target_pct / 100.0,
                live,
                options: if with_options {
                    kopt_search::OptionAxes::standard()
                } else {
                    kopt_search::OptionAxes::none()
                },
                strategies: if strategies.is_empty() {
                    kopt_search::StrategyKind::ALL.to_vec()
                } else {
                    strategies.iter().map(|s| s.kind()).collect()
                },
                threads,
                eval: args.settings(),
                step_timeout: args.step_timeout,
            };
            let report = search::search_bench(&gathered, k, &o, json)?;
            if let Some(path) = json_out {
                std::fs::write(
                    &path,
                    serde_json::to_string_pretty(&report).expect("reports serialise"),
                )
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            }
            if json {
                print_json(&report);
            } else {
                search::render_bench(&report);
            }
            Ok(ExitCode::SUCCESS)
        }
        // --- end of search (issue 6)
        Command::Job {
            kernel,
            shape,
            variant,
        } => {
            let k = commands::find(&gathered, &kernel).map_err(|e| e.to_string())?;
            let candidate = eval::chosen_version(k, variant.as_deref())?;
            let shape = eval::shape_index(k, &shape)?;
            print_json(&eval::shape_job(&gathered, k, candidate, shape, false)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Report {
            bench,
            search_bench,
            pending,
            title,
            generated,
            out,
        } => {
            let options = cargo_kopt::report::Options {
                bench,
                search_bench,
                pending,
                title,
                generated,
            };
            let report = cargo_kopt::report::build(&gathered, &options)?;
            let out = out.unwrap_or_else(|| gathered.target_dir.join("kopt/report.html"));
            if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            std::fs::write(&out, kopt_report::render(&report))
                .map_err(|e| format!("cannot write {}: {e}", out.display()))?;
            let gaps = kopt_report::gaps(&report);
            if json {
                print_json(&serde_json::json!({ "path": out, "empty": gaps }));
            } else {
                println!("wrote {}", out.display());
                for g in &gaps {
                    println!("  empty: {g}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        // --- profile (issue 5)
        Command::Profile {
            kernel,
            shape,
            variant,
            device,
            ncu,
            no_ncu,
            ncu_timeout,
            arch,
            library,
            no_cases,
            no_cache,
        } => {
            let options = cargo_kopt::profile::Options {
                kernel,
                shape,
                variant,
                device,
                ncu: kopt_profile::collect::NcuChoice {
                    explicit: ncu,
                    disabled: no_ncu,
                    timeout: Some(std::time::Duration::from_secs(ncu_timeout)),
                },
                arch,
                cases: library.path,
                no_cases,
                no_cache,
            };
            let bar = progress_bar(json);
            let outcome = cargo_kopt::profile::profile(&gathered, &options, &mut |m| bar.say(m));
            bar.finish_and_clear();
            let outcome = outcome?;
            if json {
                print_json(&outcome);
            } else {
                let mut out = anstream::stdout();
                let _ = writeln!(out, "{}", outcome.snapshot.render(8));
                let _ = writeln!(
                    out,
                    "{}run {}: every artefact is in {}{:#}",
                    dim(),
                    outcome.run_id,
                    outcome.dir.display(),
                    dim()
                );
            }
            Ok(ExitCode::from(outcome.exit_code()))
        }
        // --- end of profile (issue 5)
        Command::Worker { .. } => unreachable!("handled before gathering"),
    }
}

/// A win threshold in percent (`--min-gain`, `--min-uniform-gain`): finite, 0 to 100.
fn parse_gain_pct(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("`{text}` is not a percentage: write e.g. `3` or `0.5`"))?;
    if !(0.0..100.0).contains(&v) {
        return Err(format!(
            "`{text}`: a gain threshold is a percentage from 0 to below 100"
        ));
    }
    Ok(v)
}

/// `rounds=8,candidates=24,minutes=60,tokens=2000000,dollars=20` (any subset).
fn parse_budget(text: Option<&str>) -> Result<kopt_agent::run::Budget, String> {
    let mut b = kopt_agent::run::Budget::default();
    let Some(text) = text else { return Ok(b) };
    for part in text.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = part.split_once('=').ok_or(format!(
            "`{part}`: write name=value (rounds, candidates, minutes, tokens, dollars)"
        ))?;
        let bad = || format!("`{part}`: `{v}` is not a number");
        match k.trim() {
            "rounds" => b.rounds = v.trim().parse().map_err(|_| bad())?,
            "candidates" => b.candidates = v.trim().parse().map_err(|_| bad())?,
            "minutes" => {
                b.wall = std::time::Duration::from_secs_f64(
                    v.trim().parse::<f64>().map_err(|_| bad())? * 60.0,
                )
            }
            "tokens" => b.tokens = v.trim().parse().map_err(|_| bad())?,
            "dollars" => b.dollars = v.trim().parse().map_err(|_| bad())?,
            other => {
                return Err(format!(
                    "unknown budget `{other}`: use rounds, candidates, minutes, tokens, dollars"
                ))
            }
        }
    }
    Ok(b)
}

fn parse_run_budget(text: Option<&str>) -> Result<kopt_agent::run::RunLimits, String> {
    let mut l = kopt_agent::run::RunLimits::default();
    let Some(text) = text else { return Ok(l) };
    for part in text.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = part.split_once('=').ok_or(format!(
            "--run-budget `{part}`: write name=value (candidates, minutes, tokens, dollars)"
        ))?;
        let bad = || format!("--run-budget `{part}`: `{v}` is not a number");
        match k.trim() {
            "candidates" => l.candidates = Some(v.trim().parse().map_err(|_| bad())?),
            "minutes" => {
                l.wall = Some(std::time::Duration::from_secs_f64(
                    v.trim().parse::<f64>().map_err(|_| bad())? * 60.0,
                ))
            }
            "tokens" => l.tokens = Some(v.trim().parse().map_err(|_| bad())?),
            "dollars" => l.dollars = Some(v.trim().parse().map_err(|_| bad())?),
            "rounds" => {
                return Err(
                    "--run-budget has no `rounds`: rounds are per kernel (`--budget rounds=N`)"
                        .into(),
                )
            }
            other => {
                return Err(format!(
                    "unknown run budget `{other}`: use candidates, minutes, tokens, dollars"
                ))
            }
        }
    }
    Ok(l)
}

fn check_names(g: &Gathered, names: &[String]) -> Result<(), String> {
    for n in names {
        commands::find(g, n).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Where progress goes: a spinner on a terminal; elsewhere (a CI log, a pipe) one plain
/// line per new message with the time since the start, so that a long run says what it
/// is doing in a log too; nothing with `--message-format json` (stdout is the machine's).
enum Progress {
    Bar(indicatif::ProgressBar),
    Lines {
        start: std::time::Instant,
        last: std::cell::RefCell<String>,
    },
    Quiet,
}

impl Progress {
    fn say(&self, message: &str) {
        match self {
            Progress::Bar(bar) => bar.set_message(message.to_string()),
            Progress::Lines { start, last } => {
                if *last.borrow() != message {
                    eprintln!("[{:>5}s] {message}", start.elapsed().as_secs());
                    *last.borrow_mut() = message.to_string();
                }
            }
            Progress::Quiet => {}
        }
    }

    fn finish_and_clear(&self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

fn progress_bar(json: bool) -> Progress {
    use std::io::IsTerminal;
    if json {
        return Progress::Quiet;
    }
    if !std::io::stderr().is_terminal() {
        return Progress::Lines {
            start: std::time::Instant::now(),
            last: Default::default(),
        };
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}")
            .expect("valid template"),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    Progress::Bar(bar)
}

fn print_json<T: serde::Serialize>(v: &T) {
    let mut out = anstream::stdout();
    let _ = writeln!(out, "{}", serde_json::to_string(v).expect("serialises"));
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

/// The compile fence's table (one row per version and architecture) and its notes, or
/// the one line that says why nothing was compiled.
fn print_compile_check(g: &Gathered, c: &cargo_kopt::compile_check::CompileCheck) {
    let mut out = anstream::stdout();
    for k in &g.kernels {
        for n in &k.notes {
            let _ = writeln!(
                out,
                "{}note{:#}: {}::{}: {n}",
                yellow(),
                yellow(),
                k.package,
                k.spec.name
            );
        }
    }
    let _ = write!(out, "{}", cargo_kopt::render::compile_check(c));
}

/// The variant folders `check` cannot vouch for, which do not fail it.
fn print_audit_notes(notes: &[String]) {
    let mut out = anstream::stdout();
    for n in notes {
        let _ = writeln!(out, "{}note{:#}: {n}", yellow(), yellow());
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
