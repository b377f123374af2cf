//! Scalar models of ggml's SVE one-row dot products of Q4_0 and Q8_0 against Q8_0
//! (`ggml_vec_dot_q4_0_q8_0` / `ggml_vec_dot_q8_0_q8_0` in ggml-cpu's `arch/arm/quants.c` under
//! `__ARM_FEATURE_SVE`, `nrc == 1`; with i8mm the two-row `smmla` kernels take even row pairs as in
//! the NEON build): the twins of `quant::aarch64::sve_quant`, portable so the order can be tested
//! anywhere. `w` is the number of f32 lanes of one SVE vector (4, 8 or 16).
//!
//! Blocks go in pairs, the first of each pair into accumulator 0, the second into accumulator 1,
//! each lane `acc = fma(float(lane), d_x·d_y, acc)` (SVE `fmla`, fused):
//! - `w = 4` (128-bit): 4 lanes, lane `l` the exact sum over elements `4l..4l+4` and `16+4l..16+4l+4`;
//! - `w ≥ 8`: 8 lanes, lane `l` the sum over elements `4l..4l+4` (at 512 bits only the first 8 lanes
//!   of a vector carry a block: the rest stay zero and are outside the reduction).
//!
//! The result is `faddv(acc0 + acc1)` (lane by lane, then SVE's halving reduction), except Q8_0 at
//! 512 bits, which holds both blocks of a pair in one vector, lanes 0..8 and 8..16, and reduces it
//! whole: `faddv(acc0) + faddv(acc1)`. An odd last block follows the generic C step
//! ([`NeonBlock::tail`], the same as the NEON build's).
//!
//! Q2_K (`ggml_vec_dot_q2_K_q8_K`, the one K-quant whose SVE one-row float steps differ from the
//! NEON build's) keeps one accumulator of 4 lanes (128-bit) or 8 lanes (256 and 512 bits: only 8 are
//! used). Element `e` of a super-block feeds lane `(e mod 4L)/4` (`L` lanes), scaled by its group's
//! scale; min `g` times bsum `g` feeds lane `g mod L`. Per super-block, lane by lane,
//! `acc = fma(f32(mins), −(y.d·x.dmin), acc)`, then `acc = fma(f32(sums), y.d·x.d, acc)`; the result
//! `faddv(acc)`.

use super::neon_order::{NeonBlock, Q40, Q80};
use super::sve_float::faddv;
use crate::quant::blocks::*;

/// The exact integer lanes of one block for an SVE vector of `w` f32 lanes.
fn lanes<B: NeonBlock>(x: &B::X, y: &B::Y, w: usize) -> Vec<i32> {
    let (wt, q) = (B::weights(x), B::qs(y));
    let p = |e: usize| wt[e] * q[e] as i32;
    if w == 4 {
        (0..4).map(|l| (0..4).map(|j| p(4 * l + j) + p(16 + 4 * l + j)).sum()).collect()
    } else {
        (0..8).map(|l| (0..4).map(|j| p(4 * l + j)).sum()).collect()
    }
}

/// ggml's SVE one-row `vec_dot` of `B` for `w` f32 lanes; `split` reduces the two accumulators
/// separately (Q8_0 at 512 bits).
fn vec_dot_blocks<B: NeonBlock>(xs: &[B::X], ys: &[B::Y], w: usize, split: bool) -> f32 {
    let width = if w == 4 { 4 } else { 8 };
    let (mut acc0, mut acc1) = (vec![0f32; width], vec![0f32; width]);
    let nb = xs.len();
    let mut ib = 0;
    while ib + 1 < nb {
        for (acc, i) in [(&mut acc0, ib), (&mut acc1, ib + 1)] {
            let d = B::d(&xs[i], &ys[i]);
            for (a, l) in acc.iter_mut().zip(lanes::<B>(&xs[i], &ys[i], w)) {
                *a = (l as f32).mul_add(d, *a);
            }
        }
        ib += 2;
    }
    let mut sumf = if split {
        faddv(&acc0) + faddv(&acc1)
    } else {
        let s: Vec<f32> = acc0.iter().zip(&acc1).map(|(a, b)| a + b).collect();
        faddv(&s)
    };
    if ib < nb {
        let s: i32 = lanes::<B>(&xs[ib], &ys[ib], w).iter().sum();
        sumf = B::tail(sumf, s, &xs[ib], &ys[ib]);
    }
    sumf
}

fn rows<'a, B: NeonBlock>(n: usize, x: &'a [u8], y: &'a [u8]) -> (&'a [B::X], &'a [B::Y]) {
    assert_eq!(n % QK, 0, "vec_dot: n = {n} is not a whole number of blocks of {QK}");
    (take_blocks::<B::X>(x, n / QK), take_blocks::<B::Y>(y, n / QK))
}

/// Q4_0 · Q8_0 in ggml's SVE order for `w` f32 lanes per vector.
pub fn vec_dot_q4_0_q8_0_sve(w: usize, n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<Q40>(n, x, y);
    vec_dot_blocks::<Q40>(xs, ys, w, false)
}

/// Q8_0 · Q8_0 in ggml's SVE order for `w` f32 lanes per vector.
pub fn vec_dot_q8_0_q8_0_sve(w: usize, n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<Q80>(n, x, y);
    vec_dot_blocks::<Q80>(xs, ys, w, w == 16)
}

/// Q2_K · Q8_K in ggml's SVE order for `w` f32 lanes per vector.
pub fn vec_dot_q2_k_q8_k_sve(w: usize, n: usize, x: &[u8], y: &[u8]) -> f32 {
    use crate::dtype::QK_K;
    assert_eq!(n % QK_K, 0, "vec_dot: n = {n} is not a whole number of blocks of {QK_K}");
    let (xs, ys) = (take_blocks::<BlockQ2K>(x, n / QK_K), take_blocks::<BlockQ8K>(y, n / QK_K));
    let lanes = if w == 4 { 4 } else { 8 };
    let mut acc = vec![0f32; lanes];
    for (bx, by) in xs.iter().zip(ys) {
        let yd = f32::from_le_bytes(by.d);
        let (d, dmin) = (yd * f16le(bx.d), -yd * f16le(bx.dmin));
        let mut mins = vec![0i32; lanes];
        for g in 0..16 {
            mins[g % lanes] += (bx.scales[g] >> 4) as i32 * i16::from_le_bytes(by.bsums[g]) as i32;
        }
        let mut sums = vec![0i32; lanes];
        for e in 0..QK_K {
            let (half, idx) = (e / 128, e % 128);
            let q = (bx.qs[32 * half + idx % 32] >> (2 * (idx / 32))) & 3;
            let scale = (bx.scales[e / 16] & 0xF) as i32;
            sums[(e % (4 * lanes)) / 4] += scale * q as i32 * by.qs[e] as i32;
        }
        for l in 0..lanes {
            acc[l] = (mins[l] as f32).mul_add(dmin, acc[l]);
            acc[l] = (sums[l] as f32).mul_add(d, acc[l]);
        }
    }
    faddv(&acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two Q4_0 blocks of weight 1 (nibble 9) with scale 1.
    fn q4_ones() -> Vec<u8> {
        let mut b = Vec::new();
        for _ in 0..2 {
            b.extend(half::f16::from_f32(1.0).to_bits().to_le_bytes());
            b.extend([0x99u8; 16]);
        }
        b
    }

    /// Q2_K with every quant 1, scale 1 and min 1 against activations of 1: each element gives
    /// `d·1 − dmin·1` summed over 256 elements: 256·(d − dmin) with d = 0.5, dmin = 0.25 → 64.
    #[test]
    fn q2_k_hand_computed() {
        let mut x = vec![0x11u8; 16]; // scale 1, min 1 per group
        x.extend([0x55u8; 64]); // every 2-bit quant 1
        x.extend(half::f16::from_f32(0.5).to_bits().to_le_bytes());
        x.extend(half::f16::from_f32(0.25).to_bits().to_le_bytes());
        let mut y = 1.0f32.to_le_bytes().to_vec();
        y.extend([1u8; 256]);
        for _ in 0..16 {
            y.extend(16i16.to_le_bytes());
        }
        for w in [4, 8, 16] {
            assert_eq!(vec_dot_q2_k_q8_k_sve(w, 256, &x, &y), 64.0);
        }
    }

    /// A hand-computed case: two Q8_0 blocks of ones against ones with scales 1 give 64, in every
    /// lane layout; an odd third block takes the tail step.
    #[test]
    fn ones_sum_to_the_element_count() {
        let block = |d: f32| {
            let mut b = half::f16::from_f32(d).to_bits().to_le_bytes().to_vec();
            b.extend([1u8; 32]);
            b
        };
        let x: Vec<u8> = (0..3).flat_map(|_| block(1.0)).collect();
        for w in [4, 8, 16] {
            assert_eq!(vec_dot_q8_0_q8_0_sve(w, 96, &x, &x), 96.0);
            assert_eq!(vec_dot_q4_0_q8_0_sve(w, 64, &q4_ones(), &x), 64.0 * 1.0);
            assert_eq!(vec_dot_q8_0_q8_0_sve(w, 64, &x, &x), 64.0);
        }
    }
}
