// Emulations for the paged_decode kernels (kernels/paged_decode.cu and the accepted
// variant, kopt/paged_decode/run-1796233338-r1c1): gqa_decode's PTX wrappers and intrinsics, plus the CUDA
// intrinsics only these use.
#pragma once
#include "gqa_ptx_emu.h"
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
// __shfl_sync of an int: every lane of the warp takes part, as on the GPU.
inline int __shfl_sync(unsigned, int v, int src) {
    Warp& w = my_warp(); unsigned l = my_lane();
    w.slot[l][0] = (uint64_t)(uint32_t)v; w.bar.arrive_and_wait();
    int r = (int)(uint32_t)w.slot[src & 31][0]; w.bar.arrive_and_wait(); return r;
}
