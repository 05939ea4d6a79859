#line 1 "kernels/reduce_sum.cu"
// Sum of a vector into one float: a grid-stride loop per thread, a block reduction in
// shared memory, and one atomicAdd per block. `out` is accumulated into (out += sum(x)).
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
#line 4 "kernels/reduce_sum.cu"

extern "C" __global__ void reduce_sum_f32(const float* __restrict__ x, float* out,
                                          unsigned long long n) {
    __shared__ float scratch[32];
    float s = 0.0f;
    #pragma unroll 8
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        s += x[i];
    s = block_reduce<false>(s, scratch);
    if (threadIdx.x == 0) atomicAdd(out, s);
}

