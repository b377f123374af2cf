#!/usr/bin/env python3
"""ggml's own quantizers, dequantizers and CPU dot products, for compute/tests/quant_peer.rs.

Usage: quant_ref.py JOBS, where each line of the JOBS file is one of
    to_float   TYPE N IN OUT      # IN: N elements of TYPE blocks → OUT: N f32
    from_float TYPE N IN OUT      # IN: N f32 → OUT: TYPE blocks (the CPU backend's from_float,
                                  #   what CPY and SET_ROWS use)
    vec_dot    TYPE N X Y OUT     # X: one row of TYPE, Y: one row of its vec_dot_type → OUT: f32
    bench_dot  TYPE N X Y OUT R   # as vec_dot, R times; OUT: the best seconds per call (text)
TYPE is ggml's numeric type id. Runs with the reference peer's Python (tests/peer/build-peer.sh).
"""

import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "interop"))
import _ggml  # noqa: E402


class Traits(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("blck", ctypes.c_int64),
        ("blck_interleave", ctypes.c_int64),
        ("size", ctypes.c_size_t),
        ("quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


class CpuTraits(ctypes.Structure):
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


BASE = _ggml.load("libggml-base")
CPU = _ggml.load("libggml-cpu")
BASE.ggml_get_type_traits.restype = ctypes.c_void_p
BASE.ggml_get_type_traits.argtypes = [ctypes.c_int]
CPU.ggml_get_type_traits_cpu.restype = ctypes.c_void_p
CPU.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
CPU.ggml_cpu_init.restype = None
CPU.ggml_cpu_init()

TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
)


def traits(ty):
    return Traits.from_address(BASE.ggml_get_type_traits(ty))


def cpu(ty):
    return CpuTraits.from_address(CPU.ggml_get_type_traits_cpu(ty))


def row_bytes(ty, n):
    t = traits(ty)
    assert n % t.blck == 0, (t.name, n)
    return n // t.blck * t.size


def run(line):
    f = line.split()
    mode, ty, n = f[0], int(f[1]), int(f[2])
    if mode == "to_float":
        src = open(f[3], "rb").read()
        assert len(src) == row_bytes(ty, n)
        inp = ctypes.create_string_buffer(src, len(src))
        out = ctypes.create_string_buffer(4 * n)
        TO_FLOAT(traits(ty).to_float)(ctypes.addressof(inp), ctypes.addressof(out), n)
        open(f[4], "wb").write(out.raw)
    elif mode == "from_float":
        src = open(f[3], "rb").read()
        assert len(src) == 4 * n
        fn = cpu(ty).from_float
        if not fn:
            raise SystemExit(f"type {ty}: ggml's CPU backend has no from_float")
        inp = ctypes.create_string_buffer(src, len(src))
        out = ctypes.create_string_buffer(row_bytes(ty, n))
        FROM_FLOAT(fn)(ctypes.addressof(inp), ctypes.addressof(out), n)
        open(f[4], "wb").write(out.raw)
    elif mode == "vec_dot":
        x = open(f[3], "rb").read()
        y = open(f[4], "rb").read()
        xb = ctypes.create_string_buffer(x, len(x))
        yb = ctypes.create_string_buffer(y, len(y))
        s = ctypes.c_float(0)
        VEC_DOT(cpu(ty).vec_dot)(n, ctypes.addressof(s), 0, ctypes.addressof(xb), 0, ctypes.addressof(yb), 0, 1)
        open(f[5], "wb").write(bytes(s))
    elif mode == "bench_dot":
        import time
        x = open(f[3], "rb").read()
        y = open(f[4], "rb").read()
        xb = ctypes.create_string_buffer(x, len(x))
        yb = ctypes.create_string_buffer(y, len(y))
        s = ctypes.c_float(0)
        fn = VEC_DOT(cpu(ty).vec_dot)
        args = (n, ctypes.addressof(s), 0, ctypes.addressof(xb), 0, ctypes.addressof(yb), 0, 1)
        best = float("inf")
        for _ in range(int(f[6])):
            t0 = time.perf_counter()
            fn(*args)
            best = min(best, time.perf_counter() - t0)
        open(f[5], "w").write(repr(best))
    else:
        raise SystemExit(f"unknown mode {mode}")


def main():
    for line in open(sys.argv[1]):
        if line.strip():
            run(line)


if __name__ == "__main__":
    main()
