#!/usr/bin/env bash
# On the H200 (carry .gpu; from the repo root: `bash .gpu/run.sh -- bash scripts/capture-h200.sh`):
# a program's own launches captured, read back, and checked at run time.
#
# Staged here first: scripts/gpu-stage-tests.sh (cargo-kopt, the GPU test binaries and the
# llm-kernels binary in .gpu/cuda-13000) and cargo (.gpu/cargo.xz, for `cargo kopt`).
#
# Steps (STEPS, default: tests overhead decode shadow profile; each under a timeout, the
# next after a failure; the capture is kept in target/capture-h200/ for a later call):
#   tests     the GPU tests of capture and shadow checks (kopt's gpu_observe, cargo-kopt's
#             capture_cli) and the example's launcher tests
#   overhead  `llm-kernels overhead` (host time per launch against a hand-written cudarc
#             launch) with KOPT_CAPTURE and KOPT_SHADOW unset, capture on, shadow at rates
#             0, 0.001 and 1
#   decode    `llm-kernels decode --steps 4`, then again under KOPT_CAPTURE (one kept
#             launch a case): the step times say what the capture costs
#   shadow    `llm-kernels decode --steps 2` under KOPT_SHADOW=1: every variant launch of
#             the decode step checked against the reference
#   profile   `cargo kopt profile --program` of the capture
#   verify    `cargo kopt verify --inputs` of the capture, every kernel (no sanitizer: the
#             accepted variants' sanitizer runs are verify's own, elsewhere)
#   bench     `cargo kopt bench --inputs` of the capture for BENCH_KERNELS
# Back in $OUT: capture.tgz (each step's log, the capture's manifests), summary.txt.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
STEPS="${STEPS:-tests overhead decode shadow profile}"
ROOT="$PWD"
W="$OUT/capture"
mkdir -p "$W"
. "$ROOT/scripts/h200-steps.sh"
S=.gpu/cuda-13000
for f in "$S"/bin/*.xz; do
    [ -e "$f" ] && xz -d -f "$f" && chmod +x "${f%.xz}"
done
export PATH="$ROOT/$S/bin:$PATH"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
CAP="$ROOT/target/capture-h200"
if has tests; then
    step tests-observe 200 env KOPT_GPU_TESTS="gpu_observe-test gpu-test" bash scripts/gpu-tests.sh --staged "$S"
    step tests-capture 200 env KOPT_GPU_TESTS="it-test" bash scripts/gpu-tests.sh --staged "$S" capture_cli
fi
if has overhead; then
    step overhead-none 60 llm-kernels overhead
    step overhead-capture 60 env KOPT_CAPTURE=/tmp/overhead-capture llm-kernels overhead
    for rate in 0 0.001 1; do
        step "overhead-shadow-$rate" 60 env KOPT_SHADOW="$rate" llm-kernels overhead
    done
fi
cd "$ROOT/examples/llm-kernels"
if has decode; then
    rm -rf "$CAP"
    step decode-plain 120 llm-kernels decode --steps "${DECODE_STEPS:-4}"
    step decode 120 env KOPT_CAPTURE="$CAP" KOPT_CAPTURE_INPUTS=1 KOPT_CAPTURE_MAX_BYTES=2G \
        llm-kernels decode --steps "${DECODE_STEPS:-4}"
fi
if has shadow; then
    step decode-shadow 120 env KOPT_SHADOW=1 llm-kernels decode --steps 2
fi
if has profile; then
    step profile 60 cargo kopt profile --program "$CAP"
    step profile-json 60 cargo kopt profile --program "$CAP" --message-format json
fi
if has verify; then
    step verify 300 cargo kopt verify --inputs "$CAP" --no-sanitize
fi
if has bench; then
    step bench 240 cargo kopt bench ${BENCH_KERNELS:-rmsnorm layer_norm silu_mul softmax} --inputs "$CAP"
fi
if [ -d "$CAP" ]; then
    mkdir -p "$W/manifests"
    for m in "$CAP"/*/manifest.json; do cp "$m" "$W/manifests/$(basename "$(dirname "$m")").json"; done
    du -sh "$CAP" > "$W/capture-size.txt"
fi
cp "$W/summary.txt" "$OUT/summary.txt"
tar czf "$OUT/capture.tgz" -C "$OUT" capture && rm -rf "$W"
