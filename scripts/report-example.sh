#!/usr/bin/env bash
# Regenerates docs/report-example.html and docs/report-screenshot.png from the H200 runs in
# docs/runs/ (no GPU needed; chromium for the screenshot: apt-get install chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run -q -p cargo-kopt -- kopt report --manifest-path examples/llm-kernels/Cargo.toml \
    --bench docs/runs/2026-11-30-h200-small-shapes/rounds-c/bench-b1.json \
    --search-bench docs/runs/2026-11-29-h200-suite-4/search-bench-row_sum.json \
    --pending docs/runs/2026-11-29-h200-optimize/pending \
    --title "kopt report: llm-kernels on an NVIDIA H200" \
    --generated "2026-11-30, from the runs in docs/runs/" \
    -o docs/report-example.html
profile="$(mktemp -d)"; trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --hide-scrollbars --user-data-dir="$profile" --window-size=1280,2400 \
    --screenshot="$PWD/docs/report-screenshot.png" "file://$PWD/docs/report-example.html"
