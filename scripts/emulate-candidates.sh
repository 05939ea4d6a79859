#!/usr/bin/env bash
# No GPU needed: runs the hand-written candidates of examples/llm-kernels/agents/
# (layer_norm, rmsnorm, softmax without its cluster mode, transpose, silu_mul, gemm) in a CPU emulation of their blocks (one thread
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
python3 - "$agents" "$work" <<'PY'
import re, sys
agents, work = sys.argv[1], sys.argv[2]
def conv(name, out, gemm=False):
    s = open(f"{agents}/{name}").read()
    s = s.replace('#include <cuda_fp16.h>', '#include "emu.h"').replace('extern "C" __global__', '')
    s = re.sub(r'asm volatile\("st.global.cs.v4.u32.*?: "memory"\);', '*p = v;', s, flags=re.S)
    if gemm:
        s = re.sub(r'// PTX-BEGIN.*?// PTX-END', '#include "ptx_emu.h"', s, flags=re.S)
        s = s.replace('extern __shared__ __align__(128) unsigned char smem[];', 'unsigned char* smem = g_dyn_smem;')
    open(f"{work}/{out}", "w").write(s)
conv('layer_norm.cu', 'ln.cpp')
conv('silu_mul.cu', 'silu.cpp')
conv('transpose.cu', 'tr.cpp')
conv('gemm.cu', 'gemm.cpp', gemm=True)
conv('rmsnorm.cu', 'rms.cpp')
# softmax: the cluster helpers are PTX; the emulated shapes never reach the cluster mode.
s = open(f"{agents}/softmax.cu").read().replace('extern "C" __global__', '')
s = re.sub(r'__device__ __forceinline__ unsigned int cluster_rank.*?\n}\n\n(?=// One warp per row)', '', s, flags=re.S)
s = s.replace('__device__ __forceinline__ void warp_merge', '''unsigned cluster_rank() { abort(); }
void cluster_arrive() { abort(); }
void cluster_wait() { abort(); }
float2 load_remote(const float2*, unsigned) { abort(); }
__device__ __forceinline__ void warp_merge''')
open(f"{work}/sm.cpp", "w").write(s)
PY
cd "$work"
# The candidates reinterpret uint4 registers as __half2, as CUDA code does; in host C++
# that is type punning, so strict aliasing is off.
flags="-std=c++20 -O2 -fno-strict-aliasing -pthread"
g++ $flags mem_test.cpp -o mem_test
g++ $flags gemm_test.cpp -o gemm_test
g++ $flags norms_test.cpp -o norms_test
./mem_test
./norms_test
fails=0
for s in "128 128 32" "130 136 40" "256 384 256" "33 17 19" "100 8 8" "200 64 1032"; do
    ./gemm_test $s || fails=$((fails + 1))
done
echo "gemm: $fails failed"
[ "$fails" -eq 0 ]
