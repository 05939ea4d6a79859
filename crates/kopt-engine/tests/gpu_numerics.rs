//! On a GPU: the numeric fence with real fp32 kernels, through the engine's CUDA backend
//! (in this process: these candidates are the test's own, so the isolation of a worker
//! process buys nothing here).
//!
//! - fp32 layer norms that only reorder their reductions (warp shuffles, Welford, one-pass
//!   `E[x^2] - E[x]^2` built with `--use_fast_math`) pass against a serial reference at
//!   16384x4096 on every seed, with a margin;
//! - a softmax whose row sum is reduced in fp16 fails, while the same softmax reduced in
//!   fp32 passes.
//!
//! Run on the GPU machine, in release (each check compares 67M elements on the CPU):
//!
//! ```text
//! KOPT_REQUIRE_GPU=1 cargo test --release -p kopt-engine --test gpu_numerics -- --ignored --nocapture
//! ```
//!
//! `KOPT_NUMERICS_SEEDS` sets how many seeds the layer norms run (default 8); each seed is
//! two checks (the declared inputs and the shifted ones), each comparing the candidate run
//! before and after the reference. `kernels_compile` needs only NVRTC (no GPU).

use kopt_engine::job::{EvalJob, KernelVersion, Seeds};
use kopt_engine::verdict::{Fence, Judge};
use kopt_engine::worker::cuda::CudaBackend;
use kopt_engine::worker::Backend;
use kopt_spec::shapes::ShapeCase;
use kopt_spec::spec::KernelSpec;

fn spec(signature: &str, annotation: &str) -> KernelSpec {
    let item = kopt_spec::spec::parse_item(signature.parse().unwrap()).unwrap();
    kopt_spec::spec::parse_kernel(annotation.parse().unwrap(), &item)
        .unwrap()
        .0
}

/// Activations with a mean offset, a weight near one, and a bias wide enough that
/// `x_hat * w + b` cancels to near zero at many elements of every row (as in the CPU
/// tests); the shifted check moves each normal by one standard deviation (x ~ N(4, 1)),
/// which makes the one-pass variance's cancellation worse still.
fn layer_norm_spec() -> KernelSpec {
    spec(
        "pub fn layer_norm(s: &CudaStream, x: &CudaSlice<f32>, weight: &CudaSlice<f32>, bias: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32, eps: f32);",
        r#"reference = "layer_norm_f32.cu", entry = "layer_norm_f32",
           x: [rows * cols] normal(3.0, 1.0),
           weight: [cols] normal(1.0, 0.5),
           bias: [cols] normal(0.0, 2.0),
           y: [rows * cols],
           grid = rows, block = 256,
           defaults = { eps: 1e-5 },
           shapes = [{ rows: 16384, cols: 4096 }]"#,
    )
}

const LAYER_NORM_HEAD: &str = r#"
extern "C" __global__ void layer_norm_f32(const float* __restrict__ x,
                                          const float* __restrict__ w,
                                          const float* __restrict__ b, float* __restrict__ y,
                                          unsigned int rows, unsigned int cols, float eps)
"#;

/// The reference: one thread of the block computes the row's statistics left to right,
/// two passes (mean, then the variance around it); the block writes.
fn serial_layer_norm() -> String {
    format!(
        r#"{LAYER_NORM_HEAD}{{
    __shared__ float stats[2];
    const unsigned int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    if (threadIdx.x == 0) {{
        float s = 0.0f;
        for (unsigned int c = 0; c < cols; ++c) s += xr[c];
        const float mean = s / (float)cols;
        float ss = 0.0f;
        for (unsigned int c = 0; c < cols; ++c) {{
            const float d = xr[c] - mean;
            ss += d * d;
        }}
        stats[0] = mean;
        stats[1] = 1.0f / sqrtf(ss / (float)cols + eps);
    }}
    __syncthreads();
    const float mean = stats[0], rstd = stats[1];
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x)
        yr[c] = (xr[c] - mean) * rstd * w[c] + b[c];
}}
"#
    )
}

const WARP_SUM: &str = r#"
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// Sums of (a, b) over the block: shuffles within each warp, then warp 0 over the warps.
__device__ float2 block_sum2(float a, float b, float2* scratch) {
    a = warp_sum(a);
    b = warp_sum(b);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = make_float2(a, b);
    __syncthreads();
    if (warp == 0) {
        const int warps = (blockDim.x + 31) >> 5;
        float2 v = lane < warps ? scratch[lane] : make_float2(0.0f, 0.0f);
        v.x = warp_sum(v.x);
        v.y = warp_sum(v.y);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    const float2 r = scratch[0];
    __syncthreads();
    return r;
}
"#;

/// Two passes, each reduced by warp shuffles.
fn shuffle_layer_norm() -> String {
    format!(
        r#"{WARP_SUM}{LAYER_NORM_HEAD}{{
    __shared__ float2 scratch[32];
    const unsigned int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    float s = 0.0f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
    const float mean = block_sum2(s, 0.0f, scratch).x / (float)cols;
    float ss = 0.0f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) {{
        const float d = xr[c] - mean;
        ss += d * d;
    }}
    const float rstd = rsqrtf(block_sum2(ss, 0.0f, scratch).x / (float)cols + eps);
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x)
        yr[c] = (xr[c] - mean) * rstd * w[c] + b[c];
}}
"#
    )
}

/// One pass: sum and sum of squares together, variance `E[x^2] - E[x]^2` (built with
/// `--use_fast_math`, as projects that ship such kernels build them).
fn one_pass_layer_norm() -> String {
    format!(
        r#"{WARP_SUM}{LAYER_NORM_HEAD}{{
    __shared__ float2 scratch[32];
    const unsigned int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    float s = 0.0f, q = 0.0f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) {{
        const float v = xr[c];
        s += v;
        q += v * v;
    }}
    const float2 t = block_sum2(s, q, scratch);
    const float mean = t.x / (float)cols;
    const float var = fmaxf(t.y / (float)cols - mean * mean, 0.0f);
    const float rstd = rsqrtf(var + eps);
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x)
        yr[c] = (xr[c] - mean) * rstd * w[c] + b[c];
}}
"#
    )
}

/// Welford's running mean and M2 per thread, merged by shuffles (Chan et al.).
fn welford_layer_norm() -> String {
    format!(
        r#"
struct Stats {{ float n, mean, m2; }};
__device__ __forceinline__ Stats merge(Stats a, Stats b) {{
    const float n = a.n + b.n;
    if (n == 0.0f) return a;
    const float d = b.mean - a.mean, f = b.n / n;
    Stats r;
    r.n = n;
    r.mean = a.mean + d * f;
    r.m2 = a.m2 + b.m2 + d * d * a.n * f;
    return r;
}}
__device__ __forceinline__ Stats warp_merge(Stats v) {{
    for (int o = 16; o > 0; o >>= 1) {{
        Stats other;
        other.n = __shfl_xor_sync(0xffffffffu, v.n, o);
        other.mean = __shfl_xor_sync(0xffffffffu, v.mean, o);
        other.m2 = __shfl_xor_sync(0xffffffffu, v.m2, o);
        v = merge(v, other);
    }}
    return v;
}}
{LAYER_NORM_HEAD}{{
    __shared__ Stats scratch[32];
    const unsigned int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    Stats st = {{0.0f, 0.0f, 0.0f}};
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) {{
        const float v = xr[c];
        st.n += 1.0f;
        const float d = v - st.mean;
        st.mean += d / st.n;
        st.m2 += d * (v - st.mean);
    }}
    st = warp_merge(st);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = st;
    __syncthreads();
    if (warp == 0) {{
        const int warps = (blockDim.x + 31) >> 5;
        Stats v = {{0.0f, 0.0f, 0.0f}};
        if (lane < warps) v = scratch[lane];
        v = warp_merge(v);
        if (lane == 0) scratch[0] = v;
    }}
    __syncthreads();
    const float mean = scratch[0].mean;
    const float rstd = rsqrtf(scratch[0].m2 / (float)cols + eps);
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x)
        yr[c] = (xr[c] - mean) * rstd * w[c] + b[c];
}}
"#
    )
}

/// Attention-like scores (std 2) over rows of 1024: a row's largest outputs are of order
/// 0.1, where fp16's rounding of the sum shows.
fn softmax_spec() -> KernelSpec {
    spec(
        "pub fn softmax(s: &CudaStream, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, rows: u32, cols: u32);",
        r#"reference = "softmax_f32.cu", entry = "softmax_f32",
           x: [rows * cols] normal(0.0, 2.0),
           y: [rows * cols],
           grid = rows, block = 256,
           shapes = [{ rows: 4096, cols: 1024 }, { rows: 32768, cols: 1024 }]"#,
    )
}

/// A softmax of the block: max by shuffles, the row sum by `sum_of` (thread 0 serially
/// in the reference), then the write.
fn softmax(prelude: &str, sum: &str) -> String {
    format!(
        r#"#include <cuda_fp16.h>
#define NEG_INF __int_as_float(0xff800000)
__device__ float block_max(float v, float* s) {{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = NEG_INF;
    for (int w = 0; w < (blockDim.x + 31) / 32; ++w) r = fmaxf(r, s[w]);
    __syncthreads();
    return r;
}}
{prelude}
extern "C" __global__ void softmax_f32(const float* __restrict__ x, float* __restrict__ y,
                                       unsigned int rows, unsigned int cols) {{
    __shared__ float scratch[32];
    __shared__ float total;
    const unsigned int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    float m = NEG_INF;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    m = block_max(m, scratch);
    {sum}
    const float inv = 1.0f / total;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) * inv;
}}
"#
    )
}

fn serial_softmax() -> String {
    softmax(
        "",
        r#"if (threadIdx.x == 0) {
        float s = 0.0f;
        for (unsigned int c = 0; c < cols; ++c) s += expf(xr[c] - m);
        total = s;
    }
    __syncthreads();"#,
    )
}

/// Per-thread partial sums in fp32, reduced over the block in `half` (shuffles of
/// `__half` and `__hadd`): the fp16 accumulation the fence must reject. With `in_half`
/// false, the same reduction in fp32: a reordering that must pass.
fn block_softmax(in_half: bool) -> String {
    let (ty, zero, add, from, to) = if in_half {
        (
            "__half",
            "__float2half(0.0f)",
            "__hadd",
            "__float2half",
            "__half2float",
        )
    } else {
        ("float", "0.0f", "__fadd_rn", "", "")
    };
    softmax(
        &format!(
            r#"__device__ float block_sum_of(float partial, {ty}* s) {{
    {ty} v = {from}(partial);
    for (int o = 16; o > 0; o >>= 1) v = {add}(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;
    __syncthreads();
    {ty} r = {zero};
    for (int w = 0; w < (blockDim.x + 31) / 32; ++w) r = {add}(r, s[w]);
    __syncthreads();
    return {to}(r);
}}"#
        ),
        &format!(
            r#"__shared__ {ty} partials[32];
    float s = 0.0f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
    s = block_sum_of(s, partials);
    if (threadIdx.x == 0) total = s;
    __syncthreads();"#
        ),
    )
}

fn candidate(spec: &KernelSpec, id: &str, source: String, options: &[&str]) -> KernelVersion {
    let mut v = KernelVersion::reference(spec, &source);
    v.id = id.into();
    v.options = options.iter().map(|o| o.to_string()).collect();
    v
}

fn job(spec: &KernelSpec, reference: &str, candidate: &KernelVersion, seed: u64) -> EvalJob {
    EvalJob {
        spec: spec.clone(),
        reference: KernelVersion::reference(spec, reference),
        candidate: candidate.clone(),
        shapes: spec.shapes.iter().map(ShapeCase::declared).collect(),
        seeds: Seeds::from_base(seed),
        timing: None,
    }
}

fn seeds() -> u64 {
    std::env::var("KOPT_NUMERICS_SEEDS")
        .ok()
        .map(|s| s.parse().expect("KOPT_NUMERICS_SEEDS is a count"))
        .unwrap_or(8)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn reordered_fp32_layer_norms_pass_against_a_serial_reference_at_16384x4096() {
    if !kopt::gpu::available_for_test() {
        return;
    }
    let mut gpu = CudaBackend::new(0).expect("GPU 0");
    let spec = layer_norm_spec();
    let reference = serial_layer_norm();
    let candidates = [
        candidate(&spec, "shuffles", shuffle_layer_norm(), &[]),
        candidate(&spec, "welford", welford_layer_norm(), &[]),
        candidate(
            &spec,
            "one-pass-fast-math",
            one_pass_layer_norm(),
            &["--use_fast_math"],
        ),
    ];
    let mut checked = 0;
    for seed in 1..=seeds() {
        for c in &candidates {
            let report = gpu.evaluate(&job(&spec, &reference, c, seed), &mut |_, _| {});
            let verdict = Judge::new(None).judge(&Ok(report.clone()));
            for check in report.shapes.iter().flat_map(|s| &s.checks) {
                for o in &check.outputs {
                    println!(
                        "seed {seed} {} {} ({:?}): {}",
                        c.id,
                        check.variation.name(),
                        check.phase,
                        o.describe()
                    );
                    // A margin, not a pass by a hair.
                    assert!(
                        o.max_error_ratio < 0.5,
                        "seed {seed} {}: {}",
                        c.id,
                        o.describe()
                    );
                }
                checked += 1;
            }
            assert!(
                verdict.accepted,
                "seed {seed} {}: {}\n{}",
                c.id,
                verdict.summary(),
                verdict.compile_log
            );
        }
    }
    // Two checks a seed (declared, shifted), each the candidate before and after the
    // reference.
    assert_eq!(checked, seeds() as usize * candidates.len() * 4);
    println!(
        "{} seeds x {} layer norms accepted at 16384x4096",
        seeds(),
        candidates.len()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_softmax_that_reduces_its_row_sum_in_fp16_fails_on_the_gpu() {
    if !kopt::gpu::available_for_test() {
        return;
    }
    let mut gpu = CudaBackend::new(0).expect("GPU 0");
    let spec = softmax_spec();
    let reference = serial_softmax();
    for seed in 1..=3 {
        let fp32 = candidate(&spec, "fp32-shuffles", block_softmax(false), &[]);
        let report = gpu.evaluate(&job(&spec, &reference, &fp32, seed), &mut |_, _| {});
        let verdict = Judge::new(None).judge(&Ok(report));
        assert!(verdict.accepted, "seed {seed}: {}", verdict.summary());

        let fp16 = candidate(&spec, "fp16-sum", block_softmax(true), &[]);
        let verdict = Judge::new(None).judge(&Ok(
            gpu.evaluate(&job(&spec, &reference, &fp16, seed), &mut |_, _| {})
        ));
        println!("seed {seed}: {}", verdict.summary());
        assert_eq!(
            verdict.fences(),
            vec![Fence::Numerics],
            "seed {seed}: {}",
            verdict.summary()
        );
        // Every shape fails, not only the luckiest.
        let failed: Vec<&str> = verdict
            .failures
            .iter()
            .filter_map(|f| f.shape.as_deref())
            .collect();
        assert_eq!(failed.len(), spec.shapes.len(), "{failed:?}");
    }
}

/// The GPU tests' material on the CPU: the annotations parse and give the shapes and
/// rows the tests assume, and every kernel compiles for sm_90.
#[test]
#[ignore = "needs NVRTC"]
fn kernels_compile() {
    let ln = layer_norm_spec();
    let args = ln.shape_args(&ln.shapes[0]);
    let y = &ln.buffers().find(|b| b.name == "y").unwrap().len;
    assert_eq!(
        kopt_spec::shapes::buffer_dims(y, &ln, &args),
        Some(vec![("rows".into(), 16384), ("cols".into(), 4096)])
    );
    assert_eq!(softmax_spec().shapes.len(), 2);
    assert!(
        kopt::gpu::nvrtc_present(),
        "NVRTC (libnvrtc.so) could not be loaded: add its folder to LD_LIBRARY_PATH"
    );
    let sources = [
        ("serial", serial_layer_norm(), vec![]),
        ("shuffles", shuffle_layer_norm(), vec![]),
        ("welford", welford_layer_norm(), vec![]),
        ("one-pass", one_pass_layer_norm(), vec!["--use_fast_math"]),
        ("serial-softmax", serial_softmax(), vec![]),
        ("fp32-softmax", block_softmax(false), vec![]),
        ("fp16-softmax", block_softmax(true), vec![]),
    ];
    for (name, source, options) in sources {
        kopt::compile_ptx("numerics", name, &source, &options, (9, 0))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
