//! Context assembly on the example's real softmax: the prompts are snapshot-tested, and
//! the budget trims what matters least first.

use kopt_agent::context::{self, CaseLine, ContextInput, Feedback};

mod common;

fn softmax() -> (kopt_spec::KernelSpec, String) {
    common::example_kernel("softmax")
}

fn input<'a>(spec: &'a kopt_spec::KernelSpec, source: &'a str, budget: usize) -> ContextInput<'a> {
    ContextInput {
        spec,
        round: 2,
        best_label: "reference".into(),
        best_source: source,
        best_launch: [
            "rows, 1, 1".into(),
            "256, 1, 1".into(),
            "0".into(),
            String::new(),
        ],
        device: "NVIDIA H200 (sm_90, 132 SMs, 60 MiB L2)".into(),
        ceilings: "copy 4212 GB/s; bf16 matmul 771 TFLOP/s".into(),
        figures: vec![
            "cols=4096 rows=4096: 64.61 µs, 49.4% of copy bandwidth".into(),
            "cols=65536 rows=16: 195.88 µs, 1.0% of copy bandwidth (16 blocks on 132 SMs)".into(),
        ],
        regions: vec!["`cols <= 1024`: warp-row (1.22x over the best on those shapes; region found by kopt)".into()],
        snapshot: Some("memory-bound (extra passes): dram 49% of peak; 3 global loads per element".into()),
        structure: "3 loops over cols (stride blockDim.x); 2 block reductions through shared memory (32 floats); no atomics".into(),
        cases: (1..=6)
            .map(|i| CaseLine { title: format!("case {i}"), outcome: "accepted, 1.5x".into(), diagnosis: "extra passes".into(), change: "online softmax".into(), similarity: 0.6 * (1.0 - i as f64 / 8.0) + 0.4 * (1.0 - i as f64 / 12.0), metric_similarity: Some(1.0 - i as f64 / 8.0), text_similarity: 1.0 - i as f64 / 12.0 })
            .collect(),
        history: vec![
            Feedback { round: 1, candidate: "vec4".into(), verdict: "rejected: compile".into(), details: vec!["kernel.cu(12): error: identifier \"float4x\" is undefined".into()] },
            Feedback { round: 1, candidate: "warp".into(), verdict: "rejected: numerics".into(), details: vec!["y: 16 of 16777216 elements fail; first at index 4095 (rows=0, cols=4095): got NaN, want 0.0002".into()] },
            Feedback { round: 1, candidate: "online".into(), verdict: "accepted, 1.31x on cols=4096 rows=4096, 0.98x on cols=65536 rows=16".into(), details: vec!["dram throughput 49% -> 63%".into()] },
        ],
        hint: Some("The 16x65536 shape matters most for us.".into()),
        budget_tokens: budget,
    }
}

#[test]
fn the_propose_prompt() {
    let (spec, src) = softmax();
    let req = context::propose(&input(&spec, &src, 50_000), "{\"$schema\": \"...\"}").unwrap();
    insta::assert_snapshot!("system", req.system);
    insta::assert_snapshot!("propose", req.messages[0].content);
}

#[test]
fn the_budget_trims_history_then_cases_then_source() {
    let (spec, src) = softmax();
    let full = context::propose(&input(&spec, &src, 50_000), "{}").unwrap();
    let full_tokens = context::tokens(&full.system) + context::tokens(&full.messages[0].content);
    let tight = context::propose(&input(&spec, &src, full_tokens - 100), "{}").unwrap();
    let text = &tight.messages[0].content;
    assert!(
        !text.contains("round 1, `vec4`"),
        "the oldest feedback goes first"
    );
    assert!(text.contains("round 1, `online`"));
    let tiny = context::propose(&input(&spec, &src, full_tokens - 600), "{}");
    match tiny {
        Ok(r) => assert!(
            r.messages[0]
                .content
                .contains("trimmed to the entry function"),
            "{}",
            r.messages[0].content
        ),
        Err(e) => assert!(e.contains("over the budget"), "{e}"),
    }
    let err = context::propose(&input(&spec, &src, 100), "{}").unwrap_err();
    assert!(err.contains("over the budget of 100"), "{err}");
}

#[test]
fn every_template_placeholder_is_filled() {
    let e = context::fill(
        "a {{x}} b {{y}}",
        &std::collections::BTreeMap::from([("x", "1".to_string())]),
    )
    .unwrap_err();
    assert_eq!(e, "the template needs `y`");
    assert!(context::entry_region("__device__ int f() { return 1; }\nextern \"C\" __global__ void k(int* y) {\n  if (1) { y[0] = f(); }\n}\nint tail;\n", "k").unwrap().ends_with("y[0] = f(); }\n}"));
}

#[test]
fn a_cluster_set_at_launch_is_shown_with_the_launch_rule() {
    let (spec, src) = softmax();
    let plain = context::propose(&input(&spec, &src, 50_000), "{}").unwrap();
    assert!(!plain.messages[0].content.contains("set at launch"));
    let mut with = input(&spec, &src, 50_000);
    with.best_launch[3] = "if rows < 256 { 8 } else { 1 }, 1, 1".into();
    let req = context::propose(&with, "{}").unwrap();
    assert!(
        req.messages[0].content.contains(
            "block (256, 1, 1), clusters of (if rows < 256 { 8 } else { 1 }, 1, 1) blocks set at launch, dynamic shared memory 0 bytes"
        ),
        "{}",
        req.messages[0].content
    );
}

/// With `args`, the prompt lists the kernel's own arguments in order (what a candidate's
/// signature must take), then the launch-only scalars, so that an agent neither drops the
/// computed `block_size` nor adds `rows`.
#[test]
fn the_prompt_lists_the_kernels_arguments_not_the_launchers() {
    let item = kopt_spec::spec::parse_item(
        "pub fn softmax(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, ncols: u32);"
            .parse()
            .unwrap(),
    )
    .unwrap();
    let spec = kopt_spec::spec::parse_kernel(
        "reference = \"k.cu\", entry = \"softmax_f32\", x: [rows * ncols], y: [rows * ncols], args = (x, y, ncols, block_size: i32 = block_x), grid = rows, block = BLOCK, shapes = [{ rows: 8, ncols: 1000 }], tunables = { BLOCK: [256] }"
            .parse()
            .unwrap(),
        &item,
    )
    .unwrap()
    .0;
    let src = "extern \"C\" __global__ void softmax_f32(const float* x, float* y, const int ncols, const int block_size) {}\n";
    let req = context::propose(&input(&spec, src, 50_000), "{}").unwrap();
    let line = req.messages[0]
        .content
        .lines()
        .find(|l| l.starts_with("- arguments: "))
        .unwrap()
        .to_string();
    assert_eq!(
        line,
        "- arguments: x (f32 in, rows * ncols elements); y (f32 out, rows * ncols elements); ncols: u32; block_size: i32 = block_x (computed by the launcher for each launch); rows: u32 (launch only: sizes the launch, not a kernel argument)"
    );
}
