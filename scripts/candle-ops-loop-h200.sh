#!/usr/bin/env bash
# On the H200 (staged with `../shared/tools/gpu-stage --with-cargo --no-tests`; run from the
# repo root as `bash .gpu/run.sh -- bash scripts/candle-ops-loop-h200.sh`): examples/candle-ops'
# kernels, candle's own, through kopt's loop with their hand-written candidates
# (agents/*.proposal.json through agents/scripted-agent.sh), each accepted into this
# machine's copy. The loop needs no candle build: cargo kopt compiles the kernels with NVRTC.
#
#   check          cargo kopt check (the compile fence with the machine's NVRTC), first
#   <kernel>       optimize (one round, the scripted candidate), pending, accept for sm_90
#   check-after    cargo kopt check with the accepted variants
#
# KERNELS picks the kernels (default: all four). Each step has a timeout and the next runs
# after a failure. Back in $OUT: candle-ops-loop.tgz (logs, run journals, the pending area
# as the loop left it, and kopt/, the accepted variants: copy it into examples/candle-ops/kopt/
# and commit it, then stage the binaries again) and summary.txt.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
KERNELS="${KERNELS:-softmax_bf16 softmax_f32 rmsnorm_bf16 rmsnorm_f32}"
ROOT="$PWD"
W="$OUT/candle-ops-loop"
mkdir -p "$W/logs"
STEP_LOGS="$W/logs"
. "$ROOT/scripts/h200-steps.sh"
export KOPT_SANITIZER_TIMEOUT="${KOPT_SANITIZER_TIMEOUT:-60}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$W/logs/nvidia-smi.txt" 2>&1
cd "$ROOT/examples/candle-ops"
step check 180 cargo kopt check
for k in $KERNELS; do
    step "$k-optimize" 420 cargo kopt optimize "$k" \
        --agent "cmd:$PWD/agents/scripted-agent.sh" --budget rounds=1 --no-ncu --step-timeout 60
    step "$k-pending" 30 cargo kopt pending
    step "$k-accept" 60 cargo kopt accept "$k" --arch sm_90 --no-cases
done
step check-after 180 cargo kopt check
cp -r kopt "$W/kopt" 2>/dev/null
cp -r target/kopt/pending "$W/pending-as-left" 2>/dev/null
cp -r target/kopt/runs "$W/runs" 2>/dev/null
tar czf "$OUT/candle-ops-loop.tgz" -C "$OUT" candle-ops-loop
cp "$W/summary.txt" "$OUT/summary.txt"
rm -rf "$W"
ls -la "$OUT"
