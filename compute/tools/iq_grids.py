#!/usr/bin/env python3
"""Writes compute/src/quant/scalar/iq_grids.rs: the lookup grids of ggml's IQ1/IQ2/IQ3 formats.

The grids are data (which 8- or 4-element patterns each index stands for), not code. They are read
out of ggml's own dequantizer (`to_float` of the reference peer's libggml-base) by dequantizing
blocks built so that each element equals a known multiple of one grid value: unit block scale, no
sign bits, sub-block scale 0 and, for each index, a block position that selects it. The layouts
used to place the indices are those of ggml-compute-semantics.md §2.2 and the comments in
`quant/scalar/iq.rs`; the peer test `quant_peer` then checks every type's dequantizer and dot
product against ggml on random blocks, so a wrong layout here cannot pass.

Run with the peer's Python (tests/peer/build-peer.sh):
    ~/.cache/llamad-peer/venv-0.3.36-avx2/bin/python compute/tools/iq_grids.py > compute/src/quant/scalar/iq_grids.rs
"""

import ctypes
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "data"))
import quant_ref  # noqa: E402  (ggml's type traits through ctypes)

IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S = 16, 17, 18, 19, 21, 22
F16_ONE = struct.pack("<H", 0x3C00)


def dequant(ty: int, blocks: list) -> list:
    tr = quant_ref.traits(ty)
    raw = b"".join(blocks)
    assert len(raw) == tr.size * len(blocks), (tr.name, len(raw))
    n = 256 * len(blocks)
    out = (ctypes.c_float * n)()
    buf = ctypes.create_string_buffer(raw, len(raw))
    quant_ref.TO_FLOAT(tr.to_float)(ctypes.addressof(buf), ctypes.addressof(out), n)
    return list(out)


def groups(values: list, width: int, scale: float) -> list:
    """Cuts the dequantized values into `width`-element grid entries, each divided by `scale`."""
    out = []
    for i in range(0, len(values), width):
        entry = [values[i + j] / scale for j in range(width)]
        for v in entry:
            assert v == round(v), (v, i)
        out.append([int(round(v)) for v in entry])
    return out


def iq2xxs() -> list:
    # d = 1, per 32 elements: four index bytes, then a u32 whose top nibble (scale) and sign
    # fields are 0: each element is grid · 0.125.
    blocks = []
    for b in range(8):
        qs = b"".join(bytes([32 * b + 4 * g + l for l in range(4)]) + bytes(4) for g in range(8))
        blocks.append(F16_ONE + qs)
    return groups(dequant(IQ2_XXS, blocks), 8, 0.125)


def iq2xs() -> list:
    # u16 per 8 elements: 9-bit index, 7 sign bits (0); scales 0 → grid · 0.125.
    blocks = []
    for b in range(16):
        qs = b"".join(struct.pack("<H", 32 * b + i) for i in range(32))
        blocks.append(F16_ONE + qs + bytes(8))
    return groups(dequant(IQ2_XS, blocks), 8, 0.125)


def iq2s() -> list:
    # 32 low index bytes, 32 sign bytes (0), qh per 32 elements holds bits 8..9 of its four
    # indices (two bits each); scales 0 → grid · 0.125.
    out = []
    for hi in range(4):
        blocks = []
        for b in range(8):
            qs = bytes(32 * b + i for i in range(32)) + bytes(32)
            qh = bytes([hi * 0b0101_0101] * 8)
            blocks.append(F16_ONE + qs + qh + bytes(8))
        out += groups(dequant(IQ2_S, blocks), 8, 0.125)
    return out


def iq3xxs() -> list:
    # 64 index bytes (two 4-element entries per 8 elements), then a u32 per 32 elements with
    # scale nibble 0 and no signs: grid · 0.25.
    blocks = []
    for b in range(4):
        blocks.append(F16_ONE + bytes(64 * b + i for i in range(64)) + bytes(32))
    return groups(dequant(IQ3_XXS, blocks), 4, 0.25)


def iq3s() -> list:
    # 64 low index bytes; qh holds bit 8 of every index: all clear or all set; no signs; scale
    # nibbles 0 → grid · 1.
    out = []
    for hi in range(2):
        blocks = []
        for b in range(4):
            qs = bytes(64 * b + i for i in range(64))
            blocks.append(F16_ONE + qs + bytes([0xFF * hi] * 8) + bytes(32) + bytes(4))
        out += groups(dequant(IQ3_S, blocks), 4, 1.0)
    return out


def iq1s() -> list:
    # 32 low index bytes; a u16 per 32 elements with three high index bits per 8 elements (bits
    # 0..11), scale 0 (bits 12..14) and positive delta (bit 15): grid + 0.125.
    out = []
    for hi in range(8):
        blocks = []
        for b in range(8):
            qs = bytes(32 * b + i for i in range(32))
            qh = struct.pack("<H", hi | hi << 3 | hi << 6 | hi << 9) * 8
            blocks.append(F16_ONE + qs + qh)
        vals = [v - 0.125 for v in dequant(IQ1_S, blocks)]
        out += groups(vals, 8, 1.0)
    return out


def rust_u64(name: str, doc: str, entries: list) -> str:
    lines = [f"/// {doc}", f"pub static {name}: [[i8; 8]; {len(entries)}] = ["]
    for e in entries:
        lines.append("    [" + ", ".join(str(v) for v in e) + "],")
    lines.append("];")
    return "\n".join(lines)


def rust_u32(name: str, doc: str, entries: list) -> str:
    lines = [f"/// {doc}", f"pub static {name}: [[u8; 4]; {len(entries)}] = ["]
    for e in entries:
        lines.append("    [" + ", ".join(str(v) for v in e) + "],")
    lines.append("];")
    return "\n".join(lines)


def main() -> None:
    print("//! The lookup grids of the IQ1/IQ2/IQ3 formats: which values each grid index stands for.")
    print("//!")
    print("//! Generated by `compute/tools/iq_grids.py` from ggml's own dequantizer (data read out of the")
    print("//! reference peer, see the script); do not edit. Checked against ggml by `compute/tests/quant_peer.rs`.")
    print()
    print("#![allow(clippy::all)]")
    print()
    print(rust_u64("IQ2XXS_GRID", "IQ2_XXS: 256 entries of 8 magnitudes.", iq2xxs()))
    print()
    print(rust_u64("IQ2XS_GRID", "IQ2_XS: 512 entries of 8 magnitudes.", iq2xs()))
    print()
    print(rust_u64("IQ2S_GRID", "IQ2_S: 1024 entries of 8 magnitudes.", iq2s()))
    print()
    print(rust_u32("IQ3XXS_GRID", "IQ3_XXS: 256 entries of 4 magnitudes.", iq3xxs()))
    print()
    print(rust_u32("IQ3S_GRID", "IQ3_S: 512 entries of 4 magnitudes.", iq3s()))
    print()
    print(rust_u64("IQ1S_GRID", "IQ1_S and IQ1_M: 2048 entries of 8 values in -1..=1.", iq1s()))


if __name__ == "__main__":
    main()
