#!/usr/bin/env python3
"""PyTorch's own versions of examples/llm-kernels' suite, timed on the GPU: the bar the
kopt variants have to clear ("none slower than the faster of PyTorch eager and
torch.compile").

For every kernel and shape of scripts/suite_shapes.json (the annotations' shapes and
dtypes), PyTorch eager and torch.compile (dynamic=False; --mode picks the mode, the
output says which) are each timed two ways in the same run, and the faster median is
the figure:
  - graph: a CUDA graph of many back-to-back calls cycling over enough input copies to
    exceed 2x the L2 (as kopt times), replayed --reps times; median per call;
  - do_bench: triton.testing.do_bench (L2 flushed before every call), median.
The run also measures the ceilings: copy bandwidth (1 GiB device-to-device copy, read
plus write bytes), read bandwidth (torch.sum over 1 GiB) and cuBLAS's fp16 GEMM rate
(8192^3 on uniform(-1, 1) data).

Writes --out (JSON: device, versions, ceilings, one row per kernel, shape and impl with
the median µs of each method, GB/s and % of copy bandwidth, TFLOP/s and % of the cuBLAS
rate) and prints a table. torch.compile's compile time is bounded by --compile-budget-s:
shapes are compiled round-robin over the kernels (every kernel's first shape first), and
those left when the budget is spent are recorded as skipped.

  PYTHONUNBUFFERED=1 python3 scripts/torch_compare.py --out /tmp/torch_compare.json
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

KERNEL_ORDER = [
    "softmax",
    "rms_norm",
    "layer_norm",
    "sum",
    "transpose",
    "gqa_decode",
    "paged_decode",
    "silu_mul",
    "matmul",
]


def parse_args():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--shapes", default=os.path.join(here, "suite_shapes.json"))
    ap.add_argument("--kernels", default="", help="comma-separated subset of: " + ", ".join(KERNEL_ORDER))
    ap.add_argument(
        "--mode",
        default="default",
        choices=["default", "max-autotune-no-cudagraphs"],
        help="torch.compile mode (default: 'default', whose compile time fits the budget)",
    )
    ap.add_argument("--no-compile", action="store_true", help="eager only")
    ap.add_argument("--compile-budget-s", type=float, default=120.0)
    ap.add_argument("--reps", type=int, default=15, help="graph replays per measurement")
    ap.add_argument("--min-calls", type=int, default=32, help="calls per graph, at least")
    return ap.parse_args()


class Case:
    """One kernel at one shape: how to make its inputs, the PyTorch call, and its ideal
    bytes (every input read once, every output written once) and FLOPs."""

    def __init__(self, kernel, shape, make, fn, nbytes, flops, in_bytes):
        self.kernel, self.shape, self.make, self.fn = kernel, shape, make, fn
        self.nbytes, self.flops, self.in_bytes = nbytes, flops, in_bytes

    @property
    def label(self):
        return " ".join(f"{k}={v}" for k, v in self.shape.items())


def build_case(torch, F, kernel, spec, s):
    dt = getattr(torch, spec["dtype"])
    es = torch.empty((), dtype=dt).element_size()
    dev = "cuda"

    def randn(*size):
        return torch.randn(*size, device=dev, dtype=dt)

    def uniform(*size):
        return torch.rand(*size, device=dev, dtype=dt) + 0.5

    if kernel == "softmax":
        r, c = s["rows"], s["cols"]
        return Case(kernel, s, lambda: (randn(r, c),), lambda x: torch.softmax(x, -1),
                    2 * r * c * es, 5 * r * c, r * c * es)
    if kernel == "rms_norm":
        r, c, eps = s["rows"], s["cols"], spec.get("eps", 1e-5)
        return Case(kernel, s, lambda: (randn(r, c), uniform(c)),
                    lambda x, w: F.rms_norm(x, (c,), w, eps),
                    2 * r * c * es + c * es, 4 * r * c, (r * c + c) * es)
    if kernel == "layer_norm":
        r, c, eps = s["rows"], s["cols"], spec.get("eps", 1e-5)
        return Case(kernel, s, lambda: (randn(r, c), uniform(c), randn(c)),
                    lambda x, w, b: F.layer_norm(x, (c,), w, b, eps),
                    2 * r * c * es + 2 * c * es, 8 * r * c, (r * c + 2 * c) * es)
    if kernel == "sum":
        n = s["n"]
        return Case(kernel, s, lambda: (randn(n) + 1.0,), lambda x: x.sum(),
                    n * es + es, n, n * es)
    if kernel == "transpose":
        r, c = s["rows"], s["cols"]
        return Case(kernel, s, lambda: (randn(r, c),), lambda x: x.t().contiguous(),
                    2 * r * c * es, 0, r * c * es)
    if kernel == "gqa_decode":
        b, hq, hkv, sl = s["batch"], s["q_heads"], s["kv_heads"], s["seq_len"]
        d = spec.get("head_dim", 128)
        return Case(
            kernel, s,
            lambda: (randn(b, hq, 1, d), randn(b, hkv, sl, d), randn(b, hkv, sl, d)),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
            (2 * b * hq * d + 2 * b * hkv * sl * d) * es, 4 * b * hq * sl * d,
            (b * hq * d + 2 * b * hkv * sl * d) * es)
    if kernel == "paged_decode":
        return paged_decode_case(torch, F, spec, s, dt, es, dev)
    if kernel == "silu_mul":
        t, d = s["tokens"], s["d"]
        return Case(kernel, s, lambda: (randn(t, 2 * d),),
                    lambda x: F.silu(x[:, :d]) * x[:, d:],
                    3 * t * d * es, 4 * t * d, 2 * t * d * es)
    if kernel == "matmul":
        m, n, k = s["m"], s["n"], s["k"]
        return Case(kernel, s, lambda: (randn(m, k), randn(k, n)), lambda a, b: torch.matmul(a, b),
                    (m * k + k * n + m * n) * es, 2 * m * n * k, (m * k + k * n) * es)
    raise SystemExit(f"unknown kernel `{kernel}` in the shapes file (known: {', '.join(KERNEL_ORDER)})")


def spread(torch, lo, hi, n, dev):
    """kopt's `spread(lo..hi)` over n elements: lo + floor(i * (hi - lo) / n), shuffled."""
    vals = lo + torch.arange(n, dtype=torch.int64) * (hi - lo) // n
    return vals[torch.randperm(n)].to(device=dev, dtype=torch.int32)


def paged_decode_case(torch, F, spec, s, dt, es, dev):
    """GQA decode over a paged KV cache, the inputs as the annotation draws them: the block
    table a shuffled spread of the pages (a permutation: no page shared), the lengths spread
    from min_len to max_len. Plain PyTorch has no paged attention, so each call gathers every
    sequence's pages through the block table into contiguous K and V padded to max_pages *
    page_size keys (one indexing copy each, already in [batch, kv_heads, keys, head_dim]
    order), then runs scaled_dot_product_attention with a boolean mask of the padding. The
    q_heads / kv_heads query heads of a KV head go in as that head's query rows ([batch,
    kv_heads, group, head_dim]): the same attention as enable_gqa=True, and it keeps the
    fused (memory-efficient) backend, which takes the mask, where enable_gqa would fall back
    to the math backend and repeat K and V per query head. The ideal bytes are the kernel's:
    q and out, the table and lengths, and the K and V rows of the sequences (the annotation's
    figure, exact here)."""
    b, hq, hkv = s["batch"], s["q_heads"], s["kv_heads"]
    ps, mp, npg = s["page_size"], s["max_pages"], s["num_pages"]
    lo, hi = s["min_len"], s["max_len"]
    d = spec.get("head_dim", 128)
    group, keys_padded = hq // hkv, mp * ps
    keys = sum(lo + (i * (hi + 1 - lo)) // b for i in range(b))

    def make():
        return (torch.randn(b, hq, d, device=dev, dtype=dt),
                torch.randn(npg, hkv, ps, d, device=dev, dtype=dt),
                torch.randn(npg, hkv, ps, d, device=dev, dtype=dt),
                spread(torch, 0, npg, b * mp, dev).view(b, mp),
                spread(torch, lo, hi + 1, b, dev))

    def fn(q, k_cache, v_cache, block_table, seq_lens):
        pages = block_table.long().unsqueeze(1)                    # [b, 1, mp]
        heads = torch.arange(hkv, device=q.device).view(1, hkv, 1)  # [1, hkv, 1]
        # [b, hkv, mp, ps, d]: sequence b's pages of KV head h, in position order.
        k = k_cache[pages, heads].view(b, hkv, keys_padded, d)
        v = v_cache[pages, heads].view(b, hkv, keys_padded, d)
        pos = torch.arange(keys_padded, device=q.device, dtype=torch.int32)
        mask = (pos.view(1, keys_padded) < seq_lens.view(b, 1)).view(b, 1, 1, keys_padded)
        o = F.scaled_dot_product_attention(q.view(b, hkv, group, d), k, v, attn_mask=mask)
        return o.reshape(b, hq, d)

    return Case("paged_decode", s, make, fn,
                2 * b * hq * d * es + b * mp * 4 + b * 4 + 2 * keys * hkv * d * es,
                4 * hq * d * keys,
                (b * hq * d + 2 * npg * hkv * ps * d) * es + b * mp * 4 + b * 4)


def time_graph(torch, fn, input_sets, min_calls, reps):
    """Median µs per call of a CUDA graph of back-to-back calls over the input sets."""
    calls = max(min_calls, len(input_sets))
    seq = [input_sets[i % len(input_sets)] for i in range(calls)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as graphs want
        for ins in seq[:3]:
            fn(*ins)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for ins in seq:
            fn(*ins)
    per_call = events_median_us(torch, g.replay, warm=1, reps=reps) / calls
    del g
    return per_call, calls


def time_do_bench(fn, inputs):
    from triton.testing import do_bench

    return do_bench(lambda: fn(*inputs), warmup=25, rep=100, return_mode="median") * 1e3


def measure(torch, fn, case, l2, args):
    """Both methods; returns a dict of what each gave (or why not)."""
    n_sets = max(1, min(256, math.ceil(2 * l2 / max(1, case.in_bytes))))
    input_sets = [case.make() for _ in range(n_sets)]
    out = {"input_sets": n_sets, "l2_cold": n_sets * case.in_bytes > 2 * l2}
    fn(*input_sets[0])  # compiles (torch.compile), loads modules
    torch.cuda.synchronize()
    try:
        out["graph_us"], out["graph_calls"] = time_graph(torch, fn, input_sets, args.min_calls, args.reps)
    except Exception as e:  # a call that cannot be captured: do_bench still times it
        out["graph_error"] = f"{type(e).__name__}: {e}"
    try:
        out["do_bench_us"] = time_do_bench(fn, input_sets[0])
    except Exception as e:
        out["do_bench_error"] = f"{type(e).__name__}: {e}"
    del input_sets
    torch.cuda.empty_cache()
    figures = [(out[k], k[:-3]) for k in ("graph_us", "do_bench_us") if k in out]
    if figures:
        out["us"], out["method"] = min(figures)
    return out


def events_median_us(torch, fn, warm=3, reps=20):
    """Median µs of `fn()` between two CUDA events, after `warm` calls."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def ceilings(torch):
    n = 1 << 30
    src = torch.empty(n // 4, device="cuda", dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    copy_us = events_median_us(torch, lambda: dst.copy_(src))
    read_us = events_median_us(torch, lambda: src.sum())
    del src, dst
    a = torch.rand(8192, 8192, device="cuda", dtype=torch.float16) * 2 - 1
    b = torch.rand(8192, 8192, device="cuda", dtype=torch.float16) * 2 - 1
    mm_us = events_median_us(torch, lambda: torch.matmul(a, b), warm=3, reps=10)
    del a, b
    torch.cuda.empty_cache()
    return {
        "copy_gbs": 2 * n / (copy_us * 1e-6) / 1e9,
        "read_gbs": n / (read_us * 1e-6) / 1e9,
        "cublas_f16_tflops": 2 * 8192**3 / (mm_us * 1e-6) / 1e12,
        "method": "copy: 1 GiB dst.copy_(src), (read+write)/time; read: torch.sum over 1 GiB fp32; "
        "cuBLAS: torch.matmul 8192^3 fp16 on uniform(-1,1); CUDA events, median of 20 (matmul 10) after 3 warm-ups",
    }


def figures(case, us, ceil):
    f = {"gbs": case.nbytes / (us * 1e-6) / 1e9}
    f["pct_copy"] = 100 * f["gbs"] / ceil["copy_gbs"]
    if case.kernel == "matmul":
        f["tflops"] = case.flops / (us * 1e-6) / 1e12
        f["pct_cublas"] = 100 * f["tflops"] / ceil["cublas_f16_tflops"]
    return f


def main():
    args = parse_args()
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        raise SystemExit("torch_compare.py needs a CUDA GPU: torch.cuda.is_available() is False")
    with open(args.shapes) as fh:
        suite = json.load(fh)
    wanted = [k for k in KERNEL_ORDER if k in suite]
    if args.kernels:
        sel = [k.strip() for k in args.kernels.split(",") if k.strip()]
        unknown = [k for k in sel if k not in suite]
        if unknown:
            raise SystemExit(f"--kernels: {', '.join(unknown)} not in {args.shapes} (it has {', '.join(wanted)})")
        wanted = [k for k in wanted if k in sel]
    torch._dynamo.config.cache_size_limit = 64
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 60 * 1024 * 1024)
    t_start = time.time()
    ceil = ceilings(torch)
    print(f"device {props.name}: copy {ceil['copy_gbs']:.0f} GB/s, read {ceil['read_gbs']:.0f} GB/s, "
          f"cuBLAS fp16 {ceil['cublas_f16_tflops']:.0f} TFLOP/s, L2 {l2 / 2**20:.0f} MiB")

    # Round-robin over the kernels: every kernel's first shape, then every second one...
    jobs = []
    for i in range(max(len(suite[k]["shapes"]) for k in wanted)):
        for k in wanted:
            if i < len(suite[k]["shapes"]):
                jobs.append((k, suite[k]["shapes"][i]))
    compile_mode = None if args.mode == "default" else args.mode
    compile_spent = 0.0
    rows = []
    for kernel, shape in jobs:
        case = build_case(torch, F, kernel, suite[kernel], shape)
        impls = [("eager", case.fn)]
        if not args.no_compile:
            impls.append(("compile", None))
        for impl, fn in impls:
            row = {"kernel": kernel, "shape": shape, "label": case.label, "impl": impl,
                   "bytes": case.nbytes, "flops": case.flops}
            try:
                if impl == "compile":
                    if compile_spent >= args.compile_budget_s:
                        row["skipped"] = f"compile budget of {args.compile_budget_s:.0f} s spent"
                        rows.append(row)
                        print(f"{kernel:<11} {case.label:<42} {impl:<8} skipped ({row['skipped']})")
                        continue
                    fn = torch.compile(case.fn, dynamic=False, mode=compile_mode)
                    t0 = time.time()
                    fn(*case.make())
                    torch.cuda.synchronize()
                    row["compile_s"] = time.time() - t0
                    compile_spent += row["compile_s"]
                row.update(measure(torch, fn, case, l2, args))
                if "us" in row:
                    row.update(figures(case, row["us"], ceil))
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc(limit=2)
            rows.append(row)
            if "us" in row:
                extra = (f"{row['tflops']:7.1f} TFLOP/s ({row['pct_cublas']:5.1f}% cuBLAS)"
                         if "tflops" in row else f"{row['gbs']:7.0f} GB/s ({row['pct_copy']:5.1f}% copy)")
                print(f"{kernel:<11} {case.label:<42} {impl:<8} {row['us']:10.2f} µs  {extra}  [{row['method']}]")
            else:
                print(f"{kernel:<11} {case.label:<42} {impl:<8} failed: {row.get('error') or row.get('graph_error')}")

    result = {
        "device": props.name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "compile_mode": args.mode,
        "compile_dynamic": False,
        "timing": "per impl, the faster median of (a) a CUDA graph of back-to-back calls over input copies "
        "exceeding 2x L2 where memory allows (l2_cold), and (b) triton.testing.do_bench with L2 flushing",
        "ceilings": ceil,
        "l2_bytes": l2,
        "wall_s": time.time() - t_start,
        "rows": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print_table(rows, wanted, ceil)
    print(f"wrote {args.out} ({time.time() - t_start:.0f} s)")


def print_table(rows, wanted, ceil):
    by = {}
    for r in rows:
        by.setdefault((r["kernel"], r["label"]), {})[r["impl"]] = r
    print()
    print(f"{'kernel':<11} {'shape':<42} {'eager µs':>10} {'compile µs':>11} {'best':>8} {'best figure':>26}")
    pcts = []
    for k in wanted:
        for (kernel, label), impls in by.items():
            if kernel != k:
                continue
            e, c = impls.get("eager", {}), impls.get("compile", {})
            timed = [(r["us"], name, r) for name, r in (("eager", e), ("compile", c)) if "us" in r]
            best = min(timed, key=lambda t: t[0]) if timed else None
            fig = ""
            if best:
                r = best[2]
                if "tflops" in r:
                    fig = f"{r['tflops']:.1f} TFLOP/s ({r['pct_cublas']:.0f}% cuBLAS)"
                else:
                    fig = f"{r['gbs']:.0f} GB/s ({r['pct_copy']:.1f}% copy)"
                    pcts.append(r["pct_copy"])
            eu = f"{e['us']:.2f}" if "us" in e else "-"
            cu = f"{c['us']:.2f}" if "us" in c else ("skipped" if "skipped" in c else "-")
            print(f"{kernel:<11} {label:<42} {eu:>10} {cu:>11} {best[1] if best else '-':>8} {fig:>26}")
    if pcts:
        geo = math.exp(sum(math.log(max(p, 1e-9)) for p in pcts) / len(pcts))
        print(f"memory-bound shapes, faster PyTorch impl: geometric mean {geo:.1f}% of copy bandwidth "
              f"({ceil['copy_gbs']:.0f} GB/s) over {len(pcts)} shapes")


if __name__ == "__main__":
    sys.exit(main())
