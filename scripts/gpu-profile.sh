#!/usr/bin/env bash
# On a GPU machine (staged with `gpu-stage --with-cargo`, run through `.gpu/run.sh --`):
# `cargo kopt profile` on each example kernel; snapshots on stdout, run folders packed
# into $OUT/profile.tgz.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
cd examples/llm-kernels
for k in softmax rmsnorm reduce_sum gqa_decode; do
  echo "== $k"
  timeout 60 cargo kopt profile "$k" --no-cases
done
echo "== softmax online-vec4"
timeout 60 cargo kopt profile softmax --variant online-vec4 --no-cases
tar czf "$OUT/profile.tgz" -C ../../target kopt/runs 2>/dev/null
