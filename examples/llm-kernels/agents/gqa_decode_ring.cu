// Grouped-query attention, one decode step, fp16 (head dim 128), flash-decoding style on
// the tensor cores, with K and V streamed through a cp.async shared-memory ring.
//
// The same work split, tile arithmetic and merges as gqa_decode.cu (proposals[0]); what
// differs is how K and V reach the mma fragments. There every lane loads two tiles of
// 16 keys (32 x 16 bytes) into registers, computes the first while the second is in
// flight, then the second with nothing in flight: the bytes in flight per SM swing
// between about 128 KB and 0, and all of them cost registers. Here each warp owns a
// private ring of STAGES tiles (16 keys of K + 16 keys of V = 8 KB per stage) in dynamic
// shared memory, filled with 16-byte cp.async.cg copies (no registers, no L1): before
// computing its tile i a warp issues tile i + STAGES - 1, so STAGES - 1 tiles per warp
// stay in flight all the time (STAGES = 3, WARPS = 8: 128 KB per SM, steadily). A warp
// waits only for its own copies (cp.async.wait_group STAGES - 2, then __syncwarp so the
// lanes see each other's copies and have all finished reading the stage about to be
// refilled): the main loop has no block barrier.
//
// Work item = (batch, kv head, group of up to 8 of the query heads sharing that KV head):
// each K and V row is read once for all of them. The sequence is split over gridDim.x
// blocks of equal key ranges (trailing ones may be empty); blockIdx.y is the work item.
// Warp w of a block takes the split's tiles w, w + WARPS, ... From SPLIT_ITEMS work items
// up (a launch-rule define) the rule does not split at all: each block streams a whole
// work item and writes its output directly, with no partials, no fence and no counter.
// On the H200 at batch 8 (64 items) 64 such blocks beat 128 blocks of 2 splits (12.38
// against 13.16 us at 1024 keys, 35.89 against 36.93 at 4096,
// docs/runs/2026-11-29-h200-cluster-at-launch): the split's merge through global memory
// cost more than the 64 more SMs brought. Below SPLIT_ITEMS the rule splits each work item
// into max(CLUSTER, WAVE_BLOCKS / items rounded down to whole clusters) blocks: at batch 1
// (8 items) with CLUSTER 8 and WAVE_BLOCKS 64, one cluster of 8 splits per item, 64
// blocks, merged in the cluster (below). Clusters of 8 with 16 splits, and of 10 to 16,
// lost by 35-60% there: the H200 holds 15 clusters of 8 blocks and 7 of 16 with this
// kernel's 192 KB of shared memory, so the rest of the grid ran in a second wave
// (docs/runs/2026-11-29-h200-dsmem-merge).
//
// Per warp and tile of 16 keys:
//   scores  S[8 heads x 16 keys] = Q[heads x 128] K^T    (16 mma.m16n8k16, rows 8..15 zero)
//   output  O[8 heads x 128]    += P[heads x 16 keys] V  (16 mma.m16n8k16)
// The head dimension's order inside an mma is free (a dot product does not care), so each
// lane reads whole 16-byte chunks from the ring into its fragments: K as the B operand of
// the scores (lane (g, t) holds key g, chunks t, t+4, t+8, t+12), V as the B operand of
// the output (lane (g, t) holds chunks g and g+8 of keys 2t, 2t+1, 2t+8, 2t+9, paired
// across keys with one byte-permute per register). Chunk c of key row r of a stage sits
// at chunk position c ^ SWZ(r), SWZ(r) = (r & 6) ^ 4 (r & 1): each quarter-warp's eight
// 16-byte reads, of the K pattern (2 keys x 4 chunks) and of the V pattern (4 keys x 2
// chunks) alike, then hit 8 different 16-byte bank groups (no bank conflicts), and the
// cp.async writes (8 consecutive chunks of one row per quarter-warp) too. The score
// fragment of the scores mma is, after the softmax, the P fragment of the output mma
// (as in FlashAttention 2): 2 shuffles per tile, one ex2 per score.
//
// The warps merge through shared memory (the ring, once every copy has landed). With one
// split the block writes the output. Split, the blocks of a work item come in thread-block
// clusters of CLUSTER (set at launch by the launch rule; the kernel traps without it) and
// merge through distributed shared memory: each block leaves its partial (max, sum, 128
// accumulators per head) in its own shared memory, and after a cluster barrier block r
// reads every block's values for the (head, 4 dims) columns r, r + CLUSTER, ... (mapa +
// ld.shared::cluster, CLUSTER loads in flight) and folds them. With one cluster per work
// item that is the output, with no global scratch, fence or counter: at batch 1 seq_len
// 32768 36.26 us against 37.39 for the previous variant (this kernel's global merge, 16
// splits on 128 blocks; one session, docs/runs/2026-11-29-h200-dsmem-merge). With more than one cluster per
// work item, each cluster's merged partial goes to a module-scope scratch area, and the
// last block of the work item to finish (atomic counter after __threadfence) merges the
// clusters' partials with all its threads and writes the output, then resets the counter
// for the next launch.
// CLUSTER 1 is that global merge over every split, with no cluster.
#include <cuda_fp16.h>

#define NEG_INF __int_as_float(0xff800000)
#define HEAD_DIM 128
#define HEADS 8            // query heads per work item (rows of the mma's A operand)
#ifndef WARPS
#define WARPS 8            // warps per block, each with its own ring
#endif
#ifndef STAGES
#define STAGES 3           // ring depth in tiles: STAGES - 1 tiles in flight per warp
#endif
#ifndef CLUSTER
#define CLUSTER 8          // blocks per cluster when split (the launch rule's cluster)
#endif
#define THREADS (WARPS * 32)
#define TILE 16            // keys per warp per step
#define KEY_BYTES 256      // one key row of K or V
#define TILE_BYTES 8192    // one stage: TILE rows of K, then TILE rows of V
#define RING_BYTES (STAGES * TILE_BYTES)  // per warp; the launch rule's smem is WARPS of them
#define ROW (HEAD_DIM + 4) // padded shared-memory row of the merge: fewer bank conflicts
// Merge slots of the last block: one per thread, or one per (head, 4 dims) column.
#define SLOTS (THREADS > HEADS * 32 ? THREADS : HEADS * 32)
// Scratch capacity (4 MB), for one partial per cluster (per split with CLUSTER 1). The
// launch rule splits below SPLIT_ITEMS work items only, into at most
// max(CLUSTER, WAVE_BLOCKS / items) splits; the kernel traps rather than overrun it.
// Plain numbers: tests/tests/scripted_proposals.rs reads them to check the launch rule.
#define MAX_ITEMS 1024
#define MAX_PARTIALS 8192  // MAX_ITEMS * HEADS
// softmax scale 1/sqrt(128) times log2(e): scores are kept in the exp2 domain.
#define SCALE_LOG2E 0.12751743074790924f

static_assert(STAGES >= 2, "STAGES: one tile computed while at least one is in flight");
static_assert(THREADS <= 1024, "WARPS: at most 32 warps per block");
// The merges reuse the ring: the warps' rows, then the last block's slots.
static_assert(WARPS * RING_BYTES >= WARPS * HEADS * ROW * 4, "ring too small for the merge");
static_assert(WARPS * RING_BYTES >= SLOTS * 24, "ring too small for the split merge");
static_assert(CLUSTER >= 1 && CLUSTER <= 16, "CLUSTER: 1 to 16 blocks (16 is non-portable)");

__device__ float partial_acc[MAX_PARTIALS * HEAD_DIM];
__device__ float2 partial_ml[MAX_PARTIALS];
__device__ unsigned int arrivals[MAX_ITEMS];

// PTX-BEGIN: async copy, clusters, exp2, and the tensor-core step.
__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    return (unsigned int)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, cached in L2 only (K and V are read once); the L2 fetches
// 256-byte segments. src_bytes < 16 fills the rest with zeros.
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

// Dims 4 c4 .. 4 c4 + 3 of query head `head` of batch b: the accumulators over their sum.
__device__ __forceinline__ void write_out(__half* out, unsigned int b, unsigned int q_heads,
                                          unsigned int head, unsigned int c4, float4 a,
                                          float sum) {
    const float inv = 1.0f / sum;
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

// Issues one warp's copies of the tile of 16 keys from `base` into the stage at shared
// address `dst` (keys past k1 copy key k1 - 1 instead: finite, and masked to probability 0
// by tile_step). Lane l copies chunks 32j + l of the 256 of K and of V: a quarter-warp
// copies 128 contiguous bytes of one row.
__device__ __forceinline__ void issue_tile(unsigned int dst, const __half* kb,
                                           const __half* vb, unsigned int base,
                                           unsigned int k1, unsigned int lane) {
    const unsigned int last = k1 - 1;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const unsigned int idx = 32 * j + lane, r = idx >> 4, c = idx & 15u;
        const size_t src = (size_t)min(base + r, last) * HEAD_DIM + c * 8;
        const unsigned int off = chunk_offset(r, c);
        cp_async16(dst + off, kb + src, 16);
        cp_async16(dst + TILE_BYTES / 2 + off, vb + src, 16);
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

// Scores, online softmax and output update for one loaded tile (see the top comment).
__device__ __forceinline__ void tile_step(const uint4 (&kk)[2][4], const uint4 (&vv)[4][2],
                                          const uint4 (*sm_q)[32], unsigned int base,
                                          unsigned int k1, unsigned int lane,
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
        s[nt][0] = key < k1 ? s0 * SCALE_LOG2E : NEG_INF;
        s[nt][1] = key + 1 < k1 ? s1 * SCALE_LOG2E : NEG_INF;
    }
    float mx = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // Key `base` < k1 is in every tile, so the new max is finite: no -inf - -inf.
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

extern "C" __global__ void __launch_bounds__(THREADS)
gqa_decode_f16(const __half* __restrict__ q, const __half* __restrict__ k,
               const __half* __restrict__ v, __half* __restrict__ out, unsigned int batch,
               unsigned int q_heads, unsigned int kv_heads, unsigned int seq_len) {
    // WARPS rings of RING_BYTES (the launch rule's smem); reused by the merges.
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ float2 sm_ml[WARPS][HEADS];
    __shared__ uint4 sm_q[4][32];
    __shared__ bool sm_last;
    // This block's partial for the cluster merge: per head, the max and sum, and the
    // 128 accumulators.
    __shared__ float2 cl_ml[HEADS];
    __shared__ __align__(16) float cl_acc[HEADS][HEAD_DIM];

    const unsigned int group_size = q_heads / kv_heads;
    const unsigned int chunks = (group_size + HEADS - 1) / HEADS;
    const unsigned int item = blockIdx.y;  // (b * kv_heads + kvh) * chunks + chunk
    const unsigned int chunk = item % chunks;
    const unsigned int bkv = item / chunks;  // b * kv_heads + kvh
    const unsigned int b = bkv / kv_heads, kvh = bkv % kv_heads;
    const unsigned int h0 = kvh * group_size + chunk * HEADS;  // first query head
    const unsigned int nh = min((unsigned int)HEADS, group_size - chunk * HEADS);
    const unsigned int splits = gridDim.x, split = blockIdx.x;
    // Split, the blocks of a work item merge in clusters of CLUSTER, and the `groups`
    // clusters (splits with CLUSTER 1) through the scratch.
    const bool clustered = CLUSTER > 1 && splits > 1;
    const unsigned int groups = clustered ? splits / CLUSTER : splits;
    const unsigned int group = clustered ? split / CLUSTER : split;
    // The launch rule never asks for these: fault loudly rather than merge the wrong
    // blocks or overrun the scratch.
    if (clustered && (cluster_blocks() != CLUSTER || splits % CLUSTER != 0)) __trap();
    if (groups > 1 && (gridDim.y > MAX_ITEMS || groups * gridDim.y * HEADS > MAX_PARTIALS))
        __trap();

    // Whole tiles per split (the last split takes the rest); trailing splits may be empty.
    const unsigned int per = ((seq_len + splits - 1) / splits + TILE - 1) / TILE * TILE;
    const unsigned int k0 = min(seq_len, split * per), k1 = min(seq_len, k0 + per);

    const unsigned int tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned int g = lane >> 2, t = lane & 3u;  // mma group and thread in group

    const __half* kb = k + (size_t)bkv * seq_len * HEAD_DIM;
    const __half* vb = v + (size_t)bkv * seq_len * HEAD_DIM;
    const unsigned char* ring = smem + warp * RING_BYTES;
    const unsigned int ring_s = smem_addr(ring);
    // This warp's tile i starts at key k0 + (i * WARPS + warp) * TILE and lives in stage
    // i % STAGES. Prologue: tiles 0 .. STAGES - 2, one commit group each (empty past k1,
    // so that the group count stays uniform), issued before Q is staged.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        const unsigned int base = k0 + (s * WARPS + warp) * TILE;
        if (base < k1) issue_tile(ring_s + s * TILE_BYTES, kb, vb, base, k1, lane);
        cp_async_commit();
    }

    // A fragment of Q: row g is query head h0 + g (zero past the group); k-step 2i + j
    // covers the dimensions of 16-byte chunk 4i + t (halves 4j..4j+3) in every lane. Kept
    // in shared memory (the same for every warp, read as one 16-byte word per lane and
    // chunk), not in 16 registers.
    if (warp == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint4 u = make_uint4(0, 0, 0, 0);
            if (g < nh)
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
    for (unsigned int base = k0 + warp * TILE; base < k1; base += WARPS * TILE) {
        // Tile i's group has landed (this lane's copies), and after __syncwarp every
        // lane's; every lane has also finished reading tile i - 1, whose stage is refilled
        // with tile i + STAGES - 1 before tile i is computed.
        cp_async_wait<STAGES - 2>();
        __syncwarp();
        const unsigned int next = base + (STAGES - 1) * WARPS * TILE;
        const unsigned int refill = stage == 0 ? STAGES - 1 : stage - 1;
        if (next < k1) issue_tile(ring_s + refill * TILE_BYTES, kb, vb, next, k1, lane);
        cp_async_commit();
        uint4 kk[2][4], vv[4][2];
        read_tile(kk, vv, ring + stage * TILE_BYTES, g, t);
        tile_step(kk, vv, sm_q, base, k1, lane, t, m, l, o);
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

    const bool direct = splits == 1;
    // Warp w produces heads w, w + WARPS, ..., lane c4 their dims 4 c4 .. 4 c4 + 3.
    for (unsigned int h = warp; h < nh; h += WARPS) {
        const unsigned int c4 = lane;
        float mm = NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mm = fmaxf(mm, sm_ml[w][h].x);
        const float ms = mm == NEG_INF ? 0.0f : mm;  // empty split: no NaN
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
        if (direct) {
            write_out(out, b, q_heads, h0 + h, c4, a, ll);
        } else if (clustered) {
            *reinterpret_cast<float4*>(&cl_acc[h][4 * c4]) = a;
            if (c4 == 0) cl_ml[h] = make_float2(mm, ll);
        } else {
            const unsigned int p = (item * splits + split) * HEADS + h;
            *reinterpret_cast<float4*>(&partial_acc[(size_t)p * HEAD_DIM + 4 * c4]) = a;
            if (c4 == 0) partial_ml[p] = make_float2(mm, ll);
        }
    }
    if (direct) return;

    if (clustered) {
        // Every block of the cluster has its partial in its shared memory (unwritten heads
        // past nh are never read). Block `rank` folds columns rank, rank + CLUSTER, ...
        cluster_arrive();
        cluster_wait();
        const unsigned int rank = cluster_rank(), cols = nh * 32;
        for (unsigned int col = rank + CLUSTER * tid; col < cols; col += CLUSTER * THREADS) {
            const unsigned int h = col >> 5, c4 = col & 31u;
            float2 ml[CLUSTER];
            float4 x[CLUSTER];
#pragma unroll
            for (int r = 0; r < CLUSTER; ++r) {
                ml[r] = load_remote2(&cl_ml[h], r);
                x[r] = load_remote4(reinterpret_cast<const float4*>(&cl_acc[h][4 * c4]), r);
            }
            float mm = NEG_INF;
#pragma unroll
            for (int r = 0; r < CLUSTER; ++r) mm = fmaxf(mm, ml[r].x);
            const float ms = mm == NEG_INF ? 0.0f : mm;  // a cluster of empty splits
            float ll = 0.0f;
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int r = 0; r < CLUSTER; ++r) {
                const float wt = ex2(ml[r].x - ms);
                ll = fmaf(ml[r].y, wt, ll);
                a.x = fmaf(x[r].x, wt, a.x);
                a.y = fmaf(x[r].y, wt, a.y);
                a.z = fmaf(x[r].z, wt, a.z);
                a.w = fmaf(x[r].w, wt, a.w);
            }
            if (groups == 1) {
                write_out(out, b, q_heads, h0 + h, c4, a, ll);
            } else {
                const unsigned int p = (item * groups + group) * HEADS + h;
                *reinterpret_cast<float4*>(&partial_acc[(size_t)p * HEAD_DIM + 4 * c4]) = a;
                if (c4 == 0) partial_ml[p] = make_float2(mm, ll);
            }
        }
        // No block may exit (or go on) while another can still read its shared memory.
        cluster_arrive();
        cluster_wait();
        if (groups == 1) return;
    }

    // Last block of the work item merges the groups' partials.
    __threadfence();
    __syncthreads();
    if (tid == 0) sm_last = atomicAdd(&arrivals[item], 1u) == splits - 1;
    __syncthreads();
    if (!sm_last) return;
    __threadfence();

    // nh * 32 columns (head, 4 dims) and `parts` slots per column (slot = part * cols +
    // col), each folding every parts-th split with an online max, 8 splits' loads in
    // flight; then one thread per column folds its parts (through shared memory, reusing
    // the ring: all reads of the warps' rows are done).
    const unsigned int cols = nh * 32, parts = max(1u, (unsigned int)THREADS / cols);
    float4* part_acc = reinterpret_cast<float4*>(smem);                 // [SLOTS]
    float2* part_ml = reinterpret_cast<float2*>(smem + SLOTS * 16);     // [SLOTS]
    for (unsigned int slot = tid; slot < cols * parts; slot += THREADS) {
        const unsigned int col = slot % cols, part = slot / cols;
        const unsigned int h = col >> 5, c4 = col & 31u;
        float mm = NEG_INF, ll = 0.0f;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const unsigned int p0 = item * groups * HEADS + h;
        for (unsigned int s0 = part; s0 < groups; s0 += 8 * parts) {
            float2 ml[8];
            float4 x[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const unsigned int s = s0 + u * parts;
                if (s < groups) {
                    const unsigned int p = p0 + s * HEADS;
                    ml[u] = __ldcg(&partial_ml[p]);
                    x[u] = __ldcg(reinterpret_cast<const float4*>(
                        &partial_acc[(size_t)p * HEAD_DIM + 4 * c4]));
                } else {
                    ml[u] = make_float2(NEG_INF, 0.0f);
                    x[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const float mn = fmaxf(mm, ml[u].x);
                const float ms = mn == NEG_INF ? 0.0f : mn;
                const float c = ex2(mm - ms), wt = ex2(ml[u].x - ms);
                ll = fmaf(ll, c, ml[u].y * wt);
                a.x = fmaf(a.x, c, x[u].x * wt);
                a.y = fmaf(a.y, c, x[u].y * wt);
                a.z = fmaf(a.z, c, x[u].z * wt);
                a.w = fmaf(a.w, c, x[u].w * wt);
                mm = mn;
            }
        }
        part_acc[slot] = a;
        part_ml[slot] = make_float2(mm, ll);
    }
    __syncthreads();
    for (unsigned int col = tid; col < cols; col += THREADS) {
        const unsigned int h = col >> 5, c4 = col & 31u;
        float mm = NEG_INF;
        for (unsigned int r = 0; r < parts; ++r) mm = fmaxf(mm, part_ml[col + r * cols].x);
        const float ms = mm == NEG_INF ? 0.0f : mm;
        float ll = 0.0f;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (unsigned int r = 0; r < parts; ++r) {
            const float2 ml = part_ml[col + r * cols];
            const float4 x = part_acc[col + r * cols];
            const float wt = ex2(ml.x - ms);
            ll = fmaf(ml.y, wt, ll);
            a.x = fmaf(x.x, wt, a.x);
            a.y = fmaf(x.y, wt, a.y);
            a.z = fmaf(x.z, wt, a.z);
            a.w = fmaf(x.w, wt, a.w);
        }
        write_out(out, b, q_heads, h0 + h, c4, a, ll);
    }
    if (tid == 0) arrivals[item] = 0;  // ready for the next launch (stream-ordered)
}
