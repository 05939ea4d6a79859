#!/usr/bin/env bash
# On a GPU machine (staged with `gpu-stage --with-cargo`, run through `.gpu/run.sh --`):
# one round of `cargo kopt optimize gqa_decode` with the scripted agent, which proposes every
# hand-written candidate of agents/gqa_decode.proposal.json (register loads, and the
# cp.async ring of gqa_decode_pipe.cu, whose matrix the loop sweeps), so the loop checks and
# times them side by side on the four suite shapes. The run's folder and the pending area are packed into $OUT/gqa-pipe.tgz.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
cd examples/llm-kernels
cargo kopt optimize gqa_decode --agent "cmd:$PWD/agents/scripted-agent.sh" --budget rounds=1 \
    --run gqa-pipe-h200 --step-timeout 60
cargo kopt pending
tar czf "$OUT/gqa-pipe.tgz" -C ../../target kopt/runs kopt/pending 2>/dev/null
