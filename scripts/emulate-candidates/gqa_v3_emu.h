// Emulations of the PTX wrappers of agents/gqa_decode_v3.cu beyond gqa_ptx_emu.h's: the
// relaxed cluster arrive and stores into another block's shared memory
// (st.shared::cluster). Used by gqa_v3_test.cpp only.
#include "gqa_ptx_emu.h"
inline void cluster_arrive_relaxed() { cluster_arrive(); }
// Stores into the same shared variable of the cluster's block `rank`, at the offset of `p`
// in this block's; aborts on a rank outside the cluster or a store past the variable.
template <class T> void store_remote(T* p, unsigned rank, T v) {
    if (rank >= g_cluster_x) { fprintf(stderr, "store to cluster rank %u of %u\n", rank, g_cluster_x); abort(); }
    auto [name, off] = t_block_shared->locate(p);
    BlockShared* dst = t_cluster_shared[rank];
    {
        std::lock_guard<std::mutex> g(dst->mu);
        auto it = dst->vars.find(name);
        if (it == dst->vars.end()) { fprintf(stderr, "remote store: block %u has no %s yet\n", rank, name.c_str()); abort(); }
        if (off + sizeof(T) > it->second.size()) { fprintf(stderr, "remote store past %s\n", name.c_str()); abort(); }
        memcpy(it->second.data() + off, &v, sizeof(T));
    }
}
inline void store_remote2(float2* p, unsigned rank, float2 v) { store_remote(p, rank, v); }
inline void store_remote4(float4* p, unsigned rank, float4 v) { store_remote(p, rank, v); }
