// Emulated runs of the memory-bound candidates against f64 references (scripts/emulate-candidates.sh).
#include <cstdlib>
inline void __trap() { abort(); }
#include "ln.cpp"
namespace s { 
#include "silu.cpp"
}
namespace t {
#include "tr.cpp"
}
#include <random>
std::mt19937 rng(3); std::normal_distribution<float> nd(0, 1);
int fails = 0;
void check(const char* what, double got, double want, double rtol, double atol, size_t& bad) {
    if (!(std::fabs(got - want) <= atol + rtol * std::fabs(want))) { if (bad < 3) printf("  %s got %f want %f\n", what, got, want); ++bad; }
}
void ln(unsigned rows, unsigned cols, float offset = 0.5f) {
    std::vector<__half> x(rows * cols), w(cols), b(cols), y(rows * cols, __float2half(NAN));
    for (auto& v : x) v = __float2half(nd(rng) + offset); for (auto& v : w) v = __float2half(nd(rng)); for (auto& v : b) v = __float2half(nd(rng));
    // The proposal's launch rule: min(1024, max(32, round_up(ceil_div(cols, D), 32))),
    // D = 8 for fewer than 256 rows, else 32.
    const unsigned per = rows < 256 ? 8 : 32;
    unsigned block = std::min(1024u, std::max(32u, ((cols + per - 1) / per + 31) / 32 * 32));
    launch({rows, 1}, {block, 1}, 0, [&] { layer_norm_f16(x.data(), w.data(), b.data(), y.data(), rows, cols, 1e-5f); });
    size_t bad = 0;
    for (unsigned r = 0; r < rows; ++r) { double m = 0, v = 0; for (unsigned c = 0; c < cols; ++c) m += __half2float(x[r*cols+c]); m /= cols;
        for (unsigned c = 0; c < cols; ++c) { double d = __half2float(x[r*cols+c]) - m; v += d*d; } v /= cols; double rs = 1/std::sqrt(v + 1e-5);
        for (unsigned c = 0; c < cols; ++c) check("ln", __half2float(y[r*cols+c]), (__half2float(x[r*cols+c]) - m) * rs * __half2float(w[c]) + __half2float(b[c]), 1e-2, 1e-2, bad); }
    printf("layer_norm %ux%u block %u bad %zu\n", rows, cols, block, bad); fails += bad != 0;
}
void silu(unsigned tokens, unsigned d) {
    std::vector<__half> x(tokens * 2 * d), o(tokens * d, __float2half(NAN));
    for (auto& v : x) v = __float2half(nd(rng));
    // The proposal's launch rule: fewer than 256 tokens, SMALL_U vectors a thread and
    // SMALL_THREADS-thread blocks; otherwise UNROLL vectors and 256-thread blocks.
    const unsigned block = tokens < 256 ? SMALL_THREADS : 256, per = tokens < 256 ? SMALL_U : UNROLL;
    unsigned gx = (d + 8 * per * block - 1) / (8 * per * block), gy = std::min(tokens, 3u); // a small grid y exercises the token stride
    if (FLAT && tokens >= 256 && d % 8 == 0) { gx = (tokens * (d / 8) + per * block - 1) / (per * block); gy = 1; }  // the flat grid
    launch({gx, gy}, {block, 1}, 0, [&] { s::silu_mul_f16(x.data(), o.data(), tokens, d); });
    size_t bad = 0;
    for (unsigned t = 0; t < tokens; ++t) for (unsigned j = 0; j < d; ++j) { double g = __half2float(x[t*2*d+j]), u = __half2float(x[t*2*d+d+j]);
        check("silu", __half2float(o[t*d+j]), g / (1 + std::exp(-g)) * u, 1e-2, 1e-3, bad); }
    printf("silu_mul %ux%u grid %ux%u block %u bad %zu\n", tokens, d, gx, gy, block, bad); fails += bad != 0;
}
void tr(unsigned rows, unsigned cols) {
    std::vector<float> x(rows * cols), y(rows * cols, NAN);
    for (auto& v : x) v = nd(rng);
    launch({(((cols + 63) / 64) * ((rows + 63) / 64) + TILES - 1) / TILES, 1}, {THREADS, 1}, 0, [&] { t::transpose_f32(x.data(), y.data(), rows, cols); });
    size_t bad = 0;
    for (unsigned r = 0; r < rows; ++r) for (unsigned c = 0; c < cols; ++c) check("tr", y[c*rows+r], x[r*cols+c], 0, 0, bad);
    printf("transpose %ux%u bad %zu\n", rows, cols, bad); fails += bad != 0;
}
int main() {
    ln(3, 4096); ln(2, 8192); ln(3, 1001); ln(2, 64); ln(2, 40000); ln(2, 8); ln(1, 33000); ln(2, 16384); ln(2, 16392);
    ln(256, 1024); ln(257, 1001); ln(256, 2056);
    ln(4, 4096, 30.0f); ln(3, 2048, -200.0f); ln(1, 4104, 8.0f);
    silu(5, 4096); silu(4, 1376); silu(3, 1001); silu(7, 8); silu(2, 11008); silu(3, 14336); silu(256, 1032); silu(257, 1001); silu(300, 4104); silu(260, 1376); silu(256, 8);
    tr(128, 128); tr(200, 72); tr(37, 101); tr(64, 4); tr(4, 260); tr(130, 3); tr(68, 264); tr(1, 1); tr(300, 200); tr(130, 390);
    printf("%d failed\n", fails); return fails;
}
