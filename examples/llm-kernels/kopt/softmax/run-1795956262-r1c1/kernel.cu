// Row softmax, fp32, for any row count and length. Each row is read from device memory
// once: a thread keeps its first CACHE float4s in registers between the statistics pass
// and the write pass (rows longer than the block's register footprint re-read the rest).
//
// Two modes, chosen from (rows, cols) by the same test as the launch rule (split_rows):
// - many rows: one block per row (the grid is rounded up to whole clusters; the extra
//   blocks return at once and no cluster barrier is used);
// - few long rows (rows < 256, cols >= 1024): a cluster of CLUSTER blocks per row, each
//   taking a slice; the blocks exchange their (max, sum of exp) through distributed
//   shared memory (mapa + ld.shared::cluster, barrier.cluster), so 16 rows fill 128 SMs.
// Vectors: 16-byte loads and stores over the 16-byte aligned body of each row; the
// unaligned head (when cols % 4 != 0) and the tail are done one float at a time.
#define NEG_INF __int_as_float(0xff800000)
#define CLUSTER 8
#ifndef CACHE
#define CACHE 4
#endif

// Same test as the launch rule's grid and block expressions.
__device__ __forceinline__ bool split_rows(unsigned int rows, unsigned int cols) {
    return rows < 256u && cols >= 1024u;
}

// Merges (m2, s2) into (m, s): two partial (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
    const float mm = fmaxf(m, m2);
    if (mm == NEG_INF) return;  // both empty
    s = s * __expf(m - mm) + s2 * __expf(m2 - mm);
    m = mm;
}

__device__ __forceinline__ void add(float& m, float& s, float v) {
    const float nm = fmaxf(m, v);
    s = s * __expf(m - nm) + __expf(v - nm);
    m = nm;
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
// Reads the float2 at `p` in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ float2 load_remote(const float2* p, unsigned int rank) {
    const unsigned int local = (unsigned int)__cvta_generic_to_shared(p);
    unsigned int remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
                 : "=f"(v.x), "=f"(v.y)
                 : "r"(remote)
                 : "memory");
    return v;
}

extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(1024)
softmax_f32(const float* __restrict__ x, float* __restrict__ y, unsigned int rows,
            unsigned int cols) {
    __shared__ float2 warp_stats[32];
    __shared__ float2 block_stats;
    const bool split = split_rows(rows, cols);
    const unsigned int part = split ? cluster_rank() : 0u;
    const unsigned int parts = split ? CLUSTER : 1u;
    const unsigned int row = split ? blockIdx.x / CLUSTER : blockIdx.x;
    if (!split && row >= rows) return;  // padding blocks of the last cluster

    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    // Scalar head up to the first 16-byte boundary, float4 body, scalar tail. x and y
    // rows share their alignment when the buffers do; else everything is scalar.
    const unsigned long long xa = (unsigned long long)xr, ya = (unsigned long long)yr;
    unsigned int head, nv;
    if (((xa ^ ya) & 15ull) == 0 && (xa & 3ull) == 0) {
        head = (unsigned int)(((16ull - (xa & 15ull)) & 15ull) >> 2);
        if (head > cols) head = cols;
        nv = (cols - head) >> 2;
    } else {
        head = cols;
        nv = 0;
    }
    const float4* xv = reinterpret_cast<const float4*>(xr + head);
    float4* yv = reinterpret_cast<float4*>(yr + head);
    const unsigned int per = (nv + parts - 1) / parts;
    const unsigned int v0 = min(nv, part * per), v1 = min(nv, v0 + per);
    const unsigned int tid = threadIdx.x, bs = blockDim.x;

    // Pass 1: statistics. The cached vectors are all loaded before any is used.
    float4 cache[CACHE];
#pragma unroll
    for (int i = 0; i < CACHE; ++i) {
        const unsigned int v = v0 + tid + i * bs;
        cache[i] = v < v1 ? xv[v] : make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
    }
    float m = NEG_INF;
#pragma unroll
    for (int i = 0; i < CACHE; ++i)
        m = fmaxf(m, fmaxf(fmaxf(cache[i].x, cache[i].y), fmaxf(cache[i].z, cache[i].w)));
    float s = 0.0f;
    if (m != NEG_INF) {
#pragma unroll
        for (int i = 0; i < CACHE; ++i)
            s += (__expf(cache[i].x - m) + __expf(cache[i].y - m)) +
                 (__expf(cache[i].z - m) + __expf(cache[i].w - m));
    }
    for (unsigned int v = v0 + tid + CACHE * bs; v < v1; v += bs) {
        const float4 a = xv[v];
        const float lm = fmaxf(fmaxf(a.x, a.y), fmaxf(a.z, a.w));
        const float nm = fmaxf(m, lm);
        s = s * __expf(m - nm) + (__expf(a.x - nm) + __expf(a.y - nm)) +
            (__expf(a.z - nm) + __expf(a.w - nm));
        m = nm;
    }
    const unsigned int tail0 = head + 4 * nv;  // first element after the body
    if (part == 0) {
        for (unsigned int c = tid; c < head; c += bs) add(m, s, xr[c]);
        for (unsigned int c = tail0 + tid; c < cols; c += bs) add(m, s, xr[c]);
    }

    // Block reduction of (m, s): shuffles, then one warp over the warps' pairs.
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
        merge(m, s, m2, s2);
    }
    const unsigned int lane = tid & 31u, warp = tid >> 5;
    if (lane == 0) warp_stats[warp] = make_float2(m, s);
    __syncthreads();
    if (warp == 0) {
        const unsigned int warps = (bs + 31u) >> 5;
        m = lane < warps ? warp_stats[lane].x : NEG_INF;
        s = lane < warps ? warp_stats[lane].y : 0.0f;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
            const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
            merge(m, s, m2, s2);
        }
        if (lane == 0) block_stats = make_float2(m, s);
    }
    __syncthreads();
    float2 st = block_stats;
    if (split) {
        // Every block of the cluster has written its pair once all have arrived; each
        // merges the pairs in rank order, so all get the same row statistics.
        cluster_arrive();
        cluster_wait();
        st = make_float2(NEG_INF, 0.0f);
        for (unsigned int r = 0; r < CLUSTER; ++r) {
            const float2 o = load_remote(&block_stats, r);
            merge(st.x, st.y, o.x, o.y);
        }
        // No block may exit while another can still read its shared memory: arrive now,
        // wait before returning.
        cluster_arrive();
    }
    m = st.x;
    const float inv = 1.0f / st.y;

    // Pass 2: write, from registers where cached.
#pragma unroll
    for (int i = 0; i < CACHE; ++i) {
        const unsigned int v = v0 + tid + i * bs;
        if (v < v1)
            yv[v] = make_float4(__expf(cache[i].x - m) * inv, __expf(cache[i].y - m) * inv,
                                __expf(cache[i].z - m) * inv, __expf(cache[i].w - m) * inv);
    }
    for (unsigned int v = v0 + tid + CACHE * bs; v < v1; v += bs) {
        const float4 a = xv[v];
        yv[v] = make_float4(__expf(a.x - m) * inv, __expf(a.y - m) * inv, __expf(a.z - m) * inv,
                            __expf(a.w - m) * inv);
    }
    if (part == 0) {
        for (unsigned int c = tid; c < head; c += bs) yr[c] = __expf(xr[c] - m) * inv;
        for (unsigned int c = tail0 + tid; c < cols; c += bs) yr[c] = __expf(xr[c] - m) * inv;
    }
    if (split) cluster_wait();
}
