//! `cargo kopt profile`: the bottleneck snapshot of one kernel version.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use super::store;
use cargo_kopt::style::dim;
use clap::Args;
use kopt_workspace::gather::Gathered;

use super::{print_json, progress_bar};

#[derive(Args)]
pub struct ProfileArgs {
    /// The kernel whose bottleneck snapshot to take (or `--program`).
    #[arg(required_unless_present = "program")]
    pub kernel: Option<String>,
    /// Instead of one kernel's snapshot: where a program's kernel time goes, from its
    /// capture (the folder `KOPT_CAPTURE` named when it ran): the annotated kernels ranked
    /// by their share of the program's estimated GPU time. No GPU needed.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["kernel", "shape", "variant"])]
    pub program: Option<PathBuf>,
    /// A declared shape, by index or label (default: the first).
    #[arg(long, value_name = "INDEX|LABEL")]
    pub shape: Option<String>,
    /// A committed variant to profile (default: the reference).
    #[arg(long)]
    pub variant: Option<String>,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Nsight Compute's `ncu` (default: PATH, $CUDA_HOME/bin, /usr/local/cuda/bin,
    /// /opt/nvidia/nsight-compute/*/).
    #[arg(long, value_name = "PATH", env = "KOPT_NCU")]
    pub ncu: Option<PathBuf>,
    /// Do not run Nsight Compute (wins over --ncu and KOPT_NCU).
    #[arg(long)]
    pub no_ncu: bool,
    /// Seconds an ncu run may take before it is stopped.
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    pub ncu_timeout: u64,
    /// Architecture to compile PTX and SASS for when no GPU says (e.g. sm_90).
    #[arg(long)]
    pub arch: Option<String>,
    #[command(flatten)]
    pub library: store::CasesPath,
    /// Take the confidence from the rules' margin, not from the case library.
    #[arg(long)]
    pub no_cases: bool,
    /// Measure again even when an identical evaluation is cached.
    #[arg(long)]
    pub no_cache: bool,
}

pub fn run(a: ProfileArgs, gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    if let Some(dir) = &a.program {
        return program(dir, &gathered, json);
    }
    let options = kopt_loop::profile::Options {
        kernel: a.kernel.expect("clap requires a kernel without --program"),
        shape: a.shape,
        variant: a.variant,
        device: a.device,
        ncu: kopt_profile::collect::NcuChoice {
            explicit: a.ncu,
            disabled: a.no_ncu,
            timeout: Some(std::time::Duration::from_secs(a.ncu_timeout)),
        },
        arch: a.arch,
        cases: a.library.path,
        no_cases: a.no_cases,
        no_cache: a.no_cache,
    };
    let bar = progress_bar(json);
    let outcome = kopt_loop::profile::profile(&gathered, &options, &mut |m| bar.say(m));
    bar.finish_and_clear();
    let outcome = outcome.map_err(|e| e.to_string())?;
    if json {
        print_json(&outcome);
    } else {
        let mut out = anstream::stdout();
        let _ = writeln!(out, "{}", outcome.snapshot.render(8));
        let _ = writeln!(
            out,
            "{}run {}: every artefact is in {}{:#}",
            dim(),
            outcome.run_id,
            outcome.dir.display(),
            dim()
        );
    }
    Ok(ExitCode::from(outcome.exit_code()))
}

/// `profile --program DIR`: the annotated kernels of a capture by their share of the
/// program's kernel time.
fn program(dir: &std::path::Path, g: &Gathered, json: bool) -> Result<ExitCode, String> {
    let runs = kopt_spec::capture::load(dir)?;
    let shares = kopt_loop::captured::time_shares(&runs);
    // A capture of another annotation is still the program's time; only the shapes to add
    // are left out (`verify --inputs` says why).
    let uncovered = kopt_loop::captured::Captured::from_runs(g, dir, runs.clone())
        .map(|c| c.uncovered(g))
        .unwrap_or_default();
    if json {
        print_json(&serde_json::json!({
            "captures": runs.iter().map(|r| r.dir.display().to_string()).collect::<Vec<_>>(),
            "kernels": shares,
            "uncovered": uncovered,
        }));
        return Ok(ExitCode::SUCCESS);
    }
    cargo_kopt::render::program_time(&runs, &shares, &uncovered);
    Ok(ExitCode::SUCCESS)
}
