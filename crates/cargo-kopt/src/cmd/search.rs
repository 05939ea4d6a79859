//! `cargo kopt search` and `cargo kopt search-bench`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::search_progress::SearchBar;
use cargo_kopt::render;
use clap::Args;
use kopt_loop::search;
use kopt_workspace::commands;
use kopt_workspace::gather::Gathered;

use super::{print_json, EvalArgs};

#[derive(Args)]
pub struct SearchArgs {
    pub kernel: String,
    #[arg(long, value_enum, default_value_t = StrategyArg::Hill)]
    pub strategy: StrategyArg,
    /// Seed the search from the reference's bottleneck snapshot (the built-in
    /// heuristic's parameter matrix).
    #[arg(long)]
    pub seeded: bool,
    /// An agent's parameter matrix (JSON), instead of the heuristic's; implies --seeded.
    #[arg(long, value_name = "FILE")]
    pub matrix: Option<PathBuf>,
    /// A bottleneck snapshot instead of measuring the reference: `cargo kopt
    /// profile`'s snapshot.json (with Nsight Compute's achieved occupancy and its
    /// classification), or SnapshotHints JSON; implies --seeded.
    #[arg(long, value_name = "FILE")]
    pub hints: Option<PathBuf>,
    /// Points to evaluate at most (default: all for exhaustive, else min(100, valid)).
    #[arg(long, value_name = "N")]
    pub budget_evals: Option<usize>,
    /// Wall time at most, seconds.
    #[arg(long, value_name = "S")]
    pub budget_seconds: Option<f64>,
    /// The strategy's random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Compile-option axes: `standard` (fast math where outputs are floating point,
    /// --extra-device-vectorization, --maxrregcount 32/64/128/255) or `none`.
    #[arg(long, value_enum, default_value_t = OptionsArg::Standard)]
    pub options: OptionsArg,
    /// Go on with an interrupted run (same kernel, strategy, seed and options).
    #[arg(long, value_name = "RUN_ID")]
    pub resume: Option<String>,
    /// Rounds an interesting point stays in the neighbourhood.
    #[arg(long, default_value_t = 8)]
    pub keep_rounds: usize,
    /// CPU threads compiling ahead (default: the cores, at most 16).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Skip the full verification of the best points at the end.
    #[arg(long)]
    pub no_verify: bool,
    /// Save the best point as a pending variant (for `cargo kopt review`) when its
    /// full verification passes and it beats the reference by 3%.
    #[arg(long, conflicts_with = "no_verify")]
    pub save: bool,
    #[command(flatten)]
    pub eval: EvalArgs,
}

#[derive(Args)]
pub struct SearchBenchArgs {
    pub kernel: String,
    #[arg(long, default_value_t = 10)]
    pub seeds: u64,
    /// Within this many percent of the exhaustive best counts as converged.
    #[arg(long, default_value_t = 2.0)]
    pub target_pct: f64,
    /// Measure every trial again on the device (wall clock) instead of replaying the
    /// exhaustive run's measurements.
    #[arg(long)]
    pub live: bool,
    /// Include the compile-option axes in the space (default: the tunables only).
    #[arg(long)]
    pub with_options: bool,
    /// Strategies to compare (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub strategies: Vec<StrategyArg>,
    #[arg(long)]
    pub threads: Option<usize>,
    /// Also write the report as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json_out: Option<PathBuf>,
    #[command(flatten)]
    pub eval: EvalArgs,
}

pub fn run(a: SearchArgs, gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    let k = commands::find(&gathered, &a.kernel).map_err(|e| e.to_string())?;
    let o = search::SearchOptions {
        strategy: a.strategy.kind(),
        seeded: a.seeded,
        matrix: a.matrix,
        hints: a.hints,
        budget_evals: a.budget_evals,
        budget_seconds: a.budget_seconds,
        seed: a.seed,
        options: a.options.axes(),
        resume: a.resume,
        keep_rounds: a.keep_rounds,
        threads: a.threads,
        eval: a.eval.settings(),
        step_timeout: a.eval.step_timeout,
        no_verify: a.no_verify,
        base: None,
        save: a.save.then(|| search::SaveWinner {
            agent: "search".into(),
            min_gain: 0.03,
        }),
    };
    let report =
        search::search(&gathered, k, &o, &mut SearchBar::new(json)).map_err(|e| e.to_string())?;
    if json {
        print_json(&report);
    } else {
        render::search::render_search(&report);
    }
    Ok(if report.best.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

pub fn run_bench(a: SearchBenchArgs, gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    let k = commands::find(&gathered, &a.kernel).map_err(|e| e.to_string())?;
    let o = search::BenchOptions {
        seeds: a.seeds.max(1),
        target: a.target_pct / 100.0,
        live: a.live,
        options: if a.with_options {
            kopt_search::OptionAxes::standard()
        } else {
            kopt_search::OptionAxes::none()
        },
        strategies: if a.strategies.is_empty() {
            kopt_search::StrategyKind::ALL.to_vec()
        } else {
            a.strategies.iter().map(|s| s.kind()).collect()
        },
        threads: a.threads,
        eval: a.eval.settings(),
        step_timeout: a.eval.step_timeout,
    };
    let report = search::search_bench(&gathered, k, &o, &mut SearchBar::new(json))
        .map_err(|e| e.to_string())?;
    if let Some(path) = a.json_out {
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&report).expect("reports serialise"),
        )
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if json {
        print_json(&report);
    } else {
        render::search::render_bench(&report);
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StrategyArg {
    Exhaustive,
    Random,
    Hill,
    Evolution,
}

impl StrategyArg {
    pub fn kind(self) -> kopt_search::StrategyKind {
        use kopt_search::StrategyKind as K;
        match self {
            StrategyArg::Exhaustive => K::Exhaustive,
            StrategyArg::Random => K::Random,
            StrategyArg::Hill => K::Hill,
            StrategyArg::Evolution => K::Evolution,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OptionsArg {
    Standard,
    None,
}

impl OptionsArg {
    pub fn axes(self) -> kopt_search::OptionAxes {
        match self {
            OptionsArg::Standard => kopt_search::OptionAxes::standard(),
            OptionsArg::None => kopt_search::OptionAxes::none(),
        }
    }
}
