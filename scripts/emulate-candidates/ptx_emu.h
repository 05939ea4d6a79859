// Emulations of the PTX wrappers of gemm_f16_mma.cu.
inline unsigned int smem_addr(const void* p) { return (unsigned)((const unsigned char*)p - g_dyn_smem); }
// Deferred (the default): a copy lands at the wait that retires its group, the latest a
// GPU may land it, so a read before its wait sees the poison. CP_ASYNC_EAGER: it lands at
// issue, the earliest, so a refill issued before the lanes finish reading a stage shows.
inline void cp_async16(unsigned int dst, const void* src, int n) {
#ifdef CP_ASYNC_EAGER
    std::vector<Copy> now{{dst, src, n}};
    do_copies(now);
#else
    t_open.push_back({dst, src, n});
#endif
}
inline void cp_async_commit() { t_groups.push_back(t_open); t_open.clear(); }
template <int N> inline void cp_async_wait() {
    while ((int)t_groups.size() > N) { do_copies(t_groups.front()); t_groups.pop_front(); }
}
inline uint16_t smem_h(unsigned addr) { uint16_t v; memcpy(&v, g_dyn_smem + addr, 2); return v; }
inline void ldm(unsigned* r, unsigned addr, bool trans) {
    Warp& w = my_warp(); unsigned l = my_lane();
    if (addr % 16) { fprintf(stderr, "ldmatrix misaligned\n"); abort(); }
    w.slot[l][0] = addr; w.bar.arrive_and_wait();
    for (int i = 0; i < 4; ++i) {
        unsigned row, col;
        if (!trans) { row = l / 4; col = 2 * (l % 4); 
            unsigned base = w.slot[8 * i + row][0];
            r[i] = smem_h(base + 2 * col) | (unsigned)smem_h(base + 2 * col + 2) << 16;
        } else { row = 2 * (l % 4); col = l / 4;
            unsigned b0 = w.slot[8 * i + row][0], b1 = w.slot[8 * i + row + 1][0];
            r[i] = smem_h(b0 + 2 * col) | (unsigned)smem_h(b1 + 2 * col) << 16;
        }
    }
    w.bar.arrive_and_wait();
}
inline void ldmatrix_x4(unsigned int* r, unsigned int addr) { ldm(r, addr, false); }
inline void ldmatrix_x4_trans(unsigned int* r, unsigned int addr) { ldm(r, addr, true); }
inline float hf(unsigned reg, int half) { uint16_t b = half ? reg >> 16 : reg & 0xffff; _Float16 h; memcpy(&h, &b, 2); return (float)h; }
inline void mma_16816(float* d, const unsigned int* a, const unsigned int* b) {
    Warp& w = my_warp(); unsigned l = my_lane();
    for (int i = 0; i < 4; ++i) w.slot[l][i] = a[i];
    for (int i = 0; i < 2; ++i) w.slot[l][4 + i] = b[i];
    w.bar.arrive_and_wait();
    auto A = [&](unsigned row, unsigned k) { unsigned ln = (row % 8) * 4 + (k % 8) / 2; int reg = (row >= 8) + 2 * (k >= 8); return hf(w.slot[ln][reg], k % 2); };
    auto B = [&](unsigned k, unsigned col) { unsigned ln = col * 4 + (k % 8) / 2; int reg = k >= 8; return hf(w.slot[ln][4 + reg], k % 2); };
    for (int e = 0; e < 4; ++e) {
        unsigned row = l / 4 + (e >= 2 ? 8 : 0), col = 2 * (l % 4) + (e % 2);
        float s = d[e]; for (unsigned k = 0; k < 16; ++k) s += A(row, k) * B(k, col); d[e] = s;
    }
    w.bar.arrive_and_wait();
}
