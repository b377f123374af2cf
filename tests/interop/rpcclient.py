"""A minimal RPC 7.0.0 client for differential tests: enough to upload tensors, run one graph and read the result.

Byte layouts follow ggml-rpc-protocol.md §3 (framing), §4.3 (rpc_tensor, 296 bytes), §5 (commands), §8.1 (graph blob).
"""

import socket
import struct
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

CMD_ALLOC_BUFFER = 0
CMD_GET_ALIGNMENT = 1
CMD_BUFFER_GET_BASE = 3
CMD_FREE_BUFFER = 4
CMD_SET_TENSOR = 6
CMD_GET_TENSOR = 8
CMD_GRAPH_COMPUTE = 10
CMD_HELLO = 14

# ggml_type values (ref: ggml-rpc-protocol.md §12.1): (value, block size, bytes per block).
TYPES = {
    "f32": (0, 1, 4), "f16": (1, 1, 2), "q4_0": (2, 32, 18), "q4_1": (3, 32, 20), "q5_0": (6, 32, 22),
    "q5_1": (7, 32, 24), "q8_0": (8, 32, 34), "q2_K": (10, 256, 84), "q3_K": (11, 256, 110),
    "q4_K": (12, 256, 144), "q5_K": (13, 256, 176), "q6_K": (14, 256, 210), "iq4_nl": (20, 32, 18),
    "iq4_xs": (23, 256, 136), "i32": (26, 1, 4), "i64": (27, 1, 8), "bf16": (30, 1, 2),
}

TENSOR_FMT = "<QIQ4I4II16ii10QQQQ64si"
assert struct.calcsize(TENSOR_FMT) == 296


@dataclass
class T:
    """A tensor of a single-op test graph."""

    id: int
    type: str
    ne: Sequence[int]
    nb: Sequence[int] = ()
    op: int = 0
    params: Sequence[int] = ()
    flags: int = 0
    src: Sequence[Optional["T"]] = ()
    view_src: Optional["T"] = None
    view_offs: int = 0
    offset: int = 0  # byte offset inside the test buffer (for views: view_src.offset + view_offs)
    name: str = ""
    data: bytes = b""

    def __post_init__(self):
        self.ne = list(self.ne) + [1] * (4 - len(self.ne))
        if not self.nb:
            _, blck, size = TYPES[self.type]
            nb0 = size
            nb1 = nb0 * (self.ne[0] // blck)
            self.nb = [nb0, nb1, nb1 * self.ne[1], nb1 * self.ne[1] * self.ne[2]]

    def nbytes(self) -> int:
        _, blck, size = TYPES[self.type]
        if 0 in self.ne:
            return 0
        if blck == 1:
            return size + sum((self.ne[i] - 1) * self.nb[i] for i in range(4))
        return self.ne[0] * self.nb[0] // blck + sum((self.ne[i] - 1) * self.nb[i] for i in range(1, 4))

    def pack(self, buffer: int, base: int) -> bytes:
        params = list(self.params) + [0] * (16 - len(self.params))
        src = [s.id if s is not None else 0 for s in self.src] + [0] * (10 - len(self.src))
        return struct.pack(
            TENSOR_FMT, self.id, TYPES[self.type][0], buffer, *self.ne, *self.nb, self.op, *params, self.flags,
            *src, self.view_src.id if self.view_src else 0, self.view_offs, base + self.offset,
            self.name.encode()[:63], 0,
        )


class RpcConn:
    """One connection to an RPC server (llamad or ggml-rpc-server)."""

    def __init__(self, port: int, host: str = "127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rsp = self._call(CMD_HELLO, bytes(24))
        if len(rsp) != 28 or rsp[0] != 7:
            raise RuntimeError(f"unexpected HELLO reply {rsp!r}")

    def close(self):
        self.sock.close()

    def _send(self, cmd: int, payload: bytes):
        self.sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)

    def _recv_exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("server closed the connection")
            out += chunk
        return bytes(out)

    def _call(self, cmd: int, payload: bytes) -> bytes:
        self._send(cmd, payload)
        (n,) = struct.unpack("<Q", self._recv_exact(8))
        return self._recv_exact(n)

    def alloc(self, size: int):
        handle, got = struct.unpack("<QQ", self._call(CMD_ALLOC_BUFFER, struct.pack("<IQ", 0, size)))
        if handle == 0:
            raise RuntimeError(f"ALLOC_BUFFER({size}) failed")
        (base,) = struct.unpack("<Q", self._call(CMD_BUFFER_GET_BASE, struct.pack("<Q", handle)))
        return handle, base, got

    def alignment(self) -> int:
        return struct.unpack("<Q", self._call(CMD_GET_ALIGNMENT, struct.pack("<I", 0)))[0]

    def set_tensor(self, t: T, buffer: int, base: int, data: bytes, offset: int = 0):
        self._send(CMD_SET_TENSOR, t.pack(buffer, base) + struct.pack("<BQ", 0, offset) + data)

    def get_tensor(self, t: T, buffer: int, base: int, size: int, offset: int = 0) -> bytes:
        return self._call(CMD_GET_TENSOR, t.pack(buffer, base) + struct.pack("<QQ", offset, size))

    def graph_compute(self, nodes: List[T], tensors: List[T], buffer: int, base: int):
        blob = struct.pack("<II", 0, len(nodes)) + b"".join(struct.pack("<Q", n.id) for n in nodes)
        blob += struct.pack("<I", len(tensors)) + b"".join(t.pack(buffer, base) for t in tensors)
        self._send(CMD_GRAPH_COMPUTE, blob)


def post_order(nodes: List[T]) -> List[T]:
    """Every tensor reachable from `nodes` through src and view_src, each once, sources first (§8.2)."""
    seen, out = set(), []

    def visit(t: T):
        if t is None or t.id in seen:
            return
        seen.add(t.id)
        for s in t.src:
            visit(s)
        visit(t.view_src)
        out.append(t)

    for n in nodes:
        visit(n)
    return out


def run_graph(port: int, nodes: List[T], inputs: List[T], outputs: List[T]) -> List[bytes]:
    """Places every tensor in one buffer, uploads `inputs`, computes `nodes`, returns the bytes of `outputs`."""
    conn = RpcConn(port)
    try:
        align = max(64, conn.alignment())
        tensors = post_order(nodes)
        off = 0
        for t in tensors:
            if t.view_src is not None:
                continue
            t.offset = off
            off += (t.nbytes() + align - 1) // align * align
        for t in tensors:
            if t.view_src is not None:
                t.offset = t.view_src.offset + t.view_offs
        buf, base, _ = conn.alloc(max(off, align))
        for t in inputs:
            conn.set_tensor(t, buf, base, t.data)
        conn.graph_compute(nodes, tensors, buf, base)
        return [conn.get_tensor(t, buf, base, t.nbytes()) for t in outputs]
    finally:
        conn.close()
