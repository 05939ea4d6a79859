// Matrix product, fp16 in, fp32 accumulation, fp16 out: C[M, N] = A[M, K] * B[K, N], all
// row-major (B is [K, N], as torch.matmul(A, B) takes a contiguous B). The classic tiled
// shared-memory SIMT kernel: 32x32 output tiles, a 32x8 block, each thread accumulating
// 4 outputs of one column over 32-wide K slices staged in shared memory as fp32. Edges
// are bounds-checked (zeros are staged past M, N or K), so any shape works.
#include <cuda_fp16.h>

#define TILE 32
#define BLOCK_ROWS 8

extern "C" __global__ void gemm_f16(const __half* __restrict__ a, const __half* __restrict__ b,
                                    __half* __restrict__ c, unsigned int m, unsigned int n,
                                    unsigned int k) {
    __shared__ float as[TILE][TILE];
    __shared__ float bs[TILE][TILE];
    const unsigned int tx = threadIdx.x, ty = threadIdx.y;
    const unsigned int row0 = blockIdx.y * TILE, col = blockIdx.x * TILE + tx;
    float acc[TILE / BLOCK_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (unsigned int k0 = 0; k0 < k; k0 += TILE) {
        for (unsigned int i = 0; i < TILE; i += BLOCK_ROWS) {
            const unsigned int ar = row0 + ty + i, ac = k0 + tx;
            as[ty + i][tx] = (ar < m && ac < k) ? __half2float(a[(size_t)ar * k + ac]) : 0.0f;
            const unsigned int br = k0 + ty + i;
            bs[ty + i][tx] = (br < k && col < n) ? __half2float(b[(size_t)br * n + col]) : 0.0f;
        }
        __syncthreads();
        for (unsigned int kk = 0; kk < TILE; ++kk) {
            const float bv = bs[kk][tx];
            for (unsigned int i = 0; i < TILE / BLOCK_ROWS; ++i)
                acc[i] += as[ty + i * BLOCK_ROWS][kk] * bv;
        }
        __syncthreads();
    }
    for (unsigned int i = 0; i < TILE / BLOCK_ROWS; ++i) {
        const unsigned int r = row0 + ty + i * BLOCK_ROWS;
        if (r < m && col < n) c[(size_t)r * n + col] = __float2half(acc[i]);
    }
}
