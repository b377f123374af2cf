"""Compares the graphs two masters sent to an RPC server, op for op and shape for shape.

Usage: python graphdiff.py CAPTURE_A CAPTURE_B [--eval K ...] [--all] [--verbose]

Each capture is a directory written by ``proxy.py --capture`` (``capture_session.py``, or the
proxies ``test_graphs.py`` puts in front of a reference server). Every GRAPH_COMPUTE (and
GRAPH_RECOMPUTE, which reruns the connection's last graph) is one *evaluation*, in the order the
server received them. An evaluation's graph is put in a canonical form that leaves out what
differs between two masters computing the same thing: tensor ids (master-side pointers), buffer
handles and addresses. What stays:

- per node, in graph order: op, type, ``ne``, ``nb``, ``op_params`` (16 words), flags, and each
  source as either an earlier node's index or a leaf;
- a leaf (a tensor the graph reads but does not compute: weights, the KV cache, input tensors) as
  its type, ``ne``, ``nb`` and, for a view, its view offset and the leaf it views; weights (names
  ending ``.weight``/``.bias``) also by name.

Node names are reported but not compared (they are labels). The wire layout is that of 7.0.0
(ref: ggml-rpc-protocol.md §4.3 rpc_tensor, §6.10 GRAPH_COMPUTE) or 8.0.0 (ggml-rpc-protocol-8.md:
the graph id word in front), told apart by whether the 7.0.0 reading accounts for every byte.

Library: ``evaluations(capture_dir) -> [Graph]``, ``diff(a, b) -> [str]``.
"""

import argparse
import glob
import json
import os
import struct
import sys

OP_NAMES = [
    "NONE", "DUP", "ADD", "ADD_ID", "ADD1", "ACC", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG", "SIN", "COS",
    "SUM", "SUM_ROWS", "CUMSUM", "MEAN", "ARGMAX", "COUNT_EQUAL", "REPEAT", "REPEAT_BACK", "CONCAT",
    "SILU_BACK", "NORM", "RMS_NORM", "RMS_NORM_BACK", "GROUP_NORM", "L2_NORM", "MUL_MAT", "MUL_MAT_ID",
    "OUT_PROD", "SCALE", "SET", "CPY", "CONT", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "GET_ROWS",
    "GET_ROWS_BACK", "SET_ROWS", "DIAG", "DIAG_MASK_INF", "DIAG_MASK_ZERO", "SOFT_MAX", "SOFT_MAX_BACK",
    "ROPE", "ROPE_BACK", "CLAMP", "CONV_TRANSPOSE_1D", "IM2COL", "IM2COL_BACK", "IM2COL_3D", "CONV_2D",
    "CONV_3D", "CONV_2D_DW", "CONV_TRANSPOSE_2D", "POOL_1D", "POOL_2D", "POOL_2D_BACK", "UPSCALE", "PAD",
    "PAD_REFLECT_1D", "ROLL", "ARANGE", "TIMESTEP_EMBEDDING", "ARGSORT", "LEAKY_RELU", "TRI", "FILL",
    "FLASH_ATTN_EXT", "FLASH_ATTN_BACK", "SSM_CONV", "SSM_SCAN", "WIN_PART", "WIN_UNPART",
    "GET_REL_POS", "ADD_REL_POS", "RWKV_WKV6", "GATED_LINEAR_ATTN", "RWKV_WKV7", "SOLVE_TRI",
]
CMD_GRAPH_COMPUTE = "GRAPH_COMPUTE"
CMD_GRAPH_RECOMPUTE = "GRAPH_RECOMPUTE"
TENSOR_SIZE = 296


def op_name(op: int) -> str:
    return OP_NAMES[op] if op < len(OP_NAMES) else f"OP_{op}"


class Tensor:
    __slots__ = ("id", "type", "ne", "nb", "op", "params", "flags", "src", "view_src", "view_offs", "name")

    def __init__(self, d: bytes):
        self.id, self.type = struct.unpack_from("<QI", d, 0)
        self.ne = struct.unpack_from("<4I", d, 20)
        self.nb = struct.unpack_from("<4I", d, 36)
        self.op = struct.unpack_from("<I", d, 52)[0]
        params = list(struct.unpack_from("<16i", d, 56))
        while params and params[-1] == 0:
            params.pop()
        self.params = tuple(params)
        self.flags = struct.unpack_from("<i", d, 120)[0]
        self.src = struct.unpack_from("<10Q", d, 124)
        self.view_src, self.view_offs = struct.unpack_from("<QQ", d, 204)
        self.name = d[228:292].split(b"\0", 1)[0].decode("utf-8", errors="replace")


class Graph:
    """One evaluation: the nodes in order and the tensors by id."""

    def __init__(self, payload: bytes, v8: bool):
        off = 4  # device
        self.uid = None
        if v8:
            (self.uid,) = struct.unpack_from("<Q", payload, off)  # 8.0.0: the graph's uid
            off += 8
        (n_nodes,) = struct.unpack_from("<I", payload, off)
        off += 4
        ids = struct.unpack_from(f"<{n_nodes}Q", payload, off)
        off += 8 * n_nodes
        (n_t,) = struct.unpack_from("<I", payload, off)
        off += 4
        self.tensors = {}
        for i in range(n_t):
            t = Tensor(payload[off + TENSOR_SIZE * i : off + TENSOR_SIZE * (i + 1)])
            self.tensors.setdefault(t.id, t)
        self.nodes = [self.tensors[i] for i in ids]
        self.index = {t.id: k for k, t in enumerate(self.nodes)}

    def ref(self, tid: int, depth: int = 0):
        """A source reference without ids: an earlier node's index, or a leaf's description."""
        if tid == 0:
            return None
        if tid in self.index:
            return ("node", self.index[tid])
        t = self.tensors.get(tid)
        if t is None:
            return ("missing",)
        view = self.ref(t.view_src, depth + 1) if t.view_src and depth < 4 else None
        name = t.name if t.name.endswith((".weight", ".bias")) else ""
        return ("leaf", t.type, t.ne, t.nb, name, view, t.view_offs if t.view_src else 0)

    def canonical(self, k: int):
        t = self.nodes[k]
        return (
            op_name(t.op),
            t.type,
            t.ne,
            t.nb,
            t.params,
            t.flags,
            tuple(self.ref(s) for s in t.src),
            self.ref(t.view_src),
            t.view_offs if t.view_src else 0,
        )

    def describe(self, k: int) -> str:
        t = self.nodes[k]
        srcs = []
        for s in t.src:
            r = self.ref(s)
            if r is None:
                continue
            if r[0] == "node":
                srcs.append(f"#{r[1]}")
            elif r[0] == "leaf":
                srcs.append(f"leaf({r[4] or 'type ' + str(r[1])} {list(r[2])} nb={list(r[3])})")
            else:
                srcs.append("?")
        return (
            f"#{k} {op_name(t.op)} {t.name!r} type={t.type} ne={list(t.ne)} nb={list(t.nb)} "
            f"params={list(t.params)} flags={t.flags} src=[{', '.join(srcs)}]"
        )


def _conn_files(capture_dir):
    return sorted(glob.glob(os.path.join(capture_dir, "conn-*.json")))


def evaluations(capture_dir):
    """Every evaluation the server received, over all connections in order of connection."""
    out = []
    for index_path in _conn_files(capture_dir):
        frames = json.load(open(index_path))
        req = open(index_path[: -len(".json")] + ".req", "rb").read()
        v8 = False
        last = None
        stored = {}
        for f in frames:
            if f.get("elided"):
                continue
            payload = req[f["offset"] + 9 : f["offset"] + 9 + f["len"]]
            if f["cmd"] == CMD_GRAPH_COMPUTE:
                if last is None and len(payload) >= 16:
                    v8 = _looks_v8(payload)
                last = Graph(payload, v8)
                if last.uid:
                    stored[last.uid] = last
                out.append(last)
            elif f["cmd"] == CMD_GRAPH_RECOMPUTE:
                # 7.0.0 reruns the last graph; 8.0.0 names the stored graph by uid.
                g = stored.get(struct.unpack_from("<Q", payload, 4)[0]) if v8 and len(payload) >= 12 else last
                if g is not None:
                    out.append(g)
    return out


def _looks_v8(payload: bytes) -> bool:
    """7.0.0 reads (u32 device, u32 n_nodes, ...); 8.0.0 has a u64 uid between the two. A payload
    whose 7.0.0 reading accounts for every byte is 7.0.0."""
    try:
        (n_nodes,) = struct.unpack_from("<I", payload, 4)
        end = 8 + 8 * n_nodes
        (n_t,) = struct.unpack_from("<I", payload, end)
        if end + 4 + TENSOR_SIZE * n_t == len(payload):
            return False
    except struct.error:
        pass
    return True


def diff(a: Graph, b: Graph, limit: int = 12):
    """Differences between two evaluations, as readable lines (empty: the same graph)."""
    lines = []
    if len(a.nodes) != len(b.nodes):
        lines.append(f"node count: {len(a.nodes)} vs {len(b.nodes)}")
    for k in range(min(len(a.nodes), len(b.nodes))):
        if a.canonical(k) != b.canonical(k):
            lines.append(f"first difference at node {k}:\n  A {a.describe(k)}\n  B {b.describe(k)}")
            for j in range(max(0, k - 3), k):
                lines.append(f"  (before: A {a.describe(j)})")
            break
    if not lines[1:] and len(a.nodes) != len(b.nodes):
        k = min(len(a.nodes), len(b.nodes))
        extra = a if len(a.nodes) > k else b
        lines.append("  first extra node: " + extra.describe(k))
    return lines[: limit + 1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--eval", type=int, nargs="*", help="evaluation indices to compare (default: all)")
    ap.add_argument("--dump", action="store_true", help="print every node of the compared evaluations")
    args = ap.parse_args()
    ea, eb = evaluations(args.a), evaluations(args.b)
    print(f"evaluations: A {len(ea)}, B {len(eb)}")
    ks = args.eval if args.eval else range(min(len(ea), len(eb)))
    bad = 0
    for k in ks:
        d = diff(ea[k], eb[k])
        if args.dump:
            for name, g in (("A", ea[k]), ("B", eb[k])):
                print(f"--- eval {k} {name}: {len(g.nodes)} nodes")
                for j in range(len(g.nodes)):
                    print("  " + g.describe(j))
        if d:
            bad += 1
            print(f"eval {k}: DIFFERENT ({len(ea[k].nodes)} vs {len(eb[k].nodes)} nodes)")
            print("\n".join(d))
        else:
            print(f"eval {k}: same ({len(ea[k].nodes)} nodes)")
    return 1 if bad or len(ea) != len(eb) else 0


if __name__ == "__main__":
    sys.exit(main())
