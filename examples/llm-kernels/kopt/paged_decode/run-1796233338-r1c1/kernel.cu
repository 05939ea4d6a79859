// Grouped-query attention, one decode step, fp16 (head dim 128), over a paged KV cache:
// flash-decoding on the tensor cores, K and V streamed through per-warp cp.async rings,
// each sequence split over one thread-block cluster whose blocks merge in distributed
// shared memory. Same arguments and layout as kernels/paged_decode.cu.
//
// Why it is shaped this way (from reading the reference; see the proposal for the
// figures): the reference gives a whole (sequence, KV head) to one block of 128 threads,
// so at batch 8 only 64 blocks stream and the one holding a 29k-key sequence sets the
// time; each 64-key step waits three times on memory (block table, K, V) with a few KB in
// flight; and the dot products cost 5 shuffles per key and head on the CUDA cores.
//
// Work item = (sequence, KV head) with its group of up to HEADS (8) query heads, as rows of
// the mma's A operand: each K and V row is read once for all of them. Every work item is
// one thread-block cluster of C blocks (grid (C, batch * kv_heads), cluster (C, 1, 1), set
// at launch; C from the launch rule, read back from %cluster_nctarank): block r of the
// cluster takes tiles [r T / C, (r + 1) T / C) of the item's T tiles of 16 keys, so a
// cluster's blocks finish together whatever the sequence's length, and the blocks merge
// their partials (max, sum, 128 accumulators per head) through distributed shared memory
// after a cluster barrier: no global scratch, no second kernel. The launch rule picks
// C = clamp(SPLIT_BLOCKS / items, 1, MAX_CLUSTER): about SPLIT_BLOCKS blocks in all, so
// that few items (batch 8: 64 items, C = 8) still cover the GPU in blocks small enough to
// balance, and many items (batch 64: 512 items, C = 2) pay little merge. On an H200
// (standalone harness, 2026-12-02) SPLIT_BLOCKS 512 and 1024 ran within 1.5% of each
// other at batch 8 to 64; 2048 and 4096 (clusters of 8 at batch 32 and 64) lost up to 5%
// there, 128 and 256 (clusters of 2 or 4 at batch 8) 13-35% at batch 8.
//
// Balance across items: the lengths differ (1k to 32k keys), so a cluster of a long
// sequence runs 32 times longer than one of a short sequence. The clusters are dispatched
// longest first: blockIdx.y / kv_heads is a rank, and every block maps it to the sequence
// of that rank in decreasing length (each thread ranks one sequence against the others in
// shared memory: batch^2 / THREADS comparisons, for batch <= SORT_MAX; above that the
// order is the batch's). The block scheduler hands out clusters in order as SMs free up,
// so the last ones to start are the shortest and the tail of the launch is short (the
// longest-processing-time-first rule): 13% faster at batch 8 (127 against 143 us) and 15%
// at batch 64 with one block an item (1036 against 1189 us) than the batch's own order on
// the H200. The KV heads of one sequence stay adjacent, so the kv_heads tiles of a page
// (contiguous in the cache) are read at about the same time.
//
// Streaming: each warp owns a ring of STAGES tiles (16 keys of K + 16 of V, 8 KB a stage)
// in dynamic shared memory, filled with 16-byte cp.async.cg (no registers, no L1); warp w
// takes the block's tiles w, w + WARPS, ... and issues tile i + STAGES - 1 before computing
// tile i, so STAGES - 1 tiles per warp stay in flight; a warp waits for its own copies only
// (no block barrier in the main loop). page_size % 16 == 0, so a tile never straddles a
// page: its 16 K rows are 4 KB contiguous in the cache, as are its V rows. The page
// indices come from the block table 32 tiles ahead: lane j of a warp holds the page of the
// warp's tile 32 c + j (one coalesced load per 32 tiles, issued a group early), broadcast
// with a shuffle when the tile is issued, so no table load sits in front of a copy. Rows
// of the last tile past the sequence's end copy its last row instead (finite whatever the
// cache holds there, masked to probability 0): a page's unused rows are never read, so
// stale or NaN contents cannot reach the output.
// WARPS 4 and STAGES 3: 96 KB of ring per block, two blocks per SM (128 KB in flight per
// SM), so one block's start (ranking, table, first copies) and end (merges) overlap the
// other's streaming, and the device holds 30 clusters of 8 (15 with 8 warps or 4 stages,
// one block per SM: 8% slower at batch 8).
//
// Per warp and tile of 16 keys (as in the accepted contiguous variant,
// kopt/gqa_decode/run-1795990872-r1c2):
//   scores  S[8 heads x 16 keys] = Q[heads x 128] K^T    (16 mma.m16n8k16, rows 8..15 zero)
//   output  O[8 heads x 128]    += P[heads x 16 keys] V  (16 mma.m16n8k16)
// Each lane reads whole 16-byte chunks of the stage into its fragments (the head
// dimension's order inside an mma is free): K as the B operand of the scores (lane (g, t)
// holds key g, chunks t, t+4, t+8, t+12), V as the B operand of the output (chunks g and
// g+8 of keys 2t, 2t+1, 2t+8, 2t+9, paired across keys with one byte-permute per
// register). Chunk c of row r of a stage sits at chunk position c ^ SWZ(r), SWZ(r) = (r & 6)
// ^ 4 (r & 1): the K and V read patterns and the cp.async writes are free of bank
// conflicts. The score fragment is, after the online softmax (exp2 domain, fp32), the P
// fragment of the output mma (FlashAttention 2): 2 shuffles per tile, one ex2 per score.
#include <cuda_fp16.h>

#define NEG_INF __int_as_float(0xff800000)
#define HEAD_DIM 128
#define HEADS 8            // query heads per work item (rows of the mma's A operand)
#ifndef WARPS
#define WARPS 4            // warps per block, each with its own ring
#endif
#ifndef STAGES
#define STAGES 3           // ring depth in tiles: STAGES - 1 tiles in flight per warp
#endif
#ifndef MAX_CLUSTER
#define MAX_CLUSTER 8      // most blocks per cluster (portable); the launch rule's cap
#endif
#ifndef SORT_MAX
#define SORT_MAX 256       // longest-first order for batches up to this size
#endif
#define THREADS (WARPS * 32)
#define TILE 16            // keys per warp per step
#define KEY_BYTES 256      // one key row of K or V
#define TILE_BYTES 8192    // one stage: TILE rows of K, then TILE rows of V
#define RING_BYTES (STAGES * TILE_BYTES)  // per warp; the launch rule's smem is WARPS of them
#define ROW (HEAD_DIM + 4) // padded shared-memory row of the warps' merge
// softmax scale 1/sqrt(128) times log2(e): scores are kept in the exp2 domain.
#define SCALE_LOG2E 0.12751743074790924f

static_assert(STAGES >= 2, "STAGES: one tile computed while at least one is in flight");
static_assert(THREADS <= 1024, "WARPS: at most 32 warps per block");
static_assert(WARPS * RING_BYTES >= WARPS * HEADS * ROW * 4, "ring too small for the merge");
static_assert(MAX_CLUSTER >= 1 && MAX_CLUSTER <= 16, "MAX_CLUSTER: 1 to 16 blocks");

// PTX-BEGIN: async copy, clusters, exp2, and the tensor-core step.
__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    return (unsigned int)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, cached in L2 only (K and V are read once).
__device__ __forceinline__ void cp_async16(unsigned int dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(src), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Until at most N of this thread's newest groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Thread-block cluster: this block's rank, the cluster's size (1 for a launch without a
// cluster), the split barrier (arrive releases this block's shared-memory writes, wait
// acquires the others'), and loads from the shared memory of the cluster's block `rank`
// at the address of `p` in this block.
__device__ __forceinline__ unsigned int cluster_rank() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
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
__device__ __forceinline__ unsigned int remote_addr(const void* p, unsigned int rank) {
    unsigned int r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr(p)), "r"(rank));
    return r;
}
__device__ __forceinline__ float2 load_remote2(const float2* p, unsigned int rank) {
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
                 : "=f"(v.x), "=f"(v.y)
                 : "r"(remote_addr(p, rank))
                 : "memory");
    return v;
}
__device__ __forceinline__ float4 load_remote4(const float4* p, unsigned int rank) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(remote_addr(p, rank))
                 : "memory");
    return v;
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// d[row g][cols 2t, 2t+1] += A B for an m16n8k16 whose rows 8..15 of A are zero: only
// the accumulators of rows 0..7 are kept (the other two come out zero and are dropped).
__device__ __forceinline__ void mma_rows8(float& d0, float& d1, unsigned int a0,
                                          unsigned int a2, unsigned int b0, unsigned int b1) {
    float z0, z1;
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %10, %11};"
        : "+f"(d0), "+f"(d1), "=f"(z0), "=f"(z1)
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1), "f"(0.0f), "f"(0.0f));
}
// PTX-END

__device__ __forceinline__ unsigned int pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned int*>(&h);
}

// Dims 4 c4 .. 4 c4 + 3 of query head `head` of sequence b: the accumulators over their
// sum (zeros for an empty sequence).
__device__ __forceinline__ void write_out(__half* out, unsigned int b, unsigned int q_heads,
                                          unsigned int head, unsigned int c4, float4 a,
                                          float sum) {
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    uint2 r;
    r.x = pack_half2(a.x * inv, a.y * inv);
    r.y = pack_half2(a.z * inv, a.w * inv);
    *reinterpret_cast<uint2*>(out + ((size_t)b * q_heads + head) * HEAD_DIM + 4 * c4) = r;
}

__device__ __forceinline__ unsigned int word(const uint4& u, int i) {
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

// Byte offset of 16-byte chunk c (0..15) of row r (0..15) inside a K or V half-stage.
__device__ __forceinline__ unsigned int chunk_offset(unsigned int r, unsigned int c) {
    const unsigned int swz = (r & 6u) ^ ((r & 1u) << 2);
    return r * KEY_BYTES + ((c ^ swz) << 4);
}

// One warp's copies of a tile into the stage at shared address `dst`: `kt` and `vt` are
// its first K and V rows in the cache (16 contiguous rows of one page), `rows` (1..16) how
// many hold keys of the sequence; the rows past them copy row rows - 1 instead. Lane l
// copies chunks 32j + l of the 256 of K and of V: a quarter-warp copies 128 contiguous
// bytes of one row.
__device__ __forceinline__ void issue_tile(unsigned int dst, const __half* kt,
                                           const __half* vt, unsigned int rows,
                                           unsigned int lane) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const unsigned int idx = 32 * j + lane, r = idx >> 4, c = idx & 15u;
        const unsigned int src = min(r, rows - 1) * HEAD_DIM + c * 8;
        const unsigned int off = chunk_offset(r, c);
        cp_async16(dst + off, kt + src, 16);
        cp_async16(dst + TILE_BYTES / 2 + off, vt + src, 16);
    }
}

// The fragments of one stage: K as the B fragments of the scores mma (key 8nt + g,
// chunks 4i + t), V as the raw chunks g and g + 8 of keys 2t, 2t+1, 2t+8, 2t+9.
__device__ __forceinline__ void read_tile(uint4 (&kk)[2][4], uint4 (&vv)[4][2],
                                          const unsigned char* stage, unsigned int g,
                                          unsigned int t) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
            kk[nt][i] = *reinterpret_cast<const uint4*>(stage + chunk_offset(8 * nt + g, 4 * i + t));
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const unsigned int r = (c >> 1) * 8 + 2 * t + (c & 1);
#pragma unroll
        for (int hi = 0; hi < 2; ++hi)
            vv[c][hi] = *reinterpret_cast<const uint4*>(stage + TILE_BYTES / 2 +
                                                        chunk_offset(r, g + 8 * hi));
    }
}

// Scores, online softmax and output update for one loaded tile whose first key is `base`
// (keys from `len` on are masked).
__device__ __forceinline__ void tile_step(const uint4 (&kk)[2][4], const uint4 (&vv)[4][2],
                                          const uint4 (*sm_q)[32], unsigned int base,
                                          unsigned int len, unsigned int lane,
                                          unsigned int t, float& m, float& l,
                                          float (&o)[16][2]) {
    // s[nt][j] = score of head g with key base + 8nt + 2t + j.
    float s[2][2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
        // Two accumulator chains (k-steps 2i and 2i + 1) halve the dependent mma chain.
        float s0 = 0.0f, s1 = 0.0f, r0 = 0.0f, r1 = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4 qa = sm_q[i][lane];
            mma_rows8(s0, s1, qa.x, qa.y, kk[nt][i].x, kk[nt][i].y);
            mma_rows8(r0, r1, qa.z, qa.w, kk[nt][i].z, kk[nt][i].w);
        }
        s0 += r0;
        s1 += r1;
        const unsigned int key = base + 8 * nt + 2 * t;
        s[nt][0] = key < len ? s0 * SCALE_LOG2E : NEG_INF;
        s[nt][1] = key + 1 < len ? s1 * SCALE_LOG2E : NEG_INF;
    }
    float mx = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // Key `base` < len is in every tile, so the new max is finite: no -inf - -inf.
    const float m_new = fmaxf(m, mx);
    const float corr = ex2(m - m_new);
    float p[2][2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) p[nt][j] = ex2(s[nt][j] - m_new);
    l = l * corr + ((p[0][0] + p[0][1]) + (p[1][0] + p[1][1]));
    m = m_new;
#pragma unroll
    for (int d = 0; d < 16; ++d) {
        o[d][0] *= corr;
        o[d][1] *= corr;
    }
    // A fragment of P: keys 2t, 2t+1 (cols 0..7 = the first 8 keys) and 2t+8, 2t+9.
    const unsigned int pa0 = pack_half2(p[0][0], p[0][1]);
    const unsigned int pa2 = pack_half2(p[1][0], p[1][1]);
    // B fragment of V for dim tile d: {V[key 2t][D(d, g)], V[key 2t+1][D(d, g)]} and the
    // same for keys 2t+8, 2t+9 (one byte-permute of two loaded words each).
#pragma unroll
    for (int d = 0; d < 16; ++d) {
        const int hi = d >> 3, w = (d & 7) >> 1;
        const unsigned int sel = (d & 1) ? 0x7632u : 0x5410u;
        const unsigned int b0 = __byte_perm(word(vv[0][hi], w), word(vv[1][hi], w), sel);
        const unsigned int b1 = __byte_perm(word(vv[2][hi], w), word(vv[3][hi], w), sel);
        mma_rows8(o[d][0], o[d][1], pa0, pa2, b0, b1);
    }
}

// Lane `lane`'s block-table entry for the warp's tile 32 grp + lane: the page of the
// tile's first key, or 0 past the warp's n_w tiles (never used).
__device__ __forceinline__ int page_entry(const int* table, unsigned int first,
                                          unsigned int n_w, unsigned int grp,
                                          unsigned int lane, unsigned int page_size) {
    const unsigned int i = 32 * grp + lane;
    return i < n_w ? __ldg(table + (first + i * WARPS) * TILE / page_size) : 0;
}

extern "C" __global__ void __launch_bounds__(THREADS)
paged_decode_f16(const __half* __restrict__ q, const __half* __restrict__ k_cache,
                 const __half* __restrict__ v_cache, const int* __restrict__ block_table,
                 const int* __restrict__ seq_lens, __half* __restrict__ out,
                 unsigned int q_heads, unsigned int kv_heads, unsigned int page_size,
                 unsigned int max_pages) {
    // WARPS rings of RING_BYTES (the launch rule's smem); reused by the warps' merge.
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ float2 sm_ml[WARPS][HEADS];
    __shared__ uint4 sm_q[4][32];
    __shared__ int sm_len[SORT_MAX];
    __shared__ int sm_seq;
    // This block's partial for the cluster merge: per head, the max and sum, and the
    // 128 accumulators.
    __shared__ float2 cl_ml[HEADS];
    __shared__ __align__(16) float cl_acc[HEADS][HEAD_DIM];

    // One cluster per work item, along x: the launch rule never does otherwise; fault
    // loudly rather than merge the wrong blocks.
    const unsigned int C = cluster_blocks(), rank = cluster_rank();
    const unsigned int group = q_heads / kv_heads;
    if (gridDim.x != C || C > MAX_CLUSTER || group > HEADS || group == 0) __trap();
    const unsigned int batch = gridDim.y / kv_heads;
    const unsigned int order = blockIdx.y / kv_heads, kvh = blockIdx.y % kv_heads;
    const unsigned int tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned int g = lane >> 2, t = lane & 3u;  // mma group and thread in group

    // The sequence: the order-th longest (ties by index), where the batch is small enough
    // to rank in shared memory (block-uniform branch).
    unsigned int b = order;
    int raw_len;
    if (batch <= SORT_MAX) {
        for (unsigned int i = tid; i < batch; i += THREADS) sm_len[i] = seq_lens[i];
        __syncthreads();
        for (unsigned int j = tid; j < batch; j += THREADS) {
            const int lj = sm_len[j];
            unsigned int r = 0;
            for (unsigned int i = 0; i < batch; ++i) {
                const int li = sm_len[i];
                r += (li > lj) | ((li == lj) & (i < j));
            }
            if (r == order) sm_seq = (int)j;
        }
        __syncthreads();
        b = (unsigned int)sm_seq;
        raw_len = sm_len[b];
    } else {
        raw_len = seq_lens[b];
    }
    const unsigned int len = min((unsigned int)max(raw_len, 0), max_pages * page_size);
    const unsigned int h0 = kvh * group;  // first query head

    // This block's tiles [t0, t1) of the sequence's T; warp w takes t0 + w, t0 + w + WARPS..
    const unsigned int T = (len + TILE - 1) / TILE;
    const unsigned int t0 = (unsigned int)((unsigned long long)rank * T / C);
    const unsigned int t1 = (unsigned int)((unsigned long long)(rank + 1) * T / C);
    const unsigned int first = t0 + warp;
    const unsigned int n_w = first < t1 ? (t1 - first + WARPS - 1) / WARPS : 0;

    const int* table = block_table + (size_t)b * max_pages;
    const size_t head_elems = (size_t)page_size * HEAD_DIM;  // one (page, KV head) tile
    const size_t page_elems = head_elems * kv_heads;         // one page of every KV head
    const __half* kb = k_cache + kvh * head_elems;
    const __half* vb = v_cache + kvh * head_elems;
    const unsigned char* ring = smem + warp * RING_BYTES;
    const unsigned int ring_s = smem_addr(ring);

    // Pages of the warp's tiles 32 grp .. 32 grp + 31 (pg_cur) and of the next 32 (pg_nxt).
    unsigned int pg_grp = 0;
    int pg_cur = page_entry(table, first, n_w, 0, lane, page_size);
    int pg_nxt = page_entry(table, first, n_w, 1, lane, page_size);
    // Issues the warp's tile i (in order: i is one more than at the previous call) into
    // stage `st`. Warp-uniform: every lane takes part in the shuffle.
    auto issue = [&](unsigned int i, unsigned int st) {
        if ((i >> 5) != pg_grp) {
            ++pg_grp;
            pg_cur = pg_nxt;
            pg_nxt = page_entry(table, first, n_w, pg_grp + 1, lane, page_size);
        }
        const size_t page = (size_t)__shfl_sync(0xffffffffu, pg_cur, i & 31u);
        const unsigned int key = (first + i * WARPS) * TILE;
        const size_t at = page * page_elems + (size_t)(key % page_size) * HEAD_DIM;
        issue_tile(ring_s + st * TILE_BYTES, kb + at, vb + at, min(len - key, (unsigned int)TILE),
                   lane);
    };

    // Prologue: tiles 0 .. STAGES - 2, one commit group each (empty past n_w, so that the
    // group count stays uniform), issued before Q is staged.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if ((unsigned int)s < n_w) issue(s, s);
        cp_async_commit();
    }

    // A fragment of Q: row g is query head h0 + g (zero past the group); k-step 2i + j
    // covers the dimensions of 16-byte chunk 4i + t (halves 4j..4j+3) in every lane.
    if (warp == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint4 u = make_uint4(0, 0, 0, 0);
            if (g < group)
                u = *reinterpret_cast<const uint4*>(
                    q + ((size_t)b * q_heads + h0 + g) * HEAD_DIM + (4 * i + t) * 8);
            sm_q[i][lane] = u;
        }
    }
    __syncthreads();

    // Row g's running max (identical in the 4 lanes of a group), this lane's share of the
    // sum, and o[d][j] = O[head g][dim D(d, 2t + j)], D(d, n) = 8n + d (d < 8) or
    // 64 + 8n + d - 8 (d >= 8): the dims the V chunks of lane group n hold.
    float m = NEG_INF, l = 0.0f;
    float o[16][2];
#pragma unroll
    for (int d = 0; d < 16; ++d) o[d][0] = o[d][1] = 0.0f;

    // Warp-uniform loop (every mma, shuffle and __syncwarp has all 32 lanes).
    unsigned int stage = 0;
    for (unsigned int i = 0; i < n_w; ++i) {
        // Tile i's group has landed (this lane's copies), and after __syncwarp every
        // lane's; every lane has also finished reading tile i - 1, whose stage is refilled
        // with tile i + STAGES - 1 before tile i is computed.
        cp_async_wait<STAGES - 2>();
        __syncwarp();
        const unsigned int refill = stage == 0 ? STAGES - 1 : stage - 1;
        if (i + STAGES - 1 < n_w) issue(i + STAGES - 1, refill);
        cp_async_commit();
        uint4 kk[2][4], vv[4][2];
        read_tile(kk, vv, ring + stage * TILE_BYTES, g, t);
        tile_step(kk, vv, sm_q, (first + i * WARPS) * TILE, len, lane, t, m, l, o);
        stage = stage + 1 == STAGES ? 0 : stage + 1;
    }
    // Only empty groups can still be pending; every warp is done with its ring before
    // the merge reuses it.
    cp_async_wait<0>();
    __syncthreads();

    // Merge the warps (through the ring). The 4 lanes of a group hold row g's max and
    // parts of its sum.
    float (*sm_o)[HEADS][ROW] = reinterpret_cast<float (*)[HEADS][ROW]>(smem);
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (t == 0) sm_ml[warp][g] = make_float2(m, l);
#pragma unroll
    for (int d = 0; d < 16; ++d)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const unsigned int n = 2 * t + j;
            sm_o[warp][g][d < 8 ? 8 * n + d : 64 + 8 * n + (d - 8)] = o[d][j];
        }
    __syncthreads();

    // Warp w produces heads w, w + WARPS, ..., lane c4 their dims 4 c4 .. 4 c4 + 3: written
    // out alone, or left in cl_ml / cl_acc for the cluster.
    for (unsigned int h = warp; h < group; h += WARPS) {
        const unsigned int c4 = lane;
        float mm = NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mm = fmaxf(mm, sm_ml[w][h].x);
        const float ms = mm == NEG_INF ? 0.0f : mm;  // no keys here: no NaN
        float ll = 0.0f;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float2 ml = sm_ml[w][h];
            const float wt = ex2(ml.x - ms);
            const float4 x = *reinterpret_cast<const float4*>(&sm_o[w][h][4 * c4]);
            ll = fmaf(ml.y, wt, ll);
            a.x = fmaf(x.x, wt, a.x);
            a.y = fmaf(x.y, wt, a.y);
            a.z = fmaf(x.z, wt, a.z);
            a.w = fmaf(x.w, wt, a.w);
        }
        if (C == 1) {
            write_out(out, b, q_heads, h0 + h, c4, a, ll);
        } else {
            *reinterpret_cast<float4*>(&cl_acc[h][4 * c4]) = a;
            if (c4 == 0) cl_ml[h] = make_float2(mm, ll);
        }
    }
    if (C == 1) return;

    // Every block of the cluster has its partial in its shared memory (heads past the
    // group are never read). Block `rank` folds the (head, 4 dims) columns rank,
    // rank + C, ... over the cluster's C blocks and writes them out.
    cluster_arrive();
    cluster_wait();
    const unsigned int cols = group * 32;
    for (unsigned int col = rank + C * tid; col < cols; col += C * THREADS) {
        const unsigned int h = col >> 5, c4 = col & 31u;
        float2 ml[MAX_CLUSTER];
        float4 x[MAX_CLUSTER];
#pragma unroll
        for (int r = 0; r < MAX_CLUSTER; ++r) {
            if ((unsigned int)r < C) {
                ml[r] = load_remote2(&cl_ml[h], r);
                x[r] = load_remote4(reinterpret_cast<const float4*>(&cl_acc[h][4 * c4]), r);
            } else {
                ml[r] = make_float2(NEG_INF, 0.0f);
                x[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
        float mm = NEG_INF;
#pragma unroll
        for (int r = 0; r < MAX_CLUSTER; ++r) mm = fmaxf(mm, ml[r].x);
        const float ms = mm == NEG_INF ? 0.0f : mm;  // an empty sequence
        float ll = 0.0f;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int r = 0; r < MAX_CLUSTER; ++r) {
            const float wt = ex2(ml[r].x - ms);
            ll = fmaf(ml[r].y, wt, ll);
            a.x = fmaf(x[r].x, wt, a.x);
            a.y = fmaf(x[r].y, wt, a.y);
            a.z = fmaf(x[r].z, wt, a.z);
            a.w = fmaf(x[r].w, wt, a.w);
        }
        write_out(out, b, q_heads, h0 + h, c4, a, ll);
    }
    // No block may exit while another can still read its shared memory.
    cluster_arrive();
    cluster_wait();
}
