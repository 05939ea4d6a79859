// Sum of a vector into one float: a grid-stride loop per thread, a block reduction in
// shared memory, and one atomicAdd per block. `out` is accumulated into (out += sum(x)).
#include "common.cuh"

extern "C" __global__ void reduce_sum_f32(const float* __restrict__ x, float* out,
                                          unsigned long long n) {
    __shared__ float scratch[32];
    float s = 0.0f;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        s += x[i];
    s = block_reduce<false>(s, scratch);
    if (threadIdx.x == 0) atomicAdd(out, s);
}
