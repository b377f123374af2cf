"""llama.cpp's master loading a model onto RPC servers, held until told to let go (bench/load.py).

Usage: python lcpp_load.py MODEL HOST:PORT[,HOST:PORT...]   (run under the reference peer's Python)

Registers the RPC servers (ref: tests/interop/ref_master.py), loads MODEL with every layer offloaded
(``n_gpu_layers = 99``: llama.cpp's layer split over the servers by their free memory), prints one
JSON line ``{"load_s": ...}`` (the wall time of ``llama_model_load_from_file``, upload included) and
waits for a line on stdin before freeing the model, so that the caller can read the servers' memory
while the model is loaded.
"""

import json
import sys
import time

from lcpp_bench import register_rpc


def main() -> int:
    model_path, endpoints = sys.argv[1], [e for e in sys.argv[2].split(",") if e]
    register_rpc(endpoints)
    import llama_cpp  # after registration, so the registry already holds the RPC devices

    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = 99
    t0 = time.perf_counter()
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), mp)
    load_s = time.perf_counter() - t0
    if not model:
        print(json.dumps({"error": f"cannot load {model_path}"}), flush=True)
        return 1
    print(json.dumps({"load_s": load_s}), flush=True)
    sys.stdin.readline()
    llama_cpp.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
