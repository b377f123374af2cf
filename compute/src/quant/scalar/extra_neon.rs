//! Scalar models of ggml's aarch64 NEON dot products of Q1_0, Q2_0 and NVFP4 against Q8_0
//! (`ggml_vec_dot_{q1_0,q2_0,nvfp4}_q8_0` under `__ARM_NEON` in ggml-cpu's `arch/arm/quants.c`, the
//! same code in its dotprod, i8mm and SVE builds; the multiply-add contractions read off their
//! machine code). They are what the `neon-dotprod`, `neon-i8mm` and `sve` tables install for these
//! types: plain scalar code, as the reference kernels were (ggml has no two-row kernel for them).
//!
//! * Q1_0 (128 elements, four Q8_0 blocks) and Q2_0 (64 elements, two Q8_0 blocks): per Q8_0 block,
//!   four lanes of exact integer sums (`sdot`: lane `l` over elements `4l..4l + 4` and
//!   `16 + 4l..16 + 4l + 4`) of the weights (`±1`; `q − 1`) times the activations; each lane is
//!   converted and multiplied by `d_x·d_y` and added to its accumulator lane, multiply and add
//!   rounded apart (`vmlaq_n_f32` is `fmul` + `fadd`), block after block; the result is
//!   `(a0 + a1) + (a2 + a3)` (`faddp` twice).
//! * NVFP4 (64 elements, a UE4M3 scale per 16): per super-block four lanes, lane `s` the exact sum of
//!   sub-block `s`, `acc_s = fma(float(lane_s), ue4m3(d_s)·d_y, acc_s)` (`fmla`; `d_y` of the Q8_0
//!   block holding the sub-block); the result `(a0 + a1) + (a2 + a3)`.

use super::extra::{nvfp4_values, q1_0_values, q2_0_values};
use super::extra_x86::check;
use super::neon_order::hadd;
use crate::quant::blocks::*;

/// The four `sdot` lanes of 32 weights `w` against one Q8_0 block.
fn sdot_lanes(w: &[i8], y: &[i8; QK]) -> [i32; 4] {
    std::array::from_fn(|l| {
        (4 * l..4 * l + 4).chain(16 + 4 * l..16 + 4 * l + 4).map(|e| w[e] as i32 * y[e] as i32).sum()
    })
}

/// Q1_0 / Q2_0: per Q8_0 block `acc_l = acc_l + float(lane_l)·(d_x·d_y)`, unfused.
fn binary_order(acc: &mut [f32; 4], w: &[i8], dx: f32, by: &BlockQ8_0) {
    let d = dx * f16le(by.d);
    for (a, l) in acc.iter_mut().zip(sdot_lanes(w, &by.qs)) {
        *a += l as f32 * d;
    }
}

/// Q1_0 · Q8_0 in ggml's NEON order.
pub fn vec_dot_q1_0_q8_0_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = check(n, 128, x, std::mem::size_of::<BlockQ1_0>(), y);
    let (xs, ys) = (take_blocks::<BlockQ1_0>(x, nb), take_blocks::<BlockQ8_0>(y, 4 * nb));
    let mut acc = [0f32; 4];
    for (ib, bx) in xs.iter().enumerate() {
        let w = q1_0_values(bx);
        for k in 0..4 {
            binary_order(&mut acc, &w[32 * k..32 * k + 32], f16le(bx.d), &ys[4 * ib + k]);
        }
    }
    hadd(acc)
}

/// Q2_0 · Q8_0 in ggml's NEON order.
pub fn vec_dot_q2_0_q8_0_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = check(n, 64, x, std::mem::size_of::<BlockQ2_0>(), y);
    let (xs, ys) = (take_blocks::<BlockQ2_0>(x, nb), take_blocks::<BlockQ8_0>(y, 2 * nb));
    let mut acc = [0f32; 4];
    for (ib, bx) in xs.iter().enumerate() {
        let w = q2_0_values(bx);
        for k in 0..2 {
            binary_order(&mut acc, &w[32 * k..32 * k + 32], f16le(bx.d), &ys[2 * ib + k]);
        }
    }
    hadd(acc)
}

/// NVFP4 · Q8_0 in ggml's NEON order.
pub fn vec_dot_nvfp4_q8_0_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = check(n, 64, x, std::mem::size_of::<BlockNvfp4>(), y);
    let (xs, ys) = (take_blocks::<BlockNvfp4>(x, nb), take_blocks::<BlockQ8_0>(y, 2 * nb));
    let mut acc = [0f32; 4];
    for (ib, bx) in xs.iter().enumerate() {
        let w = nvfp4_values(bx);
        for (s, a) in acc.iter_mut().enumerate() {
            let by = &ys[2 * ib + s / 2];
            let q = &by.qs[(s % 2) * 16..(s % 2) * 16 + 16];
            let i: i32 = w[16 * s..16 * s + 16].iter().zip(q).map(|(&w, &q)| w as i32 * q as i32).sum();
            *a = (i as f32).mul_add(ue4m3_half(bx.d[s]) * f16le(by.d), *a);
        }
    }
    hadd(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::GgmlType;
    use crate::quant::scalar;
    use crate::quant::tests::assert_model_is_another_order;
    use rand::{Rng, SeedableRng};

    /// Each model is the dot product of the dequantized operands and, over many rows, not the
    /// reference's order (`quant::tests::assert_model_is_another_order`).
    #[test]
    fn models_are_the_dot_in_ggmls_neon_order() {
        use GgmlType::*;
        type FromF32 = fn(&[f32], &mut [u8]);
        let cases: [(GgmlType, crate::quant::VecDotFn, FromF32); 3] = [
            (Q1_0, vec_dot_q1_0_q8_0_neon, scalar::q1_0_from_f32),
            (Q2_0, vec_dot_q2_0_q8_0_neon, scalar::q2_0_from_f32),
            (NVFP4, vec_dot_nvfp4_q8_0_neon, scalar::nvfp4_from_f32),
        ];
        let mut r = rand::rngs::StdRng::seed_from_u64(2502);
        for (t, model, from_f32) in cases {
            let n = 512;
            assert_model_is_another_order(t, n, model, &mut r, |r| {
                let w: Vec<f32> = (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect();
                let mut x = vec![0u8; n / t.blck_size() * t.type_size()];
                from_f32(&w, &mut x);
                x
            });
        }
    }

    /// Q1_0 by hand: all-plus signs, scale 1, activations all one quant `q` at scale 1 → 128·q.
    #[test]
    fn q1_0_uniform_block_is_hand_computed() {
        let mut x = vec![0xFFu8; std::mem::size_of::<BlockQ1_0>()];
        x[..2].copy_from_slice(&half::f16::from_f32(1.0).to_bits().to_le_bytes());
        let mut y = Vec::new();
        for _ in 0..4 {
            y.extend_from_slice(&half::f16::from_f32(1.0).to_bits().to_le_bytes());
            y.extend(std::iter::repeat_n(3u8, QK));
        }
        assert_eq!(vec_dot_q1_0_q8_0_neon(128, &x, &y), 384.0);
    }
}
