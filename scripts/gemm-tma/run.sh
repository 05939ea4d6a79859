#!/usr/bin/env bash
# Builds and benchmarks the TMA GEMM candidate (examples/llm-kernels/kopt/gemm/run-1796224274-r1c1/kernel.cu)
# against torch.matmul and the accepted variant, on an H200. From the repository root:
#     bash scripts/gemm-tma/run.sh
# Needs: nvcc (CUDA 12.3+ / 13), python3 with torch, the driver. Under 4 minutes:
# the builds run in parallel (2 min cap each), the benchmark driver stops starting
# configurations after DEADLINE seconds (default 170), each configuration runs in its own
# process (60 s cap) so a fault or a hang loses only that row.
# Environment: BUILD (build folder), DEADLINE, CONFIGS (comma list, default all), OUT.
set -u
cd "$(dirname "$0")/../.."
HERE=scripts/gemm-tma
BUILD=${BUILD:-$HERE/build}
DEADLINE=${DEADLINE:-170}
mkdir -p "$BUILD"
T0=$(date +%s)

NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    [ -x "$c" ] && NVCC=$c && break
done
echo "== machine"
timeout 20 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit \
    --format=csv 2>&1 | head -3
echo "nvcc: $NVCC ($($NVCC --version 2>/dev/null | tail -1))"
timeout 60 python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
timeout 20 python3 $HERE/bench.py selftest >/dev/null || echo "selftest FAILED"

echo "== build"
CUDA_INC=$(dirname "$(dirname "$NVCC")")/include
TMA_SRC=examples/llm-kernels/kopt/gemm/run-1796224274-r1c1/kernel.cu
BASE_SRC=examples/llm-kernels/agents/gemm_wgmma.cu
while IFS=$'\t' read -r name kind ptx flags; do
    if [ "$kind" = base ]; then
        ( timeout 120 "$NVCC" -gencode=arch=compute_90a,code=sm_90a -cubin -Xptxas -v $flags \
            -o "$BUILD/base.cubin" "$BASE_SRC" >"$BUILD/base.log" 2>&1 \
            || echo "BUILD FAILED: base (see $BUILD/base.log)" ) &
    elif [ "$ptx" = 1 ]; then
        # kopt's path: NVRTC, --gpu-architecture=compute_90a, the CUDA headers on the path.
        # Falls back to the PTX made by NVRTC 13.0.88 on the dev machine (ptx/) if this
        # machine has no libnvrtc or it fails.
        (
            LIB=""
            for c in "$(dirname "$(dirname "$NVCC")")"/lib64/libnvrtc.so* \
                     /usr/local/cuda/lib64/libnvrtc.so* ; do
                [ -e "$c" ] && LIB=$c && break
            done
            defs=$(echo "$flags" | sed 's/-D//g; s/ /,/g')
            rm -f "$BUILD/$name.ptx"
            if [ -n "$LIB" ] && timeout 120 python3 $HERE/nvrtc_check.py "$TMA_SRC" --lib "$LIB" \
                    --include "$CUDA_INC" --defs "$defs" --ptx-out "$BUILD/nvrtc-$name" \
                    >"$BUILD/$name.log" 2>&1; then
                cp "$BUILD/nvrtc-$name/"*.ptx "$BUILD/$name.ptx"
            elif [ -f "$HERE/ptx/$name.ptx" ] && [ "$(sha256sum <"$TMA_SRC" | cut -c1-64)" = \
                    "$(cat "$HERE/ptx/$name.src-sha256")" ]; then
                echo "(using the stored NVRTC 13.0.88 PTX)" >>"$BUILD/$name.log"
                cp "$HERE/ptx/$name.ptx" "$BUILD/$name.ptx"
            else
                echo "BUILD FAILED: $name (no NVRTC, no current stored PTX; see $BUILD/$name.log)"
            fi
        ) &
    else
        ( timeout 120 "$NVCC" -gencode=arch=compute_90a,code=sm_90a -cubin -Xptxas -v $flags \
            -o "$BUILD/$name.cubin" "$TMA_SRC" >"$BUILD/$name.log" 2>&1 \
            || echo "BUILD FAILED: $name (see $BUILD/$name.log)" ) &
    fi
done < <(python3 $HERE/bench.py flags)
wait
for f in "$BUILD"/*.log; do
    n=$(basename "$f" .log)
    echo "$n: $(grep -h -E 'registers|spill|^NVRTC|^\[|stored' "$f" | sed 's/ptxas info *: //' | tr '\n' ' ' | tr -s ' ')"
    grep -h -i -E 'warning|error' "$f" | head -3
done
echo "build took $(( $(date +%s) - T0 )) s"

echo "== benchmark"
timeout $(( DEADLINE + 60 )) python3 $HERE/bench.py driver --build "$BUILD" \
    --deadline "$DEADLINE" ${CONFIGS:+--configs "$CONFIGS"}

# compute-sanitizer's four tools (what kopt verify runs) on small shapes, without torch,
# while the 4 minutes allow (SANITIZE=0 skips).
SAN=$(dirname "$NVCC")/compute-sanitizer
if [ "${SANITIZE:-1}" != 0 ] && [ -x "$SAN" ] && python3 -c "import numpy" 2>/dev/null; then
    echo "== compute-sanitizer"
    for tool in memcheck racecheck synccheck initcheck; do
        if [ $(( $(date +%s) - T0 )) -gt 190 ]; then echo "$tool: skipped (time)"; continue; fi
        timeout 40 "$SAN" --tool $tool --error-exitcode 9 python3 $HERE/sanitize.py \
            --build "$BUILD" --configs c1p,c2p >"$BUILD/san-$tool.log" 2>&1
        rc=$?
        echo "$tool: rc=$rc $(grep -h -E 'ERROR SUMMARY|sanitize run|bad' "$BUILD/san-$tool.log" \
            | tr '\n' ' ' | tr -s ' ')"
        grep -h -E '^========= (Invalid|Race|Barrier|Uninit|Error)' "$BUILD/san-$tool.log" | head -5
    done
fi
echo "total $(( $(date +%s) - T0 )) s"
