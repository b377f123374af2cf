"""A byte-counting TCP proxy for the ggml RPC protocol (7.0.0), with optional stream capture.

It forwards bytes unchanged between a master and a server, and parses both directions as it
goes: requests per ref: ggml-rpc-protocol.md §3.1 (``u8 cmd, u64 len, payload``), responses per
§3.2 (``u64 len, payload``), paired in order with the response-bearing requests of §5. It
counts frames and bytes per command type and records every SET_TENSOR_HASH (tensor size, name,
result) and SET_TENSOR data size, so a test can see whether a model load hit the server's
tensor cache (§9).

Library: ``with Proxy(upstream_port) as p: ... p.stats.snapshot()``.
CLI:     ``python proxy.py --listen PORT --upstream HOST:PORT [--capture DIR [--responses]
          [--elide-set-tensor-over BYTES]] [--stats FILE]``
         ``--capture DIR`` writes each connection's request stream to ``DIR/conn-NNNN.req`` (whole
         frames, in order) with a frame index ``DIR/conn-NNNN.json`` (command, payload length,
         offset in the file or ``elided``); ``--responses`` adds the response stream
         ``DIR/conn-NNNN.rsp``. ``--elide-set-tensor-over BYTES`` leaves out SET_TENSOR frames with
         more data than that (the weight uploads), so a model session fits in a small corpus; the
         stream stays well-framed because SET_TENSOR has no response. Buffer handles and
         addresses inside a capture are those the original server handed out.
"""

import argparse
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections import deque

CMD_NAMES = {
    0: "ALLOC_BUFFER",
    1: "GET_ALIGNMENT",
    2: "GET_MAX_SIZE",
    3: "BUFFER_GET_BASE",
    4: "FREE_BUFFER",
    5: "BUFFER_CLEAR",
    6: "SET_TENSOR",
    7: "SET_TENSOR_HASH",
    8: "GET_TENSOR",
    9: "COPY_TENSOR",
    10: "GRAPH_COMPUTE",
    11: "GET_DEVICE_MEMORY",
    12: "INIT_TENSOR",
    13: "GET_ALLOC_SIZE",
    14: "HELLO",
    15: "DEVICE_COUNT",
    16: "GRAPH_RECOMPUTE",
    17: "MEMSET_TENSOR",
}
# Commands that get a response frame (ref: §5); all others get none.
HAS_RESPONSE = {0, 1, 2, 3, 7, 8, 9, 11, 13, 14, 15}
SET_TENSOR = 6
SET_TENSOR_HASH = 7
HASH_THRESHOLD = 10 * 1024 * 1024  # ref: §2, master hashes writes strictly larger than this
RPC_TENSOR_SIZE = 296
# Bytes of a request payload the parser keeps: enough for any descriptor-bearing header.
KEEP_HEAD = 320

# ggml_type -> (block size, bytes per block); ref: §12.1
TYPE_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
    15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18),
    21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8),
    28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36),
    41: (128, 18), 42: (64, 18),
}


def cmd_name(cmd: int) -> str:
    return CMD_NAMES.get(cmd, f"CMD_{cmd}")


def tensor_info(desc: bytes) -> dict:
    """Type, shape, name and byte extent of a 296-byte rpc_tensor (ref: §4.3, §12.2)."""
    ttype = struct.unpack_from("<I", desc, 8)[0]
    ne = struct.unpack_from("<4I", desc, 20)
    nb = struct.unpack_from("<4I", desc, 36)
    name = desc[228:292].split(b"\0", 1)[0].decode("utf-8", errors="replace")
    nbytes = None
    if ttype in TYPE_SIZES:
        blck, size = TYPE_SIZES[ttype]
        if any(n == 0 for n in ne):
            nbytes = 0
        elif blck == 1:
            nbytes = size + sum((ne[i] - 1) * nb[i] for i in range(4))
        else:
            nbytes = ne[0] * nb[0] // blck + sum((ne[i] - 1) * nb[i] for i in range(1, 4))
    return {"type": ttype, "ne": list(ne), "name": name, "nbytes": nbytes}


class Stats:
    """Counters shared by all connections of one proxy. Thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.connections = 0
            self.commands = {}  # name -> {"count", "request_bytes", "response_bytes"}
            self.set_tensor = []  # {"data_len", "cache_flag", "name"}
            self.hash_requests = []  # {"name", "nbytes", "offset", "hash", "result"}
            self.protocol_errors = []

    def _cmd(self, name: str) -> dict:
        return self.commands.setdefault(name, {"count": 0, "request_bytes": 0, "response_bytes": 0})

    def on_request(self, cmd: int, length: int, head: bytes) -> None:
        with self.lock:
            c = self._cmd(cmd_name(cmd))
            c["count"] += 1
            c["request_bytes"] += 9 + length
            if cmd == SET_TENSOR and len(head) >= 305:
                info = tensor_info(head[:RPC_TENSOR_SIZE])
                self.set_tensor.append({"data_len": length - 305, "cache_flag": head[296], "name": info["name"]})

    def on_response(self, cmd: int, length: int, payload: bytes, request_head: bytes) -> None:
        with self.lock:
            self._cmd(cmd_name(cmd))["response_bytes"] += 8 + length
            if cmd == SET_TENSOR_HASH and len(request_head) >= 312:
                info = tensor_info(request_head[:RPC_TENSOR_SIZE])
                offset, fnv = struct.unpack_from("<QQ", request_head, 296)
                result = payload[0] if length == 1 and payload else None
                self.hash_requests.append(
                    {"name": info["name"], "nbytes": info["nbytes"], "offset": offset, "hash": f"{fnv:016x}", "result": result}
                )

    def on_error(self, msg: str) -> None:
        with self.lock:
            self.protocol_errors.append(msg)

    def snapshot(self) -> dict:
        """A JSON-able copy of all counters, plus the cache summary used by the tests."""
        with self.lock:
            big = [s for s in self.set_tensor if s["data_len"] > HASH_THRESHOLD]
            return {
                "connections": self.connections,
                "commands": {k: dict(v) for k, v in self.commands.items()},
                "set_tensor_count": len(self.set_tensor),
                "set_tensor_data_bytes": sum(s["data_len"] for s in self.set_tensor),
                "set_tensor_big_count": len(big),
                "set_tensor_big_bytes": sum(s["data_len"] for s in big),
                "set_tensor_flagged_count": sum(1 for s in self.set_tensor if s["cache_flag"]),
                "hash_requests": [dict(h) for h in self.hash_requests],
                "hash_hits": sum(1 for h in self.hash_requests if h["result"] == 1),
                "hash_misses": sum(1 for h in self.hash_requests if h["result"] == 0),
                "protocol_errors": list(self.protocol_errors),
            }


class _Conn:
    """One proxied connection: two pump threads and the request/response parsers."""

    def __init__(self, proxy: "Proxy", index: int, client: socket.socket, upstream: socket.socket):
        self.proxy = proxy
        self.index = index
        self.client = client
        self.upstream = upstream
        self.pending = deque()  # (cmd, request head) awaiting a response, FIFO (ref: §3.4)
        self.pending_lock = threading.Lock()
        self.req_file = self.rsp_file = None
        self.frames = []  # capture index: one entry per request frame
        if proxy.capture_dir:
            base = os.path.join(proxy.capture_dir, f"conn-{index:04d}")
            self.req_file = open(base + ".req", "wb")
            if proxy.capture_responses:
                self.rsp_file = open(base + ".rsp", "wb")

    def _elide(self, cmd: int, length: int) -> bool:
        limit = self.proxy.elide_set_tensor_over
        return cmd == SET_TENSOR and limit is not None and length - 305 > limit

    # --- request parser (client -> server) ---
    def parse_requests(self):
        buf = bytearray()
        out = self.req_file
        while True:
            while len(buf) < 9:
                data = yield
                buf += data
            cmd = buf[0]
            length = struct.unpack_from("<Q", buf, 1)[0]
            header = bytes(buf[:9])
            del buf[:9]
            want = min(length, KEEP_HEAD)
            while len(buf) < want:
                data = yield
                buf += data
            head = bytes(buf[:want])
            del buf[:want]
            # Captured frames are written whole; elided ones (big weight uploads) are left out,
            # which keeps the stream well-framed since SET_TENSOR has no response (§5).
            keep = out is not None and not self._elide(cmd, length)
            if out is not None:
                self.frames.append(
                    {"cmd": cmd_name(cmd), "len": length, "offset": out.tell() if keep else None, "elided": not keep}
                )
            if keep:
                out.write(header + head)
            remaining = length - len(head)
            while remaining > 0:
                if not buf:
                    data = yield
                    buf += data
                take = min(remaining, len(buf))
                if keep:
                    out.write(buf[:take])
                del buf[:take]
                remaining -= take
            if cmd not in CMD_NAMES:
                self.proxy.stats.on_error(f"conn {self.index}: unknown command byte {cmd}")
            self.proxy.stats.on_request(cmd, length, head)
            if cmd in HAS_RESPONSE:
                with self.pending_lock:
                    self.pending.append((cmd, head))

    # --- response parser (server -> client) ---
    def parse_responses(self):
        buf = bytearray()
        while True:
            while len(buf) < 8:
                data = yield
                buf += data
            length = struct.unpack_from("<Q", buf, 0)[0]
            del buf[:8]
            with self.pending_lock:
                req = self.pending.popleft() if self.pending else None
            if req is None:
                self.proxy.stats.on_error(f"conn {self.index}: response frame without a pending request")
                req = (255, b"")
            want = min(length, KEEP_HEAD)
            while len(buf) < want:
                data = yield
                buf += data
            payload = bytes(buf[:want])
            del buf[:want]
            remaining = length - want
            while remaining > 0:
                if not buf:
                    data = yield
                    buf += data
                take = min(remaining, len(buf))
                del buf[:take]
                remaining -= take
            self.proxy.stats.on_response(req[0], length, payload, req[1])

    def pump(self, src: socket.socket, dst: socket.socket, parser, capture):
        next(parser)
        try:
            while True:
                data = src.recv(1 << 20)
                if not data:
                    break
                if capture:
                    capture.write(data)
                # Parse before forwarding, so a request is queued before its response can arrive.
                parser.send(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def run(self):
        t_up = threading.Thread(target=self.pump, args=(self.client, self.upstream, self.parse_requests(), None), daemon=True)
        t_down = threading.Thread(target=self.pump, args=(self.upstream, self.client, self.parse_responses(), self.rsp_file), daemon=True)
        t_up.start()
        t_down.start()
        t_up.join()
        t_down.join()
        for s in (self.client, self.upstream):
            s.close()
        for f in (self.req_file, self.rsp_file):
            if f:
                f.close()
        if self.req_file:
            with open(os.path.join(self.proxy.capture_dir, f"conn-{self.index:04d}.json"), "w") as f:
                json.dump(self.frames, f, indent=0)


class Proxy:
    """Listens on 127.0.0.1:listen_port (0 = any free port) and forwards to upstream_host:upstream_port."""

    def __init__(
        self,
        upstream_port: int,
        upstream_host: str = "127.0.0.1",
        listen_port: int = 0,
        capture_dir=None,
        capture_responses: bool = False,
        elide_set_tensor_over=None,
    ):
        self.upstream = (upstream_host, upstream_port)
        self.capture_dir = capture_dir
        self.capture_responses = capture_responses
        self.elide_set_tensor_over = elide_set_tensor_over
        if capture_dir:
            os.makedirs(capture_dir, exist_ok=True)
        self.stats = Stats()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", listen_port))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self._n = 0
        self._closed = False
        self._threads = []
        self._threads_lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept_loop(self):
        while not self._closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError as e:
                self.stats.on_error(f"upstream connect failed: {e}")
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._n += 1
            with self.stats.lock:
                self.stats.connections += 1
            conn = _Conn(self, self._n, client, upstream)
            t = threading.Thread(target=conn.run, daemon=True)
            with self._threads_lock:
                self._threads.append(t)
            t.start()

    def wait_closed(self, timeout: float = 10.0) -> bool:
        """Waits until every connection accepted so far has closed and been fully counted
        (and its capture files written). Call after the master process has exited."""
        deadline = time.monotonic() + timeout
        with self._threads_lock:
            threads = list(self._threads)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    def close(self):
        self._closed = True
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", type=int, required=True, help="port to listen on (127.0.0.1)")
    ap.add_argument("--upstream", required=True, help="HOST:PORT of the RPC server")
    ap.add_argument("--capture", metavar="DIR", help="write each connection's request stream (and a frame index)")
    ap.add_argument("--responses", action="store_true", help="with --capture: also write the response streams")
    ap.add_argument(
        "--elide-set-tensor-over",
        metavar="BYTES",
        type=int,
        default=None,
        help="with --capture: leave SET_TENSOR frames carrying more than BYTES of data out of the capture",
    )
    ap.add_argument("--stats", metavar="FILE", help="write the counters as JSON here on exit (SIGINT/SIGTERM)")
    args = ap.parse_args()
    host, port = args.upstream.rsplit(":", 1)
    proxy = Proxy(int(port), host, args.listen, args.capture, args.responses, args.elide_set_tensor_over)
    print(f"proxy 127.0.0.1:{proxy.port} -> {args.upstream}", file=sys.stderr, flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    proxy.close()
    proxy.wait_closed()
    snap = proxy.stats.snapshot()
    text = json.dumps(snap, indent=1)
    if args.stats:
        with open(args.stats, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
