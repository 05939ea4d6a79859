//! `cargo kopt list`: the annotated kernels, their shapes, tunables and variants.

use std::io::Write;
use std::process::ExitCode;

use anstyle::Style;
use cargo_kopt::style::{dim, green, red, yellow};
use cargo_kopt::table::Table;
use clap::Args;
use kopt_workspace::commands;
use kopt_workspace::gather::Gathered;
use kopt_workspace::partition;

use super::{print_json, PartitionArg};

#[derive(Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub partition: PartitionArg,
}

pub fn run(a: ListArgs, mut gathered: Gathered, json: bool) -> Result<ExitCode, String> {
    let ListArgs { partition } = a;
    partition::select(&mut gathered, partition.partition.as_ref());
    let listed = commands::list(&gathered);
    if json {
        print_json(&listed);
    } else {
        print_list(&gathered, &listed);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_list(g: &Gathered, listed: &[commands::ListedKernel]) {
    let mut out = anstream::stdout();
    if listed.is_empty() {
        let _ = writeln!(
            out,
            "no #[kopt::kernel] found in {} package(s) that depend on kopt",
            g.packages.len()
        );
        return;
    }
    let mut t = Table::new(&[
        "crate",
        "kernel",
        "reference",
        "shapes",
        "tunables",
        "variants",
    ]);
    for k in listed {
        let variants = if k.variants.is_empty() {
            ("reference everywhere".to_string(), dim())
        } else {
            let any_bad = k.variants.iter().any(|v| v.status != "active");
            let text = k
                .variants
                .iter()
                .map(|v| {
                    let region = v
                        .region
                        .as_ref()
                        .map(|r| format!(" where {r}"))
                        .unwrap_or_default();
                    let status = if v.status == "active" {
                        String::new()
                    } else {
                        format!(" [{}]", v.status.to_uppercase())
                    };
                    format!("{}: {}{region}{status}", v.key, v.variant)
                })
                .collect::<Vec<_>>()
                .join(", ");
            (text, if any_bad { red() } else { green() })
        };
        t.row(vec![
            (k.package.clone(), Style::new()),
            (k.kernel.clone(), Style::new().bold()),
            (format!("{} ({})", k.reference, k.entry), Style::new()),
            (k.shapes.len().to_string(), Style::new()),
            (
                if k.tunables.is_empty() {
                    "–".into()
                } else {
                    k.tunables.join(" ")
                },
                Style::new(),
            ),
            variants,
        ]);
    }
    let _ = write!(out, "{}", t.render());
    for k in listed {
        for v in k.variants.iter().filter(|v| v.status != "active") {
            let _ = writeln!(
                out,
                "{}{}/{} for {} is {}: {}{:#}",
                yellow(),
                k.kernel,
                v.variant,
                v.key,
                v.status,
                v.reason.as_deref().unwrap_or(""),
                yellow()
            );
        }
    }
    if !g.errors.is_empty() {
        let _ = writeln!(
            out,
            "{}{} annotation(s) do not parse; `cargo kopt check` lists them{:#}",
            red(),
            g.errors.len(),
            red()
        );
    }
}
