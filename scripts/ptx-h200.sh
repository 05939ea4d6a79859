#!/usr/bin/env bash
# On the H200 (carry .gpu; from the repo root: `bash .gpu/run.sh -- bash scripts/ptx-h200.sh`):
# the verified PTX of the example crate's variants, and the first-launch latency of its
# nine kernels in one process.
#
# Staged here first: scripts/gpu-stage-tests.sh (cargo-kopt, the GPU test binaries and the
# llm-kernels binary, in .gpu/cuda-13000/bin) and, for the `old` step, an llm-kernels binary
# built from the commit before verified PTX (`.gpu/old/llm-kernels`, with the same
# `first-launch` subcommand), and cargo (.gpu/cargo.xz, for `cargo kopt`).
#
# Steps (STEPS, default: old keep first tests; the logs and kopt/ files come back in $OUT/ptx.tgz), each under a timeout, the next after a failure:
#   old    first-launch of the old binary: every version compiled by NVRTC at first launch
#   keep   `cargo kopt verify --keep-ptx KERNEL`, each kernel of the example (KEEP_KERNELS,
#          KEEP_SECS each, default 120): each variant verified with the PTX
#          NVRTC compiles for it now, kept with it when it passes (its kopt/ files come back
#          in $OUT/ptx/kopt/)
#   first  first-launch of the staged binary, as built (PTX embedded or not), then with
#          KOPT_IGNORE_PTX=1
#   verify `cargo kopt verify KERNEL`, each kernel of the example (the kept PTX loaded;
#          VERIFY_SECS each, default 120, and 300 for the GEMM, whose sanitizer pass is long)
#   tests  scripts/gpu-tests.sh over the staged test binaries
# Each first-launch runs twice per binary: with the driver's JIT cache off
# (CUDA_CACHE_DISABLE=1, a cold start) and on (a fresh cache folder: the first run fills it,
# the second reads it).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
STEPS="${STEPS:-old keep first tests}"
ROOT="$PWD"
W="$OUT/ptx"
mkdir -p "$W"
. "$ROOT/scripts/h200-steps.sh"
S=.gpu/cuda-13000
for f in "$S"/bin/*.xz .gpu/old/*.xz; do
    [ -e "$f" ] && xz -d -f "$f" && chmod +x "${f%.xz}"
done
export PATH="$ROOT/$S/bin:$PATH"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
first_launch() { # NAME BINARY [ENV=VALUE...]
    local name=$1 bin=$2
    shift 2
    step "$name-cold" 60 env CUDA_CACHE_DISABLE=1 "$@" "$bin" first-launch
    local cache
    cache=$(mktemp -d)
    step "$name-cache-fill" 60 env CUDA_CACHE_DISABLE=0 CUDA_CACHE_PATH="$cache" "$@" "$bin" first-launch
    step "$name-cache-hit" 60 env CUDA_CACHE_DISABLE=0 CUDA_CACHE_PATH="$cache" "$@" "$bin" first-launch
}
if has old; then
    first_launch old "$ROOT/.gpu/old/llm-kernels"
fi
cd "$ROOT/examples/llm-kernels"
if has keep; then
    # One kernel at a time, so that a timeout loses one kernel's verification only.
    for k in ${KEEP_KERNELS:-$(ls kopt)}; do
        step "keep-$k" "${KEEP_SECS:-120}" cargo kopt verify --keep-ptx "$k"
    done
    mkdir -p "$W/kopt" && cp -r kopt/. "$W/kopt/"
fi
if has first; then
    first_launch new "$ROOT/$S/bin/llm-kernels"
    step new-ignore-ptx-cold 60 env CUDA_CACHE_DISABLE=1 KOPT_IGNORE_PTX=1 "$ROOT/$S/bin/llm-kernels" first-launch
fi
if has verify; then
    for k in ${KEEP_KERNELS:-$(ls kopt)}; do
        secs=${VERIFY_SECS:-120}
        [ "$k" = gemm ] && secs=300
        step "verify-$k" "$secs" cargo kopt verify "$k"
    done
fi
cd "$ROOT"
if has tests; then
    STEP_TAIL=15 step tests 560 bash scripts/gpu-tests.sh --staged "$S"
fi
cp "$W/summary.txt" "$OUT/summary.txt"
# One archive: the device returns a limited number of files.
tar -C "$OUT" -czf "$OUT/ptx.tgz" ptx && rm -rf "$W"
