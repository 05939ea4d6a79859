// Launch geometry and define sweeps of the suite's kernels on the shapes furthest from a
// same-size copy, in one process, before any of them goes through kopt's loop. This
// version holds the last sweeps: gqa_decode with 9 warps of 3 stages at batch 8 and 1
// (sweep-6.txt), softmax with its cluster compiled in against set at launch (sweep-7.txt),
// reduce_sum's accepted variant in its own and in one-warp grids, and the rmsnorm,
// layer_norm and silu_mul variants of sweeps 1-2. The other variants of earlier sweeps are
// in this file's history (sweep 5 as run: commit 1023c86).
//
// Each variant is a kernel object that run.sh compiles from the accepted variant's
// kernel.cu or from examples/llm-kernels/agents/<kernel>.cu with some defines, its entry
// renamed. Timing is kopt's method: CUDA graphs of 32 launches over input and output sets
// that together exceed twice the L2 (at most 64 sets), median of 15 replays, per launch. Three rounds, the
// variants interleaved within a round. The ruler of each shape is the faster of a copy
// kernel and cudaMemcpyAsync moving half the shape's ideal bytes (the suite's same-size
// copy). Every variant's output is compared with the accepted variant's on the same input
// (a check that it computed the same thing, not a verification: kopt's loop does that).
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#define CK(x)                                                                               \
    do {                                                                                    \
        cudaError_t e = (x);                                                                \
        if (e != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

// Kernels built by run.sh (renamed entries) and ruler.cu: __global__ under nvcc (their host
// stubs), plain declarations for a host compiler's syntax check.
#ifdef __CUDACC__
#define KERNEL extern "C" __global__ void
#else
#define KERNEL extern "C" void
#endif
#define SOFTMAX(n) KERNEL n(const float*, float*, unsigned, unsigned);
SOFTMAX(sm_acc) SOFTMAX(sm_cc)
#define RMS(n) KERNEL n(const void*, const void*, void*, unsigned, unsigned, float);
RMS(rms_acc) RMS(rms_c8) RMS(rms_c16)
#define LN(n) KERNEL n(const void*, const void*, const void*, void*, unsigned, unsigned, float);
LN(ln_acc) LN(ln_fv2) LN(ln_fv4) LN(ln_fv8)
KERNEL rs_acc(const float*, float*, unsigned long long);
#define SILU(n) KERNEL n(const void*, void*, unsigned, unsigned);
SILU(si_acc) SILU(si_u1) SILU(si_t512) SILU(si_t1024) SILU(si_flat1_512) SILU(si_t512_u2)
#define GQA(n) KERNEL n(const void*, const void*, const void*, void*, unsigned, unsigned, unsigned, unsigned);
GQA(gq_acc) GQA(gq_w9s3)
KERNEL copy_f4(const void*, void*, unsigned long long);

static cudaStream_t g_stream;

static void launch(const void* fn, dim3 grid, dim3 block, unsigned cluster, void** args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.stream = g_stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = cluster > 1 ? 1 : 0;
    CK(cudaLaunchKernelExC(&cfg, fn, args));
}

// How many clusters of `cluster` blocks of this geometry the device holds at once.
static int max_clusters(const void* fn, unsigned block, unsigned cluster, size_t smem) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(cluster * 64);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int n = -1;
    CK(cudaOccupancyMaxActiveClusters(&n, fn, &cfg));
    return n;
}

// Median over 15 replays of a graph of captured calls of body(i), in us per call: at least
// 32 calls, a whole number of rounds over `sets` (each replay reads every set alike).
static double time_graph(int sets, const std::function<void(int)>& body) {
    const int calls = (std::max(32, sets) + sets - 1) / sets * sets, replays = 15;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < calls; ++i) body(i);
    CK(cudaStreamEndCapture(g_stream, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaGraphLaunch(ge, g_stream));  // warm-up
    CK(cudaStreamSynchronize(g_stream));
    std::vector<float> ms;
    for (int r = 0; r < replays; ++r) {
        CK(cudaEventRecord(e0, g_stream));
        CK(cudaGraphLaunch(ge, g_stream));
        CK(cudaEventRecord(e1, g_stream));
        CK(cudaEventSynchronize(e1));
        float t = 0;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return 1000.0 * ms[ms.size() / 2] / calls;
}

// One buffer role of a shape, `sets` copies `stride` bytes apart in one allocation.
struct Role {
    char* base = nullptr;
    size_t bytes = 0, stride = 0;
    void* at(int set) const { return base + (size_t)set * stride; }
};

static size_t g_l2 = 0;

// A shape's buffers: roles of the given sizes, as many sets as exceed twice the L2.
struct Shape {
    std::vector<Role> roles;
    int sets = 2;
    explicit Shape(const std::vector<size_t>& bytes) {
        size_t total = 0;
        for (size_t b : bytes) total += (b + 4095) / 4096 * 4096;
        // kopt's timing_sets: enough sets to exceed twice the L2, at most 64 (the small
        // shapes are then timed warm, as kopt times them).
        sets = total >= 2 * g_l2 ? 1 : (int)std::min<size_t>(64, (2 * g_l2 + total - 1) / total + 1);
        for (size_t b : bytes) {
            Role r;
            r.bytes = b;
            r.stride = (b + 4095) / 4096 * 4096;
            CK(cudaMalloc(&r.base, r.stride * sets));
            roles.push_back(r);
        }
    }
    ~Shape() {
        for (Role& r : roles) CK(cudaFree(r.base));
    }
    // Fills role k of every set from `host` (r.bytes of it).
    void fill(size_t k, const void* host) {
        for (int i = 0; i < sets; ++i)
            CK(cudaMemcpy(roles[k].at(i), host, roles[k].bytes, cudaMemcpyHostToDevice));
    }
};

static uint16_t f2h(float f) {  // round to nearest even, finite inputs of modest size
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    int e = (int)((x >> 23) & 0xff) - 127 + 15;
    uint32_t m = x & 0x7fffffu;
    if (e <= 0) return (uint16_t)sign;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
    const uint32_t rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return (uint16_t)h;
}
static float h2f(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const int e = (h >> 10) & 0x1f;
    uint32_t m = h & 0x3ffu, x;
    if (e == 0) {
        const float v = std::ldexp((float)m, -24);
        return sign ? -v : v;
    }
    if (e == 31) x = sign | 0x7f800000u | (m << 13);
    else x = sign | ((uint32_t)(e - 15 + 127) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float uniform() {  // [0, 1)
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)(g_rng >> 40) / (float)(1ull << 24);
}
static float normal() {
    const float u = std::max(uniform(), 1e-7f), v = uniform();
    return std::sqrt(-2.0f * std::log(u)) * std::cos(6.2831853f * v);
}
static std::vector<float> normals(size_t n, float sd = 1.0f, float mean = 0.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = mean + sd * normal();
    return v;
}
static std::vector<uint16_t> halves(const std::vector<float>& f) {
    std::vector<uint16_t> h(f.size());
    for (size_t i = 0; i < f.size(); ++i) h[i] = f2h(f[i]);
    return h;
}

// A variant of a shape: its name, and how to launch it on set i.
struct Variant {
    std::string name;
    std::function<void(int)> run;
};

// Times the ruler and every variant of one shape over `rounds` rounds, prints one line
// a variant (median of the round medians, the rounds, the ruler's share) and compares the
// outputs (role `out`, `half` or fp32) with the first variant's.
static void sweep(const char* kernel, const char* shape, Shape& sh, size_t ideal_bytes,
                  const std::vector<Variant>& vs, size_t out, bool half, bool accumulates) {
    const int rounds = 3;
    const unsigned long long copy_n4 = ideal_bytes / 2 / 16;
    // The ruler moves its half of the ideal bytes between two roles' worth of memory of
    // its own (sets of its own too), so it is timed like the kernels.
    Shape ruler({copy_n4 * 16, copy_n4 * 16});
    std::vector<double> rul;
    std::vector<std::vector<double>> t(vs.size());
    for (int r = 0; r < rounds; ++r) {
        const double k = time_graph(ruler.sets, [&](int i) {
            const void* a = ruler.roles[0].at(i % ruler.sets);
            void* b = ruler.roles[1].at(i % ruler.sets);
            unsigned long long n4 = copy_n4;
            void* args[] = {&a, &b, &n4};
            launch((const void*)copy_f4, dim3((unsigned)std::max(1ull, (n4 + 1023) / 1024)),
                   dim3(256), 1, args);
        });
        const double m = time_graph(ruler.sets, [&](int i) {
            CK(cudaMemcpyAsync(ruler.roles[1].at(i % ruler.sets), ruler.roles[0].at(i % ruler.sets),
                               copy_n4 * 16, cudaMemcpyDeviceToDevice, g_stream));
        });
        rul.push_back(std::min(k, m));
        for (size_t v = 0; v < vs.size(); ++v)
            t[v].push_back(time_graph(sh.sets, [&](int i) { vs[v].run(i % sh.sets); }));
    }
    std::sort(rul.begin(), rul.end());
    const double ruler_us = rul[rul.size() / 2];
    printf("\n%s %s: same-size copy %.2f us (%d input sets)\n", kernel, shape, ruler_us, sh.sets);
    printf("  %-14s %8s %8s %8s %8s %9s %10s\n", "variant", "us", "r1", "r2", "r3", "of copy",
           "max diff");
    // Outputs: each variant once on set 0.
    const Role& o = sh.roles[out];
    std::vector<char> first(o.bytes), cur(o.bytes);
    for (size_t v = 0; v < vs.size(); ++v) {
        if (accumulates) CK(cudaMemset(o.at(0), 0, o.bytes));
        vs[v].run(0);
        CK(cudaStreamSynchronize(g_stream));
        CK(cudaMemcpy(v == 0 ? first.data() : cur.data(), o.at(0), o.bytes, cudaMemcpyDeviceToHost));
        double diff = 0;
        if (v > 0) {
            const size_t n = half ? o.bytes / 2 : o.bytes / 4;
            for (size_t i = 0; i < n; ++i) {
                double a, b;
                if (half) {
                    uint16_t x, y;
                    memcpy(&x, &first[2 * i], 2);
                    memcpy(&y, &cur[2 * i], 2);
                    a = h2f(x);
                    b = h2f(y);
                } else {
                    float x, y;
                    memcpy(&x, &first[4 * i], 4);
                    memcpy(&y, &cur[4 * i], 4);
                    a = x;
                    b = y;
                }
                const double d = std::isfinite(a) && std::isfinite(b) ? std::fabs(a - b) : INFINITY;
                diff = std::max(diff, d);
            }
        }
        std::vector<double> s = t[v];
        std::sort(s.begin(), s.end());
        printf("  %-14s %8.2f %8.2f %8.2f %8.2f %8.1f%% %10.2e\n", vs[v].name.c_str(),
               s[s.size() / 2], t[v][0], t[v][1], t[v][2], 100.0 * ruler_us / s[s.size() / 2],
               diff);
    }
    fflush(stdout);
}

static unsigned cdiv(unsigned a, unsigned b) { return (a + b - 1) / b; }
static unsigned clampu(unsigned v, unsigned lo, unsigned hi) { return std::min(hi, std::max(lo, v)); }
static unsigned rup(unsigned a, unsigned b) { return cdiv(a, b) * b; }

int main(int argc, char** argv) {
    const std::string only = argc > 1 ? argv[1] : "";
    auto want = [&](const char* k) { return only.empty() || only.find(k) != std::string::npos; };
    int l2 = 0;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    g_l2 = (size_t)l2;
    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    if (want("softmax")) {
        // Sweep 7: the accepted variant with its cluster set at launch (the launch rule's
        // `cluster`, split mode only) against the same source with __cluster_dims__(8)
        // compiled in, which puts every mode's launch in clusters of 8.
        for (const std::pair<unsigned, unsigned> rc :
             {std::pair<unsigned, unsigned>{16, 65536}, {8, 50257}, {32768, 1024}, {4096, 4096}}) {
            const unsigned rows = rc.first, cols = rc.second;
            const size_t n = (size_t)rows * cols;
            Shape sh({n * 4, n * 4});
            sh.fill(0, normals(n, 2.0f).data());
            std::vector<Variant> vs;
            // The launch rule of the accepted variant (CLUSTER 8, SPLIT_CACHE 8, WARPS 1,
            // WARP_CACHE 8); `compiled`: no cluster attribute at launch.
            auto add = [&](const char* name, const void* fn, bool compiled) {
                const bool split = rows < 256 && cols >= 1024, warp = !split && cols <= 1024;
                const unsigned grid = split ? rows * 8 : rows;  // warp mode: one row a 32-thread block
                const unsigned block = split ? clampu(rup(cdiv(cdiv(cols, 8), 32), 32), 64, 1024)
                                       : warp ? 32 : clampu(rup(cdiv(cols, 32), 32), 64, 1024);
                const unsigned cluster = split && !compiled ? 8 : 1;
                vs.push_back({name, [=, &sh](int i) {
                                  const void* x = sh.roles[0].at(i);
                                  void* y = sh.roles[1].at(i);
                                  unsigned r = rows, c = cols;
                                  void* args[] = {&x, &y, &r, &c};
                                  launch(fn, dim3(grid), dim3(block), cluster, args);
                              }});
            };
            add("accepted", (const void*)sm_acc, false);
            add("compiled-in cluster", (const void*)sm_cc, true);
            char name[32];
            snprintf(name, sizeof name, "%ux%u", rows, cols);
            sweep("softmax", name, sh, n * 8, vs, 1, false, false);
        }
    }
    if (want("rmsnorm")) {
        for (const std::pair<unsigned, unsigned> rc : {std::pair<unsigned, unsigned>{1, 4096}, {64, 8192}}) {
            const unsigned rows = rc.first, cols = rc.second;
            const size_t n = (size_t)rows * cols;
            Shape sh({n * 2, (size_t)cols * 2, n * 2});
            sh.fill(0, halves(normals(n)).data());
            sh.fill(1, halves(normals(cols, 0.2f, 1.0f)).data());
            std::vector<Variant> vs;
            auto add = [&](const char* name, const void* fn, unsigned block) {
                vs.push_back({name, [=, &sh](int i) {
                                  const void* x = sh.roles[0].at(i);
                                  const void* w = sh.roles[1].at(i);
                                  void* y = sh.roles[2].at(i);
                                  unsigned r = rows, c = cols;
                                  float eps = 1e-5f;
                                  void* args[] = {&x, &w, &y, &r, &c, &eps};
                                  launch(fn, dim3(rows), dim3(block), 1, args);
                              }});
            };
            add("accepted", (const void*)rms_acc, clampu(rup(cdiv(cols, 32), 32), 32, 512));
            add("c4 b=cols/16", (const void*)rms_acc, clampu(rup(cdiv(cols, 16), 32), 32, 512));
            add("c8 b=cols/64", (const void*)rms_c8, clampu(rup(cdiv(cols, 64), 32), 32, 512));
            add("c16 b=cols/128", (const void*)rms_c16, clampu(rup(cdiv(cols, 128), 32), 32, 512));
            char name[32];
            snprintf(name, sizeof name, "%ux%u", rows, cols);
            sweep("rmsnorm", name, sh, n * 4 + cols * 2, vs, 2, true, false);
        }
    }
    if (want("layer_norm")) {
        const unsigned rows = 64, cols = 4096;
        const size_t n = (size_t)rows * cols;
        Shape sh({n * 2, (size_t)cols * 2, (size_t)cols * 2, n * 2});
        sh.fill(0, halves(normals(n)).data());
        sh.fill(1, halves(normals(cols, 0.2f, 1.0f)).data());
        sh.fill(2, halves(normals(cols, 0.1f)).data());
        std::vector<Variant> vs;
        auto add = [&](const char* name, const void* fn, unsigned block) {
            vs.push_back({name, [=, &sh](int i) {
                              const void* x = sh.roles[0].at(i);
                              const void* w = sh.roles[1].at(i);
                              const void* b = sh.roles[2].at(i);
                              void* y = sh.roles[3].at(i);
                              unsigned r = rows, c = cols;
                              float eps = 1e-5f;
                              void* args[] = {&x, &w, &b, &y, &r, &c, &eps};
                              launch(fn, dim3(rows), dim3(block), 1, args);
                          }});
        };
        add("accepted", (const void*)ln_acc, 512);
        add("fv2 b=256", (const void*)ln_fv2, 256);
        add("fv4 b=128", (const void*)ln_fv4, 128);
        add("fv8 b=64", (const void*)ln_fv8, 64);
        sweep("layer_norm", "64x4096", sh, n * 4 + cols * 4, vs, 3, true, false);
    }
    if (want("reduce_sum")) {
        for (unsigned long long n : {1000ull, 1048576ull}) {
            Shape sh({n * 4, 4});
            sh.fill(0, normals(n, 1.0f, 1.0f).data());
            std::vector<Variant> vs;
            auto add = [&](std::string name, unsigned grid, unsigned block) {
                vs.push_back({name, [=, &sh](int i) {
                                  const void* x = sh.roles[0].at(i);
                                  void* o = sh.roles[1].at(i);
                                  unsigned long long nn = n;
                                  void* args[] = {&x, &o, &nn};
                                  launch((const void*)rs_acc, dim3(grid), dim3(block), 1, args);
                              }});
            };
            const unsigned acc_grid = (unsigned)std::min<unsigned long long>((n + 4095) / 4096, 1056);
            add("accepted", acc_grid, 256);
            add("accepted, warps n/128", (unsigned)((n + 127) / 128), 32);
            char name[32];
            snprintf(name, sizeof name, "n=%llu", n);
            sweep("reduce_sum", name, sh, n * 4 + 4, vs, 1, false, true);
        }
    }
    if (want("gqa_decode")) {
        // The accepted rule: at batch 8 (64 work items) one block a work item, no split; at
        // batch 1 (8 work items) one cluster of 8 splits a work item (64 blocks of 192 KB of
        // shared memory, one a SM). Sweep 6: 9 warps of 3 stages (216 KB) in the same rule.
        for (const std::pair<unsigned, unsigned> bs :
             {std::pair<unsigned, unsigned>{8, 1024}, {8, 4096}, {1, 16384}, {1, 32768}}) {
            const unsigned batch = bs.first, seq = bs.second, hq = 32, hkv = 8;
            const size_t qn = (size_t)batch * hq * 128, kn = (size_t)batch * hkv * seq * 128;
            Shape sh({qn * 2, kn * 2, kn * 2, qn * 2});
            sh.fill(0, halves(normals(qn)).data());
            sh.fill(1, halves(normals(kn)).data());
            sh.fill(2, halves(normals(kn)).data());
            std::vector<Variant> vs;
            auto add = [&](const char* name, const void* fn, unsigned warps, unsigned stages,
                           unsigned splits, unsigned cluster) {
                const int smem = (int)(warps * stages * 8192);
                CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                printf("gqa_decode %s: clusters of %u (%u threads, %d KB) held at once: %d\n", name,
                       cluster, warps * 32, smem / 1024, max_clusters(fn, warps * 32, cluster, smem));
                vs.push_back({name, [=, &sh](int i) {
                                  const void* q = sh.roles[0].at(i);
                                  const void* k = sh.roles[1].at(i);
                                  const void* v = sh.roles[2].at(i);
                                  void* o = sh.roles[3].at(i);
                                  unsigned b = batch, h = hq, kvh = hkv, s = seq;
                                  void* args[] = {&q, &k, &v, &o, &b, &h, &kvh, &s};
                                  cudaLaunchConfig_t cfg = {};
                                  cfg.gridDim = dim3(splits, batch * hkv * ((hq / hkv + 7) / 8));
                                  cfg.blockDim = dim3(warps * 32);
                                  cfg.dynamicSmemBytes = (size_t)smem;
                                  cfg.stream = g_stream;
                                  cudaLaunchAttribute attr[1];
                                  attr[0].id = cudaLaunchAttributeClusterDimension;
                                  attr[0].val.clusterDim.x = cluster;
                                  attr[0].val.clusterDim.y = 1;
                                  attr[0].val.clusterDim.z = 1;
                                  cfg.attrs = attr;
                                  cfg.numAttrs = cluster > 1 ? 1 : 0;
                                  CK(cudaLaunchKernelExC(&cfg, fn, args));
                              }});
            };
            const unsigned splits = batch == 1 ? 8 : 1;
            add("accepted", (const void*)gq_acc, 8, 3, splits, splits);
            add("w9 s3", (const void*)gq_w9s3, 9, 3, splits, splits);
            char name[32];
            snprintf(name, sizeof name, "B%u S%u", batch, seq);
            sweep("gqa_decode", name, sh, qn * 4 + kn * 4, vs, 3, true, false);
        }
    }
    if (want("silu_mul")) {
        for (const std::pair<unsigned, unsigned> rc : {std::pair<unsigned, unsigned>{4096, 11008}, {16384, 4096}}) {
            const unsigned tokens = rc.first, d = rc.second;
            const size_t n = (size_t)tokens * d;
            Shape sh({n * 4, n * 2});
            {
                std::vector<float> f(2 * n);
                for (float& v : f) v = 8.0f * uniform() - 4.0f;
                sh.fill(0, halves(f).data());
            }
            std::vector<Variant> vs;
            // flat: the FLAT = 1 one-dimensional grid; else the 2-D span grid.
            auto add = [&](const char* name, const void* fn, unsigned u, unsigned threads,
                           bool flat) {
                vs.push_back({name, [=, &sh](int i) {
                                  const void* x = sh.roles[0].at(i);
                                  void* o = sh.roles[1].at(i);
                                  unsigned t = tokens, dd = d;
                                  void* args[] = {&x, &o, &t, &dd};
                                  const dim3 grid =
                                      flat ? dim3(cdiv(tokens * (d / 8), u * threads))
                                           : dim3(cdiv(d, 8 * u * threads), std::min(tokens, 65535u));
                                  launch(fn, grid, dim3(threads), 1, args);
                              }});
            };
            add("accepted", (const void*)si_acc, 2, 256, false);
            add("U1 128 thr", (const void*)si_u1, 1, 128, false);
            add("U1 256 thr", (const void*)si_u1, 1, 256, false);
            add("U1 512 thr", (const void*)si_t512, 1, 512, false);
            add("U1 1024 thr", (const void*)si_t1024, 1, 1024, false);
            add("flat U1 512", (const void*)si_flat1_512, 1, 512, true);
            add("U2 512 thr", (const void*)si_t512_u2, 2, 512, false);
            char name[32];
            snprintf(name, sizeof name, "%ux%u", tokens, d);
            sweep("silu_mul", name, sh, n * 6, vs, 1, true, false);
        }
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
