//! `examples/candle-ops` (a candle crate, its own workspace) checked without a GPU:
//!
//! - its `kernels/candle/` files are candle-kernels' own, byte for byte, at the version its
//!   Cargo.lock pins (found through `cargo metadata` of the example), so that "candle's
//!   kernels" stays true when either side changes;
//! - the hand-written candidates that `agents/scripted-agent.sh` feeds to `cargo kopt
//!   optimize` (each source written out from the accepted variant it points at) are
//!   proposals the loop accepts (kopt_agent::proposal::parse), and their launch rules give
//!   every declared and held-out shape a geometry the kernels are written for (whole warps, each row once);
//! - each candidate and each reference compiles with NVRTC for sm_90, with its entry in
//!   the module and without spills (with the wheels' NVRTC, as CI has it);
//! - `cargo kopt check` passes on it (its committed files, and the compile fence over its
//!   references and accepted variants);
//! - the example builds: `cargo check` of it with the wheels' nvcc (candle-kernels' build
//!   script compiles its kernels with it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use kopt_agent::proposal::{self, ProposalSet};
use kopt_spec::spec::KernelSpec;
use kopt_tests::repo_root;

/// The files of `kernels/candle/` that are candle-kernels' (`src/` of the crate).
const CANDLE_FILES: [&str; 3] = ["reduce.cu", "cuda_utils.cuh", "compatibility.cuh"];
/// The other files there: candle's licence texts and the folder's note.
const NOTICE_FILES: [&str; 3] = ["LICENSE-APACHE", "LICENSE-MIT", "README.md"];

fn example() -> PathBuf {
    repo_root().join("examples/candle-ops")
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

#[test]
fn kernel_sources_are_candle_kernels_files_byte_for_byte() {
    let out = Command::new(cargo())
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--manifest-path",
        ])
        .arg(example().join("Cargo.toml"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo metadata of examples/candle-ops failed (it needs crates.io, or the crates in cargo's cache):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kernels: Vec<&serde_json::Value> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"] == "candle-kernels")
        .collect();
    assert_eq!(kernels.len(), 1, "one candle-kernels in the example's lock");
    let version = kernels[0]["version"].as_str().unwrap();
    let src = Path::new(kernels[0]["manifest_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .join("src");
    let ours = example().join("kernels/candle");
    for f in CANDLE_FILES {
        let theirs = std::fs::read(src.join(f)).unwrap();
        let mine = std::fs::read(ours.join(f)).unwrap();
        assert!(
            theirs == mine,
            "examples/candle-ops/kernels/candle/{f} differs from candle-kernels {version}'s src/{f} ({}): copy it again (and re-verify the variants) after a candle upgrade",
            src.join(f).display()
        );
    }
    let mut present: Vec<String> = std::fs::read_dir(&ours)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    let mut expected: Vec<String> = CANDLE_FILES
        .iter()
        .chain(&NOTICE_FILES)
        .map(|s| s.to_string())
        .collect();
    expected.sort();
    assert_eq!(
        present, expected,
        "kernels/candle/ holds candle's files and their notice only"
    );
    assert_eq!(
        version, "0.11.1",
        "the example's README and kernels name candle 0.11.1"
    );
}

fn kernels() -> Vec<kopt_workspace::gather::Kernel> {
    let g =
        kopt_workspace::gather::gather_crate("candle-ops", &example(), &repo_root().join("target"));
    assert!(g.errors.is_empty(), "{:?}", g.errors);
    g.kernels
}

/// What the example's scripted agent answers the loop for `kernel`: its one proposal.
fn proposal_text(kernel: &str) -> String {
    let text = kopt_tests::scripted_answer(&example().join("agents"), kernel);
    let set: ProposalSet = serde_json::from_str(&text).unwrap();
    assert_eq!(set.proposals.len(), 1, "{kernel}: one candidate");
    text
}

fn eval(
    spec: &KernelSpec,
    defines: &BTreeMap<String, i64>,
    text: &str,
    vars: &[(&str, i64)],
) -> i64 {
    kopt_tests::parse_launch_expr(spec, defines, text)
        .eval_named(vars)
        .unwrap()
}

#[test]
fn every_candidate_is_a_valid_proposal_launchable_on_every_shape() {
    let mut checked = Vec::new();
    for k in kernels() {
        let name = k.spec.name.clone();
        let text = proposal_text(&name);
        let resolved = proposal::parse(&text, &k.spec, &k.reference.text)
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(resolved.len(), 1, "{name}");
        let p = &resolved[0].proposal;
        let launch = p
            .launch
            .as_ref()
            .expect("the candidates have their own launch rule");
        let cache = p.defines["CACHE"];
        // 16-byte vectors: 8 bf16 or 4 f32.
        let per_vector = if name.ends_with("bf16") { 8 } else { 4 };
        let declared = k.spec.shapes.len();
        for (i, values) in kopt_tests::every_drawable_shape(&k.spec).iter().enumerate() {
            let mut vars: Vec<(&str, i64)> = values
                .iter()
                .filter_map(|(n, v)| v.as_i64().map(|i| (n.as_str(), i)))
                .collect();
            vars.extend(p.defines.iter().map(|(n, v)| (n.as_str(), *v)));
            let at = |e: &str| eval(&k.spec, &p.defines, e, &vars);
            let g: Vec<i64> = launch.grid.iter().map(|e| at(e)).collect();
            let b: Vec<i64> = launch.block.iter().map(|e| at(e)).collect();
            let (rows, ncols) = (at("rows"), at("ncols"));
            let shape = format!("{name} {values:?}: grid {g:?} block {b:?}");
            assert_eq!(at(&launch.smem), 0, "{shape}");
            assert!(
                g.iter().all(|&d| d >= 1) && b.iter().all(|&d| d >= 1),
                "{shape}"
            );
            assert_eq!((g[1], g[2], b[2]), (1, 1, 1), "{shape}");
            // A row's threads: a power of two, within one warp's aligned lanes or whole
            // warps (row_reduce's shuffles), and the block whole warps (full-mask shuffles).
            assert!(b[0].count_ones() == 1 && b[0] <= 1024, "{shape}");
            assert!(b[0] * b[1] <= 1024 && (b[0] * b[1]) % 32 == 0, "{shape}");
            assert!(
                b[1] == 1 || b[0] < 32,
                "{shape}: several rows a block only below a warp a row"
            );
            // The kernel is not told the row count: the grid covers each row exactly once.
            assert_eq!(g[0] * b[1], rows, "{shape}");
            if i < declared {
                // The declared shapes are read once: the row fits the registers.
                assert_eq!(ncols % per_vector, 0, "{shape}");
                let vectors_per_thread = (ncols / per_vector + b[0] - 1) / b[0];
                assert!(
                    vectors_per_thread <= cache,
                    "{shape}: {vectors_per_thread} vectors a thread, CACHE = {cache}"
                );
            }
        }
        checked.push(name);
    }
    checked.sort();
    assert_eq!(
        checked,
        ["rmsnorm_bf16", "rmsnorm_f32", "softmax_bf16", "softmax_f32"]
    );
}

#[test]
fn every_candidate_and_reference_compiles_with_nvrtc_for_sm_90_without_spills() {
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    // (kernel, version, source, options, entry); one compile per distinct source and
    // options (the four references are one file).
    let mut versions = Vec::new();
    for k in kernels() {
        let name = k.spec.name.clone();
        let p = proposal::parse(&proposal_text(&name), &k.spec, &k.reference.text)
            .unwrap()
            .remove(0);
        let mut options: Vec<String> = p
            .proposal
            .defines
            .iter()
            .map(|(d, v)| format!("-D{d}={v}"))
            .collect();
        options.extend(p.proposal.options.iter().cloned());
        let entry = k.spec.entry.clone();
        versions.push((
            name.clone(),
            "reference",
            k.reference.text.clone(),
            k.spec.options.clone(),
            entry.clone(),
        ));
        versions.push((name, "candidate", p.source, options, entry));
    }
    let mut compiled: Vec<((String, Vec<String>), kopt::Native)> = Vec::new();
    for (name, version, source, options, entry) in &versions {
        let key = (source.clone(), options.clone());
        if !compiled.iter().any(|(k, _)| *k == key) {
            let mut opts: Vec<&str> = options.iter().map(String::as_str).collect();
            opts.push("--ptxas-options=-v");
            let native = kopt::compile_native(name, version, source, &opts, "sm_90", None)
                .unwrap_or_else(|e| panic!("{name} {version}: {e}"));
            compiled.push((key.clone(), native));
        }
        let native = &compiled.iter().find(|(k, _)| *k == key).unwrap().1;
        let entries = kopt::ptxas_entries(&native.log);
        let e = entries
            .iter()
            .find(|e| e.name == *entry)
            .unwrap_or_else(|| panic!("{name} {version}: no entry `{entry}` in {entries:?}"));
        assert_eq!(
            (e.spill_stores, e.spill_loads, e.stack_bytes),
            (0, 0, 0),
            "{name} {version}: {e:?}"
        );
        if *version == "candidate" {
            let warnings: Vec<&str> = native
                .log
                .lines()
                .filter(|l| !l.starts_with("ptxas") && !l.trim().is_empty())
                .collect();
            assert!(warnings.is_empty(), "{name} {version}: {warnings:?}");
            // At most 64 registers: the candidates launch up to 1024 threads a block.
            assert!(e.registers <= 64, "{name} {version}: {e:?}");
        }
        eprintln!(
            "{name} {version}: {} registers, {} bytes of static shared memory",
            e.registers, e.shared_bytes
        );
    }
}

/// `cargo kopt check` of the example: its committed files (lock files and the accepted
/// variants, once the loop has produced them) intact and current, and, with NVRTC, the
/// compile fence: every reference and accepted variant compiled for its architecture.
#[test]
fn kopt_check_passes_on_the_example() {
    let g =
        kopt_workspace::gather::gather_crate("candle-ops", &example(), &repo_root().join("target"));
    let checked = kopt_workspace::commands::check(&g);
    assert!(checked.problems.is_empty(), "{:?}", checked.problems);
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    match kopt_workspace::compile_check::compile_check(&g) {
        kopt_workspace::compile_check::CompileCheck::Ran {
            versions, problems, ..
        } => {
            assert!(problems.is_empty(), "{problems:?}");
            let references = versions.iter().filter(|v| v.version == "reference").count();
            assert!(references >= 4, "{versions:?}");
        }
        other => panic!("NVRTC loads, yet the compile fence did not run: {other:?}"),
    }
}

/// `cargo check` of the example, as a user with the wheels would run it: candle-kernels'
/// build script compiles candle's kernels with the wheels' nvcc (what takes most of the
/// time), then every target of the example is checked against candle and kopt, in the
/// folder other workspaces' checks share (`kopt_tests::cargo_check_other_workspace`).
#[test]
fn the_example_checks_with_the_wheels_nvcc() {
    if !kopt_tests::nvcc_or_skip() {
        return;
    }
    let out = kopt_tests::cargo_check_other_workspace(
        &example(),
        &["--locked", "--all-targets"],
        // No GPU to ask: the H200's architecture.
        &[("CUDA_COMPUTE_CAP", std::ffi::OsStr::new("90"))],
    );
    assert!(
        out.status.success(),
        "cargo check of examples/candle-ops failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
