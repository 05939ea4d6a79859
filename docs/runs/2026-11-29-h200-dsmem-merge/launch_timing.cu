// Per-launch time of two gqa_decode variants as a function of how many launches one CUDA
// graph holds (1 to 64), on the suite's shapes: does a kernel launched with a thread-block
// cluster carry a fixed cost per graph replay that kopt's bench (graphs of about 500 µs,
// 8-16 launches here) and the loop (16) amortise differently?
//
//   old: the committed variant (examples/llm-kernels/kopt/gqa_decode/run-1795985991-r1c2),
//        16 splits at batch 1 merged through global scratch, no cluster;
//   new: agents/gqa_decode_pipe.cu with CLUSTER 8 and WAVE_BLOCKS 64, 8 splits at batch 1
//        in one cluster of 8, merged through distributed shared memory.
//
// Build and run (see run.sh beside this): nvcc -O3 -arch=sm_90, each kernel in its own
// translation unit. Inputs: random fp16, K and V rotated over enough copies to exceed
// twice the L2 (as kopt and torch_compare.py time), so every launch reads from DRAM.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

extern "C" __global__ void gqa_decode_f16(const __half*, const __half*, const __half*, __half*,
                                          unsigned, unsigned, unsigned, unsigned);
extern "C" __global__ void gqa_decode_old(const __half*, const __half*, const __half*, __half*,
                                          unsigned, unsigned, unsigned, unsigned);

#define CK(x)                                                                          \
    do {                                                                               \
        cudaError_t e = (x);                                                           \
        if (e != cudaSuccess) {                                                        \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

static unsigned cdiv(unsigned a, unsigned b) { return (a + b - 1) / b; }

struct Geometry { dim3 grid, block; unsigned smem, cluster; };

// The launch rules of the two variants' variant.toml / proposal.
static Geometry geometry(bool is_new, unsigned batch, unsigned qh, unsigned kvh, unsigned seq) {
    const unsigned items = batch * kvh * cdiv(qh / kvh, 8);
    Geometry g{dim3(1, items), dim3(256), 8 * 3 * 8192, 1};
    if (is_new) {
        if (items < 64) {
            g.grid.x = std::max(8u, 64 / items / 8 * 8);
            g.cluster = 8;
        }
    } else {
        const unsigned s0 = items >= 64 ? 1 : std::max(1u, 132 / items);
        g.grid.x = cdiv(seq, cdiv(cdiv(seq, s0), 16) * 16);
    }
    return g;
}

static void launch(bool is_new, const Geometry& g, cudaStream_t s, const __half* q, const __half* k,
                   const __half* v, __half* o, unsigned b, unsigned qh, unsigned kvh, unsigned seq) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = g.grid;
    cfg.blockDim = g.block;
    cfg.dynamicSmemBytes = g.smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    if (g.cluster > 1) {
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = g.cluster;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    if (is_new)
        CK(cudaLaunchKernelEx(&cfg, gqa_decode_f16, q, k, v, o, b, qh, kvh, seq));
    else
        CK(cudaLaunchKernelEx(&cfg, gqa_decode_old, q, k, v, o, b, qh, kvh, seq));
}

int main() {
    int dev = 0;
    CK(cudaSetDevice(dev));
    int l2 = 0;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    for (auto f : {(const void*)gqa_decode_f16, (const void*)gqa_decode_old})
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 3 * 8192));
    CK(cudaFuncSetAttribute((const void*)gqa_decode_f16, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    // How many clusters of 8 and 16 blocks of the new kernel can be resident at once.
    for (unsigned c : {8u, 16u}) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(c * 8, 8);
        cfg.blockDim = dim3(256);
        cfg.dynamicSmemBytes = 8 * 3 * 8192;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = c;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int n = 0;
        cudaError_t e = cudaOccupancyMaxActiveClusters(&n, (const void*)gqa_decode_f16, &cfg);
        printf("max active clusters of %u blocks (192 KB shared each): %d (%s)\n", c, n,
               cudaGetErrorString(e));
    }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    struct Shape { unsigned b, qh, kvh, seq; };
    const Shape shapes[] = {{1, 32, 8, 32768}, {1, 32, 8, 16384}, {8, 32, 8, 4096}, {8, 32, 8, 1024}};
    const int lengths[] = {1, 2, 4, 8, 16, 32, 64};
    printf("\nshape               variant  grid      cluster | us per launch, graph of N launches:");
    for (int n : lengths) printf(" %7d", n);
    printf("\n");
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (const Shape& sh : shapes) {
        const size_t nq = (size_t)sh.b * sh.qh * 128, nkv = (size_t)sh.b * sh.kvh * sh.seq * 128;
        const size_t set_bytes = 2 * nkv * 2;
        const int sets = set_bytes >= 2 * (size_t)l2 ? 1 : (int)(2 * (size_t)l2 / set_bytes + 2);
        std::vector<__half> hq(nq), hkv(nkv);
        for (auto& x : hq) x = __float2half(nd(rng));
        for (auto& x : hkv) x = __float2half(nd(rng));
        __half *q, *o_new, *o_old;
        CK(cudaMalloc(&q, nq * 2));
        CK(cudaMalloc(&o_new, nq * 2));
        CK(cudaMalloc(&o_old, nq * 2));
        CK(cudaMemcpy(q, hq.data(), nq * 2, cudaMemcpyHostToDevice));
        std::vector<__half*> ks(sets), vs(sets);
        for (int i = 0; i < sets; ++i) {
            CK(cudaMalloc(&ks[i], nkv * 2));
            CK(cudaMalloc(&vs[i], nkv * 2));
            CK(cudaMemcpy(ks[i], hkv.data(), nkv * 2, cudaMemcpyHostToDevice));
            std::rotate(hkv.begin(), hkv.begin() + 977, hkv.end());
            CK(cudaMemcpy(vs[i], hkv.data(), nkv * 2, cudaMemcpyHostToDevice));
        }
        // The two variants agree (a check that both ran, not the loop's verification).
        for (int is_new = 0; is_new < 2; ++is_new)
            launch(is_new, geometry(is_new, sh.b, sh.qh, sh.kvh, sh.seq), s, q, ks[0], vs[0],
                   is_new ? o_new : o_old, sh.b, sh.qh, sh.kvh, sh.seq);
        CK(cudaStreamSynchronize(s));
        std::vector<__half> a(nq), b(nq);
        CK(cudaMemcpy(a.data(), o_new, nq * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b.data(), o_old, nq * 2, cudaMemcpyDeviceToHost));
        float diff = 0.f;
        for (size_t i = 0; i < nq; ++i)
            diff = std::max(diff, std::fabs(__half2float(a[i]) - __half2float(b[i])));
        for (int is_new = 0; is_new < 2; ++is_new) {
            const Geometry g = geometry(is_new, sh.b, sh.qh, sh.kvh, sh.seq);
            printf("B%u S%-6u %2d set(s)  %s  %4ux%-4u %u       |", sh.b, sh.seq, sets,
                   is_new ? "new" : "old", g.grid.x, g.grid.y, g.cluster);
            for (int n : lengths) {
                cudaGraph_t graph;
                cudaGraphExec_t exec;
                CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
                for (int i = 0; i < n; ++i)
                    launch(is_new, g, s, q, ks[i % sets], vs[i % sets], is_new ? o_new : o_old,
                           sh.b, sh.qh, sh.kvh, sh.seq);
                CK(cudaStreamEndCapture(s, &graph));
                CK(cudaGraphInstantiate(&exec, graph, 0));
                for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(exec, s));
                std::vector<float> t;
                for (int r = 0; r < 25; ++r) {
                    CK(cudaEventRecord(e0, s));
                    CK(cudaGraphLaunch(exec, s));
                    CK(cudaEventRecord(e1, s));
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    t.push_back(ms * 1000.f / n);
                }
                std::sort(t.begin(), t.end());
                printf(" %7.2f", t[t.size() / 2]);
                CK(cudaGraphExecDestroy(exec));
                CK(cudaGraphDestroy(graph));
            }
            printf("\n");
        }
        printf("  (max |new - old| = %.2e)\n", diff);
        for (int i = 0; i < sets; ++i) {
            CK(cudaFree(ks[i]));
            CK(cudaFree(vs[i]));
        }
        CK(cudaFree(q));
        CK(cudaFree(o_new));
        CK(cudaFree(o_old));
    }
    CK(cudaGetLastError());
    return 0;
}
