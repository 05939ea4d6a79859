#!/usr/bin/env bash
# On the H200 (staged with `gpu-stage --with-cargo`, run from the repo root through
# `.gpu/run.sh -- bash scripts/suite-new-h200.sh`): the four newer kernels of the example
# crate (layer_norm, transpose, silu_mul, gemm).
#  1. `llm-kernels run`: every launcher against the CPU f64 reference (the new ones too).
#  2. per kernel, `cargo kopt optimize KERNEL --agent cmd:agents/scripted-agent.sh`, one
#     round: the hand-written candidate of agents/KERNEL.proposal.json through the engine
#     (numerics, held-out shapes, timing, watchdog, compute-sanitizer); a verified winner
#     becomes a pending variant.
#  3. per kernel, `cargo kopt bench KERNEL --message-format json`: the reference's times.
# Tables on stdout; logs, the runs' folders and the pending area packed into
# $OUT/suite-new.tgz. Every step has a time limit, so the whole stays within ~20 minutes
# at worst (a few minutes when the candidates pass quickly).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
W="$(mktemp -d)/suite-new"; mkdir -p "$W"
ROOT="$PWD"
cd examples/llm-kernels
status=0
step() { # step NAME LIMIT_S CMD...: runs CMD with a time limit, logging to $W/NAME.txt
    local name=$1 limit=$2; shift 2
    echo "== $name: $*"
    timeout "$limit" "$@" >"$W/$name.txt" 2>&1
    local rc=$?
    tail -n 25 "$W/$name.txt"
    echo "-- $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}
step run 120 llm-kernels run
for k in layer_norm transpose silu_mul gemm; do
    limit=240; [ "$k" = gemm ] && limit=420
    step "optimize-$k" "$limit" cargo kopt optimize "$k" \
        --agent "cmd:$PWD/agents/scripted-agent.sh" --budget rounds=1 \
        --run "suite-new-$k" --no-ncu --step-timeout 120
done
echo "== pending"
cargo kopt pending 2>&1 | tee "$W/pending.txt"
for k in layer_norm transpose silu_mul gemm; do
    step "bench-$k" 150 cargo kopt bench "$k" --message-format json
done
cp -r ../../target/kopt/runs ../../target/kopt/pending "$W/" 2>/dev/null
tar czf "$OUT/suite-new.tgz" -C "$(dirname "$W")" suite-new
echo "packed $OUT/suite-new.tgz; overall exit $status"
cd "$ROOT"
exit "$status"
