#!/usr/bin/env bash
# On the H200 (carry .gpu; run from the repo root as
# `bash .gpu/run.sh -- bash scripts/regions-h200.sh`): the example crate's softmax with two
# accepted variants for two regions and the reference for the rest, through the generated
# launcher, and `cargo kopt verify` of both entries on their regions.
#
# Prepared here, in this order (the binary embeds the locks as they are when it is built):
#   cargo kopt revert softmax --arch sm_90   (in examples/llm-kernels)
#   cargo kopt pin softmax online-vec4 --arch sm_90 --region 'cols % 4 == 0 && cols < 65536'
#   cargo kopt pin softmax run-1796024738-r1c1 --arch sm_90 --region 'cols >= 65536'
#   cargo build --release -p llm-kernels && cp target/release/llm-kernels .gpu/bin/
# and a cargo-kopt staged by scripts/gpu-stage-tests.sh (CARGO_KOPT_XZ, default the CUDA 12.8
# bindings' in .gpu/cuda-12080; either loads the machine's CUDA 13 libraries at run time).
#
# STEPS picks steps (default: explain run verify); each has a timeout and the next runs
# after a failure. Back in $OUT: regions/ with each step's log, and summary.txt.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
STEPS="${STEPS:-explain run verify}"
ROOT="$PWD"
W="$OUT/regions"
mkdir -p "$W"
. "$ROOT/scripts/h200-steps.sh"
B=/tmp/regions-bin
mkdir -p "$B"
# scripts/gpu-tests.sh unpacks a staged folder in place: take the binary either way.
XZ="$ROOT/${CARGO_KOPT_XZ:-.gpu/cuda-12080/bin/cargo-kopt.xz}"
if [ -f "$XZ" ]; then xz -dc "$XZ" >"$B/cargo-kopt"; else cp "${XZ%.xz}" "$B/cargo-kopt"; fi
chmod +x "$B/cargo-kopt"
export PATH="$B:$PATH"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cd "$ROOT/examples/llm-kernels"
cp kopt/softmax/kopt.lock "$W/softmax-kopt.lock"
if has explain; then
    step explain 30 llm-kernels explain --arch sm_90 --device "NVIDIA H200"
fi
if has run; then
    step run 120 llm-kernels run
fi
if has verify; then
    step verify 300 cargo kopt verify softmax
fi
cp "$W/summary.txt" "$OUT/summary.txt"
