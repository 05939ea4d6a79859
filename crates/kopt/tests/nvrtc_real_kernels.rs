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

#[test]
fn compile_entry_reports_the_entry_s_figures_and_warnings() {
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    let source = r#"
extern "C" __global__ void other(float* y) { y[0] = 1.f; }
extern "C" __global__ void k(const float* x, float* y) {
  __shared__ float tile[64];
  int unused;
  tile[threadIdx.x % 64] = x[threadIdx.x];
  __syncthreads();
  y[threadIdx.x] = tile[(threadIdx.x + 1) % 64];
}
"#;
    let c = kopt::compile_entry("t", "reference", source, &[], ARCH, "k")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.arch, "sm_90");
    assert_eq!(c.resources.name, "k");
    assert_eq!(c.resources.shared_bytes, 256, "{:?}", c.resources);
    assert!(c.resources.registers > 0, "{:?}", c.resources);
    assert_eq!((c.resources.spill_stores, c.resources.spill_loads), (0, 0));
    assert!(!c.native.cubin.is_empty());
    assert_eq!(c.warning_count(), 1, "{}", c.warnings);
    assert!(c.warnings.contains("\"unused\""), "{}", c.warnings);
    assert!(!c.warnings.contains("ptxas info"), "{}", c.warnings);
}

#[test]
fn a_module_without_any_kernel_says_so() {
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    let source = "__device__ float scale(float x) { return 2.f * x; }\n";
    let text = kopt::compile_entry("t", "v1", source, &[], ARCH, "softmax")
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("has no kernel `softmax`")
            && text.contains("(ptxas compiled the module for sm_90; it holds no kernel at all)"),
        "{text}"
    );
}

#[test]
fn compile_entry_refuses_a_module_without_the_entry() {
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    let source = "extern \"C\" __global__ void softmax_f32(float* y) { y[0] = 1.f; }\n";
    let e = kopt::compile_entry("t", "v1", source, &[], ARCH, "softmax").unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, kopt::Error::NoEntry { .. }), "{text}");
    assert!(
        text.contains("has no kernel `softmax`")
            && text.contains("it holds `softmax_f32`")
            && text.contains("for sm_90"),
        "{text}"
    );
    // An arch-specific option compiles for the architecture it names.
    let c = kopt::compile_entry(
        "t",
        "v1",
        source,
        &["--gpu-architecture=compute_90a"],
        ARCH,
        "softmax_f32",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.arch, "sm_90a");
    // A compile error is NVRTC's log.
    let e = kopt::compile_entry("t", "v2", "int x = y;\n", &[], ARCH, "k").unwrap_err();
    match e {
        kopt::Error::Compile { log, .. } => {
            assert!(log.contains("identifier \"y\" is undefined"), "{log}")
        }
        other => panic!("{other}"),
    }
}

#[test]
fn a_kernel_made_to_spill_reports_its_spills() {
    if !kopt::gpu::nvrtc_for_test() {
        return;
    }
    // Many live values and a register cap: ptxas must spill.
    let source = r#"
extern "C" __global__ void k(const float* x, float* y, int n) {
  float v[64];
  #pragma unroll
  for (int i = 0; i < 64; i++) v[i] = x[i * n + threadIdx.x];
  float s = 0.f;
  #pragma unroll
  for (int r = 0; r < 8; r++) {
    #pragma unroll
    for (int i = 0; i < 64; i++) s += v[i] * v[(i * 7 + r) % 64];
  }
  #pragma unroll
  for (int i = 0; i < 64; i++) y[i * n + threadIdx.x] = v[i] * s;
}
"#;
    let c = kopt::compile_entry("t", "v", source, &["--maxrregcount=16"], ARCH, "k")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        c.resources.spill_stores > 0 && c.resources.spill_loads > 0,
        "{:?}\n{}",
        c.resources,
        c.native.log
    );
    assert!(c.resources.stack_bytes > 0, "{:?}", c.resources);
    // The cap is honoured down to ptxas' own floor for the architecture (24 on sm_90).
    assert!(c.resources.registers <= 24, "{:?}", c.resources);
}
