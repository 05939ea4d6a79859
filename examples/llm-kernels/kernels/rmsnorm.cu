// RMS norm: fp16 in and out, fp32 accumulation. One block per row. A template with
// dtype-suffixed extern "C" entry points, as inference engines write them.
#include "common.cuh"
#include <cuda_bf16.h>

template <typename T>
__device__ void rmsnorm(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                        unsigned int cols, float eps) {
    __shared__ float scratch[32];
    const T* xr = x + (size_t)blockIdx.x * cols;
    T* yr = y + (size_t)blockIdx.x * cols;
    float ss = 0.0f;
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = (float)xr[c];
        ss += v * v;
    }
    ss = block_reduce<false>(ss, scratch);
    const float inv = rsqrtf(ss / (float)cols + eps);
    for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x)
        yr[c] = (T)((float)xr[c] * inv * (float)w[c]);
}

extern "C" __global__ void rmsnorm_f16(const __half* x, const __half* w, __half* y,
                                       unsigned int rows, unsigned int cols, float eps) {
    if (blockIdx.x < rows) rmsnorm<__half>(x, w, y, cols, eps);
}

extern "C" __global__ void rmsnorm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                        __nv_bfloat16* y, unsigned int rows, unsigned int cols,
                                        float eps) {
    if (blockIdx.x < rows) rmsnorm<__nv_bfloat16>(x, w, y, cols, eps);
}
