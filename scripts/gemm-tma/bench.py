#!/usr/bin/env python3
"""Checks and times the TMA GEMM candidate (examples/llm-kernels/kopt/gemm/run-1796224274-r1c1/kernel.cu) against
torch.matmul (cuBLAS) and the accepted cp.async variant, on an H200, without kopt.

Modes:
  bench.py driver --build DIR [--deadline S]   run every configuration, each in its own
                                                subprocess, and print the table
  bench.py child --build DIR --config NAME     one configuration (what the driver runs)
  bench.py selftest                             no GPU: struct layouts, launch rules, maps

Each configuration is launched through the driver API exactly as kopt would: the kernel
from a cubin (nvcc) or from NVRTC's PTX (driver JIT), its dynamic shared memory limit
raised, the tensor maps encoded with cuTensorMapEncodeTiled from the parameters the
annotation declares (MAPS below), a cluster set at launch with cuLaunchKernelEx, on torch's
current stream. Timing: CUDA events around batches of launches that rotate over enough
copies of the inputs and output to defeat the L2, each batch queued behind a GPU sleep so
that Python's launch cost is not measured, kernel and torch.matmul batches interleaved;
the median per launch over the batches.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# ----------------------------------------------------------------------------------------
# Shapes: (m, n, k). The three declared ones are timed; the others are checked only.
TIMED_SHAPES = [(512, 4096, 4096), (2048, 4096, 4096), (4096, 4096, 4096)]
CHECK_SHAPES = [(300, 520, 200), (8, 4096, 4096), (129, 136, 72), (1000, 1032, 1000),
                (136, 264, 56)]
RTOL, ATOL = 2e-3, 1e-2

NUM_SMS = 132
SMEM_TMA = lambda d: 1024 + max(d["STAGES_WIDE"] * 49152, d["STAGES_NARROW"] * 32768) + 32768 + 256

TMA_DEFAULTS = {"WIDE_MIN_TILES": 100, "STAGES_WIDE": 4, "STAGES_NARROW": 6, "GROUP_M": 8}


def cdiv(a, b):
    return (a + b - 1) // b


# Configurations. kind "tma": gemm_f16_tma from the accepted variant's kernel.cu with `defines`; the
# launch rule's choices: cluster size for the wide (128x256) and narrow (128x128) paths,
# persistent grid or one CTA per tile, and the persistent cap (NUM_SMS, or "auto": the
# occupancy API's count of co-resident clusters). kind "base": the accepted variant.
CONFIGS = [
    dict(name="base", kind="base", defines={"WIDE_MIN_TILES": 100}),
    # The default: no cluster, persistent (first run: 99.2 / 99.6 / 99.1% of torch.matmul).
    dict(name="c1p", kind="tma", defines={}, cm_wide=1, cm_narrow=1, persistent=True),
    # The kopt path: NVRTC's PTX (compute_90a) of the default defines, JIT-compiled by the
    # driver at load, launched like c1p.
    dict(name="c1p_nvrtc", kind="tma", defines={}, cm_wide=1, cm_narrow=1, persistent=True,
         ptx=True),
    dict(name="c2p", kind="tma", defines={}, cm_wide=2, cm_narrow=2, persistent=True),
    dict(name="c2w1n", kind="tma", defines={}, cm_wide=2, cm_narrow=1, persistent=True),
    dict(name="c1np", kind="tma", defines={}, cm_wide=1, cm_narrow=1, persistent=False),
    dict(name="c2np", kind="tma", defines={}, cm_wide=2, cm_narrow=2, persistent=False),
    dict(name="c1p_g4", kind="tma", defines={"GROUP_M": 4}, cm_wide=1, cm_narrow=1,
         persistent=True),
    dict(name="c1p_g16", kind="tma", defines={"GROUP_M": 16}, cm_wide=1, cm_narrow=1,
         persistent=True),
    dict(name="c1p_g1", kind="tma", defines={"GROUP_M": 1}, cm_wide=1, cm_narrow=1,
         persistent=True),
    dict(name="wide_c1p", kind="tma", defines={"WIDE_MIN_TILES": 0}, cm_wide=1, cm_narrow=1,
         persistent=True),
    dict(name="narrow_c1p", kind="tma", defines={"WIDE_MIN_TILES": 1 << 30}, cm_wide=1,
         cm_narrow=1, persistent=True),
]
CONFIG_BY_NAME = {c["name"]: c for c in CONFIGS}


def tma_defines(cfg):
    d = dict(TMA_DEFAULTS)
    d.update(cfg.get("defines", {}))
    return d


def nvcc_flags(cfg):
    """-D flags for the cubin of a configuration (run.sh builds them)."""
    if cfg["kind"] == "base":
        return [f"-D{k}={v}" for k, v in cfg["defines"].items()]
    return [f"-D{k}={v}" for k, v in tma_defines(cfg).items()]


def launch_rule(cfg, m, n, k, max_clusters=None):
    """(grid, block, smem, cluster) of a configuration: the expressions the variant's launch
    rule would hold, in Python."""
    if cfg["kind"] == "base":
        wide = cdiv(m, 128) * cdiv(n, 256) >= cfg["defines"]["WIDE_MIN_TILES"]
        grid = (cdiv(n, 256) if wide else cdiv(n, 128), cdiv(m, 128), 1)
        return grid, (256, 1, 1), 197632, 1
    d = tma_defines(cfg)
    wide = cdiv(m, 128) * cdiv(n, 256) >= d["WIDE_MIN_TILES"]
    bn = 256 if wide else 128
    cm = cfg["cm_wide"] if wide else cfg["cm_narrow"]
    units = cdiv(cdiv(m, 128), cm) * cdiv(n, bn)
    if cfg["persistent"]:
        cap = NUM_SMS // cm
        if cfg.get("num_sms") == "auto" and max_clusters and max_clusters.get(cm):
            cap = min(cap, max_clusters[cm])
        gx = cm * min(units, cap)
    else:
        gx = cm * units
    return (gx, 1, 1), (384, 1, 1), SMEM_TMA(d), cm


# The tensor maps, as the annotation declares them (dims / box innermost first, strides
# packed, element strides 1, no interleave; oob_fill zero = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE).
# (buffer, dims(m, n, k), box, swizzle bytes, l2 promotion bytes)
MAPS = [
    ("a", lambda m, n, k: [k, m], [64, 128], 128, 256),
    ("b", lambda m, n, k: [n, k], [64, 64], 128, 256),
    ("c", lambda m, n, k: [n, m], [64, 64], 128, 0),
]
SWIZZLE_CODE = {0: 0, 32: 1, 64: 2, 128: 3}
L2_CODE = {0: 0, 64: 1, 128: 2, 256: 3}
CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6

# ----------------------------------------------------------------------------------------
# Driver API through ctypes.


class ClusterDim(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class LaunchAttrValue(ctypes.Union):
    # CUlaunchAttributeValue: a 64-byte union, 8-byte aligned (it holds pointers).
    _fields_ = [("pad", ctypes.c_char * 64), ("align", ctypes.c_uint64),
                ("clusterDim", ClusterDim)]


class LaunchAttr(ctypes.Structure):
    # CUlaunchAttribute: id, 4 bytes of padding, the value.
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", LaunchAttrValue)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttr)), ("numAttrs", ctypes.c_uint)]


CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_NUM_REGS = 4
CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3


class TensorMap:
    """A 128-byte CUtensorMap in a 64-byte aligned host buffer."""

    def __init__(self):
        self._raw = ctypes.create_string_buffer(128 + 128)
        base = ctypes.addressof(self._raw)
        self.addr = (base + 127) & ~127
        self.ptr = ctypes.c_void_p(self.addr)


class Cuda:
    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.lib.cuTensorMapEncodeTiled.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint), ctypes.c_int,
            ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self.lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p,
                                              ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        self.lib.cuOccupancyMaxActiveClusters.argtypes = [
            ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.POINTER(LaunchConfig)]
        self.lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        self.lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                                                 ctypes.c_void_p, ctypes.c_char_p]
        self.lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self.lib.cuFuncGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                                ctypes.c_void_p]
        self.lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]

    def check(self, r, what):
        if r != 0:
            s = ctypes.c_char_p()
            self.lib.cuGetErrorString(r, ctypes.byref(s))
            raise RuntimeError(f"{what}: CUDA error {r} ({(s.value or b'?').decode()})")

    def ensure_context(self):
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            raise RuntimeError("no current CUDA context (torch should have made one)")

    def load(self, image, entry):
        mod = ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(mod), image), "cuModuleLoadData")
        fn = ctypes.c_void_p()
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, entry.encode()),
                   "cuModuleGetFunction")
        return fn

    def func_attr(self, fn, attr):
        v = ctypes.c_int()
        self.check(self.lib.cuFuncGetAttribute(ctypes.byref(v), attr, fn), "cuFuncGetAttribute")
        return v.value

    def set_smem(self, fn, smem):
        self.check(self.lib.cuFuncSetAttribute(
            fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem), "cuFuncSetAttribute")

    def encode_map(self, ptr, dims, box, swizzle, l2):
        """cuTensorMapEncodeTiled for a packed fp16 tensor, dims/box innermost first."""
        tm = TensorMap()
        rank = len(dims)
        gdim = (ctypes.c_uint64 * rank)(*dims)
        strides, acc = [], 2
        for d in dims[:-1]:
            acc *= d
            strides.append(acc)  # bytes, dims 1 .. rank-1
        gstr = (ctypes.c_uint64 * max(1, rank - 1))(*strides)
        bdim = (ctypes.c_uint * rank)(*box)
        estr = (ctypes.c_uint * rank)(*([1] * rank))
        self.check(self.lib.cuTensorMapEncodeTiled(
            tm.ptr, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, rank, ctypes.c_void_p(ptr), gdim, gstr,
            bdim, estr, 0, SWIZZLE_CODE[swizzle], L2_CODE[l2], 0),
            f"cuTensorMapEncodeTiled(dims={dims}, box={box})")
        return tm

    def make_config(self, grid, block, smem, stream, cluster):
        cfg = LaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
        cfg.sharedMemBytes = smem
        cfg.hStream = ctypes.c_void_p(stream)
        if cluster > 1:
            attrs = (LaunchAttr * 1)()
            attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attrs[0].value.clusterDim.x = cluster
            attrs[0].value.clusterDim.y = 1
            attrs[0].value.clusterDim.z = 1
            cfg.attrs = attrs
            cfg.numAttrs = 1
            cfg._keep = attrs
        else:
            cfg.attrs = None
            cfg.numAttrs = 0
        return cfg

    def max_active_clusters(self, fn, block, smem, cluster):
        cfg = self.make_config((NUM_SMS * cluster, 1, 1), block, smem, 0, cluster)
        n = ctypes.c_int()
        self.check(self.lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), fn, ctypes.byref(cfg)),
                   "cuOccupancyMaxActiveClusters")
        return n.value


class Launch:
    """A prepared launch: its config and packed kernel parameters (kept alive here)."""

    def __init__(self, cuda, fn, cfg, args):
        self.cuda, self.fn, self.cfg, self.args = cuda, fn, cfg, args
        self.params = (ctypes.c_void_p * len(args))(
            *[ctypes.cast(a.ptr, ctypes.c_void_p) if isinstance(a, TensorMap)
              else ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])

    def __call__(self):
        r = self.cuda.lib.cuLaunchKernelEx(ctypes.byref(self.cfg), self.fn, self.params, None)
        if r != 0:
            self.cuda.check(r, "cuLaunchKernelEx")


def pack_args(cuda, cfg, a, b, c, m, n, k):
    """The kernel's argument list: maps + scalars for the TMA kernel, pointers + scalars for
    the accepted variant."""
    if cfg["kind"] == "base":
        return [ctypes.c_uint64(a.data_ptr()), ctypes.c_uint64(b.data_ptr()),
                ctypes.c_uint64(c.data_ptr()), ctypes.c_uint32(m), ctypes.c_uint32(n),
                ctypes.c_uint32(k)]
    bufs = {"a": a, "b": b, "c": c}
    maps = [cuda.encode_map(bufs[name].data_ptr(), dims(m, n, k), box, sw, l2)
            for name, dims, box, sw, l2 in MAPS]
    return maps + [ctypes.c_uint32(m), ctypes.c_uint32(n), ctypes.c_uint32(k)]


# ----------------------------------------------------------------------------------------
# Child: one configuration.


def run_child(args):
    import torch

    cfg = CONFIG_BY_NAME[args.config]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    cuda = Cuda()
    cuda.ensure_context()
    if cfg["kind"] == "base":
        image, entry = open(os.path.join(args.build, "base.cubin"), "rb").read(), "gemm_f16"
    elif cfg.get("ptx"):
        path = os.path.join(args.build, f"{cfg['name']}.ptx")
        image, entry = open(path, "rb").read() + b"\0", "gemm_f16_tma"
    else:
        image, entry = open(os.path.join(args.build, f"{cfg['name']}.cubin"), "rb").read(), \
            "gemm_f16_tma"
    fn = cuda.load(image, entry)
    _, block, smem, _ = launch_rule(cfg, 4096, 4096, 4096)
    cuda.set_smem(fn, smem)
    regs = cuda.func_attr(fn, CU_FUNC_ATTRIBUTE_NUM_REGS)
    local = cuda.func_attr(fn, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
    max_clusters = {1: NUM_SMS}
    if cfg["kind"] == "tma":
        for cl in (1, 2):
            try:
                max_clusters[cl] = cuda.max_active_clusters(fn, block, smem, cl)
            except RuntimeError as e:
                max_clusters[cl] = None
                emit({"type": "info", "config": cfg["name"], "occupancy_error": str(e)})
    emit({"type": "info", "config": cfg["name"], "regs": regs, "local_bytes": local,
          "max_active_clusters": max_clusters})
    stream = torch.cuda.current_stream().cuda_stream
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)

    def prepare(m, n, k, copies):
        a = [torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen)
             for _ in range(copies)]
        b = [torch.randn(k, n, device="cuda", dtype=torch.float16, generator=gen)
             for _ in range(copies)]
        c = [torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
             for _ in range(copies)]
        grid, block, smem, cluster = launch_rule(cfg, m, n, k, max_clusters)
        lcfgs = [cuda.make_config(grid, block, smem, stream, cluster) for _ in range(copies)]
        launches = [Launch(cuda, fn, lcfgs[i], pack_args(cuda, cfg, a[i], b[i], c[i], m, n, k))
                    for i in range(copies)]
        return a, b, c, launches, (grid, block, smem, cluster)

    def wait_or_die(what, seconds=10.0):
        ev = torch.cuda.Event()
        ev.record()
        t0 = time.time()
        while not ev.query():
            if time.time() - t0 > seconds:
                emit({"type": "error", "config": cfg["name"], "what": f"HANG in {what}"})
                sys.stdout.flush()
                os._exit(3)
            time.sleep(0.001)
        torch.cuda.synchronize()

    def check(m, n, k, a, b, c, launch):
        launch()
        wait_or_die(f"check {m}x{n}x{k}")
        ref = a.float() @ b.float()
        got = c.float()
        rms = ref.pow(2).mean(dim=1, keepdim=True).sqrt()
        allowed = ATOL + RTOL * torch.maximum(ref.abs(), rms)
        err = (got - ref).abs()
        bad = ~(err <= allowed)  # NaN (unwritten) counts as bad
        nbad = int(bad.sum().item())
        ratio = float((err / allowed).nan_to_num(float("inf")).max().item())
        first = None
        if nbad:
            idx = bad.nonzero()[0].tolist()
            first = {"row": idx[0], "col": idx[1], "got": float(got[idx[0], idx[1]].item()),
                     "want": float(ref[idx[0], idx[1]].item())}
        return nbad, ratio, first

    # Correctness on every shape (one copy).
    for (m, n, k) in CHECK_SHAPES + TIMED_SHAPES:
        a, b, c, launches, geo = prepare(m, n, k, 1)
        nbad, ratio, first = check(m, n, k, a[0], b[0], c[0], launches[0])
        emit({"type": "check", "config": cfg["name"], "shape": [m, n, k], "bad": nbad,
              "max_err_over_allowed": ratio, "first_bad": first, "grid": geo[0],
              "cluster": geo[3], "smem": geo[2]})
        del a, b, c, launches
    torch.cuda.empty_cache()

    # Timing, interleaved with torch.matmul on the same copies.
    for (m, n, k) in TIMED_SHAPES:
        per = 2 * (m * k + k * n + m * n)
        copies = max(2, math.ceil(args.rotate_mb * 2**20 / per))
        a, b, c, launches, geo = prepare(m, n, k, copies)
        tl = [lambda i=i: launches[i]() for i in range(copies)]
        tt = [lambda i=i: torch.matmul(a[i], b[i], out=c[i]) for i in range(copies)]
        for f in tl + tt + tl + tt:
            f()
        wait_or_die(f"warm-up {m}x{n}x{k}")
        batch = args.batch
        ev = []
        for r in range(args.reps):
            for which, fs in (("k", tl), ("t", tt)):
                torch.cuda._sleep(args.sleep_cycles)
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for i in range(batch):
                    fs[(r * batch + i) % copies]()
                e1.record()
                ev.append((which, e0, e1))
        wait_or_die(f"timing {m}x{n}x{k}", 60.0)
        tk = [e0.elapsed_time(e1) * 1000 / batch for w, e0, e1 in ev if w == "k"]
        tt_ = [e0.elapsed_time(e1) * 1000 / batch for w, e0, e1 in ev if w == "t"]
        # The last copies' outputs once more: a timing run that raced would show here.
        nbad, ratio, _ = check(m, n, k, a[-1], b[-1], c[-1], launches[-1])
        emit({"type": "time", "config": cfg["name"], "shape": [m, n, k],
              "us": statistics.median(tk), "us_min": min(tk), "us_max": max(tk),
              "torch_us": statistics.median(tt_), "torch_us_min": min(tt_),
              "copies": copies, "grid": geo[0], "cluster": geo[3], "recheck_bad": nbad})
        del a, b, c, launches, tl, tt
        torch.cuda.empty_cache()


def emit(obj):
    print("RESULT " + json.dumps(obj), flush=True)


# ----------------------------------------------------------------------------------------
# Driver: every configuration in its own process, then the table.


def run_driver(args):
    t_start = time.time()
    names = args.configs.split(",") if args.configs else [c["name"] for c in CONFIGS]
    results = []
    for name in names:
        cfg = CONFIG_BY_NAME[name]
        need = os.path.join(args.build, f"{name}.ptx" if cfg.get("ptx") else
                            ("base.cubin" if cfg["kind"] == "base" else f"{name}.cubin"))
        if not os.path.exists(need):
            print(f"[{name}] skipped: {need} missing (build failed?)", flush=True)
            continue
        left = args.deadline - (time.time() - t_start)
        if left < 15:
            print(f"[{name}] skipped: deadline", flush=True)
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "child", "--build", args.build,
               "--config", name, "--reps", str(args.reps), "--batch", str(args.batch),
               "--rotate-mb", str(args.rotate_mb), "--sleep-cycles", str(args.sleep_cycles)]
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True,
                               timeout=min(args.child_timeout, left))
            out, err, rc = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err, rc = "timeout", "timeout"
        got = [json.loads(l[7:]) for l in out.splitlines() if l.startswith("RESULT ")]
        results += got
        print(f"[{name}] rc={rc} in {time.time() - t0:.1f}s, {len(got)} results", flush=True)
        for r in got:
            if r["type"] in ("info", "error"):
                print("   ", json.dumps(r), flush=True)
            elif r["type"] == "check" and r["bad"]:
                print("    CHECK FAILED", json.dumps(r), flush=True)
        if rc != 0:
            tail = "\n".join((err or "").strip().splitlines()[-15:])
            print(f"    stderr tail:\n{tail}", flush=True)

    # Table.
    print()
    checks = {}
    for r in results:
        if r["type"] == "check":
            ok = checks.get(r["config"], True) and r["bad"] == 0
            checks[r["config"]] = ok
    fails = {r["config"] for r in results if r["type"] == "check" and r["bad"]}
    print(f"{'shape':>16} {'config':>11} {'us':>8} {'TFLOP/s':>8} {'torch us':>9} "
          f"{'% torch':>8} {'grid':>6} {'cl':>3} check")
    times = [r for r in results if r["type"] == "time"]
    for shape in TIMED_SHAPES:
        m, n, k = shape
        fl = 2.0 * m * n * k
        rows = [r for r in times if tuple(r["shape"]) == shape]
        for r in sorted(rows, key=lambda r: r["us"]):
            ok = "FAIL" if (r["config"] in fails or r["recheck_bad"]) else (
                "ok" if checks.get(r["config"]) else "?")
            print(f"{m:>5}x{n}x{k} {r['config']:>11} {r['us']:8.2f} {fl / r['us'] / 1e6:8.1f} "
                  f"{r['torch_us']:9.2f} {100 * r['torch_us'] / r['us']:7.1f}% "
                  f"{r['grid'][0]:>6} {r['cluster']:>3} {ok}")
        print()
    out_dir = os.environ.get("OUT") or os.path.join(HERE, "out")
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "gemm_tma_results.json"), "w") as f:
            json.dump(results, f, indent=1)
        print(f"results: {os.path.join(out_dir, 'gemm_tma_results.json')}")
    except OSError as e:
        print(f"results not saved: {e}")


# ----------------------------------------------------------------------------------------
# Self-test without a GPU.


def selftest():
    assert ctypes.sizeof(ClusterDim) == 12
    assert ctypes.sizeof(LaunchAttrValue) == 64, ctypes.sizeof(LaunchAttrValue)
    assert ctypes.sizeof(LaunchAttr) == 72, ctypes.sizeof(LaunchAttr)
    assert LaunchAttr.value.offset == 8
    assert ctypes.sizeof(LaunchConfig) == 56, ctypes.sizeof(LaunchConfig)
    assert LaunchConfig.hStream.offset == 32 and LaunchConfig.attrs.offset == 40
    assert LaunchConfig.numAttrs.offset == 48
    tm = TensorMap()
    assert tm.addr % 128 == 0
    for cfg in CONFIGS:
        for (m, n, k) in TIMED_SHAPES + CHECK_SHAPES:
            grid, block, smem, cl = launch_rule(cfg, m, n, k, {1: 132, 2: 66})
            assert grid[0] % cl == 0, (cfg["name"], m, n, k)
            assert smem <= 232448, smem
            if cfg["kind"] == "tma":
                assert block == (384, 1, 1)
                for name, dims, box, sw, l2 in MAPS:
                    d = dims(m, n, k)
                    assert (d[0] * 2) % 16 == 0, (name, d)  # row pitch multiple of 16 bytes
                    assert box[0] * 2 <= sw and all(1 <= x <= 256 for x in box)
        print(f"{cfg['name']:>11}: " + "  ".join(
            f"{m}x{n}x{k}: grid {launch_rule(cfg, m, n, k)[0][0]} cl {launch_rule(cfg, m, n, k)[3]}"
            for (m, n, k) in TIMED_SHAPES) + f"  smem {launch_rule(cfg, 1, 1, 1)[2]}  "
            f"flags {' '.join(nvcc_flags(cfg))}")
    # Argument packing: a launch's params point at the maps and at the scalars.
    fake = type("T", (), {"data_ptr": lambda self: 0x7f0000000000})()
    args = [TensorMap(), TensorMap(), TensorMap(), ctypes.c_uint32(4096), ctypes.c_uint32(4096),
            ctypes.c_uint32(512)]
    L = Launch(None, None, LaunchConfig(), args)
    assert L.params[0] == args[0].addr and L.params[3] == ctypes.addressof(args[3])
    assert ctypes.c_uint32.from_address(L.params[5]).value == 512
    base = pack_args(None, CONFIG_BY_NAME["base"], fake, fake, fake, 1, 2, 3)
    assert [type(x) for x in base] == [ctypes.c_uint64] * 3 + [ctypes.c_uint32] * 3
    print("selftest ok")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["driver", "child", "selftest", "flags"])
    ap.add_argument("--build", default=os.path.join(HERE, "build"))
    ap.add_argument("--config")
    ap.add_argument("--configs", default="")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--rotate-mb", type=int, default=256)
    ap.add_argument("--sleep-cycles", type=int, default=4_000_000)
    ap.add_argument("--deadline", type=float, default=170.0)
    ap.add_argument("--child-timeout", type=float, default=60.0)
    args = ap.parse_args()
    if args.mode == "selftest":
        selftest()
    elif args.mode == "flags":
        # name<TAB>kind<TAB>ptx<TAB>flags: what run.sh compiles.
        for c in CONFIGS:
            print(f"{c['name']}\t{c['kind']}\t{1 if c.get('ptx') else 0}\t{' '.join(nvcc_flags(c))}")
    elif args.mode == "child":
        run_child(args)
    else:
        run_driver(args)


if __name__ == "__main__":
    main()
