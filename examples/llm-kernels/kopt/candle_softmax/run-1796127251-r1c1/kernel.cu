// candle_softmax, a candidate for every dtype at once (the entries are still stamped out
// by the macro). The reference reads each row three times with one warp a row. This one:
// - 256 threads a row (1024 for rows of 16384 and more): the launch rule sets the block
//   and the launcher passes it as `block_size`, so few long rows (64 x 32000) keep more
//   loads in flight per SM;
// - 16-byte loads (8 bf16/f16, 4 f32) where the row's length keeps every row aligned
//   (ncols a multiple of the vector), the reference's scalar loop otherwise;
// - the row's statistics in one pass (a running max and sum of exponentials per thread,
//   merged across the block), and the first CACHE vectors of each thread held in
//   registers for the write pass, so rows up to block_size x CACHE vectors are read once.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cuda/std/limits>
#include <cmath>
#include <stdint.h>
#include "cuda_fp16.h"
#include "cuda_bf16.h"

#ifndef CACHE
#define CACHE 4
#endif

namespace cg = cooperative_groups;

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

template <typename T> struct alignas(16) Vec {
  static constexpr int N = 16 / sizeof(T);
  T v[N];
};

__device__ __forceinline__ float neg_inf() { return -cuda::std::numeric_limits<float>::infinity(); }

// (max, sum of exp(x - max)) merged over the block: the max first, then each thread's sum
// rescaled to it.
__device__ __forceinline__ void block_stats(float& m, float& s, const int block_size) {
  __shared__ float part_m[32];
  __shared__ float part_s[32];
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  const int nwarps = block_size / 32;
  float wm = cg::reduce(warp, m, cg::greater<float>());
  float ws = cg::reduce(warp, m == neg_inf() ? 0.0f : s * __expf(m - wm), cg::plus<float>());
  if (warp.thread_rank() == 0) {
    part_m[warp.meta_group_rank()] = wm;
    part_s[warp.meta_group_rank()] = ws;
  }
  block.sync();
  const bool mine = warp.thread_rank() < nwarps;
  float bm = mine ? part_m[warp.thread_rank()] : neg_inf();
  float bs = mine ? part_s[warp.thread_rank()] : 0.0f;
  m = cg::reduce(warp, bm, cg::greater<float>());
  s = cg::reduce(warp, bm == neg_inf() ? 0.0f : bs * __expf(bm - m), cg::plus<float>());
}

__device__ __forceinline__ void push(float x, float& m, float& s) {
  if (x > m) {
    s = s * __expf(m - x) + 1.0f;
    m = x;
  } else {
    s += __expf(x - m);
  }
}

template <typename T>
__device__ void softmax(const T* src, T* dst, const int ncols, const int block_size) {
  const uint64_t base = static_cast<uint64_t>(blockIdx.x) * static_cast<uint64_t>(ncols);
  const T* x = src + base;
  T* y = dst + base;
  float m = neg_inf(), s = 0.0f;
  constexpr int N = Vec<T>::N;
  if (ncols % N == 0) {
    const Vec<T>* xv = reinterpret_cast<const Vec<T>*>(x);
    Vec<T>* yv = reinterpret_cast<Vec<T>*>(y);
    const int nvec = ncols / N;
    Vec<T> cache[CACHE];
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
      const int i = threadIdx.x + k * block_size;
      if (i < nvec) {
        cache[k] = xv[i];
#pragma unroll
        for (int j = 0; j < N; ++j) push(to_float(cache[k].v[j]), m, s);
      }
    }
    for (int i = threadIdx.x + CACHE * block_size; i < nvec; i += block_size) {
      const Vec<T> a = xv[i];
#pragma unroll
      for (int j = 0; j < N; ++j) push(to_float(a.v[j]), m, s);
    }
    block_stats(m, s, block_size);
    const float inv = 1.0f / s;
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
      const int i = threadIdx.x + k * block_size;
      if (i < nvec) {
        Vec<T> o;
#pragma unroll
        for (int j = 0; j < N; ++j) o.v[j] = from_float<T>(__expf(to_float(cache[k].v[j]) - m) * inv);
        yv[i] = o;
      }
    }
    for (int i = threadIdx.x + CACHE * block_size; i < nvec; i += block_size) {
      const Vec<T> a = xv[i];
      Vec<T> o;
#pragma unroll
      for (int j = 0; j < N; ++j) o.v[j] = from_float<T>(__expf(to_float(a.v[j]) - m) * inv);
      yv[i] = o;
    }
  } else {
    for (int c = threadIdx.x; c < ncols; c += block_size) push(to_float(x[c]), m, s);
    block_stats(m, s, block_size);
    const float inv = 1.0f / s;
    for (int c = threadIdx.x; c < ncols; c += block_size) {
      y[c] = from_float<T>(__expf(to_float(x[c]) - m) * inv);
    }
  }
}

#define SOFTMAX_OP(TYPENAME, FN_NAME)                                                  \
  extern "C" __global__ void FN_NAME(const TYPENAME* src, TYPENAME* dst, const int ncols, \
                                     const int block_size) {                            \
    softmax<TYPENAME>(src, dst, ncols, block_size);                                     \
  }

SOFTMAX_OP(float, softmax_f32)
SOFTMAX_OP(__half, softmax_f16)
SOFTMAX_OP(__nv_bfloat16, softmax_bf16)
