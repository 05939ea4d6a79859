#!/usr/bin/env python3
"""Runs the TMA GEMM on small shapes without torch (driver API + numpy only), so that it can
run under compute-sanitizer quickly (kopt's `verify` runs memcheck, racecheck, initcheck and
synccheck on accepted variants). Checks the result against numpy.

usage: compute-sanitizer --tool memcheck python3 sanitize.py --build DIR [--configs c1p,c2p]
"""
import argparse
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

SHAPES = [(300, 520, 200), (129, 136, 72), (256, 512, 128)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--configs", default="c1p,c2p")
    args = ap.parse_args()
    cuda = bench.Cuda()
    lib = cuda.lib
    cuda.check(lib.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    cuda.check(lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    cuda.check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    cuda.check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]

    class Buf:
        def __init__(self, arr):
            self.nbytes = arr.nbytes
            self.ptr = ctypes.c_uint64()
            cuda.check(lib.cuMemAlloc_v2(ctypes.byref(self.ptr), arr.nbytes), "cuMemAlloc")
            cuda.check(lib.cuMemcpyHtoD_v2(self.ptr.value, arr.ctypes.data, arr.nbytes),
                       "cuMemcpyHtoD")

        def data_ptr(self):
            return self.ptr.value

    rng = np.random.default_rng(7)
    ok = True
    for name in args.configs.split(","):
        cfg = bench.CONFIG_BY_NAME[name]
        image = open(os.path.join(args.build, f"{name}.cubin"), "rb").read()
        fn = cuda.load(image, "gemm_f16_tma" if cfg["kind"] == "tma" else "gemm_f16")
        _, _, smem, _ = bench.launch_rule(cfg, 1, 1, 1)
        cuda.set_smem(fn, smem)
        for (m, n, k) in SHAPES:
            a = rng.standard_normal((m, k)).astype(np.float16)
            b = rng.standard_normal((k, n)).astype(np.float16)
            c = np.full((m, n), np.nan, dtype=np.float16)
            A, B, C = Buf(a), Buf(b), Buf(c)
            grid, block, smem, cl = bench.launch_rule(cfg, m, n, k)
            lc = cuda.make_config(grid, block, smem, 0, cl)
            bench.Launch(cuda, fn, lc, bench.pack_args(cuda, cfg, A, B, C, m, n, k))()
            cuda.check(lib.cuCtxSynchronize(), "cuCtxSynchronize")
            cuda.check(lib.cuMemcpyDtoH_v2(c.ctypes.data, C.ptr.value, c.nbytes), "cuMemcpyDtoH")
            ref = a.astype(np.float32) @ b.astype(np.float32)
            rms = np.sqrt((ref ** 2).mean(axis=1, keepdims=True))
            allowed = bench.ATOL + bench.RTOL * np.maximum(np.abs(ref), rms)
            bad = int((~(np.abs(c.astype(np.float32) - ref) <= allowed)).sum())
            print(f"{name} {m}x{n}x{k} grid {grid[0]} cluster {cl}: {bad} bad", flush=True)
            ok &= bad == 0
            for buf in (A, B, C):
                lib.cuMemFree_v2(buf.ptr.value)
    print("sanitize run " + ("ok" if ok else "FAILED"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
