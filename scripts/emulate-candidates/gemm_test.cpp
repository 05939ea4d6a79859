// Emulated run of the gemm candidate against an f64 reference: gemm_test M N K.
#include "gemm.cpp"
#include <random>
int main(int argc, char** argv) {
    unsigned m = atoi(argv[1]), n = atoi(argv[2]), k = atoi(argv[3]);
    std::mt19937 rng(1); std::normal_distribution<float> nd(0, 1);
    std::vector<__half> a(m * k), b(k * n), c(m * n, __float2half(NAN));
    for (auto& x : a) x = __float2half(nd(rng)); for (auto& x : b) x = __float2half(nd(rng));
    launch({(n + 127) / 128, (m + 127) / 128}, {256, 1}, 4 * (128 * 32 + 32 * 128) * 2,
           [&] { gemm_f16(a.data(), b.data(), c.data(), m, n, k); });
    double maxerr = 0; size_t bad = 0;
    for (unsigned i = 0; i < m; ++i) for (unsigned j = 0; j < n; ++j) {
        double s = 0; for (unsigned p = 0; p < k; ++p) s += (double)__half2float(a[i * k + p]) * __half2float(b[p * n + j]);
        double g = __half2float(c[i * n + j]); double e = std::fabs(g - s);
        if (!(e <= 1e-2 + 2e-3 * std::fabs(s))) { if (bad < 5) printf("bad %u %u got %f want %f\n", i, j, g, s); ++bad; }
        if (e > maxerr || e != e) maxerr = e;
    }
    printf("m=%u n=%u k=%u max abs err %g bad %zu\n", m, n, k, maxerr, bad);
    return bad != 0;
}
