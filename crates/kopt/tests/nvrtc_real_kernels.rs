//! Kernels as third-party code writes them compile through kopt's one NVRTC path on the
//! CPU (no GPU): CUDA's own headers in the toolkit's layout (CUDA 13's `include/cccl`),
//! the standard headers NVRTC does not ship, entries made by macros and templates.
//! Skipped without NVRTC, failing instead under `KOPT_REQUIRE_NVRTC=1` (CI sets it).

const ARCH: &str = "sm_90";

fn compile(source: &str, entry: &str) -> kopt::Native {
    kopt::compile_native(
        "t",
        "reference",
        source,
        &["--ptxas-options=-v"],
        ARCH,
        Some(entry),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn entries(n: &kopt::Native) -> Vec<String> {
    kopt::ptxas_entries(&n.log)
        .into_iter()
        .map(|e| e.name)
        .collect()
}

#[test]
fn standard_and_cuda_headers_compile_unchanged() {
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    let source = r#"
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cuda/std/limits>
#include <cmath>
#include <math.h>
#include <stdint.h>
#include <cstdint>
#include <limits>
#include <cfloat>
#include <stdio.h>
#include "cuda_fp16.h"
#include "cuda_bf16.h"
namespace cg = cooperative_groups;
extern "C" __global__ void k(const float* x, float* y, int64_t n) {
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  float v = threadIdx.x < n ? x[threadIdx.x] : -INFINITY;
  float m = cg::reduce(warp, v, cg::greater<float>());
  float lo = cuda::std::numeric_limits<float>::lowest() + std::numeric_limits<float>::max();
  uint32_t bits = __float_as_uint(m);
  if (bits == UINT32_MAX && n < 0) printf("%f\n", lo);
  y[threadIdx.x] = std::exp(v - m) + fmaxf(lo, -FLT_MAX) + __half2float(__float2half(1.f));
}
"#;
    let n = compile(source, "k");
    assert_eq!(entries(&n), vec!["k"]);
}

#[test]
fn macro_and_template_entries_are_in_the_module() {
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    let source = r#"
#include <stdint.h>
#include "cuda_bf16.h"
template <typename T> __device__ void scale(const T* x, T* y, const size_t n, float s) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
    y[i] = T(float(x[i]) * s);
}
#define SCALE_OP(TYPENAME, FN_NAME) \
  extern "C" __global__ void FN_NAME(const TYPENAME* x, TYPENAME* y, const size_t n, float s) { \
    scale<TYPENAME>(x, y, n, s); \
  }
SCALE_OP(float, scale_f32)
SCALE_OP(__nv_bfloat16, scale_bf16)
template <int BLOCK> __global__ void fill(float* y) { y[threadIdx.x] = BLOCK; }
template __global__ void fill<256>(float*);
"#;
    let n = compile(source, "scale_bf16");
    let names = entries(&n);
    assert!(names.contains(&"scale_f32".to_string()), "{names:?}");
    assert_eq!(n.entry.as_deref(), Some("scale_bf16"));
    let t = compile(source, "fill<256>");
    let lowered = t.entry.clone().expect("a name expression is lowered");
    assert!(lowered.starts_with("_Z"), "{lowered}");
    assert!(entries(&t).contains(&lowered));
    // A name expression instantiates the template: no explicit instantiation needed.
    let t = compile(source, "fill<128>");
    assert!(entries(&t).contains(&t.entry.clone().unwrap()));
    let e = kopt::compile_native("t", "reference", source, &[], ARCH, Some("fil<128>"))
        .expect_err("no template of that name");
    assert!(e.to_string().contains("fil"), "{e}");
}

#[test]
fn a_missing_header_names_the_folders_searched() {
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    let e = kopt::compile_ptx(
        "t",
        "reference",
        "#include <no_such_header.h>\nextern \"C\" __global__ void k() {}\n",
        &[],
        (9, 0),
    )
    .expect_err("no such header");
    let text = e.to_string();
    assert!(text.contains("no_such_header.h"), "{text}");
    assert!(text.contains("--include-path="), "{text}");
}
