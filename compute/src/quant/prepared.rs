//! Prepared activations for generation: a Q8_0 (or Q8_1) activation row is met by every weight row of a
//! matrix, so what the one-column dot recomputes per weight row from the activation alone (its
//! f16 scale as f32, the offset term `-bias · Σ y` of the weights' stored bias, per four-element
//! lane) is computed once per row here. Under the ggml-order profiles (no panels) the prompt's
//! products of 9+ activation rows read prepared rows as well, through the type's tiled `gemm`. The prepared dots form the same exact integer lanes and
//! the same float steps as their kernel set's `vec_dot` (tested bit for bit), with fewer
//! instructions per block.
//! ref: ggml-compute-semantics.md §2.2 (Q8_0), §2.3.

use bytemuck::{Pod, Zeroable};

use super::blocks::{f16le, take_blocks, BlockQ8_0, BlockQ8_1, QK};
use super::{GemmFn, VecDotFn};
use crate::dtype::GgmlType;

/// One block of a prepared Q8_0 row.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct PreparedQ8 {
    /// The quants.
    pub qs: [i8; QK],
    /// Per lane `l` (elements `4l..4l + 4`): `-bias · Σ y` (i32, little-endian).
    pub off: [[u8; 4]; 8],
    /// The block's scale as f32 (little-endian).
    pub d: [u8; 4],
    /// Q8_1 rows: the block's `d · Σ y` as f32 (little-endian), next to `d`; 0 for Q8_0 rows.
    pub s: [u8; 4],
}

const _: () = assert!(std::mem::size_of::<PreparedQ8>() == 72 && std::mem::align_of::<PreparedQ8>() == 1);

/// A type's prepared dot: the weights' stored bias (`q + bias` unsigned) and the dot of a weight
/// row with a prepared row.
#[derive(Clone, Copy, Debug)]
pub struct PreparedDot {
    /// The bias the activation offsets are computed for.
    pub bias: i32,
    /// `dot(n, weight row, prepared row)`: `vec_dot`'s value bit for bit.
    pub dot: VecDotFn,
    /// The register-tiled product of weight rows × prepared rows (prompt processing), each output
    /// `dot`'s bits, when the kernel set has one.
    pub gemm: Option<GemmFn>,
}

/// Bytes of a prepared row of `k` elements.
pub const fn row_bytes(k: usize) -> usize {
    k / QK * std::mem::size_of::<PreparedQ8>()
}

/// Prepares a row of `k` elements of `vdt` (Q8_0 or Q8_1) for weights stored with `bias`
/// (`out` holds [`row_bytes`]).
pub fn prepare(k: usize, vdt: GgmlType, bias: i32, q8: &[u8], out: &mut [u8]) {
    assert_eq!(k % QK, 0, "prepare: k = {k} is not a whole number of blocks");
    assert!(out.len() >= row_bytes(k), "prepare: {} bytes for a row of {k}", out.len());
    let outs: &mut [PreparedQ8] = bytemuck::cast_slice_mut(&mut out[..row_bytes(k)]);
    let fill = |o: &mut PreparedQ8, qs: &[i8; QK], d: f32, s: f32| {
        o.qs = *qs;
        for (l, off) in o.off.iter_mut().enumerate() {
            let sum: i32 = qs[4 * l..4 * l + 4].iter().map(|&v| v as i32).sum();
            *off = (-bias * sum).to_le_bytes();
        }
        o.d = d.to_le_bytes();
        o.s = s.to_le_bytes();
    };
    match vdt {
        GgmlType::Q8_0 => {
            for (b, o) in take_blocks::<BlockQ8_0>(q8, k / QK).iter().zip(outs.iter_mut()) {
                fill(o, &b.qs, f16le(b.d), 0.0);
            }
        }
        GgmlType::Q8_1 => {
            for (b, o) in take_blocks::<BlockQ8_1>(q8, k / QK).iter().zip(outs.iter_mut()) {
                fill(o, &b.qs, f16le(b.d), f16le(b.s));
            }
        }
        other => panic!("prepare: {other} rows are not prepared"),
    }
}
