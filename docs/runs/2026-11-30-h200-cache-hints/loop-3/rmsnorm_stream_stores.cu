// RMS norm, fp16 in and out, fp32 accumulation; x is read from device memory once.
//
// One block per row for every shape: every thread's share of the row (up to CACHE 16-byte
// vectors) and the matching weight vectors are loaded before the first use, the sum of
// squares is reduced by shuffles and one block barrier, and y is written from the
// registers. The launch rule gives every shape cols / 32 threads (128 at 4096, between 32
// and 512), four vectors a thread:
// - many rows: the layout of the layer_norm candidate's many-row path that moves the
//   same bytes at 8192 x 4096 in 36.1 us: 128-thread blocks of 58 registers a thread (64
//   allocated), eight rows in flight per SM, one barrier per row (layer_norm has four),
//   and a block leaves as soon as its row is written;
// - few rows (1 to 64): one round trip to memory plus one barrier either way, and a
//   quarter of the warps of cols / 8 threads to launch and to meet at the barrier: on the
//   H200, 1.50 against 1.71 us at 1x4096 and 2.57 against 2.66 at 64x8192
//   (docs/runs/2026-11-29-h200-cluster-at-launch).
// Rows longer than 8 x CACHE x blockDim.x halves are finished by a loop that re-reads x.
// Rows whose length is not a multiple of 8 (or unaligned buffers) take a scalar path
// with the same partition.
#include <cuda_fp16.h>

#ifndef CACHE
#define CACHE 4
#endif

// STREAM_STORES = 1: the 16-byte stores of y are streaming (st.global.cs, evict-first in
// L2): y is never re-read by this kernel, and write-back stores, whose dirty lines stay in
// L2 at normal priority, cost silu_mul 6-9% at its large shapes on the H200
// (docs/runs/2026-11-30-h200-silu-cache-hints).
#ifndef STREAM_STORES
#define STREAM_STORES 0
#endif
__device__ __forceinline__ void store8(uint4* p, uint4 v) {
#if STREAM_STORES && defined(__CUDA_ARCH__)
    __stcs(p, v);
#else
    *p = v;
#endif
}

__device__ __forceinline__ float sum_squares(const uint4& u) {
    const __half2* h = reinterpret_cast<const __half2*>(&u);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 f = __half22float2(h[j]);
        s = fmaf(f.x, f.x, s);
        s = fmaf(f.y, f.y, s);
    }
    return s;
}

__device__ __forceinline__ uint4 scale(const uint4& u, const uint4& wu, float inv) {
    uint4 o;
    const __half2* h = reinterpret_cast<const __half2*>(&u);
    const __half2* w = reinterpret_cast<const __half2*>(&wu);
    __half2* oh = reinterpret_cast<__half2*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 f = __half22float2(h[j]);
        const float2 g = __half22float2(w[j]);
        oh[j] = __floats2half2_rn(f.x * inv * g.x, f.y * inv * g.y);
    }
    return o;
}

// Butterfly sum: every lane gets the same total (fp32 addition is commutative).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

extern "C" __global__ void __launch_bounds__(512)
rmsnorm_f16(const __half* __restrict__ x, const __half* __restrict__ w, __half* __restrict__ y,
            unsigned int rows, unsigned int cols, float eps) {
    const bool vec = (cols & 7u) == 0 &&
                     (((unsigned long long)x | (unsigned long long)w | (unsigned long long)y) & 15ull) == 0;
    // One block per row (grid = rows).
    __shared__ float warp_sums[32];
    const unsigned int row = blockIdx.x;
    if (row >= rows) return;
    const __half* xr = x + (size_t)row * cols;
    __half* yr = y + (size_t)row * cols;
    const unsigned int tid = threadIdx.x, bs = blockDim.x;
    const unsigned int lane = tid & 31u, warp = tid >> 5, warps = (bs + 31u) >> 5;

    uint4 cache[CACHE], wcache[CACHE];
    float ss = 0.0f;
    const unsigned int n = cols >> 3;
    const uint4* x8 = reinterpret_cast<const uint4*>(xr);
    const uint4* w8 = reinterpret_cast<const uint4*>(w);
    if (vec) {
        // x and the weight both requested before the first use: one round trip.
#pragma unroll
        for (int c = 0; c < CACHE; ++c) {
            const unsigned int i = tid + c * bs;
            cache[c] = i < n ? x8[i] : make_uint4(0, 0, 0, 0);
            wcache[c] = i < n ? w8[i] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int c = 0; c < CACHE; ++c) ss += sum_squares(cache[c]);
        for (unsigned int i = tid + CACHE * bs; i < n; i += bs) ss += sum_squares(x8[i]);
    } else {
        for (unsigned int i = tid; i < cols; i += bs) {
            const float f = __half2float(xr[i]);
            ss = fmaf(f, f, ss);
        }
    }

    // One barrier: each warp's sum to shared memory, then every thread adds the warps'
    // sums in the same order, so all get the same total.
    ss = warp_sum(ss);
    if (lane == 0) warp_sums[warp] = ss;
    __syncthreads();
    float total = 0.0f;
    for (unsigned int k = 0; k < warps; ++k) total += warp_sums[k];
    const float inv = rsqrtf(total / (float)cols + eps);

    if (vec) {
        uint4* y8 = reinterpret_cast<uint4*>(yr);
#pragma unroll
        for (int c = 0; c < CACHE; ++c) {
            const unsigned int i = tid + c * bs;
            if (i < n) store8(y8 + i, scale(cache[c], wcache[c], inv));
        }
        for (unsigned int i = tid + CACHE * bs; i < n; i += bs)
            store8(y8 + i, scale(x8[i], w8[i], inv));
    } else {
        for (unsigned int i = tid; i < cols; i += bs)
            yr[i] = __float2half(__half2float(xr[i]) * inv * __half2float(w[i]));
    }
}
