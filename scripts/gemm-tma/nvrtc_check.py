#!/usr/bin/env python3
"""Compiles a .cu file with NVRTC the way kopt does (--gpu-architecture=compute_90a, the CUDA
include folders on the include path), for each set of -D defines given, and reports errors.

usage: nvrtc_check.py FILE.cu [--lib libnvrtc.so] [--include DIR]... [--ptx-out DIR]
                              [--defs "BN=256,STAGES=4"]...
"""
import argparse
import ctypes
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--lib", default=None)
    ap.add_argument("--include", action="append", default=[])
    ap.add_argument("--defs", action="append", default=[])
    ap.add_argument("--ptx-out", default=None)
    args = ap.parse_args()

    lib = args.lib
    if lib is None:
        home = os.environ.get("CUDA_HOME", "")
        lib = os.path.join(home, "lib", "libnvrtc.so")
    nvrtc = ctypes.CDLL(lib)
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    print(f"NVRTC {major.value}.{minor.value} ({lib})")

    src = open(args.file, "rb").read()
    incs = args.include or [os.path.join(os.environ.get("CUDA_HOME", ""), "include")]
    ok_all = True
    for defs in (args.defs or [""]):
        opts = ["--gpu-architecture=compute_90a"] + [f"-I{d}" for d in incs]
        for d in filter(None, defs.split(",")):
            opts.append(f"-D{d}")
        prog = ctypes.c_void_p()
        r = nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, os.path.basename(args.file).encode(),
                                     0, None, None)
        assert r == 0, nvrtc.nvrtcGetErrorString(r)
        copts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        r = nvrtc.nvrtcCompileProgram(prog, len(opts), copts)
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        status = "OK" if r == 0 else "FAILED: " + nvrtc.nvrtcGetErrorString(r).decode()
        print(f"[{defs or 'defaults'}] {status}")
        text = log.value.decode(errors="replace").strip()
        if text:
            print(text)
        if r == 0:
            nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
            ptx = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetPTX(prog, ptx)
            print(f"  PTX: {size.value} bytes")
            if args.ptx_out:
                os.makedirs(args.ptx_out, exist_ok=True)
                name = (defs.replace(",", "_").replace("=", "") or "default") + ".ptx"
                with open(os.path.join(args.ptx_out, name), "wb") as f:
                    f.write(ptx.value)
        else:
            ok_all = False
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
