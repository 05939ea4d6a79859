#!/usr/bin/env bash
# On the H200, from the repo root: builds split_anatomy.cu with agents/softmax.cu (the
# accepted softmax variant's source and defines; also with GATHER 0, CACHE 4, and a copy
# with phase stamps made by phases.py) and runs it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../../.."
w="$(mktemp -d)"
src="$root/examples/llm-kernels/agents/softmax.cu"
base="-DCLUSTER=8 -DWARPS=1 -DWARP_CACHE=8"
nvcc -O3 -arch=sm_90 $base -DGATHER=1 -DCACHE=8 -c "$src" -o "$w/softmax.o"
nvcc -O3 -arch=sm_90 $base -DGATHER=0 -DCACHE=8 -Dsoftmax_f32=softmax_g0 -c "$src" -o "$w/g0.o"
nvcc -O3 -arch=sm_90 $base -DGATHER=1 -DCACHE=4 -Dsoftmax_f32=softmax_c4 -c "$src" -o "$w/c4.o"
python3 "$here/phases.py" "$src" "$w/phases.cu"
nvcc -O3 -arch=sm_90 $base -DGATHER=1 -DCACHE=8 -Dsoftmax_f32=softmax_phases -c "$w/phases.cu" \
    -o "$w/phases.o"
nvcc -O3 -arch=sm_90 "$here/split_anatomy.cu" "$w/softmax.o" "$w/g0.o" "$w/c4.o" "$w/phases.o" \
    -o "$w/split_anatomy"
"$w/split_anatomy"
