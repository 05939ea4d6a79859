// Emulated runs of examples/candle-ops' candidates (agents/softmax.cu, agents/rmsnorm.cu)
// with their proposals' launch rules, against a CPU model of candle's own arithmetic in
// candle's types (reduce.cu's softmax<T, ACC> and rmsnorm<T>) with the same emulated bf16
// operations: index arithmetic, tails, several rows a block, rows longer than the
// registers hold, misaligned pointers, and every output written
// (scripts/emulate-candle-candidates.sh).
#include "emu.h"
#include "bf16_emu.h"
#include <random>
#ifndef SOFTMAX_CACHE
#define SOFTMAX_CACHE 4
#endif
namespace sm {
#define CACHE SOFTMAX_CACHE
#include "softmax.cpp"
#undef CACHE
}
namespace rms {
#include "rmsnorm.cpp"
#undef CACHE
}
static std::mt19937 rng(7);
static std::normal_distribution<float> nd(0, 1);
static int fails = 0;

template <class T> T of(float v);
template <> float of<float>(float v) { return v; }
template <> __nv_bfloat16 of<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
static float f(float v) { return v; }
static float f(__nv_bfloat16 v) { return __bfloat162float(v); }

// The proposals' launch rule: blockDim.x threads a row (about two 16-byte vectors each),
// several rows a 256-thread block when a row needs fewer than 32 and the block's row
// count divides rows.
struct Geometry { unsigned grid, bx, by; };
static Geometry geometry(unsigned rows, unsigned ncols, unsigned per_vector) {
    unsigned need = (ncols + 2 * per_vector - 1) / (2 * per_vector), g0 = 1;
    while (g0 < need) g0 <<= 1;
    g0 = std::min(1024u, std::max(4u, g0));
    const bool shared = g0 < 32 && rows % (256 / g0) == 0;
    return {shared ? rows / (256 / g0) : rows, (g0 >= 32 || rows % (256 / g0) == 0) ? g0 : 32, shared ? 256 / g0 : 1};
}

// Buffers with `offset` elements before the data (a misaligned candle view when nonzero)
// and guard elements after it that nothing may write.
template <class T> struct Buf {
    std::vector<T> v; size_t off, n;
    Buf(size_t n, size_t off, float fill) : v(off + n + 16, of<T>(fill)), off(off), n(n) {}
    T* p() { return v.data() + off; }
    bool guards_intact(float fill) {
        for (size_t i = 0; i < v.size(); ++i)
            if ((i < off || i >= off + n) && !(f(v[i]) == fill || (std::isnan(fill) && std::isnan(f(v[i]))))) return false;
        return true;
    }
};

template <class T> static void softmax(unsigned rows, unsigned ncols, size_t offset, float scale) {
    constexpr unsigned N = 16 / sizeof(T);
    Buf<T> x(size_t(rows) * ncols, offset, 0), y(size_t(rows) * ncols, offset, NAN);
    for (size_t i = 0; i < x.n; ++i) x.p()[i] = of<T>(scale * nd(rng));
    const Geometry g = geometry(rows, ncols, N);
    launch({g.grid, 1}, {g.bx, g.by}, 0, [&] {
        if constexpr (sizeof(T) == 2) sm::softmax_bf16(x.p(), y.p(), ncols); else sm::softmax_f32(x.p(), y.p(), ncols);
    });
    size_t bad = 0;
    for (unsigned r = 0; r < rows; ++r) {
        const T* xr = x.p() + size_t(r) * ncols;
        float m = -INFINITY;
        for (unsigned c = 0; c < ncols; ++c) m = std::fmax(m, f(xr[c]));
        double s = 0;
        std::vector<T> val(ncols);
        for (unsigned c = 0; c < ncols; ++c) { val[c] = sm::exp_shifted(xr[c], of<T>(m)); s += f(val[c]); }
        const T inv = of<T>(float(1. / s));
        for (unsigned c = 0; c < ncols; ++c) {
            const float want = f(sm::scaled(val[c], inv)), got = f(y.p()[size_t(r) * ncols + c]);
            // bf16: the reciprocal may round the other way (the sum's order): 2^-6.
            const float tol = sizeof(T) == 2 ? 0.016f * std::fabs(want) : 1e-5f * std::fabs(want) + 1e-30f;
            if (!(std::fabs(got - want) <= tol)) { if (bad < 3) printf("  [%u][%u] got %g want %g\n", r, c, got, want); ++bad; }
        }
    }
    const bool guards = y.guards_intact(NAN);
    printf("softmax_%s %ux%u offset %zu: grid %u block %ux%u, %zu wrong%s\n", sizeof(T) == 2 ? "bf16" : "f32",
           rows, ncols, offset, g.grid, g.bx, g.by, bad, guards ? "" : ", WROTE OUTSIDE THE OUTPUT");
    fails += bad != 0 || !guards;
}

template <class T> static void rmsnorm(unsigned rows, unsigned ncols, size_t offset, size_t alpha_offset) {
    constexpr unsigned N = 16 / sizeof(T);
    const float eps = 1e-6f;
    Buf<T> x(size_t(rows) * ncols, offset, 0), y(size_t(rows) * ncols, offset, NAN), a(ncols, alpha_offset, 1);
    for (size_t i = 0; i < x.n; ++i) x.p()[i] = of<T>(nd(rng));
    for (size_t i = 0; i < a.n; ++i) a.p()[i] = of<T>(0.5f + std::uniform_real_distribution<float>(0, 1)(rng));
    const Geometry g = geometry(rows, ncols, N);
    launch({g.grid, 1}, {g.bx, g.by}, 0, [&] {
        if constexpr (sizeof(T) == 2) rms::rmsnorm_bf16(x.p(), y.p(), a.p(), ncols, g.bx, eps);
        else rms::rmsnorm_f32(x.p(), y.p(), a.p(), ncols, g.bx, eps);
    });
    size_t bad = 0;
    for (unsigned r = 0; r < rows; ++r) {
        const T* xr = x.p() + size_t(r) * ncols;
        double ss = 0;
        for (unsigned c = 0; c < ncols; ++c) ss += double(f(xr[c])) * f(xr[c]);
        const float scale = rsqrtf(float(ss) / ncols + eps);
        for (unsigned c = 0; c < ncols; ++c) {
            const float want = f(of<T>(scale * f(xr[c]) * f(a.p()[c]))), got = f(y.p()[size_t(r) * ncols + c]);
            const float tol = sizeof(T) == 2 ? 0.008f * std::fabs(want) + 1e-6f : 1e-5f * std::fabs(want) + 1e-6f;
            if (!(std::fabs(got - want) <= tol)) { if (bad < 3) printf("  [%u][%u] got %g want %g\n", r, c, got, want); ++bad; }
        }
    }
    const bool guards = y.guards_intact(NAN);
    printf("rmsnorm_%s %ux%u offsets %zu/%zu: grid %u block %ux%u, %zu wrong%s\n", sizeof(T) == 2 ? "bf16" : "f32",
           rows, ncols, offset, alpha_offset, g.grid, g.bx, g.by, bad, guards ? "" : ", WROTE OUTSIDE THE OUTPUT");
    fails += bad != 0 || !guards;
}

int main() {
    setvbuf(stdout, nullptr, _IONBF, 0);
    // (rows, ncols): the declared shapes' kinds at fewer rows, one-column and odd rows, rows
    // that do not divide a shared block's, rows longer than the registers hold (bf16 4 and
    // f32 SOFTMAX_CACHE vectors a thread at 1024 threads), and misaligned views.
    const unsigned shapes[][2] = {{64, 1024}, {8, 4096}, {2, 32000}, {1, 1}, {3, 7}, {33, 1001}, {5, 4099},
                                  {64, 8}, {40, 16}, {96, 120}, {2, 40000}, {1, 33000}, {7, 64}};
    for (auto& s : shapes) {
        softmax<__nv_bfloat16>(s[0], s[1], 0, 1);
        softmax<float>(s[0], s[1], 0, 1);
    }
    softmax<__nv_bfloat16>(32, 1024, 1, 1);
    softmax<float>(32, 1024, 3, 1);
    softmax<__nv_bfloat16>(16, 512, 0, 30);  // wide range of the max and exponentials
    const unsigned norms[][2] = {{16, 4096}, {512, 128}, {100, 128}, {64, 8}, {1, 1}, {3, 7}, {33, 1001},
                                 {2, 8192}, {1, 40000}, {256, 16}, {9, 64}};
    for (auto& s : norms) {
        rmsnorm<__nv_bfloat16>(s[0], s[1], 0, 0);
        rmsnorm<float>(s[0], s[1], 0, 0);
    }
    rmsnorm<__nv_bfloat16>(64, 128, 0, 1);
    rmsnorm<float>(8, 4096, 1, 0);
    printf("%d failed\n", fails);
    return fails;
}
