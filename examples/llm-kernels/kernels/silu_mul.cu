// The fused SwiGLU activation of a gated MLP, fp16: for x of shape [tokens, 2d] holding
// the gate and up projections side by side, out[t, j] = silu(x[t, j]) * x[t, d + j] with
// silu(v) = v / (1 + exp(-v)), computed in fp32. One thread per output element.
#include <cuda_fp16.h>

extern "C" __global__ void silu_mul_f16(const __half* __restrict__ x, __half* __restrict__ out,
                                        unsigned int tokens, unsigned int d) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)tokens * d) return;
    const size_t t = i / d;
    const size_t j = i % d;
    const float g = __half2float(x[t * 2 * d + j]);
    const float u = __half2float(x[t * 2 * d + d + j]);
    out[i] = __float2half(g / (1.0f + __expf(-g)) * u);
}
