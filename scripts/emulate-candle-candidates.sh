#!/usr/bin/env bash
# No GPU needed: runs examples/candle-ops' hand-written candidates (the softmax and
# rmsnorm sources of agents/*_f32.proposal.json, which the bf16 ones share) in the CPU
# emulation of scripts/emulate-candidates/emu.h (one thread per CUDA thread, __syncthreads and warp shuffles emulated; bf16 in
# emulate-candidates/bf16_emu.h) with their proposals' launch rules, and compares them with
# a CPU model of candle's own arithmetic (reduce.cu's softmax and rmsnorm) on tails, odd
# shapes, several rows a block, rows longer than the registers hold and misaligned views,
# with the output's surroundings checked untouched. It checks index arithmetic, bounds
# and barrier placement; not timing, and not the device's math functions (the emulation's
# exp is the host's, on both sides). Needs g++ (C++20).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
agents="$here/../examples/candle-ops/agents"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$here"/emulate-candidates/emu.h "$here"/emulate-candidates/bf16_emu.h "$here"/emulate-candidates/candle_test.cpp "$work/"
for k in softmax rmsnorm; do
    sed -e 's|#include <cuda_bf16.h>|#include "bf16_emu.h"|' -e 's|extern "C" __global__||' \
        <(python3 "$here/scripted_agent.py" source "$agents/${k}_f32.proposal.json" 0) >"$work/$k.cpp"
done
cd "$work"
# The candidates reinterpret registers as vectors of bf16, as CUDA code does; in host C++
# that is type punning, so strict aliasing is off.
flags="-std=c++20 -O2 -fno-strict-aliasing -pthread"
fails=0
# CACHE of the softmax proposals: 4 (bf16), 8 (f32); the rmsnorm ones use the file's 2.
for cache in 4 8; do
    g++ $flags -DSOFTMAX_CACHE=$cache candle_test.cpp -o "candle_test_$cache"
    echo "softmax CACHE=$cache:"
    "./candle_test_$cache" || fails=$((fails + 1))
done
echo "candle-ops candidates: $fails run(s) failed"
[ "$fails" -eq 0 ]
