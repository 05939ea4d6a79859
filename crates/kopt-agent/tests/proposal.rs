//! The proposal schema: extraction from replies, validation against the kernel, diffs,
//! the repair prompt, and the schema itself (snapshot).

use kopt_agent::proposal::{self, extract_json, repair_prompt};

fn spec() -> kopt_spec::KernelSpec {
    let item = kopt_spec::spec::parse_item(
        "pub fn scale(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: u32);"
            .parse()
            .unwrap(),
    )
    .unwrap();
    kopt_spec::spec::parse_kernel("reference = \"k.cu\", x: [n], y: [n], grid = ceil_div(n, 256), block = 256, shapes = [{ n: 4096 }]".parse().unwrap(), &item).unwrap().0
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
