// Grouped-query attention, one decode step, fp16 (head dim 128), flash-decoding style on
// the tensor cores, with the work balanced stream-K style over one wave of blocks.
//
// Work item = (batch, kv head, group of up to 8 of the query heads sharing that KV head):
// each K and V row is read once for all of them. A work item's keys are cut into tiles of
// 16; the (work item, tile) pairs, item-major, form one flat range of
// T = items * ceil(seq_len / 16) tiles, and block b of the G = gridDim.x blocks (the
// launch rule: G = min(WAVE_BLOCKS, T), WAVE_BLOCKS = 132, one block per SM) takes the
// contiguous tiles [b T / G, (b + 1) T / G): every block streams the same number of tiles
// (to one), whether or not items * splits fills the SMs, and its range may run from the
// end of one work item into the next (a "piece" per work item it touches).
//
// Each of the 8 warps of a block streams tiles of 16 keys of a piece (its own online
// softmax):
//   scores  S[8 heads x 16 keys] = Q[heads x 128] K^T    (16 mma.m16n8k16, rows 8..15 zero)
//   output  O[8 heads x 128]    += P[heads x 16 keys] V  (16 mma.m16n8k16)
// The head dimension's order inside an mma is free (a dot product does not care), so every
// lane loads whole 16-byte chunks straight from global memory into its fragments: K as the
// B operand of the scores (lane (g, t) holds key g, chunks t, t+4, t+8, t+12), V as the B
// operand of the output (lane (g, t) holds chunks g and g+8 of keys 2t, 2t+1, 2t+8, 2t+9,
// paired across keys with one byte-permute per register). The score fragment of the
// scores mma is, after the softmax, the P fragment of the output mma (as in FlashAttention
// 2), so the softmax needs 2 shuffles per tile and one ex2 per score: no per-key shuffles.
// Per lane and step: two tiles' 32 loads of 16 bytes issued before the first use (16 KB
// per warp, 8 warps per SM).
//
// The 8 warps merge a piece through shared memory. When the piece is the whole work item
// the block writes the output; otherwise it writes the piece's partial (max, sum, 128
// accumulators per head) to a module-scope scratch area, and the last block of the work
// item to finish (atomic counter after __threadfence) merges the pieces with all its
// threads and writes the output, then resets the counter for the next launch.
//
// Scratch indexing, bounded by G alone (not by the shape): only a block's first and last
// work items can be partial pieces (the ones between are whole, written directly), so the
// partial of block b's piece of item i is slot 2b + (i is not b's first item). A work item
// split over blocks f..l has pieces in slots (2f or 2f + 1), 2(f + 1), ..., 2l: blocks
// after f start inside it. Its counter is arrivals[f]: two split items never share their
// first block (the earlier one would end inside f and so be whole in f).
#include <cuda_fp16.h>

#define NEG_INF __int_as_float(0xff800000)
#define HEAD_DIM 128
#define HEADS 8            // query heads per work item (rows of the mma's A operand)
#define WARPS 8
#define THREADS (WARPS * 32)
#define TILE 16            // keys per warp per step
#define ROW (HEAD_DIM + 4) // padded shared-memory row: fewer bank conflicts, 16-byte rows
// Scratch capacity (4 MB): 2 partial slots of HEADS heads per block, for grids of up to
// MAX_BLOCKS blocks (the launch rule asks for at most WAVE_BLOCKS = 132).
#define MAX_BLOCKS 512
#define MAX_SLOTS (2 * MAX_BLOCKS)
// softmax scale 1/sqrt(128) times log2(e): scores are kept in the exp2 domain.
#define SCALE_LOG2E 0.12751743074790924f

__device__ float partial_acc[MAX_SLOTS * HEADS * HEAD_DIM];
__device__ float2 partial_ml[MAX_SLOTS * HEADS];
__device__ unsigned int arrivals[MAX_BLOCKS];

// PTX-BEGIN: streaming load, exp2, and the tensor-core step.
// 16 bytes of K or V: read once, so not kept in L1; the L2 fetches 256-byte segments.
__device__ __forceinline__ uint4 ld_stream(const __half* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
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

// One warp's tile of 16 keys from `base` (keys past k1 read key k1 - 1 instead: finite,
// and masked to probability 0 by tile_step). K as the B fragments of the scores mma:
// key base + 8nt + g, chunks 4i + t. V as the raw chunks g and g + 8 of keys
// base + 2t, 2t+1, 2t+8, 2t+9.
__device__ __forceinline__ void load_tile(uint4 (&kk)[2][4], uint4 (&vv)[4][2],
                                          const __half* kb, const __half* vb,
                                          unsigned int base, unsigned int k1,
                                          unsigned int g, unsigned int t) {
    const unsigned int last = k1 - 1;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
        const unsigned int key = min(base + 8 * nt + g, last);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            kk[nt][i] = ld_stream(kb + (size_t)key * HEAD_DIM + (4 * i + t) * 8);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const unsigned int key = min(base + (c >> 1) * 8 + 2 * t + (c & 1), last);
        vv[c][0] = ld_stream(vb + (size_t)key * HEAD_DIM + g * 8);
        vv[c][1] = ld_stream(vb + (size_t)key * HEAD_DIM + 64 + g * 8);
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

// First tile of block `blk`'s range: floor(blk * total / blocks).
__device__ __forceinline__ unsigned int range_start(unsigned int blk, unsigned int total,
                                                    unsigned int blocks) {
    return (unsigned int)((unsigned long long)blk * total / blocks);
}

// The block whose range holds tile x: the largest blk with range_start(blk) <= x, i.e.
// blk * total < (x + 1) * blocks.
__device__ __forceinline__ unsigned int tile_owner(unsigned int x, unsigned int total,
                                                   unsigned int blocks) {
    return (unsigned int)((((unsigned long long)x + 1) * blocks - 1) / total);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
gqa_decode_f16(const __half* __restrict__ q, const __half* __restrict__ k,
               const __half* __restrict__ v, __half* __restrict__ out, unsigned int batch,
               unsigned int q_heads, unsigned int kv_heads, unsigned int seq_len) {
    __shared__ __align__(16) float sm_o[WARPS][HEADS][ROW];
    __shared__ float2 sm_ml[WARPS][HEADS];
    __shared__ uint4 sm_q[4][32];
    __shared__ bool sm_last;

    const unsigned int group_size = q_heads / kv_heads;
    const unsigned int chunks = (group_size + HEADS - 1) / HEADS;
    const unsigned int items = batch * kv_heads * chunks;
    const unsigned int tiles = (seq_len + TILE - 1) / TILE;  // key tiles per work item
    const unsigned long long total64 = (unsigned long long)items * tiles;
    const unsigned int blocks = gridDim.x, blk = blockIdx.x;
    // The launch rule gives 1 <= blocks <= min(WAVE_BLOCKS, total): every block's range is
    // non-empty (total / blocks >= 1). Never overrun the scratch or run an empty block.
    if (blocks > MAX_BLOCKS || blocks > total64 || total64 > 0xffffffffull || gridDim.y != 1)
        __trap();
    const unsigned int total = (unsigned int)total64;
    const unsigned int r0 = range_start(blk, total, blocks);
    const unsigned int r1 = range_start(blk + 1, total, blocks);

    const unsigned int tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned int g = lane >> 2, t = lane & 3u;  // mma group and thread in group

    // One piece per work item the range touches: tiles [t0, t1) of `item`.
    for (unsigned int x = r0; x < r1;) {
        const unsigned int item = x / tiles;  // (b * kv_heads + kvh) * chunks + chunk
        const unsigned int t0 = x - item * tiles, t1 = min(tiles, r1 - item * tiles);
        x = item * tiles + t1;
        const unsigned int chunk = item % chunks;
        const unsigned int bkv = item / chunks;  // b * kv_heads + kvh
        const unsigned int b = bkv / kv_heads, kvh = bkv % kv_heads;
        const unsigned int h0 = kvh * group_size + chunk * HEADS;  // first query head
        const unsigned int nh = min((unsigned int)HEADS, group_size - chunk * HEADS);
        const unsigned int k0 = t0 * TILE, k1 = min(seq_len, t1 * TILE);

        __syncthreads();  // the previous piece's reads of sm_q, sm_o, sm_ml, sm_last are done

        // A fragment of Q: row g is query head h0 + g (zero past the group); k-step 2i + j
        // covers the dimensions of 16-byte chunk 4i + t (halves 4j..4j+3) in every lane.
        // Kept in shared memory (the same for every warp, read as one 16-byte word per lane
        // and chunk), not in 16 registers: the loop's registers go to loads in flight.
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

        // Row g's running max (identical in the 4 lanes of a group), this lane's share of
        // the sum, and o[d][j] = O[head g][dim D(d, 2t + j)], D(d, n) = 8n + d (d < 8) or
        // 64 + 8n + d - 8 (d >= 8): the dims the V chunks of lane group n hold.
        float m = NEG_INF, l = 0.0f;
        float o[16][2];
#pragma unroll
        for (int d = 0; d < 16; ++d) o[d][0] = o[d][1] = 0.0f;

        const __half* kb = k + (size_t)bkv * seq_len * HEAD_DIM;
        const __half* vb = v + (size_t)bkv * seq_len * HEAD_DIM;
        // Warp-uniform loop (every mma and shuffle has all 32 lanes). Two tiles' 32 loads
        // (16 KB per warp) are issued before the first is used; the second tile's loads
        // stay in flight while the first is computed.
        uint4 ka[2][4], va[4][2], kn[2][4], vn[4][2];
        for (unsigned int base = k0 + warp * TILE; base < k1; base += 2 * WARPS * TILE) {
            const unsigned int b1 = base + WARPS * TILE;
            load_tile(ka, va, kb, vb, base, k1, g, t);
            if (b1 < k1) load_tile(kn, vn, kb, vb, b1, k1, g, t);
            tile_step(ka, va, sm_q, base, k1, lane, t, m, l, o);
            if (b1 < k1) tile_step(kn, vn, sm_q, b1, k1, lane, t, m, l, o);
        }

        // Merge the 8 warps. The 4 lanes of a group hold row g's max and parts of its sum.
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

        // Blocks first..last hold this item's pieces; one piece: the whole item, direct.
        const unsigned int first = tile_owner(item * tiles, total, blocks);
        const unsigned int last = tile_owner(item * tiles + tiles - 1, total, blocks);
        const unsigned int pieces = last - first + 1;
        const bool direct = pieces == 1;
        // Warp w produces head w, lane c4 its dims 4 c4 .. 4 c4 + 3.
        {
            const unsigned int h = warp, c4 = lane;
            if (h < nh) {
                float mm = NEG_INF;
#pragma unroll
                for (int w = 0; w < WARPS; ++w) mm = fmaxf(mm, sm_ml[w][h].x);
                const float ms = mm == NEG_INF ? 0.0f : mm;  // empty warp: no NaN
                float ll = 0.0f;
                float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int w = 0; w < WARPS; ++w) {
                    const float2 ml = sm_ml[w][h];
                    const float wt = ex2(ml.x - ms);
                    const float4 xw = *reinterpret_cast<const float4*>(&sm_o[w][h][4 * c4]);
                    ll = fmaf(ml.y, wt, ll);
                    a.x = fmaf(xw.x, wt, a.x);
                    a.y = fmaf(xw.y, wt, a.y);
                    a.z = fmaf(xw.z, wt, a.z);
                    a.w = fmaf(xw.w, wt, a.w);
                }
                if (direct) {
                    const float inv = 1.0f / ll;
                    uint2 r;
                    r.x = pack_half2(a.x * inv, a.y * inv);
                    r.y = pack_half2(a.z * inv, a.w * inv);
                    *reinterpret_cast<uint2*>(out + ((size_t)b * q_heads + h0 + h) * HEAD_DIM +
                                              4 * c4) = r;
                } else {
                    // Slot 2 blk, or 2 blk + 1 for the second partial piece of the block.
                    const unsigned int slot = 2 * blk + (item != r0 / tiles);
                    const unsigned int p = slot * HEADS + h;
                    *reinterpret_cast<float4*>(&partial_acc[(size_t)p * HEAD_DIM + 4 * c4]) = a;
                    if (c4 == 0) partial_ml[p] = make_float2(mm, ll);
                }
            }
        }
        if (direct) continue;

        // Last block of the work item merges the pieces.
        __threadfence();
        __syncthreads();
        if (tid == 0) sm_last = atomicAdd(&arrivals[first], 1u) == pieces - 1;
        __syncthreads();
        if (!sm_last) continue;
        __threadfence();

        // Piece s's slot: 2 first (+ 1 when the item is block first's second partial), then
        // 2 (first + s): the later blocks start inside this item.
        const unsigned int slot0 = 2 * first + (item != range_start(first, total, blocks) / tiles);
        // nh * 32 columns (head, 4 dims); `parts` threads per column, each folding every
        // parts-th piece with an online max, 8 pieces' loads in flight; then one per column
        // folds the parts (through shared memory, reusing sm_o: all reads of it are done).
        const unsigned int cols = nh * 32, parts = THREADS / cols;
        const unsigned int col = tid % cols, part = tid / cols;
        const unsigned int h = col >> 5, c4 = col & 31u;
        float4* part_acc = reinterpret_cast<float4*>(&sm_o[0][0][0]);        // [THREADS]
        float2* part_ml = reinterpret_cast<float2*>(&sm_o[0][0][0] + 4 * THREADS);  // [THREADS]
        if (part < parts) {
            float mm = NEG_INF, ll = 0.0f;
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (unsigned int s0 = part; s0 < pieces; s0 += 8 * parts) {
                float2 ml[8];
                float4 xs[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    const unsigned int s = s0 + u * parts;
                    if (s < pieces) {
                        const unsigned int p = (s == 0 ? slot0 : 2 * (first + s)) * HEADS + h;
                        ml[u] = __ldcg(&partial_ml[p]);
                        xs[u] = __ldcg(reinterpret_cast<const float4*>(
                            &partial_acc[(size_t)p * HEAD_DIM + 4 * c4]));
                    } else {
                        ml[u] = make_float2(NEG_INF, 0.0f);
                        xs[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    }
                }
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    const float mn = fmaxf(mm, ml[u].x);
                    const float ms = mn == NEG_INF ? 0.0f : mn;
                    const float c = ex2(mm - ms), wt = ex2(ml[u].x - ms);
                    ll = fmaf(ll, c, ml[u].y * wt);
                    a.x = fmaf(a.x, c, xs[u].x * wt);
                    a.y = fmaf(a.y, c, xs[u].y * wt);
                    a.z = fmaf(a.z, c, xs[u].z * wt);
                    a.w = fmaf(a.w, c, xs[u].w * wt);
                    mm = mn;
                }
            }
            part_acc[tid] = a;
            part_ml[tid] = make_float2(mm, ll);
        }
        __syncthreads();
        if (part == 0) {
            float mm = NEG_INF;
            for (unsigned int r = 0; r < parts; ++r) mm = fmaxf(mm, part_ml[col + r * cols].x);
            const float ms = mm == NEG_INF ? 0.0f : mm;
            float ll = 0.0f;
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (unsigned int r = 0; r < parts; ++r) {
                const float2 ml = part_ml[col + r * cols];
                const float4 xp = part_acc[col + r * cols];
                const float wt = ex2(ml.x - ms);
                ll = fmaf(ml.y, wt, ll);
                a.x = fmaf(xp.x, wt, a.x);
                a.y = fmaf(xp.y, wt, a.y);
                a.z = fmaf(xp.z, wt, a.z);
                a.w = fmaf(xp.w, wt, a.w);
            }
            const float inv = 1.0f / ll;
            uint2 r;
            r.x = pack_half2(a.x * inv, a.y * inv);
            r.y = pack_half2(a.z * inv, a.w * inv);
            *reinterpret_cast<uint2*>(out + ((size_t)b * q_heads + h0 + h) * HEAD_DIM + 4 * c4) =
                r;
        }
        if (tid == 0) arrivals[first] = 0;  // ready for the next launch (stream-ordered)
    }
}
