#!/usr/bin/env bash
# On the H200 (carry .gpu; from the repo root: `bash .gpu/run.sh -- bash scripts/hopper-h200.sh`):
# TMA tensor maps on the GPU, the Hopper candidates of examples/llm-kernels/agents/hopper/
# through kopt's loop, and the kernels timed against PyTorch in the same session.
#
# Staged here first: scripts/gpu-stage-tests.sh (cargo-kopt, the GPU test binaries and the
# llm-kernels binary in .gpu/cuda-13000) and gpu-stage --with-cargo --no-tests (cargo).
#
# Steps (STEPS, default: tests optimize accept rounds; each under a timeout, the next after
# a failure):
#   tests     kopt-tests' gpu_tma: a TMA kernel through the generated launcher, and a TMA
#             variant verified against its pointer reference by the engine's worker
#   optimize  `cargo kopt optimize KERNELS` with the scripted agent answering from
#             agents/hopper/ (KOPT_PROPOSALS), one round, no ncu; pending/ and runs/ come back
#   accept    the pending winners accepted in this machine's copy (their kopt/ folders come
#             back), so that the rounds time them
#   rounds    two rounds, alternating, of `cargo kopt bench K` (-> bench-K-i.json) and
#             scripts/torch_compare.py on the same kernel (-> torch-K-i.json)
# KERNELS: default "gemm paged_decode gqa_decode", in order of priority: each kernel's loop,
# accept and first round run before the next kernel's. Back in $OUT, each as soon as it is
# made: hopper/ (logs, summary.txt), loop-K.tgz (pending/ and runs/), accepted-K.tgz (the
# accepted kopt/ folder), bench-K-i.json, torch-K-i.json.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
STEPS="${STEPS:-tests optimize accept rounds}"
ROOT="$PWD"
W="$OUT/hopper"
mkdir -p "$W"
. "$ROOT/scripts/h200-steps.sh"
S=.gpu/cuda-13000
for f in "$S"/bin/*.xz; do
    [ -e "$f" ] && xz -d -f "$f" && chmod +x "${f%.xz}"
done
export PATH="$ROOT/$S/bin:$PATH"
read -r -a KERNELS <<<"${KERNELS:-gemm paged_decode gqa_decode}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
    >"$W/nvidia-smi.txt" 2>&1
if has tests; then
    step tests-tma 100 env KOPT_GPU_TESTS="gpu_tma-test" bash scripts/gpu-tests.sh --staged "$S"
fi
cd "$ROOT/examples/llm-kernels"
TARGET="$ROOT/target/kopt"
# The loop on one group of kernels, its winners accepted here; what it left comes back at
# once (a later step may run past the device's limit).
loop() { # loop NAME SECONDS KERNEL...
    local name=$1 secs=$2
    shift 2
    cd "$ROOT/examples/llm-kernels"
    if has optimize; then
        step "optimize-$name" "$secs" env KOPT_PROPOSALS="$PWD/agents/hopper" \
            cargo kopt optimize "$@" --agent "cmd:$PWD/agents/scripted-agent.sh" \
            --budget rounds=1 --no-ncu --step-timeout 120
        tar czf "$OUT/loop-$name.tgz" -C "$TARGET" pending runs 2>/dev/null
    fi
    if has accept; then
        for k in "$@"; do
            step "accept-$k" 30 cargo kopt accept "$k" --arch sm_90 --no-cases
        done
        tar czf "$OUT/accepted-$name.tgz" $(for k in "$@"; do echo "kopt/$k"; done) 2>/dev/null
    fi
}
# One kernel at a time, in the order of KERNELS: its loop, its accept, then a round of
# bench and PyTorch; then the second rounds. Everything written so far comes back if the
# device's limit cuts the run short.
round() { # round I KERNEL
    local i=$1 k=$2 tk
    tk=$(echo "$k" | sed -e 's/^gemm$/matmul/')
    cd "$ROOT/examples/llm-kernels"
    echo "== bench-$k-$i"
    t0=$SECONDS
    timeout "${BENCH_TIMEOUT:-90}" cargo kopt bench "$k" --no-cache --message-format json \
        >"$OUT/bench-$k-$i.json" 2>"$W/bench-$k-$i.stderr"
    echo "   bench-$k-$i: exit $? after $((SECONDS - t0)) s" | tee -a "$W/summary.txt"
    tail -n 3 "$W/bench-$k-$i.stderr"
    cd "$ROOT"
    step "torch-$k-$i" "${TORCH_TIMEOUT:-120}" env PYTHONUNBUFFERED=1 python3 scripts/torch_compare.py \
        --out "$OUT/torch-$k-$i.json" --kernels "$tk" --compile-budget-s 45
}
for k in "${KERNELS[@]}"; do
    loop "$k" "${LOOP_TIMEOUT:-170}" "$k"
    has rounds && round 1 "$k"
done
if has rounds; then
    for k in "${KERNELS[@]}"; do round 2 "$k"; done
fi
ls -la "$OUT"
