//! Interleaved weights for generation: 16 rows of a Q4_0, Q4_1, Q5_0 or Q8_0 matrix stored block column
//! by block column, so that one 512-bit register holds the same four elements of all 16 rows.
//!
//! A generation step meets every weight row with one or two activation rows. Row by row, each
//! block costs a nibble unpack, a load of the activation block and one `vpdpbusd` for 32 products,
//! and the loads of the activation dominate. Interleaved, one `vpdpbusd` forms four products of 16
//! rows against one broadcast activation group, and a 16-row group is one sequential stream.
//!
//! The layout, per group of 16 rows (`r`) and per block column `b` (elements `32b..32b + 32`):
//!
//! * Q4_0, Q4_1 and Q5_0: 4 chunks `c` of `16 × 4` bytes, row `r` holding bytes `4c..4c + 4` of its
//!   block's `qs` (low nibbles: elements `4c..4c + 4`, high nibbles: elements `16 + 4c..`);
//! * Q5_0 then: 8 masks `l` (u64, little-endian), bit `4r + e` holding the fifth bit of element
//!   `4l + e` of row `r`;
//! * Q8_0: 8 chunks `g` of `16 × 4` bytes, row `r` holding its quants `4g..4g + 4` plus 128
//!   (unsigned);
//! * then the 16 rows' `d` (f16), and for Q4_1 the 16 rows' `m` (f16).
//!
//! A group is exactly as large as the 16 rows it holds, so an interleaved matrix is as large as the
//! original.
//!
//! The arithmetic is the one-column `vec_dot`'s of the AVX2/AVX-512 kernel sets, lane for lane: per
//! block, lane `l` (elements `4l..4l + 4`) forms its exact integer sum (from the prepared row's
//! offset `-bias · Σ y`, see [`super::prepared`]), and `acc[l] = fma(f32(d_x) · d_y, f32(sum),
//! acc[l])`; at the end the eight lanes are added as `hsum_ps` adds them, and Q4_1 adds its
//! `Σ f32(m_x) · s_y` (accumulated block by block). [`dot_reference`] is that definition; the SIMD
//! kernel equals it bit for bit, and both equal the prepared `vec_dot` of the de-interleaved rows
//! (tested), so a model computes the same tokens with or without interleaved weights.
//! ref: ggml-compute-semantics.md §2.2 (block layouts), §2.3.

use super::blocks::{f16le, take_blocks, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0, QK};
use super::prepared::PreparedQ8;
use crate::dtype::GgmlType;
use crate::tensor::Layout;

/// Rows per interleaved group.
pub const ROWS: usize = 16;

/// Most activation rows one kernel call of the RPC server's order takes (its kernels hold eight
/// accumulators per column).
pub const MAX_COLS: usize = 2;

/// Most activation rows one kernel call in llama.cpp's local order takes (one accumulator per
/// column, so four columns share each decoded weight block; `quant::local`).
pub const LOCAL_MAX_COLS: usize = 4;

/// Most activation rows of a product that reads the interleaved copy ([`MAX_COLS`] per kernel
/// call): a generation step of up to 8 sequences decoded together (a server's parallel slots).
pub const SERVE_MAX_COLS: usize = 8;

/// The interleaved product of one group of [`ROWS`] rows of `k` elements with 1..=[`MAX_COLS`]
/// prepared activation rows: `out[j * ROWS + r]` = row `r` · column `j`. The cache lines of `ahead`
/// (a share of the group to run next; any length, empty for none) are prefetched spread over the
/// product, so that the weight stream overlaps the arithmetic; they change no result.
pub type InterleavedDotFn = fn(k: usize, group: &[u8], cols: &[&[u8]], out: &mut [f32], ahead: &[u8]);

/// Whether `t` has an interleaved layout.
pub fn supported(t: GgmlType) -> bool {
    matches!(t, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0)
}

/// Whether a matrix of layout `l` can be multiplied interleaved with the active kernel set: a
/// whole, contiguous 2-D matrix of a type with an interleaved kernel, whose rows form whole groups.
pub fn eligible(l: &Layout) -> bool {
    let t = l.dtype;
    supported(t)
        && super::kernels(t).interleaved_dot.is_some()
        && l.ne[2] == 1
        && l.ne[3] == 1
        && l.ne[1] > 0
        && l.ne[0].is_multiple_of(t.blck_size() as u64)
        && l.ne[1].is_multiple_of(ROWS as u64)
        && l.is_contiguous()
}

/// Where a block of `t` keeps its min (Q4_1), its fifth bits (Q5_0) and its quants; its scale is
/// at 0.
fn fields(t: GgmlType) -> (Option<usize>, Option<usize>, usize) {
    match t {
        GgmlType::Q4_1 => (Some(2), None, 4),
        GgmlType::Q5_0 => (None, Some(2), 6),
        _ => (None, None, 2),
    }
}

/// Q8_0's quants are stored plus 128: the sign bit of each byte flipped (word-wise).
fn flip(t: GgmlType) -> u32 {
    if t == GgmlType::Q8_0 {
        0x8080_8080
    } else {
        0
    }
}

/// The little-endian word at `b[at..at + 4]`.
fn word(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The bias of the prepared activation rows the kernels take (`-bias · Σ y` per lane; see
/// [`super::prepared`]): the weights' stored offset.
pub fn bias(t: GgmlType) -> i32 {
    match t {
        GgmlType::Q4_0 => 8,
        GgmlType::Q5_0 => 16,
        GgmlType::Q8_0 => 128,
        _ => 0,
    }
}

/// Bytes of the quants of one block column (before the scales): the nibble chunks (and Q5_0's
/// masks), or Q8_0's bytes.
pub fn quant_bytes(t: GgmlType) -> usize {
    match t {
        GgmlType::Q8_0 => QK * ROWS,
        GgmlType::Q5_0 => QK / 2 * ROWS + 8 * 8,
        _ => QK / 2 * ROWS,
    }
}

/// Offset of Q5_0's high-bit masks in a block column.
const MASKS: usize = QK / 2 * ROWS;

/// Bytes of one block column of a group (equal to 16 blocks of `t`).
pub fn block_bytes(t: GgmlType) -> usize {
    debug_assert!(supported(t));
    ROWS * t.type_size()
}

/// Bytes of one group of rows of `k` elements.
pub fn group_bytes(t: GgmlType, k: usize) -> usize {
    k / QK * block_bytes(t)
}

/// Interleaves `rows` contiguous rows of `k` elements of `t` (`rows` a multiple of [`ROWS`]) from
/// `src` into `out` (the same number of bytes).
pub fn interleave(t: GgmlType, k: usize, rows: usize, src: &[u8], out: &mut [u8]) {
    assert!(supported(t), "interleave: {t} has no interleaved layout");
    assert!(k.is_multiple_of(QK) && rows.is_multiple_of(ROWS), "interleave: {rows} rows of {k} elements");
    let row = k / QK * t.type_size();
    let (gb, bb, qb) = (group_bytes(t, k), block_bytes(t), quant_bytes(t));
    assert!(src.len() >= rows * row && out.len() >= rows * row, "interleave: short buffers");
    let ts = t.type_size();
    let (m_at, qh_at, qs_at) = fields(t);
    let flip = flip(t);
    for (g, dst) in out[..rows * row].chunks_exact_mut(gb).enumerate() {
        let src = &src[g * ROWS * row..(g + 1) * ROWS * row];
        for (b, o) in dst.chunks_exact_mut(bb).enumerate() {
            let mut masks = [0u64; 8];
            for r in 0..ROWS {
                let blk = &src[r * row + b * ts..][..ts];
                for c in 0..(ts - qs_at) / 4 {
                    let v = word(blk, qs_at + 4 * c) ^ flip;
                    o[c * 4 * ROWS + r * 4..][..4].copy_from_slice(&v.to_le_bytes());
                }
                o[qb + 2 * r..qb + 2 * r + 2].copy_from_slice(&blk[0..2]);
                if let Some(m) = m_at {
                    o[qb + 2 * ROWS + 2 * r..][..2].copy_from_slice(&blk[m..m + 2]);
                }
                if let Some(h) = qh_at {
                    // Bits 4l..4l + 4 of the row's fifth bits go to bits 4r..4r + 4 of mask l.
                    let qh = word(blk, h);
                    for (l, mask) in masks.iter_mut().enumerate() {
                        *mask |= (((qh >> (4 * l)) & 0xF) as u64) << (4 * r);
                    }
                }
            }
            if qh_at.is_some() {
                for (l, mask) in masks.iter().enumerate() {
                    o[MASKS + 8 * l..][..8].copy_from_slice(&mask.to_le_bytes());
                }
            }
        }
    }
}

/// [`interleave`] on up to `threads` threads (scoped, each taking a contiguous run of groups):
/// for large matrices, which are made when a model is first run.
pub fn interleave_parallel(t: GgmlType, k: usize, rows: usize, src: &[u8], out: &mut [u8], threads: usize) {
    assert!(supported(t), "interleave: {t} has no interleaved layout");
    assert!(k.is_multiple_of(QK) && rows.is_multiple_of(ROWS), "interleave: {rows} rows of {k} elements");
    let row = k / QK * t.type_size();
    assert!(src.len() >= rows * row && out.len() >= rows * row, "interleave: short buffers");
    let groups = rows / ROWS;
    // Below a few MiB a thread costs more than it saves.
    let threads = threads.clamp(1, groups.max(1)).min(((rows * row) >> 22).max(1));
    if threads == 1 {
        interleave(t, k, rows, src, out);
        return;
    }
    let per = groups.div_ceil(threads) * ROWS * row;
    std::thread::scope(|sc| {
        for (s, o) in src[..rows * row].chunks(per).zip(out[..rows * row].chunks_mut(per)) {
            sc.spawn(move || interleave(t, k, s.len() / row, s, o));
        }
    });
}

/// Row `r` of a group, back in `t`'s own block layout (the inverse of [`interleave`]).
pub fn deinterleave_row(t: GgmlType, k: usize, group: &[u8], r: usize, out: &mut [u8]) {
    assert!(supported(t) && k.is_multiple_of(QK) && r < ROWS, "deinterleave_row: {t}, k {k}, row {r}");
    let (bb, qb, ts) = (block_bytes(t), quant_bytes(t), t.type_size());
    assert!(group.len() >= group_bytes(t, k) && out.len() >= k / QK * ts, "deinterleave_row: short");
    let (m_at, qh_at, qs_at) = fields(t);
    for b in 0..k / QK {
        let g = &group[b * bb..(b + 1) * bb];
        let o = &mut out[b * ts..(b + 1) * ts];
        o[0..2].copy_from_slice(&g[qb + 2 * r..qb + 2 * r + 2]);
        if let Some(m) = m_at {
            o[m..m + 2].copy_from_slice(&g[qb + 2 * ROWS + 2 * r..][..2]);
        }
        if let Some(h) = qh_at {
            let qh = (0..QK).fold(0u32, |qh, e| qh | (weight(t, g, e / 4, r, e % 4) as u32 >> 4) << e);
            o[h..h + 4].copy_from_slice(&qh.to_le_bytes());
        }
        for c in 0..(ts - qs_at) / 4 {
            let v = word(g, c * 4 * ROWS + r * 4) ^ flip(t);
            o[qs_at + 4 * c..][..4].copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Panics unless the arguments fit (before any kernel reads them), for a kernel of up to
/// [`MAX_COLS`] columns.
pub fn check_args(t: GgmlType, k: usize, group: &[u8], cols: &[&[u8]], out: &[f32]) {
    check_args_cols(t, k, group, cols, out, MAX_COLS)
}

/// [`check_args`] for a kernel of up to `max_cols` columns.
pub fn check_args_cols(t: GgmlType, k: usize, group: &[u8], cols: &[&[u8]], out: &[f32], max_cols: usize) {
    assert!(supported(t) && k.is_multiple_of(QK), "interleaved dot: {t}, k = {k}");
    assert!(group.len() >= group_bytes(t, k), "interleaved dot: {} bytes for k = {k}", group.len());
    assert!((1..=max_cols).contains(&cols.len()), "interleaved dot: {} columns", cols.len());
    let row = super::prepared::row_bytes(k);
    assert!(cols.iter().all(|c| c.len() >= row), "interleaved dot: a column is short for k = {k}");
    assert!(out.len() >= cols.len() * ROWS, "interleaved dot: {} outputs", out.len());
}

/// The reference interleaved product of type `t` (the definition in the module docs).
pub fn dot_reference(t: GgmlType, k: usize, group: &[u8], cols: &[&[u8]], out: &mut [f32]) {
    check_args(t, k, group, cols, out);
    let (bb, qb) = (block_bytes(t), quant_bytes(t));
    let nb = k / QK;
    for (j, col) in cols.iter().enumerate() {
        let ys = take_blocks::<PreparedQ8>(col, nb);
        for r in 0..ROWS {
            let mut acc = [0.0f32; 8];
            let mut ms = 0.0f32;
            for (b, y) in ys.iter().enumerate() {
                let g = &group[b * bb..(b + 1) * bb];
                let dx = f16le([g[qb + 2 * r], g[qb + 2 * r + 1]]);
                let d = dx * f32::from_le_bytes(y.d);
                for (l, a) in acc.iter_mut().enumerate() {
                    let mut isum = i32::from_le_bytes(y.off[l]);
                    for e in 0..4 {
                        let w = weight(t, g, l, r, e);
                        isum += w as i32 * y.qs[4 * l + e] as i32;
                    }
                    *a = d.mul_add(isum as f32, *a);
                }
                if t == GgmlType::Q4_1 {
                    let mx = f16le([g[qb + 2 * ROWS + 2 * r], g[qb + 2 * ROWS + 2 * r + 1]]);
                    ms += mx * f32::from_le_bytes(y.s);
                }
            }
            let s: [f32; 4] = std::array::from_fn(|i| acc[i] + acc[i + 4]);
            let v = (s[0] + s[2]) + (s[1] + s[3]);
            out[j * ROWS + r] = if t == GgmlType::Q4_1 { v + ms } else { v };
        }
    }
}

/// The stored (unsigned) weight of element `4l + e` of row `r` in block column `g`.
pub(crate) fn weight(t: GgmlType, g: &[u8], l: usize, r: usize, e: usize) -> u8 {
    if t == GgmlType::Q8_0 {
        return g[l * 4 * ROWS + r * 4 + e];
    }
    let w = g[(l % 4) * 4 * ROWS + r * 4 + e];
    let nib = if l < 4 { w & 0xF } else { w >> 4 };
    if t != GgmlType::Q5_0 {
        return nib;
    }
    let mask = u64::from_le_bytes(g[MASKS + 8 * l..MASKS + 8 * l + 8].try_into().expect("8 bytes"));
    nib | (((mask >> (4 * r + e)) & 1) as u8) << 4
}

/// The block types this layout is defined over (a compile-time check of their sizes).
const _: () = {
    assert!(std::mem::size_of::<BlockQ4_0>() == 18);
    assert!(std::mem::size_of::<BlockQ4_1>() == 20);
    assert!(std::mem::size_of::<BlockQ5_0>() == 22);
    assert!(std::mem::size_of::<BlockQ8_0>() == 34);
};
