#!/usr/bin/env bash
# Installs NVIDIA's CUDA compiler wheels (NVRTC, the runtime's and CCCL's headers; nvcc
# with --nvcc) into a virtual environment under target/, pinned, and writes an env file
# that points kopt (and cudarc) at them. They need no GPU: a CPU machine compiles CUDA C++
# to PTX and cubins with them, which is how CI runs `cargo kopt check`'s compile fence.
#
#   scripts/cuda-wheels.sh [--cuda 13|12] [--nvcc]   # then: . target/cuda-wheels/cu13/env.sh
#
# Idempotent: a finished install (its stamp matches the pinned list) is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=13; nvcc=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) cuda="$2"; shift 2 ;;
    --nvcc) nvcc=1; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "cuda-wheels.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$cuda" in
  # CUDA 13.0, the H200 machine's toolkit. One root holds bin/, include/, include/cccl,
  # lib/ and nvvm/. nvcc's wheel depends on NVVM's unpinned: pinned here, so that pip does
  # not pull a newer one.
  13) pins="nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-crt==13.0.88"
      [ $nvcc = 1 ] && pins="$pins nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88"
      sub=cu13 ;;
  # CUDA 12.9: each package has its own root under nvidia/.
  12) pins="nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-cccl-cu12==12.9.27"
      [ $nvcc = 1 ] && pins="$pins nvidia-cuda-nvcc-cu12==12.9.86"
      sub=cu12 ;;
  *) echo "cuda-wheels.sh: --cuda takes 12 or 13" >&2; exit 2 ;;
esac
dir="target/cuda-wheels/$sub"
stamp="$dir/installed.txt"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pins" ]; then
  echo "cuda-wheels: $dir is up to date"
else
  python3 -m venv "$dir/venv"
  # shellcheck disable=SC2086
  "$dir/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir $pins
  echo "$pins" > "$stamp"
fi
site=$("$dir/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
root="$(cd "$site/nvidia" && pwd)"
if [ "$cuda" = 13 ]; then
  # CUDA_HOME alone: kopt finds include/ and include/cccl under it.
  home="$root/cu13"; include=""; lib="$home/lib"; bin="$home/bin"
  # cudarc built with CUDA 12 bindings (CUDARC_CUDA_VERSION=12080) looks NVRTC up as
  # libnvrtc.so or libnvrtc.so.12 only; the wheel ships libnvrtc.so.13.
  [ -e "$lib/libnvrtc.so" ] || ln -s libnvrtc.so.13 "$lib/libnvrtc.so"
else
  home="$root/cuda_runtime"
  include="$root/cuda_runtime/include:$root/cuda_nvrtc/include:$root/cuda_cccl/include"
  lib="$root/cuda_nvrtc/lib:$root/cuda_runtime/lib"; bin="$root/cuda_nvcc/bin"
  # cudarc and kopt dlopen libnvrtc.so; the wheel ships only the versioned name.
  [ -e "$root/cuda_nvrtc/lib/libnvrtc.so" ] || ln -s libnvrtc.so.12 "$root/cuda_nvrtc/lib/libnvrtc.so"
fi
cat > "$dir/env.sh" <<ENV
# Written by scripts/cuda-wheels.sh: source it to compile CUDA with the wheels.
export CUDA_HOME="$home"
${include:+export KOPT_CUDA_INCLUDE=\"$include\"}
export LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PATH="$bin\${PATH:+:\$PATH}"
ENV
echo "cuda-wheels: CUDA $cuda wheels in $dir; source $dir/env.sh"
