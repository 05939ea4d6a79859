//! The subcommands: each module maps its arguments to the libraries' options, calls
//! them, and renders what they return.

use std::io::Write;
use std::process::ExitCode;

pub use cargo_kopt::render::print_json;
use clap::{Args, Subcommand};
use kopt_loop::eval;
use kopt_workspace::commands::{self, Edit};
use kopt_workspace::gather::Gathered;

pub mod bench;
pub mod check;
pub mod devices;
pub mod gc;
pub mod job;
pub mod list;
pub mod mcp;
pub mod optimize;
pub mod pin;
pub mod profile;
pub mod report;
pub mod revert;
pub mod search;
pub mod store;
pub mod verify;
pub mod worker;

#[derive(Subcommand)]
pub enum Command {
    /// List every annotated kernel with its shapes, tunables and accepted variants.
    List(list::ListArgs),
    /// Check, without a GPU, that every lock file and variant is intact and current.
    Check,
    /// Record a hand-made variant from kopt/<KERNEL>/<VARIANT>/ in the lock file
    /// (marked `verified_by = "manual"`: kopt's verification has not run on it).
    Pin(pin::PinArgs),
    /// Drop the accepted variant(s) of a kernel: the reference runs instead. With
    /// `--to VARIANT`, make an earlier variant (its folder still in kopt/KERNEL/) the
    /// accepted one again, if it was verified against today's reference and annotation.
    Revert(revert::RevertArgs),
    /// List the variant folders under kopt/KERNEL/ that no lock entry names (superseded
    /// variants, kept for `revert --to`); with --delete, remove them. Their history stays
    /// in git. A folder kopt never accepted (no claim in its rationale.json) is listed but
    /// kept.
    Gc(gc::GcArgs),
    /// List the pending variants (verified winners of optimisation runs) awaiting review.
    Pending,
    /// Review pending variants one by one: rationale, figures, evidence, what they
    /// replace, source diff. Keys: a accept, r reject, s skip, d full diff, q quit.
    Review(store::ReviewArgs),
    /// Accept pending variant(s) without review: writes kopt/KERNEL/VARIANT/ and the lock
    /// file, printing any accepted variant it replaces.
    Accept(store::AcceptArgs),
    /// Reject pending variant(s): kept in their run's folder, and in the case library as
    /// negative cases.
    Reject(store::RejectArgs),
    /// Bring back the work of other machines (the parts of a `--partition`ed run): the
    /// pending variants in each DIR (a target folder, its kopt/ folder, or a pending area
    /// copied back) join this workspace's, with their run folders; two different variants
    /// for one kernel and architecture are refused and nothing is merged. Case libraries
    /// at a DIR's root (cases.sqlite, cases.jsonl) are imported, each case once.
    Merge(store::MergeArgs),
    /// The case library: past diagnoses and their outcomes (list, show, search, import,
    /// export).
    Cases(store::CasesArgs),
    /// Re-verify every accepted variant on this GPU: numerics on fresh inputs, held-out
    /// shapes, anti-cheat checks, the performance watchdog, compute-sanitizer.
    Verify(verify::VerifyArgs),
    /// Time the reference and the active variant of each kernel on each declared shape.
    Bench(bench::BenchArgs),
    /// List the GPUs with their measured ceilings.
    Devices(devices::DevicesArgs),
    /// Optimise kernels with an agent: propose, review, verify, feed back; verified
    /// winners are left as pending variants (`cargo kopt review`).
    Optimize(optimize::OptimizeArgs),
    /// Serve the verified loop as Model Context Protocol tools over stdio, for a coding
    /// agent to drive: list_kernels, get_context, profile, propose_variant, search,
    /// list_pending, explain_verdict. Winners become pending variants; nothing committed
    /// is written (`cargo kopt review` accepts).
    Mcp(mcp::McpArgs),
    /// Write one self-contained HTML report (SVG charts, no scripts): per kernel and
    /// shape the reference against the active version and its share of the roofline, a
    /// roofline plot, the search's convergence, and the verification evidence of the
    /// committed and pending variants. Sections without data say which file fills them.
    Report(report::ReportArgs),
    /// Profile one version of a kernel on one declared shape: the engine's figures,
    /// Nsight Compute (where `ncu` exists), PTX and SASS, and the source's structure,
    /// summarised as a bottleneck snapshot (classification, ranked findings with their
    /// evidence). Every raw artefact stays in <target>/kopt/runs/<run-id>/profile/KERNEL/.
    /// Exit code: 0 classified, 1 nothing could be measured (what is missing is named), 2
    /// error.
    Profile(profile::ProfileArgs),
    /// Search a kernel's tunables, launch geometry and compile options on this GPU;
    /// prints the best verified configuration per shape and the leaderboard. Runs are
    /// journalled under target/kopt/runs/ and resume with --resume RUN_ID.
    Search(search::SearchArgs),
    /// The convergence benchmark: an exhaustive run measured once, then each strategy with
    /// and without the profile seed over --seeds seeds: median evaluations and seconds to
    /// come within --target-pct of the best, evaluations per second.
    SearchBench(search::SearchBenchArgs),
    /// Print the evaluation job (checks only) of a kernel's shape, as the worker reads it:
    /// for running the worker by hand under a profiler or sanitizer.
    #[command(name = "__job", hide = true)]
    Job(job::JobArgs),
    /// The evaluation worker (started by kopt itself).
    #[command(name = kopt_engine::worker::SUBCOMMAND, hide = true)]
    Worker(worker::WorkerArgs),
}

impl Command {
    /// Runs a command over the gathered workspace (every command but `cases` and
    /// `__worker`, which need none).
    pub fn run(self, gathered: Gathered, json: bool) -> Result<ExitCode, String> {
        match self {
            Command::List(a) => list::run(a, gathered, json),
            Command::Check => check::run(gathered, json),
            Command::Pin(a) => pin::run(a, gathered, json),
            Command::Revert(a) => revert::run(a, gathered, json),
            Command::Gc(a) => gc::run(a, gathered, json),
            Command::Pending => Ok(store::pending(&gathered, json)),
            Command::Review(a) => store::review(a, gathered, json),
            Command::Accept(a) => store::accept(a, gathered, json),
            Command::Reject(a) => store::reject(a, gathered, json),
            Command::Merge(a) => store::merge(a, gathered, json),
            Command::Verify(a) => verify::run(a, gathered, json),
            Command::Bench(a) => bench::run(a, gathered, json),
            Command::Devices(a) => devices::run(a, gathered, json),
            Command::Optimize(a) => optimize::run(a, gathered, json),
            Command::Mcp(a) => mcp::run(a, gathered, json),
            Command::Report(a) => report::run(a, gathered, json),
            Command::Profile(a) => profile::run(a, gathered, json),
            Command::Search(a) => search::run(a, gathered, json),
            Command::SearchBench(a) => search::run_bench(a, gathered, json),
            Command::Job(a) => job::run(a, gathered),
            Command::Cases(_) | Command::Worker(_) => unreachable!("handled before gathering"),
        }
    }
}

/// `--partition`: this machine's share of the kernels.
#[derive(Args, Clone)]
pub struct PartitionArg {
    /// Only this part of the workspace's kernels: `slice:M/N` (the M-th of every N in
    /// name order) or `hash:M/N` (by a fixed hash of `package::kernel`), M from 1.
    #[arg(long, value_name = "slice:M/N|hash:M/N", value_parser = clap::builder::ValueParser::new(|s: &str| s.parse::<kopt_workspace::partition::Partition>()))]
    pub partition: Option<kopt_workspace::partition::Partition>,
}

/// What a candidate must gain to be a new best, for `optimize` and `mcp`.
#[derive(Args, Clone)]
pub struct WinArgs {
    /// A candidate is a new best when it is faster than the best by more than this
    /// percentage on some shape...
    #[arg(long, value_name = "PCT", default_value_t = 3.0, value_parser = kopt_agent::run::parse_gain_pct)]
    pub min_gain: f64,
    /// ... or not slower on any shape (beyond that shape's measured timing noise) and
    /// faster by more than this percentage in geometric mean over the shapes. Both are
    /// raised to twice the timing noise measured on the starting version, never lowered
    /// below it.
    #[arg(long, value_name = "PCT", default_value_t = 1.0, value_parser = kopt_agent::run::parse_gain_pct)]
    pub min_uniform_gain: f64,
}

impl WinArgs {
    pub fn rules(&self) -> kopt_agent::run::Rules {
        kopt_agent::run::Rules {
            min_gain: self.min_gain / 100.0,
            min_uniform_gain: self.min_uniform_gain / 100.0,
            ..Default::default()
        }
    }
}

#[derive(Args, Clone)]
pub struct EvalArgs {
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Measure again even when an identical evaluation is cached.
    #[arg(long)]
    pub no_cache: bool,
    /// Tolerated slowdown against the best, percent.
    #[arg(long, default_value_t = 3.0)]
    pub threshold: f64,
    /// Seconds without progress after which a kernel counts as hung (a step whose
    /// launches the reference's measured time predicts to take longer is allowed ten
    /// times that prediction).
    #[arg(long, default_value_t = 30)]
    pub step_timeout: u64,
}

impl EvalArgs {
    pub fn settings(&self) -> eval::Settings {
        eval::Settings {
            threshold: self.threshold / 100.0,
            use_cache: !self.no_cache,
            device: self.device,
            ..eval::Settings::default()
        }
    }
}

/// A program's recorded launches, for `verify`, `bench` and `optimize`.
#[derive(Args, Clone)]
pub struct InputsArg {
    /// A capture of the program's own launches (the folder `KOPT_CAPTURE` named when it
    /// ran): each kept launch's recorded inputs join the numeric checks against the
    /// reference, and the bench times each captured shape and weighs it by its launch
    /// count. A capture made with another annotation than today's is refused.
    #[arg(long, value_name = "DIR")]
    pub inputs: Option<std::path::PathBuf>,
}

impl InputsArg {
    /// The capture, loaded into `settings` (nothing without `--inputs`); the captured
    /// shapes no declared shape covers are said on stderr with the line to add them.
    pub fn load(
        &self,
        g: &Gathered,
        settings: &mut eval::Settings,
    ) -> Result<Option<std::sync::Arc<kopt_loop::captured::Captured>>, String> {
        let Some(dir) = &self.inputs else {
            return Ok(None);
        };
        let captured = kopt_loop::captured::Captured::load(g, dir).map_err(|e| e.to_string())?;
        if captured.is_empty() {
            return Err(format!(
                "{} holds no launch of this workspace's annotated kernels{}",
                dir.display(),
                if captured.unknown.is_empty() {
                    String::new()
                } else {
                    format!(" (it has {})", captured.unknown.join(", "))
                }
            ));
        }
        for u in captured.uncovered(g) {
            eprintln!(
                "note: `{}` was launched on {} ({} launches{}), which no declared shape covers; to time it too: {}",
                u.kernel,
                u.case,
                u.launches,
                u.share_pct
                    .map(|p| format!(", {p:.1}% of its captured time"))
                    .unwrap_or_default(),
                u.annotation
            );
        }
        let captured = std::sync::Arc::new(captured);
        settings.captured = captured.clone();
        Ok(Some(captured))
    }
}

pub fn check_names(g: &Gathered, names: &[String]) -> Result<(), String> {
    for n in names {
        commands::find(g, n).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Where progress goes: a spinner on a terminal; elsewhere (a CI log, a pipe) one plain
/// line per new message with the time since the start, so that a long run says what it
/// is doing in a log too; nothing with `--message-format json` (stdout is the machine's).
pub enum Progress {
    Bar(indicatif::ProgressBar),
    Lines {
        start: std::time::Instant,
        last: std::cell::RefCell<String>,
    },
    Quiet,
}

impl Progress {
    pub fn say(&self, message: &str) {
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

    pub fn finish_and_clear(&self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

pub fn progress_bar(json: bool) -> Progress {
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

pub fn report_edit(edit: &Edit, json: bool) {
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
