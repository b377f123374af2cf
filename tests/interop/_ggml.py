"""ctypes access to the ggml libraries shipped inside the llama-cpp-python wheel.

Only the ``.so.0`` files are loaded: they carry the soname that ``libllama`` links against, so
every library in the process shares one ggml backend registry. Loading the plain ``.so`` copies
would map a second registry that libllama never sees (a device registered there is ignored).
"""

import ctypes
import importlib.util
import os


def lib_dir() -> str:
    """Directory holding the wheel's shared libraries (``llama_cpp/lib``), without importing llama_cpp."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llama_cpp is not installed in this Python (run tests/peer/build-peer.sh)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    if not os.path.isfile(os.path.join(path, "libggml-rpc.so.0")):
        raise RuntimeError(f"{path} has no libggml-rpc.so.0: llama-cpp-python was built without GGML_RPC=ON")
    return path


def load(name: str) -> ctypes.CDLL:
    """Loads ``llama_cpp/lib/<name>.so.0`` with global symbol visibility."""
    return ctypes.CDLL(os.path.join(lib_dir(), f"{name}.so.0"), mode=ctypes.RTLD_GLOBAL)


def ggml() -> ctypes.CDLL:
    lib = load("libggml")
    lib.ggml_backend_load_all.argtypes = []
    lib.ggml_backend_load_all.restype = None
    lib.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_register.restype = None
    lib.ggml_backend_dev_count.argtypes = []
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    return lib


def ggml_rpc() -> ctypes.CDLL:
    load("libggml-base")
    lib = load("libggml-rpc")
    lib.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    lib.ggml_backend_rpc_start_server.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p),
    ]
    lib.ggml_backend_rpc_start_server.restype = None
    return lib
