// Emulations of the PTX wrappers of the gqa_decode candidates (and the CUDA intrinsics
// they use beyond emu.h); the cp.async ring of gqa_decode_pipe.cu uses ptx_emu.h's.
#include "ptx_emu.h"
#include <atomic>
struct uint2 { unsigned x, y; };
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    uint64_t v = (uint64_t)y << 32 | x; unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
template <class T> inline T __ldcg(const T* p) { return *p; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __syncwarp(unsigned = 0xffffffffu) { my_warp().bar.arrive_and_wait(); }
inline void __trap() { fprintf(stderr, "__trap\n"); abort(); }
inline uint4 ld_stream(const __half* p) { uint4 r; memcpy(&r, p, 16); return r; }
inline float ex2(float x) { return std::exp2(x); }
// Thread-block clusters (emu.h's launch_clusters): rank along x, size, the split barrier,
// and loads from the same shared variable of another block of the cluster.
inline unsigned cluster_rank() { return blockIdx.x % g_cluster_x; }
inline unsigned cluster_blocks() { return g_cluster_x; }
inline void cluster_arrive() {
    if (t_cluster_token) { fprintf(stderr, "cluster_arrive twice without a wait\n"); abort(); }
    t_cluster_token.emplace(t_cluster_bar->arrive());
}
inline void cluster_wait() {
    if (!t_cluster_token) { fprintf(stderr, "cluster_wait without an arrive\n"); abort(); }
    t_cluster_bar->wait(std::move(*t_cluster_token));
    t_cluster_token.reset();
}
template <class T> T load_remote(const T* p, unsigned rank) {
    if (rank >= g_cluster_x) { fprintf(stderr, "cluster rank %u of %u\n", rank, g_cluster_x); abort(); }
    auto [name, off] = t_block_shared->locate(p);
    T v; memcpy(&v, t_cluster_shared[rank]->at(name, off), sizeof(T)); return v;
}
inline float2 load_remote2(const float2* p, unsigned rank) { return load_remote(p, rank); }
inline float4 load_remote4(const float4* p, unsigned rank) { return load_remote(p, rank); }
inline void mma_rows8(float& d0, float& d1, unsigned a0, unsigned a2, unsigned b0, unsigned b1) {
    unsigned a[4] = {a0, 0, a2, 0}, b[2] = {b0, b1};
    float d[4] = {d0, d1, 0, 0};
    mma_16816(d, a, b);
    d0 = d[0]; d1 = d[1];
}
