#!/usr/bin/env bash
# On the H200 (staged with `gpu-stage --with-cargo`, run from the repo root as
# `bash .gpu/run.sh -- bash scripts/suite-repeat-h200.sh`): the committed variants and
# PyTorch's versions of the suite timed ROUNDS times (default 2), alternating, in one
# session: round i runs `cargo kopt bench` on the suite (-> $OUT/bench-i.json), then
# scripts/torch_compare.py (-> $OUT/torch-i.json). Two runs of the same versions give the
# run-to-run spread, below which a difference between kopt and PyTorch is noise
# (scripts/suite_table.py takes every round: --bench bench-1.json --bench bench-2.json
# --torch torch-1.json --torch torch-2.json). FIRST numbers the first round (default 1),
# so that rounds split over several device calls do not overwrite each other.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
ROUNDS="${ROUNDS:-2}"
FIRST="${FIRST:-1}"
for ((i = FIRST; i < FIRST + ROUNDS; i++)); do
    echo "=== round $i"
    t0=$SECONDS
    OUT="$OUT/round-$i" STEPS="bench torch" bash scripts/suite-h200.sh >"$OUT/round-$i.log" 2>&1
    cp "$OUT/round-$i/bench.json" "$OUT/bench-$i.json" 2>/dev/null
    cp "$OUT/round-$i/torch_compare.json" "$OUT/torch-$i.json" 2>/dev/null
    rm -rf "$OUT/round-$i"
    grep -E '^   [a-z_-]+: exit' "$OUT/round-$i.log" || true
    echo "    round $i: $((SECONDS - t0)) s"
done
ls -la "$OUT"
