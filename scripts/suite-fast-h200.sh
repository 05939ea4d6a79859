#!/usr/bin/env bash
# On the H200 (staged with `gpu-stage --with-cargo`, run from the repo root through
# `.gpu/run.sh -- bash scripts/suite-fast-h200.sh`): the hand-written fast candidates of
# examples/llm-kernels/agents/ fed through kopt's loop as an engineer in the loop would
# (`cargo kopt optimize --agent cmd:agents/scripted-agent.sh`, one round each), then the
# winners accepted in this machine's copy only to time them with `cargo kopt bench`, and
# PyTorch's versions of the whole suite (scripts/torch_compare.py) in the same session.
#
# STEPS picks the steps (default: "optimize bench torch"; "verify" adds `cargo kopt
# verify`, compute-sanitizer included, on the accepted candidates: slower). Every step has
# its own timeout and goes on after a failure. All of it can take longer than the device
# tool's 10 minutes a command: run it as two calls, STEPS="optimize bench" (bench needs the pending
# variants of the same call) and STEPS=torch. What comes back: $OUT/suite-fast.tgz
# (pending/ as the loop left it, before any accept; runs/; the accepted kopt/ folders;
# the logs) and $OUT/summary.txt, plus the tables on stdout.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
STEPS="${STEPS:-optimize bench torch}"
KERNELS=(softmax rmsnorm reduce_sum gqa_decode)
ROOT="$PWD"
W="$OUT/suite-fast"
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

if has optimize; then
    step optimize 420 cargo kopt optimize "${KERNELS[@]}" \
        --agent "cmd:$PWD/agents/scripted-agent.sh" --budget rounds=1 --no-ncu --step-timeout 60
    step pending 60 cargo kopt pending
    step pending-json 60 cargo kopt pending --message-format json
    # The pending area as the loop left it: the lead reviews these (see the brief's report).
    mkdir -p "$W/pending-as-left"
    [ -d "$TARGET/pending" ] && cp -r "$TARGET/pending/." "$W/pending-as-left/"
fi

if has bench || has verify; then
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
    step bench 150 cargo kopt bench "${KERNELS[@]}" --no-cache
    step bench-json 90 cargo kopt bench "${KERNELS[@]}" --message-format json
    cp "$W/logs/bench-json.txt" "$OUT/bench.json" 2>/dev/null
fi

if has verify; then
    step verify 300 cargo kopt verify "${KERNELS[@]}"
fi

cd "$ROOT"
if has torch; then
    step torch 300 env PYTHONUNBUFFERED=1 python3 scripts/torch_compare.py --out "$OUT/torch_compare.json"
    [ -f "$OUT/torch_compare.json" ] && cp "$OUT/torch_compare.json" "$W/"
fi

mkdir -p "$W/runs"
[ -d "$TARGET/runs" ] && cp -r "$TARGET/runs/." "$W/runs/"
tar czf "$OUT/suite-fast.tgz" -C "$OUT" suite-fast
cp "$W/summary.txt" "$OUT/summary.txt"
echo "== summary"
cat "$W/summary.txt"
ls -la "$OUT"
