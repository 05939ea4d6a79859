// Emulated runs of agents/gqa_decode_v3.cu against an f64 reference:
// gqa_v3_test batch q_heads kv_heads seq_len WAVE_BLOCKS CLUSTER GROUPS FEW_BLOCKS [splits cluster]
// The launch rule of gqa_decode_v3.proposal.json: items = batch * kv_heads *
// ceil(group / 8), P = max(1, WAVE_BLOCKS / items), cluster C = min(CLUSTER, P), G = min(GROUPS,
// P / C) clusters per item, grid (C * G, items); grids of at most FEW_BLOCKS blocks take the
// second ring geometry (WARPS_FEW * 32 threads, WARPS_FEW * STAGES_FEW * 8 KB of dynamic
// shared memory), others the first (WARPS, STAGES). [splits cluster] override the grid's x
// and the cluster (splits must be whole clusters), e.g. to leave trailing splits empty.
// Each shape runs twice (the arrival counters must be reset), outputs poisoned with NaN
// before each.
#include "gqa_v3.cpp"
#include <random>
int main(int argc, char** argv) {
    if (argc < 9) { fprintf(stderr, "usage: gqa_v3_test batch q_heads kv_heads seq_len WAVE_BLOCKS CLUSTER GROUPS FEW_BLOCKS [splits cluster]\n"); return 2; }
    unsigned batch = atoi(argv[1]), qh = atoi(argv[2]), kvh = atoi(argv[3]), seq = atoi(argv[4]);
    unsigned wave = atoi(argv[5]), cl = atoi(argv[6]), gmax = atoi(argv[7]), few = atoi(argv[8]);
    std::mt19937 rng(batch * 7919 + qh * 131 + kvh * 17 + seq); std::normal_distribution<float> nd(0, 1);
    std::vector<__half> q(batch * qh * 128), k((size_t)batch * kvh * seq * 128), v(k.size()), o(q.size());
    for (auto& x : q) x = __float2half(nd(rng)); for (auto& x : k) x = __float2half(nd(rng));
    for (auto& x : v) x = __float2half(nd(rng));
    auto cdiv = [](unsigned a, unsigned b) { return (a + b - 1) / b; };
    const unsigned items = batch * kvh * cdiv(qh / kvh, 8);
    const unsigned P = std::max(1u, wave / items), C = std::min(cl, P), G = std::min(gmax, P / C);
    unsigned splits = C * G, cluster = C;
    if (argc > 10) { splits = atoi(argv[9]); cluster = atoi(argv[10]); }
    const bool small = splits * items <= few;
    const unsigned warps = small ? WARPS_FEW : WARPS, smem = small ? WARPS_FEW * STAGES_FEW * 8192 : WARPS * STAGES * 8192;
    int fails = 0;
    for (int rep = 0; rep < 2; ++rep) {
        for (auto& x : o) x = __float2half(NAN);
        launch_clusters({splits, items}, {warps * 32, 1}, smem, cluster, [&] {
            gqa_decode_f16(q.data(), k.data(), v.data(), o.data(), batch, qh, kvh, seq);
        });
        size_t bad = 0; double maxerr = 0;
        for (unsigned b = 0; b < batch; ++b) for (unsigned h = 0; h < qh; ++h) {
            unsigned kv = h / (qh / kvh);
            const __half* kr = &k[((size_t)b * kvh + kv) * seq * 128];
            const __half* vr = &v[((size_t)b * kvh + kv) * seq * 128];
            std::vector<double> s(seq); double mx = -1e300;
            for (unsigned j = 0; j < seq; ++j) { double d = 0; for (int e = 0; e < 128; ++e) d += (double)__half2float(q[(b * qh + h) * 128 + e]) * __half2float(kr[j * 128 + e]);
                s[j] = d / std::sqrt(128.0); mx = std::max(mx, s[j]); }
            double sum = 0; for (auto& x : s) { x = std::exp(x - mx); sum += x; }
            for (int e = 0; e < 128; ++e) { double a = 0; for (unsigned j = 0; j < seq; ++j) a += s[j] * __half2float(vr[j * 128 + e]);
                a /= sum; double got = __half2float(o[(b * qh + h) * 128 + e]); double err = std::fabs(got - a);
                if (!(err <= 1e-2 + 1e-2 * std::fabs(a))) { if (bad < 3) printf("  bad b%u h%u d%d got %f want %f\n", b, h, e, got, a); ++bad; }
                if (!(err <= maxerr)) maxerr = err; }
        }
        printf("gqa_decode_v3 (WARPS %d STAGES %d EARLY_REFILL %d | WARPS_FEW %d STAGES_FEW %d EARLY_FEW %d)"
               " B%u Hq%u Hkv%u S%u grid %ux%u cluster %u block %u run %d: max abs err %.2e bad %zu\n",
               WARPS, STAGES, EARLY_REFILL, WARPS_FEW, STAGES_FEW, EARLY_FEW,
               batch, qh, kvh, seq, splits, items, cluster, warps * 32, rep, maxerr, bad);
        fails += bad != 0;
    }
    return fails;
}
