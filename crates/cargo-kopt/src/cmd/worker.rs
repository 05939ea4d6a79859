//! `cargo kopt __worker`: the engine's worker, started by kopt itself
//! (`kopt_engine::worker::SUBCOMMAND`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

#[derive(Args)]
pub struct WorkerArgs {
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    #[arg(long)]
    pub fake: bool,
    #[arg(long)]
    pub oneshot: Option<PathBuf>,
    /// With --oneshot: write the report to this file instead of stdout.
    #[arg(long, requires = "oneshot")]
    pub report_file: Option<PathBuf>,
}

pub fn run(a: &WorkerArgs) -> ExitCode {
    let code = kopt_engine::worker::main(
        a.device,
        a.fake,
        a.oneshot.as_deref(),
        a.report_file.as_deref(),
    );
    ExitCode::from(code as u8)
}
