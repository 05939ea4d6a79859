// Layer norm over rows of fp16, with fp16 weight and bias; fp32 accumulation:
// y = (x - mean) / sqrt(var + eps) * w + b. One block per row, three passes over the row
// (mean, variance around the mean, write), as a competent author first writes it.
#include "common.cuh"

extern "C" __global__ void layer_norm_f16(const __half* __restrict__ x,
                                          const __half* __restrict__ w,
                                          const __half* __restrict__ b, __half* __restrict__ y,
                                          unsigned int rows, unsigned int cols, float eps) {
    __shared__ float scratch[32];
    const unsigned int row = blockIdx.x;
    if (row >= rows) return;
    const __half* xr = x + (size_t)row * cols;
    __half* yr = y + (size_t)row * cols;

    float s = 0.0f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) s += __half2float(xr[c]);
    const float mean = block_reduce<false>(s, scratch) / (float)cols;

    float ss = 0.0f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = __half2float(xr[c]) - mean;
        ss += d * d;
    }
    const float rstd = rsqrtf(block_reduce<false>(ss, scratch) / (float)cols + eps);

    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = (__half2float(xr[c]) - mean) * rstd;
        yr[c] = __float2half(v * __half2float(w[c]) + __half2float(b[c]));
    }
}
