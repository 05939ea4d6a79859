#!/usr/bin/env python3
"""Kernel Tuner on the search benchmark's space, for comparison with `cargo kopt
search-bench row_sum`: the same kernel (examples/llm-kernels/kernels/row_sum.cu), the same
tunables (BLOCK, VEC, ROWS_PER_BLOCK, UNROLL) and constraints, brute force over every valid
point, each compiled cold by NVRTC (CuPy backend), checked against a NumPy answer and timed
with Kernel Tuner's defaults (CUDA events, 7 iterations). Prints the evaluations per second
per shape and in all.

On the GPU machine (Kernel Tuner and the packages it needs are not installed there: carry
them as wheels, see the device notes; CuPy is there):
    python3 scripts/kernel_tuner_row_sum.py [--out FILE.json]

Kernel Tuner tunes one problem size per call; kopt's evaluation of a point covers both
declared shapes (two checks on fresh inputs, timing against the reference, a re-check),
so one kopt evaluation does about the work of two Kernel Tuner evaluations, and more
checking. The output says so next to the figures.
"""
import argparse
import importlib.metadata
import json
import os
import time

import numpy as np
from kernel_tuner import tune_kernel

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "..", "examples", "llm-kernels", "kernels", "row_sum.cu")
SHAPES = [(64, 16384), (512, 2048)]  # the annotation's declared shapes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    source = open(SOURCE).read()
    tune_params = {
        "BLOCK": [32, 64, 128, 256, 512, 1024],
        "VEC": [1, 2, 4, 8],
        "ROWS_PER_BLOCK": [1, 2, 4, 8],
        "UNROLL": [1, 2, 4],
    }
    results = []
    total_points, total_s = 0, 0.0
    for rows, cols in SHAPES:
        rng = np.random.default_rng(rows * cols)
        x = rng.standard_normal(rows * cols, dtype=np.float32)
        y = np.zeros(rows, dtype=np.float32)
        want = x.reshape(rows, cols).astype(np.float64).sum(axis=1).astype(np.float32)
        restrictions = [
            "BLOCK % (32 * ROWS_PER_BLOCK) == 0",
            f"{cols} % VEC == 0",
        ]
        t0 = time.perf_counter()
        res, env = tune_kernel(
            "row_sum_f32",
            source,
            rows,
            [x, y, np.uint32(rows), np.uint32(cols)],
            tune_params,
            block_size_names=["BLOCK"],
            grid_div_x=["ROWS_PER_BLOCK"],
            restrictions=restrictions,
            answer=[None, want, None, None],
            atol=1e-3,
            lang="CUPY",
            strategy="brute_force",
            cache=None,
            verbose=False,
            quiet=True,
        )
        wall = time.perf_counter() - t0
        valid = [r for r in res if isinstance(r.get("time"), float)]
        best = min(valid, key=lambda r: r["time"]) if valid else None
        row = {
            "rows": rows,
            "cols": cols,
            "points": len(res),
            "timed": len(valid),
            "wall_s": wall,
            "evaluations_per_s": len(res) / wall,
            "best": {k: best[k] for k in tune_params} if best else None,
            "best_ms": best["time"] if best else None,
            "device": env.get("device_name"),
            "kernel_tuner": importlib.metadata.version("kernel_tuner"),
        }
        results.append(row)
        total_points += len(res)
        total_s += wall
        print(
            f"rows={rows} cols={cols}: {len(res)} points ({len(valid)} timed) in {wall:.1f} s"
            f" = {len(res) / wall:.1f} evaluations/s; best {row['best']} at"
            f" {row['best_ms'] * 1e3 if best else float('nan'):.2f} us"
        )
    print(
        f"Kernel Tuner {results[0]['kernel_tuner']} on {results[0]['device']}: "
        f"{total_points} evaluations in {total_s:.1f} s = {total_points / total_s:.1f}/s "
        "(one shape per evaluation; a kopt evaluation covers both shapes)"
    )
    if args.out:
        json.dump(results, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
