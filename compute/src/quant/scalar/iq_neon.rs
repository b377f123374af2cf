//! Scalar models of ggml's aarch64 NEON dot products of the grid IQ types and TQ1_0 / TQ2_0 against Q8_K
//! (`ggml_vec_dot_iq*_q8_K` under `__ARM_NEON` in ggml-cpu's `arch/arm/quants.c`, which the
//! armv8.2-a+dotprod, armv8.6-a+i8mm and SVE builds all run: ggml has no two-row, llamafile or SVE
//! kernel for these types), the bit-exact twins of the kernels the `neon-dotprod`, `neon-i8mm` and
//! `sve` profiles install (`quant::aarch64::iq`, `GgmlGrid`).
//!
//! The integer parts are exact in any order; what the models fix is where ggml leaves integers for
//! floats and how GCC contracts each `a += b * c` (all of them into `fmadd`, read off the reference
//! builds' machine code from tests/peer/build-peer-aarch64.sh). Per super-block, with
//! `d = d_x·d_y` rounded once:
//! * IQ2_XXS, IQ3_XXS: two float accumulators per super-block; 32 elements at a time, the raw
//!   integer dot `p` of the block (no scale) goes in by `fma(float(p), 0.5 + s, acc)` (`s` the 4-bit
//!   scale field), the even blocks into the first accumulator, the odd ones into the second; then
//!   `sum = fma(acc1 + acc2, d, sum)` and at the end `C·sum` (`C` = 1/4 for IQ2_XXS, 1/2 for IQ3_XXS);
//! * IQ2_XS, IQ2_S, IQ3_S: the integer `Σ scale·p` of the whole super-block, `sum = fma(float(that),
//!   d, sum)`, `C·sum` at the end (1/8, 1/8, 1);
//! * IQ1_S, IQ1_M: the grid part `S = Σ scale·g·y` (`g ∈ {−1, 0, 1}`) and the delta part `Δ` apart,
//!   `v = fma(float(Δ), 1/8, float(S))` and `sum = fma(d, v, sum)`. IQ1_S takes `Δ` from the Q8_K
//!   `bsums` (`Σ_ib scale_ib·δ_ib·(bsum_2ib + bsum_2ib+1)`), IQ1_M from the activations themselves
//!   (`Σ scale·δ·y`, δ per 8 elements); IQ1_M's `d` is its spread f16 scale times `d_y`.
//!
//! * TQ1_0, TQ2_0: the digits `q ∈ {0, 1, 2}` against the activations less the Q8_K `bsums`,
//!   `sum = fma(float(that), d, sum)`.
//!
//! The reference kernels of [`super::iq`] (ggml's generic C) instead multiply and add each
//! super-block's `d_x·d_y·float(Σ scale·p)` unfused, so they differ in the last bit now and then.

use super::iq::{
    block_isum, decode_iq1_m, decode_iq1_s, decode_iq2_xxs, decode_iq3_xxs, iq1_m_d, iq1_s_delta_isum,
    iq1_split, Decoded, IqSpec, IQ2_S_SPEC, IQ2_XS_SPEC, IQ3_S_SPEC,
};
use super::iq_x86::{pairs, q8k_d};
use crate::dtype::QK_K;
use crate::quant::blocks::*;

/// The raw integer dot (no scale) of the 32-element block `j` of `dec` against `q8`.
fn block32(dec: &Decoded, q8: &[i8; QK_K], j: usize) -> i32 {
    dec.v[32 * j..32 * j + 32].iter().zip(&q8[32 * j..]).map(|(&v, &a)| v as i32 * a as i32).sum()
}

/// The XXS order: per pair of 32-element blocks `fma(float(p), 0.5 + s, acc_even/odd)`, then
/// `fma(acc1 + acc2, d, sum)`; `c·sum` at the end.
fn xxs<B: bytemuck::Pod + super::iq::HasD>(
    decode: fn(&B) -> Decoded,
    c: f32,
    n: usize,
    x: &[u8],
    y: &[u8],
) -> f32 {
    let mut sum = 0f32;
    for (bx, by) in pairs::<B>(n, x, y) {
        let d = super::iq::d_f16(bx) * q8k_d(by);
        let dec = decode(bx);
        let (mut acc1, mut acc2) = (0f32, 0f32);
        for k in 0..4 {
            let (j1, j2) = (2 * k, 2 * k + 1);
            // The decoded scale is 2s + 1, so 0.5 + s is half of it (exact).
            acc1 = (block32(&dec, &by.qs, j1) as f32).mul_add(dec.scale[2 * j1] as f32 * 0.5, acc1);
            acc2 = (block32(&dec, &by.qs, j2) as f32).mul_add(dec.scale[2 * j2] as f32 * 0.5, acc2);
        }
        sum = (acc1 + acc2).mul_add(d, sum);
    }
    c * sum
}

/// The integer order: `fma(float(Σ scale·p), d, sum)` per super-block; `C·sum` at the end (the
/// types' own `C`, as `spec` has it).
fn integer<B: bytemuck::Pod>(spec: &IqSpec<B>, n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bx, by) in pairs::<B>(n, x, y) {
        sum = (block_isum(&(spec.decode)(bx), &by.qs) as f32).mul_add((spec.d)(bx) * q8k_d(by), sum);
    }
    spec.c * sum
}

/// `Σ scale·w(e)·y(e)` over a super-block, `w` a function of the decoded value.
fn scaled(dec: &Decoded, q8: &[i8; QK_K], w: impl Fn(i8) -> i32) -> i32 {
    (0..QK_K).map(|e| dec.scale[e / 16] * w(dec.v[e]) * q8[e] as i32).sum()
}

/// ggml's IQ1 step: `fma(d, fma(float(Δ), 1/8, float(S)), sum)`.
fn iq1_step(sum: f32, d: f32, s: i32, delta: i32) -> f32 {
    d.mul_add((delta as f32).mul_add(0.125, s as f32), sum)
}

/// IQ2_XXS · Q8_K in ggml's NEON order.
pub fn vec_dot_iq2_xxs_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    xxs::<BlockIq2Xxs>(decode_iq2_xxs, 0.25, n, x, y)
}

/// IQ3_XXS · Q8_K in ggml's NEON order.
pub fn vec_dot_iq3_xxs_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    xxs::<BlockIq3Xxs>(decode_iq3_xxs, 0.5, n, x, y)
}

/// IQ2_XS · Q8_K in ggml's NEON order.
pub fn vec_dot_iq2_xs_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    integer(&IQ2_XS_SPEC, n, x, y)
}

/// IQ2_S · Q8_K in ggml's NEON order.
pub fn vec_dot_iq2_s_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    integer(&IQ2_S_SPEC, n, x, y)
}

/// IQ3_S · Q8_K in ggml's NEON order.
pub fn vec_dot_iq3_s_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    integer(&IQ3_S_SPEC, n, x, y)
}

/// IQ1_S · Q8_K in ggml's NEON order.
pub fn vec_dot_iq1_s_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bx, by) in pairs::<BlockIq1S>(n, x, y) {
        let dec = decode_iq1_s(bx);
        let s = scaled(&dec, &by.qs, |v| iq1_split(v).0);
        sum = iq1_step(sum, f16le(bx.d) * q8k_d(by), s, iq1_s_delta_isum(bx, by));
    }
    sum
}

/// IQ1_M · Q8_K in ggml's NEON order.
pub fn vec_dot_iq1_m_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bx, by) in pairs::<BlockIq1M>(n, x, y) {
        let dec = decode_iq1_m(bx);
        let s = scaled(&dec, &by.qs, |v| iq1_split(v).0);
        let delta = scaled(&dec, &by.qs, |v| iq1_split(v).1);
        sum = iq1_step(sum, iq1_m_d(bx) * q8k_d(by), s, delta);
    }
    sum
}

/// The ternary order: `fma(float(Σ q·y − Σ bsums), d_x·d_y, sum)` with the digits `q = v + 1`.
fn ternary<B: bytemuck::Pod + super::iq::HasD>(
    decode: fn(&B) -> Decoded,
    n: usize,
    x: &[u8],
    y: &[u8],
) -> f32 {
    let mut sum = 0f32;
    for (bx, by) in pairs::<B>(n, x, y) {
        let dec = decode(bx);
        let digits: i32 = dec.v.iter().zip(&by.qs).map(|(&v, &q)| (v as i32 + 1) * q as i32).sum();
        let bsums: i32 = by.bsums.iter().map(|b| i16::from_le_bytes(*b) as i32).sum();
        sum = ((digits - bsums) as f32).mul_add(super::iq::d_f16(bx) * q8k_d(by), sum);
    }
    sum
}

/// TQ1_0 · Q8_K in ggml's NEON order.
pub fn vec_dot_tq1_0_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    ternary::<BlockTq1_0>(super::iq::decode_tq1_0, n, x, y)
}

/// TQ2_0 · Q8_K in ggml's NEON order.
pub fn vec_dot_tq2_0_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    ternary::<BlockTq2_0>(super::iq::decode_tq2_0, n, x, y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::GgmlType;
    use crate::quant::scalar;
    use crate::quant::testing::random_grid_blocks;
    use crate::quant::tests::assert_model_is_another_order;
    use rand::{Rng, SeedableRng};

    fn models() -> [(GgmlType, crate::quant::VecDotFn); 9] {
        use GgmlType::*;
        [
            (IQ2_XXS, vec_dot_iq2_xxs_q8_k_neon),
            (IQ2_XS, vec_dot_iq2_xs_q8_k_neon),
            (IQ2_S, vec_dot_iq2_s_q8_k_neon),
            (IQ3_XXS, vec_dot_iq3_xxs_q8_k_neon),
            (IQ3_S, vec_dot_iq3_s_q8_k_neon),
            (IQ1_S, vec_dot_iq1_s_q8_k_neon),
            (IQ1_M, vec_dot_iq1_m_q8_k_neon),
            (TQ1_0, vec_dot_tq1_0_q8_k_neon),
            (TQ2_0, vec_dot_tq2_0_q8_k_neon),
        ]
    }

    /// Random TQ1_0 / TQ2_0 blocks with a scale of 0.01 (their bytes are all valid digits).
    fn ternary_row(r: &mut rand::rngs::StdRng, t: GgmlType, nb: usize) -> Vec<u8> {
        let size = t.type_size();
        let at = if t == GgmlType::TQ1_0 { 52 } else { 64 };
        let mut q: Vec<u8> = (0..nb * size).map(|_| r.random()).collect();
        for b in q.chunks_exact_mut(size) {
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
        }
        q
    }

    /// Each model is the dot product of the dequantized operands and, over many rows, not the
    /// reference's order (`quant::tests::assert_model_is_another_order`).
    #[test]
    fn models_are_the_reference_dot_in_another_order() {
        let mut r = rand::rngs::StdRng::seed_from_u64(2501);
        for (t, model) in models() {
            let nb = 4;
            assert_model_is_another_order(t, nb * QK_K, model, &mut r, |r| {
                random_grid_blocks(t, nb, 1.0, r.random()).unwrap_or_else(|| ternary_row(r, t, nb))
            });
        }
    }

    /// IQ1_M's model splits `8·g + δ` exactly: with grid row 0 (all −1) and every delta +1, each
    /// weight is `−7/8` at scale 1, so the dot is `d_y·(−7·Σq/8)`, rounded once (hand-computed).
    #[test]
    fn iq1_m_uniform_block_is_hand_computed() {
        // qs = 0 and qh = 0: grid index 0, delta sign clear (+1); 3-bit scales 0 (scale 1); the
        // f16 super-block scale 1.0 (0x3C00) in the top nibbles of the four scale words.
        let mut x = vec![0u8; std::mem::size_of::<BlockIq1M>()];
        for k in 0..4 {
            x[48 + 2 * k + 1] = (((0x3C00u16 >> (4 * k)) & 0xF) as u8) << 4;
        }
        let a: Vec<f32> = (0..QK_K).map(|e| (e % 7) as f32 - 2.0).collect();
        let mut y = vec![0u8; std::mem::size_of::<BlockQ8K>()];
        scalar::q8_k_from_f32(&a, &mut y);
        let yb: &BlockQ8K = bytemuck::from_bytes(&y);
        let sum_q: i32 = yb.qs.iter().map(|&q| q as i32).sum();
        assert_ne!(sum_q, 0);
        let want = f32::from_le_bytes(yb.d) * (-7 * sum_q) as f32 * 0.125;
        assert_eq!(vec_dot_iq1_m_q8_k_neon(QK_K, &x, &y), want);
        assert_eq!(crate::quant::scalar::iq1_m_d(bytemuck::from_bytes(&x)), 1.0);
    }
}
