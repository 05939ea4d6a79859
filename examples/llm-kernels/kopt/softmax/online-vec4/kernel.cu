// Row softmax, fp32: online (single-pass) max and sum, 16-byte loads and stores,
// warp-shuffle reductions. One block per row; rows must hold a multiple of 4 floats.
#define NEG_INF __int_as_float(0xff800000)

#ifndef MAX_BLOCK
#define MAX_BLOCK 1024
#endif

// Merges two (max, sum-of-exp) pairs.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
    const float mm = fmaxf(m, m2);
    if (mm == NEG_INF) return;  // both empty
    s = s * __expf(m - mm) + s2 * __expf(m2 - mm);
    m = mm;
}

extern "C" __global__ void __launch_bounds__(MAX_BLOCK)
softmax_f32(const float* __restrict__ x, float* __restrict__ y, unsigned int rows,
            unsigned int cols) {
    __shared__ float wm[32], ws[32];
    const unsigned int row = blockIdx.x;
    if (row >= rows) return;
    const float4* xr = reinterpret_cast<const float4*>(x + (size_t)row * cols);
    float4* yr = reinterpret_cast<float4*>(y + (size_t)row * cols);
    const unsigned int n4 = cols >> 2;

    float m = NEG_INF, s = 0.0f;
    for (unsigned int i = threadIdx.x; i < n4; i += blockDim.x) {
        const float4 v = xr[i];
        const float lm = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
        const float nm = fmaxf(m, lm);
        s = s * __expf(m - nm) + __expf(v.x - nm) + __expf(v.y - nm) + __expf(v.z - nm) +
            __expf(v.w - nm);
        m = nm;
    }
    for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
        merge(m, s, m2, s2);
    }
    const unsigned int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        wm[warp] = m;
        ws[warp] = s;
    }
    __syncthreads();
    if (warp == 0) {
        const unsigned int warps = (blockDim.x + 31) >> 5;
        m = lane < warps ? wm[lane] : NEG_INF;
        s = lane < warps ? ws[lane] : 0.0f;
        for (int off = 16; off > 0; off >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
            const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
            merge(m, s, m2, s2);
        }
        if (lane == 0) {
            wm[0] = m;
            ws[0] = s;
        }
    }
    __syncthreads();
    m = wm[0];
    const float inv = 1.0f / ws[0];
    for (unsigned int i = threadIdx.x; i < n4; i += blockDim.x) {
        const float4 v = xr[i];
        yr[i] = make_float4(__expf(v.x - m) * inv, __expf(v.y - m) * inv, __expf(v.z - m) * inv,
                            __expf(v.w - m) * inv);
    }
}
