#!/usr/bin/env bash
# Builds examples/candle-ops' GPU test binary and its bench binary here (release; the staged
# copies stripped of symbols), against NVIDIA's wheels (scripts/cuda-wheels.sh --link: nvcc for
# candle-kernels' build script, the CUDA libraries and the libcuda link stub for the
# linker), and stages them under .gpu/candle-ops/ for the H200. Run it after
# ../shared/tools/gpu-stage, which empties .gpu/:
#
#   ../shared/tools/gpu-stage --with-cargo --no-tests && scripts/candle-ops-stage.sh
#
# then, on the H200 (carry .gpu): bash .gpu/run.sh -- bash scripts/candle-ops-gpu-h200.sh
# The binaries embed the variants committed under examples/candle-ops/kopt/ when they are
# built: stage again after accepting variants to test and time them.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
scripts/cuda-wheels.sh --link >&2
# shellcheck disable=SC1091
. target/cuda-wheels/cu13/env.sh
# candle-kernels' build script compiles for the GPU it finds, or this one (the H200's).
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
cd examples/candle-ops
target="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
# The macro embeds the kopt/ files; a lock file copied in from the H200 into a crate that
# had none is only seen after a change of the crate's sources: make one.
touch src/kernels.rs
cargo build --release --locked --bins
rm -rf "$root/.gpu/candle-ops" && mkdir -p "$root/.gpu/candle-ops"
cp "$target/release/candle-ops" "$root/.gpu/candle-ops/candle-ops"
cargo test --release --locked --no-run --message-format=json | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"].get("test") \
            and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], sys.argv[1] + "/" + m["target"]["name"] + "-test")
' "$root/.gpu/candle-ops"
# Stripped after the build, not through the profile: another profile would rebuild
# everything, candle-kernels' nvcc compile included. Each binary holds candle's kernels
# (about 11 MB of PTX and the MoE library's machine code): about 41 and 47 MB stripped,
# over the carry's 64 MiB together, so they travel compressed (about 5.5 MB each);
# candle-ops-gpu-h200.sh unpacks them.
for b in "$root"/.gpu/candle-ops/*; do
  strip "$b"
  xz -T2 -6 -f "$b"
done
echo "staged in .gpu/candle-ops (the carry's limit is 64 MiB in all):"
ls -l "$root/.gpu/candle-ops"
du -sh "$root/.gpu"
