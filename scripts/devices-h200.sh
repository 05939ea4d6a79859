#!/usr/bin/env bash
# On the one-GPU machine (staged with `gpu-stage --with-cargo`, run through
# `.gpu/run.sh -- bash scripts/devices-h200.sh` from the repository root):
# `cargo kopt optimize --devices all` against the same run without the flag, on two
# kernels of the example crate with the heuristic agent and one round each. With one GPU
# both must run every kernel on GPU 0 and leave the same pending variants (whether a
# candidate wins can still differ by timing noise). Each run has its own target folder, so
# neither reuses the other's evaluations or pending area. Prints both results as JSON (each
# kernel with the GPU it ran on), both wall times, both pending lists and a comparison of
# the pending sources; packs the runs' folders into $OUT/devices.tgz (the JSON results
# are $OUT/optimize-all.json and $OUT/optimize-none.json). About 2 minutes of device time.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
cd examples/llm-kernels
# KERNELS and AGENT override the kernels and the agent (e.g. the whole suite with
# AGENT=cmd:$PWD/agents/scripted-agent.sh on a machine of two GPUs); LIMIT_S bounds each run.
read -r -a KERNELS <<<"${KERNELS:-reduce_sum gqa_decode}"
AGENT="${AGENT:-heuristic}"
LIMIT_S="${LIMIT_S:-150}"
COMMON=(--budget rounds=1 --no-ncu --no-cache --step-timeout 60 --color never --agent "$AGENT")
echo "== devices"
cargo kopt devices --color never
status=0
for mode in all none; do
  target="/tmp/kopt-devices-$mode"
  rm -rf "$target"
  flag=()
  [ "$mode" = all ] && flag=(--devices all)
  echo "== optimize ${flag[*]:-(no --devices)}: ${KERNELS[*]}"
  start=$(date +%s%N)
  CARGO_TARGET_DIR="$target" timeout "$LIMIT_S" cargo kopt optimize "${KERNELS[@]}" "${flag[@]}" \
    "${COMMON[@]}" --run "devices-$mode" --message-format json | tee "$OUT/optimize-$mode.json" || status=1
  end=$(date +%s%N)
  echo "wall time ($mode): $(( (end - start) / 1000000 )) ms"
  echo "== pending ($mode)"
  CARGO_TARGET_DIR="$target" cargo kopt pending --color never
done
echo "== pending sources of the two runs"
for f in $( (cd /tmp/kopt-devices-none/kopt/pending 2>/dev/null && find . -name kernel.cu;
             cd /tmp/kopt-devices-all/kopt/pending 2>/dev/null && find . -name kernel.cu) | sort -u); do
  a="/tmp/kopt-devices-all/kopt/pending/$f"
  b="/tmp/kopt-devices-none/kopt/pending/$f"
  if [ ! -f "$a" ] || [ ! -f "$b" ]; then
    echo "only in one run: $f"
  elif cmp -s "$a" "$b"; then
    echo "same: $f"
  else
    echo "DIFFERENT: $f"
  fi
done
tar czf "$OUT/devices.tgz" -C /tmp kopt-devices-all/kopt/runs kopt-devices-all/kopt/pending \
  kopt-devices-none/kopt/runs kopt-devices-none/kopt/pending 2>/dev/null
exit $status
