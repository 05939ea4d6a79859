// RMS norm, fp16 in and out, fp32 accumulation; x is read from device memory once.
//
// Many rows: one block per row, each thread keeping up to CACHE 16-byte vectors (8 halves
// each) of its row in registers between the sum of squares and the write. Few rows
// (rows < 256, cols >= 1024): a cluster of CLUSTER blocks per row, each block a slice,
// the slices' sums of squares exchanged through distributed shared memory (mapa +
// ld.shared::cluster, barrier.cluster), so that 1 or 64 rows still spread over the SMs.
// Rows whose length is not a multiple of 8 (or unaligned buffers) take a scalar path
// with the same partition.
#include <cuda_fp16.h>

#define CLUSTER 8
#ifndef CACHE
#define CACHE 4
#endif

// Same test as the launch rule's grid and block expressions.
__device__ __forceinline__ bool split_rows(unsigned int rows, unsigned int cols) {
    return rows < 256u && cols >= 1024u;
}

__device__ __forceinline__ unsigned int cluster_rank() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ float load_remote(const float* p, unsigned int rank) {
    const unsigned int local = (unsigned int)__cvta_generic_to_shared(p);
    unsigned int remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
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

extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024)
rmsnorm_f16(const __half* __restrict__ x, const __half* __restrict__ w, __half* __restrict__ y,
            unsigned int rows, unsigned int cols, float eps) {
    __shared__ float warp_sums[32];
    __shared__ float block_sum;
    const bool split = split_rows(rows, cols);
    const unsigned int part = split ? cluster_rank() : 0u;
    const unsigned int parts = split ? CLUSTER : 1u;
    const unsigned int row = split ? blockIdx.x / CLUSTER : blockIdx.x;
    if (!split && row >= rows) return;  // padding blocks of the last cluster

    const __half* xr = x + (size_t)row * cols;
    __half* yr = y + (size_t)row * cols;
    const bool vec = (cols & 7u) == 0 &&
                     (((unsigned long long)x | (unsigned long long)w | (unsigned long long)y) & 15ull) == 0;
    const unsigned int n = vec ? cols >> 3 : cols;  // vectors or elements
    const unsigned int per = (n + parts - 1) / parts;
    const unsigned int i0 = min(n, part * per), i1 = min(n, i0 + per);
    const unsigned int tid = threadIdx.x, bs = blockDim.x;

    uint4 cache[CACHE];
    float ss = 0.0f;
    if (vec) {
        const uint4* x8 = reinterpret_cast<const uint4*>(xr);
#pragma unroll
        for (int c = 0; c < CACHE; ++c) {
            const unsigned int i = i0 + tid + c * bs;
            cache[c] = i < i1 ? x8[i] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int c = 0; c < CACHE; ++c) ss += sum_squares(cache[c]);
        for (unsigned int i = i0 + tid + CACHE * bs; i < i1; i += bs) ss += sum_squares(x8[i]);
    } else {
        for (unsigned int i = i0 + tid; i < i1; i += bs) {
            const float f = __half2float(xr[i]);
            ss = fmaf(f, f, ss);
        }
    }

#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const unsigned int lane = tid & 31u, warp = tid >> 5;
    if (lane == 0) warp_sums[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        float t = lane < ((bs + 31u) >> 5) ? warp_sums[lane] : 0.0f;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
        if (lane == 0) block_sum = t;
    }
    __syncthreads();
    float total = block_sum;
    if (split) {
        // All blocks' sums are written once all have arrived; every block adds them in
        // rank order, so all get the same total.
        cluster_arrive();
        cluster_wait();
        total = 0.0f;
        for (unsigned int r = 0; r < CLUSTER; ++r) total += load_remote(&block_sum, r);
        cluster_arrive();  // no block exits while another may still read its sum
    }
    const float inv = rsqrtf(total / (float)cols + eps);

    if (vec) {
        const uint4* x8 = reinterpret_cast<const uint4*>(xr);
        const uint4* w8 = reinterpret_cast<const uint4*>(w);
        uint4* y8 = reinterpret_cast<uint4*>(yr);
#pragma unroll
        for (int c = 0; c < CACHE; ++c) {
            const unsigned int i = i0 + tid + c * bs;
            if (i < i1) y8[i] = scale(cache[c], w8[i], inv);
        }
        for (unsigned int i = i0 + tid + CACHE * bs; i < i1; i += bs) y8[i] = scale(x8[i], w8[i], inv);
    } else {
        for (unsigned int i = i0 + tid; i < i1; i += bs)
            yr[i] = __float2half(__half2float(xr[i]) * inv * __half2float(w[i]));
    }
    if (split) cluster_wait();
}
