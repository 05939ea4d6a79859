//! `cargo kopt`: the command line. Its subcommands are in `cmd/`, each mapping its
//! arguments to the options of `kopt_workspace` and `kopt_loop` and rendering what they
//! return.

mod cmd;
mod mcp;
mod review;
mod search_progress;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anstyle::{AnsiColor, Style};
use clap::{Args, Parser, ValueEnum};
use cmd::Command;
use kopt_workspace::gather::{self, Selection};

#[derive(Parser)]
#[command(name = "cargo", bin_name = "cargo", styles = clap::builder::Styles::styled())]
enum Cargo {
    /// Verified, explained CUDA kernel variants for the kernels of this workspace.
    Kopt(Cli),
}

#[derive(Args)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct Global {
    /// Path to Cargo.toml.
    #[arg(long, global = true, value_name = "PATH")]
    manifest_path: Option<PathBuf>,
    /// Package(s) to work on (default: every member that depends on kopt).
    #[arg(short, long = "package", global = true, value_name = "SPEC")]
    package: Vec<String>,
    /// Work on every workspace member (the default).
    #[arg(long, global = true)]
    workspace: bool,
    /// Members to leave out.
    #[arg(long, global = true, value_name = "SPEC")]
    exclude: Vec<String>,
    /// Output format.
    #[arg(long, global = true, value_enum, default_value_t = MessageFormat::Human)]
    message_format: MessageFormat,
    /// Colouring (NO_COLOR is honoured under `auto`).
    #[arg(long, global = true, value_enum, default_value_t = clap::ColorChoice::Auto)]
    color: clap::ColorChoice,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MessageFormat {
    Human,
    Json,
}

fn main() -> ExitCode {
    // NVRTC (12.9 and later) answers a compile it has seen from a cache that keeps the
    // cubin and drops ptxas' report, and the compile fence and `check` read entries,
    // registers and spills from that report. Off for this process and the workers it
    // starts, unless the user chose; set here, before any thread exists or NVRTC loads.
    if std::env::var_os(kopt_engine::precompile::NVRTC_CACHE_SWITCH).is_none() {
        std::env::set_var(kopt_engine::precompile::NVRTC_CACHE_SWITCH, "1");
    }
    let Cargo::Kopt(cli) = Cargo::parse();
    if let Command::Worker(w) = &cli.command {
        return cmd::worker::run(w);
    }
    match cli.global.color {
        clap::ColorChoice::Always => anstream::ColorChoice::Always.write_global(),
        clap::ColorChoice::Never => anstream::ColorChoice::Never.write_global(),
        clap::ColorChoice::Auto => {}
    }
    match run(cli) {
        Ok(code) => code,
        Err(msg) => {
            let red = Style::new().fg_color(Some(AnsiColor::Red.into())).bold();
            let _ = writeln!(anstream::stderr(), "{red}error{red:#}: {msg}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    let g = &cli.global;
    let json = g.message_format == MessageFormat::Json;
    // The case library needs no workspace.
    let command = match cli.command {
        Command::Cases(c) => return cmd::store::cases_command(&c.library, c.command, json),
        other => other,
    };
    let sel = Selection {
        manifest_path: g.manifest_path.clone(),
        // `--workspace` is every member that depends on kopt, whatever `-p` says.
        packages: g.package.iter().filter(|_| !g.workspace).cloned().collect(),
        exclude: g.exclude.clone(),
    };
    let gathered = gather::gather(&sel).map_err(|e| e.to_string())?;
    command.run(gathered, json)
}
