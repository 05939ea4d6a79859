//! `cargo kopt optimize`: the agent loop over the selected kernels.

use std::process::ExitCode;

use cargo_kopt::render;
use clap::Args;
use kopt_loop::{budget, eval};
use kopt_workspace::gather::Gathered;
use kopt_workspace::partition;

use super::{check_names, print_json, progress_bar, EvalArgs, InputsArg, PartitionArg, WinArgs};

#[derive(Args)]
pub struct OptimizeArgs {
    pub kernels: Vec<String>,
    /// heuristic (no model), openai:MODEL, anthropic:MODEL, cmd:PATH or replay:PATH.
    #[arg(long, env = "KOPT_AGENT", default_value = "heuristic")]
    pub agent: String,
    /// A second backend that critiques each proposal before verification.
    #[arg(long, env = "KOPT_REVIEWER")]
    pub reviewer: Option<String>,
    /// Each kernel's budget: rounds=N,candidates=N,minutes=N,tokens=N,dollars=N (any
    /// subset).
    #[arg(long)]
    pub budget: Option<String>,
    /// The whole run's budget, over all its kernels together:
    /// candidates=N,minutes=N,tokens=N,dollars=N (any subset; none by default). A
    /// kernel the run has no room left for does not start.
    #[arg(long, value_name = "LIMITS")]
    pub run_budget: Option<String>,
    /// Guidance from a person (resumes after an escalation).
    #[arg(long)]
    pub hint: Option<String>,
    /// The context's size limit, in tokens.
    #[arg(long, default_value_t = 60_000)]
    pub context_tokens: usize,
    /// The run's id: a new run with this id, or, where its journal exists, that run
    /// resumed (as `--resume`).
    #[arg(long)]
    pub run: Option<String>,
    /// Go on with a run that was stopped (killed, interrupted): kernels whose loop
    /// had finished are not run again; the others start where they started, the agent
    /// answered from the recorded session while the questions are the recorded ones,
    /// and recorded candidates answered from their verdicts in the journal. Give the
    /// run's kernels, agent, reviewer, hint, thresholds and --no-sanitize again; budgets
    /// may change.
    #[arg(long, value_name = "RUN_ID", conflicts_with = "run")]
    pub resume: Option<String>,
    /// Profile the reference without Nsight Compute (engine figures and the source).
    #[arg(long)]
    pub no_ncu: bool,
    /// Let a candidate become the best without compute-sanitizer's memcheck, racecheck,
    /// initcheck and synccheck (its evidence then says they were not run).
    #[arg(long)]
    pub no_sanitize: bool,
    /// Start from the reference even where a variant is accepted for the GPU's
    /// architecture (by default the loop starts from that variant, verified again, and
    /// a candidate must beat it).
    #[arg(long)]
    pub from_reference: bool,
    #[command(flatten)]
    pub win: WinArgs,
    /// One evaluation worker per GPU, kernels scheduled across them: `all` or
    /// ordinals (`0,1`). Without it, the one GPU of `--device`.
    #[arg(long, value_name = "all|0,1,...", value_parser = clap::builder::ValueParser::new(|s: &str| s.parse::<kopt_engine::pool::DeviceSelection>()), conflicts_with = "device")]
    pub devices: Option<kopt_engine::pool::DeviceSelection>,
    #[command(flatten)]
    pub partition: PartitionArg,
    #[command(flatten)]
    pub eval: EvalArgs,
    /// A capture of the program's own launches (see `verify --inputs`): its kept launches
    /// join every candidate's numeric checks; without kernel names, the kernels the
    /// program launched are optimised in the order of their share of its kernel time.
    #[command(flatten)]
    pub inputs: InputsArg,
}

pub fn run(a: OptimizeArgs, mut gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    check_names(&gathered, &a.kernels)?;
    partition::select(&mut gathered, a.partition.partition.as_ref());
    let mut settings = eval::Settings {
        sanitize: !a.no_sanitize,
        ..a.eval.settings()
    };
    let mut kernels = a.kernels;
    if let (Some(dir), Some(captured)) =
        (&a.inputs.inputs, a.inputs.load(&gathered, &mut settings)?)
    {
        if kernels.is_empty() {
            let ranked: Vec<_> = kopt_loop::captured::time_shares(&captured.runs)
                .into_iter()
                .filter(|s| {
                    gathered
                        .kernels
                        .iter()
                        .any(|k| k.spec.name == s.kernel && k.package == s.krate)
                })
                .collect();
            eprintln!(
                "optimising the kernels {} launched, by their share of its kernel time: {}",
                dir.display(),
                ranked
                    .iter()
                    .map(|s| format!("{} {:.1}%", s.kernel, s.share_pct))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            kernels = ranked.into_iter().map(|s| s.kernel).collect();
        }
    }
    let opts = kopt_loop::optimize::Options {
        kernels,
        agent: a.agent,
        reviewer: a.reviewer,
        budget: budget::parse_budget(a.budget.as_deref()).map_err(|e| e.to_string())?,
        hint: a.hint,
        context_tokens: a.context_tokens,
        settings,
        resume: a.resume.is_some(),
        run_id: a.run.or(a.resume),
        ncu: kopt_profile::collect::NcuChoice {
            explicit: None,
            disabled: a.no_ncu,
            timeout: Some(std::time::Duration::from_secs(600)),
        },
        devices: a.devices,
        step_timeout: std::time::Duration::from_secs(a.eval.step_timeout),
        from_reference: a.from_reference,
        rules: a.win.rules(),
        run_limits: budget::parse_run_budget(a.run_budget.as_deref()).map_err(|e| e.to_string())?,
    };
    let bar = progress_bar(json);
    let r = kopt_loop::optimize::optimize(&gathered, &opts, &mut |m| bar.say(m))
        .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    if json {
        print_json(&r);
    } else {
        render::optimize(&r);
    }
    Ok(ExitCode::SUCCESS)
}
