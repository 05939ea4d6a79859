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

--bench and --torch may each be given several times: rounds of the same versions timed in
one session (scripts/suite-repeat-h200.sh). Times are then the median over the rounds,
with their range, and each memory-bound shape is judged against the faster PyTorch with
the rounds' spread (two runs of one version differ by a few percent): "slower" only when
every round of the variant is slower than every round of the best PyTorch, "faster" when
every round is faster, "within the spread" otherwise. One round of each is judged by its
single ratio.
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


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def timed(xs, digits=2):
    """`median` or `median (min-max)` of several rounds."""
    if len(xs) == 1:
        return f"{xs[0]:.{digits}f}"
    return f"{median(xs):.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"


def verdict(variant, best):
    """faster / slower / tie of the variant's rounds against the best PyTorch's rounds."""
    if len(variant) == 1 and len(best) == 1:
        return "faster" if variant[0] < best[0] else "slower" if variant[0] > best[0] else "tie"
    if max(variant) < min(best):
        return "faster"
    if min(variant) > max(best):
        return "slower"
    return "tie"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, action="append",
                    help="cargo kopt bench JSON; repeat for rounds of one session")
    ap.add_argument("--torch", required=True, action="append",
                    help="torch_compare.py JSON; repeat for rounds of one session")
    ap.add_argument("--before")
    args = ap.parse_args()
    benches = [json.load(open(f)) for f in args.bench]
    torches = [json.load(open(f)) for f in args.torch]
    before = {}
    if args.before:
        for r in json.load(open(args.before))["rows"]:
            before[(r["kernel"], r["shape"])] = r
    copy_gbs = [b["ceilings"]["copy_gbs"] for b in benches]
    rounds = len(benches) > 1 or len(torches) > 1

    def torch_us(torch, kernel, shape, impl):
        for r in torch["rows"]:
            if (r["kernel"] == TORCH_NAME.get(kernel, kernel) and r["impl"] == impl
                    and same_shape(shape, r["shape"]) and "us" in r):
                return r["us"], r.get("bytes")
        return None, None

    def rows_of(bench, kernel, shape):
        return next((r for r in bench["rows"] if r["kernel"] == kernel and r["shape"] == shape), None)

    head = ["kernel", "shape", "reference µs"]
    if before:
        head.append("previous variant µs")
    head += ["kopt variant µs", "PyTorch eager µs", "torch.compile µs",
             "best PyTorch / variant", "roofline"]
    if rounds:
        head.insert(len(head) - 1, "judged over the rounds")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---", "---"] + ["---:"] * (len(head) - 3) + ["---"]) + "|")
    mem_pct, large_pct, same_pct, gemm = [], [], [], []
    judged = {"faster": [], "tie": [], "slower": []}
    for r in benches[0]["rows"]:
        if r.get("problem"):
            print(f"| {r['kernel']} | {r['shape']} | {r['problem']} |", file=sys.stderr)
            continue
        runs = [x for x in (rows_of(b, r["kernel"], r["shape"]) for b in benches)
                if x and not x.get("problem")]
        shape = parse_shape(r["shape"])
        # Per PyTorch round: (eager µs, bytes), (compiled µs, bytes).
        per_round = [(torch_us(t, r["kernel"], shape, "eager"), torch_us(t, r["kernel"], shape, "compile"))
                     for t in torches]
        eager = [e for (e, _), _ in per_round if e]
        comp = [c for _, (c, _) in per_round if c]
        nbytes = next((b for (_, b), _ in per_round if b), None)
        # Each round's faster PyTorch: eager and compiled of the same torch_compare run.
        best = [min(x for x in (e, c) if x) for (e, _), (c, _) in per_round if e or c]
        v = [x["active_us"] for x in runs]
        ratio = median(best) / median(v) if best else None
        if r["kernel"] in COMPUTE_BOUND:
            pct_cublas = 100 * ratio if ratio else float("nan")
            flops = median([x["flops_pct"] for x in runs])
            roof = f"{flops:.1f}% of f16 peak; {pct_cublas:.0f}% of cuBLAS"
            gemm.append(pct_cublas)
            judge = verdict(v, best) if best else None
        else:
            pct = median([x["copy_bandwidth_pct"] for x in runs])
            roof = f"{pct:.1f}% of copy bw"
            mem_pct.append(pct)
            same = [x["same_size_copy_pct"] for x in runs if x.get("same_size_copy_pct") is not None]
            if same:
                roof += f"; {median(same):.1f}% of a same-size copy"
                same_pct.append(median(same))
            if nbytes and nbytes >= LARGE_BYTES:
                large_pct.append(pct)
            judge = verdict(v, best) if best else None
            if judge:
                judged[judge].append((r["kernel"], r["shape"], round(ratio, 3)))
        cells = [r["kernel"], r["shape"], timed([x["reference_us"] for x in runs])]
        if before:
            b = before.get((r["kernel"], r["shape"]))
            cells.append(f"{b['active_us']:.2f}" if b else "–")
        cells += [timed(v), timed(eager) if eager else "–", timed(comp) if comp else "–",
                  f"{ratio:.2f}x" if ratio else "–"]
        if rounds:
            cells.append({"tie": "within the spread"}.get(judge, judge or "–"))
        cells.append(roof)
        print("| " + " | ".join(cells) + " |")

    def geomean(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")

    print()
    print(f"copy bandwidth: {timed(copy_gbs, 0)} GB/s (kopt's ceiling, same session"
          + (f"; {len(benches)} bench rounds, {len(torches)} PyTorch rounds" if rounds else "") + ")")
    print(f"geomean copy-bandwidth share over {len(mem_pct)} memory-bound shapes: "
          f"{geomean(mem_pct):.1f}%")
    print(f"geomean over the {len(large_pct)} memory-bound shapes that move at least "
          f"{LARGE_BYTES >> 20} MB: {geomean(large_pct):.1f}%")
    if same_pct:
        print(f"geomean share of a same-size one-launch copy over {len(same_pct)} memory-bound "
              f"shapes: {geomean(same_pct):.1f}% ({benches[0].get('same_size_copy', '')})")
    print(f"GEMM share of cuBLAS: {', '.join(f'{x:.0f}%' for x in gemm)}")
    if rounds:
        print(f"memory-bound shapes against the best PyTorch, judged over the rounds: "
              f"{len(judged['faster'])} faster, {len(judged['tie'])} within the spread "
              f"{judged['tie']}, {len(judged['slower'])} slower {judged['slower']}")
    else:
        slower = judged["slower"]
        print(f"memory-bound shapes slower than the best PyTorch: {len(slower)} {slower}")


if __name__ == "__main__":
    main()
