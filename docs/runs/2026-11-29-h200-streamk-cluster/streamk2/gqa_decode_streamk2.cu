// Grouped-query attention, one decode step, fp16 (head dim 128), flash-decoding style on
// the tensor cores, K and V streamed through a cp.async shared-memory ring, and the work
// split stream-K style: every block streams the same number of key tiles whatever the
// number of work items, and its ring runs on from one work item into the next.
//
// The tile arithmetic, the ring, the fragments and the merges are gqa_decode_pipe.cu's
// (proposals[1], the variant accepted now; its top comment explains them). What differs is
// the split. There each work item is cut into the same number of splits, so the grid is a
// multiple of the work items: at 64 items (batch 8 x 8 KV heads) that is 128 blocks, and 4
// of the H200's 132 SMs idle. Here the items' key tiles are laid end to end (T = items x
// ceil(seq_len / 16) tiles) and block b of G = min(gridDim.x, T) takes tiles
// [b T / G, (b + 1) T / G). With G at least the number of items a range is at most one item
// long, so it touches one item or two: segment 0 (the end of one, or all of it) and
// segment 1 (the start of the next).
//
// The ring does not stop at the segment boundary: a warp issues each copy from whichever
// item its tile belongs to, so segment 1's first tiles are in flight while segment 0 is
// finished. At the boundary each warp flushes its (max, sum, accumulators) into the stage
// of its last computed tile (free: its other stages hold segment 1's copies) and the block
// merges the warps from there; the last segment is merged through the ring as before.
// (An earlier stream-K candidate drained and refilled the ring at the boundary, and
// divided 64-bit integers before its first copy: 12-16% slower on every shape,
// docs/runs/2026-11-29-h200-streamk-cluster.)
//
// A segment that is a whole item writes the output. Otherwise its block writes a partial to
// slot 2b + 1 when the item is the block's last (it ends with the item or inside it) and
// to slot 2b when it is the block's first and ends inside it: two slots per block, so the
// scratch is bounded by the grid. The item's blocks b_lo .. b_hi follow from the same
// division (block of tile x = ((x + 1) G - 1) / T); the last of them to arrive (atomic
// counter b_lo, after __threadfence) merges the slots and writes the output, then resets
// the counter for the next launch.
//
// The launch rule: one block per item when there are at least WAVE_BLOCKS items; the
// stream-K grid of WAVE_BLOCKS when every warp gets STREAMK_MIN tiles or more; otherwise a
// multiple of the items (then no range crosses an item and the split is the previous
// kernel's).
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
// The launch rule's threshold (tiles per warp) for the stream-K grid. Read by the launch
// rule only.
#ifndef STREAMK_MIN
#define STREAMK_MIN 8
#endif
#define THREADS (WARPS * 32)
#define TILE 16            // keys per warp per step
#define KEY_BYTES 256      // one key row of K or V
#define TILE_BYTES 8192    // one stage: TILE rows of K, then TILE rows of V
#define RING_BYTES (STAGES * TILE_BYTES)  // per warp; the launch rule's smem is WARPS of them
#define ROW (HEAD_DIM + 4) // padded shared-memory row of the merge: fewer bank conflicts
// Merge slots of the last block: one per thread, or one per (head, 4 dims) column.
#define SLOTS (THREADS > HEADS * 32 ? THREADS : HEADS * 32)
// Scratch capacity: two partial slots and one counter per block (4 MB of partials). The
// kernel traps rather than write a partial from a block past MAX_BLOCKS.
// Plain numbers: tests/tests/scripted_proposals.rs reads them to check the launch rule.
#define MAX_BLOCKS 512
#define MAX_PARTIALS 8192  // 2 * MAX_BLOCKS * HEADS
// softmax scale 1/sqrt(128) times log2(e): scores are kept in the exp2 domain.
#define SCALE_LOG2E 0.12751743074790924f

static_assert(STAGES >= 2, "STAGES: one tile computed while at least one is in flight");
static_assert(WARPS >= 2 && THREADS <= 1024, "WARPS: 2 to 32 (warps 0 and 1 stage Q)");
static_assert(MAX_PARTIALS == 2 * MAX_BLOCKS * HEADS, "two partial slots per block");
// A warp's flushed rows fit in one stage; the merges reuse the ring.
static_assert(HEADS * ROW * 4 <= TILE_BYTES, "a warp's rows must fit in a stage");
static_assert(SLOTS * 24 <= TILE_BYTES, "the split merge's scratch must fit in a stage");
static_assert(WARPS * RING_BYTES >= WARPS * HEADS * ROW * 4, "ring too small for the merge");

__device__ float partial_acc[MAX_PARTIALS * HEAD_DIM];
__device__ float2 partial_ml[MAX_PARTIALS];
__device__ unsigned int arrivals[MAX_BLOCKS];

// PTX-BEGIN: async copy, exp2, and the tensor-core step.
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

// floor(a * b / c) without a 64-bit division where the product fits in 32 bits.
__device__ __forceinline__ unsigned long long mul_div(unsigned long long a, unsigned long long b,
                                                      unsigned long long c) {
    const unsigned long long p = a * b;
    return (p >> 32) == 0 && (c >> 32) == 0 ? (unsigned int)p / (unsigned int)c : p / c;
}

// One segment of a block's range: the tiles of one work item it holds.
struct Segment {
    const __half* kb;   // the item's K and V rows
    const __half* vb;
    unsigned int item;
    unsigned int first; // the item's first tile in the flat order
    unsigned int k1;    // keys of the item this block handles end here
};

__device__ __forceinline__ Segment segment(const __half* k, const __half* v, unsigned int item,
                                           unsigned int chunks, unsigned int tiles,
                                           unsigned int seq_len, unsigned int t1) {
    const unsigned int bkv = item / chunks;  // b * kv_heads + kvh
    Segment s;
    s.kb = k + (size_t)bkv * seq_len * HEAD_DIM;
    s.vb = v + (size_t)bkv * seq_len * HEAD_DIM;
    s.item = item;
    s.first = item * tiles;
    s.k1 = min(seq_len, (min(t1, s.first + tiles) - s.first) * TILE);
    return s;
}

// Where tile f of the flat order reads from: its segment's K and V at key (f - first) * TILE.
__device__ __forceinline__ void issue_flat(unsigned int dst, const Segment& s0, const Segment& s1,
                                           unsigned int boundary, unsigned int f,
                                           unsigned int lane) {
    const bool first = f < boundary;
    issue_tile(dst, first ? s0.kb : s1.kb, first ? s0.vb : s1.vb,
               (f - (first ? s0.first : s1.first)) * TILE, first ? s0.k1 : s1.k1, lane);
}

// This warp's (m, l, o) as rows [head g][128 dims] at `rows` (HEADS x ROW floats) and its
// (max, sum) per head in ml[g]. The 4 lanes of a group hold row g's max and parts of its sum.
__device__ __forceinline__ void flush_state(float (*rows)[ROW], float2* ml, float m, float l,
                                            const float (&o)[16][2], unsigned int g,
                                            unsigned int t) {
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (t == 0) ml[g] = make_float2(m, l);
#pragma unroll
    for (int d = 0; d < 16; ++d)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const unsigned int n = 2 * t + j;
            rows[g][d < 8 ? 8 * n + d : 64 + 8 * n + (d - 8)] = o[d][j];
        }
}

// The block's share of a work item: the warps' flushed states (warp w's rows at
// smem + row_off[w], its (max, sum) in sm_ml[w]) merged and written as the output when the
// block holds the whole item, else as the partial in `slot`; then the last of the item's
// blocks to arrive (counter b_lo, `parts` blocks, the slots of blocks b_lo .. b_lo + parts - 1
// from slot_lo .. and slot_hi for the last) merges the partials and writes the output, using
// `scratch` (SLOTS x 24 bytes that no warp reads any more). Every thread of the block calls it.
__device__ __forceinline__ void emit_item(unsigned char* smem, const unsigned int* row_off,
                          float2 (*sm_ml)[HEADS], bool* sm_last, unsigned char* scratch,
                          __half* __restrict__ out, unsigned int q_heads, unsigned int b,
                          unsigned int h0, unsigned int nh, bool whole, unsigned int slot,
                          unsigned int b_lo, unsigned int parts, unsigned int slot_last) {
    const unsigned int tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    // Warp w produces heads w, w + WARPS, ..., lane c4 their dims 4 c4 .. 4 c4 + 3.
    for (unsigned int h = warp; h < nh; h += WARPS) {
        const unsigned int c4 = lane;
        float mm = NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mm = fmaxf(mm, sm_ml[w][h].x);
        const float ms = mm == NEG_INF ? 0.0f : mm;  // warps without tiles: no NaN
        float ll = 0.0f;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float2 ml = sm_ml[w][h];
            const float wt = ex2(ml.x - ms);
            const float* rows = reinterpret_cast<const float*>(smem + row_off[w]);
            const float4 x = *reinterpret_cast<const float4*>(rows + h * ROW + 4 * c4);
            ll = fmaf(ml.y, wt, ll);
            a.x = fmaf(x.x, wt, a.x);
            a.y = fmaf(x.y, wt, a.y);
            a.z = fmaf(x.z, wt, a.z);
            a.w = fmaf(x.w, wt, a.w);
        }
        if (whole) {
            const float inv = 1.0f / ll;
            uint2 r;
            r.x = pack_half2(a.x * inv, a.y * inv);
            r.y = pack_half2(a.z * inv, a.w * inv);
            *reinterpret_cast<uint2*>(out + ((size_t)b * q_heads + h0 + h) * HEAD_DIM +
                                      4 * c4) = r;
        } else {
            const unsigned int p = slot * HEADS + h;
            *reinterpret_cast<float4*>(&partial_acc[(size_t)p * HEAD_DIM + 4 * c4]) = a;
            if (c4 == 0) partial_ml[p] = make_float2(mm, ll);
        }
    }
    if (whole) return;

    // The last of the item's blocks to arrive merges its partials.
    __threadfence();
    __syncthreads();
    if (tid == 0) *sm_last = atomicAdd(&arrivals[b_lo], 1u) == parts - 1;
    __syncthreads();
    if (!*sm_last) return;
    __threadfence();

    // nh * 32 columns (head, 4 dims) and `fold` slots per column (slot = part * cols +
    // col), each folding every fold-th share with an online max, 8 shares' loads in
    // flight; then one thread per column folds its slots through shared memory.
    const unsigned int cols = nh * 32, fold = max(1u, (unsigned int)THREADS / cols);
    float4* part_acc = reinterpret_cast<float4*>(scratch);              // [SLOTS]
    float2* part_ml = reinterpret_cast<float2*>(scratch + SLOTS * 16);  // [SLOTS]
    for (unsigned int s_slot = tid; s_slot < cols * fold; s_slot += THREADS) {
        const unsigned int col = s_slot % cols, part = s_slot / cols;
        const unsigned int h = col >> 5, c4 = col & 31u;
        float mm = NEG_INF, ll = 0.0f;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (unsigned int s0 = part; s0 < parts; s0 += 8 * fold) {
            float2 ml[8];
            float4 x[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const unsigned int s = s0 + u * fold;
                if (s < parts) {
                    // Blocks before the item's last hold its end: their slot is 2b + 1.
                    const unsigned int sl = s + 1 < parts ? 2 * (b_lo + s) + 1 : slot_last;
                    const unsigned int p = sl * HEADS + h;
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
        part_acc[s_slot] = a;
        part_ml[s_slot] = make_float2(mm, ll);
    }
    __syncthreads();
    for (unsigned int col = tid; col < cols; col += THREADS) {
        const unsigned int h = col >> 5, c4 = col & 31u;
        float mm = NEG_INF;
        for (unsigned int r = 0; r < fold; ++r) mm = fmaxf(mm, part_ml[col + r * cols].x);
        const float ms = mm == NEG_INF ? 0.0f : mm;
        float ll = 0.0f;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (unsigned int r = 0; r < fold; ++r) {
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
    if (tid == 0) arrivals[b_lo] = 0;  // ready for the next launch (stream-ordered)
    __syncthreads();  // the scratch is free again when this returns
}

extern "C" __global__ void __launch_bounds__(THREADS)
gqa_decode_f16(const __half* __restrict__ q, const __half* __restrict__ k,
               const __half* __restrict__ v, __half* __restrict__ out, unsigned int batch,
               unsigned int q_heads, unsigned int kv_heads, unsigned int seq_len) {
    // WARPS rings of RING_BYTES (the launch rule's smem); reused by the merges.
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ float2 sm_ml[WARPS][HEADS];
    __shared__ uint4 sm_q[2][4][32];  // Q fragments of the block's two work items
    __shared__ unsigned int row_off[WARPS];
    __shared__ bool sm_last;

    const unsigned int group_size = q_heads / kv_heads;
    const unsigned int chunks = (group_size + HEADS - 1) / HEADS;
    const unsigned int items = batch * kv_heads * chunks;
    const unsigned int tiles = (seq_len + TILE - 1) / TILE;  // per item
    const unsigned long long total = (unsigned long long)items * tiles;
    if (total > 0xffffffffull) __trap();  // tile indices are 32-bit
    // The ranges are cut for min(grid, tiles) blocks, so that none is empty (an empty block
    // between an item's first and last would never arrive); blocks past that return.
    const unsigned int blocks = (unsigned int)min((unsigned long long)gridDim.x, total);
    const unsigned int blk = blockIdx.x;
    if (blk >= blocks) return;
    const unsigned int t0 = (unsigned int)mul_div(blk, total, blocks);
    const unsigned int t1 = (unsigned int)mul_div(blk + 1, total, blocks);
    // With at least as many blocks as items a range is at most one item long, so it touches
    // one or two; the launch rule never asks for fewer blocks than items.
    const unsigned int i0 = t0 / tiles, i1 = (t1 - 1) / tiles;
    if (i1 > i0 + 1) __trap();
    const unsigned int boundary = i1 > i0 ? i1 * tiles : t1;  // first tile of segment 1

    const unsigned int tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned int g = lane >> 2, t = lane & 3u;  // mma group and thread in group

    const Segment seg0 = segment(k, v, i0, chunks, tiles, seq_len, t1);
    const Segment seg1 = segment(k, v, i1, chunks, tiles, seq_len, t1);

    unsigned char* ring = smem + warp * RING_BYTES;
    const unsigned int ring_s = smem_addr(ring);
    // This warp's tiles are t0 + warp + i * WARPS in the flat order; tile i lives in stage
    // i % STAGES. Prologue: tiles 0 .. STAGES - 2, one commit group each (empty past t1, so
    // that the group count stays uniform), issued before Q is staged. The ring runs on
    // across the two segments: a copy is issued from whichever item its tile belongs to.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        const unsigned int f = t0 + s * WARPS + warp;
        if (f < t1) issue_flat(ring_s + s * TILE_BYTES, seg0, seg1, boundary, f, lane);
        cp_async_commit();
    }

    // A fragment of Q for each segment's item (warp s stages segment s's): row g is query
    // head h0 + g (zero past the group); k-step 2i + j covers the dimensions of 16-byte
    // chunk 4i + t (halves 4j..4j+3) in every lane.
    if (warp < 2) {
        const unsigned int item = warp == 0 ? i0 : i1;
        const unsigned int chunk = item % chunks, bkv = item / chunks;
        const unsigned int b = bkv / kv_heads, kvh = bkv % kv_heads;
        const unsigned int h0 = kvh * group_size + chunk * HEADS;
        const unsigned int nh = min((unsigned int)HEADS, group_size - chunk * HEADS);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint4 u = make_uint4(0, 0, 0, 0);
            if (g < nh)
                u = *reinterpret_cast<const uint4*>(
                    q + ((size_t)b * q_heads + h0 + g) * HEAD_DIM + (4 * i + t) * 8);
            sm_q[warp][i][lane] = u;
        }
    }
    __syncthreads();

    float m = NEG_INF, l = 0.0f;
    float o[16][2];
#pragma unroll
    for (int d = 0; d < 16; ++d) o[d][0] = o[d][1] = 0.0f;

    unsigned int stage = 0, f = t0 + warp;
#pragma unroll
    for (int s = 0; s < 2; ++s) {
        const unsigned int end = s == 0 ? boundary : t1;
        const Segment cur = s == 0 ? seg0 : seg1;
        // Warp-uniform loop (every mma, shuffle and __syncwarp has all 32 lanes).
        for (; f < end; f += WARPS) {
            // Tile i's group has landed (this lane's copies), and after __syncwarp every
            // lane's; every lane has also finished reading tile i - 1, whose stage is
            // refilled with tile i + STAGES - 1 before tile i is computed.
            cp_async_wait<STAGES - 2>();
            __syncwarp();
            const unsigned int next = f + (STAGES - 1) * WARPS;
            const unsigned int refill = stage == 0 ? STAGES - 1 : stage - 1;
            if (next < t1)
                issue_flat(ring_s + refill * TILE_BYTES, seg0, seg1, boundary, next, lane);
            cp_async_commit();
            uint4 kk[2][4], vv[4][2];
            read_tile(kk, vv, ring + stage * TILE_BYTES, g, t);
            tile_step(kk, vv, sm_q[s], (f - cur.first) * TILE, cur.k1, lane, t, m, l, o);
            stage = stage + 1 == STAGES ? 0 : stage + 1;
        }
        const bool last = s == 1 || boundary == t1;
        // Segment 0 of a block with two: each warp flushes its state into the stage of its
        // last computed tile (free: the next copies go to the others, still in flight) and
        // the block merges them while segment 1's first tiles land. The last segment is
        // merged through the ring once every copy has landed.
        unsigned int own;
        if (last) {
            cp_async_wait<0>();
            __syncthreads();
            own = warp * (HEADS * ROW * 4);
        } else {
            __syncwarp();  // every lane has read the stage about to be written
            own = warp * RING_BYTES + (stage == 0 ? STAGES - 1 : stage - 1) * TILE_BYTES;
        }
        flush_state(reinterpret_cast<float (*)[ROW]>(smem + own), sm_ml[warp], m, l, o, g, t);
        if (lane == 0) row_off[warp] = own;
        __syncthreads();

        const unsigned int item = cur.item, chunk = item % chunks, bkv = item / chunks;
        const unsigned int b = bkv / kv_heads, kvh = bkv % kv_heads;
        const unsigned int h0 = kvh * group_size + chunk * HEADS;
        const unsigned int nh = min((unsigned int)HEADS, group_size - chunk * HEADS);
        const unsigned int item_t0 = item * tiles, item_end = item_t0 + tiles;
        const bool whole = item_t0 >= t0 && item_end <= t1;
        unsigned int b_lo = blk, parts = 1, slot = 0, slot_last = 0;
        if (!whole) {
            // The item's blocks: block of tile x = ((x + 1) G - 1) / total.
            b_lo = (unsigned int)mul_div(item_t0 + 1, blocks, total) -
                   ((item_t0 + 1) * (unsigned long long)blocks % total == 0 ? 1 : 0);
            const unsigned int b_hi =
                (unsigned int)mul_div(item_end, blocks, total) -
                (item_end * (unsigned long long)blocks % total == 0 ? 1 : 0);
            parts = b_hi - b_lo + 1;
            // Slot 2b + 1 for the block's last item (it ends with the item's end or inside
            // it), 2b for its first when that ends inside the block.
            slot = t1 <= item_end ? 2 * blk + 1 : 2 * blk;
            slot_last = mul_div(b_hi + 1, total, blocks) <= item_end ? 2 * b_hi + 1 : 2 * b_hi;
            if (blk >= MAX_BLOCKS) __trap();  // the launch rule never asks for this
        }
        // The split merge's scratch: warp 0's rows, read by now (after emit_item's barrier).
        emit_item(smem, row_off, sm_ml, &sm_last, smem + row_off[0], out, q_heads, b, h0, nh,
                  whole, slot, b_lo, parts, slot_last);
        if (last) break;
        // Every read of the flushed stages is done before any warp refills its stage.
        __syncthreads();
        m = NEG_INF;
        l = 0.0f;
#pragma unroll
        for (int d = 0; d < 16; ++d) o[d][0] = o[d][1] = 0.0f;
    }
}
