//! `cargo kopt gc`: the variant folders no lock entry names.

use std::process::ExitCode;

use super::store;
use clap::Args;
use kopt_workspace::gather::Gathered;

use super::check_names;

#[derive(Args)]
pub struct GcArgs {
    /// Only these kernels (default: every kernel of the selected packages).
    pub kernels: Vec<String>,
    /// Remove the folders listed (default: only list them).
    #[arg(long)]
    pub delete: bool,
}

pub fn run(a: GcArgs, gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    let GcArgs { kernels, delete } = a;
    check_names(&gathered, &kernels)?;
    store::gc(&gathered, &kernels, delete, json)
}
