//! `cargo kopt bench`: the reference and the active version timed per shape.

use std::process::ExitCode;

use cargo_kopt::render;
use clap::Args;
use kopt_loop::eval;
use kopt_workspace::gather::Gathered;
use kopt_workspace::partition;

use super::{check_names, print_json, progress_bar, EvalArgs, InputsArg, PartitionArg};

#[derive(Args)]
pub struct BenchArgs {
    pub kernels: Vec<String>,
    #[command(flatten)]
    pub eval: EvalArgs,
    #[command(flatten)]
    pub partition: PartitionArg,
    #[command(flatten)]
    pub inputs: InputsArg,
}

pub fn run(a: BenchArgs, mut gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    check_names(&gathered, &a.kernels)?;
    partition::select(&mut gathered, a.partition.partition.as_ref());
    let mut settings = a.eval.settings();
    a.inputs.load(&gathered, &mut settings)?;
    let mut engine = eval::engine(&gathered, &settings).map_err(|e| e.to_string())?;
    engine.worker.step_timeout = std::time::Duration::from_secs(a.eval.step_timeout);
    let bar = progress_bar(json);
    let file = eval::bench(&gathered, &a.kernels, &mut engine, &settings, &mut |m| {
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
