"""Protocol versions against the real llama.cpp master (llama-cpp-python 0.3.36, RPC protocol 7.0.0).

(a) llamad announcing 8.0.0 (its default) makes a 7.0.0 master fail exactly as an 8.0.0
    ``ggml-rpc-server`` would: the master's own "version mismatch" abort, with the same message as
    against a stand-in 8.0.0 server that answers HELLO with the bytes of ggml-rpc-protocol-8.md
    (``08 00 00 00`` and 24 zero bytes). llamad logs which version the peer probably expected.
(b) One llamad serving 8.0.0 on its port and 7.0.0 on ``--port-v7`` serves the 7.0.0 master on the
    second port, with llama.cpp's local CPU tokens.
"""

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

import peer
from test_interop import PROMPTS, assert_same_tokens, local_cpu


class Hello8Server:
    """Answers every HELLO with 8.0.0 (what an 8.0.0 ggml-rpc-server sends over TCP), then waits
    for the peer to leave."""

    def __init__(self):
        self.port = peer.free_port()
        self.sock = socket.create_server(("127.0.0.1", self.port))
        self.hellos = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                req = b""
                while len(req) < 33:
                    chunk = conn.recv(33 - len(req))
                    if not chunk:
                        break
                    req += chunk
                if req[:1] != b"\x0e" or len(req) != 33:
                    continue
                self.hellos += 1
                conn.sendall((28).to_bytes(8, "little") + bytes([8, 0, 0, 0]) + bytes(24))
                conn.settimeout(30)
                try:
                    while conn.recv(4096):
                        pass
                except OSError:
                    pass

    def close(self):
        self.sock.close()


def mismatch_line(log: str) -> str:
    m = re.search(r"[^\n]*version mismatch[^\n]*", log)
    assert m, f"no version-mismatch message in the master's output:\n{log[-3000:]}"
    return m.group(0).strip()


def failed_master(model, endpoint: str) -> str:
    """Runs ref_master.py against ``endpoint`` and returns its whole output (ggml's abort prints a
    long backtrace after the message, so the tail that peer.run_master keeps is not enough)."""
    with tempfile.TemporaryDirectory(prefix="interop-mismatch-") as tmp:
        args = os.path.join(tmp, "args.json")
        with open(args, "w") as f:
            json.dump({"model": model, "endpoints": [endpoint], "n_gpu_layers": 99, "prompts": PROMPTS[:1], "n_tokens": 4}, f)
        env = dict(os.environ, GGML_NO_BACKTRACE="1")
        proc = subprocess.run(
            [sys.executable, os.path.join(peer.HERE, "ref_master.py"), args, os.path.join(tmp, "out.json")],
            cwd=peer.HERE,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=120,
            env=env,
        )
    log = proc.stdout.decode("utf-8", errors="replace")
    assert proc.returncode != 0, f"a 7.0.0 master against {endpoint} (8.0.0) did not fail:\n{log[-3000:]}"
    return log


def test_master_7_fails_against_llamad_8_as_against_an_8_0_0_server(model):
    stand_in = Hello8Server()
    try:
        reference = mismatch_line(failed_master(model, stand_in.endpoint))
        assert stand_in.hellos >= 1
    finally:
        stand_in.close()
    assert "8.0.0" in reference, reference
    with peer.start_llamad(protocol=8) as w:
        ours = mismatch_line(failed_master(model, w.endpoint))
        # The master's message carries the server's version only: byte-identical HELLO answers give
        # identical messages.
        assert ours == reference, f"llamad: {ours!r}\nstand-in 8.0.0 server: {reference!r}"
        deadline = time.time() + 10
        while "probably speaks RPC protocol 7.0.0" not in w.log() and time.time() < deadline:
            time.sleep(0.1)
        assert "probably speaks RPC protocol 7.0.0" in w.log(), w.log()[-3000:]
        assert w.alive()


def test_master_7_on_the_port_v7_of_a_dual_llamad(model, report):
    base = local_cpu(model, report, False)
    port_v7 = peer.free_port()
    with peer.start_llamad(protocol=8, extra_args=["--port-v7", str(port_v7)]) as w:
        res = peer.run_master(model, PROMPTS, 32, endpoints=[f"127.0.0.1:{port_v7}"], timeout=300)
        assert_same_tokens("llamad --port-v7", res, base)
        assert "serving RPC protocol 7.0.0" in w.log() and "serving RPC protocol 8.0.0" in w.log()
