#!/usr/bin/env bash
# On the H200, from the repo root: builds and runs launch_timing.cu against the committed
# gqa_decode variant and agents/gqa_decode_pipe.cu (CLUSTER 8, WAVE_BLOCKS 64).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../../.."
w="$(mktemp -d)"
old="$root/examples/llm-kernels/kopt/gqa_decode/${OLD_VARIANT:-run-1795985991-r1c2}/kernel.cu"
nvcc -O3 -arch=sm_90 -DWARPS=8 -DSTAGES=3 -DCLUSTER=8 -c "$root/examples/llm-kernels/agents/gqa_decode_pipe.cu" -o "$w/new.o"
cp "$old" "$w/old.cu"
nvcc -O3 -arch=sm_90 -DWARPS=8 -DSTAGES=3 -Dgqa_decode_f16=gqa_decode_old -Dpartial_acc=old_partial_acc \
    -Dpartial_ml=old_partial_ml -Darrivals=old_arrivals -c "$w/old.cu" -o "$w/old.o"
nvcc -O3 -arch=sm_90 "$here/launch_timing.cu" "$w/new.o" "$w/old.o" -o "$w/launch_timing"
"$w/launch_timing"
