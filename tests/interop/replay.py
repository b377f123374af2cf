"""Replays a captured master session against two RPC servers and finds the first graph node whose output differs.

Usage: python replay.py CAPTURE_DIR PORT_A PORT_B [--conn N] [--graph K]

CAPTURE_DIR comes from ``capture_session.py DIR --responses`` (no elision). Buffer handles and addresses are
remapped to what each server hands out (ref: ggml-rpc-protocol.md §4.2), so both servers compute from identical
inputs. At the K-th GRAPH_COMPUTE (default the first) the graph's node prefixes are recomputed in a bisection
and each prefix's last node is read back from both servers, which pins a numerical difference on one node.
"""

import argparse
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from rpcclient import RpcConn  # noqa: E402

CMD = {"ALLOC_BUFFER": 0, "GET_ALIGNMENT": 1, "GET_MAX_SIZE": 2, "BUFFER_GET_BASE": 3, "FREE_BUFFER": 4,
       "BUFFER_CLEAR": 5, "SET_TENSOR": 6, "SET_TENSOR_HASH": 7, "GET_TENSOR": 8, "COPY_TENSOR": 9,
       "GRAPH_COMPUTE": 10, "GET_DEVICE_MEMORY": 11, "INIT_TENSOR": 12, "GET_ALLOC_SIZE": 13, "HELLO": 14,
       "DEVICE_COUNT": 15, "GRAPH_RECOMPUTE": 16, "MEMSET_TENSOR": 17}
HAS_REPLY = {0, 1, 2, 3, 7, 8, 9, 11, 13, 14, 15}
OP_NAMES = {2: "ADD", 7: "MUL", 25: "RMS_NORM", 29: "MUL_MAT", 32: "SCALE", 34: "CPY", 35: "CONT", 40: "GET_ROWS",
            42: "SET_ROWS", 46: "SOFT_MAX", 48: "ROPE", 74: "FLASH_ATTN_EXT", 91: "UNARY", 100: "GLU"}
TYPE_SIZES = {0: (1, 4), 1: (1, 2), 3: (32, 20), 8: (32, 34), 26: (1, 4), 27: (1, 8)}


def frames(capture_dir, conn):
    index = json.load(open(os.path.join(capture_dir, f"conn-{conn:04d}.json")))
    req = open(os.path.join(capture_dir, f"conn-{conn:04d}.req"), "rb").read()
    rsp = open(os.path.join(capture_dir, f"conn-{conn:04d}.rsp"), "rb").read()
    pos = 0
    for f in index:
        cmd = CMD[f["cmd"]]
        payload = req[f["offset"] + 9 : f["offset"] + 9 + f["len"]]
        reply = None
        if cmd in HAS_REPLY:
            (n,) = struct.unpack_from("<Q", rsp, pos)
            reply = rsp[pos + 8 : pos + 8 + n]
            pos += 8 + n
        yield cmd, payload, reply


class Replayer:
    def __init__(self, port):
        self.c = RpcConn(port)
        self.handles = {}  # old handle -> new handle
        self.bases = {}  # old handle -> (old base, new base)

    def patch_tensor(self, buf, off):
        old_h, = struct.unpack_from("<Q", buf, off + 12)
        data, = struct.unpack_from("<Q", buf, off + 220)
        if old_h in self.handles:
            struct.pack_into("<Q", buf, off + 12, self.handles[old_h])
            ob, nb = self.bases.get(old_h, (0, 0))
            if data:
                struct.pack_into("<Q", buf, off + 220, data - ob + nb)

    def patch(self, cmd, payload):
        b = bytearray(payload)
        if cmd in (3, 4, 5):
            h, = struct.unpack_from("<Q", b, 0)
            struct.pack_into("<Q", b, 0, self.handles.get(h, h))
        elif cmd in (6, 7, 8, 12, 17):
            self.patch_tensor(b, 0)
        elif cmd == 9:
            self.patch_tensor(b, 0)
            self.patch_tensor(b, 296)
        elif cmd == 13:
            self.patch_tensor(b, 4)
            for i in range(10):
                self.patch_tensor(b, 300 + 296 * i)
        elif cmd == 10:
            n_nodes, = struct.unpack_from("<I", b, 4)
            table = 12 + 8 * n_nodes
            n_t, = struct.unpack_from("<I", b, table - 4)
            for i in range(n_t):
                self.patch_tensor(b, table + 296 * i)
        return bytes(b)

    def step(self, cmd, payload, old_reply):
        if cmd == 14:
            return None
        self.c._send(cmd, self.patch(cmd, payload))
        if cmd not in HAS_REPLY:
            return None
        (n,) = struct.unpack("<Q", self.c._recv_exact(8))
        reply = self.c._recv_exact(n)
        if cmd == 0:
            old_h, _ = struct.unpack("<QQ", old_reply)
            self.handles[old_h] = struct.unpack("<QQ", reply)[0]
        elif cmd == 3:
            new_h, = struct.unpack("<Q", self.patch(3, payload))
            old_h = [o for o, n_ in self.handles.items() if n_ == new_h][0]
            self.bases[old_h] = (struct.unpack("<Q", old_reply)[0], struct.unpack("<Q", reply)[0])
        return reply


def parse_graph(payload):
    n_nodes, = struct.unpack_from("<I", payload, 4)
    ids = list(struct.unpack_from(f"<{n_nodes}Q", payload, 8))
    table = 12 + 8 * n_nodes
    n_t, = struct.unpack_from("<I", payload, table - 4)
    descs = {}
    for i in range(n_t):
        d = payload[table + 296 * i : table + 296 * (i + 1)]
        tid, = struct.unpack_from("<Q", d, 0)
        descs.setdefault(tid, d)
    return ids, descs, payload[table:]


def nbytes(d):
    typ, = struct.unpack_from("<I", d, 8)
    ne = struct.unpack_from("<4I", d, 20)
    nb = struct.unpack_from("<4I", d, 36)
    blck, size = TYPE_SIZES.get(typ, (1, 4))
    if 0 in ne:
        return 0
    if blck == 1:
        return size + sum((ne[i] - 1) * nb[i] for i in range(4))
    return ne[0] * nb[0] // blck + sum((ne[i] - 1) * nb[i] for i in range(1, 4))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("capture")
    ap.add_argument("port_a", type=int)
    ap.add_argument("port_b", type=int)
    ap.add_argument("--conn", type=int, default=11)
    ap.add_argument("--graph", type=int, default=1)
    args = ap.parse_args()
    import numpy as np

    ra, rb = Replayer(args.port_a), Replayer(args.port_b)
    # Replay up to (not including) the K-th GRAPH_COMPUTE, remembering the graph inputs written since the
    # previous one: each bisection step rewrites them, since the graph's own nodes reuse their memory.
    seen, inputs, payload = 0, [], None
    for cmd, p, reply in frames(args.capture, args.conn):
        if cmd == 10:
            seen += 1
            if seen == args.graph:
                payload = p
                break
            inputs = []
        if cmd == 5:
            inputs = []
        if cmd == 6:
            inputs.append(p)
        ra.step(cmd, p, reply)
        rb.step(cmd, p, reply)
    ids, descs, table = parse_graph(payload)

    def node_out(r, k):
        for p in inputs:
            r.c._send(6, r.patch(6, p))
        blob = payload[:4] + struct.pack("<I", k) + payload[8 : 8 + 8 * k]
        blob += payload[8 + 8 * len(ids) : 12 + 8 * len(ids)] + table
        r.c._send(10, r.patch(10, blob))
        d = bytearray(descs[ids[k - 1]])
        get = bytes(d) + struct.pack("<QQ", 0, nbytes(d))
        r.c._send(8, r.patch(8, get))
        (n,) = struct.unpack("<Q", r.c._recv_exact(8))
        return r.c._recv_exact(n)

    def differs(k):
        a, b = node_out(ra, k), node_out(rb, k)
        d = descs[ids[k - 1]]
        typ, = struct.unpack_from("<I", d, 8)
        dt = {0: np.float32, 1: np.float16}.get(typ)
        if dt is None:
            return a != b, 0.0
        x = np.frombuffer(a, dtype=dt).astype(np.float64)
        y = np.frombuffer(b, dtype=dt).astype(np.float64)
        m = np.isfinite(x) & np.isfinite(y)
        return a != b, float(np.max(np.abs(x[m] - y[m]))) if m.any() else 0.0

    def describe(k):
        d = descs[ids[k - 1]]
        op, = struct.unpack_from("<I", d, 52)
        name = d[228:292].split(b"\0")[0].decode(errors="replace")
        return f"node {k - 1} {OP_NAMES.get(op, op)} '{name}'"

    print(f"graph {args.graph}: {len(ids)} nodes")
    for k in range(1, len(ids) + 1):
        diff, mx = differs(k)
        if diff or k % 100 == 0:
            print(f"  {describe(k):50s} bytes differ={diff} maxabs={mx:.3e}")
        if diff:
            break


if __name__ == "__main__":
    main()
