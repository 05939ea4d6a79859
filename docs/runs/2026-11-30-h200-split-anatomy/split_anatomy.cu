// Where does the time of softmax's split mode go? The accepted variant runs 16x65536 in
// 7.4 us and 8x50257 in 5.9 us on the H200, against 3.5 and 2.3 us for a same-size copy
// (docs/runs/2026-11-30-h200-transpose-residency/TABLE.md). Its split mode gives each row a
// cluster of 8 blocks (set at launch), loads a slice per block into registers, reduces,
// exchanges the row's (max, sum) through distributed shared memory, then stores.
//
// This times, per launch, in CUDA graphs of 32 launches over input and output sets that
// exceed twice the L2 (kopt's method), the pieces of that structure on the same bytes and
// the same grid:
//   empty        the grid, no memory traffic (launch and block scheduling alone);
//   copy         each thread loads its 4 float4s of the slice, then stores them;
//   copy+sync    the same with a __syncthreads between the loads and the stores;
//   copy+cluster the same with a cluster barrier (arrive.release / wait.acquire) between;
//   softmax      agents/softmax.cu's softmax_f32 (the accepted variant's source and
//                defines: CLUSTER 8, GATHER 1, CACHE 8), its launch rule's geometry;
//   memcpy       cudaMemcpyAsync of the same bytes (the driver's copy);
//   read, hot    two launches: a read-only pass (a sum) over x, then the copy of the same
//                x, now in L2: what a two-kernel softmax (statistics, then normalise)
//                would cost at least.
// each launched without a cluster and with clusters of 8 where that applies.
// Build and run: run.sh beside this (nvcc -O3 -arch=sm_90).
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

extern "C" __global__ void softmax_f32(const float*, float*, unsigned, unsigned);
// The same source with GATHER 0 (every thread reads the 8 pairs), with CACHE 4 (no
// padding slots), and with clock64 / globaltimer stamps between its phases (phases.py).
extern "C" __global__ void softmax_g0(const float*, float*, unsigned, unsigned);
extern "C" __global__ void softmax_c4(const float*, float*, unsigned, unsigned);
extern "C" __global__ void softmax_phases(const float*, float*, unsigned, unsigned);
extern "C" void read_phases(long long* host, int n);
typedef void (*Softmax)(const float*, float*, unsigned, unsigned);

#define CK(x)                                                                               \
    do {                                                                                    \
        cudaError_t e = (x);                                                                \
        if (e != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

__global__ void empty_kernel(const float4*, float4*, unsigned) {}

// MODE 0: no barrier; 1: __syncthreads; 2: cluster barrier. Block b copies float4s
// [b * per, (b + 1) * per) of n, thread t the ones at t + i * blockDim.x.
template <int MODE>
__global__ void copy_kernel(const float4* __restrict__ x, float4* __restrict__ y, unsigned n) {
    const unsigned per = (n + gridDim.x - 1) / gridDim.x;
    const unsigned v0 = blockIdx.x * per, v1 = min(n, v0 + per);
    float4 r[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned v = v0 + threadIdx.x + i * blockDim.x;
        if (v < v1) r[i] = x[v];
    }
    if (MODE == 1) __syncthreads();
    if (MODE == 2) {
        asm volatile("barrier.cluster.arrive.release;" ::: "memory");
        asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned v = v0 + threadIdx.x + i * blockDim.x;
        if (v < v1) y[v] = r[i];
    }
}

// One block per 1/gridDim of x: a sum, one atomic per block (the statistics pass's reads).
__global__ void read_kernel(const float4* __restrict__ x, float4* __restrict__ y, unsigned n) {
    const unsigned per = (n + gridDim.x - 1) / gridDim.x;
    const unsigned v0 = blockIdx.x * per, v1 = min(n, v0 + per);
    float s = 0.f;
    for (unsigned v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
        const float4 a = x[v];
        s += a.x + a.y + a.z + a.w;
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(&y[0].x, s);
}

typedef void (*Kernel)(const float4*, float4*, unsigned);

static void launch(Kernel k, unsigned grid, unsigned block, unsigned cluster, cudaStream_t s,
                   const float* x, float* y, unsigned n4) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = cluster > 1 ? 1 : 0;  // no attribute at all for a plain launch
    CK(cudaLaunchKernelEx(&cfg, k, (const float4*)x, (float4*)y, n4));
}

static void launch_softmax(unsigned rows, unsigned cols, cudaStream_t s, const float* x, float* y,
                           Softmax kernel = softmax_f32) {
    // The accepted variant's launch rule in the split mode (rows < 256, cols >= 1024).
    const unsigned cluster = 8;
    unsigned block = (cols + cluster - 1) / cluster;
    block = (block + 15) / 16;
    block = (block + 31) / 32 * 32;
    block = std::min(1024u, std::max(64u, block));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(rows * cluster);
    cfg.blockDim = dim3(block);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, kernel, x, y, rows, cols));
}

// Median over 15 replays of a graph of 32 captured calls of `body(i)`, in us per call.
template <class F>
static double time_graph(cudaStream_t s, F body) {
    const int calls = 32, replays = 15;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < calls; ++i) body(i);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaGraphLaunch(ge, s));  // warm-up
    CK(cudaStreamSynchronize(s));
    std::vector<float> ms;
    for (int r = 0; r < replays; ++r) {
        CK(cudaEventRecord(e0, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float t = 0;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return 1000.0 * ms[ms.size() / 2] / calls;
}

int main() {
    CK(cudaSetDevice(0));
    int l2 = 0;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    struct Shape { unsigned rows, cols; };
    const Shape shapes[] = {{16, 65536}, {8, 50257}, {8, 50256}};
    printf("%-10s %-28s %8s %7s %8s\n", "shape", "what", "grid", "cluster", "us");
    for (const Shape& sh : shapes) {
        const size_t n = (size_t)sh.rows * sh.cols, bytes = n * 4;
        const unsigned n4 = (unsigned)(n / 4);  // the copies move the whole float4s only
        const int sets = (int)std::max<size_t>(2, 2 * (size_t)l2 / (2 * bytes) + 2);
        std::vector<float*> xs(sets), ys(sets);
        std::vector<float> h(n);
        for (size_t i = 0; i < n; ++i) h[i] = (float)((i * 2654435761u) % 1000) / 100.f;
        for (int i = 0; i < sets; ++i) {
            CK(cudaMalloc(&xs[i], bytes));
            CK(cudaMalloc(&ys[i], bytes));
            CK(cudaMemcpy(xs[i], h.data(), bytes, cudaMemcpyHostToDevice));
        }
        // The split mode's geometry: 8 blocks a row, 4 float4s a thread.
        const unsigned grid = sh.rows * 8;
        unsigned block = ((sh.cols + 7) / 8 + 15) / 16;
        block = std::min(1024u, std::max(64u, (block + 31) / 32 * 32));
        char name[32];
        snprintf(name, sizeof name, "%ux%u", sh.rows, sh.cols);
        auto row = [&](const char* what, unsigned g, unsigned c, double us) {
            printf("%-10s %-28s %8u %7u %8.2f\n", name, what, g, c, us);
        };
        for (unsigned c : {1u, 8u}) {
            row("empty", grid, c, time_graph(s, [&](int i) {
                    launch(empty_kernel, grid, block, c, s, xs[i % sets], ys[i % sets], n4);
                }));
            row("copy", grid, c, time_graph(s, [&](int i) {
                    launch(copy_kernel<0>, grid, block, c, s, xs[i % sets], ys[i % sets], n4);
                }));
            row("copy+sync", grid, c, time_graph(s, [&](int i) {
                    launch(copy_kernel<1>, grid, block, c, s, xs[i % sets], ys[i % sets], n4);
                }));
        }
        row("copy+cluster barrier", grid, 8, time_graph(s, [&](int i) {
                launch(copy_kernel<2>, grid, block, 8, s, xs[i % sets], ys[i % sets], n4);
            }));
        row("softmax (accepted source)", grid, 8, time_graph(s, [&](int i) {
                launch_softmax(sh.rows, sh.cols, s, xs[i % sets], ys[i % sets]);
            }));
        row("softmax, GATHER 0", grid, 8, time_graph(s, [&](int i) {
                launch_softmax(sh.rows, sh.cols, s, xs[i % sets], ys[i % sets], softmax_g0);
            }));
        row("softmax, CACHE 4", grid, 8, time_graph(s, [&](int i) {
                launch_softmax(sh.rows, sh.cols, s, xs[i % sets], ys[i % sets], softmax_c4);
            }));
        row("softmax, with phase stamps", grid, 8, time_graph(s, [&](int i) {
                launch_softmax(sh.rows, sh.cols, s, xs[i % sets], ys[i % sets], softmax_phases);
            }));
        row("memcpy", 0, 0, time_graph(s, [&](int i) {
                CK(cudaMemcpyAsync(ys[i % sets], xs[i % sets], bytes, cudaMemcpyDeviceToDevice, s));
            }));
        // A copy over many small blocks: 64 threads of 4 float4s each, 256 float4s a block.
        const unsigned wide = (n4 + 255) / 256;
        row("copy, 64-thread blocks", wide, 1, time_graph(s, [&](int i) {
                launch(copy_kernel<0>, wide, 64, 1, s, xs[i % sets], ys[i % sets], n4);
            }));
        row("read, then hot copy (2 launches)", grid, 1, time_graph(s, [&](int i) {
                launch(read_kernel, grid, block, 1, s, xs[i % sets], ys[(i + 1) % sets], n4);
                launch(copy_kernel<0>, grid, block, 1, s, xs[i % sets], ys[i % sets], n4);
            }));
        // The softmax ran: its rows sum to 1 (a check that it ran, not a verification).
        launch_softmax(sh.rows, sh.cols, s, xs[0], ys[0]);
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(h.data(), ys[0], bytes, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (unsigned r = 0; r < sh.rows; ++r) {
            double t = 0;
            for (unsigned c = 0; c < sh.cols; ++c) t += h[(size_t)r * sh.cols + c];
            worst = std::max(worst, std::abs(t - 1.0));
        }
        printf("%-10s softmax rows sum to 1 within %.2e; %d input sets of %.1f MB\n", name, worst,
               sets, bytes / 1e6);
        // Phases of the stamped kernel: 10 single launches on cold sets; per block, thread
        // 0's clock64 deltas (load + local stats, block reduction, cluster exchange, stores
        // issued, final cluster wait) and its globaltimer at entry and exit.
        {
            const int runs = 10, nb = (int)grid;
            std::vector<long long> ph(nb * 8);
            double cyc[5] = {0, 0, 0, 0, 0}, spread_start = 0, span = 0;
            for (int r = 0; r < runs; ++r) {
                launch_softmax(sh.rows, sh.cols, s, xs[(r + 1) % sets], ys[(r + 1) % sets],
                               softmax_phases);
                CK(cudaStreamSynchronize(s));
                read_phases(ph.data(), nb * 8);
                long long t0 = ph[5], t0max = ph[5], t1 = ph[6];
                for (int b = 0; b < nb; ++b) {
                    for (int k = 0; k < 5; ++k) cyc[k] += ph[b * 8 + k];
                    t0 = std::min(t0, ph[b * 8 + 5]);
                    t0max = std::max(t0max, ph[b * 8 + 5]);
                    t1 = std::max(t1, ph[b * 8 + 6]);
                }
                spread_start += (double)(t0max - t0);
                span += (double)(t1 - t0);
            }
            int khz = 0;
            CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
            const char* names[5] = {"loads+local stats", "block reduction", "cluster exchange",
                                    "stores issued", "final cluster wait"};
            for (int k = 0; k < 5; ++k)
                printf("%-10s   phase %-20s %8.0f cycles %7.2f us (at %d MHz)\n", name, names[k],
                       cyc[k] / (runs * nb), cyc[k] / (runs * nb) / (khz / 1e3), khz / 1000);
            printf("%-10s   globaltimer: blocks enter within %.2f us of each other; first entry to "
                   "last exit %.2f us\n",
                   name, spread_start / runs / 1e3, span / runs / 1e3);
        }
        for (int i = 0; i < sets; ++i) {
            CK(cudaFree(xs[i]));
            CK(cudaFree(ys[i]));
        }
    }
    return 0;
}
