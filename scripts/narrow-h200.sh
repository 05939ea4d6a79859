#!/usr/bin/env bash
# On the H200 (staged with `../shared/tools/gpu-stage --with-cargo --no-tests`, run from the
# repo root as `bash .gpu/run.sh -- bash scripts/narrow-h200.sh`): the loop with narrowing
# on the kernels whose accepted variant needed it, then the whole suite's bench.
#
#   optimize  `cargo kopt optimize $LOOP_KERNELS` with the scripted agent (one round): the
#             accepted start is verified again, a winner slower than the reference on some
#             shape is narrowed to where it is not
#   accept    the pending winners accepted in this machine's copy (the lead accepts the
#             returned pending variants again at home)
#   verify    `cargo kopt verify --keep-ptx $VERIFY_KERNELS` (compute-sanitizer included)
#   bench     `cargo kopt bench` of every kernel, JSON: reference against active per shape
#
# STEPS picks steps (default: all four). Back in $OUT: narrow.tgz (pending/ as the loop left
# it, the accepted folders, the run's journal, each step's log), bench.json, summary.txt.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
STEPS="${STEPS:-optimize accept verify bench}"
read -r -a LOOP <<<"${LOOP_KERNELS:-reduce_sum gqa_decode}"
read -r -a VERIFY <<<"${VERIFY_KERNELS:-reduce_sum gqa_decode}"
ROOT="$PWD"
W="$OUT/narrow"
mkdir -p "$W"
. "$ROOT/scripts/h200-steps.sh"
cd "$ROOT/examples/llm-kernels"
TARGET="$ROOT/target/kopt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$W/nvidia-smi.txt" 2>&1
if has optimize; then
    step optimize 200 cargo kopt optimize "${LOOP[@]}" --agent "cmd:$PWD/agents/scripted-agent.sh" \
        --budget rounds=1 --no-ncu --step-timeout 60 --run narrow-h200 --message-format json
    step pending 30 cargo kopt pending
    mkdir -p "$W/pending-as-left"
    [ -d "$TARGET/pending" ] && cp -r "$TARGET/pending/." "$W/pending-as-left/"
fi
if has accept; then
    for k in "${LOOP[@]}"; do
        step "accept-$k" 60 cargo kopt accept "$k" --no-cases
    done
    step list 30 cargo kopt list
fi
if has verify; then
    KOPT_SANITIZER_TIMEOUT="${KOPT_SANITIZER_TIMEOUT:-90}" \
        step verify 150 cargo kopt verify --keep-ptx "${VERIFY[@]}"
fi
if has bench; then
    echo "== bench (timeout 200s)"
    t0=$SECONDS
    timeout 200 cargo kopt bench --no-cache --message-format json >"$OUT/bench.json" 2>"$W/bench.stderr"
    echo "   bench: exit $? after $((SECONDS - t0)) s" | tee -a "$W/summary.txt"
    tail -n 3 "$W/bench.stderr"
fi
mkdir -p "$W/accepted" "$W/runs"
for k in "${LOOP[@]}" "${VERIFY[@]}"; do [ -d "kopt/$k" ] && cp -r "kopt/$k" "$W/accepted/"; done
[ -d "$TARGET/runs" ] && cp -r "$TARGET/runs/." "$W/runs/"
cp "$W/summary.txt" "$OUT/summary.txt"
tar czf "$OUT/narrow.tgz" -C "$OUT" narrow && rm -rf "$W"
