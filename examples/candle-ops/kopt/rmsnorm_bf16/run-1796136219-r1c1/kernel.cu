// A candidate for candle's rmsnorm_bf16 and rmsnorm_f32 (candle-kernels' reduce.cu,
// `rmsnorm<T>`), keeping its arithmetic and changing how the row is read.
//
// candle gives each row one block of 32 threads (rows under 1024 columns) or 1024, and
// reads it from memory twice, one element per thread and load: the sum of squares, then
// x again with the weight to write the output. On short rows (a Qwen3 head of 128) a
// block is one warp with four elements a thread; on long ones each thread loads four
// scalars per pass. This version:
// - gives a row blockDim.x threads (the launch rule sizes it to about two 16-byte vectors
//   a thread, up to 1024 threads; short rows share a block of 256 threads, blockDim.y
//   rows of it, so that a block keeps many loads in flight);
// - reads the row once, in 16-byte vectors (8 bf16 or 4 f32) kept in registers (CACHE
//   vectors a thread), and the weight in vectors too; where the row's length or a pointer
//   does not allow aligned vectors it takes a scalar loop instead;
// - reduces across the row with warp shuffles, through shared memory only when the row
//   has more than one warp.
// The arithmetic is candle's: the sum of squares in f32, `rsqrtf(sum / ncols + eps)`, and
// each output `scale * x * alpha` in f32, rounded to the output type. Only the order of
// the sum differs. The kernel reads its row's width from blockDim.x; `block_size`, which
// the launcher sets to it, is not needed.
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef CACHE
#define CACHE 2
#endif

// 16 bytes of T: one vector load or store.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int N = 16 / sizeof(T);
  T v[N];
};

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

// v summed over the blockDim.x threads of a row: shuffles within a warp (a row of up to
// 32 threads occupies its own aligned lanes, several rows to a warp), then, for a row of
// several warps (one row a block), through shared memory. Every thread of the block
// calls it: blocks are whole warps.
__device__ __forceinline__ float row_sum(float v) {
  const int g = blockDim.x;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    if (o < g) v += __shfl_xor_sync(0xffffffffu, v, o);
  }
  if (g <= 32) return v;
  __shared__ float part[32];
  const int lane = threadIdx.x & 31;
  if (lane == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  v = lane < (g >> 5) ? part[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__device__ __forceinline__ void rmsnorm_rows(const T* __restrict__ src, T* __restrict__ dst,
                                             const T* __restrict__ alpha, const int ncols,
                                             const float eps) {
  constexpr int N = Vec16<T>::N;
  const int g = blockDim.x;
  const int t = threadIdx.x;
  const size_t row = static_cast<size_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const T* x = src + row * ncols;
  T* y = dst + row * ncols;
  const bool vectors = ncols % N == 0 && ((reinterpret_cast<uintptr_t>(src) |
                                           reinterpret_cast<uintptr_t>(dst) |
                                           reinterpret_cast<uintptr_t>(alpha)) & 15) == 0;
  float s = 0.0f;
  if (vectors) {
    const int nvec = ncols / N;
    const Vec16<T>* xv = reinterpret_cast<const Vec16<T>*>(x);
    const Vec16<T>* av = reinterpret_cast<const Vec16<T>*>(alpha);
    Vec16<T>* yv = reinterpret_cast<Vec16<T>*>(y);
    Vec16<T> c[CACHE];
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
      const int i = t + k * g;
      if (i < nvec) {
        c[k] = xv[i];
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float xi = to_f(c[k].v[j]);
          s += xi * xi;
        }
      }
    }
    // Rows longer than blockDim.x * CACHE vectors: the rest is read again for the output.
    for (int i = t + CACHE * g; i < nvec; i += g) {
      const Vec16<T> a = xv[i];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float xi = to_f(a.v[j]);
        s += xi * xi;
      }
    }
    const float scale = rsqrtf(row_sum(s) / ncols + eps);
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
      const int i = t + k * g;
      if (i < nvec) {
        const Vec16<T> w = av[i];
        Vec16<T> o;
#pragma unroll
        for (int j = 0; j < N; ++j) o.v[j] = from_f<T>(scale * to_f(c[k].v[j]) * to_f(w.v[j]));
        yv[i] = o;
      }
    }
    for (int i = t + CACHE * g; i < nvec; i += g) {
      const Vec16<T> a = xv[i];
      const Vec16<T> w = av[i];
      Vec16<T> o;
#pragma unroll
      for (int j = 0; j < N; ++j) o.v[j] = from_f<T>(scale * to_f(a.v[j]) * to_f(w.v[j]));
      yv[i] = o;
    }
  } else {
    for (int i = t; i < ncols; i += g) {
      const float xi = to_f(x[i]);
      s += xi * xi;
    }
    const float scale = rsqrtf(row_sum(s) / ncols + eps);
    for (int i = t; i < ncols; i += g) y[i] = from_f<T>(scale * to_f(x[i]) * to_f(alpha[i]));
  }
}

extern "C" __global__ void __launch_bounds__(1024)
    rmsnorm_bf16(const __nv_bfloat16* __restrict__ src, __nv_bfloat16* __restrict__ dst,
                 const __nv_bfloat16* __restrict__ alpha, const int n_cols,
                 const int block_size, const float eps) {
  (void)block_size;
  rmsnorm_rows(src, dst, alpha, n_cols, eps);
}

extern "C" __global__ void __launch_bounds__(1024)
    rmsnorm_f32(const float* __restrict__ src, float* __restrict__ dst,
                const float* __restrict__ alpha, const int n_cols, const int block_size,
                const float eps) {
  (void)block_size;
  rmsnorm_rows(src, dst, alpha, n_cols, eps);
}
