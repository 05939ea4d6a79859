#!/usr/bin/env bash
# On the GPU machine (staged with `gpu-stage`, run through `.gpu/run.sh --`): only the
# GPU tests (the ignored ones) of every staged test binary, each from its crate's folder.
# The CPU tests run in CI; trybuild needs a Rust toolchain the GPU machine lacks.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; here="$(pwd)"; fail=0; : > "$OUT/gpu-tests.log"
for t in .gpu/tests/*; do
  case "$t" in *.dir) continue ;; esac
  n=$("$t" --list --ignored 2>/dev/null | grep -c ': test$' || true)
  [ "$n" = 0 ] && continue
  echo "=== $(basename "$t") ($n GPU tests)" | tee -a "$OUT/gpu-tests.log"
  ( cd "$(cat "$t.dir")" && timeout 400 "$here/$t" --ignored --test-threads 1 "$@" ) 2>&1 | tee -a "$OUT/gpu-tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || fail=1
done
echo "gpu tests: $([ $fail = 0 ] && echo all passed || echo SOME FAILED)"
exit $fail
