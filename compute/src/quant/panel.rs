//! Packed panels for prompt-processing matrix products: the weight rows of one work unit are
//! unpacked once into a layout where one vector register holds the same four elements of 16 rows,
//! and activation rows are converted once into per-sub-block records, so the inner loop is one
//! `vpdpbusd` per four elements of 16 rows and one scale step per sub-block.
//!
//! The layouts (`sub` = elements per sub-block, 32 or 16; `P` = [`PANEL_ROWS`]):
//!
//! * weight panel, per sub-block: `sub / 4` groups of `P × 4` unsigned bytes (group `g`, row `r`
//!   holds elements `4g..4g + 4` of that row, stored as `w = q + bias`), then `sx: [f32; P]` (the
//!   row's scale for this sub-block), then, for formats with a min term, `mx: [f32; P]`;
//! * activation column, per sub-block: `y: [i8; sub]`, `off: i32` (`-bias · Σ y`, so that
//!   `off + Σ w·y = Σ q·y` exactly), `sy: f32` (the column's scale), `ty: f32` (`sy · Σ y`, used
//!   by the min term).
//!
//! The value of output `(r, c)` is, sub-block after sub-block,
//! `acc = fma(f32(off + Σ w·y), sx[r] · sy, acc)` and, with a min term, `acc = fma(mx[r], ty, acc)`.
//! [`run_reference`] is that definition; the SIMD kernels equal it bit for bit (tested). It is not
//! ggml's AVX2 summation order, so the panel kernels are only installed where no bit-exact ggml
//! parity is promised (the `portable` numerics profile on the AVX-512 set, for Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL, MXFP4, IQ4_XS (values
//! `v + 128`), the grid IQ types
//! and TQ1_0/TQ2_0, whose blocks are decoded by `scalar::iq` into values `v + 64` with a scale
//! per 16 elements); against the
//! one-column `vec_dot` they agree to float rounding (tested against an f64 reference). For Q4_0,
//! IQ4_NL and MXFP4 this order is also llama.cpp's repacked (CPU_REPACK) order, so the panels serve the
//! in-process products of those weights under every profile (see [`super::local`]).
//! The packers here are the scalar definitions; the AVX-512 set replaces the Q4_0 weight packer
//! (a register transpose) and the Q8_0 column packer with SIMD twins that write the same bytes
//! (tested), since packing was a tenth of a Q4_0 prompt's time.
//! ref: ggml-compute-semantics.md §2.2 (block layouts), §2.3 (activation types).

use super::blocks::*;
use super::scalar::iq::{self, IqSpec};
use super::scalar::{iq4xs_indices, k4_scales, q4k_quants, q5k_quants, q6k_quants};
use crate::dtype::{GgmlType, QK_K};

/// Weight rows per panel (one 512-bit register of i32 lanes).
pub const PANEL_ROWS: usize = 16;
/// Most activation columns one kernel call takes.
pub const PANEL_COLS: usize = 8;

/// The shape of a type's panels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PanelFormat {
    /// Elements per sub-block (16 or 32): one scale per row and per column each.
    pub sub: usize,
    /// Whether rows carry a min term (`mx · ty`).
    pub min: bool,
}

impl PanelFormat {
    /// Bytes of one sub-block of a weight panel.
    pub const fn row_sub_bytes(self) -> usize {
        self.sub * PANEL_ROWS + 4 * PANEL_ROWS + if self.min { 4 * PANEL_ROWS } else { 0 }
    }

    /// Bytes of one sub-block of an activation column.
    pub const fn col_sub_bytes(self) -> usize {
        self.sub + 12
    }

    /// Bytes of a weight panel of rows of `k` elements.
    pub const fn panel_bytes(self, k: usize) -> usize {
        k / self.sub * self.row_sub_bytes()
    }

    /// Bytes of an activation column of `k` elements.
    pub const fn col_bytes(self, k: usize) -> usize {
        k / self.sub * self.col_sub_bytes()
    }
}

/// Packs [`PANEL_ROWS`] weight rows of `k` elements into a panel (`out` holds
/// [`PanelFormat::panel_bytes`]).
pub type PackRowsFn = fn(k: usize, rows: &[&[u8]; PANEL_ROWS], out: &mut [u8]);
/// Packs one activation row of `k` elements, of the weight type's `vec_dot_type`, into a column.
pub type PackColFn = fn(k: usize, row: &[u8], out: &mut [u8]);
/// Every row of a panel of format `f` against each column in `cols` (1 ..= [`PANEL_COLS`]):
/// `out[j * PANEL_ROWS + r]`.
pub type PanelRunFn = fn(f: PanelFormat, k: usize, panel: &[u8], cols: &[&[u8]], out: &mut [f32]);

/// The panel kernels of one type.
#[derive(Clone, Copy, Debug)]
pub struct PanelKernels {
    /// The layout.
    pub format: PanelFormat,
    /// Weight rows → panel.
    pub pack_rows: PackRowsFn,
    /// Activation row → column.
    pub pack_col: PackColFn,
    /// The product.
    pub run: PanelRunFn,
}

/// The packers of `t` and its format, if it has panels.
pub fn packers(t: GgmlType) -> Option<(PanelFormat, PackRowsFn, PackColFn)> {
    let legacy = PanelFormat { sub: 32, min: false };
    Some(match t {
        GgmlType::Q4_0 => (legacy, pack_rows_q4_0, pack_col_q8_0::<8>),
        GgmlType::Q5_0 => (legacy, pack_rows_q5_0, pack_col_q8_0::<16>),
        GgmlType::Q8_0 => (legacy, pack_rows_q8_0, pack_col_q8_0::<128>),
        GgmlType::Q4_K => (PanelFormat { sub: 32, min: true }, pack_rows_q4_k, pack_col_q8_k_32),
        GgmlType::Q5_K => (PanelFormat { sub: 32, min: true }, pack_rows_q5_k, pack_col_q8_k_32),
        GgmlType::Q6_K => (PanelFormat { sub: 16, min: false }, pack_rows_q6_k, pack_col_q8_k_16::<32>),
        GgmlType::IQ4_NL => (legacy, pack_rows_iq4_nl, pack_col_q8_0::<128>),
        GgmlType::MXFP4 => (legacy, pack_rows_mxfp4, pack_col_q8_0::<128>),
        GgmlType::IQ4_XS => (legacy, pack_rows_iq4_xs, pack_col_q8_k_32_biased::<128>),
        GgmlType::IQ2_XXS => (GRID, pack_rows_iq2_xxs, pack_col_q8_k_16::<GRID_BIAS>),
        GgmlType::IQ2_XS => (GRID, pack_rows_iq2_xs, pack_col_q8_k_16::<GRID_BIAS>),
        GgmlType::IQ2_S => (GRID, pack_rows_iq2_s, pack_col_q8_k_16::<GRID_BIAS>),
        GgmlType::IQ3_XXS => (GRID, pack_rows_iq3_xxs, pack_col_q8_k_16::<GRID_BIAS>),
        GgmlType::IQ3_S => (GRID, pack_rows_iq3_s, pack_col_q8_k_16::<GRID_BIAS>),
        GgmlType::IQ1_S => (GRID, pack_rows_iq1_s, pack_col_q8_k_16::<GRID_BIAS>),
        GgmlType::IQ1_M => (GRID, pack_rows_iq1_m, pack_col_q8_k_16::<GRID_BIAS>),
        GgmlType::TQ1_0 => (GRID, pack_rows_tq1_0, pack_col_q8_k_16::<GRID_BIAS>),
        GgmlType::TQ2_0 => (GRID, pack_rows_tq2_0, pack_col_q8_k_16::<GRID_BIAS>),
        _ => return None,
    })
}

/// The scalar panel kernels of `t` (the reference the SIMD kernels are tested against).
pub fn scalar_kernels(t: GgmlType) -> Option<PanelKernels> {
    let (format, pack_rows, pack_col) = packers(t)?;
    Some(PanelKernels { format, pack_rows, pack_col, run: run_reference })
}

/// The reference product of panels of format `f` (the definition in the module docs).
pub fn run_reference(f: PanelFormat, k: usize, panel: &[u8], cols: &[&[u8]], out: &mut [f32]) {
    check_args(f, k, panel, cols, out);
    let (rsb, csb) = (f.row_sub_bytes(), f.col_sub_bytes());
    for (c, col) in cols.iter().enumerate() {
        for r in 0..PANEL_ROWS {
            let mut acc = 0.0f32;
            for s in 0..k / f.sub {
                let w = &panel[s * rsb..(s + 1) * rsb];
                let y = &col[s * csb..(s + 1) * csb];
                let mut isum = i32_at(y, f.sub);
                for e in 0..f.sub {
                    let (g, t) = (e / 4, e % 4);
                    isum += w[g * 4 * PANEL_ROWS + r * 4 + t] as i32 * y[e] as i8 as i32;
                }
                let sx = f32_at(w, f.sub * PANEL_ROWS + 4 * r);
                let sy = f32_at(y, f.sub + 4);
                acc = (isum as f32).mul_add(sx * sy, acc);
                if f.min {
                    let mx = f32_at(w, f.sub * PANEL_ROWS + 4 * PANEL_ROWS + 4 * r);
                    acc = mx.mul_add(f32_at(y, f.sub + 8), acc);
                }
            }
            out[c * PANEL_ROWS + r] = acc;
        }
    }
}

/// Panics unless the arguments fit format `f` (before any kernel reads them).
pub fn check_args(f: PanelFormat, k: usize, panel: &[u8], cols: &[&[u8]], out: &[f32]) {
    assert_eq!(k % f.sub, 0, "panel: k = {k} is not a whole number of sub-blocks of {}", f.sub);
    assert!(panel.len() >= f.panel_bytes(k), "panel: {} bytes for k = {k}", panel.len());
    assert!((1..=PANEL_COLS).contains(&cols.len()), "panel: {} columns", cols.len());
    assert!(cols.iter().all(|c| c.len() >= f.col_bytes(k)), "panel: a column is short for k = {k}");
    assert!(out.len() >= cols.len() * PANEL_ROWS, "panel: {} outputs for {} columns", out.len(), cols.len());
}

#[inline(always)]
fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

// ---- weight packers ----

/// Writes one sub-block of the panel: `q[r][e]` (already biased to unsigned), `sx[r]`, `mx[r]`.
fn put_sub(
    f: PanelFormat,
    out: &mut [u8],
    q: &[[u8; 32]; PANEL_ROWS],
    sx: &[f32; PANEL_ROWS],
    mx: &[f32; PANEL_ROWS],
) {
    for g in 0..f.sub / 4 {
        for r in 0..PANEL_ROWS {
            let at = g * 4 * PANEL_ROWS + r * 4;
            out[at..at + 4].copy_from_slice(&q[r][4 * g..4 * g + 4]);
        }
    }
    let at = f.sub * PANEL_ROWS;
    for r in 0..PANEL_ROWS {
        out[at + 4 * r..at + 4 * r + 4].copy_from_slice(&sx[r].to_le_bytes());
    }
    if f.min {
        let at = at + 4 * PANEL_ROWS;
        for r in 0..PANEL_ROWS {
            out[at + 4 * r..at + 4 * r + 4].copy_from_slice(&mx[r].to_le_bytes());
        }
    }
}

/// Packs rows of a 32-element format: `unpack(block) -> (biased quants, scale)`.
fn pack_rows_legacy<B: bytemuck::Pod>(
    k: usize,
    rows: &[&[u8]; PANEL_ROWS],
    out: &mut [u8],
    unpack: impl Fn(&B) -> ([u8; 32], f32),
) {
    let f = PanelFormat { sub: 32, min: false };
    assert_eq!(k % QK, 0, "panel: k = {k} is not a whole number of blocks");
    assert!(out.len() >= f.panel_bytes(k), "panel: {} bytes for k = {k}", out.len());
    let nb = k / QK;
    let blocks: [&[B]; PANEL_ROWS] = std::array::from_fn(|r| take_blocks::<B>(rows[r], nb));
    let mut q = [[0u8; 32]; PANEL_ROWS];
    let mut sx = [0.0f32; PANEL_ROWS];
    let mx = [0.0f32; PANEL_ROWS];
    for b in 0..nb {
        for r in 0..PANEL_ROWS {
            (q[r], sx[r]) = unpack(&blocks[r][b]);
        }
        put_sub(f, &mut out[b * f.row_sub_bytes()..], &q, &sx, &mx);
    }
}

fn nibbles(qs: &[u8; 16]) -> [u8; 32] {
    std::array::from_fn(|e| if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 })
}

fn pack_rows_q4_0(k: usize, rows: &[&[u8]; PANEL_ROWS], out: &mut [u8]) {
    pack_rows_legacy::<BlockQ4_0>(k, rows, out, |b| (nibbles(&b.qs), f16le(b.d)));
}

fn pack_rows_q5_0(k: usize, rows: &[&[u8]; PANEL_ROWS], out: &mut [u8]) {
    pack_rows_legacy::<BlockQ5_0>(k, rows, out, |b| {
        let qh = u32::from_le_bytes(b.qh);
        let lo = nibbles(&b.qs);
        (std::array::from_fn(|e| lo[e] | (((qh >> e) & 1) as u8) << 4), f16le(b.d))
    });
}

/// IQ4_NL: the non-linear values `KVALUES_IQ4NL[nibble]` (−127..=113) stored as `v + 128`.
fn pack_rows_iq4_nl(k: usize, rows: &[&[u8]; PANEL_ROWS], out: &mut [u8]) {
    pack_rows_legacy::<BlockIq4Nl>(k, rows, out, |b| {
        let q = nibbles(&b.qs);
        (std::array::from_fn(|e| (KVALUES_IQ4NL[q[e] as usize] as i16 + 128) as u8), f16le(b.d))
    });
}

/// MXFP4: the doubled E2M1 values `KVALUES_MXFP4[nibble]` (−12..=12) stored as `v + 128`, the
/// block's E8M0 exponent as its f32 half-scale (as ggml's `vec_dot` and repacked kernels take it).
fn pack_rows_mxfp4(k: usize, rows: &[&[u8]; PANEL_ROWS], out: &mut [u8]) {
    pack_rows_legacy::<BlockMxfp4>(k, rows, out, |b| {
        let q = nibbles(&b.qs);
        (std::array::from_fn(|e| (KVALUES_MXFP4[q[e] as usize] as i16 + 128) as u8), e8m0_half(b.e))
    });
}

/// IQ4_XS: IQ4_NL's values with a 6-bit scale (minus 32) per 32 elements, stored as `v + 128`.
fn pack_rows_iq4_xs(k: usize, rows: &[&[u8]; PANEL_ROWS], out: &mut [u8]) {
    pack_rows_super::<BlockIq4Xs>(PanelFormat { sub: 32, min: false }, k, rows, out, |blk| {
        let idx = iq4xs_indices(blk);
        let d = f16le(blk.d);
        let q = std::array::from_fn(|e| (KVALUES_IQ4NL[idx[e] as usize] as i16 + 128) as u8);
        // Eight scales (one per 32 elements); the rest of the array is unused.
        (q, std::array::from_fn(|j| if j < 8 { d * (iq4xs_scale(blk, j) - 32) as f32 } else { 0.0 }))
    });
}

/// Packs rows of a super-block type without a min term whose blocks unpack to biased values and a
/// scale per sub-block of `f.sub` (Q6_K, IQ4_XS, the grid types): `unpack(block) -> (values,
/// scales)`, scale `j` for elements `j·sub..(j + 1)·sub`.
fn pack_rows_super<B: bytemuck::Pod>(
    f: PanelFormat,
    k: usize,
    rows: &[&[u8]; PANEL_ROWS],
    out: &mut [u8],
    unpack: impl Fn(&B) -> ([u8; QK_K], [f32; QK_K / 16]),
) {
    assert_eq!(k % QK_K, 0, "panel: k = {k} is not a whole number of super-blocks");
    assert!(out.len() >= f.panel_bytes(k), "panel: {} bytes for k = {k}", out.len());
    let (nb, per) = (k / QK_K, QK_K / f.sub);
    let blocks: [&[B]; PANEL_ROWS] = std::array::from_fn(|r| take_blocks::<B>(rows[r], nb));
    let mut q = [[0u8; 32]; PANEL_ROWS];
    let mut sx = [0.0f32; PANEL_ROWS];
    let mx = [0.0f32; PANEL_ROWS];
    for b in 0..nb {
        let unpacked: [_; PANEL_ROWS] = std::array::from_fn(|r| unpack(&blocks[r][b]));
        for j in 0..per {
            for (r, (vals, scales)) in unpacked.iter().enumerate() {
                sx[r] = scales[j];
                q[r][..f.sub].copy_from_slice(&vals[f.sub * j..f.sub * (j + 1)]);
            }
            put_sub(f, &mut out[(b * per + j) * f.row_sub_bytes()..], &q, &sx, &mx);
        }
    }
}

fn pack_rows_q8_0(k: usize, rows: &[&[u8]; PANEL_ROWS], out: &mut [u8]) {
    pack_rows_legacy::<BlockQ8_0>(k, rows, out, |b| {
        (std::array::from_fn(|e| (b.qs[e] as i16 + 128) as u8), f16le(b.d))
    });
}

/// Packs rows of a K-quant with 8 sub-blocks of 32 and 6-bit scales and mins (Q4_K, Q5_K):
/// `unpack(block) -> (quants, d, dmin, scales)`.
fn pack_rows_k4<B: bytemuck::Pod>(
    k: usize,
    rows: &[&[u8]; PANEL_ROWS],
    out: &mut [u8],
    unpack: impl Fn(&B) -> ([u8; QK_K], f32, f32, [u8; 12]),
) {
    let f = PanelFormat { sub: 32, min: true };
    assert_eq!(k % QK_K, 0, "panel: k = {k} is not a whole number of super-blocks");
    assert!(out.len() >= f.panel_bytes(k), "panel: {} bytes for k = {k}", out.len());
    let nb = k / QK_K;
    let blocks: [&[B]; PANEL_ROWS] = std::array::from_fn(|r| take_blocks::<B>(rows[r], nb));
    let mut q = [[0u8; 32]; PANEL_ROWS];
    let mut sx = [[0.0f32; PANEL_ROWS]; 8];
    let mut mx = [[0.0f32; PANEL_ROWS]; 8];
    for b in 0..nb {
        let unpacked: [_; PANEL_ROWS] = std::array::from_fn(|r| unpack(&blocks[r][b]));
        for (r, (_, d, dmin, scales)) in unpacked.iter().enumerate() {
            for (j, (sc, m)) in k4_scales(scales).into_iter().enumerate() {
                sx[j][r] = d * sc as f32;
                mx[j][r] = -(dmin * m as f32);
            }
        }
        for j in 0..8 {
            for r in 0..PANEL_ROWS {
                q[r].copy_from_slice(&unpacked[r].0[32 * j..32 * j + 32]);
            }
            put_sub(f, &mut out[(b * 8 + j) * f.row_sub_bytes()..], &q, &sx[j], &mx[j]);
        }
    }
}

fn pack_rows_q4_k(k: usize, rows: &[&[u8]; PANEL_ROWS], out: &mut [u8]) {
    pack_rows_k4::<BlockQ4K>(k, rows, out, |b| (q4k_quants(b), f16le(b.d), f16le(b.dmin), b.scales));
}

fn pack_rows_q5_k(k: usize, rows: &[&[u8]; PANEL_ROWS], out: &mut [u8]) {
    pack_rows_k4::<BlockQ5K>(k, rows, out, |b| (q5k_quants(b), f16le(b.d), f16le(b.dmin), b.scales));
}

fn pack_rows_q6_k(k: usize, rows: &[&[u8]; PANEL_ROWS], out: &mut [u8]) {
    pack_rows_super::<BlockQ6K>(PanelFormat { sub: 16, min: false }, k, rows, out, |blk| {
        let q = q6k_quants(blk);
        let d = f16le(blk.d);
        (std::array::from_fn(|e| (q[e] + 32) as u8), std::array::from_fn(|j| d * blk.scales[j] as f32))
    });
}

/// The grid IQ types and TQ1_0/TQ2_0: 16 sub-blocks of 16 per block, no min term.
const GRID: PanelFormat = PanelFormat { sub: 16, min: false };
/// Their stored weights are `v + 64`: every decoded value lies in −64..=63 (the largest grid
/// magnitude is IQ3_XXS's 62; IQ1's eighths reach ±9, the ternary types ±1).
const GRID_BIAS: i32 = 64;

/// Packs rows of a type `spec` decodes (`x = d · scale · C · v`, IQ1's `v` in eighths) into
/// sub-blocks of 16 with `sx = d · C (· ⅛) · scale`.
fn pack_rows_grid<B: bytemuck::Pod>(k: usize, rows: &[&[u8]; PANEL_ROWS], out: &mut [u8], spec: &IqSpec<B>) {
    let unit = spec.c * if spec.eighths { 0.125 } else { 1.0 };
    pack_rows_super::<B>(GRID, k, rows, out, |blk| {
        let dec = (spec.decode)(blk);
        let d = (spec.d)(blk) * unit;
        (dec.v.map(|v| (v as i32 + GRID_BIAS) as u8), dec.scale.map(|s| d * s as f32))
    });
}

macro_rules! grid_packers {
    ($($name:ident = $spec:path),* $(,)?) => {
        $(
            fn $name(k: usize, rows: &[&[u8]; PANEL_ROWS], out: &mut [u8]) {
                pack_rows_grid(k, rows, out, &$spec)
            }
        )*
    };
}

grid_packers!(
    pack_rows_iq2_xxs = iq::IQ2_XXS_SPEC,
    pack_rows_iq2_xs = iq::IQ2_XS_SPEC,
    pack_rows_iq2_s = iq::IQ2_S_SPEC,
    pack_rows_iq3_xxs = iq::IQ3_XXS_SPEC,
    pack_rows_iq3_s = iq::IQ3_S_SPEC,
    pack_rows_iq1_s = iq::IQ1_S_SPEC,
    pack_rows_iq1_m = iq::IQ1_M_SPEC,
    pack_rows_tq1_0 = iq::TQ1_0_SPEC,
    pack_rows_tq2_0 = iq::TQ2_0_SPEC,
);

// ---- activation packers ----

/// Writes one sub-block of a column.
fn put_col(out: &mut [u8], y: &[i8], off: i32, sy: f32, ty: f32) {
    let n = y.len();
    out[..n].copy_from_slice(bytemuck::cast_slice(y));
    out[n..n + 4].copy_from_slice(&off.to_le_bytes());
    out[n + 4..n + 8].copy_from_slice(&sy.to_le_bytes());
    out[n + 8..n + 12].copy_from_slice(&ty.to_le_bytes());
}

/// A Q8_0 row as a column for weights stored as `q + BIAS`.
fn pack_col_q8_0<const BIAS: i32>(k: usize, row: &[u8], out: &mut [u8]) {
    let f = PanelFormat { sub: 32, min: false };
    assert_eq!(k % QK, 0, "panel: k = {k} is not a whole number of blocks");
    assert!(out.len() >= f.col_bytes(k), "panel: {} bytes for a column of {k}", out.len());
    for (b, blk) in take_blocks::<BlockQ8_0>(row, k / QK).iter().enumerate() {
        let sum: i32 = blk.qs.iter().map(|&v| v as i32).sum();
        let y: &[i8] = bytemuck::cast_slice(&blk.qs);
        put_col(&mut out[b * f.col_sub_bytes()..], y, -BIAS * sum, f16le(blk.d), 0.0);
    }
}

/// A Q8_K row as 32-element sub-blocks with the min term's `d · Σ y` (Q4_K, Q5_K).
fn pack_col_q8_k_32(k: usize, row: &[u8], out: &mut [u8]) {
    let f = PanelFormat { sub: 32, min: true };
    assert_eq!(k % QK_K, 0, "panel: k = {k} is not a whole number of super-blocks");
    assert!(out.len() >= f.col_bytes(k), "panel: {} bytes for a column of {k}", out.len());
    for (b, blk) in take_blocks::<BlockQ8K>(row, k / QK_K).iter().enumerate() {
        let d = f32::from_le_bytes(blk.d);
        for j in 0..8 {
            let sum =
                i16::from_le_bytes(blk.bsums[2 * j]) as i32 + i16::from_le_bytes(blk.bsums[2 * j + 1]) as i32;
            let y = &blk.qs[32 * j..32 * j + 32];
            put_col(&mut out[(b * 8 + j) * f.col_sub_bytes()..], y, 0, d, d * sum as f32);
        }
    }
}

/// A Q8_K row as 32-element sub-blocks for weights stored as `q + BIAS`, no min term (IQ4_XS).
fn pack_col_q8_k_32_biased<const BIAS: i32>(k: usize, row: &[u8], out: &mut [u8]) {
    let f = PanelFormat { sub: 32, min: false };
    assert_eq!(k % QK_K, 0, "panel: k = {k} is not a whole number of super-blocks");
    assert!(out.len() >= f.col_bytes(k), "panel: {} bytes for a column of {k}", out.len());
    for (b, blk) in take_blocks::<BlockQ8K>(row, k / QK_K).iter().enumerate() {
        let d = f32::from_le_bytes(blk.d);
        for j in 0..8 {
            let sum =
                i16::from_le_bytes(blk.bsums[2 * j]) as i32 + i16::from_le_bytes(blk.bsums[2 * j + 1]) as i32;
            let y = &blk.qs[32 * j..32 * j + 32];
            put_col(&mut out[(b * 8 + j) * f.col_sub_bytes()..], y, -BIAS * sum, d, 0.0);
        }
    }
}

/// A Q8_K row as 16-element sub-blocks for weights stored as `q + BIAS` (Q6_K: 32; the grid types:
/// [`GRID_BIAS`]).
fn pack_col_q8_k_16<const BIAS: i32>(k: usize, row: &[u8], out: &mut [u8]) {
    let f = PanelFormat { sub: 16, min: false };
    assert_eq!(k % QK_K, 0, "panel: k = {k} is not a whole number of super-blocks");
    assert!(out.len() >= f.col_bytes(k), "panel: {} bytes for a column of {k}", out.len());
    for (b, blk) in take_blocks::<BlockQ8K>(row, k / QK_K).iter().enumerate() {
        let d = f32::from_le_bytes(blk.d);
        for j in 0..16 {
            let sum = i16::from_le_bytes(blk.bsums[j]) as i32;
            let y = &blk.qs[16 * j..16 * j + 16];
            put_col(&mut out[(b * 16 + j) * f.col_sub_bytes()..], y, -BIAS * sum, d, 0.0);
        }
    }
}
