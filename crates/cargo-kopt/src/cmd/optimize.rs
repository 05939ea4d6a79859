//! `cargo kopt optimize`: the agent loop over the selected kernels.

use std::process::ExitCode;

use cargo_kopt::render;
use clap::Args;
use kopt_loop::eval;
use kopt_workspace::gather::Gathered;
use kopt_workspace::partition;

use super::{check_names, print_json, progress_bar, EvalArgs, PartitionArg, WinArgs};

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
}

pub fn run(a: OptimizeArgs, mut gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    let OptimizeArgs {
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
    } = a;
    check_names(&gathered, &kernels)?;
    partition::select(&mut gathered, partition.partition.as_ref());
    let opts = kopt_loop::optimize::Options {
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
    let r = kopt_loop::optimize::optimize(&gathered, &opts, &mut |m| bar.say(m))?;
    bar.finish_and_clear();
    if json {
        print_json(&r);
    } else {
        render::optimize(&r);
    }
    Ok(ExitCode::SUCCESS)
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
