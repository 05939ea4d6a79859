// The same-size copy of sweep.cu: 256-thread blocks, 4 float4s a thread, all loaded
// before any is stored (n4 float4s in all).
extern "C" __global__ void __launch_bounds__(256)
copy_f4(const float4* __restrict__ x, float4* __restrict__ y, unsigned long long n4) {
    const unsigned long long b = (unsigned long long)blockIdx.x * 1024 + threadIdx.x;
    float4 r[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        if (b + i * 256 < n4) r[i] = x[b + i * 256];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        if (b + i * 256 < n4) y[b + i * 256] = r[i];
}
