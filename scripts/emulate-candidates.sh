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
