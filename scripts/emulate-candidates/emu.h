// Minimal CPU emulation of a CUDA block: one std::thread per CUDA thread, std::barrier for
// __syncthreads and for warp collectives (shfl, ldmatrix, mma.sync), deferred cp.async.
#pragma once
#include <barrier>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <thread>
#include <vector>
#include <deque>
#include <functional>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
struct dim3 { unsigned x = 1, y = 1, z = 1; };
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(x) alignas(x)
#define __constant__ static
struct uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
struct float3 { float x, y, z; };
struct float4 { float x, y, z, w; };
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float3 make_float3(float a, float b, float c) { return {a, b, c}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct __half { _Float16 v; };
struct __half2 { __half x, y; };
inline float __half2float(__half h) { return (float)h.v; }
inline __half __float2half(float f) { return {(_Float16)f}; }
inline float2 __half22float2(__half2 h) { return {(float)h.x.v, (float)h.y.v}; }
inline __half2 __floats2half2_rn(float a, float b) { return {{(_Float16)a}, {(_Float16)b}}; }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
using std::min; using std::max;
std::barrier<>* g_block_bar;
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
struct Warp { std::barrier<> bar{32}; uint64_t slot[32][12]; };
std::vector<Warp*> g_warps;
inline Warp& my_warp() { return *g_warps[threadIdx.x / 32 + threadIdx.y * blockDim.x / 32]; }
inline unsigned my_lane() { return (threadIdx.x + threadIdx.y * blockDim.x) % 32; }
inline float __shfl_xor_sync(unsigned, float v, int o) {
    Warp& w = my_warp(); unsigned l = my_lane();
    float f; memcpy(&w.slot[l][0], &v, 4); w.bar.arrive_and_wait();
    memcpy(&f, &w.slot[l ^ o][0], 4); w.bar.arrive_and_wait(); return f;
}
unsigned char* g_dyn_smem;
size_t g_dyn_bytes;
// Deferred cp.async: per thread, groups of pending copies.
struct Copy { unsigned dst; const void* src; int n; };
thread_local std::vector<Copy> t_open;
thread_local std::deque<std::vector<Copy>> t_groups;
inline void do_copies(std::vector<Copy>& g) {
    for (auto& c : g) { if (c.dst + 16 > g_dyn_bytes) { fprintf(stderr, "cp.async out of smem\n"); abort(); }
        memset(g_dyn_smem + c.dst, 0, 16); memcpy(g_dyn_smem + c.dst, c.src, c.n); }
}

template <class F> void launch(dim3 grid, dim3 block, size_t dyn, F kernel) {
    gridDim = grid; blockDim = block;
    std::vector<unsigned char> smem(dyn + 16);
    // poison the shared memory
    unsigned nthreads = block.x * block.y * block.z;
    for (unsigned by = 0; by < grid.y; ++by) for (unsigned bx = 0; bx < grid.x; ++bx) {
        memset(smem.data(), 0x7f, smem.size());
        g_dyn_smem = smem.data(); g_dyn_bytes = dyn;
        std::barrier<> bar(nthreads); g_block_bar = &bar;
        std::vector<Warp*> warps; for (unsigned w = 0; w < (nthreads + 31) / 32; ++w) warps.push_back(new Warp);
        g_warps = warps;
        std::vector<std::thread> ts;
        for (unsigned ty = 0; ty < block.y; ++ty) for (unsigned tx = 0; tx < block.x; ++tx)
            ts.emplace_back([=] { threadIdx = {tx, ty, 0}; blockIdx = {bx, by, 0};
                t_open.clear(); t_groups.clear(); kernel();
                if (!t_open.empty() || !t_groups.empty()) { for (auto& g : t_groups) do_copies(g); do_copies(t_open); } });
        for (auto& t : ts) t.join();
        for (auto* w : warps) delete w;
    }
}
