// Grouped-query attention, one decode step, fp16 (head dim 128), flash-decoding style.
//
// Work item = (batch, kv head, group of up to 4 of the query heads sharing that KV head):
// each K and V row is read once for all of them. The sequence is split over gridDim.x
// blocks (the launch rule picks the split so that about 512 blocks fill the 132 SMs);
// blockIdx.y is the work item.
//
// In a block, 16 key groups (half-warps) stream keys; a key group's 16 lanes each hold
// 8 of the 128 dimensions (one 16-byte load of K and of V per key), reduce the 4 dot
// products with 4 shuffles, and keep an online softmax (max, sum, 4 x 8 accumulators).
// The 16 key groups merge through shared memory. With one split the block writes the
// output; otherwise it writes its partial (max, sum, 128 accumulators per head) to a
// module-scope scratch area, and the last block of the work item to finish (atomic
// counter after __threadfence) merges the splits and writes the output, then resets the
// counter for the next launch.
#include <cuda_fp16.h>

#define NEG_INF __int_as_float(0xff800000)
#define HEAD_DIM 128
#define HEADS 4            // query heads per block
#define THREADS 256
#define GROUPS (THREADS / 16)  // key groups per block
#ifndef KEYS
#define KEYS 2             // keys per key group per iteration (loads in flight)
#endif
// Scratch capacity. The launch rule keeps (work items) * (splits) below 1024 whenever
// there is more than one split, and so the work items below 512.
#define MAX_ITEMS 512
#define MAX_PARTIALS (1024 * HEADS)
// softmax scale 1/sqrt(128) times log2(e): scores are kept in the exp2 domain.
#define SCALE_LOG2E 0.12751743074790924f

__device__ float partial_acc[MAX_PARTIALS * HEAD_DIM];
__device__ float2 partial_ml[MAX_PARTIALS];
__device__ unsigned int arrivals[MAX_ITEMS];

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void unpack(const uint4& u, float f[8]) {
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 t = __half22float2(h[j]);
        f[2 * j] = t.x;
        f[2 * j + 1] = t.y;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
gqa_decode_f16(const __half* __restrict__ q, const __half* __restrict__ k,
               const __half* __restrict__ v, __half* __restrict__ out, unsigned int batch,
               unsigned int q_heads, unsigned int kv_heads, unsigned int seq_len) {
    __shared__ __align__(16) float sm_acc[GROUPS][HEADS][HEAD_DIM];
    __shared__ float2 sm_ml[GROUPS][HEADS];
    __shared__ bool sm_last;

    const unsigned int group_size = q_heads / kv_heads;
    const unsigned int chunks = (group_size + HEADS - 1) / HEADS;
    const unsigned int item = blockIdx.y;  // (b * kv_heads + kvh) * chunks + chunk
    const unsigned int chunk = item % chunks;
    const unsigned int bkv = item / chunks;  // b * kv_heads + kvh
    const unsigned int b = bkv / kv_heads, kvh = bkv % kv_heads;
    const unsigned int h0 = kvh * group_size + chunk * HEADS;  // first query head
    const unsigned int nh = min(HEADS, group_size - chunk * HEADS);
    const unsigned int splits = gridDim.x, split = blockIdx.x;
    if (splits > 1 && (gridDim.y > MAX_ITEMS || splits * gridDim.y * HEADS > MAX_PARTIALS))
        __trap();  // the launch rule never asks for this; never overrun the scratch

    const unsigned int per = (seq_len + splits - 1) / splits;
    const unsigned int k0 = min(seq_len, split * per), k1 = min(seq_len, k0 + per);

    const unsigned int tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned int sub = lane & 15u;          // which 8 dimensions
    const unsigned int half_id = lane >> 4;       // which key of the warp's pair
    const unsigned int g = warp * 2 + half_id;    // key group

    // This lane's 8 dimensions of each query head, pre-scaled.
    float qf[HEADS][8];
#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
        if (h < (int)nh) {
            const uint4 u = *reinterpret_cast<const uint4*>(
                q + ((size_t)b * q_heads + h0 + h) * HEAD_DIM + sub * 8);
            unpack(u, qf[h]);
#pragma unroll
            for (int j = 0; j < 8; ++j) qf[h][j] *= SCALE_LOG2E;
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) qf[h][j] = 0.0f;
        }
    }

    float m[HEADS], l[HEADS], acc[HEADS][8];
#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
        m[h] = NEG_INF;
        l[h] = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[h][j] = 0.0f;
    }

    const uint4* kr = reinterpret_cast<const uint4*>(k + (size_t)bkv * seq_len * HEAD_DIM) + sub;
    const uint4* vr = reinterpret_cast<const uint4*>(v + (size_t)bkv * seq_len * HEAD_DIM) + sub;
    // The loop bound is uniform over the warp (warp's first key), so every shuffle has
    // all 32 lanes; keys past k1 are masked.
    for (unsigned int base = k0 + warp * 2; base < k1; base += GROUPS * KEYS) {
        uint4 kk[KEYS], vv[KEYS];
#pragma unroll
        for (int u = 0; u < KEYS; ++u) {
            const unsigned int key = base + half_id + u * GROUPS;
            if (key < k1) {
                kk[u] = __ldg(kr + (size_t)key * (HEAD_DIM / 8));
                vv[u] = __ldg(vr + (size_t)key * (HEAD_DIM / 8));
            } else {
                kk[u] = make_uint4(0, 0, 0, 0);
                vv[u] = make_uint4(0, 0, 0, 0);
            }
        }
        float s[KEYS][HEADS];
#pragma unroll
        for (int u = 0; u < KEYS; ++u) {
            float kf[8];
            unpack(kk[u], kf);
#pragma unroll
            for (int h = 0; h < HEADS; ++h) {
                float d = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; ++j) d = fmaf(qf[h][j], kf[j], d);
                s[u][h] = d;
            }
        }
#pragma unroll
        for (int off = 8; off > 0; off >>= 1)
#pragma unroll
            for (int u = 0; u < KEYS; ++u)
#pragma unroll
                for (int h = 0; h < HEADS; ++h)
                    s[u][h] += __shfl_xor_sync(0xffffffffu, s[u][h], off);
#pragma unroll
        for (int u = 0; u < KEYS; ++u)
            if (base + half_id + u * GROUPS >= k1)
#pragma unroll
                for (int h = 0; h < HEADS; ++h) s[u][h] = NEG_INF;

        float vf[KEYS][8];
#pragma unroll
        for (int u = 0; u < KEYS; ++u) unpack(vv[u], vf[u]);
#pragma unroll
        for (int h = 0; h < HEADS; ++h) {
            float mx = m[h];
#pragma unroll
            for (int u = 0; u < KEYS; ++u) mx = fmaxf(mx, s[u][h]);
            const float ms = mx == NEG_INF ? 0.0f : mx;  // all masked so far: no NaN
            const float corr = ex2(m[h] - ms);
            l[h] *= corr;
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[h][j] *= corr;
#pragma unroll
            for (int u = 0; u < KEYS; ++u) {
                const float p = ex2(s[u][h] - ms);
                l[h] += p;
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[h][j] = fmaf(p, vf[u][j], acc[h][j]);
            }
            m[h] = mx;
        }
    }

    // Merge the 16 key groups. Lanes of one key group hold identical (m, l).
#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
        if (sub == 0) sm_ml[g][h] = make_float2(m[h], l[h]);
        float4* dst = reinterpret_cast<float4*>(&sm_acc[g][h][sub * 8]);
        dst[0] = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
        dst[1] = make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
    }
    __syncthreads();

    const bool direct = splits == 1;
    // Thread t produces (head, dim) = (t / 128, t % 128) and (t / 128 + 2, t % 128).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const unsigned int h = (tid >> 7) + 2 * r, d = tid & 127u;
        if (h >= nh) continue;
        float mm = NEG_INF;
#pragma unroll
        for (int i = 0; i < GROUPS; ++i) mm = fmaxf(mm, sm_ml[i][h].x);
        const float ms = mm == NEG_INF ? 0.0f : mm;
        float ll = 0.0f, a = 0.0f;
#pragma unroll
        for (int i = 0; i < GROUPS; ++i) {
            const float w = ex2(sm_ml[i][h].x - ms);
            ll = fmaf(sm_ml[i][h].y, w, ll);
            a = fmaf(sm_acc[i][h][d], w, a);
        }
        if (direct) {
            out[((size_t)b * q_heads + h0 + h) * HEAD_DIM + d] = __float2half(a / ll);
        } else {
            const unsigned int p = (item * splits + split) * HEADS + h;
            partial_acc[(size_t)p * HEAD_DIM + d] = a;
            if (d == 0) partial_ml[p] = make_float2(mm, ll);
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
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const unsigned int h = (tid >> 7) + 2 * r, d = tid & 127u;
        if (h >= nh) continue;
        const unsigned int p0 = item * splits * HEADS + h;
        float mm = NEG_INF;
        for (unsigned int s = 0; s < splits; ++s) mm = fmaxf(mm, __ldcg(&partial_ml[p0 + s * HEADS]).x);
        const float ms = mm == NEG_INF ? 0.0f : mm;
        float ll = 0.0f, a = 0.0f;
        for (unsigned int s = 0; s < splits; ++s) {
            const unsigned int p = p0 + s * HEADS;
            const float2 ml = __ldcg(&partial_ml[p]);
            const float w = ex2(ml.x - ms);
            ll = fmaf(ml.y, w, ll);
            a = fmaf(__ldcg(&partial_acc[(size_t)p * HEAD_DIM + d]), w, a);
        }
        out[((size_t)b * q_heads + h0 + h) * HEAD_DIM + d] = __float2half(a / ll);
    }
    if (tid == 0) arrivals[item] = 0;  // ready for the next launch (stream-ordered)
}
