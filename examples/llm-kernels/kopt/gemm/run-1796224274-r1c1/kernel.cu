// C[M, N] = A[M, K] * B[K, N], fp16 in, fp32 accumulation, fp16 out, all row-major, on
// Hopper's TMA + warpgroup MMA (sm_90a: compile with --gpu-architecture=compute_90a).
//
// Kernel arguments (in this order):
//   a_map, b_map, c_map : const __grid_constant__ TmaMap (128-byte CUtensorMap, by value)
//   m, n, k             : unsigned int
// The maps (dims / box innermost first, as cuTensorMapEncodeTiled takes them), fp16; the
// same for every path and tunable:
//   a_map: tensor_map(a, dims = [k, m], box = [64, 128], swizzle = 128, l2_promotion = 256)
//   b_map: tensor_map(b, dims = [n, k], box = [64, 64],  swizzle = 128, l2_promotion = 256)
//   c_map: tensor_map(c, dims = [n, m], box = [64, 64],  swizzle = 128)
// Requirements: n % 8 == 0 and k % 8 == 0 (a tensor map's row pitch must be a multiple of
// 16 bytes: the driver refuses to encode the map otherwise), 16-byte aligned buffers, k >= 1.
// M is free: TMA zero-fills rows of A past m and clips the stores of C past m (and past n);
// K past the last full 64-slice is zero-filled in both A and B.
//
// Launch rule (WIDE_MIN_TILES, NUM_SMS = 132; CM = the cluster size the rule picks, 1 or 2):
//   wide  = ceil_div(m, 128) * ceil_div(n, 256) >= WIDE_MIN_TILES   (the kernel recomputes it)
//   BN    = wide ? 256 : 128
//   units = ceil_div(ceil_div(m, 128), CM) * ceil_div(n, BN)
//   grid  = (CM * min(units, NUM_SMS / CM), 1, 1)   persistent   [or (CM * units, 1, 1)]
//   block = (384, 1, 1), cluster = (CM, 1, 1) (none when CM = 1)
//   smem  = 1024 + max(STAGES_WIDE * 49152, STAGES_NARROW * 32768) + 32768 + 256  (= 230656)
// The kernel reads the cluster size from %cluster_nctarank, and strides over the tiles by
// the grid, so any grid (a multiple of CM) is correct; the rule only chooses the speed.
// Measured on the H200 (scripts/gemm-tma, 2026-12-02, two sessions), % of torch.matmul at
// 512 / 2048 / 4096 x 4096 x 4096: CM = 1 persistent 99.2-99.9 / 99.5-99.6 / 99.1 (GROUP_M
// = 16: 99.9 / 100.2 / 99.9, GROUP_M = 1: 97.4 / 97.1 / 96.9); CM = 2 persistent 95.3-96.1 /
// 98.4-98.5 / 98.9-99.0; one CTA per tile (CM = 1) 99.4-99.6 / 97.9-98.0 / 97.1-97.3.
// CM = 1, persistent, is the recommended rule.
//
// Structure (one CTA per SM, 384 threads = 3 warpgroups):
// - Warpgroup 0 is the producer: it gives registers back (setmaxnreg.dec 40) and one thread
//   issues the TMA copies of each K-slice (BK = 64) into a ring of shared-memory stages
//   (STAGES_WIDE or STAGES_NARROW). Each stage has a "full" mbarrier (1 arrival: the
//   producer's arrive.expect_tx of the stage's bytes, completed by the copies' complete_tx)
//   and an "empty" mbarrier (one arrival per consumer warpgroup of every CTA whose producer
//   writes into the stage: 2 x CM).
// - Warpgroups 1 and 2 are consumers (setmaxnreg.inc 232; 40 x 128 + 232 x 256 = 64512 of
//   the 65536 registers): consumer c owns rows 64c..64c+63 of the BM = 128 row block and all
//   BN columns: wgmma m64nBNk16, BN / 2 fp32 accumulators per thread. Per K-slice: wait
//   "full", 4 wgmma (k16 steps), commit, wait until only this slice's group is in flight,
//   then release the previous slice's stage. So the tensor cores always have the next
//   slice queued behind the current one.
// - Tiles: 128 x 256 (m64n256k16) when the grid has at least WIDE_MIN_TILES of them, else
//   128 x 128 (m64n128k16) so that small M still fills the SMs (M = 512: 128 tiles, not 64).
// - Persistent: with the grid capped at one CTA per SM, each CTA (cluster) walks the tile
//   list with a stride of the number of CTAs (clusters), in a grouped order (GROUP_M
//   row-block units at a time, row blocks fastest) so the tiles in flight share A and B in
//   L2. The stage ring and its phases run on across tiles, so the producer fills the next
//   tile's stages while the consumers store the previous one. A non-persistent launch (one
//   CTA / cluster per tile) runs the same code, one loop trip each.
// - Cluster of 2 (cluster dims (2, 1, 1) at launch): the two CTAs take two vertically
//   adjacent tiles (row blocks 2u and 2u + 1, same column block). They need the same B
//   slice, so each CTA loads half of its 64-column panels and multicasts them to both CTAs:
//   half of B's L2 traffic. Both CTAs' consumers must have released a stage before either
//   producer writes it again, so every consumer warpgroup arrives on the "empty" barrier of
//   both CTAs (count 2 x 2 = 4). A row block past m (odd number of row blocks) computes on
//   zero-filled A and its stores are clipped.
// - Epilogue: per consumer, its 64 x BN accumulators go out in 64 x 64 chunks: fp32 -> fp16,
//   stmatrix into a 128-byte-swizzled 8 KB buffer (two per consumer, alternating), then one
//   TMA store per chunk (bulk async group). A buffer is written again only after the store
//   that read it has finished reading (cp.async.bulk.wait_group.read 1).
//
// Shared memory layout (dynamic, aligned to 1024 bytes at run time, hence +1024 in the
// launch rule): STAGES x [A: 128 x 64 halves (16 KB) | B: BN / 64 panels of 64 (k) x 64 (n)
// halves (8 KB each)], then 4 x 8 KB epilogue buffers, then 2 x STAGES mbarriers.
//   (BN = 256, 4 stages: 229440 bytes used; BN = 128, 6 stages: the same; sm_90's limit is
//   232448, so 230656 with the alignment slack and some spare fits.)
//
// Operand layouts (what the wgmma descriptors describe; a TMA box whose inner extent is 64
// halves = 128 bytes, with the 128-byte swizzle, lands in exactly these canonical layouts):
//   A (K-major): row r of the 128 x 64 tile at r * 128 bytes, its 16-byte chunk c stored at
//     chunk c ^ (r % 8): 8-row x 128-byte swizzle atoms of 1024 bytes. Descriptor: SBO = 1024
//     (next 8-row group), LBO unused for a swizzled K-major operand (set to 16), k16 step =
//     +32 bytes of start address.
//   B (N-major: [K, N] with N contiguous; wgmma's transpose-b bit = 1): panel p (columns
//     64p..64p+63) is a 64 (k) x 64 (n) box, k-row r at r * 128 bytes, chunk c ^ (r % 8).
//     Descriptor: LBO = 8192 (next 64-column panel), SBO = 1024 (next 8-k group), k16 step =
//     +2048 bytes (16 k-rows).
//   The same layouts (and descriptors) as the cp.async variant run-1795963354-r1c2, which is
//   verified; there the chunks were placed by hand, here by TMA's 128B swizzle, which XORs
//   address bits [4:6] with bits [7:9] (hence the 1024-byte alignment of every buffer).
//   Descriptor bits: [0:14) start >> 4, [16:30) LBO >> 4, [32:46) SBO >> 4, [49:52) base
//   offset (0: atoms are 1024-aligned), [62:64) layout = 1 (128-byte swizzle).
//   C chunk (epilogue): row r of 64 at r * 128 bytes, chunk c ^ (r % 8): the c_map box with
//     the 128B swizzle; stmatrix's 8 rows of 16 bytes then hit 8 distinct bank groups.

// ---------------------------------------------------------------------------------------
// Tunables (the launch rule must use the same values).
#ifndef WIDE_MIN_TILES
#define WIDE_MIN_TILES 100  // 128 x 256 tiles when there are at least this many, else 128 x 128
#endif
#ifndef STAGES_WIDE
#define STAGES_WIDE 4       // ring depth of the 128 x 256 path (48 KB a stage)
#endif
#ifndef STAGES_NARROW
#define STAGES_NARROW 6     // ring depth of the 128 x 128 path (32 KB a stage)
#endif
#ifndef GROUP_M
#define GROUP_M 8           // tile order: row-block units per group (see tile_of)
#endif

#define BM 128              // two consumer warpgroups x 64 rows
#define BK 64               // 64 halves = 128 bytes: one swizzle row
#define NUM_THREADS 384     // producer warpgroup + 2 consumer warpgroups
#define A_BYTES (BM * BK * 2)          // 16 KB
#define B_PANEL_BYTES (BK * 64 * 2)    // 8 KB: 64 k-rows of 64 columns
#define C_BUF_BYTES (64 * 64 * 2)      // one 64 x 64 epilogue chunk
#define SMEM_LIMIT 232448              // sm_90's opt-in maximum of dynamic shared memory

// Shared-memory layout of one path (offsets from the 1024-aligned base).
template <int BN_, int STAGES_>
struct Layout {
    static constexpr unsigned int B_BYTES = BN_ * BK * 2;
    static constexpr unsigned int STAGE = A_BYTES + B_BYTES;
    static constexpr unsigned int C_OFF = STAGES_ * STAGE;             // 4 epilogue buffers
    static constexpr unsigned int BAR_OFF = C_OFF + 4 * C_BUF_BYTES;   // full[], then empty[]
    static constexpr unsigned int USED = BAR_OFF + 2 * STAGES_ * 8;
    static_assert(STAGE % 1024 == 0, "swizzle atoms stay 1024-byte aligned");
    static_assert(STAGES_ >= 2, "at least double buffering");
    static_assert(USED + 1024 <= SMEM_LIMIT, "over the 227 KB of shared memory of sm_90");
};
using WideLayout = Layout<256, STAGES_WIDE>;
using NarrowLayout = Layout<128, STAGES_NARROW>;

// The driver's CUtensorMap: 128 opaque bytes, passed by value. Declared here because
// <cuda.h> is a host header (it includes <stdlib.h>) that NVRTC cannot compile.
struct __align__(64) TmaMap {
    unsigned long long opaque[16];
};

// ---------------------------------------------------------------------------------------
// PTX-BEGIN: mbarriers, TMA, cluster, wgmma, stmatrix.
__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    return (unsigned int)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(unsigned int bar, unsigned int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Makes the barrier inits visible to the async proxy (TMA's complete_tx) and, with the
// cluster barrier after it, to the other CTA of the cluster.
__device__ __forceinline__ void fence_mbar_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The producer's one arrival per stage use, announcing the bytes the copies will deliver.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned int bar, unsigned int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive_local(unsigned int bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Arrival on the barrier at the same offset in the shared memory of CTA `rank` of the
// cluster (the own CTA included). Default semantics (release at CTA scope), as CUTLASS's
// ClusterBarrier::arrive(cta_id): what it publishes is that this warpgroup's wgmma reads of
// the stage have completed (wgmma.wait_group), not data, so nothing needs ordering at
// cluster scope; .release.cluster would cost a MEMBAR.GPU before every arrival.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned int bar, unsigned int rank) {
    asm volatile(
        "{\n.reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
        "r"(rank)
        : "memory");
}

// Spins until the phase of parity `parity` has completed. A fresh barrier is in phase 0,
// so waiting for parity 1 returns at once (the producer's first pass over the ring).
__device__ __forceinline__ void mbar_wait(unsigned int bar, unsigned int parity) {
    unsigned int done;
    do {
        asm volatile(
            "{\n.reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

__device__ __forceinline__ void prefetch_tmap(const TmaMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map))
                 : "memory");
}

// 2D tile global -> this CTA's shared memory; completes `bytes` on `bar` (this CTA's).
// Coordinates are in elements, innermost first; out-of-bounds elements are zero-filled
// (and still counted in the transaction bytes).
__device__ __forceinline__ void tma_load(unsigned int dst, const TmaMap* map, int c0, int c1,
                                         unsigned int bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// The same, written at the same offsets into the shared memory of every CTA in `mask`, each
// copy completing its bytes on the barrier at `bar`'s offset in that CTA.
__device__ __forceinline__ void tma_load_multicast(unsigned int dst, const TmaMap* map, int c0,
                                                   int c1, unsigned int bar,
                                                   unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
        : "memory");
}

// 2D tile shared -> global; the parts outside the tensor are not written.
__device__ __forceinline__ void tma_store(const TmaMap* map, unsigned int src, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
            reinterpret_cast<unsigned long long>(map)),
        "r"(c0), "r"(c1), "r"(src)
        : "memory");
}

__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Waits until at most N of this thread's bulk groups still read their shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Waits until all of this thread's bulk groups have completed (writes done).
__device__ __forceinline__ void bulk_wait_all() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Makes this thread's generic-proxy shared-memory writes (stmatrix) visible to the async
// proxy (the TMA store that reads them); the named barrier after it covers the other threads.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Barrier among the 128 threads of one consumer warpgroup (ids 1, 2; 0 is __syncthreads).
__device__ __forceinline__ void named_bar_sync(unsigned int id) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

__device__ __forceinline__ unsigned int cluster_ctarank() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

__device__ __forceinline__ unsigned int cluster_nctarank() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
    return r;
}

__device__ __forceinline__ unsigned int cluster_id_x() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
    return r;
}

__device__ __forceinline__ unsigned int ncluster_x() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
    return r;
}

template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}

template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
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
// wgmma window (the tensor cores read and write them until wgmma_wait).
template <int R>
__device__ __forceinline__ void fence_regs(float* d) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle (layout bits above).
__device__ __forceinline__ unsigned long long make_desc(unsigned int addr, unsigned int lbo,
                                                        unsigned int sbo) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) |
           ((unsigned long long)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((unsigned long long)((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}

// The operand lists below are regular: %0 .. %(N/2 - 1) are d[0 .. N/2 - 1], then the two
// descriptors and the scale-d flag (accumulate 0: D = A * B, the first k16 step of a tile,
// so the accumulators need no zero fill; 1: D += A * B). Immediates: scale-a 1, scale-b 1,
// transpose-a 0 (A is K-major), transpose-b 1 (B is N-major).
__device__ __forceinline__ void wgmma_m64n256(float* d, unsigned long long desc_a,
                                              unsigned long long desc_b, int accumulate) {
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

__device__ __forceinline__ void wgmma_m64n128(float* d, unsigned long long desc_a,
                                              unsigned long long desc_b, int accumulate) {
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

// Stores four 8 x 8 b16 matrices: lanes 8i .. 8i + 7 give the row addresses of matrix i;
// register i holds the calling lane's two elements of matrix i (row lane / 4, columns
// 2 (lane % 4), + 1), which is the mma accumulator fragment's layout.
__device__ __forceinline__ void stmatrix_x4(unsigned int addr, unsigned int r0, unsigned int r1,
                                            unsigned int r2, unsigned int r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

// Two fp32 to a packed fp16 pair: lo in bits 0-15 (the lower column), hi in bits 16-31.
// (cvt.rn.f16x2.f32 d, a, b puts a in the upper half.)
__device__ __forceinline__ unsigned int pack_half2(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// PTX-END


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

// Whether the launch rule chose the 128 x 256 tile: the same expression as the rule's.
__device__ __forceinline__ bool wide_tiles(unsigned int m, unsigned int n) {
    // (signed 64-bit, so WIDE_MIN_TILES = 0, "always wide", compiles without a warning)
    return (long long)(((m + BM - 1) / BM) * ((n + 255) / 256)) >= (long long)WIDE_MIN_TILES;
}

// The work of one CTA: the tile list and its K-slices, identical for the producer and the
// consumers (and for both CTAs of a cluster, which share `cid`).
struct Work {
    unsigned int m_units;   // row-block units: ceil(row blocks / cluster size)
    unsigned int n_blocks;  // column blocks
    unsigned int units;     // m_units * n_blocks
    unsigned int ktiles;    // K-slices of BK
    unsigned int cid, ncl;  // this cluster (CTA) and how many there are: the unit stride
    unsigned int rank;      // rank in the cluster: row block = unit's first + rank
};

// Work unit `u` -> (row-block unit, column block). Units are grouped GROUP_M row-block units
// at a time; inside a group the row-block unit varies fastest, so consecutive units (which
// run at the same time on neighbouring CTAs) share B's column panel, and a group's A rows
// stay in L2 while its column blocks are walked.
__device__ __forceinline__ void tile_of(unsigned int u, const Work& w, unsigned int& mu,
                                        unsigned int& nb) {
    const unsigned int per_group = GROUP_M * w.n_blocks;
    const unsigned int g = u / per_group, first = g * GROUP_M;
    const unsigned int rest = w.m_units - first;
    const unsigned int gsz = rest < GROUP_M ? rest : GROUP_M;
    const unsigned int r = u - g * per_group;
    mu = first + r % gsz;
    nb = r / gsz;
}

// ---------------- producer: one thread ----------------
template <int BN_, int STAGES_, int CM>
__device__ __forceinline__ void producer(const TmaMap* a_map, const TmaMap* b_map,
                                         unsigned int sbase, const Work& w) {
    using L = Layout<BN_, STAGES_>;
    const unsigned int full_bar = sbase + L::BAR_OFF, empty_bar = full_bar + 8 * STAGES_;
    unsigned int stage = 0, phase = 0;
    for (unsigned int u = w.cid; u < w.units; u += w.ncl) {
        unsigned int mu, nb;
        tile_of(u, w, mu, nb);
        const int m0 = (int)((mu * CM + w.rank) * BM);
        const int n0 = (int)(nb * BN_);
        for (unsigned int kt = 0; kt < w.ktiles; ++kt) {
            const unsigned int fb = full_bar + 8 * stage;
            // The stage is free once every consumer that reads it (both CTAs' with the
            // multicast) has released its previous use. First pass: parity 1 passes at once.
            mbar_wait(empty_bar + 8 * stage, phase ^ 1);
            // All of the stage's bytes: A from this CTA's copy, B from both CTAs' halves.
            mbar_arrive_expect_tx(fb, L::STAGE);
            const unsigned int sa = sbase + stage * L::STAGE;
            const unsigned int sb = sa + A_BYTES;
            const int k0 = (int)(kt * BK);
            tma_load(sa, a_map, k0, m0, fb);
            if (CM == 2) {
                // This CTA's half of B's 64-column panels, into both CTAs (same offsets, each
                // copy completing on that CTA's full[stage]).
#pragma unroll
                for (int p = 0; p < BN_ / 128; ++p) {
                    const int panel = (int)w.rank * (BN_ / 128) + p;
                    tma_load_multicast(sb + panel * B_PANEL_BYTES, b_map, n0 + 64 * panel, k0,
                                       fb, (unsigned short)0x3);
                }
            } else {
#pragma unroll
                for (int p = 0; p < BN_ / 64; ++p)
                    tma_load(sb + p * B_PANEL_BYTES, b_map, n0 + 64 * p, k0, fb);
            }
            if (++stage == STAGES_) {
                stage = 0;
                phase ^= 1;
            }
        }
    }
}

// Gives stage `s` back: one arrival per consumer warpgroup on the "empty" barrier of every
// CTA whose producer writes the stage (with the multicast, both CTAs of the cluster).
template <int CM>
__device__ __forceinline__ void release_stage(unsigned int empty_bar_s) {
    if (CM == 2) {
        mbar_arrive_cluster(empty_bar_s, 0);
        mbar_arrive_cluster(empty_bar_s, 1);
    } else {
        mbar_arrive_local(empty_bar_s);
    }
}

// ---------------- consumers: warpgroup ci (0, 1), 128 threads ----------------
template <int BN_, int STAGES_, int CM>
__device__ __forceinline__ void consumer(const TmaMap* c_map, unsigned int sbase,
                                         const Work& w, unsigned int ci, unsigned int tid) {
    using L = Layout<BN_, STAGES_>;
    constexpr int ACC = BN_ / 2;  // fp32 accumulators per thread
    const unsigned int full_bar = sbase + L::BAR_OFF, empty_bar = full_bar + 8 * STAGES_;
    const unsigned int warp = tid >> 5, lane = tid & 31;
    // This thread's stmatrix row inside a 64 x 64 epilogue chunk: lanes 8i .. 8i + 7 address
    // the rows of matrix i = (row half i % 2, column half i / 2) of the warp's 16 x 16 piece,
    // rows 16 warp + 8 (i % 2) + lane % 8 (so crow % 8 == rr).
    const unsigned int mi = lane >> 3, rr = lane & 7;
    const unsigned int crow = warp * 16 + (mi & 1) * 8 + rr;
    const unsigned int cbuf0 = sbase + L::C_OFF + ci * 2 * C_BUF_BYTES;

    float acc[ACC];  // written first by each tile's first wgmma (scale-d 0)
    unsigned int stage = 0, phase = 0;
    for (unsigned int u = w.cid; u < w.units; u += w.ncl) {
        unsigned int mu, nb;
        tile_of(u, w, mu, nb);
        const int m0 = (int)((mu * CM + w.rank) * BM);
        const int n0 = (int)(nb * BN_);

        unsigned int prev = 0;
        for (unsigned int kt = 0; kt < w.ktiles; ++kt) {
            mbar_wait(full_bar + 8 * stage, phase);
            const unsigned int sa = sbase + stage * L::STAGE;
            // A: this warpgroup's 64 rows (8 atoms of 8 rows, SBO 1024; LBO unused: 16).
            const unsigned long long da = make_desc(sa + ci * (64 * 128), 16, 1024);
            // B: 64-column panels 8 KB apart (LBO), 8-k groups 1024 bytes apart (SBO).
            const unsigned long long db = make_desc(sa + A_BYTES, B_PANEL_BYTES, 1024);
            fence_regs<ACC>(acc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                // k16 step: +32 bytes along A's rows, +16 k-rows (2048 bytes) down B; the
                // descriptor's address field counts 16-byte units.
                wgmma_tile<BN_>(acc, da + (unsigned long long)(kk * 2),
                                db + (unsigned long long)(kk * 128), (kt | kk) != 0);
            }
            wgmma_commit();
            // Retires the previous slice's group (this slice's stays in flight), so the
            // previous stage can go back to the producer(s).
            wgmma_wait<1>();
            fence_regs<ACC>(acc);
            if (kt > 0 && tid == 0) release_stage<CM>(empty_bar + 8 * prev);
            prev = stage;
            if (++stage == STAGES_) {
                stage = 0;
                phase ^= 1;
            }
        }
        wgmma_wait<0>();
        fence_regs<ACC>(acc);
        if (tid == 0) release_stage<CM>(empty_bar + 8 * prev);  // ktiles >= 1

        // ---- epilogue: 64 x 64 chunks, stmatrix into a swizzled buffer, TMA store ----
        // Accumulator fragment of m64nN (warp `warp` holds rows 16 warp + lane / 4 and + 8):
        // acc[4 j + 0, 1] = row lane / 4, columns 8 j + 2 (lane % 4) + 0, 1;
        // acc[4 j + 2, 3] = the same columns of row lane / 4 + 8.
        // BN_ / 64 is even, so chunk jc uses buffer jc % 2 in every tile.
#pragma unroll
        for (int jc = 0; jc < BN_ / 64; ++jc) {
            const unsigned int buf = cbuf0 + (jc & 1) * C_BUF_BYTES;
            // The store that last read this buffer (two chunks ago) has finished reading it.
            if (tid == 0) bulk_wait_read<1>();
            named_bar_sync(1 + ci);
#pragma unroll
            for (int uu = 0; uu < 4; ++uu) {
                const int j = jc * 8 + uu * 2;  // 8-column groups j and j + 1
                const unsigned int r0 = pack_half2(acc[4 * j + 0], acc[4 * j + 1]);
                const unsigned int r1 = pack_half2(acc[4 * j + 2], acc[4 * j + 3]);
                const unsigned int r2 = pack_half2(acc[4 * j + 4], acc[4 * j + 5]);
                const unsigned int r3 = pack_half2(acc[4 * j + 6], acc[4 * j + 7]);
                // 16-byte chunk (8 columns) 2 uu + i / 2 of row crow, swizzled as TMA does.
                const unsigned int chunk = (unsigned int)(uu * 2) + (mi >> 1);
                stmatrix_x4(buf + crow * 128 + ((chunk ^ rr) << 4), r0, r1, r2, r3);
            }
            fence_proxy_async();
            named_bar_sync(1 + ci);
            if (tid == 0) {
                tma_store(c_map, buf, n0 + 64 * jc, m0 + 64 * (int)ci);
                bulk_commit();
            }
        }
    }
    if (tid == 0) bulk_wait_all();  // the last stores are done before the CTA leaves
}

template <int BN_, int STAGES_>
__device__ __forceinline__ void init_barriers(unsigned int sbase, unsigned int cm) {
    using L = Layout<BN_, STAGES_>;
    const unsigned int full_bar = sbase + L::BAR_OFF, empty_bar = full_bar + 8 * STAGES_;
    for (int s = 0; s < STAGES_; ++s) {
        mbar_init(full_bar + 8 * s, 1);           // the producer's arrive.expect_tx
        mbar_init(empty_bar + 8 * s, 2 * cm);     // 2 consumer warpgroups x cluster CTAs
    }
}

extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1)
gemm_f16_tma(const __grid_constant__ TmaMap a_map, const __grid_constant__ TmaMap b_map,
             const __grid_constant__ TmaMap c_map, unsigned int m, unsigned int n,
             unsigned int k) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // The launch rule asks for 1024 bytes more than the layout needs, so the swizzle atoms
    // can start on a 1024-byte boundary whatever the dynamic window's base.
    const unsigned int raw = smem_addr(smem_raw);
    const unsigned int sbase = (raw + 1023u) & ~1023u;

    const unsigned int wg = threadIdx.x >> 7;  // 0: producer; 1, 2: consumers
    const unsigned int tid = threadIdx.x & 127;
    // The cluster comes from the launch: (2, 1, 1) turns the multicast on; without one every
    // CTA is a cluster of 1. The kernel is correct for any grid size (it strides over the
    // tiles), so only the cluster size must be 1 or 2.
    const unsigned int cm = cluster_nctarank();
    if (cm > 2) asm volatile("trap;");
    const bool wide = wide_tiles(m, n);

    Work w;
    const unsigned int m_blocks = (m + BM - 1) / BM;
    w.n_blocks = wide ? (n + 255) / 256 : (n + 127) / 128;
    w.m_units = (m_blocks + cm - 1) / cm;
    w.units = w.m_units * w.n_blocks;
    // At least one K-slice: each tile's first wgmma is what initialises the accumulators
    // (scale-d 0). (A map cannot have k == 0 anyway; such a slice would load zeros.)
    w.ktiles = k > BK ? (k + BK - 1) / BK : 1;
    if (cm == 2) {
        w.rank = cluster_ctarank();
        w.cid = cluster_id_x();
        w.ncl = ncluster_x();
    } else {
        w.rank = 0;
        w.cid = blockIdx.x;
        w.ncl = gridDim.x;
    }
    if (threadIdx.x == 0) {
        if (wide)
            init_barriers<256, STAGES_WIDE>(sbase, cm);
        else
            init_barriers<128, STAGES_NARROW>(sbase, cm);
        fence_mbar_init();
    }
    // Every barrier is initialised before any thread (of either CTA) uses it.
    if (cm == 2)
        cluster_sync();
    else
        __syncthreads();

    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (tid == 0) {
            prefetch_tmap(&a_map);
            prefetch_tmap(&b_map);
            if (wide) {
                if (cm == 2)
                    producer<256, STAGES_WIDE, 2>(&a_map, &b_map, sbase, w);
                else
                    producer<256, STAGES_WIDE, 1>(&a_map, &b_map, sbase, w);
            } else {
                if (cm == 2)
                    producer<128, STAGES_NARROW, 2>(&a_map, &b_map, sbase, w);
                else
                    producer<128, STAGES_NARROW, 1>(&a_map, &b_map, sbase, w);
            }
        }
    } else {
        setmaxnreg_inc<232>();
        const unsigned int ci = wg - 1;  // rows 64 ci .. 64 ci + 63 of the tile
        if (tid == 0) prefetch_tmap(&c_map);
        if (wide) {
            if (cm == 2)
                consumer<256, STAGES_WIDE, 2>(&c_map, sbase, w, ci, tid);
            else
                consumer<256, STAGES_WIDE, 1>(&c_map, sbase, w, ci, tid);
        } else {
            if (cm == 2)
                consumer<128, STAGES_NARROW, 2>(&c_map, sbase, w, ci, tid);
            else
                consumer<128, STAGES_NARROW, 1>(&c_map, sbase, w, ci, tid);
        }
    }

    // No CTA leaves while the other may still arrive on its barriers (the consumers' remote
    // releases) or write into it.
    if (cm == 2) cluster_sync();
}
