#!/usr/bin/env bash
# On the GPU machine (run through `.gpu/run.sh --`): only the GPU tests (the ignored ones)
# of every staged test binary, each from its crate's folder. The CPU tests run in CI;
# trybuild needs a Rust toolchain the GPU machine lacks.
#
#   bash .gpu/run.sh -- bash scripts/gpu-tests.sh                       # gpu-stage's .gpu/tests
#   bash .gpu/run.sh -- bash scripts/gpu-tests.sh --staged .gpu/cuda-12080
#
# --staged takes a folder of scripts/gpu-stage-tests.sh (compressed test binaries and the
# cargo-kopt they start as the worker, put first on the PATH). Other arguments go to each
# test binary. Each binary has 400 s. KOPT_GPU_TESTS="gpu_numerics-test mcp-test" runs
# those binaries only, in that order (the quick ones first when device time is short).
# it-test's capture and MCP tests start `cargo kopt`, which runs `cargo metadata`: stage
# cargo too (`../shared/tools/gpu-stage --with-cargo --no-tests`, before this folder's
# scripts/gpu-stage-tests.sh, since gpu-stage clears .gpu/), or they fail to start cargo.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; here="$(pwd)"; fail=0
tests=.gpu/tests; log="$OUT/gpu-tests.log"
if [ "${1:-}" = "--staged" ]; then
  staged="$2"; shift 2
  for f in "$staged"/bin/*.xz "$staged"/tests/*.xz; do
    [ -e "$f" ] && xz -d -f "$f" && chmod +x "${f%.xz}"
  done
  export PATH="$here/$staged/bin:$PATH"
  tests="$staged/tests"; log="$OUT/gpu-tests-$(basename "$staged").log"
  echo "CUDA bindings: $(cat "$staged/cuda-bindings"); worker: $(command -v cargo-kopt)" | tee "$log"
else
  : > "$log"
fi
if [ -n "${KOPT_GPU_TESTS:-}" ]; then
  order=(); for n in $KOPT_GPU_TESTS; do order+=("$tests/$n"); done
else
  order=("$tests"/*)
fi
for t in "${order[@]}"; do
  case "$t" in *.dir) continue ;; esac
  n=$("$t" --list --ignored 2>/dev/null | grep -c ': test$' || true)
  [ "$n" = 0 ] && continue
  echo "=== $(basename "$t") ($n GPU tests)" | tee -a "$log"
  ( cd "$(cat "$t.dir")" && timeout 400 "$here/$t" --ignored --test-threads 1 "$@" ) 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" = 0 ] || fail=1
done
echo "gpu tests: $([ $fail = 0 ] && echo all passed || echo SOME FAILED)" | tee -a "$log"
exit $fail
