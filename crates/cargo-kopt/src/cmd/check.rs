//! `cargo kopt check`: the committed files audited and compiled, without a GPU.

use std::io::Write;
use std::process::ExitCode;

use cargo_kopt::style::{green, red, yellow};
use kopt_workspace::commands;
use kopt_workspace::gather::Gathered;

use super::print_json;

pub fn run(gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    let commands::Checked {
        mut problems,
        notes: audit_notes,
    } = commands::check(&gathered);
    let compiled = kopt_workspace::compile_check::compile_check(&gathered);
    problems.extend(compiled.problems().iter().cloned());
    if json {
        print_json(&serde_json::json!({
            "kernels": gathered.kernels.len(),
            "ok": problems.is_empty(),
            "problems": problems,
            "notes": gathered.kernels.iter().flat_map(|k| k.notes.iter().map(move |n| format!("{}::{}: {n}", k.package, k.spec.name))).chain(audit_notes.iter().cloned()).collect::<Vec<_>>(),
            "compile": compiled,
        }));
    } else {
        print_compile_check(&gathered, &compiled);
        print_audit_notes(&audit_notes);
        print_check(&gathered, &problems);
    }
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The compile fence's table (one row per version and architecture) and its notes, or
/// the one line that says why nothing was compiled.
fn print_compile_check(g: &Gathered, c: &kopt_workspace::compile_check::CompileCheck) {
    let mut out = anstream::stdout();
    for k in &g.kernels {
        for n in &k.notes {
            let _ = writeln!(
                out,
                "{}note{:#}: {}::{}: {n}",
                yellow(),
                yellow(),
                k.package,
                k.spec.name
            );
        }
    }
    let _ = write!(out, "{}", cargo_kopt::render::compile_check(c));
}

/// The variant folders `check` cannot vouch for, which do not fail it.
fn print_audit_notes(notes: &[String]) {
    let mut out = anstream::stdout();
    for n in notes {
        let _ = writeln!(out, "{}note{:#}: {n}", yellow(), yellow());
    }
}

fn print_check(g: &Gathered, problems: &[kopt_spec::selection::Problem]) {
    let mut out = anstream::stdout();
    let variants: usize = g.kernels.iter().map(|k| k.state.entries.len()).sum();
    if problems.is_empty() {
        let _ = writeln!(
            out,
            "{}ok{:#}: {} kernel(s), {} accepted variant(s): every lock file and variant is intact and current",
            green(),
            green(),
            g.kernels.len(),
            variants
        );
        return;
    }
    for p in problems {
        let _ = writeln!(
            out,
            "{}problem{:#}: {} ({})",
            red(),
            red(),
            p.problem,
            p.path
        );
        let _ = writeln!(out, "  {}fix{:#}: {}", green(), green(), p.fix);
    }
    let _ = writeln!(
        out,
        "{} problem(s) in {} kernel(s)",
        problems.len(),
        g.kernels.len()
    );
}
