//! `cargo kopt report`: the HTML report written.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use kopt_workspace::gather::Gathered;

use super::print_json;

#[derive(Args)]
pub struct ReportArgs {
    /// The JSON of `cargo kopt bench --message-format json`.
    #[arg(long, value_name = "FILE")]
    pub bench: Option<PathBuf>,
    /// A file written by `cargo kopt search-bench KERNEL --json-out FILE` (repeat for
    /// several kernels).
    #[arg(long = "search-bench", value_name = "FILE")]
    pub search_bench: Vec<PathBuf>,
    /// A pending root holding <package>/<kernel>/<arch>/ folders (default: the
    /// workspace's <target>/kopt/pending).
    #[arg(long, value_name = "DIR")]
    pub pending: Option<PathBuf>,
    /// The report's title.
    #[arg(long)]
    pub title: Option<String>,
    /// A date or note shown as when the report was generated (no clock is read, so
    /// the same inputs give the same file).
    #[arg(long, value_name = "TEXT")]
    pub generated: Option<String>,
    /// Where to write the HTML (default: <target>/kopt/report.html).
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: Option<PathBuf>,
}

pub fn run(a: ReportArgs, gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    let options = kopt_workspace::report::Options {
        bench: a.bench,
        search_bench: a.search_bench,
        pending: a.pending,
        title: a.title,
        generated: a.generated,
    };
    let report = kopt_workspace::report::build(&gathered, &options).map_err(|e| e.to_string())?;
    let out = a
        .out
        .unwrap_or_else(|| gathered.target_dir.join("kopt/report.html"));
    kopt_workspace::report::write(&report, &out).map_err(|e| e.to_string())?;
    let gaps = kopt_report::gaps(&report);
    if json {
        print_json(&serde_json::json!({ "path": out, "empty": gaps }));
    } else {
        println!("wrote {}", out.display());
        for g in &gaps {
            println!("  empty: {g}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
