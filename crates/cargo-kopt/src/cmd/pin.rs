//! `cargo kopt pin`: a hand-made variant recorded in the lock file.

use std::process::ExitCode;

use clap::Args;
use kopt_workspace::commands;
use kopt_workspace::gather::Gathered;

use super::report_edit;

#[derive(Args)]
pub struct PinArgs {
    pub kernel: String,
    pub variant: String,
    /// Architecture, e.g. sm_90.
    #[arg(long)]
    pub arch: String,
    /// Only on the device of this name (as `cargo kopt devices` shows it, e.g.
    /// `NVIDIA H200`), tried there before the architecture's variants.
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// Only for launches where this condition over the scalar arguments holds.
    #[arg(long)]
    pub region: Option<String>,
}

pub fn run(a: PinArgs, gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    let k = commands::find(&gathered, &a.kernel).map_err(|e| e.to_string())?;
    let edit = commands::pin(
        k,
        &a.variant,
        &a.arch,
        a.device.as_deref(),
        a.region.as_deref(),
    )
    .map_err(|e| e.to_string())?;
    report_edit(&edit, json);
    Ok(ExitCode::SUCCESS)
}
