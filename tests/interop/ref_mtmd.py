"""One llama.cpp multimodal session (libmtmd): encode an image with a vision projector, then feed
the image embeddings (and any text after the image) to the text model; run in a fresh process.

Usage: python ref_mtmd.py ARGS.json OUT.json

Like ref_master.py, every device configuration runs in its own process (RPC registration is
process-global). ARGS.json:

    {"model": path, "mmproj": path, "endpoints": ["127.0.0.1:PORT", ...], "n_gpu_layers": 99,
     "flash_attn": bool, "n_threads": 1, "image": path, "nx": 32, "ny": 32,
     "prompt": "<__media__>", "after": [token id, ...], "out_dir": path}

"image" holds nx·ny·3 bytes of RGB. With endpoints, the projector is placed on the first RPC
device (``mtmd_context_params.device``; clip would also pick it unasked: ggml-rpc reports its
devices as GPUs and supports every op) and the text model's layers on the RPC devices too.

Writes to out_dir ``embd.npy`` (the image chunk's embeddings, n_tokens × n_embd, as libmtmd's
encoder returns them) and ``logits.npy`` (1 × n_vocab: the text model's logits after the prompt,
evaluated by ``mtmd_helper_eval_chunks``, and the token ids "after" it, given as ids because the
tiny test vocabularies cannot tokenize text). OUT.json receives the device list, the device clip ran
on and the chunk layout.
"""

import ctypes
import json
import sys

import _ggml
from ref_master import register_rpc

MTMD_INPUT_CHUNK_TYPE_IMAGE = 1


class MtmdContextParams(ctypes.Structure):
    """``struct mtmd_context_params`` of this llama.cpp (tools/mtmd/mtmd.h); callbacks as void*."""

    _fields_ = [
        ("use_gpu", ctypes.c_bool),
        ("device", ctypes.c_void_p),
        ("print_timings", ctypes.c_bool),
        ("n_threads", ctypes.c_int),
        ("image_marker", ctypes.c_char_p),
        ("media_marker", ctypes.c_char_p),
        ("flash_attn_type", ctypes.c_int),
        ("warmup", ctypes.c_bool),
        ("image_min_tokens", ctypes.c_int),
        ("image_max_tokens", ctypes.c_int),
        ("cb_eval", ctypes.c_void_p),
        ("cb_eval_user_data", ctypes.c_void_p),
        ("batch_max_tokens", ctypes.c_int32),
        ("progress_callback", ctypes.c_void_p),
        ("progress_callback_user_data", ctypes.c_void_p),
    ]


class MtmdInputText(ctypes.Structure):
    _fields_ = [
        ("text", ctypes.c_char_p),
        ("text_len", ctypes.c_size_t),
        ("add_special", ctypes.c_bool),
        ("parse_special", ctypes.c_bool),
    ]


def mtmd() -> ctypes.CDLL:
    """libmtmd.so.0 (sharing the one ggml registry and libllama), with the signatures used here."""
    lib = _ggml.load("libmtmd")
    vp, sz, i32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32
    sigs = {
        "mtmd_context_params_default": ([], MtmdContextParams),
        "mtmd_init_from_file": ([ctypes.c_char_p, vp, MtmdContextParams], vp),
        "mtmd_free": ([vp], None),
        "mtmd_bitmap_init": ([ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p], vp),
        "mtmd_bitmap_free": ([vp], None),
        "mtmd_input_chunks_init": ([], vp),
        "mtmd_input_chunks_free": ([vp], None),
        "mtmd_input_chunks_size": ([vp], sz),
        "mtmd_input_chunks_get": ([vp, sz], vp),
        "mtmd_input_chunk_get_type": ([vp], ctypes.c_int),
        "mtmd_input_chunk_get_n_tokens": ([vp], sz),
        "mtmd_tokenize": ([vp, vp, ctypes.POINTER(MtmdInputText), ctypes.POINTER(vp), sz], i32),
        "mtmd_encode_chunk": ([vp, vp], i32),
        "mtmd_get_output_embd": ([vp], ctypes.POINTER(ctypes.c_float)),
        "mtmd_helper_eval_chunks": ([vp, vp, vp, i32, i32, i32, ctypes.c_bool, ctypes.POINTER(i32)], i32),
    }
    for name, (args, res) in sigs.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = res
    return lib


def main() -> int:
    with open(sys.argv[1]) as f:
        args = json.load(f)
    devices = register_rpc(args.get("endpoints", []))
    ggml = _ggml.ggml()
    rpc_dev = None
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_name(dev).decode().startswith("RPC"):
            rpc_dev = dev
            break

    import llama_cpp  # after registration, so the registry already holds the RPC devices
    import numpy as np

    llm = llama_cpp.Llama(
        model_path=args["model"],
        n_gpu_layers=args.get("n_gpu_layers", 0),
        flash_attn=bool(args.get("flash_attn", False)),
        n_ctx=args.get("n_ctx", 256),
        n_batch=args.get("n_ctx", 256),
        seed=1234,
        n_threads=args.get("n_threads", 1),
        n_threads_batch=args.get("n_threads", 1),
        verbose=bool(args.get("verbose", False)),
    )
    lib = mtmd()
    params = lib.mtmd_context_params_default()
    params.use_gpu = rpc_dev is not None
    params.device = rpc_dev
    params.n_threads = args.get("n_threads", 1)
    params.print_timings = False
    params.warmup = True
    params.flash_attn_type = 1 if args.get("flash_attn") else 0
    ctx = lib.mtmd_init_from_file(args["mmproj"].encode(), llm.model, params)
    if not ctx:
        raise RuntimeError("mtmd_init_from_file failed")

    nx, ny = args["nx"], args["ny"]
    with open(args["image"], "rb") as f:
        pixels = f.read()
    assert len(pixels) == nx * ny * 3
    bitmap = lib.mtmd_bitmap_init(nx, ny, pixels)
    chunks = lib.mtmd_input_chunks_init()
    prompt = args["prompt"].encode()
    text = MtmdInputText(prompt, len(prompt), True, False)
    bitmaps = (ctypes.c_void_p * 1)(bitmap)
    rc = lib.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1)
    if rc != 0:
        raise RuntimeError(f"mtmd_tokenize: {rc}")

    layout = []
    embd = None
    n_embd = llama_cpp.llama_model_n_embd(llm.model)
    for i in range(lib.mtmd_input_chunks_size(chunks)):
        chunk = lib.mtmd_input_chunks_get(chunks, i)
        kind, n = lib.mtmd_input_chunk_get_type(chunk), lib.mtmd_input_chunk_get_n_tokens(chunk)
        layout.append({"type": kind, "n_tokens": n})
        if kind == MTMD_INPUT_CHUNK_TYPE_IMAGE:
            rc = lib.mtmd_encode_chunk(ctx, chunk)
            if rc != 0:
                raise RuntimeError(f"mtmd_encode_chunk: {rc}")
            out = lib.mtmd_get_output_embd(ctx)
            embd = np.ctypeslib.as_array(out, shape=(n * n_embd,)).reshape(n, n_embd).copy()
    if embd is None:
        raise RuntimeError("the prompt has no image chunk")
    np.save(f"{args['out_dir']}/embd.npy", embd.astype(np.float32))

    n_past = ctypes.c_int32(0)
    rc = lib.mtmd_helper_eval_chunks(ctx, llm.ctx, chunks, 0, 0, args.get("n_ctx", 256), True, ctypes.byref(n_past))
    if rc != 0:
        raise RuntimeError(f"mtmd_helper_eval_chunks: {rc}")
    after = args.get("after", [])
    if after:
        # Positions left to llama.cpp (a batch without positions continues the sequence).
        toks = (llama_cpp.llama_token * len(after))(*after)
        rc = llama_cpp.llama_decode(llm.ctx, llama_cpp.llama_batch_get_one(toks, len(after)))
        if rc != 0:
            raise RuntimeError(f"llama_decode: {rc}")
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llm.model))
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)).copy()
    np.save(f"{args['out_dir']}/logits.npy", logits.reshape(1, n_vocab).astype(np.float32))

    with open(sys.argv[2], "w") as f:
        json.dump({"devices": devices, "chunks": layout, "n_past": n_past.value + len(after)}, f, indent=1)
    lib.mtmd_input_chunks_free(chunks)
    lib.mtmd_bitmap_free(bitmap)
    lib.mtmd_free(ctx)
    llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
