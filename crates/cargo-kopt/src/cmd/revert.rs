//! `cargo kopt revert`: back to the reference, or (`--to`) to an earlier variant.

use std::process::ExitCode;

use super::store;
use clap::Args;
use kopt_workspace::commands;
use kopt_workspace::gather::Gathered;

use super::report_edit;

#[derive(Args)]
pub struct RevertArgs {
    pub kernel: String,
    /// Only this architecture (default: all; with --to, the variant's own).
    #[arg(long)]
    pub arch: Option<String>,
    /// What runs afterwards: `reference` (the default) or an earlier variant.
    #[arg(long, value_name = "VARIANT|reference")]
    pub to: Option<String>,
}

pub fn run(a: RevertArgs, gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    let RevertArgs { kernel, arch, to } = a;
    match to.as_deref() {
        Some(variant) if variant != "reference" => {
            store::revert_to(&gathered, &kernel, variant, arch.as_deref(), json)
        }
        _ => {
            let k = commands::find(&gathered, &kernel).map_err(|e| e.to_string())?;
            let edit = commands::revert(k, arch.as_deref()).map_err(|e| e.to_string())?;
            report_edit(&edit, json);
            Ok(ExitCode::SUCCESS)
        }
    }
}
