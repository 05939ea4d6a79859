#!/usr/bin/env bash
# On the H200 (staged with `gpu-stage --with-cargo`, run from the repo root through
# `.gpu/run.sh -- bash scripts/suite-h200.sh`): the hand-written fast candidates of
# examples/llm-kernels/agents/ fed through kopt's loop as an engineer in the loop would
# (`cargo kopt optimize --agent cmd:agents/scripted-agent.sh`, one round each), then the
# winners accepted in this machine's copy only to time them with `cargo kopt bench`, and
# PyTorch's versions of the whole suite (scripts/torch_compare.py) in the same session.
#
# STEPS picks the steps (default: "optimize bench torch"): "optimize" (the loop, one round
# per kernel), "accept" (accepts the pending winners in this machine's copy only, so that
# bench and verify see them), "bench" (JSON of `cargo kopt bench`: reference and active
# version per shape), "verify" (`cargo kopt verify`, compute-sanitizer included: slower),
# "searchbench" (the search's convergence benchmark on row_sum, 10 seeds), "torch"
# (scripts/torch_compare.py). KERNELS overrides the kernels (default: the nine of the
# suite). OPTIMIZE_ARGS adds arguments to the optimize step (e.g. "--min-uniform-gain 0.5").
# Every step has its own timeout and goes on after a failure. All of it can take
# longer than the device tool's 10 minutes a command: run it as several calls. What comes
# back: $OUT/suite.tgz (pending/ as the loop left it, before any accept; runs/; the
# accepted kopt/ folders; the logs), $OUT/summary.txt, $OUT/bench.json,
# $OUT/search-bench-row_sum.json, $OUT/torch_compare.json, plus the tables on stdout.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
STEPS="${STEPS:-optimize bench torch}"
read -r -a KERNELS <<<"${KERNELS:-softmax layer_norm rmsnorm reduce_sum transpose gqa_decode paged_decode silu_mul gemm}"
ROOT="$PWD"
W="$OUT/suite"
# cargo-kopt: gpu-stage's .gpu/bin (on the PATH through .gpu/run.sh), else the compressed
# binaries of scripts/gpu-stage-tests.sh.
if ! command -v cargo-kopt >/dev/null; then
    for f in "$ROOT"/.gpu/cuda-13000/bin/*.xz; do
        [ -e "$f" ] && xz -d -f "$f" && chmod +x "${f%.xz}"
    done
    export PATH="$ROOT/.gpu/cuda-13000/bin:$PATH"
fi
command -v cargo-kopt >/dev/null || {
    echo "suite-h200.sh: no cargo-kopt: stage it first (gpu-stage, or scripts/gpu-stage-tests.sh)" >&2
    exit 2
}
mkdir -p "$W/logs"
has() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
step() { # step NAME SECONDS CMD...: runs CMD with a timeout, logs to $W/logs/NAME.txt
    local name=$1 secs=$2
    shift 2
    echo "== $name (timeout ${secs}s): $*"
    local t0=$SECONDS
    timeout "$secs" "$@" 2>&1 | tee "$W/logs/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "   $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$W/summary.txt"
    return 0
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
    >"$W/logs/nvidia-smi.txt" 2>&1
cd "$ROOT/examples/llm-kernels"
TARGET="$ROOT/target/kopt"

if has searchbench; then
    step search-bench 150 cargo kopt search-bench row_sum --seeds 10 \
        --json-out "$OUT/search-bench-row_sum.json"
fi

if has optimize; then
    step optimize "${OPTIMIZE_TIMEOUT:-420}" cargo kopt optimize "${KERNELS[@]}" \
        --agent "cmd:$PWD/agents/scripted-agent.sh" --budget rounds=1 --no-ncu --step-timeout 60 \
        ${OPTIMIZE_ARGS:-}
    step pending 60 cargo kopt pending
    step pending-json 60 cargo kopt pending --message-format json
    # The pending area as the loop left it: the lead reviews these (see the brief's report).
    mkdir -p "$W/pending-as-left"
    [ -d "$TARGET/pending" ] && cp -r "$TARGET/pending/." "$W/pending-as-left/"
fi

if has accept; then
    # Accept in this machine's copy only, so that bench and verify see the candidates as
    # the active variants; nothing here goes back to the repository except through the
    # lead's own `cargo kopt review` of the pending files.
    for k in "${KERNELS[@]}"; do
        step "accept-$k" 60 cargo kopt accept "$k" --arch sm_90 --no-cases
    done
    step check 60 cargo kopt check
    mkdir -p "$W/accepted"
    for k in "${KERNELS[@]}"; do
        [ -d "kopt/$k" ] && cp -r "kopt/$k" "$W/accepted/"
    done
fi

if has bench; then
    echo "== bench-json: cargo kopt bench ${KERNELS[*]} --message-format json"
    t0=$SECONDS
    timeout 240 cargo kopt bench "${KERNELS[@]}" --no-cache --message-format json \
        >"$OUT/bench.json" 2>"$W/logs/bench-json.stderr"
    echo "   bench-json: exit $? after $((SECONDS - t0)) s" | tee -a "$W/summary.txt"
    tail -n 5 "$W/logs/bench-json.stderr"
fi

if has verify; then
    step verify 300 cargo kopt verify "${KERNELS[@]}"
fi

cd "$ROOT"
if has torch; then
    # PyTorch's side of the same kernels, under scripts/torch_compare.py's names.
    torch_kernels=$(printf '%s\n' "${KERNELS[@]}" |
        sed -e 's/^rmsnorm$/rms_norm/' -e 's/^reduce_sum$/sum/' -e 's/^gemm$/matmul/' | paste -sd,)
    step torch 300 env PYTHONUNBUFFERED=1 python3 scripts/torch_compare.py --out "$OUT/torch_compare.json" \
        --kernels "$torch_kernels"
    [ -f "$OUT/torch_compare.json" ] && cp "$OUT/torch_compare.json" "$W/"
fi

mkdir -p "$W/runs"
[ -d "$TARGET/runs" ] && cp -r "$TARGET/runs/." "$W/runs/"
tar czf "$OUT/suite.tgz" -C "$OUT" suite && rm -rf "$W"
echo "== summary"
tar xzf "$OUT/suite.tgz" -O suite/summary.txt | tee "$OUT/summary.txt"
ls -la "$OUT"
