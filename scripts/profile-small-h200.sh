#!/usr/bin/env bash
# On a GPU machine (staged with `gpu-stage --with-cargo`, run through `.gpu/run.sh --`):
# `cargo kopt profile` of the committed variants on the shapes furthest from a same-size
# copy or behind PyTorch (softmax's few long rows, layer_norm's and rmsnorm's 64 rows,
# gqa_decode's B8 S4096); snapshots on stdout, run folders packed into $OUT/profile.tgz.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
cd examples/llm-kernels
variant() { sed -n 's/^variant = "\(.*\)"/\1/p' "kopt/$1/kopt.lock" | head -1; }
for ks in softmax:1 softmax:3 layer_norm:2 rmsnorm:1 gqa_decode:1 gqa_decode:0; do
  k="${ks%%:*}"; s="${ks##*:}"
  echo "== $k shape $s variant $(variant "$k")"
  timeout 120 cargo kopt profile "$k" --shape "$s" --variant "$(variant "$k")" --no-cases
done
tar czf "$OUT/profile.tgz" -C ../../target kopt/runs 2>/dev/null
