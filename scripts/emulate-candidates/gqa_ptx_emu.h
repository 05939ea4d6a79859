// Emulations of the PTX wrappers of the gqa_decode candidates (and the CUDA intrinsics
// they use beyond emu.h); the cp.async ring of gqa_decode_pipe.cu uses ptx_emu.h's, the
// bulk copies and mbarriers of gqa_decode_bulk.cu the ones at the end of this file.
#include "ptx_emu.h"
#include <atomic>
#include <map>
#include <mutex>
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
inline void mma_rows8(float& d0, float& d1, unsigned a0, unsigned a2, unsigned b0, unsigned b1) {
    unsigned a[4] = {a0, 0, a2, 0}, b[2] = {b0, b1};
    float d[4] = {d0, d1, 0, 0};
    mma_16816(d, a, b);
    d0 = d[0]; d1 = d[1];
}

// Bulk copies (cp.async.bulk ... mbarrier::complete_tx::bytes) and mbarriers. One state
// per barrier address: the arrivals still pending in the current phase, its transaction
// count, the number of completed phases, and (deferred) the copies not landed yet.
// Deferred (the default): a copy lands when a thread waits for its phase, the latest a GPU
// may land it, so a read of a stage before its wait sees the poison or the stage's old
// tile. BULK_EAGER: it lands at issue, the earliest, so a refill issued while lanes still
// read the stage shows. Either way the emulation aborts where the GPU would hang or
// misbehave: a wait on a phase nobody armed, a byte count that never balances, a second
// arrival in a one-arrival phase, an uninitialised barrier, a copy outside the shared
// memory or the registered global buffers, misaligned or not a multiple of 16 bytes, a
// copy still in flight when the block ends.
struct BulkCopy { unsigned char* dst; const unsigned char* src; unsigned n; };
struct MBar { unsigned expected = 0, pending = 0; long tx = 0; unsigned phase = 0; std::vector<BulkCopy> copies; };
std::map<const void*, MBar> g_mbars;
std::mutex g_mbar_mutex;
// The global buffers a bulk copy may read ([begin, end) byte ranges), set by the test.
std::vector<std::pair<const void*, size_t>> g_bulk_sources;
[[noreturn]] inline void mbar_fail(const char* what) { fprintf(stderr, "mbarrier/bulk copy: %s\n", what); abort(); }
inline MBar& mbar_state(const void* bar) {
    auto it = g_mbars.find(bar);
    if (it == g_mbars.end()) mbar_fail("barrier used before mbarrier.init");
    return it->second;
}
inline void mbar_maybe_complete(MBar& b) {
    if (b.pending == 0 && b.tx == 0 && b.copies.empty()) { ++b.phase; b.pending = b.expected; }
}
inline void mbar_land(MBar& b) {
    for (auto& c : b.copies) { memcpy(c.dst, c.src, c.n); b.tx -= c.n; }
    b.copies.clear();
}
inline void mbar_init(unsigned long long* bar) {
    std::lock_guard<std::mutex> lock(g_mbar_mutex);
    MBar b; b.expected = b.pending = 1; g_mbars[bar] = b;
}
inline void mbar_init_fence() {}
inline void fence_proxy_async() {}
inline void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
    std::lock_guard<std::mutex> lock(g_mbar_mutex);
    MBar& b = mbar_state(bar);
    if (b.pending == 0) mbar_fail("arrival on a phase whose arrivals are all done (armed twice)");
    b.tx += bytes; --b.pending;
    mbar_maybe_complete(b);
}
inline void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    std::lock_guard<std::mutex> lock(g_mbar_mutex);
    MBar& b = mbar_state(bar);
    auto* d = (unsigned char*)dst; auto* s = (const unsigned char*)src;
    if (bytes == 0 || bytes % 16) mbar_fail("size not a positive multiple of 16");
    if ((d - g_dyn_smem) % 16 || (uintptr_t)s % 16) mbar_fail("misaligned address");
    if (d < g_dyn_smem || d + bytes > g_dyn_smem + g_dyn_bytes) mbar_fail("destination outside the dynamic shared memory");
    bool inside = false;
    for (auto& [p, n] : g_bulk_sources) inside |= s >= (const unsigned char*)p && s + bytes <= (const unsigned char*)p + n;
    if (!inside) mbar_fail("source outside the K and V buffers");
    b.copies.push_back({d, s, bytes});
#ifdef BULK_EAGER
    mbar_land(b);
    mbar_maybe_complete(b);
#endif
}
inline void mbar_wait(unsigned long long* bar, unsigned parity) {
    std::lock_guard<std::mutex> lock(g_mbar_mutex);
    MBar& b = mbar_state(bar);
    if ((b.phase & 1) != parity) return;  // the phase of this parity has completed
    if (b.pending != 0) mbar_fail("wait on a phase nobody armed (the GPU would hang)");
    mbar_land(b);
    if (b.tx != 0) mbar_fail("the phase's byte count does not balance (the GPU would hang)");
    mbar_maybe_complete(b);
}
// At the end of each block: no copy in flight or phase unfinished, then forget the
// barriers (the next block must initialise its own).
inline void mbar_block_end() {
    for (auto& [p, b] : g_mbars)
        if (b.pending != b.expected || b.tx != 0 || !b.copies.empty()) mbar_fail("copies still in flight at the end of the block");
    g_mbars.clear();
}
