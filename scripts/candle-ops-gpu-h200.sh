#!/usr/bin/env bash
# On the H200, after scripts/candle-ops-stage.sh here (carry .gpu; run from the repo root as
# `bash .gpu/run.sh -- bash scripts/candle-ops-gpu-h200.sh`): examples/candle-ops' GPU tests
# (kopt's ops against candle's on candle tensors, and the decoder step) and its bench
# (candle's kernels and ops against kopt's: a table of times). The binaries link CUDA's
# libraries (cuBLAS, cuRAND, NVRTC, the runtime), found here in /usr/local/cuda/lib64.
#
# STEPS picks steps (default: tests explain bench); each has a timeout and the next runs
# after a failure. Back in $OUT: candle-ops-gpu/ with each step's log, and summary.txt.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
STEPS="${STEPS:-tests explain bench}"
ROOT="$PWD"
W="$OUT/candle-ops-gpu"
mkdir -p "$W"
STEP_TAIL=60
. "$ROOT/scripts/h200-steps.sh"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KOPT_REQUIRE_GPU=1
# Staged compressed (scripts/candle-ops-stage.sh): unpacked outside the carried tree.
B=/tmp/candle-ops-bin
mkdir -p "$B"
for f in "$ROOT"/.gpu/candle-ops/*.xz; do
    xz -dc "$f" >"$B/$(basename "$f" .xz)" && chmod +x "$B/$(basename "$f" .xz)"
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$W/nvidia-smi.txt" 2>&1
ldd "$B/candle-ops" >"$W/ldd.txt" 2>&1
cd "$ROOT/examples/candle-ops"
if has tests; then
    step tests 600 "$B/gpu-test" --include-ignored --test-threads 1 --nocapture
fi
if has explain; then
    step explain 30 "$B/candle-ops" explain
fi
if has bench; then
    step bench 600 "$B/candle-ops" bench --samples "${SAMPLES:-50}"
fi
cp "$W/summary.txt" "$OUT/summary.txt"
