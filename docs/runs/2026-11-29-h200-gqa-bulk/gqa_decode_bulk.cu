// Grouped-query attention, one decode step, fp16 (head dim 128), flash-decoding style on
// the tensor cores, with K and V streamed into a shared-memory ring by Hopper's bulk-copy
// engine (cp.async.bulk, completion on an mbarrier).
//
// The same work split, tile arithmetic, mma fragments and merges as gqa_decode_pipe.cu
// (proposals[1]); what differs is how K and V reach shared memory. There every lane
// issues 16 cp.async.cg copies of 16 bytes per tile: the bytes in flight go through the
// SM's load/store path, like the register loads of gqa_decode.cu, and both kernels top
// out near the same ~4.1 TB/s with ~128 KB per SM in flight. Here the K rows of a tile
// (16 keys x 256 bytes, contiguous in global memory) are one 4 KB bulk copy and its V
// rows another, issued by one lane of the warp and carried out by the bulk-copy engine
// (the TMA unit), which counts the bytes that land on the stage's mbarrier.
//
// Each warp owns a private ring of STAGES = RING_TILES / WARPS stages of 8 KB (one tile
// of K, then the same tile of V) and one mbarrier per stage. Before computing its tile i
// a warp refills the stage of tile i - 1 with tile i + STAGES - 1, so STAGES - 1 tiles per
// warp stay in flight: (RING_TILES - WARPS) x 8 KB per SM (8 warps x 3 stages: 128 KB;
// 4 warps x 6 stages: 160 KB, from the same 192 KB of shared memory). Stages of one
// 16-key tile rather than bigger ones: the ring is per warp and shared memory is capped
// at 227 KB, so a finer stage keeps a larger share of the ring in flight, and a 4 KB
// copy is already one instruction where cp.async needed 256.
//
// Stage protocol (per warp, warp-uniform control flow, lane 0 the producer):
//   issue tile j into stage s: lane 0 arms mbarrier s with the tile's byte count
//     (mbarrier.arrive.expect_tx: its one arrival, plus the bytes the phase waits for)
//     and issues the K and V copies with complete_tx on it;
//   consume tile i from stage s: every lane waits for the phase of that use (parity
//     (i / STAGES) & 1) with mbarrier.try_wait.parity, which also makes the copied bytes
//     visible to it; a stage is only waited for when it was issued (both conditions are
//     `key < k1`), so issues and waits pair up and the phases stay in step.
//   reuse: the refill of stage s (tile i - 1's) comes after __syncwarp, once every lane
//     has finished reading tile i - 1, and after fence.proxy.async.shared::cta in lane 0,
//     which orders those generic-proxy reads before the async-proxy writes of the copy.
// The barriers are initialised by lane 0 of each warp, made visible to the async proxy
// (fence.mbarrier_init) and to the warp (__syncwarp) before the first copy.
//
// Bulk copies do not swizzle, so a stage is linear (key row r of K at r * 256 bytes, of V
// at 4096 + r * 256), every row starting on bank 0. The fragment reads are those of
// gqa_decode_pipe.cu with a linear offset: a quarter-warp's 16-byte K reads (2 keys x 4
// chunks) hit 4 of the 8 16-byte bank groups (2-way conflict), its V reads (4 keys x 2
// lanes' chunks g, all in bank group g mod 8) 2 groups (4-way): 192 shared-memory
// wavefronts per tile and warp instead of 64. No chunk order avoids it: the head
// dimension's order must be the same for every key of an mma, so the same chunk of
// different keys (256 bytes apart) always shares a bank group. Per 8 KB tile that is
// about 290 wavefronts with the copy's writes and Q's reads, against about 500 clocks
// per tile per SM at 4 TB/s: it costs shared-memory bandwidth and latency, not the
// stream, if the warps keep enough copies in flight.
//
// A tile at the end of the sequence may hold fewer than 16 keys: its copies move only the
// keys that exist (the byte count is clamped, so no copy reads past K or V), the stage's
// other rows keep stale or uninitialised bytes, the scores of those keys are masked to
// -inf (p = 0) as in the other kernels, and their V chunks are zeroed in registers after
// the read (0 x NaN would be NaN).
//
// Work item = (batch, kv head, group of up to 8 of the query heads sharing that KV head);
// the sequence is split over gridDim.x blocks (about one wave of at most WAVE_BLOCKS
// blocks); warp w of a block takes the split's tiles w, w + WARPS, ... Per warp and tile:
//   scores  S[8 heads x 16 keys] = Q[heads x 128] K^T    (16 mma.m16n8k16, rows 8..15 zero)
//   output  O[8 heads x 128]    += P[heads x 16 keys] V  (16 mma.m16n8k16)
// K as the B operand of the scores (lane (g, t) holds key g, chunks t, t+4, t+8, t+12), V
// as the B operand of the output (lane (g, t) holds chunks g and g+8 of keys 2t, 2t+1,
// 2t+8, 2t+9, paired across keys with one byte-permute per register); the score fragment
// is, after the softmax, the P fragment (FlashAttention 2).
//
// The warps merge through shared memory (the ring, once every copy has landed). With one
// split the block writes the output; otherwise it writes its partial (max, sum, 128
// accumulators per head) to a module-scope scratch area, and the last block of the work
// item to finish (atomic counter after __threadfence) merges the splits with all its
// threads and writes the output, then resets the counter for the next launch.
#include <cuda_fp16.h>

#define NEG_INF __int_as_float(0xff800000)
#define HEAD_DIM 128
#define HEADS 8            // query heads per work item (rows of the mma's A operand)
#ifndef WARPS
#define WARPS 8            // warps per block, each with its own ring
#endif
#ifndef RING_TILES
#define RING_TILES 24      // stages in the block (the launch rule's smem is 8 KB each)
#endif
#define STAGES (RING_TILES / WARPS)  // per warp: STAGES - 1 tiles in flight
#define THREADS (WARPS * 32)
#define TILE 16            // keys per warp per step
#define KEY_BYTES 256      // one key row of K or V
#define TILE_BYTES 8192    // one stage: TILE rows of K, then TILE rows of V
#define RING_BYTES (STAGES * TILE_BYTES)  // per warp
#define ROW (HEAD_DIM + 4) // padded shared-memory row of the merge: fewer bank conflicts
// Merge slots of the last block: one per thread, or one per (head, 4 dims) column.
#define SLOTS (THREADS > HEADS * 32 ? THREADS : HEADS * 32)
// Scratch capacity (4 MB). The launch rule keeps (work items) * (splits) at most
// WAVE_BLOCKS whenever there is more than one split; room for WAVE_BLOCKS up to 1024.
// Plain numbers: tests/tests/scripted_proposals.rs reads them to check the launch rule.
#define MAX_ITEMS 1024
#define MAX_PARTIALS 8192  // MAX_ITEMS * HEADS
// softmax scale 1/sqrt(128) times log2(e): scores are kept in the exp2 domain.
#define SCALE_LOG2E 0.12751743074790924f

static_assert(RING_TILES % WARPS == 0, "RING_TILES: the same ring depth for every warp");
static_assert(STAGES >= 2, "STAGES: one tile computed while at least one is in flight");
static_assert(THREADS <= 1024, "WARPS: at most 32 warps per block");
// The merges reuse the ring: the warps' rows, then the last block's slots.
static_assert(WARPS * RING_BYTES >= WARPS * HEADS * ROW * 4, "ring too small for the merge");
static_assert(WARPS * RING_BYTES >= SLOTS * 24, "ring too small for the split merge");

__device__ float partial_acc[MAX_PARTIALS * HEAD_DIM];
__device__ float2 partial_ml[MAX_PARTIALS];
__device__ unsigned int arrivals[MAX_ITEMS];

// PTX-BEGIN: bulk copy and mbarrier (sm_90, PTX ISA 8.0), exp2, and the tensor-core step.
__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    return (unsigned int)__cvta_generic_to_shared(p);
}

// One arrival expected per phase: the producer lane's arrive.expect_tx.
__device__ __forceinline__ void mbar_init(unsigned long long* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
}

// Makes the initialised barriers visible to the async proxy (the bulk copies' complete_tx).
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Orders this thread's (and, after a __syncwarp, its warp's) earlier generic-proxy
// accesses to shared memory before later async-proxy ones (the next bulk copy).
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The producer's arrival for this phase, which then also waits for `bytes` to land.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar,
                                                      unsigned int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                     smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

// `bytes` (a multiple of 16, 16-byte aligned ends) global -> shared by the bulk-copy
// engine, counted on `bar` as they land.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned int bytes,
                                          unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];\n" ::"r"(smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
}

// Until the phase of `bar` with this parity has completed (its bytes have landed and are
// visible to the waiting thread).
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned int parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "wait_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_%=;\n"
        "}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
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

__device__ __forceinline__ unsigned int word(const uint4& u, int i) {
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

// Byte offset of 16-byte chunk c (0..15) of row r (0..15) inside a K or V half-stage:
// linear, as the bulk copy writes it.
__device__ __forceinline__ unsigned int chunk_offset(unsigned int r, unsigned int c) {
    return r * KEY_BYTES + (c << 4);
}

// Lane 0's part of issuing the tile of keys base .. min(base + TILE, k1) - 1 (base < k1)
// into `stage`: arm its barrier with the bytes, then one bulk copy for the K rows and one
// for the V rows (contiguous in global memory).
__device__ __forceinline__ void issue_tile(unsigned char* stage, unsigned long long* bar,
                                           const __half* kb, const __half* vb,
                                           unsigned int base, unsigned int k1) {
    const unsigned int bytes = min((unsigned int)TILE, k1 - base) * KEY_BYTES;
    mbar_arrive_expect_tx(bar, 2 * bytes);
    bulk_copy(stage, kb + (size_t)base * HEAD_DIM, bytes, bar);
    bulk_copy(stage + TILE_BYTES / 2, vb + (size_t)base * HEAD_DIM, bytes, bar);
}

// The fragments of one stage: K as the B fragments of the scores mma (key 8nt + g,
// chunks 4i + t), V as the raw chunks g and g + 8 of keys 2t, 2t+1, 2t+8, 2t+9. Rows at
// or past `keys` (the tile's keys that exist) were not copied: their V chunks are zeroed
// (their K rows only reach scores that tile_step masks).
__device__ __forceinline__ void read_tile(uint4 (&kk)[2][4], uint4 (&vv)[4][2],
                                          const unsigned char* stage, unsigned int keys,
                                          unsigned int g, unsigned int t) {
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
    if (keys < TILE) {  // warp-uniform: only the sequence's last tile
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const unsigned int r = (c >> 1) * 8 + 2 * t + (c & 1);
            if (r >= keys) vv[c][0] = vv[c][1] = make_uint4(0, 0, 0, 0);
        }
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
    __shared__ unsigned long long sm_bar[WARPS][STAGES];  // one mbarrier per stage
    __shared__ float2 sm_ml[WARPS][HEADS];
    __shared__ uint4 sm_q[4][32];
    __shared__ bool sm_last;

    const unsigned int group_size = q_heads / kv_heads;
    const unsigned int chunks = (group_size + HEADS - 1) / HEADS;
    const unsigned int item = blockIdx.y;  // (b * kv_heads + kvh) * chunks + chunk
    const unsigned int chunk = item % chunks;
    const unsigned int bkv = item / chunks;  // b * kv_heads + kvh
    const unsigned int b = bkv / kv_heads, kvh = bkv % kv_heads;
    const unsigned int h0 = kvh * group_size + chunk * HEADS;  // first query head
    const unsigned int nh = min((unsigned int)HEADS, group_size - chunk * HEADS);
    const unsigned int splits = gridDim.x, split = blockIdx.x;
    if (splits > 1 && (gridDim.y > MAX_ITEMS || splits * gridDim.y * HEADS > MAX_PARTIALS))
        __trap();  // the launch rule never asks for this; never overrun the scratch

    // Whole tiles per split (the last split takes the rest); trailing splits may be empty.
    const unsigned int per = ((seq_len + splits - 1) / splits + TILE - 1) / TILE * TILE;
    const unsigned int k0 = min(seq_len, split * per), k1 = min(seq_len, k0 + per);

    const unsigned int tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned int g = lane >> 2, t = lane & 3u;  // mma group and thread in group

    const __half* kb = k + (size_t)bkv * seq_len * HEAD_DIM;
    const __half* vb = v + (size_t)bkv * seq_len * HEAD_DIM;
    unsigned char* ring = smem + warp * RING_BYTES;
    unsigned long long* bar = sm_bar[warp];
    // This warp's tile i starts at key k0 + (i * WARPS + warp) * TILE and lives in stage
    // i % STAGES. Barriers first, then the prologue: tiles 0 .. STAGES - 2 (those before
    // k1), issued before Q is staged.
    if (lane == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) mbar_init(&bar[s]);
        mbar_init_fence();
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            const unsigned int base = k0 + (s * WARPS + warp) * TILE;
            if (base < k1) issue_tile(ring + s * TILE_BYTES, &bar[s], kb, vb, base, k1);
        }
    }
    __syncwarp();

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

    // Warp-uniform loop (every mma, shuffle and __syncwarp has all 32 lanes). `phase` is
    // the parity of the current use of `stage`: it flips each time the ring wraps.
    unsigned int stage = 0, phase = 0;
    for (unsigned int base = k0 + warp * TILE; base < k1; base += WARPS * TILE) {
        // Tile i has landed and is visible to this lane; after __syncwarp every lane has
        // also finished reading tile i - 1, whose stage is refilled (after the proxy
        // fence) with tile i + STAGES - 1 before tile i is computed.
        mbar_wait(&bar[stage], phase);
        __syncwarp();
        const unsigned int next = base + (STAGES - 1) * WARPS * TILE;
        const unsigned int refill = stage == 0 ? STAGES - 1 : stage - 1;
        if (lane == 0 && next < k1) {
            fence_proxy_async();
            issue_tile(ring + refill * TILE_BYTES, &bar[refill], kb, vb, next, k1);
        }
        uint4 kk[2][4], vv[4][2];
        read_tile(kk, vv, ring + stage * TILE_BYTES, min((unsigned int)TILE, k1 - base), g, t);
        tile_step(kk, vv, sm_q, base, k1, lane, t, m, l, o);
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1u;
        }
    }
    // Every issued tile was waited for (both on `key < k1`): no copy is in flight. Every
    // warp is done with its ring before the merge reuses it.
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
            const float inv = 1.0f / ll;
            uint2 r;
            r.x = pack_half2(a.x * inv, a.y * inv);
            r.y = pack_half2(a.z * inv, a.w * inv);
            *reinterpret_cast<uint2*>(out + ((size_t)b * q_heads + h0 + h) * HEAD_DIM +
                                      4 * c4) = r;
        } else {
            const unsigned int p = (item * splits + split) * HEADS + h;
            *reinterpret_cast<float4*>(&partial_acc[(size_t)p * HEAD_DIM + 4 * c4]) = a;
            if (c4 == 0) partial_ml[p] = make_float2(mm, ll);
        }
    }
    if (direct) return;

    // Last block of the work item merges the splits.
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
        const unsigned int p0 = item * splits * HEADS + h;
        for (unsigned int s0 = part; s0 < splits; s0 += 8 * parts) {
            float2 ml[8];
            float4 x[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const unsigned int s = s0 + u * parts;
                if (s < splits) {
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
        const float inv = 1.0f / ll;
        uint2 r;
        r.x = pack_half2(a.x * inv, a.y * inv);
        r.y = pack_half2(a.z * inv, a.w * inv);
        *reinterpret_cast<uint2*>(out + ((size_t)b * q_heads + h0 + h) * HEAD_DIM + 4 * c4) = r;
    }
    if (tid == 0) arrivals[item] = 0;  // ready for the next launch (stream-ordered)
}
