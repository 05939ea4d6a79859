//! The store commands: `pending`, `review`, `accept`, `reject`, `merge`, `cases`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::store_cli;
use clap::Args;
use kopt_workspace::gather::Gathered;

#[derive(Args)]
pub struct ReviewArgs {
    /// Only this kernel's pending variants.
    pub kernel: Option<String>,
    /// Only this architecture's.
    #[arg(long)]
    pub arch: Option<String>,
    #[command(flatten)]
    pub cases: store_cli::CaseRecording,
}

#[derive(Args)]
pub struct AcceptArgs {
    pub kernel: Option<String>,
    /// Only this architecture's.
    #[arg(long)]
    pub arch: Option<String>,
    /// Every pending variant selected (of KERNEL, or of the workspace).
    #[arg(long)]
    pub all: bool,
    /// Accept under another variant name (when its own is taken).
    #[arg(long = "as", value_name = "NAME")]
    pub rename: Option<String>,
    /// Key the lock entry by the device the variant was measured on (`NVIDIA H200`), so
    /// that other devices of its architecture keep what they run; without it, the entry
    /// is for every device of the architecture.
    #[arg(long)]
    pub device_specific: bool,
    #[command(flatten)]
    pub cases: store_cli::CaseRecording,
}

#[derive(Args)]
pub struct RejectArgs {
    pub kernel: Option<String>,
    /// Only this architecture's.
    #[arg(long)]
    pub arch: Option<String>,
    /// Every pending variant selected.
    #[arg(long)]
    pub all: bool,
    /// Why, for the run's journal.
    #[arg(long)]
    pub reason: Option<String>,
    #[command(flatten)]
    pub cases: store_cli::CaseRecording,
}

#[derive(Args)]
pub struct MergeArgs {
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    #[command(flatten)]
    pub cases: store_cli::CaseRecording,
}

#[derive(Args)]
pub struct CasesArgs {
    #[command(flatten)]
    pub library: store_cli::CasesPath,
    #[command(subcommand)]
    pub command: store_cli::CasesCommand,
}

pub fn pending(gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    Ok(store_cli::pending(&gathered, json))
}

pub fn review(a: ReviewArgs, gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    store_cli::review(
        &gathered,
        a.kernel.as_deref(),
        a.arch.as_deref(),
        &a.cases,
        json,
    )
}

pub fn accept(a: AcceptArgs, gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    store_cli::accept(
        &gathered,
        a.kernel.as_deref(),
        a.arch.as_deref(),
        a.all,
        kopt_store::accept::AcceptAs {
            name: a.rename.as_deref(),
            device_specific: a.device_specific,
        },
        &a.cases,
        json,
    )
}

pub fn reject(a: RejectArgs, gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    store_cli::reject(
        &gathered,
        a.kernel.as_deref(),
        a.arch.as_deref(),
        a.all,
        a.reason.as_deref(),
        &a.cases,
        json,
    )
}

pub fn merge(a: MergeArgs, gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    store_cli::merge(&gathered, &a.dirs, &a.cases, json)
}
