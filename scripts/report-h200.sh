#!/usr/bin/env bash
# On the H200 (staged with `gpu-stage --with-cargo`, run through `.gpu/run.sh --`): fresh
# figures for `cargo kopt report`. Bench JSON of every kernel, the convergence benchmark
# of row_sum (10 seeds), and the report made of them with the committed and pending
# evidence. Everything lands in $OUT/report.tgz (bench.json, search-bench-row_sum.json,
# report.html); copy the JSON files to docs/runs/ and add them to
# scripts/report-example.sh to regenerate docs/report-example.html and its screenshot.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; W="$(mktemp -d)"
cd examples/llm-kernels
echo "== bench (JSON)"
cargo kopt bench --message-format json > "$W/bench.json"; echo "bench exit $?"
echo "== convergence benchmark (row_sum, 10 seeds)"
cargo kopt search-bench row_sum --seeds 10 --json-out "$W/search-bench-row_sum.json" 2>&1 | tail -15
echo "== report"
cargo kopt report --bench "$W/bench.json" --search-bench "$W/search-bench-row_sum.json" \
    --title "kopt report: llm-kernels on an NVIDIA H200" -o "$W/report.html"
python3 - "$W/search-bench-row_sum.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
n = sum(1 for r in rows for t in r["trials"] if t.get("best_so_far"))
print(f"trials with a best-so-far curve: {n} of {sum(len(r['trials']) for r in rows)}")
PY
mkdir -p "$OUT" && tar -C "$W" -czf "$OUT/report.tgz" . && echo "packed $OUT/report.tgz"
