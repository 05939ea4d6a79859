#!/usr/bin/env bash
# On a GPU machine (staged with `gpu-stage --with-cargo`, run through `.gpu/run.sh --`):
# `cargo kopt optimize` on the example crate, with the built-in heuristic agent and with
# the scripted (hand-written) agent through `cmd:`. Tables on stdout; the runs' folders
# (journals, sessions, pending variants) packed into $OUT/optimize.tgz.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
cd examples/llm-kernels
echo "== heuristic agent, every kernel, 3 rounds"
cargo kopt optimize --budget rounds=3 --run heuristic-h200 --step-timeout 60
echo "== scripted agent (cmd:), rmsnorm, 1 round"
cargo kopt optimize rmsnorm --agent "cmd:$PWD/agents/scripted-agent.sh" --budget rounds=1 --run cmd-h200 --step-timeout 60
echo "== pending"
cargo kopt pending
for f in $(find ../../target/kopt/pending -name RATIONALE.md -o -name rationale.json 2>/dev/null); do echo "--- $f"; done
tar czf "$OUT/optimize.tgz" -C ../../target kopt/runs kopt/pending 2>/dev/null
