//! `cargo kopt devices`: the GPUs with their measured ceilings.

use std::process::ExitCode;

use cargo_kopt::render;
use clap::Args;
use kopt_loop::eval;
use kopt_workspace::gather::Gathered;

use super::print_json;

#[derive(Args)]
pub struct DevicesArgs {
    /// Measure the ceilings again instead of using the cached ones.
    #[arg(long)]
    pub refresh: bool,
}

pub fn run(a: DevicesArgs, gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    let DevicesArgs { refresh } = a;
    let list = eval::devices(&gathered, refresh).map_err(|e| e.to_string())?;
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
