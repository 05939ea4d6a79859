#!/usr/bin/env bash
# On a GPU machine (staged with `gpu-stage --with-cargo`, run through `.gpu/run.sh --`):
# one round of `cargo kopt optimize gqa_decode` with the scripted agent, which proposes both
# hand-written candidates of agents/gqa_decode.proposal.json (the committed register-load
# kernel and gqa_decode_pipe.cu, the cp.async ring), so the loop checks and times them
# side by side on the four suite shapes. The run's folder is packed into $OUT/gqa-pipe.tgz.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
cd examples/llm-kernels
cargo kopt optimize gqa_decode --agent "cmd:$PWD/agents/scripted-agent.sh" --budget rounds=1 \
    --run gqa-pipe-h200 --step-timeout 60
cargo kopt pending
tar czf "$OUT/gqa-pipe.tgz" -C ../../target kopt/runs kopt/pending 2>/dev/null
