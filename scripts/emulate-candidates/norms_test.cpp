// Emulated runs of the softmax (warp-per-row and block-per-row modes; the cluster mode
// needs cluster barriers the emulation lacks) and rmsnorm candidates against f64
// references, with the proposals' launch rules (scripts/emulate-candidates.sh).
#include "emu.h"
#define __cluster_dims__(...)
inline void __trap() { abort(); }
inline float __int_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
namespace sm {
#include "sm.cpp"
}
// Each candidate's defaults for its tunables, not the other's.
#undef CACHE
namespace rms {
#include "rms.cpp"
}
#include <random>
static std::mt19937 rng(5);
static std::normal_distribution<float> nd(0, 1);
static int fails = 0;
static unsigned ceil_div(unsigned a, unsigned b) { return (a + b - 1) / b; }
static unsigned round_up(unsigned a, unsigned b) { return ceil_div(a, b) * b; }
static void softmax(unsigned rows, unsigned cols) {
    // The proposal's launch rule, outside the cluster mode (rows < 256 && cols >= 1024).
    if (rows < 256 && cols >= 1024) abort();
    unsigned grid, block;
    if (cols <= 1024) { grid = ceil_div(rows, WARPS); block = WARPS * 32; }
    else { grid = rows; block = std::min(1024u, std::max(64u, round_up(ceil_div(cols, 32), 32))); }
    std::vector<float> x(rows * cols), y(rows * cols, NAN);
    for (auto& v : x) v = 3 * nd(rng);
    launch({grid, 1}, {block, 1}, 0, [&] { sm::softmax_f32(x.data(), y.data(), rows, cols); });
    size_t bad = 0;
    for (unsigned r = 0; r < rows; ++r) {
        double m = -INFINITY, s = 0;
        for (unsigned c = 0; c < cols; ++c) m = std::max(m, (double)x[r * cols + c]);
        for (unsigned c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - m);
        for (unsigned c = 0; c < cols; ++c) {
            const double want = std::exp(x[r * cols + c] - m) / s, got = y[r * cols + c];
            if (!(std::fabs(got - want) <= 1e-6 + 1e-4 * want)) { if (bad < 3) printf("  softmax [%u][%u] got %g want %g\n", r, c, got, want); ++bad; }
        }
    }
    printf("softmax %ux%u grid %u block %u bad %zu\n", rows, cols, grid, block, bad); fails += bad != 0;
}
static void rmsnorm(unsigned rows, unsigned cols) {
    unsigned grid, block;
    // The proposal's launch rule: one block per row of cols / 32 threads, between 32 and
    // 512.
    grid = rows; block = std::min(512u, std::max(32u, round_up(ceil_div(cols, 32), 32)));
    // 16-byte aligned buffers, as cudaMalloc gives.
    std::vector<uint4> xb(ceil_div(rows * cols, 8)), wb(ceil_div(cols, 8)), yb(ceil_div(rows * cols, 8));
    __half* x = reinterpret_cast<__half*>(xb.data()); __half* w = reinterpret_cast<__half*>(wb.data()); __half* y = reinterpret_cast<__half*>(yb.data());
    for (unsigned i = 0; i < rows * cols; ++i) { x[i] = __float2half(nd(rng)); y[i] = __float2half(NAN); }
    for (unsigned i = 0; i < cols; ++i) w[i] = __float2half(nd(rng));
    launch({grid, 1}, {block, 1}, 0, [&] { rms::rmsnorm_f16(x, w, y, rows, cols, 1e-5f); });
    size_t bad = 0;
    for (unsigned r = 0; r < rows; ++r) {
        double ss = 0;
        for (unsigned c = 0; c < cols; ++c) { double v = __half2float(x[r * cols + c]); ss += v * v; }
        const double inv = 1 / std::sqrt(ss / cols + 1e-5);
        for (unsigned c = 0; c < cols; ++c) {
            const double want = __half2float(x[r * cols + c]) * inv * __half2float(w[c]), got = __half2float(y[r * cols + c]);
            if (!(std::fabs(got - want) <= 1e-2 + 1e-2 * std::fabs(want))) { if (bad < 3) printf("  rmsnorm [%u][%u] got %g want %g\n", r, c, got, want); ++bad; }
        }
    }
    printf("rmsnorm %ux%u grid %u block %u bad %zu\n", rows, cols, grid, block, bad); fails += bad != 0;
}
int main() {
    setvbuf(stdout, nullptr, _IONBF, 0);
    softmax(300, 1024); softmax(20, 1000); softmax(9, 1023); softmax(258, 1027); softmax(17, 1); softmax(3, 7); softmax(11, 514); softmax(257, 1031); softmax(256, 2048); softmax(300, 1025);
    rmsnorm(1, 4096); rmsnorm(3, 8192); rmsnorm(2, 4095); rmsnorm(5, 17); rmsnorm(257, 4096); rmsnorm(259, 1000); rmsnorm(256, 8); rmsnorm(300, 4097); rmsnorm(2, 40000); rmsnorm(258, 8192); rmsnorm(256, 4096); rmsnorm(260, 70000); rmsnorm(300, 2040);
    printf("%d failed\n", fails); return fails;
}
