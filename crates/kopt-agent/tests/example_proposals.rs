//! The hand-written proposals of the example crate's scripted agent
//! (`examples/llm-kernels/agents/KERNEL.proposal.json`, answered through `cmd:`) are what
//! the loop accepts: each parses and validates against its kernel's spec, its source is
//! the readable `.cu` file beside it, and its launch rule gives a launchable geometry on
//! every declared shape.

mod common;

use std::collections::BTreeMap;

use kopt_agent::proposal;
use kopt_spec::expr::{self, Ty, VarKind};

#[test]
fn every_scripted_proposal_is_valid_for_its_kernel() {
    let dir = common::example_root().join("agents");
    let mut sources: Vec<(String, String)> = Vec::new();
    let mut proposals: Vec<(String, String)> = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        if let Some(kernel) = name.strip_suffix(".proposal.json") {
            proposals.push((kernel.to_string(), text));
        } else if name.ends_with(".cu") {
            sources.push((name, text));
        }
    }
    proposals.sort();
    let kernels: Vec<&str> = proposals.iter().map(|(k, _)| k.as_str()).collect();
    for k in ["gemm", "layer_norm", "rmsnorm", "silu_mul", "transpose"] {
        assert!(kernels.contains(&k), "no proposal for {k} in {kernels:?}");
    }

    for (kernel, text) in &proposals {
        let (spec, reference) = common::example_kernel(kernel);
        let resolved = proposal::parse(text, &spec, &reference)
            .unwrap_or_else(|e| panic!("{kernel}.proposal.json: {e:?}"));
        for r in resolved {
            assert!(
                sources.iter().any(|(_, s)| *s == r.source),
                "{kernel}: the proposal's source is none of the .cu files in agents/ (regenerate the JSON from the .cu file)"
            );
            let Some(launch) = &r.proposal.launch else {
                continue;
            };
            let defines: BTreeMap<String, i64> = r.proposal.defines.clone();
            let define_names: Vec<&str> = defines.keys().map(String::as_str).collect();
            let kinds = |n: &str| {
                spec.var_kind_with(n, &define_names)
                    .or_else(|| define_names.contains(&n).then_some(VarKind::Int))
            };
            let compile = |text: &str| {
                let e = expr::parse_str(text, Ty::Int, &kinds, &spec.int_names()).unwrap();
                spec.compile_expr(&e, &defines).unwrap()
            };
            let grid: Vec<_> = launch.grid.iter().map(|t| compile(t)).collect();
            let block: Vec<_> = launch.block.iter().map(|t| compile(t)).collect();
            let smem = compile(&launch.smem);
            for shape in &spec.shapes {
                let args = spec.shape_args(shape);
                let g: Vec<i64> = grid.iter().map(|p| expr::eval(p, &args).unwrap()).collect();
                let b: Vec<i64> = block
                    .iter()
                    .map(|p| expr::eval(p, &args).unwrap())
                    .collect();
                let s = expr::eval(&smem, &args).unwrap();
                let label = kopt_spec::spec::shape_label(shape);
                assert!(
                    g.iter().all(|&v| v > 0) && g[1] <= 65535 && g[2] <= 65535,
                    "{kernel} {label}: grid {g:?}"
                );
                assert!(
                    b.iter().all(|&v| v > 0) && b.iter().product::<i64>() <= 1024,
                    "{kernel} {label}: block {b:?}"
                );
                // An H200's opt-in shared memory per block is 227 KiB.
                assert!((0..=227 * 1024).contains(&s), "{kernel} {label}: smem {s}");
            }
        }
    }
}
