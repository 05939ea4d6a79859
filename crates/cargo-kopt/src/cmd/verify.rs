//! `cargo kopt verify`: every accepted variant verified again on the GPU(s).

use std::process::ExitCode;

use cargo_kopt::render;
use clap::Args;
use kopt_loop::eval;
use kopt_workspace::gather::Gathered;
use kopt_workspace::partition;

use super::{check_names, print_json, progress_bar, EvalArgs, InputsArg, PartitionArg};

#[derive(Args)]
pub struct VerifyArgs {
    /// Kernels to verify (default: all).
    pub kernels: Vec<String>,
    #[command(flatten)]
    pub eval: EvalArgs,
    /// Skip compute-sanitizer.
    #[arg(long)]
    pub no_sanitize: bool,
    /// One evaluation worker per GPU, variants verified across them: `all` or
    /// ordinals (`0,1`). Without it, the one GPU of `--device`.
    #[arg(long, value_name = "all|0,1,...", value_parser = clap::builder::ValueParser::new(|s: &str| s.parse::<kopt_engine::pool::DeviceSelection>()), conflicts_with = "device")]
    pub devices: Option<kopt_engine::pool::DeviceSelection>,
    #[command(flatten)]
    pub partition: PartitionArg,
    /// Verify a variant without verified PTX with the PTX NVRTC compiles for it now, and
    /// keep that PTX with it (its kernel.ptx, recorded in the lock) when it passes.
    #[arg(long)]
    pub keep_ptx: bool,
    #[command(flatten)]
    pub inputs: InputsArg,
}

pub fn run(a: VerifyArgs, mut gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    check_names(&gathered, &a.kernels)?;
    partition::select(&mut gathered, a.partition.partition.as_ref());
    let mut settings = a.eval.settings();
    settings.sanitize = !a.no_sanitize;
    a.inputs.load(&gathered, &mut settings)?;
    let mut pool =
        eval::pool(&gathered, &settings, a.devices.as_ref()).map_err(|e| e.to_string())?;
    for (_, engine) in pool.engines_mut() {
        engine.worker.step_timeout = std::time::Duration::from_secs(a.eval.step_timeout);
    }
    let bar = progress_bar(json);
    let mut say = |m: &str| bar.say(m);
    let verified = eval::verify(
        &gathered, &a.kernels, &mut pool, &settings, a.keep_ptx, &mut say,
    )
    .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    let ok = verified.outcomes.iter().all(|o| o.passed());
    if json {
        print_json(&serde_json::json!({
            "device": verified.devices.first(),
            "devices": verified.devices,
            "ceilings": verified.ceilings,
            "ok": ok,
            "variants": verified.outcomes,
        }));
    } else {
        render::verify(&verified);
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
