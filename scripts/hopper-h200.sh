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
#   rounds    ROUNDS rounds (default 2), alternating, of `cargo kopt bench KERNELS` (->
#             bench-i.json) and scripts/torch_compare.py on the same kernels (-> torch-i.json)
# KERNELS: default "gemm paged_decode gqa_decode" (the GEMM's loop runs first, alone). Back
# in $OUT, each as soon as it is made: hopper/ (logs, summary.txt), loop-*.tgz (pending/ and
# runs/), accepted-*.tgz (the accepted kopt/ folders), bench-i.json, torch-i.json.
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
loop gemm "${GEMM_TIMEOUT:-150}" gemm
DECODE=()
for k in "${KERNELS[@]}"; do [ "$k" != gemm ] && DECODE+=("$k"); done
[ ${#DECODE[@]} -gt 0 ] && loop decode "${DECODE_TIMEOUT:-170}" "${DECODE[@]}"
if has rounds; then
    torch_kernels=$(printf '%s\n' "${KERNELS[@]}" | sed -e 's/^gemm$/matmul/' | paste -sd,)
    for ((i = 1; i <= ${ROUNDS:-2}; i++)); do
        cd "$ROOT/examples/llm-kernels"
        echo "== bench-$i"
        t0=$SECONDS
        timeout "${BENCH_TIMEOUT:-90}" cargo kopt bench "${KERNELS[@]}" --no-cache --message-format json \
            >"$OUT/bench-$i.json" 2>"$W/bench-$i.stderr"
        echo "   bench-$i: exit $? after $((SECONDS - t0)) s" | tee -a "$W/summary.txt"
        tail -n 3 "$W/bench-$i.stderr"
        cd "$ROOT"
        step "torch-$i" "${TORCH_TIMEOUT:-120}" env PYTHONUNBUFFERED=1 python3 scripts/torch_compare.py \
            --out "$OUT/torch-$i.json" --kernels "$torch_kernels" --compile-budget-s 45
    done
fi
ls -la "$OUT"
