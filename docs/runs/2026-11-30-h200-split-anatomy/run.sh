#!/usr/bin/env bash
# On the H200, from the repo root: builds split_anatomy.cu with agents/softmax.cu (the
# accepted softmax variant's source and defines) and runs it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../../.."
w="$(mktemp -d)"
nvcc -O3 -arch=sm_90 -DCLUSTER=8 -DGATHER=1 -DCACHE=8 -DWARPS=1 -DWARP_CACHE=8 \
    -c "$root/examples/llm-kernels/agents/softmax.cu" -o "$w/softmax.o"
nvcc -O3 -arch=sm_90 "$here/split_anatomy.cu" "$w/softmax.o" -o "$w/split_anatomy"
"$w/split_anatomy"
