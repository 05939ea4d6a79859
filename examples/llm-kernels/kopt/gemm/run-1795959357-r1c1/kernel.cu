// C[M, N] = A[M, K] * B[K, N], fp16 in, fp32 accumulation, fp16 out, row-major, on the
// tensor cores: mma.sync m16n8k16 (f32 += f16 x f16) through inline PTX.
// - 8 warps, each a 64 x 64 warp tile (4 x 8 mma tiles, 128 fp32 accumulators per thread):
//   per k16 step 8 ldmatrix.x4 feed 32 mma (the 64 x 32 warp tile of the previous
//   candidate needed 6 for 16, and shared-memory bandwidth was its limit).
// - Two block tiles, chosen by the launch rule from the number of tiles:
//   wide:  128 x 256, warps 2 (M) x 4 (N); when the grid has at least WIDE_MIN_TILES tiles.
//   split: 128 x 128, warps 2 (M) x 2 (N) x 2 (K): the two warp groups take alternate
//          halves of each K-slice and add their partial sums through shared memory at
//          the end. Small M (512 x 4096: 64 wide tiles on 132 SMs) gets 128 blocks that way.
//   The kernel recomputes the same choice from (m, n), so the grid always matches.
// - BK = 64, a 4-stage cp.async pipeline (16-byte copies; 48 KB per stage wide, 32 KB
//   split): the loads of K-slice kt + 3 are in flight while slice kt is multiplied; one
//   __syncthreads per K-slice.
// - Register fragments are double-buffered: the ldmatrix of the next k16 step (across the
//   K-slice boundary too) are issued before the mma of the current one.
// - Fragments come from shared memory with ldmatrix (x4; .trans for B, which is K-major);
//   rows of 128 bytes or more, 16-byte chunks XOR-swizzled (chunk ^ (row % 8)) so that
//   ldmatrix and the cp.async writes are free of bank conflicts.
// - Epilogue: the tile is staged as fp16 in (padded) shared memory and written with
//   coalesced 16-byte stores.
// - Edges: rows of A past M and chunks past N or K are zero-filled by cp.async (src-size
//   0) and the epilogue stores only inside C, so M is free; the 16-byte copies need
//   N % 8 == 0 and K % 8 == 0. Other shapes take a plain SIMT path (correct, slow).
#include <cuda_fp16.h>

#ifndef WIDE_MIN_TILES
#define WIDE_MIN_TILES 100
#endif

#define BM 128
#define BK 64
#define STAGES 4
#define THREADS 256
#define A_STAGE (BM * BK)  // halves per stage

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

// Offset in halves of 16-byte chunk `c` of row `r` in a swizzled tile whose rows are
// `row_halves` long (a multiple of 64 halves = 128 bytes, so only the low 3 bits of the
// chunk index move and the 8 rows an ldmatrix reads land on 8 different bank groups).
__device__ __forceinline__ unsigned int swz(unsigned int r, unsigned int c,
                                            unsigned int row_halves) {
    return r * row_halves + ((c ^ (r & 7u)) << 3);
}

// Whether the launch rule chose the wide 128 x 256 tile: the same expression as the
// proposal's launch rule.
__device__ __forceinline__ bool wide_tiles(unsigned int m, unsigned int n) {
    return ((m + BM - 1) / BM) * ((n + 255) / 256) >= WIDE_MIN_TILES;
}

// One block: the BM x BN_ tile of C at (blockIdx.y, blockIdx.x). KSPLIT warp groups split
// each K-slice; 2 x (BN_ / 64) x KSPLIT == 8 warps.
template <int BN_, int KSPLIT>
__device__ __forceinline__ void gemm_tile(const __half* __restrict__ a,
                                          const __half* __restrict__ b, __half* __restrict__ c,
                                          unsigned int m, unsigned int n, unsigned int k,
                                          unsigned char* smem) {
    constexpr int WN = BN_ / 64;                 // warps along N
    constexpr int B_STAGE = BK * BN_;            // halves per stage
    constexpr int B_CHUNKS = BN_ / 8;            // 16-byte chunks per row of B
    constexpr int KSTEPS = BK / 16 / KSPLIT;     // k16 steps per warp per K-slice
    constexpr int A_PER_THREAD = BM * BK / 8 / THREADS;
    constexpr int B_PER_THREAD = BK * BN_ / 8 / THREADS;
    static_assert(2 * WN * KSPLIT == THREADS / 32, "8 warps");
    static_assert(KSTEPS % 2 == 0, "fragment double buffer restarts at 0 each K-slice");

    __half* sa = reinterpret_cast<__half*>(smem);
    __half* sb = sa + STAGES * A_STAGE;
    const unsigned int bm = blockIdx.y * BM, bn = blockIdx.x * BN_;
    const unsigned int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned int wm = (warp & 1) * 64;
    const unsigned int wn = ((warp >> 1) % WN) * 64;
    const unsigned int wk = warp / (2 * WN);  // which KSTEPS k16 steps of a K-slice
    const unsigned int ktiles = (k + BK - 1) / BK;

    // Issues the copies of K-slice `kt` into stage `s`.
    auto load_stage = [&](unsigned int kt, unsigned int s) {
        const unsigned int k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < A_PER_THREAD; ++i) {
            const unsigned int q = threadIdx.x + i * THREADS;
            const unsigned int r = q >> 3, ch = q & 7u;
            const unsigned int gr = bm + r, gk = k0 + ch * 8;
            const bool ok = gr < m && gk < k;
            cp_async16(smem_addr(sa + s * A_STAGE + swz(r, ch, BK)),
                       ok ? a + (size_t)gr * k + gk : a, ok ? 16 : 0);
        }
#pragma unroll
        for (int i = 0; i < B_PER_THREAD; ++i) {
            const unsigned int q = threadIdx.x + i * THREADS;
            const unsigned int r = q / B_CHUNKS, ch = q % B_CHUNKS;
            const unsigned int gk = k0 + r, gn = bn + ch * 8;
            const bool ok = gk < k && gn < n;
            cp_async16(smem_addr(sb + s * B_STAGE + swz(r, ch, BN_)),
                       ok ? b + (size_t)gk * n + gn : b, ok ? 16 : 0);
        }
    };

    // Fragments of k16 step `step` (of this warp's KSTEPS) of stage `s`.
    auto load_frags = [&](unsigned int (*af)[4], unsigned int (*bf)[2], unsigned int s,
                          unsigned int step) {
        const __half* ta = sa + s * A_STAGE;
        const __half* tb = sb + s * B_STAGE;
        const unsigned int kk = wk * KSTEPS + step;
#pragma unroll
        for (int mi = 0; mi < 4; ++mi) {
            // Lanes 0-15: rows 0-15 at k 0-7; lanes 16-31: the same rows at k 8-15.
            const unsigned int r = wm + mi * 16 + (lane & 15);
            ldmatrix_x4(af[mi], smem_addr(ta + swz(r, kk * 2 + (lane >> 4), BK)));
        }
#pragma unroll
        for (int nj = 0; nj < 4; ++nj) {
            // Lanes 0-15: k 0-15 at columns 0-7; lanes 16-31: k 0-15 at columns 8-15.
            unsigned int t[4];
            const unsigned int r = kk * 16 + (lane & 15);
            ldmatrix_x4_trans(t, smem_addr(tb + swz(r, (wn >> 3) + nj * 2 + (lane >> 4), BN_)));
            bf[nj * 2][0] = t[0];
            bf[nj * 2][1] = t[1];
            bf[nj * 2 + 1][0] = t[2];
            bf[nj * 2 + 1][1] = t[3];
        }
    };

    float acc[4][8][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if ((unsigned int)s < ktiles) load_stage(s, s);
        cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();
    __syncthreads();

    unsigned int af[2][4][4];
    unsigned int bf[2][8][2];
    load_frags(af[0], bf[0], 0, 0);

#pragma unroll 1
    for (unsigned int kt = 0; kt < ktiles; ++kt) {
        // Stage (kt + STAGES - 1) % STAGES held slice kt - 1, whose last fragments every
        // warp read before the barrier of iteration kt - 1.
        const unsigned int nk = kt + STAGES - 1;
        if (nk < ktiles) load_stage(nk, nk % STAGES);
        cp_async_commit();
        const unsigned int cur = kt % STAGES;
#pragma unroll
        for (int step = 0; step < KSTEPS; ++step) {
            if (step == KSTEPS - 1) {
                // Groups committed: STAGES + kt; at most STAGES - 2 pending means slice
                // kt + 1 has landed for this thread, and the barrier for all threads.
                cp_async_wait<STAGES - 2>();
                __syncthreads();
            }
            const int nb = (step + 1) & 1;
            if (step < KSTEPS - 1)
                load_frags(af[nb], bf[nb], cur, step + 1);
            else if (kt + 1 < ktiles)
                load_frags(af[nb], bf[nb], (kt + 1) % STAGES, 0);
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < 8; ++ni) mma_16816(acc[mi][ni], af[step & 1][mi], bf[step & 1][ni]);
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // the pipeline's shared memory is reused below

    // Accumulator (mi, ni): lane holds rows g and g + 8 (g = lane / 4), columns
    // 2 * (lane % 4) and + 1 of the 16 x 8 tile.
    const unsigned int g = lane >> 2, t2 = 2 * (lane & 3);
    unsigned char* cs_bytes = smem;
    if (KSPLIT == 2) {
        // Partial sums of warp group 1 -> shared fp32 [BM][BN_ + 8] -> added by group 0.
        constexpr int RS = BN_ + 8;
        float* red = reinterpret_cast<float*>(smem);
        if (wk == 1) {
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < 8; ++ni) {
                    const unsigned int r = wm + mi * 16 + g, col = wn + ni * 8 + t2;
                    *reinterpret_cast<float2*>(red + r * RS + col) =
                        make_float2(acc[mi][ni][0], acc[mi][ni][1]);
                    *reinterpret_cast<float2*>(red + (r + 8) * RS + col) =
                        make_float2(acc[mi][ni][2], acc[mi][ni][3]);
                }
        }
        __syncthreads();
        if (wk == 0) {
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < 8; ++ni) {
                    const unsigned int r = wm + mi * 16 + g, col = wn + ni * 8 + t2;
                    const float2 p = *reinterpret_cast<const float2*>(red + r * RS + col);
                    const float2 q = *reinterpret_cast<const float2*>(red + (r + 8) * RS + col);
                    acc[mi][ni][0] += p.x;
                    acc[mi][ni][1] += p.y;
                    acc[mi][ni][2] += q.x;
                    acc[mi][ni][3] += q.y;
                }
        }
        cs_bytes = smem + BM * RS * sizeof(float);
    }

    // fp16 tile [BM][BN_ + 8] (the padding keeps the half2 writes conflict-free).
    constexpr int CS = BN_ + 8;
    __half* cs = reinterpret_cast<__half*>(cs_bytes);
    if (wk == 0) {
#pragma unroll
        for (int mi = 0; mi < 4; ++mi)
#pragma unroll
            for (int ni = 0; ni < 8; ++ni) {
                const unsigned int r = wm + mi * 16 + g, col = wn + ni * 8 + t2;
                *reinterpret_cast<__half2*>(cs + r * CS + col) =
                    __floats2half2_rn(acc[mi][ni][0], acc[mi][ni][1]);
                *reinterpret_cast<__half2*>(cs + (r + 8) * CS + col) =
                    __floats2half2_rn(acc[mi][ni][2], acc[mi][ni][3]);
            }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < BM * B_CHUNKS / THREADS; ++i) {
        const unsigned int q = threadIdx.x + i * THREADS;
        const unsigned int r = q / B_CHUNKS, ch = q % B_CHUNKS;
        const unsigned int gr = bm + r, gn = bn + ch * 8;
        if (gr < m && gn < n)
            *reinterpret_cast<uint4*>(c + (size_t)gr * n + gn) =
                *reinterpret_cast<const uint4*>(cs + r * CS + ch * 8);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_f16(const __half* __restrict__ a, const __half* __restrict__ b, __half* __restrict__ c,
         unsigned int m, unsigned int n, unsigned int k) {
    extern __shared__ __align__(128) unsigned char smem[];
    const bool wide = wide_tiles(m, n);

    if ((n & 7u) != 0 || (k & 7u) != 0) {
        // Rows not 16-byte aligned: a plain dot product per output (consecutive threads on
        // consecutive columns, so the reads of B are coalesced).
        const unsigned int bn_tile = wide ? 256 : 128;
        const unsigned int bm = blockIdx.y * BM, bn = blockIdx.x * bn_tile;
        for (unsigned int e = threadIdx.x; e < BM * bn_tile; e += THREADS) {
            const unsigned int r = bm + e / bn_tile, col = bn + e % bn_tile;
            if (r < m && col < n) {
                float s = 0.0f;
                for (unsigned int p = 0; p < k; ++p)
                    s += __half2float(a[(size_t)r * k + p]) * __half2float(b[(size_t)p * n + col]);
                c[(size_t)r * n + col] = __float2half(s);
            }
        }
        return;
    }
    if (wide)
        gemm_tile<256, 1>(a, b, c, m, n, k, smem);
    else
        gemm_tile<128, 2>(a, b, c, m, n, k, smem);
}
