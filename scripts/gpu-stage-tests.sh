#!/usr/bin/env bash
# Builds the test binaries that hold GPU tests (those marked "needs a CUDA GPU"), the
# `cargo-kopt` binary they start as the worker and the example's `llm-kernels`, in release, and stages them compressed
# under .gpu/<name>/ for scripts/gpu-tests.sh on the GPU machine. Only these binaries: the
# whole workspace's test binaries are over the carry's 64 MiB.
#
#   scripts/gpu-stage-tests.sh                          # cargo kopt's own CUDA 13.0 bindings
#   scripts/gpu-stage-tests.sh --cuda-bindings 12080    # kopt built against CUDA 12.8's API
#
# then, on the GPU machine (carry .gpu; .gpu/run.sh comes from ../shared/tools/gpu-stage):
#   bash .gpu/run.sh -- bash scripts/gpu-tests.sh --staged .gpu/cuda-12080
# With --cuda-bindings, cudarc's bindings are CUDARC_CUDA_VERSION's and cargo-kopt is built
# without its default `cuda-13000` feature (cudarc refuses both at once).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
bindings=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda-bindings) bindings="$2"; shift ;;
    -h|--help) sed -n 2,14p "$0"; exit 0 ;;
    *) echo "gpu-stage-tests.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
# The settings gpu-stage builds with, so that its artifacts are reused.
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
features=()
name=cuda-13000
if [ -n "$bindings" ]; then
  export CUDARC_CUDA_VERSION="$bindings"
  features=(--no-default-features)
  name="cuda-$bindings"
fi
# `-p PACKAGE --test TARGET` for every integration-test target holding a GPU test: a file
# `tests/NAME.rs`, or a folder `tests/NAME/` (one binary of several modules).
mapfile -t selection < <(python3 - <<'PY'
import json, pathlib, subprocess
meta = json.loads(subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"],
                                 check=True, capture_output=True, text=True).stdout)
for pkg in meta["packages"]:
    for t in pkg["targets"]:
        if t["kind"] != ["test"]:
            continue
        src = pathlib.Path(t["src_path"])
        files = [src] if src.name != "main.rs" else list(src.parent.rglob("*.rs"))
        if any("needs a CUDA GPU" in f.read_text() for f in files):
            print(f"-p\n{pkg['name']}\n--test\n{t['name']}")
PY
)
[ ${#selection[@]} -gt 0 ] || { echo "gpu-stage-tests.sh: no test target holds a GPU test" >&2; exit 1; }
echo "GPU test targets: ${selection[*]}" >&2
cargo build --release --locked "${features[@]}" -p cargo-kopt --bins
# The example's binary too (`llm-kernels run`, `first-launch`), its variants as committed.
cargo build --release --locked -p llm-kernels --bins
out="$root/.gpu/$name"
rm -rf "$out" && mkdir -p "$out/bin" "$out/tests"
cp target/release/cargo-kopt target/release/llm-kernels "$out/bin/"
cargo test --release --locked "${features[@]}" --no-run --message-format=json "${selection[@]}" \
  | python3 -c '
import json, os, shutil, sys
out = sys.argv[1]
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"].get("test"):
        dst = os.path.join(out, "tests", m["target"]["name"] + "-test")
        shutil.copy(m["executable"], dst)
        open(dst + ".dir", "w").write(os.path.relpath(os.path.dirname(m["manifest_path"]), os.getcwd()))
' "$out"
for b in "$out"/bin/* "$out"/tests/*-test; do
  strip "$b" 2>/dev/null || true
  xz -T2 -6 -f "$b"
done
if [ -n "$bindings" ]; then echo "$bindings" > "$out/cuda-bindings"; else echo "13000 (the default feature of cargo-kopt)" > "$out/cuda-bindings"; fi
echo "staged in $out:"
ls -l "$out/bin" "$out/tests" | grep -v '\.dir$'
du -sh "$root/.gpu"
