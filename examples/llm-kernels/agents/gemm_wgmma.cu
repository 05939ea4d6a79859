// C[M, N] = A[M, K] * B[K, N], fp16 in, fp32 accumulation, fp16 out, row-major, on Hopper's
// warpgroup tensor-core instructions (wgmma.mma_async, sm_90a only: the proposal compiles it
// with --gpu-architecture=compute_90a).
// - 256 threads = 2 warpgroups; each owns 64 rows of the block tile and all its columns:
//   wide:   128 x 256 tile, wgmma m64n256k16 (128 fp32 accumulators per thread), 4 stages;
//   narrow: 128 x 128 tile, wgmma m64n128k16 (64 accumulators), 6 stages, when the grid of
//           wide tiles has fewer than WIDE_MIN_TILES tiles (M = 512: 128 blocks, not 64).
//   The kernel recomputes the launch rule's choice from (m, n), so the grid always matches.
// - Operands are read by the tensor cores straight from shared memory through matrix
//   descriptors (no ldmatrix, no register fragments). Every thread copies with 16-byte
//   cp.async into the canonical 128-byte-swizzled layouts the descriptors describe
//   (1024-byte atoms of 8 rows x 128 bytes, 16-byte chunk c of row r stored at c ^ (r % 8)):
//   A (K-major): per stage a [128][64] tile, rows of 64 halves = 128 bytes;
//                descriptor: SBO = 1024 (8-row groups), LBO unused (16), k16 step = +32 bytes.
//   B (N-major, [K, N] as stored in memory; transpose bit set): per stage BN / 64 panels of
//                [64 (k)][64 (n)], rows of 64 n = 128 bytes; descriptor: LBO = 8192 (from one
//                64-column panel to the next), SBO = 1024 (8-k groups), k16 step = +2048 bytes.
//   The stage buffers start on a 1024-byte boundary (aligned at run time), so the
//   descriptors' base offset is 0.
// - Pipeline, BK = 64 per stage, one __syncthreads per K-slice:
//     wait for slice kt's copies, fence.proxy.async (cp.async writes are generic-proxy,
//     wgmma reads async-proxy), barrier; issue the copies of slice kt + STAGES - 2 into the
//     stage slice kt - 2 used (both warpgroups retired its wgmma before the barrier);
//     4 wgmma (k16 steps) on slice kt, commit, wait until at most 1 group (slice kt's) is
//     in flight. So the tensor cores always have the next slice's wgmma queued behind the
//     current one, and STAGES - 2 slices of copies are in flight.
// - Epilogue: the accumulators (the m64nN D fragment: row 16 * warp + lane / 4 (+ 8),
//   columns 8 * j + 2 * (lane % 4) (+ 1)) are staged as fp16 in padded shared memory and
//   written with coalesced 16-byte stores.
// - Edges: rows of A past M and chunks past N or K are zero-filled by cp.async (src-size 0)
//   and the epilogue stores only inside C, so M is free; the 16-byte copies need N % 8 == 0
//   and K % 8 == 0. Other shapes take a plain SIMT path (correct, slow).
#include <cuda_fp16.h>

#ifndef WIDE_MIN_TILES
#define WIDE_MIN_TILES 100
#endif

#define BM 128
#define BK 64
#define THREADS 256
#define A_STAGE_BYTES (BM * BK * 2)       // 16 KB
#define B_PANEL_BYTES (BK * 64 * 2)       // 8 KB: 64 k-rows of 64 columns
#define SMEM_ALIGN 1024                   // the 128-byte swizzle's atom

// PTX-BEGIN: async copies, proxy fence, warpgroup MMA.
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

// Makes this thread's generic-proxy writes to shared memory (cp.async's) visible to the
// async proxy (wgmma's operand reads); the barrier after it extends that to every thread.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accesses of the accumulators across the asynchronous
// wgmma window (they are read and written by the tensor cores until wgmma_wait).
template <int R>
__device__ __forceinline__ void fence_regs(float* d) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
// byte offsets, each >> 4 in 14 bits; bits 62-63 = 1 (128B swizzle); base offset 0.
__device__ __forceinline__ unsigned long long make_desc(unsigned int addr, unsigned int lbo,
                                                        unsigned int sbo) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) |
           ((unsigned long long)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((unsigned long long)((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}

// The operand lists below are regular: %0 .. %(N/2 - 1) are d[0 .. N/2 - 1], then the two
// descriptors and the scale-d flag (accumulate 0: D = A * B, the first k16 step, so the
// accumulators need no zero fill, which would make ptxas serialise the wgmma; 1: D += A * B).
// Immediates: scale-a 1, scale-b 1, transpose-a 0 (A is K-major), transpose-b 1 (B N-major).
// d[0..127] (+)= A (64 x 16, K-major) * B (16 x 256, N-major), both from shared memory.
__device__ __forceinline__ void wgmma_m64n256(float* d, unsigned long long desc_a,
                                              unsigned long long desc_b,
                                              int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// d[0..63] (+)= A (64 x 16, K-major) * B (16 x 128, N-major), both from shared memory.
__device__ __forceinline__ void wgmma_m64n128(float* d, unsigned long long desc_a,
                                              unsigned long long desc_b,
                                              int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
// PTX-END

// Whether the launch rule chose the wide 128 x 256 tile: the same expression as the
// proposal's launch rule.
__device__ __forceinline__ bool wide_tiles(unsigned int m, unsigned int n) {
    return ((m + BM - 1) / BM) * ((n + 255) / 256) >= WIDE_MIN_TILES;
}

template <int BN_>
__device__ __forceinline__ void wgmma_tile(float* d, unsigned long long da,
                                           unsigned long long db, int accumulate);
template <>
__device__ __forceinline__ void wgmma_tile<256>(float* d, unsigned long long da,
                                                unsigned long long db, int accumulate) {
    wgmma_m64n256(d, da, db, accumulate);
}
template <>
__device__ __forceinline__ void wgmma_tile<128>(float* d, unsigned long long da,
                                                unsigned long long db, int accumulate) {
    wgmma_m64n128(d, da, db, accumulate);
}

// One block: the BM x BN_ tile of C at (blockIdx.y, blockIdx.x).
template <int BN_, int STAGES_>
__device__ __forceinline__ void gemm_tile(const __half* __restrict__ a,
                                          const __half* __restrict__ b, __half* __restrict__ c,
                                          unsigned int m, unsigned int n, unsigned int k,
                                          unsigned char* smem) {
    constexpr int ACC = BN_ / 2;                         // fp32 accumulators per thread
    constexpr int B_STAGE_BYTES = (BN_ / 64) * B_PANEL_BYTES;
    constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
    constexpr int B_CHUNKS = BN_ / 8;                    // 16-byte chunks per row of B
    constexpr int A_PER_THREAD = BM * BK / 8 / THREADS;
    constexpr int B_PER_THREAD = BK * BN_ / 8 / THREADS;
    static_assert(STAGES_ >= 3, "the stage being overwritten is two slices behind");
    static_assert(BM == 2 * 64 && THREADS == 256, "two warpgroups of 64 rows");

    const unsigned int sbase = smem_addr(smem);          // 1024-byte aligned by the caller
    const unsigned int bm = blockIdx.y * BM, bn = blockIdx.x * BN_;
    const unsigned int wg = threadIdx.x >> 7;            // warpgroup: rows 64 * wg ..
    const unsigned int ktiles = (k + BK - 1) / BK;

    // Issues the copies of K-slice `kt` into stage `s` (A then B of the stage).
    auto load_stage = [&](unsigned int kt, unsigned int s) {
        const unsigned int k0 = kt * BK;
        const unsigned int sa = sbase + s * STAGE_BYTES, sb = sa + A_STAGE_BYTES;
#pragma unroll
        for (int i = 0; i < A_PER_THREAD; ++i) {
            const unsigned int q = threadIdx.x + i * THREADS;
            const unsigned int r = q >> 3, ch = q & 7u;  // row, 16-byte chunk along k
            const unsigned int gr = bm + r, gk = k0 + ch * 8;
            const bool ok = gr < m && gk < k;
            cp_async16(sa + r * 128 + ((ch ^ (r & 7u)) << 4), ok ? a + (size_t)gr * k + gk : a,
                       ok ? 16 : 0);
        }
#pragma unroll
        for (int i = 0; i < B_PER_THREAD; ++i) {
            const unsigned int q = threadIdx.x + i * THREADS;
            const unsigned int r = q / B_CHUNKS, ch = q % B_CHUNKS;  // k-row, chunk along n
            const unsigned int gk = k0 + r, gn = bn + ch * 8;
            const bool ok = gk < k && gn < n;
            // Panel ch / 8 (64 columns), row r of 128 bytes, chunk ch % 8 swizzled by r % 8.
            cp_async16(sb + (ch >> 3) * B_PANEL_BYTES + r * 128 + (((ch & 7u) ^ (r & 7u)) << 4),
                       ok ? b + (size_t)gk * n + gn : b, ok ? 16 : 0);
        }
    };

    float acc[ACC];  // written first by the wgmma of kt = 0, kk = 0 (accumulate = 0)

#pragma unroll
    for (int s = 0; s < STAGES_ - 2; ++s) {
        if ((unsigned int)s < ktiles) load_stage(s, s);
        cp_async_commit();
    }

#pragma unroll 1
    for (unsigned int kt = 0; kt < ktiles; ++kt) {
        // Groups committed so far: STAGES_ - 2 + kt, the last holding slice kt + STAGES_ - 3;
        // at most STAGES_ - 3 pending means slice kt has landed (for this thread).
        cp_async_wait<STAGES_ - 3>();
        fence_proxy_async();
        // After the barrier: slice kt is visible to every thread's wgmma, and both
        // warpgroups have retired the wgmma of slice kt - 2 (wgmma_wait<1> below).
        __syncthreads();
        const unsigned int nk = kt + STAGES_ - 2;
        if (nk < ktiles) load_stage(nk, nk % STAGES_);
        cp_async_commit();

        const unsigned int sa = sbase + (kt % STAGES_) * STAGE_BYTES;
        const unsigned int sb = sa + A_STAGE_BYTES;
        // A: this warpgroup's 64 rows (8 atoms of 8 rows, SBO 1024); LBO unused (16).
        const unsigned long long da = make_desc(sa + wg * (64 * 128), 16, 1024);
        // B: panels 8 KB apart (LBO), 8-k groups 1024 bytes apart (SBO).
        const unsigned long long db = make_desc(sb, B_PANEL_BYTES, 1024);
        fence_regs<ACC>(acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            // k16 step: 32 bytes along A's swizzled rows, 16 k-rows (2048 bytes) down B.
            // The descriptor's address field counts 16-byte units.
            wgmma_tile<BN_>(acc, da + (unsigned long long)(kk * 32 >> 4),
                            db + (unsigned long long)(kk * 2048 >> 4), kt > 0 || kk > 0);
        }
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs<ACC>(acc);
    }
    wgmma_wait<0>();
    fence_regs<ACC>(acc);
    cp_async_wait<0>();
    __syncthreads();  // the pipeline's shared memory is reused below

    // D fragment of m64nN: warp w of the warpgroup holds rows 16 w + lane / 4 and + 8;
    // acc[4 j + 0, 1] are columns 8 j + 2 (lane % 4) + 0, 1 of the first row, acc[4 j + 2, 3]
    // the same columns of the second.
    const unsigned int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    const unsigned int r0 = wg * 64 + warp * 16 + (lane >> 2), t2 = 2 * (lane & 3);
    constexpr int CS = BN_ + 8;  // padded row (halves): the half2 writes are conflict-free
    __half* cs = reinterpret_cast<__half*>(smem);
#pragma unroll
    for (int j = 0; j < BN_ / 8; ++j) {
        const unsigned int col = j * 8 + t2;
        *reinterpret_cast<__half2*>(cs + r0 * CS + col) =
            __floats2half2_rn(acc[4 * j + 0], acc[4 * j + 1]);
        *reinterpret_cast<__half2*>(cs + (r0 + 8) * CS + col) =
            __floats2half2_rn(acc[4 * j + 2], acc[4 * j + 3]);
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
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // The launch rule asks for SMEM_ALIGN bytes more than the stages need, so the swizzle
    // atoms can start on a 1024-byte boundary whatever the dynamic window's base.
    unsigned char* smem =
        smem_raw + ((SMEM_ALIGN - (smem_addr(smem_raw) & (SMEM_ALIGN - 1))) & (SMEM_ALIGN - 1));
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
        gemm_tile<256, 4>(a, b, c, m, n, k, smem);
    else
        gemm_tile<128, 6>(a, b, c, m, n, k, smem);
}
