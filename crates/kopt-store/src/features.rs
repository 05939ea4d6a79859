//! Lexical features of a kernel's CUDA source, for the case library: a structural summary
//! a person can read (loops, shared memory, synchronisation, atomics, vector access), the
//! identifier tokens for full-text search, and the kernel's kind.
//!
//! They are lexical on purpose (comments and strings removed, then words counted): cheap,
//! deterministic, and the same for a committed variant, a pending one, and a kernel never
//! seen before. They describe; they do not parse C++.

use kopt_spec::source::strip_comments;
use std::collections::BTreeSet;

/// The kinds of kernel the case library knows.
pub const KINDS: &[&str] = &[
    "softmax",
    "norm",
    "reduction",
    "attention",
    "gemm",
    "elementwise",
    "transpose",
    "scan",
    "other",
];

/// Whether `kind` is one of [`KINDS`].
pub fn is_kind(kind: &str) -> bool {
    KINDS.contains(&kind)
}

/// A kernel's kind from its name, then its source: the first rule that matches.
pub fn infer_kind(kernel: &str, source: &str) -> &'static str {
    let name = kernel.to_ascii_lowercase();
    let by_name: &[(&[&str], &str)] = &[
        (&["softmax"], "softmax"),
        (
            &["attn", "attention", "gqa", "mha", "mqa", "flash", "decode"],
            "attention",
        ),
        (&["norm"], "norm"),
        (&["gemm", "matmul", "mm_", "gemv"], "gemm"),
        (&["transpose", "permute"], "transpose"),
        (&["scan", "cumsum", "prefix"], "scan"),
        (
            &["reduce", "reduction", "sum", "argmax", "max_"],
            "reduction",
        ),
        (
            &[
                "add", "mul", "relu", "gelu", "silu", "scale", "cast", "copy", "axpy",
            ],
            "elementwise",
        ),
    ];
    for (needles, kind) in by_name {
        if needles.iter().any(|n| name.contains(n)) {
            return kind;
        }
    }
    let tokens = identifier_set(source);
    let has = |t: &str| tokens.contains(t);
    if has("mma_sync") || has("wmma") || has("ldmatrix") {
        "gemm"
    } else if tokens.iter().any(|t| t.starts_with("atomic"))
        || has("__shfl_down_sync")
        || has("__shfl_xor_sync")
    {
        "reduction"
    } else {
        "other"
    }
}

/// Identifiers and keywords, in order of appearance (numbers, comments, strings and
/// include paths left out).
fn identifiers(source: &str) -> Vec<String> {
    let code = strip_comments(source);
    let mut out = Vec::new();
    for line in code.lines() {
        // Preprocessor lines: `#include` and `#line` name files, not code; for the others
        // (`#define MAX_BLOCK 1024`) the directive's word is left out, its operands kept.
        let t = line.trim_start();
        let line = match t.strip_prefix('#') {
            Some(rest) => {
                let rest = rest.trim_start();
                if rest.starts_with("include") || rest.starts_with("line") {
                    continue;
                }
                rest.trim_start_matches(|c: char| c.is_ascii_alphabetic())
            }
            None => line,
        };
        let mut word = String::new();
        for c in line.chars().chain(std::iter::once(' ')) {
            if c.is_ascii_alphanumeric() || c == '_' {
                word.push(c);
            } else if !word.is_empty() {
                if !word.chars().next().is_some_and(|c| c.is_ascii_digit()) {
                    out.push(std::mem::take(&mut word));
                } else {
                    word.clear();
                }
            }
        }
    }
    out
}

fn identifier_set(source: &str) -> BTreeSet<String> {
    identifiers(source).into_iter().collect()
}

/// The distinct identifiers of the source, in order of first appearance, space-separated:
/// what full-text search indexes.
pub fn source_tokens(source: &str) -> String {
    let mut seen = BTreeSet::new();
    identifiers(source)
        .into_iter()
        .filter(|w| seen.insert(w.clone()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The full-text query that finds cases like `source`: its structural summary and its
/// identifiers (what the case library indexes for each case).
pub fn search_text(source: &str) -> String {
    format!("{} {}", structural_summary(source), source_tokens(source))
}

/// A one-line structural summary, e.g. `2 __global__ functions; 3 loops; static shared
/// memory; 4 __syncthreads; warp shuffles (6); vector access (float4); atomics
/// (atomicAdd); math (__expf)`.
pub fn structural_summary(source: &str) -> String {
    let words = identifiers(source);
    let count = |w: &str| words.iter().filter(|x| x.as_str() == w).count();
    let distinct = |pred: &dyn Fn(&str) -> bool| -> Vec<String> {
        let mut v: Vec<String> = words.iter().filter(|w| pred(w)).cloned().collect();
        v.sort();
        v.dedup();
        v
    };
    let mut parts = Vec::new();
    let globals = count("__global__");
    parts.push(format!(
        "{globals} __global__ function{}",
        if globals == 1 { "" } else { "s" }
    ));
    let loops = count("for") + count("while");
    parts.push(format!("{loops} loop{}", if loops == 1 { "" } else { "s" }));
    if count("__launch_bounds__") > 0 {
        parts.push("__launch_bounds__".into());
    }
    if count("template") > 0 {
        parts.push("templated".into());
    }
    let shared = count("__shared__");
    if shared > 0 {
        let dynamic = source_has_extern_shared(source);
        parts.push(if dynamic {
            "dynamic shared memory".into()
        } else {
            "static shared memory".into()
        });
    } else {
        parts.push("no shared memory".into());
    }
    let syncs = count("__syncthreads");
    if syncs > 0 {
        parts.push(format!("{syncs} __syncthreads"));
    }
    let shuffles = words.iter().filter(|w| w.starts_with("__shfl")).count();
    if shuffles > 0 {
        parts.push(format!("warp shuffles ({shuffles})"));
    }
    let vector = distinct(&|w: &str| {
        matches!(
            w,
            "float2"
                | "float4"
                | "int2"
                | "int4"
                | "uint2"
                | "uint4"
                | "half2"
                | "__half2"
                | "__nv_bfloat162"
                | "double2"
        )
    });
    if !vector.is_empty() {
        parts.push(format!("vector access ({})", vector.join(", ")));
    }
    let atomics = distinct(&|w: &str| w.starts_with("atomic") && w.len() > 6);
    if !atomics.is_empty() {
        parts.push(format!("atomics ({})", atomics.join(", ")));
    }
    let async_copy = distinct(&|w: &str| {
        w.starts_with("__pipeline")
            || w == "cp"
            || w.starts_with("cuda_pipeline")
            || w == "memcpy_async"
    });
    if !async_copy.is_empty() {
        parts.push("asynchronous copies".into());
    }
    let tensor = distinct(&|w: &str| matches!(w, "wmma" | "mma_sync" | "ldmatrix" | "mma"));
    if !tensor.is_empty() {
        parts.push("tensor cores".into());
    }
    if count("__ldg") > 0 {
        parts.push("read-only loads (__ldg)".into());
    }
    let math = distinct(&|w: &str| {
        matches!(
            w,
            "__expf"
                | "expf"
                | "exp"
                | "exp2f"
                | "__logf"
                | "logf"
                | "rsqrtf"
                | "sqrtf"
                | "__fdividef"
                | "tanhf"
                | "erff"
        )
    });
    if !math.is_empty() {
        parts.push(format!("math ({})", math.join(", ")));
    }
    parts.join("; ")
}

fn source_has_extern_shared(source: &str) -> bool {
    strip_comments(source).lines().any(|l| {
        let t: Vec<&str> = l.split_whitespace().collect();
        t.windows(2)
            .any(|w| w[0] == "extern" && w[1].starts_with("__shared__"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = r#"
// a comment with atomicAdd and float4 in it
#include "common.cuh"
extern "C" __global__ void __launch_bounds__(1024) softmax_f32(const float* x, float* y, int cols) {
    __shared__ float ws[32];
    /* block comment: for while */
    for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) {
        float4 v = reinterpret_cast<const float4*>(x)[i];
        m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 16));
    }
    __syncthreads();
    y[0] = __expf(1.0f);
}
"#;

    #[test]
    fn summary_counts_code_not_comments() {
        assert_eq!(
            structural_summary(SRC),
            "1 __global__ function; 1 loop; __launch_bounds__; static shared memory; 1 __syncthreads; warp shuffles (1); vector access (float4); math (__expf)"
        );
        let tokens = source_tokens(SRC);
        assert!(
            tokens.starts_with("extern __global__ void __launch_bounds__ softmax_f32"),
            "{tokens}"
        );
        assert!(
            !tokens.contains("atomicAdd") && !tokens.contains("comment"),
            "{tokens}"
        );
        assert!(
            !tokens.contains("1024") && !tokens.contains("0xffffffff"),
            "{tokens}"
        );
        assert!(
            !tokens.contains("common"),
            "include paths are strings: {tokens}"
        );
    }

    #[test]
    fn kinds() {
        assert_eq!(infer_kind("softmax", ""), "softmax");
        assert_eq!(infer_kind("rmsnorm", ""), "norm");
        assert_eq!(infer_kind("gqa_decode", ""), "attention");
        assert_eq!(infer_kind("reduce_sum", ""), "reduction");
        assert_eq!(
            infer_kind("k1", "__global__ void k1() { atomicAdd(p, 1); }"),
            "reduction"
        );
        assert_eq!(infer_kind("k2", "__global__ void k2() {}"), "other");
        assert!(KINDS.iter().all(|k| is_kind(k)) && !is_kind("conv"));
    }
}
