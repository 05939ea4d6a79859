#line 1 "kernels/gqa_decode.cu"
// Grouped-query attention, one decode step, fp16, contiguous KV cache.
// q: [batch, q_heads, HEAD_DIM]; k, v: [batch, kv_heads, seq_len, HEAD_DIM];
// out: [batch, q_heads, HEAD_DIM]. q_heads / kv_heads query heads share one KV head.
// One block per (batch, query head), HEAD_DIM threads; the scores of the whole sequence
// sit in dynamic shared memory (seq_len floats).
#line 1 "kernels/common.cuh"
// Shared helpers for the example kernels.

#include <cuda_fp16.h>

// -inf without <math.h>, which NVRTC does not provide.
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll 8
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    #pragma unroll 8
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Block-wide reduction through shared memory; `scratch` holds one float per warp.
// Every thread gets the result.
template <bool IsMax>
__device__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = IsMax ? warp_max(v) : warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float r = IsMax ? NEG_INF : 0.0f;
    #pragma unroll 8
    for (int w = 0; w < warps; ++w) r = IsMax ? fmaxf(r, scratch[w]) : r + scratch[w];
    __syncthreads();
    return r;
}
#line 7 "kernels/gqa_decode.cu"

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif

extern "C" __global__ void gqa_decode_f16(const __half* __restrict__ q,
                                          const __half* __restrict__ k,
                                          const __half* __restrict__ v,
                                          __half* __restrict__ out, unsigned int batch,
                                          unsigned int q_heads, unsigned int kv_heads,
                                          unsigned int seq_len) {
    extern __shared__ float scores[];
    __shared__ float qs[HEAD_DIM];
    __shared__ float scratch[32];
    const unsigned int bh = blockIdx.x;  // b * q_heads + h
    const unsigned int b = bh / q_heads;
    const unsigned int h = bh % q_heads;
    const unsigned int kvh = h / (q_heads / kv_heads);
    const size_t kv_base = ((size_t)b * kv_heads + kvh) * seq_len * HEAD_DIM;
    const float scale = rsqrtf((float)HEAD_DIM);

    #pragma unroll 8
    for (unsigned int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x)
        qs[d] = __half2float(q[(size_t)bh * HEAD_DIM + d]);
    __syncthreads();

    // Scores: each thread takes whole keys.
    float m = NEG_INF;
    #pragma unroll 8
    for (unsigned int s = threadIdx.x; s < seq_len; s += blockDim.x) {
        const __half* kr = k + kv_base + (size_t)s * HEAD_DIM;
        float dot = 0.0f;
        #pragma unroll 8
        for (int d = 0; d < HEAD_DIM; ++d) dot += qs[d] * __half2float(kr[d]);
        dot *= scale;
        scores[s] = dot;
        m = fmaxf(m, dot);
    }
    m = block_reduce<true>(m, scratch);

    float sum = 0.0f;
    #pragma unroll 8
    for (unsigned int s = threadIdx.x; s < seq_len; s += blockDim.x) {
        const float p = __expf(scores[s] - m);
        scores[s] = p;
        sum += p;
    }
    sum = block_reduce<false>(sum, scratch);  // ends with a barrier: scores are visible

    // Output: thread d accumulates dimension d over the sequence.
    const float inv = 1.0f / sum;
    #pragma unroll 8
    for (unsigned int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
        float acc = 0.0f;
        #pragma unroll 8
        for (unsigned int s = 0; s < seq_len; ++s)
            acc += scores[s] * __half2float(v[kv_base + (size_t)s * HEAD_DIM + d]);
        out[(size_t)bh * HEAD_DIM + d] = __float2half(acc * inv);
    }
}

