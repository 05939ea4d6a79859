// A candidate for candle's softmax_bf16 and softmax_f32 (candle-kernels' reduce.cu,
// `softmax<T, ACC>`), keeping its arithmetic and changing how the row is read.
//
// candle gives each row one warp (block (1, 32, 1)) and reads it from memory three times,
// one element per thread and load: the max, then the exponentials (written to dst) and
// their sum, then dst again to scale it. This version:
// - gives a row blockDim.x threads (the launch rule sizes it to about two 16-byte vectors
//   a thread, up to 1024 threads; short rows share a block, blockDim.y rows of it);
// - reads the row once, in 16-byte vectors (8 bf16 or 4 f32) kept in registers (CACHE
//   vectors a thread), and writes it once; where the row's length or a pointer does not
//   allow aligned vectors it takes a scalar loop over the row instead;
// - reduces across the row with warp shuffles, and through shared memory only when the
//   row has more than one warp.
// The arithmetic is candle's, in candle's types: the max (exact), the exponential of
// x - max in the input type (`hexp` of a bf16 difference for bf16, `expf` for f32), the
// sum of those in f32, its reciprocal through a double division, and the product with
// the reciprocal in the input type (for bf16 the reciprocal rounded to bf16 first, as
// candle's `dst[i] *= inv_tmp` does). Only the order of the sum differs.
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef CACHE
#define CACHE 4
#endif

// 16 bytes of T: one vector load or store.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int N = 16 / sizeof(T);
  T v[N];
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(static_cast<int>(0xff800000u)); }

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

// candle's `expg(x[i] - max_val)` in the input type.
__device__ __forceinline__ float exp_shifted(float x, float m) { return expf(x - m); }
__device__ __forceinline__ __nv_bfloat16 exp_shifted(__nv_bfloat16 x, __nv_bfloat16 m) {
  return hexp(x - m);
}

// candle's `dst[i] *= inv_tmp` in the input type.
__device__ __forceinline__ float scaled(float v, float inv) { return v * inv; }
__device__ __forceinline__ __nv_bfloat16 scaled(__nv_bfloat16 v, __nv_bfloat16 inv) {
  return __hmul(v, inv);
}

// v reduced over the blockDim.x threads of a row: shuffles within a warp (a row of up to
// 32 threads occupies its own aligned lanes, several rows to a warp), then, for a row of
// several warps (one row a block), through shared memory. Every thread of the block
// calls it: blocks are whole warps.
template <bool MAX>
__device__ __forceinline__ float row_reduce(float v) {
  const int g = blockDim.x;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    if (o < g) {
      const float w = __shfl_xor_sync(0xffffffffu, v, o);
      v = MAX ? fmaxf(v, w) : v + w;
    }
  }
  if (g <= 32) return v;
  __shared__ float part[32];
  const int lane = threadIdx.x & 31;
  if (lane == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  v = lane < (g >> 5) ? part[lane] : (MAX ? neg_inf() : 0.0f);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? fmaxf(v, w) : v + w;
  }
  __syncthreads();  // `part` is written again by the next reduction
  return v;
}

template <typename T>
__device__ __forceinline__ void softmax_rows(const T* __restrict__ src, T* __restrict__ dst,
                                             const int ncols) {
  constexpr int N = Vec16<T>::N;
  const int g = blockDim.x;
  const int t = threadIdx.x;
  const size_t row = static_cast<size_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const T* x = src + row * ncols;
  T* y = dst + row * ncols;
  const bool vectors =
      ncols % N == 0 &&
      ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0;
  if (vectors) {
    const int nvec = ncols / N;
    const Vec16<T>* xv = reinterpret_cast<const Vec16<T>*>(x);
    Vec16<T>* yv = reinterpret_cast<Vec16<T>*>(y);
    Vec16<T> c[CACHE];
    float m = neg_inf();
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
      const int i = t + k * g;
      if (i < nvec) {
        c[k] = xv[i];
#pragma unroll
        for (int j = 0; j < N; ++j) m = fmaxf(m, to_f(c[k].v[j]));
      }
    }
    // Rows longer than blockDim.x * CACHE vectors: the rest is read again in each pass.
    for (int i = t + CACHE * g; i < nvec; i += g) {
      const Vec16<T> a = xv[i];
#pragma unroll
      for (int j = 0; j < N; ++j) m = fmaxf(m, to_f(a.v[j]));
    }
    const T mt = from_f<T>(row_reduce<true>(m));
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
      if (t + k * g < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          c[k].v[j] = exp_shifted(c[k].v[j], mt);
          s += to_f(c[k].v[j]);
        }
      }
    }
    for (int i = t + CACHE * g; i < nvec; i += g) {
      const Vec16<T> a = xv[i];
#pragma unroll
      for (int j = 0; j < N; ++j) s += to_f(exp_shifted(a.v[j], mt));
    }
    const T inv = from_f<T>(1. / row_reduce<false>(s));
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
      const int i = t + k * g;
      if (i < nvec) {
        Vec16<T> o;
#pragma unroll
        for (int j = 0; j < N; ++j) o.v[j] = scaled(c[k].v[j], inv);
        yv[i] = o;
      }
    }
    for (int i = t + CACHE * g; i < nvec; i += g) {
      const Vec16<T> a = xv[i];
      Vec16<T> o;
#pragma unroll
      for (int j = 0; j < N; ++j) o.v[j] = scaled(exp_shifted(a.v[j], mt), inv);
      yv[i] = o;
    }
  } else {
    float m = neg_inf();
    for (int i = t; i < ncols; i += g) m = fmaxf(m, to_f(x[i]));
    const T mt = from_f<T>(row_reduce<true>(m));
    float s = 0.0f;
    for (int i = t; i < ncols; i += g) s += to_f(exp_shifted(x[i], mt));
    const T inv = from_f<T>(1. / row_reduce<false>(s));
    for (int i = t; i < ncols; i += g) y[i] = scaled(exp_shifted(x[i], mt), inv);
  }
}

extern "C" __global__ void __launch_bounds__(1024)
    softmax_bf16(const __nv_bfloat16* __restrict__ src, __nv_bfloat16* __restrict__ dst,
                 const int n_cols) {
  softmax_rows(src, dst, n_cols);
}

extern "C" __global__ void __launch_bounds__(1024)
    softmax_f32(const float* __restrict__ src, float* __restrict__ dst, const int n_cols) {
  softmax_rows(src, dst, n_cols);
}
