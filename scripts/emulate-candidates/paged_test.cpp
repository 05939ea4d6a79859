// Emulated runs of the paged_decode kernels against an f64 reference:
// paged_test q_heads kv_heads page_size LENS [cluster]
// LENS: the sequence lengths, comma-separated (batch = their count). The block table maps
// every sequence to max_pages = ceil(max(LENS) / page_size) + 1 pages (the last one never
// used), a random permutation of the batch * max_pages pages. The cache holds N(0, 1)
// values in the rows of the sequences and NaN everywhere else (unused rows of a last page,
// unused pages): a kernel that lets them reach the output fails.
// Built with -DREF: kernels/paged_decode.cu (grid batch * kv_heads, 128 threads). Otherwise
// the accepted variant (kopt/paged_decode/run-1796233338-r1c1) with its launch rule: grid (C, batch * kv_heads),
// WARPS * 32 threads, WARPS * STAGES * 8192 bytes of dynamic shared memory, clusters of C
// = clamp(SPLIT_BLOCKS / (batch * kv_heads), 1, MAX_CLUSTER); `cluster` overrides C.
#define STR2(x) #x
#define STR(x) STR2(x)
#ifdef REF
#include "paged_ref.cpp"
#define NAME "paged_decode reference"
#else
#include "paged.cpp"
#ifndef SPLIT_BLOCKS
#define SPLIT_BLOCKS 1024
#endif
#ifdef CP_ASYNC_EAGER
#define NAME "paged_decode candidate WARPS " STR(WARPS) " STAGES " STR(STAGES) " SORT_MAX " STR(SORT_MAX) " eager copies"
#else
#define NAME "paged_decode candidate WARPS " STR(WARPS) " STAGES " STR(STAGES) " SORT_MAX " STR(SORT_MAX) " deferred copies"
#endif
#endif
#include <random>
#include <string>
int main(int argc, char** argv) {
    if (argc < 5) { fprintf(stderr, "usage: paged_test q_heads kv_heads page_size LENS [cluster]\n"); return 2; }
    const unsigned qh = atoi(argv[1]), kvh = atoi(argv[2]), ps = atoi(argv[3]);
    std::vector<int> lens;
    for (std::string s = argv[4]; !s.empty();) {
        size_t c = s.find(',');
        lens.push_back(atoi(s.substr(0, c).c_str()));
        s = c == std::string::npos ? "" : s.substr(c + 1);
    }
    const unsigned batch = lens.size();
    const int longest = *std::max_element(lens.begin(), lens.end());
    const unsigned max_pages = (longest + ps - 1) / ps + 1, num_pages = batch * max_pages;
    const unsigned group = qh / kvh;
    std::mt19937 rng(qh * 131 + kvh * 17 + ps + longest * 7 + batch);
    std::normal_distribution<float> nd(0, 1);
    std::vector<int> table(num_pages);
    for (unsigned i = 0; i < num_pages; ++i) table[i] = i;
    std::shuffle(table.begin(), table.end(), rng);
    const size_t cache_elems = (size_t)num_pages * kvh * ps * 128;
    const __half nan_h = __float2half(NAN);
    std::vector<__half> q(batch * qh * 128), k(cache_elems, nan_h), v(cache_elems, nan_h), o(q.size());
    for (auto& x : q) x = __float2half(nd(rng));
    auto row = [&](unsigned b, unsigned h, unsigned p) {
        return (((size_t)table[b * max_pages + p / ps] * kvh + h) * ps + p % ps) * 128;
    };
    for (unsigned b = 0; b < batch; ++b)
        for (unsigned h = 0; h < kvh; ++h)
            for (int p = 0; p < lens[b]; ++p)
                for (int e = 0; e < 128; ++e) {
                    k[row(b, h, p) + e] = __float2half(nd(rng));
                    v[row(b, h, p) + e] = __float2half(nd(rng));
                }
    for (auto& x : o) x = nan_h;
#ifdef REF
    const unsigned cluster = 1;
    launch({batch * kvh, 1}, {128, 1}, 0, [&] {
        paged_decode_f16(q.data(), k.data(), v.data(), table.data(), lens.data(), o.data(), qh, kvh, ps, max_pages);
    });
#else
    const unsigned items = batch * kvh;
    unsigned cluster = std::max(1u, std::min((unsigned)MAX_CLUSTER, SPLIT_BLOCKS / items));
    if (argc > 5) cluster = atoi(argv[5]);
    launch_clusters({cluster, items}, {WARPS * 32, 1}, WARPS * STAGES * 8192, cluster, [&] {
        paged_decode_f16(q.data(), k.data(), v.data(), table.data(), lens.data(), o.data(), qh, kvh, ps, max_pages);
    });
#endif
    size_t bad = 0; double maxerr = 0;
    for (unsigned b = 0; b < batch; ++b) for (unsigned h = 0; h < qh; ++h) {
        const unsigned kv = h / group;
        std::vector<double> s(lens[b]); double mx = -1e300;
        for (int j = 0; j < lens[b]; ++j) {
            double d = 0;
            for (int e = 0; e < 128; ++e) d += (double)__half2float(q[(b * qh + h) * 128 + e]) * __half2float(k[row(b, kv, j) + e]);
            s[j] = d / std::sqrt(128.0); mx = std::max(mx, s[j]);
        }
        double sum = 0; for (auto& x : s) { x = std::exp(x - mx); sum += x; }
        for (int e = 0; e < 128; ++e) {
            double a = 0; for (int j = 0; j < lens[b]; ++j) a += s[j] * __half2float(v[row(b, kv, j) + e]);
            a = lens[b] > 0 ? a / sum : 0.0;  // an empty sequence: zeros
            const double got = __half2float(o[(b * qh + h) * 128 + e]), err = std::fabs(got - a);
            if (!(err <= 1e-2 + 1e-2 * std::fabs(a))) { if (bad < 3) printf("  bad b%u h%u d%d got %f want %f\n", b, h, e, got, a); ++bad; }
            if (!(err <= maxerr)) maxerr = err;
        }
    }
    printf(NAME " Hq%u Hkv%u page %u lens %s (max_pages %u) cluster %u: max abs err %.2e bad %zu\n",
           qh, kvh, ps, argv[4], max_pages, cluster, maxerr, bad);
    return bad != 0;
}
