#!/usr/bin/env python3
"""The suite's table: per kernel and shape, the reference and kopt's active variant (from
`cargo kopt bench --message-format json`), PyTorch eager and torch.compile (from
scripts/torch_compare.py, same session), the ratio of the faster PyTorch time over the
variant's (above 1: kopt is faster) and the share of the roofline (copy bandwidth for
memory-bound kernels, cuBLAS and the f16 matrix peak for the GEMM). Where the bench file
has them, memory-bound rows also give the share of a one-launch copy of the same bytes
timed the same way (`% same-size copy`), the roof a small, launch-bound shape can reach.

    python3 scripts/suite_table.py --bench bench-after.json --torch torch_compare.json \
        [--before bench-before.json] > TABLE.md

With --before, a column gives the variant that was accepted before (same session), so a
new winner is compared with the variant it replaces, not only with the reference.
"""
import argparse
import json
import math
import sys

COMPUTE_BOUND = {"gemm"}
# kopt's kernel name -> torch_compare.py's name for PyTorch's equivalent.
TORCH_NAME = {"rmsnorm": "rms_norm", "reduce_sum": "sum", "gemm": "matmul"}
# Shapes whose traffic is at least this many bytes count as "large" in the summary (the
# copy bandwidth share of a few-microsecond launch measures latency, not bandwidth).
LARGE_BYTES = 64 << 20


def parse_shape(text):
    out = {}
    for part in text.split():
        k, _, v = part.partition("=")
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = v
    return out


def same_shape(bench_shape, torch_shape):
    return all(
        k in bench_shape and float(bench_shape[k]) == float(v)
        for k, v in torch_shape.items()
        if isinstance(v, (int, float))
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True)
    ap.add_argument("--torch", required=True)
    ap.add_argument("--before")
    args = ap.parse_args()
    bench = json.load(open(args.bench))
    torch = json.load(open(args.torch))
    before = {}
    if args.before:
        for r in json.load(open(args.before))["rows"]:
            before[(r["kernel"], r["shape"])] = r
    copy_gbs = bench["ceilings"]["copy_gbs"]

    def torch_us(kernel, shape, impl):
        for r in torch["rows"]:
            if r["kernel"] == TORCH_NAME.get(kernel, kernel) and r["impl"] == impl and same_shape(shape, r["shape"]):
                return r["us"], r.get("bytes")
        return None, None

    head = ["kernel", "shape", "reference µs"]
    if before:
        head.append("previous variant µs")
    head += ["kopt variant µs", "PyTorch eager µs", "torch.compile µs",
             "best PyTorch / variant", "roofline"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---", "---"] + ["---:"] * (len(head) - 3) + ["---"]) + "|")
    mem_pct, large_pct, same_pct, slower, gemm = [], [], [], [], []
    for r in bench["rows"]:
        if r.get("problem"):
            print(f"| {r['kernel']} | {r['shape']} | {r['problem']} |", file=sys.stderr)
            continue
        shape = parse_shape(r["shape"])
        eager, nbytes = torch_us(r["kernel"], shape, "eager")
        comp, _ = torch_us(r["kernel"], shape, "compile")
        best = min(x for x in (eager, comp) if x is not None) if (eager or comp) else None
        v = r["active_us"]
        ratio = best / v if best else None
        if r["kernel"] in COMPUTE_BOUND:
            pct_cublas = 100 * best / v if best else float("nan")
            roof = f"{r['flops_pct']:.1f}% of f16 peak; {pct_cublas:.0f}% of cuBLAS"
            gemm.append(pct_cublas)
        else:
            pct = r["copy_bandwidth_pct"]
            roof = f"{pct:.1f}% of copy bw"
            mem_pct.append(pct)
            same = r.get("same_size_copy_pct")
            if same is not None:
                roof += f"; {same:.1f}% of a same-size copy"
                same_pct.append(same)
            if nbytes and nbytes >= LARGE_BYTES:
                large_pct.append(pct)
            if ratio is not None and ratio < 1:
                slower.append((r["kernel"], r["shape"], round(ratio, 3)))
        cells = [r["kernel"], r["shape"], f"{r['reference_us']:.2f}"]
        if before:
            b = before.get((r["kernel"], r["shape"]))
            cells.append(f"{b['active_us']:.2f}" if b else "–")
        cells += [f"{v:.2f}", f"{eager:.2f}" if eager else "–", f"{comp:.2f}" if comp else "–",
                  f"{ratio:.2f}x" if ratio else "–", roof]
        print("| " + " | ".join(cells) + " |")

    def geomean(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")

    print()
    print(f"copy bandwidth: {copy_gbs:.0f} GB/s (kopt's ceiling, same session)")
    print(f"geomean copy-bandwidth share over {len(mem_pct)} memory-bound shapes: "
          f"{geomean(mem_pct):.1f}%")
    print(f"geomean over the {len(large_pct)} memory-bound shapes that move at least "
          f"{LARGE_BYTES >> 20} MB: {geomean(large_pct):.1f}%")
    if same_pct:
        print(f"geomean share of a same-size one-launch copy over {len(same_pct)} memory-bound "
              f"shapes: {geomean(same_pct):.1f}% ({bench.get('same_size_copy', '')})")
    print(f"GEMM share of cuBLAS: {', '.join(f'{x:.0f}%' for x in gemm)}")
    print(f"memory-bound shapes slower than the best PyTorch: {len(slower)} {slower}")


if __name__ == "__main__":
    main()
