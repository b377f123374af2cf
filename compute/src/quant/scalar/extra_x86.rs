//! Scalar models of ggml's x86 AVX2 dot products of Q1_0 and NVFP4 against Q8_0 (read from
//! `ggml_vec_dot_q1_0_q8_0` and `ggml_vec_dot_nvfp4_q8_0` under `__AVX2__` in ggml-cpu's
//! `arch/x86/quants.c`, which ggml's native AVX-512 build runs too), and of Q2_0's (ggml has only the
//! generic C loop for it; GCC keeps its float steps in source order and contracts each `+= a * b`
//! into one FMA, read from both reference builds' machine code): the bit-exact twins of the AVX2
//! kernels the `avx2` and `avx512` numerics profiles install (`quant::x86_64::avx2::extra`).
//!
//! Both form eight 32-bit lanes per 32 activations, lane `l` the exact sum over elements `4l..4l + 4`
//! (`maddubs` + `madd`):
//! * Q1_0 (128 elements, four Q8_0 blocks): per Q8_0 block `K` the lanes of `±y`; the block's vector
//!   is `d_y0·float(lanes_0)`, then `fma(d_yK, float(lanes_K), ·)` for K = 1..3, and
//!   `acc = fma(d_x, block, acc)`; the result `hsum(acc)`;
//! * NVFP4 (64 elements, two Q8_0 blocks, a UE4M3 scale per 16): lanes of `w·y`, each lane scaled by
//!   `s = ue4m3(d_sub)·d_y` of its 16 elements (lanes 0..4 the first, 4..8 the second), the first Q8_0
//!   block's then the second's `acc = fma(s, float(lanes), acc)`; the result `hsum(acc)`;
//! * Q2_0 (64 elements, two Q8_0 blocks): per Q2_0 block `sumi = 0`, then for each Q8_0 block `K`
//!   `sumi = fma(float(isum_K), d_yK, sumi)` with `isum_K` the exact sum of `(q-1)·y`, then
//!   `sum = fma(sumi, d_x, sum)`, all in scalar registers.

use super::kquants_x86::hsum8;
use crate::quant::blocks::*;

/// The block count of `n` elements in blocks of `qk`, with the rows' lengths checked (`xb` bytes per
/// weight block, Q8_0 activations).
pub(super) fn check(n: usize, qk: usize, x: &[u8], xb: usize, y: &[u8]) -> usize {
    assert_eq!(n % qk, 0, "vec_dot: n = {n} is not a whole number of blocks");
    let nb = n / qk;
    assert!(
        x.len() >= nb * xb && y.len() >= n / QK * std::mem::size_of::<BlockQ8_0>(),
        "vec_dot: rows too short"
    );
    nb
}

/// Q1_0 · Q8_0 in ggml's AVX2 order.
pub fn vec_dot_q1_0_q8_0_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = check(n, 128, x, std::mem::size_of::<BlockQ1_0>(), y);
    let (xs, ys) = (take_blocks::<BlockQ1_0>(x, nb), take_blocks::<BlockQ8_0>(y, 4 * nb));
    let mut acc = [0f32; 8];
    for (ib, bx) in xs.iter().enumerate() {
        let mut block = [0f32; 8];
        for k in 0..4 {
            let by = &ys[4 * ib + k];
            let lanes: [i32; 8] = std::array::from_fn(|l| {
                (4 * l..4 * l + 4)
                    .map(|e| {
                        let bit = (bx.qs[4 * k + e / 8] >> (e % 8)) & 1;
                        let v = by.qs[e] as i32;
                        if bit != 0 {
                            v
                        } else {
                            -v
                        }
                    })
                    .sum()
            });
            let dy = f16le(by.d);
            for (b, l) in block.iter_mut().zip(lanes) {
                *b = if k == 0 { dy * l as f32 } else { dy.mul_add(l as f32, *b) };
            }
        }
        let d = f16le(bx.d);
        for (a, b) in acc.iter_mut().zip(block) {
            *a = d.mul_add(b, *a);
        }
    }
    hsum8(acc)
}

/// NVFP4 · Q8_0 in ggml's AVX2 order.
pub fn vec_dot_nvfp4_q8_0_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = check(n, 64, x, std::mem::size_of::<BlockNvfp4>(), y);
    let (xs, ys) = (take_blocks::<BlockNvfp4>(x, nb), take_blocks::<BlockQ8_0>(y, 2 * nb));
    let mut acc = [0f32; 8];
    for (ib, bx) in xs.iter().enumerate() {
        for p in 0..2 {
            let by = &ys[2 * ib + p];
            let dy = f16le(by.d);
            for (l, a) in acc.iter_mut().enumerate() {
                let lane: i32 = (4 * l..4 * l + 4)
                    .map(|t| {
                        let (s, j) = (2 * p + t / 16, t % 16);
                        let byte = bx.qs[s * 8 + j % 8];
                        let nib = if j < 8 { byte & 0xF } else { byte >> 4 };
                        KVALUES_MXFP4[nib as usize] as i32 * by.qs[t] as i32
                    })
                    .sum();
                let scale = ue4m3_half(bx.d[2 * p + l / 4]) * dy;
                *a = scale.mul_add(lane as f32, *a);
            }
        }
    }
    hsum8(acc)
}

/// Q2_0 · Q8_0 in the order of ggml's generic loop as GCC compiles it for x86 (FMA-contracted).
pub fn vec_dot_q2_0_q8_0_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = check(n, 64, x, std::mem::size_of::<BlockQ2_0>(), y);
    let (xs, ys) = (take_blocks::<BlockQ2_0>(x, nb), take_blocks::<BlockQ8_0>(y, 2 * nb));
    let mut sum = 0f32;
    for (ib, bx) in xs.iter().enumerate() {
        let mut sumi = 0f32;
        for k in 0..2 {
            let by = &ys[2 * ib + k];
            let isum: i32 = (0..32)
                .map(|e| {
                    let q = ((bx.qs[8 * k + e / 4] >> (2 * (e % 4))) & 3) as i32 - 1;
                    q * by.qs[e] as i32
                })
                .sum();
            sumi = (isum as f32).mul_add(f16le(by.d), sumi);
        }
        sum = sumi.mul_add(f16le(bx.d), sum);
    }
    sum
}
