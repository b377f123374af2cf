"""A raw RPC 7.0.0 connection for replay.py: HELLO, then frames sent and read as they are.

Byte layouts follow ggml-rpc-protocol.md §3 (framing) and §5 (commands). The differential op tests
live in Rust (tests/tests/opdiff.rs over llamad_proto::RpcClient).
"""

import socket
import struct

CMD_HELLO = 14


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
