//! `cargo kopt __job`: the evaluation job of one shape, as the worker reads it.

use std::process::ExitCode;

use clap::Args;
use kopt_loop::eval;
use kopt_workspace::commands;
use kopt_workspace::gather::Gathered;

use super::print_json;

#[derive(Args)]
pub struct JobArgs {
    pub kernel: String,
    /// The declared shape, by index or label.
    #[arg(long, default_value = "0", value_name = "INDEX|LABEL")]
    pub shape: String,
    /// A committed variant to use as the candidate (default: the reference).
    #[arg(long)]
    pub variant: Option<String>,
}

pub fn run(a: JobArgs, gathered: Gathered) -> Result<ExitCode, String> {
    let JobArgs {
        kernel,
        shape,
        variant,
    } = a;
    let k = commands::find(&gathered, &kernel).map_err(|e| e.to_string())?;
    let candidate = eval::chosen_version(k, variant.as_deref()).map_err(|e| e.to_string())?;
    let shape = eval::shape_index(k, &shape).map_err(|e| e.to_string())?;
    print_json(&eval::shape_job(&gathered, k, candidate, shape, false).map_err(|e| e.to_string())?);
    Ok(ExitCode::SUCCESS)
}
