// Row softmax, fp32, for any row count and length. Each row is read from device memory
// once: a thread keeps its first vectors of the row in registers between the statistics
// pass and the write pass (rows longer than the register footprint re-read the rest).
//
// Three modes, chosen from (rows, cols) by the same tests as the launch rule:
// - few long rows (split_rows: rows < 256, cols >= 1024): a cluster of CLUSTER blocks per
//   row, each taking a slice; the blocks exchange their (max, sum of exp) through
//   distributed shared memory (mapa + ld.shared::cluster after barrier.cluster, or with
//   EXCHANGE_PUSH st.async pushes onto an mbarrier), so 16 rows fill 128 SMs;
// - short rows (warp_rows: cols <= 128 x WARP_CACHE): one warp per row, WARPS rows per
//   block (blockDim.x / 32), the row in registers (WARP_CACHE float4 per lane: 1024
//   floats per warp), reduced by shuffles alone: no block barrier, so a warp that
//   finishes its row leaves at once and the SM keeps every other warp's loads in flight.
//   The row is held, so the statistics need no running (max, sum) merges: one max
//   butterfly, then each element's 2^(x log2 e - max log2 e) (one FFMA and one MUFU ex2)
//   is computed once, kept in place of x, summed, and scaled by 1 / sum when written;
// - otherwise one block per row (block-wide reduction through shared memory).
// The cluster is set at launch, by the launch rule, for the split mode only: the kernel
// carries no __cluster_dims__, because a compile-time cluster makes the block scheduler
// place every launch in groups of CLUSTER blocks, and at 32768x1024 that cost 2% (66.02
// against 64.71 us with one-warp blocks, docs/runs/2026-11-29-h200-cluster-at-launch).
// The extra warps of the last block in the warp mode return at once.
// Vectors: 16-byte loads and stores over the 16-byte aligned body of each row; the
// unaligned head (when cols % 4 != 0) and the tail are done one float at a time.
#define NEG_INF __int_as_float(0xff800000)
// Blocks per row (and per cluster) in the split mode; the launch rule's cluster.
#ifndef CLUSTER
#define CLUSTER 8
#endif
#ifndef CACHE
#define CACHE 8
#endif
// The split mode's float4s a thread in registers (the launch rule sizes its block for
// SPLIT_CACHE of them) and whether it reuses the statistics pass's exponentials (see
// softmax_block_rows). Defaults: the block mode's CACHE, no reuse.
#ifndef SPLIT_CACHE
#define SPLIT_CACHE CACHE
#endif
#ifndef SPLIT_REUSE
#define SPLIT_REUSE 0
#endif
#ifndef HEAD_REGS
#define HEAD_REGS 0
#endif
#ifndef WARP_CACHE
#define WARP_CACHE 8
#endif
// Rows (warps) per block in the warp-per-row mode; the launch rule's block is WARPS * 32.
#ifndef WARPS
#define WARPS 8
#endif
#define LOG2E 1.4426950408889634f
// Cluster mode, GATHER = 1: one warp of each block gathers the cluster's (max, sum) pairs,
// lane r reading block r's, instead of every thread reading all CLUSTER of them.
#ifndef GATHER
#define GATHER 0
#endif
// Split mode, EXCHANGE_PUSH = 1: each block pushes its (max, sum) into every block of the
// cluster with st.async onto an mbarrier, instead of a cluster barrier round and remote loads
// (see softmax_block_rows).
#ifndef EXCHANGE_PUSH
#define EXCHANGE_PUSH 0
#endif
// With EXCHANGE_PUSH, MERGE_TREE = 1 shortens the merges between the block's last load and
// its first store: warp 0 merges the warps' pairs over as many butterfly levels as the warps
// and the cluster need (3 for 8 warps and CLUSTER 8, not 5), and the cluster's CLUSTER pairs
// are merged at once (their max, then CLUSTER independent exponentials) instead of one after
// the other (CLUSTER dependent merges of two exponentials each).
#ifndef MERGE_TREE
#define MERGE_TREE 0
#endif

// 2^x by the MUFU approximation (ex2.approx.ftz, as __expf uses after its multiply by
// log2 e); plain C++ where the file is not compiled for a GPU (the CPU emulation of
// scripts/emulate-candidates.sh).
__device__ __forceinline__ float fast_exp2(float x) {
#ifdef __CUDA_ARCH__
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    return exp2f(x);
#endif
}

// Same test as the launch rule's grid and block expressions.
__device__ __forceinline__ bool split_rows(unsigned int rows, unsigned int cols) {
    return rows < 256u && cols >= 1024u;
}
__device__ __forceinline__ bool warp_rows(unsigned int rows, unsigned int cols) {
    return !split_rows(rows, cols) && cols <= 128u * WARP_CACHE;
}

// The 16-byte aligned body of a row: `head` floats before it, `nv` float4s in it. x and y
// rows share their alignment when the buffers do; else everything is scalar (head = cols).
__device__ __forceinline__ void row_body(const float* xr, const float* yr, unsigned int cols,
                                         unsigned int& head, unsigned int& nv) {
    const unsigned long long xa = (unsigned long long)xr, ya = (unsigned long long)yr;
    if (((xa ^ ya) & 15ull) == 0 && (xa & 3ull) == 0) {
        head = (unsigned int)(((16ull - (xa & 15ull)) & 15ull) >> 2);
        if (head > cols) head = cols;
        nv = (cols - head) >> 2;
    } else {
        head = cols;
        nv = 0;
    }
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

// (max, sum of exp(x - max)) of N cached float4s; padding lanes hold -inf. An all -inf
// cache gives (-inf, 0), not the NaN of exp(-inf - -inf).
template <int N>
__device__ __forceinline__ void cached_stats(const float4 (&cache)[N], float& m, float& s) {
    m = NEG_INF;
#pragma unroll
    for (int i = 0; i < N; ++i)
        m = fmaxf(m, fmaxf(fmaxf(cache[i].x, cache[i].y), fmaxf(cache[i].z, cache[i].w)));
    s = 0.0f;
    if (m != NEG_INF) {
#pragma unroll
        for (int i = 0; i < N; ++i)
            s += (__expf(cache[i].x - m) + __expf(cache[i].y - m)) +
                 (__expf(cache[i].z - m) + __expf(cache[i].w - m));
    }
}

// Butterfly over the warp: merge() is symmetric in its two pairs, so every lane ends with
// the same (max, sum of exp).
__device__ __forceinline__ void warp_merge(float& m, float& s) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
        merge(m, s, m2, s2);
    }
}

__device__ __forceinline__ unsigned int cluster_rank() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// Blocks in this launch's cluster (1 for a launch without one).
__device__ __forceinline__ unsigned int cluster_blocks() {
    unsigned int n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
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

__device__ __forceinline__ unsigned int shared_addr(const void* p) {
    return (unsigned int)__cvta_generic_to_shared(p);
}
// The exchange barrier of EXCHANGE_PUSH: one arrival (this call's) expecting `bytes`, which
// the cluster's st.async pushes complete; the init is made visible to the cluster by the
// release of the caller's next barrier.cluster.arrive.
__device__ __forceinline__ void init_exchange(unsigned long long* bar, unsigned int bytes) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_addr(bar)) : "memory");
    asm volatile(
        "{\n .reg .b64 state;\n mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}"
        ::"r"(shared_addr(bar)), "r"(bytes)
        : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Writes (m, s) to `slot` of block `rank` of the cluster, completing 8 bytes on its `bar`.
__device__ __forceinline__ void push_pair(float2* slot, unsigned long long* bar,
                                          unsigned int rank, float m, float s) {
    unsigned int rslot, rbar;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rslot) : "r"(shared_addr(slot)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rbar) : "r"(shared_addr(bar)), "r"(rank));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
                 ::"r"(rslot), "f"(m), "f"(s), "r"(rbar)
                 : "memory");
}
// Until the exchange barrier's first phase completes (every push has landed).
__device__ __forceinline__ void wait_exchange(unsigned long long* bar) {
    unsigned int done = 0;
    while (!done)
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n"
            " selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(shared_addr(bar))
            : "memory");
}

// One warp per row (warp_rows mode). No block barrier: a warp past the last row returns.
__device__ __forceinline__ void softmax_warp_row(const float* __restrict__ x,
                                                 float* __restrict__ y, unsigned int rows,
                                                 unsigned int cols) {
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    unsigned int head, nv;
    row_body(xr, yr, cols, head, nv);
    if (head > 3u) {
        // x and y rows not 16-byte aligned alike (head = cols): one float at a time.
        float m = NEG_INF, s = 0.0f;
        for (unsigned int c = lane; c < cols; c += 32u) add(m, s, xr[c]);
        warp_merge(m, s);
        const float inv = 1.0f / s;
        for (unsigned int c = lane; c < cols; c += 32u) yr[c] = __expf(xr[c] - m) * inv;
        return;
    }
    const float4* xv = reinterpret_cast<const float4*>(xr + head);
    float4* yv = reinterpret_cast<float4*>(yr + head);

    // All the loads are issued before any is used: WARP_CACHE x 16 bytes per lane, and
    // the scalar head and tail. warp_rows keeps cols <= 128 * WARP_CACHE, so
    // nv <= 32 * WARP_CACHE: the cache holds the whole body, and the head and tail are at
    // most 3 floats each. Padding holds -inf, whose 2^(-inf) is 0.
    float4 cache[WARP_CACHE];
#pragma unroll
    for (int i = 0; i < WARP_CACHE; ++i) {
        const unsigned int v = lane + 32u * i;
        cache[i] = v < nv ? xv[v] : make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
    }
    const unsigned int tail0 = head + 4 * nv;
    const bool has_head = lane < head, has_tail = tail0 + lane < cols;
    float hv = has_head ? xr[lane] : NEG_INF;
    float tv = has_tail ? xr[tail0 + lane] : NEG_INF;

    // Row max: per lane, then one butterfly (every lane ends with it).
    float m = fmaxf(hv, tv);
#pragma unroll
    for (int i = 0; i < WARP_CACHE; ++i)
        m = fmaxf(m, fmaxf(fmaxf(cache[i].x, cache[i].y), fmaxf(cache[i].z, cache[i].w)));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));

    // exp(x - m) = 2^(x log2 e - m log2 e): one FFMA and one ex2 per element, kept in the
    // cache. The rounding of m log2 e is common to the whole row and cancels in x / sum.
    const float ml = m * LOG2E;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < WARP_CACHE; ++i) {
        cache[i].x = fast_exp2(fmaf(cache[i].x, LOG2E, -ml));
        cache[i].y = fast_exp2(fmaf(cache[i].y, LOG2E, -ml));
        cache[i].z = fast_exp2(fmaf(cache[i].z, LOG2E, -ml));
        cache[i].w = fast_exp2(fmaf(cache[i].w, LOG2E, -ml));
        s += (cache[i].x + cache[i].y) + (cache[i].z + cache[i].w);
    }
    hv = fast_exp2(fmaf(hv, LOG2E, -ml));
    tv = fast_exp2(fmaf(tv, LOG2E, -ml));
    s += hv + tv;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    const float inv = 1.0f / s;
#pragma unroll
    for (int i = 0; i < WARP_CACHE; ++i) {
        const unsigned int v = lane + 32u * i;
        if (v < nv)
            yv[v] = make_float4(cache[i].x * inv, cache[i].y * inv, cache[i].z * inv,
                                cache[i].w * inv);
    }
    if (has_head) yr[lane] = hv * inv;
    if (has_tail) yr[tail0 + lane] = tv * inv;
}

// The block and split modes: N float4s a thread cached in registers. REUSE: the cache keeps
// 2^(x log2 e - m log2 e) for the cache's own max m (one FFMA and one MUFU ex2 each, as the
// warp mode does), and the write pass scales it by exp(m - row max) / sum: no second
// exponential per element. Without REUSE the write pass computes exp(x - row max) again.
template <int N, bool REUSE>
__device__ __forceinline__ void softmax_block_rows(const float* __restrict__ x,
                                                   float* __restrict__ y, unsigned int rows,
                                                   unsigned int cols, bool split) {
    __shared__ float2 warp_stats[32];
    __shared__ float2 block_stats;
#if GATHER
    __shared__ float2 row_stats;
#endif
    __shared__ unsigned long long exchange_bar;  // EXCHANGE_PUSH only (8-byte aligned)
    __shared__ float2 exchange_slots[CLUSTER];
    const unsigned int part = split ? cluster_rank() : 0u;
#if EXCHANGE_PUSH
    // The barrier is set up before the loads; the cluster wait that pairs with this arrive
    // comes before the first push, so by then every block's barrier is ready.
    if (split) {
        if (threadIdx.x == 0) init_exchange(&exchange_bar, CLUSTER * sizeof(float2));
        cluster_arrive();
    }
#endif
    const unsigned int parts = split ? CLUSTER : 1u;
    const unsigned int row = split ? blockIdx.x / CLUSTER : blockIdx.x;
    if (!split && row >= rows) return;

    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    // Scalar head up to the first 16-byte boundary, float4 body, scalar tail.
    unsigned int head, nv;
    row_body(xr, yr, cols, head, nv);
    const float4* xv = reinterpret_cast<const float4*>(xr + head);
    float4* yv = reinterpret_cast<float4*>(yr + head);
    const unsigned int per = (nv + parts - 1) / parts;
    const unsigned int v0 = min(nv, part * per), v1 = min(nv, v0 + per);
    const unsigned int tid = threadIdx.x, bs = blockDim.x;

    // Pass 1: statistics. The cached vectors are all loaded before any is used.
    float4 cache[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const unsigned int v = v0 + tid + i * bs;
        cache[i] = v < v1 ? xv[v] : make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
    }
    // The scalar head and tail (at most 3 floats each when the rows are co-aligned, block 0
    // of the row's share) are loaded with the vectors and kept: re-reading them after the
    // exchange put a dependent memory round trip before the last stores (8x50257 ran
    // 0.6 us slower than 8x50256, docs/runs/2026-11-30-h200-split-anatomy). HEAD_REGS = 0
    // keeps the loops for them. Rows not co-aligned (head = cols) always take the loops.
    const unsigned int tail0 = head + 4 * nv;  // first element after the body
    const bool edge_regs = HEAD_REGS && head <= 3u;
    const bool has_head = edge_regs && part == 0 && tid < head;
    const bool has_tail = edge_regs && part == 0 && tail0 + tid < cols;
    const float hv = has_head ? xr[tid] : NEG_INF;
    const float tv = has_tail ? xr[tail0 + tid] : NEG_INF;
    float m, s;
    if (REUSE) {
        m = NEG_INF;
#pragma unroll
        for (int i = 0; i < N; ++i)
            m = fmaxf(m, fmaxf(fmaxf(cache[i].x, cache[i].y), fmaxf(cache[i].z, cache[i].w)));
        // An all -inf cache (padding, or -inf inputs) keeps 2^-inf = 0, not a NaN.
        const float ml = m == NEG_INF ? 0.0f : m * LOG2E;
        s = 0.0f;
#pragma unroll
        for (int i = 0; i < N; ++i) {
            cache[i].x = fast_exp2(fmaf(cache[i].x, LOG2E, -ml));
            cache[i].y = fast_exp2(fmaf(cache[i].y, LOG2E, -ml));
            cache[i].z = fast_exp2(fmaf(cache[i].z, LOG2E, -ml));
            cache[i].w = fast_exp2(fmaf(cache[i].w, LOG2E, -ml));
            s += (cache[i].x + cache[i].y) + (cache[i].z + cache[i].w);
        }
    } else {
        cached_stats<N>(cache, m, s);
    }
    const float cache_max = m;  // what the REUSE cache is relative to
    for (unsigned int v = v0 + tid + N * bs; v < v1; v += bs) {
        const float4 a = xv[v];
        const float lm = fmaxf(fmaxf(a.x, a.y), fmaxf(a.z, a.w));
        const float nm = fmaxf(m, lm);
        s = s * __expf(m - nm) + (__expf(a.x - nm) + __expf(a.y - nm)) +
            (__expf(a.z - nm) + __expf(a.w - nm));
        m = nm;
    }
    if (edge_regs) {
        if (has_head) add(m, s, hv);
        if (has_tail) add(m, s, tv);
    } else if (part == 0) {
        for (unsigned int c = tid; c < head; c += bs) add(m, s, xr[c]);
        for (unsigned int c = tail0 + tid; c < cols; c += bs) add(m, s, xr[c]);
    }

    // Block reduction of (m, s): shuffles, then one warp over the warps' pairs.
    warp_merge(m, s);
    const unsigned int lane = tid & 31u, warp = tid >> 5;
    if (lane == 0) warp_stats[warp] = make_float2(m, s);
    float2 st;
    if (EXCHANGE_PUSH && split) {
        // Warp 0 reduces the warps' pairs, and lane r pushes the block's pair into slot
        // `part` of block r (st.async, completing bytes on block r's barrier). Every block
        // then waits for its CLUSTER pairs and merges them in rank order, so all get the
        // same row statistics: no cluster barrier round, no remote loads, no final wait.
        __syncthreads();
        cluster_wait();  // every block of the cluster has initialised its barrier
        if (warp == 0) {
            const unsigned int warps = (bs + 31u) >> 5;
            m = lane < warps ? warp_stats[lane].x : NEG_INF;
            s = lane < warps ? warp_stats[lane].y : 0.0f;
#if MERGE_TREE
            // Lanes from `warps` up hold empty pairs, so a butterfly over the lowest `span`
            // lanes (a power of two, at least the warps and the cluster's blocks) leaves
            // every one of them, the pushing lanes 0..CLUSTER-1 included, with the block's
            // pair (CLUSTER <= 32).
            unsigned int span = 1;
            while (span < warps || span < CLUSTER) span <<= 1;
            for (unsigned int off = span >> 1; off > 0; off >>= 1) {
                const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
                const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
                merge(m, s, m2, s2);
            }
#else
            warp_merge(m, s);
#endif
            if (lane < CLUSTER) push_pair(&exchange_slots[part], &exchange_bar, lane, m, s);
        }
        wait_exchange(&exchange_bar);
#if MERGE_TREE
        // The row max over the cluster's pairs, then each pair's sum rescaled to it: the
        // CLUSTER exponentials are independent, only the adds are in sequence (a tree of
        // them spilled at the kernel's 64 registers). Every block does the same operations
        // on the same pairs, so all get the same row statistics.
        float mx = NEG_INF, sum = 0.0f;
#pragma unroll
        for (int r = 0; r < CLUSTER; ++r) mx = fmaxf(mx, exchange_slots[r].x);
        if (mx != NEG_INF) {
#pragma unroll
            for (int r = 0; r < CLUSTER; ++r)
                sum += exchange_slots[r].y * __expf(exchange_slots[r].x - mx);
        }
        st = make_float2(mx, sum);
#else
        st = make_float2(NEG_INF, 0.0f);
#pragma unroll
        for (int r = 0; r < CLUSTER; ++r) merge(st.x, st.y, exchange_slots[r].x, exchange_slots[r].y);
#endif
    } else {
        __syncthreads();
        if (warp == 0) {
            const unsigned int warps = (bs + 31u) >> 5;
            m = lane < warps ? warp_stats[lane].x : NEG_INF;
            s = lane < warps ? warp_stats[lane].y : 0.0f;
            warp_merge(m, s);
            if (lane == 0) block_stats = make_float2(m, s);
        }
        __syncthreads();
        st = block_stats;
        if (split) {
            // Every block of the cluster has written its pair once all have arrived; each
            // merges the pairs in rank order, so all get the same row statistics.
            cluster_arrive();
            cluster_wait();
#if GATHER
            // Lane r of warp 0 reads block r's pair (CLUSTER remote loads a block, in parallel),
            // and a butterfly over lanes 0..CLUSTER-1 merges them; lane 0's result, computed by
            // the same operations on the same values in every block, is the row's statistics.
            if (warp == 0) {
                float2 o = lane < CLUSTER ? load_remote(&block_stats, lane)
                                          : make_float2(NEG_INF, 0.0f);
#pragma unroll
                for (int off = CLUSTER / 2; off > 0; off >>= 1) {
                    const float m2 = __shfl_xor_sync(0xffffffffu, o.x, off);
                    const float s2 = __shfl_xor_sync(0xffffffffu, o.y, off);
                    merge(o.x, o.y, m2, s2);
                }
                if (lane == 0) row_stats = o;
            }
            // No block may exit while another can still read its shared memory: arrive now
            // (warp 0 after its reads), wait before returning.
            cluster_arrive();
            __syncthreads();
            st = row_stats;
#else
            st = make_float2(NEG_INF, 0.0f);
            for (unsigned int r = 0; r < CLUSTER; ++r) {
                const float2 o = load_remote(&block_stats, r);
                merge(st.x, st.y, o.x, o.y);
            }
            // No block may exit while another can still read its shared memory: arrive now,
            // wait before returning.
            cluster_arrive();
#endif
        }
    }
    m = st.x;
    const float inv = 1.0f / st.y;

    // Pass 2: write, from registers where cached.
    if (REUSE) {
        const float scale = __expf(cache_max - m) * inv;
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const unsigned int v = v0 + tid + i * bs;
            if (v < v1)
                yv[v] = make_float4(cache[i].x * scale, cache[i].y * scale, cache[i].z * scale,
                                    cache[i].w * scale);
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const unsigned int v = v0 + tid + i * bs;
            if (v < v1)
                yv[v] = make_float4(__expf(cache[i].x - m) * inv, __expf(cache[i].y - m) * inv,
                                    __expf(cache[i].z - m) * inv, __expf(cache[i].w - m) * inv);
        }
    }
    for (unsigned int v = v0 + tid + N * bs; v < v1; v += bs) {
        const float4 a = xv[v];
        yv[v] = make_float4(__expf(a.x - m) * inv, __expf(a.y - m) * inv, __expf(a.z - m) * inv,
                            __expf(a.w - m) * inv);
    }
    if (edge_regs) {
        if (has_head) yr[tid] = __expf(hv - m) * inv;
        if (has_tail) yr[tail0 + tid] = __expf(tv - m) * inv;
    } else if (part == 0) {
        for (unsigned int c = tid; c < head; c += bs) yr[c] = __expf(xr[c] - m) * inv;
        for (unsigned int c = tail0 + tid; c < cols; c += bs) yr[c] = __expf(xr[c] - m) * inv;
    }
    if (split && !EXCHANGE_PUSH) cluster_wait();
}

extern "C" __global__ void __launch_bounds__(1024)
softmax_f32(const float* __restrict__ x, float* __restrict__ y, unsigned int rows,
            unsigned int cols) {
    if (warp_rows(rows, cols)) {
        softmax_warp_row(x, y, rows, cols);
        return;
    }
    const bool split = split_rows(rows, cols);
    // The split mode's slices and exchange need the launch rule's cluster: fault loudly
    // rather than write wrong rows when launched without it.
    if (split && cluster_blocks() != CLUSTER) __trap();
    if (split)
        softmax_block_rows<SPLIT_CACHE, SPLIT_REUSE != 0>(x, y, rows, cols, true);
    else
        softmax_block_rows<CACHE, false>(x, y, rows, cols, false);
}
