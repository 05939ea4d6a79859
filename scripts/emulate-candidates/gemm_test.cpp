// Emulated run of the gemm candidate against an f64 reference: gemm_test M N K.
#include "gemm.cpp"
#include <random>
int main(int argc, char** argv) {
    unsigned m = atoi(argv[1]), n = atoi(argv[2]), k = atoi(argv[3]);
    std::mt19937 rng(1); std::normal_distribution<float> nd(0, 1);
    std::vector<__half> a(m * k), b(k * n), c(m * n, __float2half(NAN));
    for (auto& x : a) x = __float2half(nd(rng)); for (auto& x : b) x = __float2half(nd(rng));
    // The proposal's launch rule: 128 x 256 tiles when there are at least WIDE_MIN_TILES of
    // them, else 128 x 128 (4 stages of 128 x 64 A + 64 x BN B halves).
    const bool wide = ((m + 127) / 128) * ((n + 255) / 256) >= WIDE_MIN_TILES;
    const unsigned bn = wide ? 256 : 128;
    launch({(n + bn - 1) / bn, (m + 127) / 128}, {256, 1}, 4 * (128 * 64 + 64 * bn) * 2,
           [&] { gemm_f16(a.data(), b.data(), c.data(), m, n, k); });
    double maxerr = 0; size_t bad = 0;
    for (unsigned i = 0; i < m; ++i) for (unsigned j = 0; j < n; ++j) {
        double s = 0; for (unsigned p = 0; p < k; ++p) s += (double)__half2float(a[i * k + p]) * __half2float(b[p * n + j]);
        double g = __half2float(c[i * n + j]); double e = std::fabs(g - s);
        if (!(e <= 1e-2 + 2e-3 * std::fabs(s))) { if (bad < 5) printf("bad %u %u got %f want %f\n", i, j, g, s); ++bad; }
        if (e > maxerr || e != e) maxerr = e;
    }
    printf("%s m=%u n=%u k=%u max abs err %g bad %zu\n", wide ? "wide" : "split", m, n, k, maxerr, bad);
    return bad != 0;
}
