// Dtype helpers in the style of a Rust inference framework's CUDA sources: CUDA's half
// types included by quotes (found in CUDA's include folders, not beside this file), and
// conversions through float so that one template serves f32, f16 and bf16.
#pragma once
#include "cuda_fp16.h"
#include "cuda_bf16.h"
#include <stdint.h>

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}

// Index arithmetic in 64 bits: rows * ncols passes 2^31 on vocabulary-sized softmaxes.
__device__ __forceinline__ uint64_t row_offset(uint32_t row, int32_t ncols) {
  return static_cast<uint64_t>(row) * static_cast<uint64_t>(ncols);
}
