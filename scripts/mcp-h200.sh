#!/usr/bin/env bash
# On a GPU machine (staged with `gpu-stage --with-cargo`, run as
# `bash .gpu/run.sh -- bash scripts/mcp-h200.sh` from the repo root): a scripted agent
# drives `cargo kopt mcp` over stdio (rmcp's client, the ignored test
# `a_scripted_agent_optimises_rmsnorm_on_the_gpu` of crates/cargo-kopt/tests/it/mcp.rs) on
# `rmsnorm` of the example crate: list_kernels, get_context (profiles the reference),
# propose_variant with the hand-written vectorised candidate, search around it (12
# evaluations), list_pending. The session's figures go to stdout and $OUT/mcp-h200.log;
# its run folders (journal, candidates, pending variants) to $OUT/mcp-runs.tgz.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
test_bin="$(pwd)/.gpu/tests/it-test"
[ -x "$test_bin" ] || { echo "mcp-h200: $test_bin is not staged (run gpu-stage without --no-tests)" >&2; exit 2; }
KOPT_MCP_SERVER="$(command -v cargo-kopt)" || { echo "mcp-h200: cargo-kopt is not on PATH" >&2; exit 2; }
export KOPT_MCP_SERVER KOPT_MCP_OUT="$OUT"
cd "$(cat "$test_bin.dir")"
"$test_bin" --ignored --exact mcp::a_scripted_agent_optimises_rmsnorm_on_the_gpu --nocapture 2>&1 | tee "$OUT/mcp-h200.log"
exit "${PIPESTATUS[0]}"
