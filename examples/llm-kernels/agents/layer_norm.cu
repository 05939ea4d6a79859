// Layer norm, fp16 in and out, fp32 accumulation, one block per row.
//
// Many rows (rows >= 256): when the row length is a multiple of 8 and fits (at most
// 8 x MAX_VECS x blockDim.x halves), the row is read once with 16-byte loads (8 halves)
// into registers, the mean and then the variance around it are reduced from the
// registers, and y is written with 16-byte stores: one pass over x instead of three.
// Launch: block = clamp(round_up(cols / 32, 32), 32, 1024) threads, so that each thread
// holds at most MAX_VECS vectors.
// Few rows (rows < 256, latency-bound): block = clamp(round_up(cols / 8, 32), 32, 1024),
// so a thread holds one or two vectors (FEW_VECS, the most it holds; a launch rule of
// cols / (8 x FEW_VECS) threads fills them all: at 64 x 4096, 256-thread blocks ran 1.6%
// faster than 512 and 128-thread ones 23% slower, docs/runs/2026-11-30-h200-small-shapes/
// sweep-1.txt and sweep-2.txt); x, w and b are all requested before
// the first use (one round trip to memory), and the mean and variance come out of one
// pass over the registers: two sums of values shifted by the row's first element,
// reduced together by shuffles, one barrier and shuffles again (no division, no serial
// merge on the critical path).
// Otherwise, a scalar three-pass path (any length).
#include <cuda_fp16.h>

#ifndef MAX_VECS
#define MAX_VECS 4
#endif
#ifndef FEW_VECS
#define FEW_VECS 2
#endif

// (x - mean) * rstd * w + b for 8 halves (one 16-byte vector each of x, w and b).
__device__ __forceinline__ uint4 normalize8(const uint4& xv, const uint4& wv, const uint4& bv,
                                            float mean, float rstd) {
    const __half2* h = reinterpret_cast<const __half2*>(&xv);
    const __half2* hw = reinterpret_cast<const __half2*>(&wv);
    const __half2* hb = reinterpret_cast<const __half2*>(&bv);
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
    return o;
}

// Few rows: one block per row, at most FEW_VECS vectors per thread (the caller checks
// cols % 8 == 0 and cols / 8 <= FEW_VECS * blockDim.x). The statistics come out of one
// pass over the registers and one block reduction of two sums of values shifted by the
// row's first element k (every thread reads it in the same round trip as its vectors):
// s1 = sum(x - k), s2 = sum((x - k)^2), mean = k + s1 / n, var = s2 / n - (s1 / n)^2.
// The shift bounds the one-pass formula's cancellation by (mean - k)^2 / var instead of
// mean^2 / var; no division on the reduction path.
__device__ __forceinline__ void layer_norm_few(const __half* __restrict__ xr,
                                               const __half* __restrict__ w,
                                               const __half* __restrict__ b,
                                               __half* __restrict__ yr, unsigned int cols,
                                               float eps) {
    __shared__ float2 warp_sums[32];
    const unsigned int nvec = cols >> 3, tid = threadIdx.x, bs = blockDim.x;
    const uint4* x8 = reinterpret_cast<const uint4*>(xr);
    const uint4* w8 = reinterpret_cast<const uint4*>(w);
    const uint4* b8 = reinterpret_cast<const uint4*>(b);
    uint4 v[FEW_VECS], gw[FEW_VECS], gb[FEW_VECS];
    // x, w, b and the shift all in flight before any is used.
    const float k = __half2float(__ldg(xr));
#pragma unroll
    for (int i = 0; i < FEW_VECS; ++i) {
        const unsigned int j = tid + i * bs;
        const bool in = j < nvec;
        v[i] = in ? __ldg(x8 + j) : make_uint4(0u, 0u, 0u, 0u);
        gw[i] = in ? __ldg(w8 + j) : make_uint4(0u, 0u, 0u, 0u);
        gb[i] = in ? __ldg(b8 + j) : make_uint4(0u, 0u, 0u, 0u);
    }
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int i = 0; i < FEW_VECS; ++i) {
        if (tid + i * bs < nvec) {
            const __half2* h = reinterpret_cast<const __half2*>(&v[i]);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float2 f = __half22float2(h[q]);
                const float dx = f.x - k, dy = f.y - k;
                s1 += dx + dy;
                s2 = fmaf(dx, dx, fmaf(dy, dy, s2));
            }
        }
    }
    // Butterfly within the warp (every lane ends with the same sums), one barrier, then
    // each warp reduces the warps' sums by the same butterfly, so every thread of the
    // block gets the same mean and variance.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        s2 += __shfl_xor_sync(0xffffffffu, s2, o);
    }
    const unsigned int lane = tid & 31u;
    if (lane == 0) warp_sums[tid >> 5] = make_float2(s1, s2);
    __syncthreads();
    const float2 t = lane < ((bs + 31u) >> 5) ? warp_sums[lane] : make_float2(0.0f, 0.0f);
    s1 = t.x;
    s2 = t.y;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        s2 += __shfl_xor_sync(0xffffffffu, s2, o);
    }
    const float inv_n = 1.0f / (float)cols, d = s1 * inv_n;
    const float mean = k + d;
    const float rstd = rsqrtf(fmaxf(fmaf(s2, inv_n, -d * d), 0.0f) + eps);
    uint4* y8 = reinterpret_cast<uint4*>(yr);
#pragma unroll
    for (int i = 0; i < FEW_VECS; ++i) {
        const unsigned int j = tid + i * bs;
        if (j < nvec) {
            y8[j] = normalize8(v[i], gw[i], gb[i], mean, rstd);
        }
    }
}

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
    // Same test as the launch rule (rows < 256): the block then has about cols / 8 threads.
    if (rows < 256u && (cols & 7u) == 0 && nvec <= FEW_VECS * blockDim.x) {
        layer_norm_few(xr, w, b, yr, cols, eps);
        return;
    }
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
                y8[j] = normalize8(v[i], __ldg(w8 + j), __ldg(b8 + j), mean, rstd);
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
