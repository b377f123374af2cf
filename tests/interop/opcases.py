"""Single-op graphs for differential tests: the ops and shapes a llama.cpp master sends for llama-family models.

Each case returns (nodes, inputs, outputs); tensors carry their input bytes. Shapes follow SmolLM2
(E=576, H=9, Hkv=3, D=64, F=1536) unless a case says otherwise (ref: ggml-compute-semantics.md §4.3, §4.4).
"""

import itertools
import struct

import numpy as np

from rpcclient import T, TYPES

COMPUTE = 16
OP = {
    "ADD": 2, "MUL": 7, "RMS_NORM": 25, "MUL_MAT": 29, "SCALE": 32, "CPY": 34, "CONT": 35, "RESHAPE": 36, "VIEW": 37,
    "PERMUTE": 38, "TRANSPOSE": 39, "GET_ROWS": 40, "SET_ROWS": 42, "SOFT_MAX": 46, "ROPE": 48,
    "FLASH_ATTN_EXT": 74, "UNARY": 91, "GLU": 100,
}

_ids = itertools.count(1)


def f32bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


def leaf(typ, ne, data, name=""):
    return T(next(_ids), typ, ne, name=name, data=data)


def node(typ, ne, op, src, params=(), nb=(), name=""):
    return T(next(_ids), typ, ne, nb=nb, op=OP[op], params=params, flags=COMPUTE, src=src, name=name)


def rand_f32(rng, n, scale=1.0):
    return (rng.standard_normal(n) * scale).astype(np.float32)


def rand_quant(rng, typ, n_elems):
    """Random blocks with sane f16 scales: real-looking weights of any quant type."""
    _, blck, size = TYPES[typ]
    nblocks = n_elems // blck
    raw = bytearray(rng.integers(0, 256, size=nblocks * size, dtype=np.uint8).tobytes())
    scale_fields = {  # byte offsets of the f16 scales inside a block, and their magnitude
        "q4_0": [(0, 0.02)], "q4_1": [(0, 0.01), (2, -0.08)], "q5_0": [(0, 0.01)], "q5_1": [(0, 0.005), (2, -0.08)],
        "q8_0": [(0, 0.002)], "iq4_nl": [(0, 0.002)],
        "q4_K": [(0, 0.003), (2, 0.003)], "q5_K": [(0, 0.002), (2, 0.002)], "q6_K": [(208, 0.0005)],
        "q2_K": [(80, 0.01), (82, 0.01)], "q3_K": [(108, 0.002)], "iq4_xs": [(0, 0.0005)],
    }[typ]
    for b in range(nblocks):
        for off, mag in scale_fields:
            v = np.float16(mag * (0.5 + rng.random()))
            raw[b * size + off : b * size + off + 2] = v.tobytes()
    return bytes(raw)


def case_mul_mat(rng, wtype, k, m, n):
    a = leaf(wtype, [k, m], rand_quant(rng, wtype, k * m) if wtype not in ("f32", "f16") else
             (rand_f32(rng, k * m, 0.05).astype(np.float16 if wtype == "f16" else np.float32)).tobytes(), "w")
    b = leaf("f32", [k, n], rand_f32(rng, k * n).tobytes(), "x")
    d = node("f32", [m, n], "MUL_MAT", [a, b])
    return [d], [a, b], [d]


def case_rms_norm_mul(rng, e=576, t=5):
    x = leaf("f32", [e, t], rand_f32(rng, e * t, 3.0).tobytes())
    w = leaf("f32", [e], rand_f32(rng, e).tobytes())
    n = node("f32", [e, t], "RMS_NORM", [x], params=[f32bits(1e-5)])
    m = node("f32", [e, t], "MUL", [n, w])
    return [n, m], [x, w], [m]


def case_add(rng, e=576, t=5):
    a = leaf("f32", [e, t], rand_f32(rng, e * t).tobytes())
    b = leaf("f32", [e, t], rand_f32(rng, e * t).tobytes())
    d = node("f32", [e, t], "ADD", [a, b])
    return [d], [a, b], [d]


def case_rope(rng, mode=0, d=64, h=9, t=5, freq_base=1e5):
    x = leaf("f32", [d, h, t], rand_f32(rng, d * h * t).tobytes())
    pos = leaf("i32", [t], np.arange(3, 3 + t, dtype=np.int32).tobytes())
    params = [0, d, mode, 0, 8192, f32bits(freq_base), f32bits(1.0), f32bits(0.0), f32bits(1.0), f32bits(32.0),
              f32bits(1.0)]
    r = node("f32", [d, h, t], "ROPE", [x, pos], params=params)
    return [r], [x, pos], [r]


def case_set_rows(rng, width=192, rows=5, kv=512):
    cache = leaf("f16", [width, kv], np.zeros(width * kv, dtype=np.float16).tobytes())
    src = leaf("f32", [width, rows], rand_f32(rng, width * rows).tobytes())
    idx = leaf("i64", [rows], np.array([7, 0, 300, 511, 42][:rows], dtype=np.int64).tobytes())
    v = T(next(_ids), "f16", [width, kv], op=OP["SET_ROWS"], flags=COMPUTE, src=[src, idx, cache], view_src=cache)
    return [v], [cache, src, idx], [cache]


def case_glu(rng, f=1536, t=5):
    g = leaf("f32", [f, t], rand_f32(rng, f * t, 2.0).tobytes())
    u = leaf("f32", [f, t], rand_f32(rng, f * t).tobytes())
    d = node("f32", [f, t], "GLU", [g, u], params=[2, 0])
    return [d], [g, u], [d]


def case_softmax(rng, nkv=256, t=5, h=9):
    kq = leaf("f32", [nkv, t, h], rand_f32(rng, nkv * t * h, 4.0).tobytes())
    mask = np.zeros((t, nkv), dtype=np.float32)
    for i in range(t):
        mask[i, 10 + i + 1 :] = -np.inf
    mk = leaf("f32", [nkv, t], mask.tobytes())
    d = node("f32", [nkv, t, h], "SOFT_MAX", [kq, mk], params=[f32bits(0.125), f32bits(0.0)])
    return [d], [kq, mk], [d]


def case_kq(rng, d=64, hkv=3, h=9, t=5, nkv=256, kv=512):
    """Non-FA attention scores: f16 K-cache view permuted × permuted Q (§4.4)."""
    cache = leaf("f16", [hkv * d, kv], (rand_f32(rng, hkv * d * kv)).astype(np.float16).tobytes())
    kview = T(next(_ids), "f16", [d, hkv, nkv], nb=[2, d * 2, hkv * d * 2, hkv * d * 2 * nkv], op=OP["VIEW"],
              src=[cache], view_src=cache)
    kperm = T(next(_ids), "f16", [d, nkv, hkv], nb=[2, hkv * d * 2, d * 2, hkv * d * 2 * nkv], op=OP["PERMUTE"],
              params=[0, 2, 1, 3], src=[kview], view_src=cache)
    q = leaf("f32", [d, h, t], rand_f32(rng, d * h * t).tobytes())
    qperm = T(next(_ids), "f32", [d, t, h], nb=[4, d * h * 4, d * 4, d * h * t * 4], op=OP["PERMUTE"],
              params=[0, 2, 1, 3], src=[q], view_src=q)
    kq = node("f32", [nkv, t, h], "MUL_MAT", [kperm, qperm], params=[10])
    return [kview, kperm, qperm, kq], [cache, q], [kq]


def case_flash_attn(rng, d=64, hkv=3, h=9, t=5, nkv=256, kv=512):
    cache_k = leaf("f16", [hkv * d, kv], rand_f32(rng, hkv * d * kv).astype(np.float16).tobytes())
    cache_v = leaf("f16", [hkv * d, kv], rand_f32(rng, hkv * d * kv).astype(np.float16).tobytes())

    def kv_view(cache):
        v = T(next(_ids), "f16", [d, hkv, nkv], nb=[2, d * 2, hkv * d * 2, hkv * d * 2 * nkv], op=OP["VIEW"],
              src=[cache], view_src=cache)
        p = T(next(_ids), "f16", [d, nkv, hkv], nb=[2, hkv * d * 2, d * 2, hkv * d * 2 * nkv], op=OP["PERMUTE"],
              params=[0, 2, 1, 3], src=[v], view_src=cache)
        return v, p

    kv_, kp = kv_view(cache_k)
    vv_, vp = kv_view(cache_v)
    q = leaf("f32", [d, h, t], rand_f32(rng, d * h * t).tobytes())
    qperm = T(next(_ids), "f32", [d, t, h], nb=[4, d * h * 4, d * 4, d * h * t * 4], op=OP["PERMUTE"],
              params=[0, 2, 1, 3], src=[q], view_src=q)
    mask = np.zeros((t, nkv), dtype=np.float16)
    for i in range(t):
        mask[i, 10 + i + 1 :] = -np.inf
    mk = leaf("f16", [nkv, t], mask.tobytes())
    out = node("f32", [d, h, t], "FLASH_ATTN_EXT", [qperm, kp, vp, mk],
               params=[f32bits(0.125), f32bits(0.0), f32bits(0.0), 10])
    return [kv_, kp, vv_, vp, qperm, out], [cache_k, cache_v, q, mk], [out]


def case_get_rows(rng, e=576, t=5):
    x = leaf("f32", [e, t], rand_f32(rng, e * t).tobytes())
    ids = leaf("i32", [1], np.array([t - 1], dtype=np.int32).tobytes())
    d = node("f32", [e, 1], "GET_ROWS", [x, ids])
    return [d], [x, ids], [d]


def all_cases():
    """(name, builder) pairs; each builder takes a numpy Generator."""
    cases = []
    for wtype in ["f32", "f16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K",
                  "iq4_nl", "iq4_xs"]:
        for n in (1, 5, 37):
            cases.append((f"mul_mat-{wtype}-n{n}", lambda r, w=wtype, n=n: case_mul_mat(r, w, 512, 384, n)))
    cases.append(("mul_mat-q4_1-smollm-ffn", lambda r: case_mul_mat(r, "q4_1", 576, 1536, 5)))
    cases.append(("mul_mat-q8_0-vocab", lambda r: case_mul_mat(r, "q8_0", 576, 4096, 1)))
    cases += [
        ("rms_norm+mul", case_rms_norm_mul),
        ("add", case_add),
        ("rope-normal", lambda r: case_rope(r, 0)),
        ("rope-neox", lambda r: case_rope(r, 2, freq_base=1e6)),
        ("set_rows-f16", case_set_rows),
        ("glu-swiglu", case_glu),
        ("soft_max-mask", case_softmax),
        ("mul_mat-kq-f16-permuted", case_kq),
        ("flash_attn_ext-f16", case_flash_attn),
        ("get_rows-f32", case_get_rows),
    ]
    return cases


def case_set_rows_v_transposed(rng, d=64, hkv=3, t=5, kv=512):
    """Non-FA V store: one element per row into the transposed V cache (§4.4)."""
    n = hkv * d
    cache = leaf("f16", [n * kv], rand_f32(rng, n * kv).astype(np.float16).tobytes())
    cache_r = T(next(_ids), "f16", [1, n * kv], op=OP["RESHAPE"], src=[cache], view_src=cache)
    src = leaf("f32", [1, t * n], rand_f32(rng, t * n).tobytes())
    cells = [3, 4, 5, 6, 7][:t]
    idx = np.array([c * kv + cells[tok] for tok in range(t) for c in range(n)], dtype=np.int64)
    ix = leaf("i64", [t * n], idx.tobytes())
    v = T(next(_ids), "f16", [1, n * kv], op=OP["SET_ROWS"], flags=COMPUTE, src=[src, ix, cache_r], view_src=cache)
    return [cache_r, v], [cache, src, ix], [cache]


def case_kqv(rng, d=64, hkv=3, h=9, t=5, nkv=256, kv=512):
    """Non-FA attention output: transposed f16 V view × softmax (§4.4)."""
    cache = leaf("f16", [hkv * d * kv], rand_f32(rng, hkv * d * kv).astype(np.float16).tobytes())
    vview = T(next(_ids), "f16", [nkv, hkv, d], nb=[2, kv * d * 2, kv * 2, kv * hkv * d * 2], op=OP["VIEW"],
              src=[cache], view_src=cache)
    vperm = T(next(_ids), "f16", [nkv, d, hkv], nb=[2, kv * 2, kv * d * 2, kv * hkv * d * 2], op=OP["PERMUTE"],
              params=[0, 2, 1, 3], src=[vview], view_src=cache)
    p = rng.random((h, t, nkv)).astype(np.float32)
    p /= p.sum(axis=2, keepdims=True)
    sm = leaf("f32", [nkv, t, h], p.tobytes())
    out = node("f32", [d, t, h], "MUL_MAT", [vperm, sm])
    return [vview, vperm, out], [cache, sm], [out]


def case_cont_permute(rng, d=64, h=9, t=5):
    x = leaf("f32", [d, t, h], rand_f32(rng, d * t * h).tobytes())
    p = T(next(_ids), "f32", [d, h, t], nb=[4, d * t * 4, d * 4, d * t * h * 4], op=OP["PERMUTE"], params=[0, 2, 1, 3],
          src=[x], view_src=x)
    c = node("f32", [d * h, t], "CONT", [p])
    return [p, c], [x], [c]


def case_scale(rng, n=4096):
    x = leaf("f32", [n], rand_f32(rng, n).tobytes())
    d = node("f32", [n], "SCALE", [x], params=[f32bits(0.125), f32bits(0.0)])
    return [d], [x], [d]


def extra_cases():
    return [
        ("set_rows-v-transposed", case_set_rows_v_transposed),
        ("mul_mat-kqv-f16-transposed-v", case_kqv),
        ("cont-permute", case_cont_permute),
        ("scale", case_scale),
    ]
