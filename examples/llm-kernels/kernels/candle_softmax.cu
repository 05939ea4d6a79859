// Row softmax written the way a Rust inference framework writes its CUDA: helper headers,
// one template, and the `extern "C"` entries stamped out by a macro for each dtype. The
// launcher passes no row count: one block a row, the row is blockIdx.x. The kernel's
// `block_size` argument must equal blockDim.x (the launcher computes it). Three passes
// over the row from global memory (max, sum of exponentials, write), accumulation in fp32.
#include "candle/reduce_utils.cuh"

template <typename T>
__device__ void softmax(const T* src, T* dst, const int ncols, const int block_size) {
  const uint64_t base = row_offset(blockIdx.x, ncols);
  const T* x = src + base;
  T* y = dst + base;
  float m = neg_inf();
  for (int c = threadIdx.x; c < ncols; c += block_size) m = fmaxf(m, to_float(x[c]));
  m = block_max(m, block_size);
  float s = 0.0f;
  for (int c = threadIdx.x; c < ncols; c += block_size) s += std::exp(to_float(x[c]) - m);
  s = block_sum(s, block_size);
  const float inv = 1.0f / s;
  for (int c = threadIdx.x; c < ncols; c += block_size) {
    y[c] = from_float<T>(std::exp(to_float(x[c]) - m) * inv);
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
