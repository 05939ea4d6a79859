//! `cargo kopt mcp`: the session served over stdio.

use std::process::ExitCode;

use clap::Args;
use kopt_workspace::gather::Gathered;

use super::{EvalArgs, WinArgs};

#[derive(Args)]
pub struct McpArgs {
    /// The agent's name, recorded in the journal and the rationales as `mcp:NAME`.
    #[arg(long, default_value = "agent")]
    pub agent_name: String,
    /// Candidates verified at most in the session.
    #[arg(long, default_value_t = 24)]
    pub max_proposals: u32,
    /// Search evaluations at most in the session.
    #[arg(long, default_value_t = 200)]
    pub max_search_evals: usize,
    /// Largest candidate source or diff, in bytes.
    #[arg(long, default_value_t = 65536)]
    pub max_candidate_bytes: usize,
    /// Profile without Nsight Compute.
    #[arg(long)]
    pub no_ncu: bool,
    /// Start every kernel from the reference even where a variant is accepted for the
    /// GPU's architecture (by default the session starts from that variant, verified
    /// again, and a proposal must beat it).
    #[arg(long)]
    pub from_reference: bool,
    #[command(flatten)]
    pub win: WinArgs,
    #[command(flatten)]
    pub eval: EvalArgs,
}

pub fn run(a: McpArgs, gathered: Gathered, _json: bool) -> Result<ExitCode, String> {
    let rules = a.win.rules();
    let cfg = kopt_loop::session::Config {
        agent: a.agent_name,
        limits: kopt_loop::session::Limits {
            max_proposals: a.max_proposals,
            max_search_evals: a.max_search_evals,
            max_candidate_bytes: a.max_candidate_bytes,
            min_gain: rules.min_gain,
            min_uniform_gain: rules.min_uniform_gain,
        },
        settings: a.eval.settings(),
        ncu: kopt_profile::collect::NcuChoice {
            explicit: None,
            disabled: a.no_ncu,
            timeout: Some(std::time::Duration::from_secs(600)),
        },
        step_timeout: a.eval.step_timeout,
        from_reference: a.from_reference,
    };
    let server = crate::mcp::KoptMcp::new(gathered, cfg)?;
    // Standard output carries the protocol: people read standard error.
    eprintln!(
        "cargo kopt mcp: serving over stdio; journal in {}/",
        server.run_dir().display()
    );
    crate::mcp::serve_stdio(server)?;
    Ok(ExitCode::SUCCESS)
}
