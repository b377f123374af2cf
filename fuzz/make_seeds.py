#!/usr/bin/env python3
"""Builds the fuzz seed corpora under fuzz/corpus/<target>/ (not committed; scripts/fuzz.sh runs this).

Sources: the captured master session in tests/interop/captures/ (split into per-command seeds and
per-connection streams), SmolLM2's GGUF header (cut down: fewer key/values and tensors), synthetic
sessions whose buffer handles and base addresses are the ones a fresh llamad hands out, admin API
request bodies, and cache-index operation sequences.

usage: make_seeds.py [--model PATH] [OUT_DIR]
"""
import argparse
import hashlib
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAPTURES = os.path.join(ROOT, "tests", "interop", "captures")
CMD = {
    "ALLOC_BUFFER": 0, "GET_ALIGNMENT": 1, "GET_MAX_SIZE": 2, "BUFFER_GET_BASE": 3, "FREE_BUFFER": 4,
    "BUFFER_CLEAR": 5, "SET_TENSOR": 6, "SET_TENSOR_HASH": 7, "GET_TENSOR": 8, "COPY_TENSOR": 9,
    "GRAPH_COMPUTE": 10, "GET_DEVICE_MEMORY": 11, "INIT_TENSOR": 12, "GET_ALLOC_SIZE": 13, "HELLO": 14,
    "DEVICE_COUNT": 15, "GRAPH_RECOMPUTE": 16, "MEMSET_TENSOR": 17,
    # Protocol 8.0.0 (ggml-rpc-protocol-8.md).
    "SET_TENSOR_2D": 18, "GET_TENSOR_2D": 19, "COMM_INIT": 20, "COMM_ALLREDUCE": 21, "COMM_FREE": 22,
}
# A fresh llamad's first buffer (daemon/src/rpc/buffer.rs: FIRST_BASE; handle = counter(1) * 0x9e3779b97f4a7c15 | 1).
FIRST_BASE = 0x0000_1000_0000_0000
FIRST_HANDLE = (1 * 0x9E3779B97F4A7C15 | 1) & (2**64 - 1)
F32 = 0
OP_NONE, OP_ADD, OP_MUL, OP_RMS_NORM, OP_MUL_MAT, OP_SCALE, OP_SOFT_MAX = 0, 2, 7, 25, 29, 32, 46
FLAG_COMPUTE = 16


def put(out_dir, target, data, tag=""):
    d = os.path.join(out_dir, target)
    os.makedirs(d, exist_ok=True)
    name = (tag + "-" if tag else "") + hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def frame(cmd, payload):
    return struct.pack("<BQ", cmd, len(payload)) + payload


def read_frames(path):
    data = open(path, "rb").read()
    pos, out = 0, []
    while pos + 9 <= len(data):
        cmd, n = struct.unpack_from("<BQ", data, pos)
        out.append((cmd, data[pos + 9:pos + 9 + n]))
        pos += 9 + n
    return out


def tensor(tid, ne, buffer=0, data=0, op=OP_NONE, src=(), flags=0, op_params=(), name=b""):
    nb = [4]
    for i in range(3):
        nb.append(nb[-1] * ne[i])
    params = list(op_params) + [0] * (16 - len(op_params))
    srcs = list(src) + [0] * (10 - len(src))
    b = struct.pack("<QIQ4I4II16ii10QQQQ", tid, F32, buffer, *ne, *nb, op, *params, flags, *srcs, 0, 0, data)
    b += name[:63].ljust(64, b"\0") + struct.pack("<i", 0)
    assert len(b) == 296, len(b)
    return b


def graph(nodes, tensors, device=0):
    return struct.pack("<II", device, len(nodes)) + b"".join(struct.pack("<Q", n) for n in nodes) + \
        struct.pack("<I", len(tensors)) + b"".join(tensors)


def synthetic_sessions():
    """Valid sessions against a fresh llamad: buffer handle 1 at FIRST_BASE."""
    hello = frame(CMD["HELLO"], bytes(24))
    h, base, n = FIRST_HANDLE, FIRST_BASE, 16
    alloc = frame(CMD["ALLOC_BUFFER"], struct.pack("<IQ", 0, 64 * 1024))
    a = tensor(1, [n, 1, 1, 1], h, base, name=b"a")
    b = tensor(2, [n, 1, 1, 1], h, base + 256, name=b"b")
    w = tensor(5, [n, n, 1, 1], h, base + 4096, name=b"w")
    data = struct.pack(f"<{n}f", *[i * 0.5 for i in range(n)])
    sets = frame(CMD["SET_TENSOR"], a + b"\0" + struct.pack("<Q", 0) + data) + \
        frame(CMD["SET_TENSOR"], b + b"\0" + struct.pack("<Q", 0) + data) + \
        frame(CMD["SET_TENSOR"], w + b"\0" + struct.pack("<Q", 0) + data * n)
    out = []
    for op, srcs, params, ne in [
        (OP_ADD, (1, 2), (), [n, 1, 1, 1]),
        (OP_MUL, (1, 2), (), [n, 1, 1, 1]),
        (OP_RMS_NORM, (1,), (struct.unpack("<i", struct.pack("<f", 1e-6))[0],), [n, 1, 1, 1]),
        (OP_SCALE, (1,), (struct.unpack("<i", struct.pack("<f", 2.0))[0],), [n, 1, 1, 1]),
        (OP_SOFT_MAX, (1,), (), [n, 1, 1, 1]),
        (OP_MUL_MAT, (5, 1), (), [n, 1, 1, 1]),
    ]:
        c = tensor(3, ne, h, base + 512, op=op, src=srcs, flags=FLAG_COMPUTE, op_params=params, name=b"c")
        table = [a, b, w, c] if 5 in srcs else [a, b, c]
        g = frame(CMD["GRAPH_COMPUTE"], graph([3], table))
        get = frame(CMD["GET_TENSOR"], c + struct.pack("<QQ", 0, 4 * n))
        recompute = frame(CMD["GRAPH_RECOMPUTE"], struct.pack("<I", 0))
        free = frame(CMD["FREE_BUFFER"], struct.pack("<Q", h))
        out.append(hello + alloc + frame(CMD["BUFFER_GET_BASE"], struct.pack("<Q", h)) + sets + g + get +
                   recompute + get + free)
    return out


def synthetic_sessions_v8():
    """Valid 8.0.0 sessions: graphs with uids replayed by uid, 2D writes and reads, COMM_FREE, and an
    all-reduce before COMM_INIT (refused)."""
    hello = frame(CMD["HELLO"], bytes(24))
    h, base, n = FIRST_HANDLE, FIRST_BASE, 16
    alloc = frame(CMD["ALLOC_BUFFER"], struct.pack("<IQ", 0, 64 * 1024))
    a = tensor(1, [n, 1, 1, 1], h, base, name=b"a")
    b = tensor(2, [n, 1, 1, 1], h, base + 256, name=b"b")
    c = tensor(3, [n, 1, 1, 1], h, base + 512, op=OP_ADD, src=(1, 2), flags=FLAG_COMPUTE, name=b"c")
    rows = struct.pack("<8f", *[i * 0.25 for i in range(8)])
    set2d = frame(CMD["SET_TENSOR_2D"], a + struct.pack("<QQQQ", 8, 16, 2, 32) + rows)
    set_b = frame(CMD["SET_TENSOR"], b + b"\0" + struct.pack("<Q", 0) + rows * 2)
    g = struct.pack("<IQI", 0, 77, 1) + struct.pack("<Q", 3) + struct.pack("<I", 3) + a + b + c
    compute = frame(CMD["GRAPH_COMPUTE"], g)
    recompute = frame(CMD["GRAPH_RECOMPUTE"], struct.pack("<IQ", 0, 77))
    get2d = frame(CMD["GET_TENSOR_2D"], c + struct.pack("<QQQQ", 0, 16, 4, 16))
    free = frame(CMD["FREE_BUFFER"], struct.pack("<Q", h))
    comm_free = frame(CMD["COMM_FREE"], struct.pack("<I", 0))
    allreduce = frame(CMD["COMM_ALLREDUCE"], struct.pack("<I", 0) + c)
    return [
        hello + alloc + set2d + set_b + compute + get2d + recompute + get2d + comm_free + free,
        hello + alloc + compute + recompute + recompute + free + recompute,
        hello + alloc + set2d + allreduce,
    ]


def gguf_seeds(model):
    data = open(model, "rb").read(8 << 20)
    pos = 0

    def u32():
        nonlocal pos
        v = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        return v

    def u64():
        nonlocal pos
        v = struct.unpack_from("<Q", data, pos)[0]
        pos += 8
        return v

    def string():
        nonlocal pos
        n = u64()
        pos += n

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def value(t):
        nonlocal pos
        if t == 8:
            string()
        elif t == 9:
            et, n = u32(), u64()
            for _ in range(n):
                value(et)
        else:
            pos += sizes[t]

    assert data[:4] == b"GGUF"
    pos = 4
    version, n_tensors, n_kv = u32(), u64(), u64()
    kvs = []
    for _ in range(n_kv):
        start = pos
        string()
        value(u32())
        kvs.append(data[start:pos])
    infos = []
    for _ in range(n_tensors):
        start = pos
        string()
        nd = u32()
        dims = [u64() for _ in range(nd)]
        t = u32()
        off_at = pos
        u64()
        infos.append((data[start:off_at], dims, t))
    out = [data[:4096], data[:pos]]
    small_kvs = [k for k in kvs if len(k) < 4096]
    small_t = [(head, dims) for head, dims, t in infos if t == F32 and len(dims) == 1][:4]
    for nk in (4, len(small_kvs)):
        body = b"".join(small_kvs[:nk])
        ti, off = b"", 0
        for head, dims in small_t:
            ti += head + struct.pack("<Q", off)
            off += (dims[0] * 4 + 31) // 32 * 32
        hdr = b"GGUF" + struct.pack("<IQQ", version, len(small_t), nk) + body + ti
        hdr += bytes((-len(hdr)) % 32)
        out.append(hdr + bytes(off))
        out.append(b"GGUF" + struct.pack("<IQQ", version, 0, nk) + body)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.environ.get("LLAMAD_MODEL",
                    os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")))
    ap.add_argument("out", nargs="?", default=os.path.join(ROOT, "fuzz", "corpus"))
    args = ap.parse_args()
    out = args.out
    counts = {}

    def add(target, data, tag=""):
        put(out, target, data, tag)
        counts[target] = counts.get(target, 0) + 1

    # Captured traffic: per-command seeds and per-connection streams.
    for name in sorted(os.listdir(CAPTURES)):
        if not name.endswith(".req"):
            continue
        path = os.path.join(CAPTURES, name)
        frames = read_frames(path)
        stream = b""
        for cmd, payload in frames:
            add("command", bytes([cmd]) + payload, f"cmd{cmd}")
            if len(stream) + 9 + len(payload) <= 256 * 1024:
                stream += frame(cmd, payload)
        add("frame", stream, name[:-4])
        add("session", stream, name[:-4])
        # A window without HELLO, for the session target (it skips HELLO anyway) and truncated frames.
        for cut in (9, 33, 100, 1000):
            if len(stream) > cut:
                add("frame", stream[:cut], f"{name[:-4]}-cut{cut}")
    for s in synthetic_sessions_v8():
        add("session", s, "synthetic-v8")
        add("frame", s, "synthetic-v8")
        for cmd, payload in read_frames_bytes(s):
            add("command", bytes([cmd]) + payload, f"cmd{cmd}")
    for s in synthetic_sessions():
        add("session", s, "synthetic")
        add("frame", s, "synthetic")
        for cmd, payload in read_frames_bytes(s):
            add("command", bytes([cmd]) + payload, f"cmd{cmd}")
    # GGUF headers.
    if os.path.exists(args.model):
        for i, s in enumerate(gguf_seeds(args.model)):
            add("gguf", s, f"smollm2-{i}")
    else:
        print(f"warning: {args.model} missing, no GGUF seeds", file=sys.stderr)
    # Admin API request bodies (tag byte picks the type, see fuzz_targets/admin_body.rs).
    bodies = [
        (0, {"model": "/models/m.gguf", "prompt": "Hello", "n_predict": 8}),
        (0, {"model": "m.gguf", "prompt": "x", "n_predict": 4, "n_ctx": 512,
             "sampling": {"seed": 1, "temp": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
                          "repeat_penalty": 1.1, "repeat_last_n": 64}, "workers": ["10.0.0.2:50052"]}),
        (1, {"address": "127.0.0.1:50052", "labels": ["gpu", "rack1"]}),
        (2, {"digests": ["00" * 32]}),
        (2, {}),
        (3, {"path": "/models/m.gguf"}),
        (4, {"sort": "size", "limit": 10, "offset": 0}),
    ]
    for tag, body in bodies:
        add("admin_body", bytes([tag]) + json.dumps(body).encode(), "body")
    # Cache index: put/remove/touch sequences (see fuzz_targets/cache_index.rs for the encoding).
    def put_op(d, flags=3, label=b"t"):
        return bytes([0, d, flags, len(label)]) + label + struct.pack(">QQQQ", 100, 1, 2, 0)
    seqs = [
        bytes([0x00]) + put_op(1) + bytes([0x00, 2, 1]) + struct.pack(">Q", 5) + bytes([1]),
        bytes([0x81]) + put_op(1) + put_op(2, 7) + bytes([0x40, 1, 1]),
        bytes([0xC2]) + put_op(3, 0, b"") + put_op(3, 2) + put_op(4, 6),
    ]
    for s in seqs:
        add("cache_index", s, "ops")
    for k, v in sorted(counts.items()):
        print(f"{k}: {v} seeds")


def read_frames_bytes(data):
    pos, out = 0, []
    while pos + 9 <= len(data):
        cmd, n = struct.unpack_from("<BQ", data, pos)
        out.append((cmd, data[pos + 9:pos + 9 + n]))
        pos += 9 + n
    return out


if __name__ == "__main__":
    main()
