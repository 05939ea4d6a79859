#!/usr/bin/env bash
# Installs NVIDIA's CUDA wheels (NVRTC, the runtime's and CCCL's headers; nvcc with --nvcc;
# what linking a CUDA program needs with --link) into a virtual environment under target/,
# pinned, and writes an env file that points kopt (and cudarc) at them. They need no GPU: a
# CPU machine compiles CUDA C++ to PTX and cubins with them, which is how CI runs `cargo
# kopt check`'s compile fence.
#
#   scripts/cuda-wheels.sh [--cuda 13|12] [--nvcc] [--link]   # then: . target/cuda-wheels/cu13/env.sh
#
#   --nvcc  nvcc and NVVM (cicc, libdevice): build scripts that run nvcc, such as
#           candle-kernels' (examples/candle-ops), and cudarc's cuda-version-from-build-system.
#   --link  --nvcc, and what linking a binary against CUDA's libraries needs (cudarc's
#           dynamic-linking, as candle uses it): cuBLAS and cuRAND, the unversioned names
#           (libcublas.so, ...) the linker looks for, and a link-only libcuda stub. CUDA 13 only.
#
# The libcuda stub: the driver library ships with the driver, not in any wheel, and the
# toolkit's own stub (lib64/stubs/libcuda.so) is not published as one either. The linker only
# needs a library with the driver API's symbols and the driver's SONAME (libcuda.so.1), so
# this builds one from the wheel's cuda.h: every driver function, each returning
# CUDA_ERROR_STUB_LIBRARY as NVIDIA's stub does. It lives in lib/stubs, which is never on
# LD_LIBRARY_PATH: at run time the loader finds the real libcuda.so.1 of the machine's driver.
#
# Idempotent: a finished install (its stamp matches the pinned list) is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=13; nvcc=0; link=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) cuda="$2"; shift 2 ;;
    --nvcc) nvcc=1; shift ;;
    --link) nvcc=1; link=1; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "cuda-wheels.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$cuda" in
  # CUDA 13.0, the H200 machine's toolkit. One root holds bin/, include/, include/cccl,
  # lib/ and nvvm/. nvcc's wheel depends on NVVM's unpinned: pinned here, so that pip does
  # not pull a newer one.
  13) pins="nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-crt==13.0.88"
      [ $nvcc = 1 ] && pins="$pins nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88"
      # cuBLAS and cuRAND of CUDA 13.0 update 1 (what candle's cudarc links).
      [ $link = 1 ] && pins="$pins nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35"
      sub=cu13 ;;
  # CUDA 12.9: each package has its own root under nvidia/.
  12) pins="nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-cccl-cu12==12.9.27"
      [ $nvcc = 1 ] && pins="$pins nvidia-cuda-nvcc-cu12==12.9.86"
      if [ $link = 1 ]; then
        echo "cuda-wheels.sh: --link is for CUDA 13 (what examples/candle-ops is built with); use --cuda 13" >&2
        exit 2
      fi
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
if [ $link = 1 ]; then
  # `-lcublas` and the others look for the unversioned names; the wheels ship the sonames.
  for so in libcudart.so.13 libnvrtc.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10; do
    [ -e "$lib/${so%.so.*}.so" ] || ln -s "$so" "$lib/${so%.so.*}.so"
  done
  stub="$lib/stubs/libcuda.so"
  if [ ! -f "$stub" ] || [ "$home/include/cuda.h" -nt "$stub" ]; then
    mkdir -p "$lib/stubs"
    src="$lib/stubs/libcuda-stub.c"
    {
      echo "/* Written by scripts/cuda-wheels.sh from cuda.h: a link-time stand-in for the driver."
      echo "   Every function returns CUDA_ERROR_STUB_LIBRARY (34), as NVIDIA's stub does. */"
      # The names a program may link: cuda.h's declarations as they preprocess by default
      # (cuMemAlloc -> cuMemAlloc_v2) and with per-thread default streams (the _ptsz ones).
      for per_thread in "" -DCUDA_API_PER_THREAD_DEFAULT_STREAM; do
        cc -E -P $per_thread -I"$home/include" "$home/include/cuda.h"
      done | tr -s ' \n\t' ' ' | grep -oE 'CUresult (cu[A-Za-z0-9_]+) ?\(' \
        | sed -E 's/CUresult (cu[A-Za-z0-9_]+) ?\(/\1/' | sort -u \
        | sed 's/.*/int &(void) { return 34; }/'
    } > "$src"
    [ "$(grep -c '^int cu' "$src")" -gt 300 ] || { echo "cuda-wheels.sh: found too few driver functions in $home/include/cuda.h for the libcuda stub" >&2; exit 1; }
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub.tmp" "$src"
    mv "$stub.tmp" "$stub"
  fi
fi
cat > "$dir/env.sh" <<ENV
# Written by scripts/cuda-wheels.sh: source it to compile CUDA with the wheels.
export CUDA_HOME="$home"
${include:+export KOPT_CUDA_INCLUDE=\"$include\"}
export LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PATH="$bin\${PATH:+:\$PATH}"
ENV
echo "cuda-wheels: CUDA $cuda wheels in $dir; source $dir/env.sh"
