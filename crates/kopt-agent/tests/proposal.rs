//! The proposal schema: extraction from replies, validation against the kernel, diffs,
//! the repair prompt, and the schema itself (snapshot).

use kopt_agent::proposal::{self, extract_json, repair_prompt};

fn spec() -> kopt_spec::KernelSpec {
    spec_of("reference = \"k.cu\", x: [n], y: [n], grid = ceil_div(n, 256), block = 256, shapes = [{ n: 4096 }]")
}

/// `scale(x, y, n)` under `annotation`.
fn spec_of(annotation: &str) -> kopt_spec::KernelSpec {
    let item = kopt_spec::spec::parse_item(
        "pub fn scale(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);"
            .parse()
            .unwrap(),
    )
    .unwrap();
    kopt_spec::spec::parse_kernel(annotation.parse().unwrap(), &item)
        .unwrap()
        .0
}

const BEST: &str = "extern \"C\" __global__ void scale(const float* x, float* y, unsigned n) {\n    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] = 2.0f * x[i];\n}\n";

fn reply(candidate: serde_json::Value) -> String {
    serde_json::json!({
        "proposals": [{
            "diagnosis": { "bottleneck": "memory-bound", "summary": "4-byte loads", "evidence": ["dram 61% of peak", "LDG.E.32 only"] },
            "changes": [{ "what": "float4 loads", "why": "16 bytes per request raises bytes in flight" }],
            "risks": ["misaligned rows"],
            "expected": [{ "metric": "dram throughput", "change": "from 61% to above 85%" }],
            "candidate": candidate,
            "launch": { "grid": ["ceil_div(n, 1024)", "1", "1"], "block": ["BLOCK", "1", "1"] },
            "defines": { "BLOCK": 256 },
            "matrix": { "BLOCK": [128, 256, 512] }
        }]
    })
    .to_string()
}

#[test]
fn a_fenced_reply_with_a_full_source_validates() {
    let src = BEST.replace("2.0f * x[i]", "x[i] + x[i]");
    let text = format!(
        "Here is my proposal.\n```json\n{}\n```\nThanks.",
        reply(serde_json::json!({ "source": src }))
    );
    let got = proposal::parse(&text, &spec(), BEST).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].source, src);
    assert_eq!(
        got[0].proposal.matrix.as_ref().unwrap()["BLOCK"],
        vec![128, 256, 512]
    );
}

#[test]
fn a_diff_is_applied_to_the_current_best() {
    let diff = "--- a/kernel.cu\n+++ b/kernel.cu\n@@ -1,4 +1,4 @@\n extern \"C\" __global__ void scale(const float* x, float* y, unsigned n) {\n     unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n-    if (i < n) y[i] = 2.0f * x[i];\n+    if (i < n) y[i] = x[i] + x[i];\n }\n";
    let got = proposal::parse(&reply(serde_json::json!({ "diff": diff })), &spec(), BEST).unwrap();
    assert!(got[0].source.contains("x[i] + x[i]"));
    let stale = BEST.replace("2.0f", "3.0f");
    let errs =
        proposal::parse(&reply(serde_json::json!({ "diff": diff })), &spec(), &stale).unwrap_err();
    assert!(errs[0].contains("the diff does not apply"), "{errs:?}");
}

#[test]
fn malformed_replies_get_errors_a_model_can_act_on() {
    let s = spec();
    assert_eq!(
        proposal::parse("I think you should vectorise.", &s, BEST).unwrap_err(),
        vec!["the reply holds no JSON object".to_string()]
    );
    let errs = proposal::parse("{\"proposals\": [{\"diagnosis\": 3}]}", &s, BEST).unwrap_err();
    assert!(
        errs[0].starts_with("the JSON does not match the schema"),
        "{errs:?}"
    );
    let renamed = BEST.replace("void scale(", "void scale2(");
    let errs =
        proposal::parse(&reply(serde_json::json!({ "source": renamed })), &s, BEST).unwrap_err();
    assert!(
        errs[0].contains("defines no `__global__` function `scale`"),
        "{errs:?}"
    );
    let errs = proposal::parse(&reply(serde_json::json!({})), &s, BEST).unwrap_err();
    assert!(errs[0].contains("neither `source` nor `diff`"));
    let bad_launch = reply(serde_json::json!({ "source": BEST }))
        .replace("ceil_div(n, 1024)", "ceil_div(rows, 1024)");
    let errs = proposal::parse(&bad_launch, &s, BEST).unwrap_err();
    assert!(
        errs[0].contains("launch grid") && errs[0].contains("unknown name `rows`"),
        "{errs:?}"
    );
    let prompt = repair_prompt(&errs);
    assert!(
        prompt.contains("- proposal 1: launch grid") && prompt.contains("only one JSON object")
    );
}

#[test]
fn json_is_found_in_its_usual_wrappings() {
    assert_eq!(extract_json("{\"a\":1}"), Some("{\"a\":1}"));
    assert_eq!(
        extract_json("text ```json\n{\"a\":1}\n``` more"),
        Some("{\"a\":1}")
    );
    assert_eq!(
        extract_json("noise {\"a\":{\"b\":2}} tail"),
        Some("{\"a\":{\"b\":2}}")
    );
    assert_eq!(extract_json("no braces"), None);
}

#[test]
fn the_schema_given_to_models() {
    insta::assert_json_snapshot!(proposal::schema());
}

/// The reply of `reply`, its matrix replaced, with a source that tests `UNROLL` and
/// mentions `STRIDE` only in a comment.
fn with_matrix(matrix: serde_json::Value) -> String {
    let src = format!(
        "#ifndef UNROLL\n#define UNROLL 1\n#endif\n// STRIDE would be a parameter one day\n{BEST}"
    );
    let mut v: serde_json::Value =
        serde_json::from_str(&reply(serde_json::json!({ "source": src }))).unwrap();
    v["proposals"][0]["matrix"] = matrix;
    v.to_string()
}

#[test]
fn a_matrix_names_defines_the_candidate_uses() {
    let s = spec();
    // `BLOCK` is in `defines`, `UNROLL` is tested by the source: both may be searched.
    let ok = proposal::parse(
        &with_matrix(serde_json::json!({ "BLOCK": [128, 512], "UNROLL": [1, 2, 4] })),
        &s,
        BEST,
    )
    .unwrap();
    assert_eq!(ok[0].proposal.matrix.as_ref().unwrap().len(), 2);
    // An empty matrix asks for nothing.
    assert!(proposal::parse(&with_matrix(serde_json::json!({})), &s, BEST).is_ok());
    let errs = proposal::parse(
        &with_matrix(serde_json::json!({ "BLCOK": [128], "STRIDE": [1, 2] })),
        &s,
        BEST,
    )
    .unwrap_err();
    assert_eq!(
        errs,
        vec![
            "proposal 1: matrix key `BLCOK` is not a define the candidate uses: list it in `defines` (with the candidate's own value) or use it in the source, or drop it from `matrix`".to_string(),
            "proposal 1: matrix key `STRIDE` is not a define the candidate uses: list it in `defines` (with the candidate's own value) or use it in the source, or drop it from `matrix`".to_string(),
        ],
        "a typo, and a name only a comment mentions"
    );
    let errs =
        proposal::parse(&with_matrix(serde_json::json!({ "n": [1, 2] })), &s, BEST).unwrap_err();
    assert!(
        errs[0].contains("matrix key `n` is an argument of the kernel, not a define"),
        "{errs:?}"
    );
    // A computed kernel argument is a parameter of the source too.
    let item = kopt_spec::spec::parse_item(
        "pub fn scale(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);"
            .parse()
            .unwrap(),
    )
    .unwrap();
    let computed = kopt_spec::spec::parse_kernel("reference = \"k.cu\", x: [n], y: [n], args = (x, y, n, threads: u32 = block_x), grid = ceil_div(n, 256), block = 256, shapes = [{ n: 4096 }]".parse().unwrap(), &item).unwrap().0;
    let errs = proposal::parse(
        &with_matrix(serde_json::json!({ "threads": [1, 2] })),
        &computed,
        BEST,
    )
    .unwrap_err();
    assert!(
        errs[0].contains("matrix key `threads` is an argument of the kernel, not a define"),
        "{errs:?}"
    );
    let errs =
        proposal::parse(&with_matrix(serde_json::json!({ "2X": [1] })), &s, BEST).unwrap_err();
    assert!(
        errs[0].contains("`2X` is not a preprocessor name"),
        "{errs:?}"
    );
}

#[test]
fn a_matrix_lists_each_value_once_and_stays_small() {
    let s = spec();
    let errs = proposal::parse(
        &with_matrix(serde_json::json!({ "BLOCK": [], "UNROLL": [2, 4, 2] })),
        &s,
        BEST,
    )
    .unwrap_err();
    assert!(
        errs.iter()
            .any(|e| e.contains("matrix `BLOCK` lists no values: give at least one")),
        "{errs:?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.contains("matrix `UNROLL` lists 2 more than once")),
        "{errs:?}"
    );
    // 1024 points pass (a matrix over 16 is hill-climbed, not swept); 1025 do not.
    assert!(proposal::parse(
        &with_matrix(serde_json::json!({ "BLOCK": (1..=32).collect::<Vec<i64>>(), "UNROLL": (1..=32).collect::<Vec<i64>>() })),
        &s,
        BEST
    )
    .is_ok());
    let errs = proposal::parse(
        &with_matrix(
            serde_json::json!({ "BLOCK": (1..=41).collect::<Vec<i64>>(), "UNROLL": (1..=25).collect::<Vec<i64>>() }),
        ),
        &s,
        BEST,
    )
    .unwrap_err();
    assert_eq!(
        errs,
        vec!["proposal 1: the matrix has 1025 points (41 `BLOCK` x 25 `UNROLL`), more than the 1024 the loop searches for one candidate: keep the values you expect to matter (at most 1024 combinations)".to_string()]
    );
    assert!(repair_prompt(&errs).contains("- proposal 1: the matrix has 1025 points"));
}

#[test]
fn matrix_points_are_every_combination_in_a_fixed_order() {
    let m = std::collections::BTreeMap::from([
        ("VEC".to_string(), vec![4, 1]),
        ("BLOCK".to_string(), vec![128, 256]),
    ]);
    let points: Vec<String> = proposal::matrix_points(&m)
        .iter()
        .map(kopt_agent::run::describe_defines)
        .collect();
    assert_eq!(
        points,
        [
            "BLOCK=128 VEC=4",
            "BLOCK=128 VEC=1",
            "BLOCK=256 VEC=4",
            "BLOCK=256 VEC=1"
        ]
    );
    assert_eq!(proposal::EXHAUSTIVE_MATRIX_POINTS, 16);
    assert_eq!(proposal::MAX_MATRIX_POINTS, 1024);
    assert!(proposal::matrix_points(&Default::default()).is_empty());
}

#[test]
fn a_cluster_set_at_launch_is_validated_and_carried_into_the_candidate() {
    let s = spec();
    let with_cluster = |cluster: &str| {
        reply(serde_json::json!({ "source": BEST })).replace(
            "\"block\":[\"BLOCK\",\"1\",\"1\"]",
            &format!("\"block\":[\"BLOCK\",\"1\",\"1\"],\"cluster\":[{cluster},\"1\",\"1\"]"),
        )
    };
    let text = with_cluster("\"if n < 8192 { 4 } else { 1 }\"");
    assert!(text.contains("\"cluster\""), "{text}");
    let got = proposal::parse(&text, &s, BEST).unwrap();
    let best = kopt_engine::job::KernelVersion::reference(&s, BEST);
    let v = kopt_agent::run::candidate_version(&best, "r1c1", &got[0]);
    let cluster = v.launch.cluster.as_ref().expect("the proposal's cluster");
    assert_eq!(cluster[0].to_string(), "if n < 8192 { 4 } else { 1 }");
    // 4096 elements: a grid of 4 blocks of 1024, in one cluster of 4.
    assert_eq!(v.geometry(&s, &[4096]).unwrap().cluster, [4, 1, 1]);
    // A name the kernel does not have is refused like any other launch expression.
    let errs = proposal::parse(&with_cluster("\"rows\""), &s, BEST).unwrap_err();
    assert!(
        errs[0].contains("launch cluster") && errs[0].contains("unknown name `rows`"),
        "{errs:?}"
    );
}

#[test]
fn a_candidate_may_take_a_tensor_map_the_annotation_declares() {
    let spec = spec_of(
        "reference = \"k.cu\", x: [n], y: [n], tensor_maps = { x_map: tensor_map(x, dims = [n], box = [256]) }, grid = ceil_div(n, 256), block = 256, shapes = [{ n: 4096 }]",
    );
    let src = BEST.replace("const float* x", "const __grid_constant__ TensorMap x_map");
    let with_args =
        |args: serde_json::Value| reply(serde_json::json!({ "source": src, "args": args }));
    let got = proposal::parse(
        &with_args(serde_json::json!(["x_map", "y", "n"])),
        &spec,
        BEST,
    )
    .unwrap();
    assert_eq!(
        got[0].proposal.candidate.args.as_deref(),
        Some(&["x_map".to_string(), "y".into(), "n".into()][..])
    );
    let errs = proposal::parse(
        &with_args(serde_json::json!(["x_mapp", "y", "n"])),
        &spec,
        BEST,
    )
    .unwrap_err();
    assert!(
        errs.iter()
            .any(|e| e.contains("`candidate.args`") && e.contains("did you mean `x_map`?")),
        "{errs:?}"
    );
    let errs = proposal::parse(&with_args(serde_json::json!(["y", "n"])), &spec, BEST).unwrap_err();
    assert!(
        errs.iter().any(|e| e.contains("do not reach buffer `x`")),
        "{errs:?}"
    );
}
