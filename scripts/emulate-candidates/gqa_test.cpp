// Emulated runs of a gqa_decode candidate against an f64 reference:
// gqa_test batch q_heads kv_heads seq_len wave_blocks (the launch rule's WAVE_BLOCKS)
// [splits: overrides the rule's grid.x, e.g. to leave trailing splits empty].
// Built with -DPIPE, it runs gqa_decode_pipe.cu (block WARPS * 32 threads, smem WARPS
// rings of STAGES tiles of 8 KB, and its launch rule's split and cluster: below
// SPLIT_ITEMS (64) work items, max(CLUSTER, wave_blocks / items rounded down to whole
// clusters) splits in clusters of CLUSTER; an overriding split count must then be whole
// clusters); otherwise gqa_decode.cu.
#define STR2(x) #x
#define STR(x) STR2(x)
#ifdef PIPE
#include "gqa_pipe.cpp"
#define BLOCK_THREADS (WARPS * 32)
#define DYN_SMEM (WARPS * STAGES * 8192)
#ifdef CP_ASYNC_EAGER
#define NAME "gqa_decode_pipe WARPS " STR(WARPS) " STAGES " STR(STAGES) " CLUSTER " STR(CLUSTER) " eager copies"
#else
#define NAME "gqa_decode_pipe WARPS " STR(WARPS) " STAGES " STR(STAGES) " CLUSTER " STR(CLUSTER) " deferred copies"
#endif
#else
#include "gqa.cpp"
#define BLOCK_THREADS 256
#define DYN_SMEM 0
#define NAME "gqa_decode"
#endif
#include <random>
int main(int argc, char** argv) {
    unsigned batch = atoi(argv[1]), qh = atoi(argv[2]), kvh = atoi(argv[3]), seq = atoi(argv[4]);
    unsigned wave = atoi(argv[5]);
    std::mt19937 rng(batch * 7919 + qh * 131 + kvh * 17 + seq); std::normal_distribution<float> nd(0, 1);
    std::vector<__half> q(batch * qh * 128), k((size_t)batch * kvh * seq * 128), v(k.size()), o(q.size());
    for (auto& x : q) x = __float2half(nd(rng)); for (auto& x : k) x = __float2half(nd(rng));
    for (auto& x : v) x = __float2half(nd(rng));
    // The proposal's launch rule.
    auto cdiv = [](unsigned a, unsigned b) { return (a + b - 1) / b; };
    unsigned items = batch * kvh * cdiv(qh / kvh, 8);
#ifdef PIPE
    const bool split = items < 64;  // the proposal's SPLIT_ITEMS
    unsigned splits = split ? std::max((unsigned)CLUSTER, wave / items / CLUSTER * CLUSTER) : 1;
    if (argc > 6) splits = atoi(argv[6]);
    const unsigned cluster = splits > 1 ? CLUSTER : 1;
#else
    unsigned s0 = std::max(1u, wave / items), per = cdiv(cdiv(seq, s0), 16) * 16, splits = cdiv(seq, per);
    if (argc > 6) splits = atoi(argv[6]);
    const unsigned cluster = 1;
#endif
    int fails = 0;
    for (int rep = 0; rep < 2; ++rep) {  // twice: the arrival counters must be reset
        for (auto& x : o) x = __float2half(NAN);
        launch_clusters({splits, items}, {BLOCK_THREADS, 1}, DYN_SMEM, cluster, [&] {
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
        printf(NAME " B%u Hq%u Hkv%u S%u grid %ux%u cluster %u run %d: max abs err %.2e bad %zu\n", batch, qh, kvh, seq, splits, items, cluster, rep, maxerr, bad);
        fails += bad != 0;
    }
    return fails;
}
