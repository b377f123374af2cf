"""Runs llama.cpp's own RPC server (protocol 7.0.0) in this process; blocks until killed.

Usage: python ref_server.py PORT [--cache-dir DIR] [--threads N]

Equivalent to ``ggml-rpc-server -H 127.0.0.1 -p PORT -t N [-c]`` on the CPU device, through the
libraries of the llama-cpp-python wheel (ref: ggml-rpc-protocol.md §10.1, §11.6). A cache
directory given here is used as is (no ``/rpc`` suffix).
"""

import argparse
import ctypes
import sys

import _ggml


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    ggml = _ggml.ggml()
    rpc = _ggml.ggml_rpc()
    ggml.ggml_backend_load_all()
    cpu = ggml.ggml_backend_dev_by_name(b"CPU")
    if not cpu:
        print("ref_server: no CPU device in the ggml registry", file=sys.stderr)
        return 1
    devs = (ctypes.c_void_p * 1)(cpu)
    endpoint = f"127.0.0.1:{args.port}".encode()
    cache = args.cache_dir.encode() if args.cache_dir else None
    sys.stdout.flush()
    rpc.ggml_backend_rpc_start_server(endpoint, cache, args.threads, 1, devs)
    return 1  # start_server only returns when it could not bind or failed


if __name__ == "__main__":
    sys.exit(main())
