#!/usr/bin/env bash
# No GPU needed: runs the hand-written candidates of examples/llm-kernels/agents/
# (layer_norm, rmsnorm, softmax without its cluster mode, transpose, silu_mul, gemm, gqa_decode
# and gqa_decode_pipe) in a CPU emulation of their blocks (one thread
# per CUDA thread; __syncthreads, warp shuffles, ldmatrix, mma.sync m16n8k16 and
# deferred cp.async groups emulated in scripts/emulate-candidates/*.h) and compares them
# with f64 references on small and edge shapes. Needs g++ (C++20) and python3.
# It checks index arithmetic, fragment layouts, bounds and barrier placement; not timing,
# and not what the emulation cannot see (memory-model subtleties, the real compiler).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
agents="$here/../examples/llm-kernels/agents"
work="$(mktemp -d)"
cp "$here"/emulate-candidates/* "$work/"
python3 - "$agents" "$work" "$here" <<'PY'
import re, sys
agents, work = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
from scripted_agent import resolved_set
def source(kernel, i=0):
    """The source of proposals[i] of the kernel's proposal file, as the agent answers it."""
    return resolved_set(f"{agents}/{kernel}.proposal.json")["proposals"][i]["candidate"]["source"]
def conv(s, out, gemm=False, gqa=False, dyn_smem=False, block_shared=False):
    s = s.replace('#include <cuda_fp16.h>', '#include "emu.h"').replace('extern "C" __global__', '')
    s = re.sub(r'asm volatile\("st.global.cs.v4.u32.*?: "memory"\);', '*p = v;', s, flags=re.S)
    if block_shared:
        # Blocks of a cluster run side by side: each its own static shared variables
        # (before the dynamic shared memory and gqa's aligned arrays are rewritten).
        s = re.sub(r'__shared__ (?:__align__\(\d+\) )?(\w+) (\w+)((?:\[[^\]]+\])*);',
                   r'auto& \2 = block_shared<\1\3>("\2");', s)
    if gemm:
        s = re.sub(r'// PTX-BEGIN.*?// PTX-END', '#include "ptx_emu.h"', s, flags=re.S)
        s = s.replace('extern __shared__ __align__(128) unsigned char smem[];', 'unsigned char* smem = g_dyn_smem;')
    if gqa:
        s = re.sub(r'// PTX-BEGIN.*?// PTX-END', '#include "gqa_ptx_emu.h"', s, flags=re.S)
        s = s.replace('__shared__ __align__(16)', 'alignas(16) static')
    if dyn_smem:
        s = s.replace('extern __shared__ __align__(128) unsigned char smem[];', 'unsigned char* smem = g_dyn_smem;')
        s = s.replace('return *reinterpret_cast<const unsigned int*>(&h);', 'unsigned int r; memcpy(&r, &h, 4); return r;')
    open(f"{work}/{out}", "w").write(s)
conv(source('gqa_decode'), 'gqa.cpp', gqa=True)
conv(source('gqa_decode', 1), 'gqa_pipe.cpp', gqa=True, dyn_smem=True, block_shared=True)
conv(source('layer_norm'), 'ln.cpp')
conv(source('silu_mul'), 'silu.cpp')
conv(source('transpose'), 'tr.cpp')
conv(source('gemm'), 'gemm.cpp', gemm=True)
conv(source('rmsnorm'), 'rms.cpp')
# softmax: the cluster helpers are PTX; the emulated shapes never reach the cluster mode.
s = source("softmax").replace('extern "C" __global__', '')
s = re.sub(r'__device__ __forceinline__ unsigned int cluster_rank.*?\n}\n\n(?=// One warp per row)', '', s, flags=re.S)
s = s.replace('__device__ __forceinline__ void warp_merge', '''unsigned cluster_rank() { abort(); }
unsigned cluster_blocks() { abort(); }
void cluster_arrive() { abort(); }
void cluster_wait() { abort(); }
float2 load_remote(const float2*, unsigned) { abort(); }
void init_exchange(unsigned long long*, unsigned) { abort(); }
void push_pair(float2*, unsigned long long*, unsigned, float, float) { abort(); }
void wait_exchange(unsigned long long*) { abort(); }
__device__ __forceinline__ void warp_merge''')
open(f"{work}/sm.cpp", "w").write(s)
# paged_decode: the candidate, the blocks of a cluster side by side (its merge reads their
# shared memory), with paged_ptx_emu.h's intrinsics; and the reference kernel, common.cuh
# inlined.
conv(resolved_set(f"{agents}/hopper/paged_decode.proposal.json")["proposals"][0]["candidate"]["source"], 'paged.cpp', gqa=True, dyn_smem=True, block_shared=True)
s = open(f"{work}/paged.cpp").read().replace('#include "gqa_ptx_emu.h"', '#include "paged_ptx_emu.h"')
open(f"{work}/paged.cpp", "w").write(s)
kernels = f"{agents}/../kernels"
common = open(f"{kernels}/common.cuh").read().replace('#pragma once', '').replace('#include <cuda_fp16.h>', '')
s = open(f"{kernels}/paged_decode.cu").read()
s = s.replace('#include "common.cuh"', '#include "emu.h"\n#include "paged_ptx_emu.h"\n' + common)
open(f"{work}/paged_ref.cpp", "w").write(s.replace('extern "C" __global__', ''))
PY
cd "$work"
# The candidates reinterpret uint4 registers as __half2, as CUDA code does; in host C++
# that is type punning, so strict aliasing is off.
flags="-std=c++20 -O2 -fno-strict-aliasing -pthread"
g++ $flags mem_test.cpp -o mem_test
# The transpose candidate's ORDER define (which tiles run side by side) changes its index
# arithmetic: the other orders run too, and bands of 3 tile rows (GROUP) leave a short
# last band on the test shapes. TILES (tiles per block) of 2 and 3 leave a last block with
# fewer tiles than TILES on some shapes; with ORDER=1, as the proposals run it. THREADS of
# 64, 128 and 512 give each warp 16, 8 and 2 chunks of a tile.
transpose_defines=("-DORDER=0" "-DORDER=1" "-DGROUP=3" "-DTILES=2" "-DTILES=3" "-DORDER=1 -DTILES=4" "-DORDER=1 -DTHREADS=128" "-DTHREADS=128 -DTILES=2" "-DTHREADS=512" "-DTHREADS=64 -DORDER=1")
for order in "${transpose_defines[@]}"; do
    g++ $flags $order mem_test.cpp -o "mem_test${order// /}"
done
# The gemm candidate picks its tile from the tile count; WIDE_MIN_TILES=1 sends these small
# shapes through the 128 x 256 path, the default through the 128 x 128 split-K one.
g++ $flags gemm_test.cpp -o gemm_test
g++ $flags -DWIDE_MIN_TILES=1 gemm_test.cpp -o gemm_test_wide
g++ $flags norms_test.cpp -o norms_test
# The softmax and silu_mul proposals differ only in geometry defines: each runs.
softmax_defines=("-DWARPS=1" "-DWARPS=2" "-DWARPS=1 -DHEAD_REGS=1")
silu_defines=("-DSMALL_U=2" "-DSMALL_U=2 -DSMALL_THREADS=64" "-DFLAT=1" "-DFLAT=1 -DUNROLL=1" "-DFLAT=1 -DUNROLL=1 -DSTORE_PLAIN=1 -DLOAD_HINT=1")
for geometry in "${softmax_defines[@]}"; do
    g++ $flags $geometry norms_test.cpp -o "norms_test$geometry"
done
for geometry in "${silu_defines[@]}"; do
    g++ $flags $geometry mem_test.cpp -o "mem_test${geometry// /}"
done
./mem_test
for order in "${transpose_defines[@]}"; do
    echo "transpose $order:"
    "./mem_test${order// /}" | grep transpose
done
./norms_test
for geometry in "${softmax_defines[@]}"; do
    echo "softmax $geometry:"
    "./norms_test$geometry" | grep -E "softmax|failed"
done
for geometry in "${silu_defines[@]}"; do
    echo "silu_mul $geometry:"
    "./mem_test${geometry// /}" | grep -E "silu|failed"
done
fails=0
for s in "128 128 64" "130 136 40" "256 384 256" "33 17 19" "100 8 8" "200 64 1032" "257 520 200"; do
    ./gemm_test $s || fails=$((fails + 1))
    ./gemm_test_wide $s || fails=$((fails + 1))
done
echo "gemm: $fails failed"
[ "$fails" -eq 0 ]
# gqa_decode: batch q_heads kv_heads seq_len WAVE_BLOCKS [splits]. Groups of 1, 2, 3, 4, 8,
# 11 (two work items of 8 and 3 heads) and 16; one split (WAVE_BLOCKS 1, or more work
# items than WAVE_BLOCKS) and many; several tiles per warp; empty trailing splits.
g++ $flags gqa_test.cpp -o gqa_test
for s in "1 32 8 1 132" "1 32 8 17 132" "2 32 8 1000 132" "1 32 8 4099 132" "3 16 8 333 132" \
         "1 64 8 515 132" "1 64 4 300 132" "2 24 8 200 132" "1 8 8 129 132" "2 33 3 77 132" \
         "2 32 8 513 1" "20 32 8 64 132" "1 32 8 40 132 5" "1 16 16 31 132 7" \
         "1 32 8 3000 16" "1 32 8 4100 8" "2 32 8 2500 40" "1 64 4 1500 9"; do
    ./gqa_test $s || fails=$((fails + 1))
done
echo "gqa_decode: $fails failed"
[ "$fails" -eq 0 ]
# gqa_decode_pipe: the same shapes, plus ones for its ring's prologue and epilogue: fewer
# keys than a tile (1, 5, 15), not a multiple of 16, warps with fewer tiles than the ring
# has stages (and none), exactly STAGES tiles per warp, many per warp (one split: 4099 keys
# are 33 tiles per warp of 8), many splits (WAVE_BLOCKS 264: 32 at batch 1). Split, its
# blocks merge in clusters (CLUSTER, default 8): one cluster per work item (WAVE_BLOCKS 64
# at 8 items), several with a second merge through the scratch (132: 2 at 8 items; the
# overrides of 16 to 48 splits, many of them empty). Each in the proposal's geometry
# (WARPS 8, STAGES 3, CLUSTER 8) and, on short shapes, 4 warps, 2 stages, clusters of 16
# and 12 and no cluster (CLUSTER 1: the global merge of every split), with cp.async copies
# landing at their wait (deferred) and at their issue (eager).
pipe_shapes=("1 32 8 1 132" "1 32 8 5 132" "1 32 8 15 132 1" "1 32 8 17 132" "2 32 8 1000 132"
    "1 32 8 4099 132" "3 16 8 333 132" "1 64 8 515 132" "1 64 4 300 132" "2 24 8 200 132"
    "1 8 8 129 132" "2 33 3 77 132" "2 32 8 513 1" "20 32 8 64 132" "1 32 8 40 132 32"
    "1 16 16 31 132 48" "1 32 8 3000 16" "1 32 8 4100 8" "2 32 8 2500 40" "1 64 4 1500 9"
    "1 32 8 100 1" "1 32 8 383 1" "1 32 8 384 1" "1 32 8 4099 1" "1 32 8 2000 264"
    "2 32 8 2049 264" "1 32 8 31 132 16" "1 32 8 4099 64" "1 32 8 1000 64" "8 32 8 300 132")
# The other geometries on the short shapes (the emulation is slow: one OS thread per lane).
pipe_short=("1 32 8 5 132" "1 32 8 17 132" "2 33 3 77 132" "1 64 4 300 132" "1 32 8 100 1"
    "1 32 8 383 1" "1 32 8 40 132 48" "1 16 16 31 132 48" "2 32 8 1000 264" "1 64 8 515 132"
    "1 32 8 600 64")
for geometry in "-DWARPS=8 -DSTAGES=3" "-DWARPS=4 -DSTAGES=3" "-DWARPS=8 -DSTAGES=2" \
                "-DCLUSTER=16" "-DCLUSTER=12" "-DCLUSTER=1"; do
    for copies in "" "-DCP_ASYNC_EAGER"; do
        bin="gqa_pipe_test${geometry// /}$copies"
        g++ $flags -DPIPE $geometry $copies gqa_test.cpp -o "$bin"
        if [ "$geometry" = "-DWARPS=8 -DSTAGES=3" ]; then shapes=("${pipe_shapes[@]}"); else shapes=("${pipe_short[@]}"); fi
        for s in "${shapes[@]}"; do
            "./$bin" $s || fails=$((fails + 1))
        done
    done
done
echo "gqa_decode_pipe: $fails failed"
[ "$fails" -eq 0 ]
# paged_decode (kernels/paged_decode.cu, the reference, and the accepted variant,
# kopt/paged_decode/run-1796233338-r1c1): q_heads kv_heads page_size LENS [cluster]. Pages of 16, 64, 32 and 80 keys;
# groups of 1, 3, 4 and 8 query heads; lengths of 0 and 1, below a tile, not a multiple of
# the page, equal ones (the candidate's longest-first ranking breaks ties by index); rows
# past a sequence and unused pages hold NaN. The candidate also: its rule's clusters (8 at
# these few work items) and overrides of 1 (no cluster; one block streams 4100 keys, 65
# tiles a warp, so the page indices it prefetches 32 tiles at a time roll over twice), 3
# and 7 (odd sizes), clusters with more blocks than tiles (empty blocks), and, on the short
# shapes, 8 warps, rings of 2 and 4 stages, the batch's own order (SORT_MAX 2) and copies
# landing at issue (eager) as well as at their wait (deferred).
g++ $flags -DREF paged_test.cpp -o paged_ref_test
paged_shapes=("8 2 16 1,17,100,333" "8 2 64 64,65,1,200" "32 8 16 300,47" "4 4 16 129"
    "24 8 80 500,1,161" "16 2 32 777,40" "8 2 16 5,5,0,300,5")
for s in "${paged_shapes[@]}"; do
    ./paged_ref_test $s || fails=$((fails + 1))
done
echo "paged_decode reference: $fails failed"
[ "$fails" -eq 0 ]
paged_long=("8 1 16 4100 1" "8 1 64 4100 1" "8 1 16 4100" "8 2 16 1,17,100,333 1"
    "8 2 16 1,17,100,333 3" "8 2 16 2,3" "8 2 64 1000,999,3000 7")
paged_short=("8 2 16 1,17,100,333" "8 2 64 64,65,1,200" "24 8 80 500,1,161" "8 2 16 5,5,0,300,5"
    "8 2 16 2,3" "8 2 16 1,17,100,333 1" "8 1 16 1200 1")
for geometry in "" "-DWARPS=8" "-DSTAGES=2" "-DSTAGES=4" "-DSORT_MAX=2"; do
    for copies in "" "-DCP_ASYNC_EAGER"; do
        bin="paged_test${geometry// /}$copies"
        g++ $flags $geometry $copies paged_test.cpp -o "$bin"
        if [ -z "$geometry$copies" ]; then shapes=("${paged_shapes[@]}" "${paged_long[@]}"); else shapes=("${paged_short[@]}"); fi
        for s in "${shapes[@]}"; do
            "./$bin" $s || fails=$((fails + 1))
        done
    done
done
echo "paged_decode candidate: $fails failed"
[ "$fails" -eq 0 ]

# gqa_decode_v3 (agents/gqa_decode_v3.cu, rejected by the loop on 2026-12-02):
# its own conversion (the relaxed cluster arrive and the pushes into other blocks' shared
# memory are emulated in gqa_v3_emu.h) and driver (gqa_v3_test.cpp: batch q_heads kv_heads
# seq_len WAVE_BLOCKS CLUSTER GROUPS FEW_BLOCKS [splits cluster]). The proposal's rule
# (WAVE_BLOCKS 128, CLUSTER 8, GROUPS 1, FEW_BLOCKS 64): no split from 65 work items up
# (batch 9: 72), one cluster of P blocks per item (batch 8: 2; batch 2: 8), grids of at most
# 64 blocks on the 12-warp ring (batch 1); G clusters per item merged through the scratch
# (CLUSTER 2 GROUPS 8, CLUSTER 4 GROUPS 4, CLUSTER 1: no cluster, every split through the
# scratch); forced grids with empty trailing splits and clusters of 16 (non-portable).
# Groups of 1, 2, 3, 4, 8, 11 and 16 query heads; fewer keys than a tile. On short shapes
# also each ring geometry alone (FEW_BLOCKS 0 and 100000), copies landing early, the other
# refill orders, and other warp and stage counts.
python3 - "$agents" "$work" "$here" <<'PY'
import re, sys
agents, work = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
s = open(f"{agents}/gqa_decode_v3.cu").read()
s = s.replace('#include <cuda_fp16.h>', '#include "emu.h"').replace('extern "C" __global__', '')
# Blocks of a cluster run side by side: each its own static shared variables.
s = re.sub(r'__shared__ (?:__align__\(\d+\) )?(\w+) (\w+)((?:\[[^\]]+\])*);',
           r'auto& \2 = block_shared<\1\3>("\2");', s)
s = re.sub(r'// PTX-BEGIN.*?// PTX-END', '#include "gqa_v3_emu.h"', s, flags=re.S)
s = s.replace('extern __shared__ __align__(128) unsigned char smem[];', 'unsigned char* smem = g_dyn_smem;')
s = s.replace('return *reinterpret_cast<const unsigned int*>(&h);', 'unsigned int r; memcpy(&r, &h, 4); return r;')
assert '__shared__' not in s, "gqa_decode_v3: a __shared__ declaration was not rewritten"
open(f"{work}/gqa_v3.cpp", "w").write(s)
PY
v3_fails=0
v3_shapes=("8 32 8 200 128 8 1 64" "8 32 8 1 128 8 1 64" "9 32 8 1 128 8 1 64" "9 32 8 40 128 8 1 64"
    "2 32 8 300 128 8 1 64" "1 32 8 1 128 8 1 64" "1 32 8 5 128 8 1 64" "1 32 8 17 128 8 1 64"
    "1 32 8 1000 128 8 1 64" "1 32 8 4099 128 8 1 64" "1 32 8 700 128 4 4 64" "1 32 8 77 128 1 16 64"
    "1 32 8 1000 128 2 8 64" "3 16 8 333 128 8 1 64" "1 64 8 515 128 8 1 64" "1 64 4 300 128 8 1 64"
    "2 24 8 200 128 8 1 64" "1 8 8 129 128 8 1 64" "2 33 3 77 128 4 4 64" "1 32 8 40 128 2 8 64 16 2"
    "1 32 8 31 128 8 1 64 16 16" "1 16 16 31 128 2 8 64 16 16" "1 32 8 600 128 1 16 64 12 1"
    "2 32 8 2049 128 8 1 64" "1 32 8 2 128 4 4 64")
v3_short=("8 32 8 100 128 8 1 0" "8 32 8 100 128 8 1 100000" "1 32 8 5 128 8 1 0"
    "1 32 8 383 128 8 1 100000" "2 33 3 77 128 4 4 100000"
    "1 32 8 40 128 2 8 0 16 2" "1 16 16 31 128 2 8 100000 16 16" "9 32 8 1 128 8 1 100000"
    "1 32 8 600 128 1 16 0")
for geometry in "" "-DEARLY_REFILL=0 -DEARLY_FEW=1" "-DWARPS=4 -DSTAGES=2 -DWARPS_FEW=8 -DSTAGES_FEW=3"; do
    for copies in "" "-DCP_ASYNC_EAGER"; do
        bin="gqa_v3_test${geometry// /}$copies"
        g++ $flags $geometry $copies gqa_v3_test.cpp -o "$bin"
        if [ -z "$geometry$copies" ]; then shapes=("${v3_shapes[@]}"); else shapes=("${v3_short[@]}"); fi
        for s in "${shapes[@]}"; do
            "./$bin" $s || v3_fails=$((v3_fails + 1))
        done
    done
done
echo "gqa_decode_v3: $v3_fails failed"
[ "$v3_fails" -eq 0 ]
