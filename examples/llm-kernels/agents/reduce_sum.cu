// out[0] += sum(x), fp32: a grid-stride loop of 16-byte loads, UNROLL of them in flight
// per thread, warp-shuffle reductions, one atomicAdd per block. The launch rule gives
// 256-thread blocks, enough of them to fill the 132 SMs (8 per SM, 1056) when n is
// large, and one per 4096 floats (one float4 per thread and unrolled load) below that.
// Any block size that is a whole number of warps works.
#ifndef UNROLL
#define UNROLL 4
#endif

extern "C" __global__ void __launch_bounds__(1024)
reduce_sum_f32(const float* __restrict__ x, float* out, unsigned long long n) {
    __shared__ float warp_sums[32];
    const unsigned long long tid = threadIdx.x;
    const unsigned long long gid = (unsigned long long)blockIdx.x * blockDim.x + tid;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    // The float4 body: all of x when it is 16-byte aligned, else nothing.
    const unsigned long long nv = ((unsigned long long)x & 15ull) == 0 ? n >> 2 : 0;
    const float4* xv = reinterpret_cast<const float4*>(x);

    float acc[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc[u] = 0.0f;
    unsigned long long i = gid;
    for (; i + (UNROLL - 1) * stride < nv; i += UNROLL * stride) {
        float4 a[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) a[u] = __ldg(xv + i + u * stride);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc[u] += (a[u].x + a[u].y) + (a[u].z + a[u].w);
    }
    for (; i < nv; i += stride) {
        const float4 a = __ldg(xv + i);
        acc[0] += (a.x + a.y) + (a.z + a.w);
    }
    // The elements after the body (n % 4 of them, or all of an unaligned x).
    for (unsigned long long j = nv * 4 + gid; j < n; j += stride) acc[0] += __ldg(x + j);

    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) s += acc[u];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if ((tid & 31u) == 0) warp_sums[tid >> 5] = s;
    __syncthreads();
    if (tid < 32) {
        s = tid < ((blockDim.x + 31u) >> 5) ? warp_sums[tid] : 0.0f;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (tid == 0) atomicAdd(out, s);
    }
}
