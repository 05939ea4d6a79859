// Grouped-query attention, one decode step, fp16, over a paged KV cache (the layout of
// vLLM, mistral.rs and candle's paged attention).
// q: [batch, q_heads, HEAD_DIM]; k_cache, v_cache: [num_pages, kv_heads, page_size, HEAD_DIM],
// each (page, KV head) a contiguous page_size x HEAD_DIM tile; block_table: [batch,
// max_pages] page indices; seq_lens: [batch]; out: [batch, q_heads, HEAD_DIM].
// Position p of sequence b is row p % page_size of page block_table[b * max_pages +
// p / page_size]. q_heads / kv_heads (at most MAX_GROUP) query heads share one KV head.
//
// One block per (sequence, KV head), HEAD_DIM threads: the block serves the group of query
// heads that share the KV head, so each K and V row is read once for all of them. The
// sequence is walked in steps of STEP keys with an online softmax in fp32 (running max
// and sum per head, the accumulators rescaled when the max grows), so shared memory does
// not grow with the sequence. Per step:
//   1. the row offset of each key of the step (one block-table lookup per key);
//   2. scores: warp w takes keys w, w + WARPS, ...; each lane holds 4 dimensions of q
//      (fp32, scale folded in) for every head and reads 8 bytes of the key's row, the
//      dot products reduced across the warp;
//   3. softmax update: one warp per head turns the step's scores into probabilities
//      against the new running max, and the factor that rescales the old accumulators;
//   4. output: thread d accumulates dimension d of every head over the step's V rows.
#include "common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#define MAX_GROUP 8                 // query heads per KV head, at most
#define WARPS (HEAD_DIM / 32)       // the block is HEAD_DIM threads
#define STEP 64                     // keys per step
#define KEYS_PER_WARP (STEP / WARPS)

extern "C" __global__ void paged_decode_f16(const __half* __restrict__ q,
                                            const __half* __restrict__ k_cache,
                                            const __half* __restrict__ v_cache,
                                            const int* __restrict__ block_table,
                                            const int* __restrict__ seq_lens,
                                            __half* __restrict__ out, unsigned int q_heads,
                                            unsigned int kv_heads, unsigned int page_size,
                                            unsigned int max_pages) {
    __shared__ size_t rows[STEP];            // element offset of each key's row in the caches
    __shared__ float p[MAX_GROUP][STEP];     // the step's scores, then probabilities
    __shared__ float corr[MAX_GROUP];        // rescale of the accumulators at this step
    __shared__ float m_run[MAX_GROUP];       // running max of the scores, per head
    __shared__ float l_run[MAX_GROUP];       // running sum of exp(score - max), per head

    const unsigned int b = blockIdx.x / kv_heads, kvh = blockIdx.x % kv_heads;
    const unsigned int group = q_heads / kv_heads;
    const unsigned int h0 = kvh * group;  // first query head of the group
    const unsigned int tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const int* table = block_table + (size_t)b * max_pages;
    // Positions past the table's pages are not in the cache: never read them.
    const unsigned int len = min((unsigned int)max(seq_lens[b], 0), max_pages * page_size);

    // q, dimensions 4 lane .. 4 lane + 3 of each head, scaled by 1/sqrt(HEAD_DIM).
    const float scale = rsqrtf((float)HEAD_DIM);
    float qr[MAX_GROUP][4];
#pragma unroll
    for (int h = 0; h < MAX_GROUP; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i)
            qr[h][i] = h < (int)group
                           ? __half2float(q[((size_t)b * q_heads + h0 + h) * HEAD_DIM + 4 * lane + i]) * scale
                           : 0.0f;
    float acc[MAX_GROUP];
#pragma unroll
    for (int h = 0; h < MAX_GROUP; ++h) acc[h] = 0.0f;
    if (tid < MAX_GROUP) {
        m_run[tid] = NEG_INF;
        l_run[tid] = 0.0f;
    }
    // Rows of p past the group stay 0 (steps 2 and 3 write the group's only), so step 4
    // can run every head's multiply-add unpredicated.
    for (unsigned int i = tid; i < MAX_GROUP * STEP; i += blockDim.x) (&p[0][0])[i] = 0.0f;

    for (unsigned int s0 = 0; s0 < len; s0 += STEP) {
        const unsigned int n = min((unsigned int)STEP, len - s0);
        // 1. Row offsets.
        if (tid < n) {
            const unsigned int pos = s0 + tid;
            const size_t page = (size_t)table[pos / page_size];
            rows[tid] = ((page * kv_heads + kvh) * page_size + pos % page_size) * HEAD_DIM;
        }
        __syncthreads();

        // 2. Scores: the warp's keys loaded first (all in flight), then the dot products.
        uint2 kraw[KEYS_PER_WARP];
#pragma unroll
        for (int i = 0; i < KEYS_PER_WARP; ++i) {
            const unsigned int j = warp + i * WARPS;
            kraw[i] = j < n ? *reinterpret_cast<const uint2*>(k_cache + rows[j] + 4 * lane)
                            : make_uint2(0u, 0u);
        }
#pragma unroll
        for (int i = 0; i < KEYS_PER_WARP; ++i) {
            const unsigned int j = warp + i * WARPS;
            if (j >= n) break;  // warp-uniform
            const float2 k01 = __half22float2(*reinterpret_cast<const __half2*>(&kraw[i].x));
            const float2 k23 = __half22float2(*reinterpret_cast<const __half2*>(&kraw[i].y));
#pragma unroll
            for (int h = 0; h < MAX_GROUP; ++h) {
                if (h >= (int)group) break;
                float d = qr[h][0] * k01.x + qr[h][1] * k01.y + qr[h][2] * k23.x + qr[h][3] * k23.y;
                d = warp_sum(d);
                if (lane == 0) p[h][j] = d;
            }
        }
        __syncthreads();

        // 3. Softmax update: warp w takes heads w, w + WARPS, ...; lane l keys l, l + 32.
        for (unsigned int h = warp; h < group; h += WARPS) {
            const float m_old = m_run[h];
            const float s_a = lane < n ? p[h][lane] : NEG_INF;
            const float s_b = lane + 32 < n ? p[h][lane + 32] : NEG_INF;
            const float m_new = fmaxf(m_old, warp_max(fmaxf(s_a, s_b)));  // finite: n >= 1
            const float e_a = lane < n ? __expf(s_a - m_new) : 0.0f;
            const float e_b = lane + 32 < n ? __expf(s_b - m_new) : 0.0f;
            p[h][lane] = e_a;
            p[h][lane + 32] = e_b;
            const float sum = warp_sum(e_a + e_b);
            __syncwarp();  // every lane has read m_run[h] before lane 0 updates it
            if (lane == 0) {
                const float c = __expf(m_old - m_new);  // 0 at the first step
                corr[h] = c;
                l_run[h] = l_run[h] * c + sum;
                m_run[h] = m_new;
            }
        }
        __syncthreads();

        // 4. Output: thread tid is dimension tid of every head of the group.
#pragma unroll
        for (int h = 0; h < MAX_GROUP; ++h)
            if (h < (int)group) acc[h] *= corr[h];
#pragma unroll 16
        for (unsigned int j = 0; j < n; ++j) {
            const float v = __half2float(v_cache[rows[j] + tid]);
#pragma unroll
            for (int h = 0; h < MAX_GROUP; ++h) acc[h] += p[h][j] * v;
        }
        __syncthreads();  // before the next step overwrites rows and p
    }

#pragma unroll
    for (int h = 0; h < MAX_GROUP; ++h) {
        if (h >= (int)group) break;
        const float l = l_run[h];  // 0 for an empty sequence: write zeros
        out[((size_t)b * q_heads + h0 + h) * HEAD_DIM + tid] = __float2half(l > 0.0f ? acc[h] / l : 0.0f);
    }
}
