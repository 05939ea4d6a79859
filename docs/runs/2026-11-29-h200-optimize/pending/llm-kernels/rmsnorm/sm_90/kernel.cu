// RMS norm, fp16 in and out, fp32 accumulation: 16-byte loads and stores (8 halves) when
// the row length is a multiple of 8, warp-shuffle reductions, one block per row.
#include <cuda_fp16.h>

__device__ __forceinline__ float block_sum(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < ((blockDim.x + 31) >> 5) ? red[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (threadIdx.x == 0) red[0] = t;
    }
    __syncthreads();
    return red[0];
}

extern "C" __global__ void rmsnorm_f16(const __half* __restrict__ x, const __half* __restrict__ w,
                                       __half* __restrict__ y, unsigned int rows, unsigned int cols,
                                       float eps) {
    __shared__ float red[32];
    const unsigned int row = blockIdx.x;
    if (row >= rows) return;
    const __half* xr = x + (size_t)row * cols;
    __half* yr = y + (size_t)row * cols;
    const bool vec = (cols & 7u) == 0;
    float ss = 0.0f;
    if (vec) {
        const uint4* x8 = reinterpret_cast<const uint4*>(xr);
        for (unsigned int i = threadIdx.x; i < (cols >> 3); i += blockDim.x) {
            const uint4 v = x8[i];
            const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 f = __half22float2(h[j]);
                ss += f.x * f.x + f.y * f.y;
            }
        }
    } else {
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) {
            const float f = __half2float(xr[c]);
            ss += f * f;
        }
    }
    const float inv = rsqrtf(block_sum(ss, red) / (float)cols + eps);
    if (vec) {
        const uint4* x8 = reinterpret_cast<const uint4*>(xr);
        const uint4* w8 = reinterpret_cast<const uint4*>(w);
        uint4* y8 = reinterpret_cast<uint4*>(yr);
        for (unsigned int i = threadIdx.x; i < (cols >> 3); i += blockDim.x) {
            const uint4 v = x8[i];
            const uint4 g = w8[i];
            uint4 o;
            const __half2* h = reinterpret_cast<const __half2*>(&v);
            const __half2* gh = reinterpret_cast<const __half2*>(&g);
            __half2* oh = reinterpret_cast<__half2*>(&o);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 f = __half22float2(h[j]);
                const float2 gg = __half22float2(gh[j]);
                oh[j] = __floats2half2_rn(f.x * inv * gg.x, f.y * inv * gg.y);
            }
            y8[i] = o;
        }
    } else {
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x)
            yr[c] = __float2half(__half2float(xr[c]) * inv * __half2float(w[c]));
    }
}
