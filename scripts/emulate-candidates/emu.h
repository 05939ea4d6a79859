// Minimal CPU emulation of a CUDA block: one std::thread per CUDA thread, std::barrier for
// __syncthreads and for warp collectives (shfl, ldmatrix, mma.sync), deferred cp.async.
// Blocks run one after the other, or (launch_clusters) the blocks of a thread-block cluster
// side by side, with per-block shared memory (block_shared) and a cluster barrier.
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
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
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
// Per CUDA thread: its block's barrier, warps and dynamic shared memory.
thread_local std::barrier<>* g_block_bar;
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
struct Warp { std::barrier<> bar{32}; uint64_t slot[32][12]; };
thread_local std::vector<Warp*> g_warps;
inline Warp& my_warp() { return *g_warps[threadIdx.x / 32 + threadIdx.y * blockDim.x / 32]; }
inline unsigned my_lane() { return (threadIdx.x + threadIdx.y * blockDim.x) % 32; }
inline float __shfl_xor_sync(unsigned, float v, int o) {
    Warp& w = my_warp(); unsigned l = my_lane();
    float f; memcpy(&w.slot[l][0], &v, 4); w.bar.arrive_and_wait();
    memcpy(&f, &w.slot[l ^ o][0], 4); w.bar.arrive_and_wait(); return f;
}
thread_local unsigned char* g_dyn_smem;
thread_local size_t g_dyn_bytes;
// A block's static shared variables, by name, for kernels whose `__shared__` declarations
// the harness rewrote into block_shared calls (needed when blocks run side by side).
struct BlockShared {
    std::mutex mu;
    std::map<std::string, std::vector<unsigned char>> vars;
    // The variable holding `p`, and p's offset in it.
    std::pair<std::string, size_t> locate(const void* p) {
        std::lock_guard<std::mutex> g(mu);
        auto* b = (const unsigned char*)p;
        for (auto& [name, v] : vars)
            if (b >= v.data() && b < v.data() + v.size()) return {name, (size_t)(b - v.data())};
        fprintf(stderr, "not a shared variable of this block\n"); abort();
    }
    unsigned char* at(const std::string& name, size_t off) {
        std::lock_guard<std::mutex> g(mu);
        auto it = vars.find(name);
        if (it == vars.end()) { fprintf(stderr, "no shared %s in that block\n", name.c_str()); abort(); }
        return it->second.data() + off;
    }
};
thread_local BlockShared* t_block_shared;
template <class T> T& block_shared(const char* name) {
    std::lock_guard<std::mutex> g(t_block_shared->mu);
    auto& v = t_block_shared->vars[name];
    if (v.empty()) v.assign(sizeof(T), 0x7f);  // poisoned, as the dynamic shared memory
    return *reinterpret_cast<T*>(v.data());
}
// The running launch's cluster (blocks along x; 1 without clusters), and per thread its
// cluster's blocks' shared variables (by rank) and barrier.
unsigned g_cluster_x = 1;
thread_local std::vector<BlockShared*> t_cluster_shared;
thread_local std::barrier<>* t_cluster_bar;
thread_local std::optional<std::barrier<>::arrival_token> t_cluster_token;
// Deferred cp.async: per thread, groups of pending copies.
struct Copy { unsigned dst; const void* src; int n; };
thread_local std::vector<Copy> t_open;
thread_local std::deque<std::vector<Copy>> t_groups;
inline void do_copies(std::vector<Copy>& g) {
    for (auto& c : g) { if (c.dst + 16 > g_dyn_bytes) { fprintf(stderr, "cp.async out of smem\n"); abort(); }
        memset(g_dyn_smem + c.dst, 0, 16); memcpy(g_dyn_smem + c.dst, c.src, c.n); }
}

// Runs the grid cluster by cluster (clusters of cx blocks along x), the blocks of a cluster
// side by side, each with its own poisoned shared memory.
template <class F> void launch_clusters(dim3 grid, dim3 block, size_t dyn, unsigned cx, F kernel) {
    if (cx == 0 || grid.x % cx) { fprintf(stderr, "grid.x %u is not whole clusters of %u\n", grid.x, cx); abort(); }
    gridDim = grid; blockDim = block; g_cluster_x = cx;
    unsigned nthreads = block.x * block.y * block.z;
    for (unsigned by = 0; by < grid.y; ++by) for (unsigned bx0 = 0; bx0 < grid.x; bx0 += cx) {
        std::vector<std::vector<unsigned char>> smem(cx, std::vector<unsigned char>(dyn + 16, 0x7f));
        std::vector<std::unique_ptr<std::barrier<>>> bars;
        std::vector<std::vector<Warp*>> warps(cx);
        std::vector<std::unique_ptr<BlockShared>> shared;
        std::vector<BlockShared*> shared_ptrs;
        for (unsigned r = 0; r < cx; ++r) {
            bars.emplace_back(new std::barrier<>(nthreads));
            for (unsigned w = 0; w < (nthreads + 31) / 32; ++w) warps[r].push_back(new Warp);
            shared.emplace_back(new BlockShared);
            shared_ptrs.push_back(shared.back().get());
        }
        std::barrier<> cluster_bar(nthreads * cx);
        std::vector<std::thread> ts;
        for (unsigned r = 0; r < cx; ++r)
            for (unsigned ty = 0; ty < block.y; ++ty) for (unsigned tx = 0; tx < block.x; ++tx)
                ts.emplace_back([&, r, tx, ty] {
                    threadIdx = {tx, ty, 0}; blockIdx = {bx0 + r, by, 0};
                    g_dyn_smem = smem[r].data(); g_dyn_bytes = dyn;
                    g_block_bar = bars[r].get(); g_warps = warps[r];
                    t_block_shared = shared[r].get(); t_cluster_shared = shared_ptrs;
                    t_cluster_bar = &cluster_bar; t_cluster_token.reset();
                    t_open.clear(); t_groups.clear(); kernel();
                    if (!t_open.empty() || !t_groups.empty()) { for (auto& g : t_groups) do_copies(g); do_copies(t_open); } });
        for (auto& t : ts) t.join();
        for (auto& ws : warps) for (auto* w : ws) delete w;
    }
    g_cluster_x = 1;
}
template <class F> void launch(dim3 grid, dim3 block, size_t dyn, F kernel) {
    launch_clusters(grid, block, dyn, 1, kernel);
}
