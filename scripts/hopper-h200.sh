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
# KERNELS: default "gemm paged_decode gqa_decode". Back in $OUT: hopper.tgz (logs, pending,
# runs, accepted folders), the JSON files, summary.txt.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
STEPS="${STEPS:-tests optimize accept rounds}"
ROOT="$PWD"
W="$OUT/hopper"
mkdir -p "$W/accepted"
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
    step tests-tma 150 env KOPT_GPU_TESTS="gpu_tma-test" bash scripts/gpu-tests.sh --staged "$S"
fi
cd "$ROOT/examples/llm-kernels"
TARGET="$ROOT/target/kopt"
if has optimize; then
    step optimize "${OPTIMIZE_TIMEOUT:-360}" env KOPT_PROPOSALS="$PWD/agents/hopper" \
        cargo kopt optimize "${KERNELS[@]}" --agent "cmd:$PWD/agents/scripted-agent.sh" \
        --budget rounds=1 --no-ncu --step-timeout 150
    step pending 60 cargo kopt pending
    [ -d "$TARGET/pending" ] && cp -r "$TARGET/pending" "$W/pending"
    [ -d "$TARGET/runs" ] && cp -r "$TARGET/runs" "$W/runs"
fi
if has accept; then
    for k in "${KERNELS[@]}"; do
        step "accept-$k" 60 cargo kopt accept "$k" --arch sm_90 --no-cases
        [ -d "kopt/$k" ] && cp -r "kopt/$k" "$W/accepted/"
    done
fi
if has rounds; then
    torch_kernels=$(printf '%s\n' "${KERNELS[@]}" | sed -e 's/^gemm$/matmul/' | paste -sd,)
    for ((i = 1; i <= ${ROUNDS:-2}; i++)); do
        cd "$ROOT/examples/llm-kernels"
        echo "== bench-$i"
        t0=$SECONDS
        timeout "${BENCH_TIMEOUT:-150}" cargo kopt bench "${KERNELS[@]}" --no-cache --message-format json \
            >"$OUT/bench-$i.json" 2>"$W/bench-$i.stderr"
        echo "   bench-$i: exit $? after $((SECONDS - t0)) s" | tee -a "$W/summary.txt"
        tail -n 3 "$W/bench-$i.stderr"
        cd "$ROOT"
        step "torch-$i" "${TORCH_TIMEOUT:-150}" env PYTHONUNBUFFERED=1 python3 scripts/torch_compare.py \
            --out "$OUT/torch-$i.json" --kernels "$torch_kernels" --compile-budget-s 60
    done
fi
cd "$ROOT"
tar czf "$OUT/hopper.tgz" -C "$OUT" hopper && rm -rf "$W"
ls -la "$OUT"
