"""Runs llama.cpp's own RPC server (protocol 7.0.0) in this process; blocks until killed.

Usage: python ref_server.py [-H HOST] [-p PORT] [-t N] [-c | --cache-dir DIR]

Takes the flags of ``ggml-rpc-server`` (ref: ggml-rpc-protocol.md §10.1) and serves the CPU device
through the libraries of the llama-cpp-python wheel (§11.6). ``-c`` puts the cache where the
real server does (``$LLAMA_CACHE/rpc``, else ``$XDG_CACHE_HOME/llama.cpp/rpc``, else
``~/.cache/llama.cpp/rpc``); ``--cache-dir DIR`` uses DIR as is (no ``/rpc`` suffix).
"""

import argparse
import ctypes
import os
import sys

import _ggml


def cache_root() -> str:
    """ggml-rpc-server's cache root on Linux (ref: §9)."""
    if os.environ.get("LLAMA_CACHE"):
        return os.environ["LLAMA_CACHE"]
    if os.environ.get("XDG_CACHE_HOME"):
        return os.path.join(os.environ["XDG_CACHE_HOME"], "llama.cpp")
    return os.path.join(os.path.expanduser("~"), ".cache", "llama.cpp")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-H", "--host", default="127.0.0.1")
    ap.add_argument("-p", "--port", type=int, default=50052)
    ap.add_argument("-t", "--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("-c", "--cache", action="store_true")
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args()
    if args.cache and not args.cache_dir:
        args.cache_dir = os.path.join(cache_root(), "rpc")
    if args.cache_dir:
        os.makedirs(args.cache_dir, exist_ok=True)

    ggml = _ggml.ggml()
    rpc = _ggml.ggml_rpc()
    ggml.ggml_backend_load_all()
    cpu = ggml.ggml_backend_dev_by_name(b"CPU")
    if not cpu:
        print("ref_server: no CPU device in the ggml registry", file=sys.stderr)
        return 1
    devs = (ctypes.c_void_p * 1)(cpu)
    endpoint = f"{args.host}:{args.port}".encode()
    cache = args.cache_dir.encode() if args.cache_dir else None
    sys.stdout.flush()
    rpc.ggml_backend_rpc_start_server(endpoint, cache, args.threads, 1, devs)
    return 1  # start_server only returns when it could not bind or failed


if __name__ == "__main__":
    sys.exit(main())
