// Fused SwiGLU, fp16: out[t, j] = silu(x[t, j]) * x[t, d + j], silu in fp32. A 2-D grid:
// blockIdx.y walks the tokens (grid-stride past 65535), blockIdx.x a span of
// 8 x U x blockDim.x columns of one token, so no division is needed per element.
// When d % 8 == 0, each thread moves U vectors of 8 halves: all 2 x U 16-byte loads
// (gate and up) are issued before the first use, then 16-byte streaming stores.
// Otherwise, scalar accesses over the same span (any d).
// U depends on the shape, by the same test as the launch rule (few_tokens): many tokens,
// U = UNROLL with 256-thread blocks (the bandwidth-bound shapes); fewer than 256 tokens,
// U = SMALL_U with SMALL_THREADS-thread blocks (1 and 128 by default: 896 blocks at
// 64 x 14336, every SM an even share, the tail one 2 KB block).
// silu(g) = g * rcp(1 + 2^(-g log2 e)) with the approximate MUFU ex2 and rcp (as
// torch.compile's Triton kernel does with its approximate division), not the IEEE
// division, which costs a dozen instructions and a slow-path branch per element: at the
// few-token shape the whole op is one wave of loads, and the per-element instructions
// between the loads' arrival and the stores are the part of its time the kernel controls.
// Both are far more accurate than the fp16 output (relative error about 2^-22).
// FLAT = 1: many tokens with d % 8 == 0 take a one-dimensional grid over all
// tokens x d / 8 output vectors instead (vector v of token v / (d / 8)): at d = 11008 the
// 2-D grid's third span of each token has 1376 - 2 x 512 = 352 of its 512 vectors, so 10%
// of the resident threads idle; a flat grid has every thread of every block but the
// last one busy. It costs one division per vector.
// LOAD_HINT picks the cache policy of the 16-byte loads (every input byte is read once).
// Measured in the loop on the H200 with FLAT = 1, UNROLL = 1 (docs/runs/2026-11-30-h200-
// cache-hints): none of them is a win, the default stays 0.
//   0: __ldg (ld.global.nc);
//   1: ld.global.nc.L1::no_allocate.L2::256B, 256-byte DRAM fetches: 0.4-0.5% slower;
//   2: ld.global.nc.L1::no_allocate.L2::evict_first: refused by the driver's PTX JIT
//      (CUDA_ERROR_INVALID_PTX, driver 580.159.04);
//   3: ld.global.nc.L1::no_allocate: 0.1-0.7% faster in the loop, not in the bench after;
//   4: ld.global.cs (cache streaming, evict-first): as 3.
//   5: ld.global.nc.L2::cache_hint with an L2 evict-first policy (createpolicy): level
//      (docs/runs/2026-11-30-h200-small-shapes/sweep-1.txt).
// STORE_POLICY: 1, st.global.L2::cache_hint with an evict-first policy; 2,
// st.global.L1::no_allocate; both level with the streaming stores in the same sweep.
// MAX_THREADS: the many-token launch's block (and the kernel's launch bounds). One
// vector pair a thread (UNROLL = 1) in 512-thread blocks moved the two large shapes 0.6-0.8%
// faster than UNROLL = 2 in 256-thread blocks in that sweep; 1024 threads were 4-11%
// slower.
// STORE_PLAIN = 1: write-back stores instead of the streaming ones. With LOAD_HINT = 1 they
// were 6.0% slower at 4096x11008 and 8.3% at 16384x4096 than the streaming stores with the
// same loads; the same change in softmax, layer_norm and rmsnorm (streaming stores in place
// of their write-back ones) made those 0.5-1.6% slower: the policy's effect is the kernel's.
#include <cuda_fp16.h>

#ifndef FLAT
#define FLAT 0
#endif
#ifndef UNROLL
#define UNROLL 2
#endif
#ifndef SMALL_U
#define SMALL_U 1
#endif
#ifndef SMALL_THREADS
#define SMALL_THREADS 128
#endif
#ifndef LOAD_HINT
#define LOAD_HINT 0
#endif
#ifndef STORE_PLAIN
#define STORE_PLAIN 0
#endif
#ifndef STORE_POLICY
#define STORE_POLICY 0
#endif
// Threads a block at most (the launch rule's many-token block).
#ifndef MAX_THREADS
#define MAX_THREADS 256
#endif

// 2^x and 1/x by the MUFU approximations (ex2.approx.ftz, rcp.approx.ftz); plain C++ where
// the file is not compiled for a GPU (the CPU emulation of scripts/emulate-candidates.sh).
__device__ __forceinline__ float fast_exp2(float x) {
#ifdef __CUDA_ARCH__
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    return exp2f(x);
#endif
}
__device__ __forceinline__ float fast_rcp(float x) {
#ifdef __CUDA_ARCH__
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    return 1.0f / x;
#endif
}

// For g below about -88, 2^(-g log2 e) is +inf and its reciprocal 0: the result is a
// signed zero, as silu(g) * u rounds to in fp16 there.
__device__ __forceinline__ float silu_mul1(float g, float u) {
    return g * fast_rcp(1.0f + fast_exp2(g * -1.4426950408889634f)) * u;
}

__device__ __forceinline__ void store_cs(uint4* p, uint4 v) {
#if STORE_PLAIN
    *p = v;
#elif STORE_POLICY == 1 && defined(__CUDA_ARCH__)
    // L2 evict-first by an explicit cache policy (createpolicy), L1 write-through as usual.
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p),
                 "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(policy)
                 : "memory");
#elif STORE_POLICY == 2 && defined(__CUDA_ARCH__)
    asm volatile("st.global.L1::no_allocate.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x),
                 "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
#else
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
#endif
}

#if LOAD_HINT == 1
#define LOAD_OP "ld.global.nc.L1::no_allocate.L2::256B.v4.u32"
#elif LOAD_HINT == 2
#define LOAD_OP "ld.global.nc.L1::no_allocate.L2::evict_first.v4.u32"
#elif LOAD_HINT == 3
#define LOAD_OP "ld.global.nc.L1::no_allocate.v4.u32"
#elif LOAD_HINT == 4
#define LOAD_OP "ld.global.cs.v4.u32"
#endif

__device__ __forceinline__ uint4 load_in(const uint4* p) {
#if LOAD_HINT == 5 && defined(__CUDA_ARCH__)
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    uint4 v;
    asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(policy));
    return v;
#elif LOAD_HINT && LOAD_HINT != 5 && defined(__CUDA_ARCH__)
    uint4 v;
    asm(LOAD_OP " {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
#else
    return __ldg(p);
#endif
}

// Same test as the launch rule's grid and block expressions.
__device__ __forceinline__ bool few_tokens(unsigned int tokens) { return tokens < 256u; }

template <int U>
__device__ __forceinline__ void silu_mul_span(const __half* __restrict__ x,
                                              __half* __restrict__ out, unsigned int tokens,
                                              unsigned int d) {
    const unsigned int span = 8u * U * blockDim.x;
    const unsigned int col0 = blockIdx.x * span;
    if ((d & 7u) == 0) {
        const unsigned int nvec = d >> 3;
        const unsigned int v0 = col0 >> 3;
        for (unsigned int t = blockIdx.y; t < tokens; t += gridDim.y) {
            const uint4* g8 = reinterpret_cast<const uint4*>(x + (size_t)t * 2 * d);
            const uint4* u8 = g8 + nvec;
            uint4* o8 = reinterpret_cast<uint4*>(out + (size_t)t * d);
            uint4 g[U], u[U];
#pragma unroll
            for (int i = 0; i < U; ++i) {
                const unsigned int j = v0 + threadIdx.x + i * blockDim.x;
                if (j < nvec) {
                    g[i] = load_in(g8 + j);
                    u[i] = load_in(u8 + j);
                }
            }
#pragma unroll
            for (int i = 0; i < U; ++i) {
                const unsigned int j = v0 + threadIdx.x + i * blockDim.x;
                if (j < nvec) {
                    const __half2* hg = reinterpret_cast<const __half2*>(&g[i]);
                    const __half2* hu = reinterpret_cast<const __half2*>(&u[i]);
                    uint4 o;
                    __half2* ho = reinterpret_cast<__half2*>(&o);
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const float2 fg = __half22float2(hg[q]);
                        const float2 fu = __half22float2(hu[q]);
                        ho[q] = __floats2half2_rn(silu_mul1(fg.x, fu.x), silu_mul1(fg.y, fu.y));
                    }
                    store_cs(o8 + j, o);
                }
            }
        }
    } else {
        const unsigned int end = min(d, col0 + span);
        for (unsigned int t = blockIdx.y; t < tokens; t += gridDim.y) {
            const __half* xg = x + (size_t)t * 2 * d;
            __half* o = out + (size_t)t * d;
            for (unsigned int j = col0 + threadIdx.x; j < end; j += blockDim.x)
                o[j] = __float2half(silu_mul1(__half2float(xg[j]), __half2float(xg[d + j])));
        }
    }
}

// The flat path (FLAT = 1, many tokens, d % 8 == 0): U output vectors a thread, blockDim
// apart, over tokens x nvec vectors; the gate and up vectors of output vector v are at
// v + t x nvec and v + (t + 1) x nvec of the input (t = v / nvec: rows of 2 x nvec).
template <int U>
__device__ __forceinline__ void silu_mul_flat(const __half* __restrict__ x,
                                              __half* __restrict__ out, unsigned int tokens,
                                              unsigned int d) {
    const unsigned int nvec = d >> 3;
    // 32-bit vector indices: an output of 2^32 vectors (64 GiB) does not fit in any GPU
    // this runs on, with its input twice as large; fault loudly rather than wrap.
    if ((unsigned long long)tokens * nvec >= (1ull << 32)) __trap();
    const unsigned int total = tokens * nvec;
    const unsigned int v0 = blockIdx.x * U * blockDim.x + threadIdx.x;
    const uint4* x8 = reinterpret_cast<const uint4*>(x);
    uint4* o8 = reinterpret_cast<uint4*>(out);
    uint4 g[U], u[U];
#pragma unroll
    for (int i = 0; i < U; ++i) {
        const unsigned int v = v0 + i * blockDim.x;
        if (v < total) {
            const size_t row = (size_t)(v / nvec) * nvec;  // t x nvec
            g[i] = load_in(x8 + row + v);
            u[i] = load_in(x8 + row + nvec + v);
        }
    }
#pragma unroll
    for (int i = 0; i < U; ++i) {
        const unsigned int v = v0 + i * blockDim.x;
        if (v < total) {
            const __half2* hg = reinterpret_cast<const __half2*>(&g[i]);
            const __half2* hu = reinterpret_cast<const __half2*>(&u[i]);
            uint4 o;
            __half2* ho = reinterpret_cast<__half2*>(&o);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float2 fg = __half22float2(hg[q]);
                const float2 fu = __half22float2(hu[q]);
                ho[q] = __floats2half2_rn(silu_mul1(fg.x, fu.x), silu_mul1(fg.y, fu.y));
            }
            store_cs(o8 + v, o);
        }
    }
}

extern "C" __global__ void __launch_bounds__(MAX_THREADS)
silu_mul_f16(const __half* __restrict__ x, __half* __restrict__ out, unsigned int tokens,
             unsigned int d) {
    if (few_tokens(tokens)) {
        silu_mul_span<SMALL_U>(x, out, tokens, d);
    } else if (FLAT && (d & 7u) == 0) {
        silu_mul_flat<UNROLL>(x, out, tokens, d);
    } else {
        silu_mul_span<UNROLL>(x, out, tokens, d);
    }
}
