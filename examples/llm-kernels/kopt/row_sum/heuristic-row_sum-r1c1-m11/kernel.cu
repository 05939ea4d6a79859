#line 1 "kernels/row_sum.cu"
// Row sums of a rows x cols fp32 matrix, y[r] = sum_c x[r, c]: the normaliser of a
// sampling step over a batch of vocabulary-sized rows, or of a long-row reduction.
//
// ROWS_PER_BLOCK rows per block, BLOCK / ROWS_PER_BLOCK threads per row (a whole number
// of warps). Each thread loads VEC consecutive floats at a time (float4 / float2 loads
// where VEC allows) and keeps UNROLL such loads in flight before adding them up. Warp
// shuffles, then shared memory across the warps of a row.
#ifndef BLOCK
#define BLOCK 256
#endif
#ifndef VEC
#define VEC 1
#endif
#ifndef ROWS_PER_BLOCK
#define ROWS_PER_BLOCK 1
#endif
#ifndef UNROLL
#define UNROLL 1
#endif

#define THREADS_PER_ROW (BLOCK / ROWS_PER_BLOCK)
#define WARPS_PER_ROW (THREADS_PER_ROW / 32)

// Sum of VEC consecutive floats at p (p is VEC-aligned: cols % VEC == 0).
__device__ __forceinline__ float load_sum(const float* __restrict__ p) {
#if VEC % 4 == 0
    float s = 0.0f;
    #pragma unroll 4
    for (int i = 0; i < VEC; i += 4) {
        const float4 v = *reinterpret_cast<const float4*>(p + i);
        s += (v.x + v.y) + (v.z + v.w);
    }
    return s;
#elif VEC == 2
    const float2 v = *reinterpret_cast<const float2*>(p);
    return v.x + v.y;
#else
    return *p;
#endif
}

extern "C" __global__ void __launch_bounds__(BLOCK)
row_sum_f32(const float* __restrict__ x, float* __restrict__ y, unsigned int rows,
            unsigned int cols) {
    __shared__ float scratch[BLOCK / 32];
    const unsigned int group = threadIdx.x / THREADS_PER_ROW;
    const unsigned int lane = threadIdx.x % THREADS_PER_ROW;
    const unsigned int row = blockIdx.x * ROWS_PER_BLOCK + group;

    float acc[UNROLL];
    #pragma unroll 4
    for (int u = 0; u < UNROLL; ++u) acc[u] = 0.0f;
    if (row < rows) {
        const float* __restrict__ xr = x + (size_t)row * cols;
        const unsigned int step = THREADS_PER_ROW * VEC;
        unsigned int c = lane * VEC;
        // UNROLL independent loads per iteration; the loop itself is not unrolled
        // further, so UNROLL is what decides the loads in flight.
        #pragma unroll 4
        for (; c + (UNROLL - 1) * step < cols; c += UNROLL * step) {
            float v[UNROLL];
            #pragma unroll 4
            for (int u = 0; u < UNROLL; ++u) v[u] = load_sum(xr + c + u * step);
            #pragma unroll 4
            for (int u = 0; u < UNROLL; ++u) acc[u] += v[u];
        }
        #pragma unroll 4
        for (; c < cols; c += step) acc[0] += load_sum(xr + c);
    }
    float s = 0.0f;
    #pragma unroll 4
    for (int u = 0; u < UNROLL; ++u) s += acc[u];
    #pragma unroll 4
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const unsigned int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) scratch[warp] = s;
    __syncthreads();
    if (lane == 0 && row < rows) {
        float t = 0.0f;
        #pragma unroll 4
        for (int w = 0; w < WARPS_PER_ROW; ++w) t += scratch[group * WARPS_PER_ROW + w];
        y[row] = t;
    }
}

