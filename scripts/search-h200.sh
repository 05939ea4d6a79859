#!/usr/bin/env bash
# On the H200 (staged with `gpu-stage --with-cargo`, run through `.gpu/run.sh --`): the
# search's figures. The launchers against the CPU reference (row_sum included), the
# convergence table and the engine's throughput on row_sum, and a seeded search over the
# compile options too. Everything lands in $OUT/search/.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; W="$OUT/search"; mkdir -p "$W"
cd examples/llm-kernels
echo "== launchers against the CPU reference"
llm-kernels run 2>&1 | tee "$W/run.txt"
echo "== convergence benchmark (row_sum, 10 seeds)"
cargo kopt search-bench row_sum --seeds 10 --json-out "$W/bench.json" 2>&1 | tee "$W/bench.txt"
echo "== seeded hill search over tunables and compile options (60 points)"
cargo kopt search row_sum --strategy hill --seeded --budget-evals 60 --no-cache 2>&1 | tee "$W/search.txt"
