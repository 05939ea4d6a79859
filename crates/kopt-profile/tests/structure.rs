//! The structural summary on the example kernels' real sources (from the committed jobs),
//! evaluated for the shape each capture profiled.

mod common;

use kopt_profile::structure::{self, Env};

/// A loop as (pattern, condition, trips, trips with outer loops, depth).
type L = (String, String, Option<u64>, Option<u64>, u32);

fn loops(stem: &'static str) -> Vec<L> {
    let s = common::structure(&common::capture(stem));
    s.loops
        .iter()
        .map(|l| {
            (
                l.pattern.clone(),
                l.condition.clone(),
                l.trips,
                l.total_trips,
                l.depth,
            )
        })
        .collect()
}

fn l(p: &str, c: &str, t: u64, tt: u64, d: u32) -> L {
    (p.into(), c.into(), Some(t), Some(tt), d)
}

#[test]
fn softmax_reads_each_row_in_three_block_stride_passes() {
    let c = common::capture("softmax-shape0");
    let s = common::structure(&c);
    assert_eq!(
        s.functions,
        ["softmax_f32", "block_reduce", "warp_max", "warp_sum"]
    );
    assert_eq!(
        loops("softmax-shape0"),
        [
            l("block-stride", "c < cols", 16, 16, 0),
            l("block-stride", "c < cols", 16, 16, 0),
            l("block-stride", "c < cols", 16, 16, 0),
            l("sequential", "w < warps", 8, 8, 0),
            l("halving", "offset > 0", 5, 5, 0),
            l("halving", "offset > 0", 5, 5, 0),
        ]
    );
    assert_eq!(s.loops[0].at, "kernels/softmax.cu:13");
    assert_eq!(s.loops[3].at, "kernels/common.cuh:31");
    let x = &s.buffers[0];
    assert_eq!(
        (
            x.name.as_str(),
            x.element.as_str(),
            x.bits,
            x.reads,
            x.read_passes
        ),
        ("x", "float", Some(32), 3, 3)
    );
    assert_eq!((s.buffers[1].name.as_str(), s.buffers[1].writes), ("y", 1));
    assert_eq!(s.max_read_passes(), Some(("x", 3)));
    let sh = &s.shared[0];
    assert_eq!(
        (sh.name.as_str(), sh.size.as_str(), sh.bytes, sh.dynamic),
        ("scratch", "32", Some(128), false)
    );
    assert_eq!(
        sh.indices,
        ["warp", "w"],
        "the helper's accesses count for the caller's array"
    );
    assert_eq!((s.sync.syncthreads, s.sync.shuffles), (2, 2));
    assert!(s.atomics.is_empty() && s.local_arrays.is_empty());
    assert!(
        s.longest_serial_loop().is_none(),
        "no sequential loop reads global memory"
    );
}

#[test]
fn the_vec4_variant_reads_float4_in_two_passes() {
    let s = common::structure(&common::capture("softmax-shape0-online-vec4"));
    assert_eq!(
        loops("softmax-shape0-online-vec4"),
        [
            l("block-stride", "i < n4", 4, 4, 0),
            l("halving", "off > 0", 5, 5, 0),
            l("halving", "off > 0", 5, 5, 0),
            l("block-stride", "i < n4", 4, 4, 0),
        ]
    );
    assert_eq!(
        (
            s.buffers[0].element.as_str(),
            s.buffers[0].bits,
            s.buffers[0].read_passes
        ),
        ("float4", Some(128), 2)
    );
    let names: Vec<&str> = s.shared.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["wm", "ws"], "two arrays in one declaration");
}

#[test]
fn rmsnorm_follows_the_template_and_binds_its_scalars() {
    let s = common::structure(&common::capture("rmsnorm-shape0"));
    assert_eq!(s.functions[..2], ["rmsnorm_f16", "rmsnorm"]);
    assert_eq!(s.loops[0].condition, "c < cols");
    assert_eq!(s.loops[0].function, "rmsnorm");
    assert_eq!(
        (s.loops[0].trips, s.loops[1].trips),
        (Some(16), Some(16)),
        "cols bound through the call"
    );
    assert_eq!(s.loops[1].reads, ["x", "w"]);
    assert_eq!(s.loops[1].writes, ["y"]);
    let bits: Vec<(&str, Option<u32>, usize)> = s
        .buffers
        .iter()
        .map(|b| (b.name.as_str(), b.bits, b.read_passes))
        .collect();
    assert_eq!(
        bits,
        [("x", Some(16), 2), ("w", Some(16), 1), ("y", Some(16), 0)]
    );
}

#[test]
fn reduce_sum_is_a_grid_stride_loop_and_one_atomic() {
    let s = common::structure(&common::capture("reduce_sum-shape0"));
    assert_eq!(s.loops[0].pattern, "grid-stride");
    assert_eq!(
        s.loops[0].trips,
        Some(64),
        "16M elements over 1024 x 256 threads"
    );
    assert_eq!(s.atomics.len(), 1);
    let a = &s.atomics[0];
    assert_eq!(
        (
            a.op.as_str(),
            a.target.as_str(),
            a.space.as_str(),
            a.in_loop
        ),
        ("atomicAdd", "out", "global", false)
    );
}

#[test]
fn gqa_decode_runs_a_serial_loop_over_the_sequence() {
    let s = common::structure(&common::capture("gqa_decode-shape0"));
    assert_eq!(
        loops("gqa_decode-shape0")[..6],
        [
            l("block-stride", "d < HEAD_DIM", 1, 1, 0),
            l("block-stride", "s < seq_len", 8, 8, 0),
            l("sequential", "d < HEAD_DIM", 128, 1024, 1),
            l("block-stride", "s < seq_len", 8, 8, 0),
            l("block-stride", "d < HEAD_DIM", 1, 1, 0),
            l("sequential", "s < seq_len", 1024, 1024, 1),
        ]
    );
    let serial = s.longest_serial_loop().unwrap();
    assert_eq!(
        (
            serial.condition.as_str(),
            serial.trips,
            serial.reads.as_slice()
        ),
        ("s < seq_len", Some(1024), &["v".to_string()][..])
    );
    let scores = s.shared.iter().find(|a| a.name == "scores").unwrap();
    assert!(scores.dynamic);
    assert_eq!(
        scores.bytes,
        Some(4096),
        "seq_len floats of dynamic shared memory"
    );
    let qs = s.shared.iter().find(|a| a.name == "qs").unwrap();
    assert_eq!((qs.size.as_str(), qs.bytes), ("HEAD_DIM", Some(512)));
    assert_eq!(s.sync.syncthreads, 3);
    assert!(s.render().contains("sequential `s < seq_len` gqa_decode_f16, 1024/thread; reads v (kernels/gqa_decode.cu:56)"), "{}", s.render());
}

#[test]
fn local_arrays_and_unknown_bounds() {
    let src = "extern \"C\" __global__ void k(float* out, const float* in, int n) {\n  float acc[8];\n  int i = 0;\n  while (i < n) { acc[i % 8] += in[i]; ++i; }\n  for (int j = 0; j < n * m; ++j) out[j] = acc[j % 8];\n  atomicMax((int*)out, 1);\n}\n";
    let s = structure::summarize(
        src,
        "k",
        &Env {
            values: [("n".to_string(), 100)].into(),
            block: [32, 1, 1],
            grid: [1, 1, 1],
            smem: 0,
        },
    )
    .unwrap();
    assert_eq!(s.local_arrays.len(), 1);
    assert_eq!(
        (
            s.local_arrays[0].name.as_str(),
            s.local_arrays[0].size.as_str()
        ),
        ("acc", "8")
    );
    assert_eq!(s.loops[0].pattern, "other");
    assert_eq!(
        s.loops[1].trips, None,
        "`m` is unknown: no count rather than a guess"
    );
    assert_eq!(s.atomics[0].target, "out");
    assert!(structure::summarize(src, "missing", &Env::default())
        .unwrap_err()
        .contains("no definition of `missing`"));
}

fn launch(values: &[(&str, i64)], block: u32, grid: u32) -> Env {
    Env {
        values: values.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        block: [block, 1, 1],
        grid: [grid, 1, 1],
        smem: 0,
    }
}

/// The example crate's candle-style softmax (`kernels/candle_softmax.cu` and its helper
/// headers), amalgamated as the build amalgamates it: a template, and three entries made
/// by `SOFTMAX_OP(TYPENAME, FN_NAME)`.
fn candle_softmax() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/llm-kernels");
    kopt_spec::source::amalgamate(&root, "kernels/candle_softmax.cu", &[])
        .unwrap()
        .text
}

#[test]
fn a_macro_made_entry_is_read_from_the_invocation_that_makes_it() {
    let src = candle_softmax();
    // The launcher passes `block_size` = blockDim.x.
    let env = launch(&[("ncols", 4096), ("block_size", 1024)], 1024, 8);
    let s = structure::summarize(&src, "softmax_bf16", &env).unwrap();
    assert_eq!(s.entry, "softmax_bf16");
    assert_eq!(
        s.functions,
        [
            "softmax_bf16",
            "softmax",
            "row_offset",
            "neg_inf",
            "block_max",
            "block_sum",
            "block_reduce"
        ],
        "the entry, then the template it instantiates and what that calls"
    );
    let loops: Vec<(&str, &str, Option<u64>, &str, &str)> = s
        .loops
        .iter()
        .map(|l| {
            (
                l.pattern.as_str(),
                l.condition.as_str(),
                l.trips,
                l.function.as_str(),
                l.at.as_str(),
            )
        })
        .collect();
    assert_eq!(
        loops,
        [
            (
                "block-stride",
                "c < ncols",
                Some(4),
                "softmax",
                "kernels/candle_softmax.cu:14"
            ),
            (
                "block-stride",
                "c < ncols",
                Some(4),
                "softmax",
                "kernels/candle_softmax.cu:17"
            ),
            (
                "block-stride",
                "c < ncols",
                Some(4),
                "softmax",
                "kernels/candle_softmax.cu:20"
            ),
        ]
    );
    let src_buf = &s.buffers[0];
    assert_eq!(
        (
            src_buf.name.as_str(),
            src_buf.element.as_str(),
            src_buf.bits,
            src_buf.read_passes
        ),
        ("src", "__nv_bfloat16", Some(16), 3),
        "the buffers of the bf16 invocation"
    );
    assert_eq!(
        (s.buffers[1].name.as_str(), s.buffers[1].writes),
        ("dst", 1)
    );
    assert_eq!(s.max_read_passes(), Some(("src", 3)));
    assert_eq!(
        s.summary,
        "1 __global__ function; 3 loops; templated; static shared memory; math (exp)"
    );
    let text = s.render();
    assert!(
        !text.contains("softmax_f32") && !text.contains("softmax_f16"),
        "{text}"
    );

    // Another invocation of the same macro: its own element type.
    let f32 = structure::summarize(&src, "softmax_f32", &env).unwrap();
    assert_eq!(
        (f32.buffers[0].element.as_str(), f32.buffers[0].bits),
        ("float", Some(32))
    );
    assert_eq!(f32.loops.len(), 3);

    // Without the launcher's `block_size` the stride cannot be read: no pattern, no count.
    let unknown =
        structure::summarize(&src, "softmax_bf16", &launch(&[("ncols", 4096)], 1024, 8)).unwrap();
    assert!(
        unknown
            .loops
            .iter()
            .all(|l| l.pattern == "other" && l.trips.is_none()),
        "{}",
        unknown.render()
    );
}

#[test]
fn an_entry_no_invocation_makes_is_still_missing() {
    let src = candle_softmax();
    let err = structure::summarize(&src, "softmax_f64", &Env::default()).unwrap_err();
    assert!(err.contains("no definition of `softmax_f64`"), "{err}");
    assert!(err.contains("function-like macro"), "{err}");
}

/// Entries in the style of a framework's unary kernels: names pasted with `##`, a macro
/// that invokes another, the loop written inside the macro.
const UNARY: &str = r#"#line 1 "kernels/unary.cu"
#define UNARY_OP(TYPENAME, NAME, FUNC) \
extern "C" __global__ void u##NAME(const size_t numel, const TYPENAME* inp, TYPENAME* out) { \
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < numel; \
         i += blockDim.x * gridDim.x) { \
        const TYPENAME x = inp[i]; \
        out[i] = FUNC; \
    } \
}
#define UNARY_F32(NAME, FUNC) UNARY_OP(float, NAME##_f32, FUNC)
#define UNARY_F16(NAME, FUNC) UNARY_OP(__half, NAME##_f16, FUNC)

UNARY_F32(neg, -x)
UNARY_F16(neg, __hneg(x))
UNARY_OP(float, exp_f32, expf(x))
"#;

#[test]
fn token_pasted_names_and_nested_macros_make_entries() {
    let env = launch(&[("numel", 1 << 20)], 256, 1024);
    let s = structure::summarize(UNARY, "uneg_f16", &env).unwrap();
    assert_eq!(s.functions, ["uneg_f16"]);
    assert_eq!(s.loops.len(), 1);
    let l = &s.loops[0];
    assert_eq!(
        (l.pattern.as_str(), l.trips, l.function.as_str()),
        ("grid-stride", Some(4), "uneg_f16")
    );
    assert_eq!(
        l.at, "kernels/unary.cu:13",
        "a loop written in the macro reports the invocation's line"
    );
    assert_eq!(
        (l.reads.as_slice(), l.writes.as_slice()),
        (&["inp".to_string()][..], &["out".to_string()][..])
    );
    assert_eq!(
        (s.buffers[0].element.as_str(), s.buffers[0].bits),
        ("__half", Some(16))
    );
    assert_eq!(s.summary, "1 __global__ function; 1 loop; no shared memory");

    let e = structure::summarize(UNARY, "uexp_f32", &env).unwrap();
    assert_eq!(e.loops[0].at, "kernels/unary.cu:14");
    assert_eq!(
        e.summary,
        "1 __global__ function; 1 loop; no shared memory; math (expf)"
    );
    let f32 = structure::summarize(UNARY, "uneg_f32", &env).unwrap();
    assert_eq!(
        (f32.buffers[0].element.as_str(), f32.loops[0].at.as_str()),
        ("float", "kernels/unary.cu:12")
    );
    // `neg_f16` is a pasted argument, not an entry.
    let err = structure::summarize(UNARY, "neg_f16", &env).unwrap_err();
    assert!(err.contains("no definition of `neg_f16`"), "{err}");
}

#[test]
fn a_macro_made_signature_takes_the_body_written_after_it() {
    let src = "#define KERNEL(NAME) __global__ void NAME(float* y, int n)\n\
               #define NAMED(NAME, FUNC) __global__ void NAME(float* y) { printf(#FUNC); y[threadIdx.x] = 1.0f; }\n\
               extern \"C\" {\n\
               KERNEL(fill) {\n\
                 for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = 1.0f;\n\
               }\n\
               NAMED(one, expf(0.0f))\n\
               }\n";
    let s = structure::summarize(src, "fill", &launch(&[("n", 1024)], 128, 1)).unwrap();
    assert_eq!(s.functions, ["fill"]);
    assert_eq!(
        (
            s.loops[0].pattern.as_str(),
            s.loops[0].trips,
            s.loops[0].at.as_str()
        ),
        ("block-stride", Some(8), "source:5"),
        "the body written out keeps its own lines"
    );
    assert_eq!(s.buffers[0].writes, 1);
    let one = structure::summarize(src, "one", &Env::default()).unwrap();
    assert_eq!(
        one.summary, "1 __global__ function; 0 loops; no shared memory",
        "`#FUNC` is a string, not the call it names"
    );
}

#[test]
fn the_summary_reads_the_entry_and_what_it_calls_only() {
    let src = "__device__ float square(float v) { return v * v; }\n\
               __device__ float unused(float v) { return __expf(v); }\n\
               extern \"C\" __global__ void plain(const float* x, float* y, int n) {\n\
                 for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = square(x[i]);\n\
               }\n\
               extern \"C\" __global__ void total(const float* x, float* out, int n) {\n\
                 __shared__ float part[32];\n\
                 part[threadIdx.x % 32] = x[threadIdx.x];\n\
                 __syncthreads();\n\
                 if (threadIdx.x == 0) atomicAdd(out, part[0]);\n\
               }\n";
    let s = structure::summarize(src, "plain", &Env::default()).unwrap();
    assert_eq!(s.functions, ["plain", "square"]);
    assert_eq!(s.summary, "1 __global__ function; 1 loop; no shared memory");
    let t = structure::summarize(src, "total", &Env::default()).unwrap();
    assert_eq!(
        t.summary,
        "1 __global__ function; 0 loops; static shared memory; 1 __syncthreads; atomics (atomicAdd)"
    );
    // The example rmsnorm defines an f16 and a bf16 entry; the f16 one's profile counts one.
    let r = common::structure(&common::capture("rmsnorm-shape0"));
    assert!(
        r.summary.starts_with("1 __global__ function; 5 loops"),
        "{}",
        r.summary
    );
}
