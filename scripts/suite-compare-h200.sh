#!/usr/bin/env bash
# On the H200 (staged with `gpu-stage --with-cargo`, run from the repo root as
# `bash .gpu/run.sh -- bash scripts/suite-compare-h200.sh`): new hand-written candidates
# through the loop, and their winners timed against the variants accepted now, in the same
# session. The loop starts from the variant accepted now and a winner must beat it in the
# loop's own measurements; this puts the two side by side in one bench, with PyTorch.
#
#   1. optimize NEW (the kernels with new candidates; default: the suite's eight)
#   2. bench ALL with the variants committed now           -> bench-before.json
#   3. accept NEW's pending winners in this machine's copy
#   4. bench ALL again, then PyTorch's versions (torch)    -> bench-after.json, torch_compare.json
#
# NEW and ALL are kernel lists (environment). Everything comes back as $OUT/compare.tgz
# (each step's suite folder: logs, pending as the loop left it, run folders, accepted
# copies) plus the three JSON files; the summaries go to stdout.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
SUITE="softmax layer_norm rmsnorm reduce_sum transpose gqa_decode silu_mul gemm"
NEW="${NEW:-$SUITE}"
ALL="${ALL:-$SUITE}"
W="$(mktemp -d)"
run() { # run NAME STEPS KERNELS
    echo "=== $1: $2 on $3"
    OUT="$W/$1" STEPS="$2" KERNELS="$3" bash scripts/suite-h200.sh >"$W/$1.log" 2>&1
    grep -E '^   [a-z_-]+: exit' "$W/$1.log" || true
}
run optimize optimize "$NEW"
grep -A20 '^kernel  rounds' "$W/optimize.log" | head -n 20
run before bench "$ALL"
run accept accept "$NEW"
run after "bench torch" "$ALL"
cp "$W/before/bench.json" "$OUT/bench-before.json" 2>/dev/null
cp "$W/after/bench.json" "$OUT/bench-after.json" 2>/dev/null
cp "$W/after/torch_compare.json" "$OUT/torch_compare.json" 2>/dev/null
tar czf "$OUT/compare.tgz" -C "$W" .
ls -la "$OUT"
