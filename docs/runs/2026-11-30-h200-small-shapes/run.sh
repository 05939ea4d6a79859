#!/usr/bin/env bash
# On the H200, from the repo root: builds sweep.cu with the kernel objects it names and runs
# it (argument: which kernels, e.g. "softmax silu_mul"; default all). nvcc, no kopt.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ex="$here/../../../examples/llm-kernels"
w="$(mktemp -d)"
objs=()
# obj NAME ENTRY SOURCE DEFINES...: SOURCE's ENTRY compiled as NAME.
obj() {
    local name=$1 entry=$2 src=$3
    shift 3
    nvcc -O3 -arch=sm_90 "$@" "-D$entry=$name" -c "$src" -o "$w/$name.o" &
    objs+=("$w/$name.o")
}
acc() { echo "$ex/kopt/$1/$(grep -m1 '^variant' "$ex/kopt/$1/kopt.lock" | cut -d'"' -f2)/kernel.cu"; }
sm="-DCACHE=8 -DEXCHANGE_PUSH=1 -DHEAD_REGS=1 -DSPLIT_REUSE=1 -DWARPS=1 -DWARP_CACHE=8"
obj sm_acc softmax_f32 "$(acc softmax)" $sm -DCLUSTER=8 -DSPLIT_CACHE=8 -DMERGE_TREE=1
# The accepted softmax with its cluster compiled in (__cluster_dims__) instead of set at launch.
sed 's/^extern "C" __global__ void __launch_bounds__(1024)/extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(1024)/' \
    "$(acc softmax)" >"$w/softmax_compiled_cluster.cu"
grep -q '__cluster_dims__(8, 1, 1)' "$w/softmax_compiled_cluster.cu"
obj sm_cc softmax_f32 "$w/softmax_compiled_cluster.cu" $sm -DCLUSTER=8 -DSPLIT_CACHE=8 -DMERGE_TREE=1
A="$ex/agents/softmax.cu"
G="$(acc gqa_decode)"
g="-DSPLIT_ITEMS=64 -DWAVE_BLOCKS=64"
obj gq_acc gqa_decode_f16 "$G" $g -DCLUSTER=8 -DSTAGES=3 -DWARPS=8
obj rms_acc rmsnorm_f16 "$(acc rmsnorm)" -DCACHE=4
obj rms_c8 rmsnorm_f16 "$ex/agents/rmsnorm.cu" -DCACHE=8
obj rms_c16 rmsnorm_f16 "$ex/agents/rmsnorm.cu" -DCACHE=16
obj ln_acc layer_norm_f16 "$(acc layer_norm)" -DMAX_VECS=4
for v in 2 4 8; do obj ln_fv$v layer_norm_f16 "$ex/agents/layer_norm.cu" -DMAX_VECS=4 -DFEW_VECS=$v; done
obj rs_acc reduce_sum_f32 "$(acc reduce_sum)" -DUNROLL=4
obj gq_w9s3 gqa_decode_f16 "$G" $g -DCLUSTER=8 -DSTAGES=3 -DWARPS=9
si="-DSMALL_THREADS=128 -DSMALL_U=1"
S="$ex/agents/silu_mul.cu"
obj si_acc silu_mul_f16 "$(acc silu_mul)" $si -DUNROLL=2
obj si_u1 silu_mul_f16 "$S" $si -DUNROLL=1
obj si_t512 silu_mul_f16 "$S" $si -DUNROLL=1 -DMAX_THREADS=512
obj si_t1024 silu_mul_f16 "$S" $si -DUNROLL=1 -DMAX_THREADS=1024
obj si_flat1_512 silu_mul_f16 "$S" $si -DFLAT=1 -DUNROLL=1 -DMAX_THREADS=512
obj si_t512_u2 silu_mul_f16 "$S" $si -DUNROLL=2 -DMAX_THREADS=512
obj copy_f4 copy_f4 "$here/ruler.cu"
wait
nvcc -O3 -arch=sm_90 -std=c++17 "$here/sweep.cu" "${objs[@]}" -o "$w/sweep"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
"$w/sweep" "${1:-}"
