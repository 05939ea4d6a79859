// C[M, N] = A[M, K] * B[K, N], fp16 in, fp32 accumulation, fp16 out, row-major, on the
// tensor cores: mma.sync m16n8k16 (f32 += f16 x f16) through inline PTX.
// - Block tile 128 x 128 x 32, 8 warps in a 2 x 4 grid, each warp a 64 x 32 tile
//   (4 x 4 mma tiles, 64 fp32 accumulators per thread).
// - A 4-stage cp.async pipeline (16-byte copies, 16 KB per stage, 64 KB of dynamic shared
//   memory): the loads of K-slice kt + 3 are in flight while slice kt is multiplied.
// - Fragments come from shared memory with ldmatrix (x4; .trans for B, which is K-major);
//   both tiles are XOR-swizzled in 16-byte chunks so that ldmatrix and the cp.async
//   writes are free of bank conflicts (A: chunk ^ ((row / 2) % 4), 4 chunks per row;
//   B: chunk ^ (row % 8), 16 chunks per row).
// - Edges: rows of A past M and columns of B past N or K are zero-filled by cp.async
//   (src-size 0) and the epilogue stores only inside C, so M is free; the 16-byte copies
//   need N % 8 == 0 and K % 8 == 0. Other shapes take a plain SIMT path (correct, slow).
#include <cuda_fp16.h>

#define BM 128
#define BN 128
#define BK 32
#define STAGES 4
#define THREADS 256
#define A_STAGE (BM * BK)  // halves per stage
#define B_STAGE (BK * BN)

// PTX-BEGIN: the tensor-core and async-copy instructions.
__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    return (unsigned int)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared; src_bytes 0 writes zeros (and reads nothing).
__device__ __forceinline__ void cp_async16(unsigned int dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(unsigned int* r, unsigned int addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned int* r, unsigned int addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a * b for one 16 x 8 x 16 tile.
__device__ __forceinline__ void mma_16816(float* d, const unsigned int* a, const unsigned int* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// PTX-END

// Offsets in halves of 16-byte chunk `c` of row `r` in a stage's swizzled tile.
__device__ __forceinline__ unsigned int a_off(unsigned int r, unsigned int c) {
    return r * BK + ((c ^ ((r >> 1) & 3u)) << 3);
}
__device__ __forceinline__ unsigned int b_off(unsigned int r, unsigned int c) {
    return r * BN + ((c ^ (r & 7u)) << 3);
}

// Issues the copies of K-slice `kt` into stage `s`: 512 chunks of A, 512 of B, two of each
// per thread.
__device__ __forceinline__ void load_stage(const __half* __restrict__ a,
                                           const __half* __restrict__ b, __half* sa,
                                           __half* sb, unsigned int m, unsigned int n,
                                           unsigned int k, unsigned int bm, unsigned int bn,
                                           unsigned int kt, unsigned int s) {
    const unsigned int k0 = kt * BK;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const unsigned int q = threadIdx.x + i * THREADS;
        const unsigned int r = q >> 2, c = q & 3u;
        const unsigned int gr = bm + r, gk = k0 + c * 8;
        const bool ok = gr < m && gk < k;
        cp_async16(smem_addr(sa + s * A_STAGE + a_off(r, c)), ok ? a + (size_t)gr * k + gk : a,
                   ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const unsigned int q = threadIdx.x + i * THREADS;
        const unsigned int r = q >> 4, c = q & 15u;
        const unsigned int gk = k0 + r, gn = bn + c * 8;
        const bool ok = gk < k && gn < n;
        cp_async16(smem_addr(sb + s * B_STAGE + b_off(r, c)), ok ? b + (size_t)gk * n + gn : b,
                   ok ? 16 : 0);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
gemm_f16(const __half* __restrict__ a, const __half* __restrict__ b, __half* __restrict__ c,
         unsigned int m, unsigned int n, unsigned int k) {
    extern __shared__ __align__(128) unsigned char smem[];
    __half* sa = reinterpret_cast<__half*>(smem);
    __half* sb = sa + STAGES * A_STAGE;
    const unsigned int bm = blockIdx.y * BM, bn = blockIdx.x * BN;

    if ((n & 7u) != 0 || (k & 7u) != 0) {
        // Rows not 16-byte aligned: a plain dot product per output (consecutive threads on
        // consecutive columns, so the reads of B are coalesced).
        for (unsigned int e = threadIdx.x; e < BM * BN; e += THREADS) {
            const unsigned int r = bm + e / BN, col = bn + e % BN;
            if (r < m && col < n) {
                float s = 0.0f;
                for (unsigned int p = 0; p < k; ++p)
                    s += __half2float(a[(size_t)r * k + p]) * __half2float(b[(size_t)p * n + col]);
                c[(size_t)r * n + col] = __float2half(s);
            }
        }
        return;
    }

    const unsigned int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const unsigned int ktiles = (k + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if ((unsigned int)s < ktiles) load_stage(a, b, sa, sb, m, n, k, bm, bn, s, s);
        cp_async_commit();
    }

#pragma unroll 1
    for (unsigned int kt = 0; kt < ktiles; ++kt) {
        // Groups committed so far: STAGES - 1 + kt; at most STAGES - 2 left pending means
        // slice kt has landed (for this thread; the barrier makes it so for all). The
        // barrier also means every warp is done with slice kt - 1, whose stage the
        // prefetch below overwrites.
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const unsigned int nk = kt + STAGES - 1;
        if (nk < ktiles) load_stage(a, b, sa, sb, m, n, k, bm, bn, nk, nk % STAGES);
        cp_async_commit();

        const __half* ta = sa + (kt % STAGES) * A_STAGE;
        const __half* tb = sb + (kt % STAGES) * B_STAGE;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            unsigned int af[4][4];
            unsigned int bf[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                // Lanes 0-15: rows 0-15 at k 0-7; lanes 16-31: the same rows at k 8-15.
                const unsigned int r = wm + mi * 16 + (lane & 15);
                ldmatrix_x4(af[mi], smem_addr(ta + a_off(r, kk * 2 + (lane >> 4))));
            }
#pragma unroll
            for (int nj = 0; nj < 2; ++nj) {
                // Lanes 0-15: k 0-15 at columns 0-7; lanes 16-31: k 0-15 at columns 8-15.
                unsigned int t[4];
                const unsigned int r = kk * 16 + (lane & 15);
                ldmatrix_x4_trans(t, smem_addr(tb + b_off(r, (wn >> 3) + nj * 2 + (lane >> 4))));
                bf[nj * 2][0] = t[0];
                bf[nj * 2][1] = t[1];
                bf[nj * 2 + 1][0] = t[2];
                bf[nj * 2 + 1][1] = t[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) mma_16816(acc[mi][ni], af[mi], bf[ni]);
        }
    }
    cp_async_wait<0>();

    // Accumulator (mi, ni): lane holds rows g and g + 8 (g = lane / 4), columns
    // 2 * (lane % 4) and + 1 of the 16 x 8 tile.
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
        const unsigned int r = bm + wm + mi * 16 + (lane >> 2);
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
            const unsigned int col = bn + wn + ni * 8 + 2 * (lane & 3);
            if (col < n) {
                if (r < m)
                    *reinterpret_cast<__half2*>(c + (size_t)r * n + col) =
                        __floats2half2_rn(acc[mi][ni][0], acc[mi][ni][1]);
                if (r + 8 < m)
                    *reinterpret_cast<__half2*>(c + (size_t)(r + 8) * n + col) =
                        __floats2half2_rn(acc[mi][ni][2], acc[mi][ni][3]);
            }
        }
    }
}
