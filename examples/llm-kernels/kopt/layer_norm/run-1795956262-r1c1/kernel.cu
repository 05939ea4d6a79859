// Layer norm, fp16 in and out, fp32 accumulation, one block per row. When the row length
// is a multiple of 8 and fits (at most 8 x MAX_VECS x blockDim.x halves), the row is read
// once with 16-byte loads (8 halves) into registers, the mean and then the variance
// around it are reduced from the registers, and y is written with 16-byte stores: one
// pass over x instead of three. Otherwise, a scalar three-pass path (any length).
// Launch: block = clamp(round_up(cols / 32, 32), 32, 1024) threads, so that each thread
// holds at most MAX_VECS vectors.
#include <cuda_fp16.h>

#ifndef MAX_VECS
#define MAX_VECS 4
#endif

// Sum over the block; `red` holds 33 floats. Every thread gets the result. The trailing
// barrier lets `red` be reused by the next call.
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < ((blockDim.x + 31) >> 5) ? red[threadIdx.x] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (threadIdx.x == 0) red[32] = t;
    }
    __syncthreads();
    return red[32];
}

extern "C" __global__ void __launch_bounds__(1024)
layer_norm_f16(const __half* __restrict__ x, const __half* __restrict__ w,
               const __half* __restrict__ b, __half* __restrict__ y, unsigned int rows,
               unsigned int cols, float eps) {
    __shared__ float red[33];
    const unsigned int row = blockIdx.x;
    if (row >= rows) return;
    const __half* xr = x + (size_t)row * cols;
    __half* yr = y + (size_t)row * cols;
    const unsigned int nvec = cols >> 3;
    const float inv_cols = 1.0f / (float)cols;

    if ((cols & 7u) == 0 && nvec <= MAX_VECS * blockDim.x) {
        const uint4* x8 = reinterpret_cast<const uint4*>(xr);
        uint4 v[MAX_VECS];
        // Every load issued before any is used: MAX_VECS x 16 bytes in flight per thread.
#pragma unroll
        for (int i = 0; i < MAX_VECS; ++i) {
            const unsigned int j = threadIdx.x + i * blockDim.x;
            v[i] = j < nvec ? __ldg(x8 + j) : make_uint4(0u, 0u, 0u, 0u);
        }
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < MAX_VECS; ++i) {
            const __half2* h = reinterpret_cast<const __half2*>(&v[i]);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float2 f = __half22float2(h[q]);
                s += f.x + f.y;
            }
        }
        const float mean = block_sum(s, red) * inv_cols;
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < MAX_VECS; ++i) {
            if (threadIdx.x + i * blockDim.x < nvec) {
                const __half2* h = reinterpret_cast<const __half2*>(&v[i]);
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const float2 f = __half22float2(h[q]);
                    const float dx = f.x - mean, dy = f.y - mean;
                    ss += dx * dx + dy * dy;
                }
            }
        }
        const float rstd = rsqrtf(block_sum(ss, red) * inv_cols + eps);
        const uint4* w8 = reinterpret_cast<const uint4*>(w);
        const uint4* b8 = reinterpret_cast<const uint4*>(b);
        uint4* y8 = reinterpret_cast<uint4*>(yr);
#pragma unroll
        for (int i = 0; i < MAX_VECS; ++i) {
            const unsigned int j = threadIdx.x + i * blockDim.x;
            if (j < nvec) {
                const uint4 gw = __ldg(w8 + j);
                const uint4 gb = __ldg(b8 + j);
                const __half2* h = reinterpret_cast<const __half2*>(&v[i]);
                const __half2* hw = reinterpret_cast<const __half2*>(&gw);
                const __half2* hb = reinterpret_cast<const __half2*>(&gb);
                uint4 o;
                __half2* ho = reinterpret_cast<__half2*>(&o);
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const float2 f = __half22float2(h[q]);
                    const float2 fw = __half22float2(hw[q]);
                    const float2 fb = __half22float2(hb[q]);
                    ho[q] = __floats2half2_rn((f.x - mean) * rstd * fw.x + fb.x,
                                              (f.y - mean) * rstd * fw.y + fb.y);
                }
                y8[j] = o;
            }
        }
    } else {
        float s = 0.0f;
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) s += __half2float(xr[c]);
        const float mean = block_sum(s, red) * inv_cols;
        float ss = 0.0f;
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) {
            const float d = __half2float(xr[c]) - mean;
            ss += d * d;
        }
        const float rstd = rsqrtf(block_sum(ss, red) * inv_cols + eps);
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x)
            yr[c] = __float2half((__half2float(xr[c]) - mean) * rstd * __half2float(w[c]) +
                                 __half2float(b[c]));
    }
}
