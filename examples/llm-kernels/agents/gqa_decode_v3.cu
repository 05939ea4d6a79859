// Grouped-query attention, one decode step, fp16 (head dim 128), flash-decoding style on
// the tensor cores: K and V streamed through per-warp cp.async shared-memory rings, the
// splits of a work item merged inside their thread-block cluster by pushing into the
// owner's shared memory (one cluster barrier round, no global traffic).
//
// What is the accepted variant's (run-1795990872-r1c2): the work item (batch, KV head, up
// to 8 of its query heads), the tile arithmetic, the mma fragments and the swizzled ring
// (below). What differs, each measured on the H200 with nvcc builds and kopt's timing
// method (the proposal's evidence):
//
// 1. The split. The launch rule asks for P = WAVE_BLOCKS / items blocks per work item
//    (items = batch x KV heads x head chunks), in clusters of C = min(CLUSTER, P) blocks,
//    G = min(GROUPS, P / C) clusters per item. WAVE_BLOCKS 128, CLUSTER 8, GROUPS 1: at
//    batch 8 (64 items) 2 blocks per item in a cluster of 2, so 128 of the 132 SMs stream
//    instead of 64 (B8 S1024 12.30 against 12.92 us); at batch 1 (8 items) one cluster of
//    8 per item, 64 blocks, as accepted; from 65 items up no split. More blocks at batch 1
//    lost: 16 per item need 16 clusters of 8 or 32 of 4, and the H200 holds 15 and 30 of
//    these 192 KB blocks at once; 64 clusters of 2 fit but their partials then meet in the
//    scratch (22.32 against 21.91 us at S16384). The kernel reads the cluster size at run
//    time (%cluster_nctarank), so one build serves every rule.
// 2. The cluster merge pushes. Each block, once its warps have merged, stores each
//    (head, 4 dims) column's float4 straight into the shared memory of the column's owner
//    (st.shared::cluster; rank r owns a contiguous range of columns) and each head's
//    (max, sum) into every block, then one cluster barrier (arrive.release, wait.acquire),
//    then each owner folds its columns from its own shared memory and writes them out.
//    The accepted variant's pull needs a barrier, remote loads (a round trip each) and a
//    second barrier that keeps every block's shared memory alive; here the stores are
//    fire-and-forget and no block touches another's shared memory after the barrier. A
//    relaxed cluster arrive at entry, waited on just before the first push, guarantees
//    every block of the cluster has started (its shared memory exists); by then it has
//    long completed.
// 3. Two ring geometries of the same 192 KB, picked by the launch rule's block size:
//    WARPS x STAGES (8 x 3) refilled early for grids of more than FEW_BLOCKS blocks,
//    WARPS_FEW x STAGES_FEW (12 x 2) refilled late for grids of at most FEW_BLOCKS (64:
//    batch 1, where each block streams 1 MB or more). With the arithmetic compiled out
//    the kernel streams B1 S16384 in 18.77 us against 21.69 with it: the warps' mma and
//    exp2 latency delays their refills. Three warps per scheduler hide more of it (21.04
//    us at B1 S16384, 36.08 at S32768, against 21.64 and 37.04 accepted), and refilling a
//    stage before waiting for the next tile keeps STAGES tiles in flight during the wait
//    (B8 S1024 12.30 us; the 12-warp ring refilled early was slower at B1 S32768). The
//    entry dispatches on blockDim.x to one template instance of the body.
//
// Per warp and tile of 16 keys (as accepted):
//   scores  S[8 heads x 16 keys] = Q[heads x 128] K^T    (16 mma.m16n8k16, rows 8..15 zero)
//   output  O[8 heads x 128]    += P[heads x 16 keys] V  (16 mma.m16n8k16)
// Each lane reads whole 16-byte chunks of the ring into its fragments: K as the B operand
// of the scores (lane (g, t) holds key g, chunks t, t+4, t+8, t+12), V as the B operand of
// the output (lane (g, t) holds chunks g and g+8 of keys 2t, 2t+1, 2t+8, 2t+9, paired
// across keys with one byte-permute per register). Chunk c of key row r of a stage sits at
// chunk position c ^ SWZ(r), SWZ(r) = (r & 6) ^ 4 (r & 1): no bank conflicts on the
// fragment reads or the cp.async writes. The score fragment is, after the online softmax,
// the P fragment of the output mma. Warp w of a block takes the split's tiles w, w + NW,
// ...; the stage of its tile i - 1 is refilled with tile i + NS - 1 before tile i is
// computed (no block barrier in the loop).
//
// With one split the block writes the output directly. With G > 1 clusters per item each
// owner writes its cluster's merged columns to the scratch, and the last block of the item
// to finish (atomic counter after __threadfence) merges the G partials and writes the
// output, then resets the counter for the next launch (so launches on two streams at once
// would share the scratch: not re-entrant across streams). CLUSTER 1 is that global merge
// over every split, with no cluster.
//
// NO_COMPUTE (a diagnostic, never proposed): the loop waits for its copies and skips the
// tile's arithmetic; the output is meaningless. It times the streaming alone.
#include <cuda_fp16.h>

#define NEG_INF __int_as_float(0xff800000)
#define HEAD_DIM 128
#define HEADS 8            // query heads per work item (rows of the mma's A operand)
// Two ring geometries, the launch rule's block size picks one per shape (blockDim.x ==
// WARPS * 32: the first; WARPS_FEW * 32: the second; the first wins if they are equal).
#ifndef WARPS
#define WARPS 8            // warps per block, each with its own ring
#endif
#ifndef STAGES
#define STAGES 3           // ring depth in tiles: STAGES - 1 tiles in flight per warp
#endif
#ifndef EARLY_REFILL
#define EARLY_REFILL 1     // refill a stage before waiting for the tile to compute (below)
#endif
#ifndef WARPS_FEW
#define WARPS_FEW 12       // the second geometry (the rule's choice for grids of few blocks)
#endif
#ifndef STAGES_FEW
#define STAGES_FEW 2
#endif
#ifndef EARLY_FEW
#define EARLY_FEW 0
#endif
#define MAX_WARPS (WARPS > WARPS_FEW ? WARPS : WARPS_FEW)
#ifndef CLUSTER_MAX
#define CLUSTER_MAX 16     // the largest cluster the merge buffers hold (16 is non-portable)
#endif
#ifndef NO_COMPUTE
#define NO_COMPUTE 0
#endif
#define TILE 16            // keys per warp per step
#define KEY_BYTES 256      // one key row of K or V
#define TILE_BYTES 8192    // one stage: TILE rows of K, then TILE rows of V
#define ROW (HEAD_DIM + 4) // padded shared-memory row of the warp merge
#define COLS (HEADS * 32)  // (head, 4 dims) columns of a work item's output
// Scratch capacity (4 MB), for one partial per cluster (per split without a cluster). The
// launch rule splits only when P = WAVE_BLOCKS / items >= 2, so items x splits <=
// WAVE_BLOCKS; the kernel traps rather than overrun it. Plain numbers:
// tests/tests/scripted_proposals.rs reads them to check the launch rule.
#define MAX_ITEMS 1024
#define MAX_PARTIALS 8192  // MAX_ITEMS * HEADS
// softmax scale 1/sqrt(128) times log2(e): scores are kept in the exp2 domain.
#define SCALE_LOG2E 0.12751743074790924f

static_assert(MAX_WARPS <= 32, "WARPS, WARPS_FEW: at most 32 warps per block");
static_assert(CLUSTER_MAX >= 1 && CLUSTER_MAX <= 32, "CLUSTER_MAX: lanes push the maxima");

__device__ float partial_acc[MAX_PARTIALS * HEAD_DIM];
__device__ float2 partial_ml[MAX_PARTIALS];
__device__ unsigned int arrivals[MAX_ITEMS];

// PTX-BEGIN: async copy, clusters, exp2, and the tensor-core step.
__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    return (unsigned int)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, cached in L2 only (K and V are read once); the L2 fetches
// 256-byte segments.
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
// cluster), the barrier (a relaxed arrive orders nothing; arrive.release publishes this
// thread's earlier shared-memory stores, local and remote, to whoever waits with acquire),
// and stores into the shared memory of the cluster's block `rank` at the address of `p`
// in this block.
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
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
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
__device__ __forceinline__ void store_remote2(float2* p, unsigned int rank, float2 v) {
    asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" ::"r"(remote_addr(p, rank)),
                 "f"(v.x), "f"(v.y)
                 : "memory");
}
__device__ __forceinline__ void store_remote4(float4* p, unsigned int rank, float4 v) {
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(remote_addr(p, rank)),
                 "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
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

// The kernel for one ring geometry: NW warps, each with a ring of NS stages, refilled
// early (EARLY) or late (see the loop). The shared arrays are the entry's.
template <int NW, int NS, bool EARLY>
__device__ __forceinline__ void decode(const __half* __restrict__ q, const __half* __restrict__ k,
                                       const __half* __restrict__ v, __half* __restrict__ out,
                                       unsigned int q_heads, unsigned int kv_heads,
                                       unsigned int seq_len, unsigned char* smem,
                                       float2 (*sm_ml)[HEADS], uint4 (*sm_q)[32], bool& sm_last,
                                       float2 (*rx_ml)[HEADS], float4* rx_acc) {
    constexpr int THREADS = NW * 32;
    constexpr int RING_BYTES = NS * TILE_BYTES;  // per warp; the launch rule's smem is NW of them
    constexpr int SLOTS = THREADS > COLS ? THREADS : COLS;  // merge slots of the last block
    static_assert(NS >= 2, "STAGES: one tile computed while at least one is in flight");
    static_assert(NW >= 1 && NW <= 32, "WARPS: 1 to 32 warps per block");
    static_assert(NW * RING_BYTES >= NW * HEADS * ROW * 4, "ring too small for the merge");
    static_assert(NW * RING_BYTES >= SLOTS * 24, "ring too small for the split merge");
    const unsigned int tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned int splits = gridDim.x, split = blockIdx.x;
    // Blocks of a cluster along x, consecutive splits of one work item; 1 without one.
    const unsigned int ncl = cluster_blocks();
    if (ncl > 1) cluster_arrive_relaxed();  // this block has started: waited before the push

    const unsigned int group_size = q_heads / kv_heads;
    const unsigned int chunks = (group_size + HEADS - 1) / HEADS;
    const unsigned int item = blockIdx.y;  // (b * kv_heads + kvh) * chunks + chunk
    const unsigned int bkv = item / chunks;  // b * kv_heads + kvh
    // Whole tiles per split (the last split takes the rest); trailing splits may be empty.
    const unsigned int per = ((seq_len + splits - 1) / splits + TILE - 1) / TILE * TILE;
    const unsigned int k0 = min(seq_len, split * per), k1 = min(seq_len, k0 + per);
    const __half* kb = k + (size_t)bkv * seq_len * HEAD_DIM;
    const __half* vb = v + (size_t)bkv * seq_len * HEAD_DIM;
    const unsigned char* ring = smem + warp * RING_BYTES;
    const unsigned int ring_s = smem_addr(ring);
    // This warp's tile i starts at key k0 + (i * NW + warp) * TILE and lives in stage
    // i % NS. Prologue: tiles 0 .. NS - 2, one commit group each (empty past k1,
    // so that the group count stays uniform), issued before anything else.
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
        const unsigned int base = k0 + (s * NW + warp) * TILE;
        if (base < k1) issue_tile(ring_s + s * TILE_BYTES, kb, vb, base, k1, lane);
        cp_async_commit();
    }

    const unsigned int chunk = item % chunks;
    const unsigned int b = bkv / kv_heads, kvh = bkv % kv_heads;
    const unsigned int h0 = kvh * group_size + chunk * HEADS;  // first query head
    const unsigned int nh = min((unsigned int)HEADS, group_size - chunk * HEADS);
    const unsigned int rank = ncl > 1 ? cluster_rank() : 0u;
    // The clusters of the work item: `groups` of them, this block in cluster `group`.
    const unsigned int groups = splits / ncl, group = split / ncl;
    // The launch rule never asks for these: fault loudly rather than merge the wrong
    // blocks or overrun the merge buffers or the scratch.
    if (ncl > CLUSTER_MAX || splits % ncl != 0) __trap();
    if (groups > 1 && (gridDim.y > MAX_ITEMS || groups * gridDim.y * HEADS > MAX_PARTIALS))
        __trap();

    const unsigned int g = lane >> 2, t = lane & 3u;  // mma group and thread in group

    // A fragment of Q: row g is query head h0 + g (zero past the group); k-step 2i + j
    // covers the dimensions of 16-byte chunk 4i + t (halves 4j..4j+3) in every lane. Kept
    // in shared memory (the same for every warp), not in 16 registers.
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
    for (unsigned int base = k0 + warp * TILE; base < k1; base += NW * TILE) {
        // The stage of tile i - 1 is refilled with tile i + NS - 1 before tile i is
        // computed. EARLY (EARLY_REFILL, EARLY_FEW): as soon as every lane has finished
        // reading tile i - 1 (the __syncwarp), before waiting for tile i, so that NS tiles
        // are in flight during the wait and NS - 1 during the arithmetic; otherwise after
        // the wait (NS - 1 during the wait, as the accepted variant). Either way the wait
        // leaves tile i's group landed (this lane's copies), and the __syncwarp after it
        // makes every lane's visible.
        const unsigned int next = base + (NS - 1) * NW * TILE;
        const unsigned int refill = stage == 0 ? NS - 1 : stage - 1;
        if (EARLY) {
            __syncwarp();
            if (next < k1) issue_tile(ring_s + refill * TILE_BYTES, kb, vb, next, k1, lane);
            cp_async_commit();
            cp_async_wait<NS - 1>();
            __syncwarp();
        } else {
            cp_async_wait<NS - 2>();
            __syncwarp();
            if (next < k1) issue_tile(ring_s + refill * TILE_BYTES, kb, vb, next, k1, lane);
            cp_async_commit();
        }
#if !NO_COMPUTE
        uint4 kk[2][4], vv[4][2];
        read_tile(kk, vv, ring + stage * TILE_BYTES, g, t);
        tile_step(kk, vv, sm_q, base, k1, lane, t, m, l, o);
#endif
        stage = stage + 1 == NS ? 0 : stage + 1;
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

    // Columns (head, 4 dims): nh * 32 of them; with a cluster, rank r owns the `own`
    // columns from r * own (the last owner fewer, or none).
    const unsigned int cols = nh * 32, own = (cols + ncl - 1) / ncl;
    // Every block of the cluster has started (so its shared memory exists) before any
    // block stores into it.
    if (ncl > 1) cluster_wait();
    // Warp w merges heads w, w + NW, ..., lane c4 their dims 4 c4 .. 4 c4 + 3.
    for (unsigned int h = warp; h < nh; h += NW) {
        const unsigned int c4 = lane;
        float mm = NEG_INF;
#pragma unroll
        for (int w = 0; w < NW; ++w) mm = fmaxf(mm, sm_ml[w][h].x);
        const float ms = mm == NEG_INF ? 0.0f : mm;  // empty split: no NaN
        float ll = 0.0f;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            const float2 ml = sm_ml[w][h];
            const float wt = ex2(ml.x - ms);
            const float4 x = *reinterpret_cast<const float4*>(&sm_o[w][h][4 * c4]);
            ll = fmaf(ml.y, wt, ll);
            a.x = fmaf(x.x, wt, a.x);
            a.y = fmaf(x.y, wt, a.y);
            a.z = fmaf(x.z, wt, a.z);
            a.w = fmaf(x.w, wt, a.w);
        }
        if (splits == 1) {
            write_out(out, b, q_heads, h0 + h, c4, a, ll);
        } else if (ncl > 1) {
            // Push: the column to its owner, the head's (max, sum) to every block.
            const unsigned int col = h * 32 + c4, owner = col / own;
            store_remote4(&rx_acc[rank * own + (col - owner * own)], owner, a);
            if (lane < ncl) store_remote2(&rx_ml[rank][h], lane, make_float2(mm, ll));
        } else {
            const unsigned int p = (item * groups + group) * HEADS + h;
            *reinterpret_cast<float4*>(&partial_acc[(size_t)p * HEAD_DIM + 4 * c4]) = a;
            if (c4 == 0) partial_ml[p] = make_float2(mm, ll);
        }
    }
    if (splits == 1) return;

    if (ncl > 1) {
        // Every block's pushes have landed; no block touches another's shared memory
        // after this barrier, so none waits for the others before it exits.
        cluster_arrive();
        cluster_wait();
        const unsigned int c0 = rank * own, c1 = min(cols, c0 + own);
        for (unsigned int col = c0 + tid; col < c1; col += THREADS) {
            const unsigned int h = col >> 5, c4 = col & 31u, j = col - c0;
            float mm = NEG_INF;
            for (unsigned int r = 0; r < ncl; ++r) mm = fmaxf(mm, rx_ml[r][h].x);
            const float ms = mm == NEG_INF ? 0.0f : mm;  // a cluster of empty splits
            float ll = 0.0f;
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (unsigned int r = 0; r < ncl; ++r) {
                const float2 ml = rx_ml[r][h];
                const float4 x = rx_acc[r * own + j];
                const float wt = ex2(ml.x - ms);
                ll = fmaf(ml.y, wt, ll);
                a.x = fmaf(x.x, wt, a.x);
                a.y = fmaf(x.y, wt, a.y);
                a.z = fmaf(x.z, wt, a.z);
                a.w = fmaf(x.w, wt, a.w);
            }
            if (groups == 1) {
                write_out(out, b, q_heads, h0 + h, c4, a, ll);
            } else {
                const unsigned int p = (item * groups + group) * HEADS + h;
                *reinterpret_cast<float4*>(&partial_acc[(size_t)p * HEAD_DIM + 4 * c4]) = a;
                if (c4 == 0) partial_ml[p] = make_float2(mm, ll);
            }
        }
        if (groups == 1) return;
    }

    // Last block of the work item merges the groups' partials.
    __threadfence();
    __syncthreads();
    if (tid == 0) sm_last = atomicAdd(&arrivals[item], 1u) == splits - 1;
    __syncthreads();
    if (!sm_last) return;
    __threadfence();

    // nh * 32 columns and `parts` slots per column (slot = part * cols + col), each
    // folding every parts-th group with an online max, 8 groups' loads in flight; then one
    // thread per column folds its parts (through shared memory, reusing the ring: all
    // reads of the warps' rows are done).
    const unsigned int parts = max(1u, (unsigned int)THREADS / cols);
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

extern "C" __global__ void __launch_bounds__(MAX_WARPS * 32)
gqa_decode_f16(const __half* __restrict__ q, const __half* __restrict__ k,
               const __half* __restrict__ v, __half* __restrict__ out, unsigned int batch,
               unsigned int q_heads, unsigned int kv_heads, unsigned int seq_len) {
    // The warps' rings (the launch rule's smem); reused by the merges.
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ float2 sm_ml[MAX_WARPS][HEADS];
    __shared__ uint4 sm_q[4][32];
    __shared__ bool sm_last;
    // What the blocks of the cluster push into this one: per source rank and head the
    // (max, sum), and per source rank the float4 of each column this block owns (slot
    // rank * own + j for its j-th column).
    __shared__ float2 rx_ml[CLUSTER_MAX][HEADS];
    __shared__ __align__(16) float4 rx_acc[COLS + CLUSTER_MAX];
    (void)batch;
    if (blockDim.x == WARPS * 32)
        decode<WARPS, STAGES, EARLY_REFILL != 0>(q, k, v, out, q_heads, kv_heads, seq_len, smem,
                                                 sm_ml, sm_q, sm_last, rx_ml, rx_acc);
    else if (blockDim.x == WARPS_FEW * 32)
        decode<WARPS_FEW, STAGES_FEW, EARLY_FEW != 0>(q, k, v, out, q_heads, kv_heads, seq_len,
                                                      smem, sm_ml, sm_q, sm_last, rx_ml, rx_acc);
    else
        __trap();  // the launch rule gives one of the two block sizes
}
