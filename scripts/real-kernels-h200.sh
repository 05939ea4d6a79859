#!/usr/bin/env bash
# On the H200 (staged with `gpu-stage --with-cargo`, run from the repo root as
# `bash .gpu/run.sh -- bash scripts/real-kernels-h200.sh`): kopt on kernels written the way
# the ecosystem writes them, and the fences against adversarial candidates.
#
#   check      cargo kopt check (the compile fence with the machine's NVRTC)
#   candle     the candle-style bf16 softmax through the loop (its hand-written candidate),
#              accepted in this machine's copy, then verify and bench with the variant
#   naive      the one-thread-per-row fp32 softmax at 8192x50257: bench, then the loop
#              starting from it (the built-in heuristic agent, one candidate)
#   oob        a fast row_sum candidate with a one-element out-of-bounds write through
#              the loop (--from-reference): compute-sanitizer must reject it
#
# STEPS picks them (default: all, in that order). Each step has a timeout and goes on after
# a failure. Back in $OUT: real-kernels.tgz (logs, the pending area, run journals, the
# accepted candle variant) and summary.txt.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
STEPS="${STEPS:-check candle naive oob}"
ROOT="$PWD"
W="$OUT/real-kernels"
mkdir -p "$W/logs"
STEP_LOGS="$W/logs"
. "$ROOT/scripts/h200-steps.sh"
export KOPT_SANITIZER_TIMEOUT="${KOPT_SANITIZER_TIMEOUT:-60}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$W/logs/nvidia-smi.txt" 2>&1
cd "$ROOT/examples/llm-kernels"
if has check; then
    step check 120 cargo kopt check
fi
if has candle; then
    step candle-optimize 300 cargo kopt optimize candle_softmax \
        --agent "cmd:$PWD/agents/scripted-agent.sh" --budget rounds=1 --no-ncu --step-timeout 60
    step candle-pending 30 cargo kopt pending
    mkdir -p "$W/pending-as-left" && cp -r "$ROOT/target/kopt/pending/." "$W/pending-as-left/" 2>/dev/null
    step candle-accept 60 cargo kopt accept candle_softmax --arch sm_90 --no-cases
    cp -r kopt/candle_softmax "$W/accepted-candle_softmax" 2>/dev/null
    step candle-run 120 "$ROOT/.gpu/bin/llm-kernels" run
    step candle-verify 300 cargo kopt verify candle_softmax
    step candle-bench 120 cargo kopt bench candle_softmax --no-cache
fi
if has naive; then
    cd "$ROOT/examples/first-kernel"
    step naive-bench 240 cargo kopt bench naive_softmax --no-cache
    step naive-optimize 300 cargo kopt optimize naive_softmax --agent heuristic \
        --budget candidates=1 --no-ncu --no-sanitize
    cd "$ROOT/examples/llm-kernels"
fi
if has oob; then
    KOPT_PROPOSALS="$PWD/agents/adversarial" step oob-optimize 300 cargo kopt optimize row_sum \
        --agent "cmd:$PWD/agents/scripted-agent.sh" --budget rounds=1 --from-reference \
        --no-ncu --step-timeout 60
    grep -h '"event":"verdict"' "$ROOT"/target/kopt/runs/*/journal.jsonl >"$W/logs/verdicts.jsonl" 2>/dev/null
fi
cp -r "$ROOT/target/kopt/runs" "$W/runs" 2>/dev/null
tar czf "$OUT/real-kernels.tgz" -C "$OUT" real-kernels
cp "$W/summary.txt" "$OUT/summary.txt"
rm -rf "$W"
ls -la "$OUT"
