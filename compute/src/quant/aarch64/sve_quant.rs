//! Q4_0 and Q8_0 one-row dot products in ggml's SVE order (the `sve` numerics profile):
//! `ggml_vec_dot_q4_0_q8_0` / `ggml_vec_dot_q8_0_q8_0` as llama.cpp's armv8.6-a+sve build runs them
//! for one row, for SVE vectors of `4·Q` f32 lanes (`Q` = 1, 2, 4). The order is described, and
//! modelled lane by lane, in `quant::scalar::sve_quant`; the kernels are NEON + dotprod code (an SVE
//! vector's block lanes are one or two NEON registers), equal to their twin for every `Q` on any
//! dotprod CPU (tests below). Two-row products keep ggml's `smmla` kernels, as ggml does.

use std::arch::aarch64::*;

use super::dot::{Dot, Sdot};
use super::legacy::{B32, Q40, Q80};
use super::sve_float::faddv;
use crate::dtype::GgmlType;
use crate::quant::blocks::*;
use crate::quant::dispatch::Kernels;
use crate::quant::scalar::neon_order::{self as no, NeonBlock};
use crate::quant::{VecDotFn, VecDotX4Fn};

/// A block's exact integer lanes: `[lo, hi]`, lane `l` of `lo` elements `4l..4l+4`, of `hi`
/// elements `16+4l..16+4l+4`.
#[inline(always)]
unsafe fn halves<B: B32>(x: &B::X, y: &B::Y) -> [int32x4_t; 2] {
    // SAFETY: in-bounds loads of the 32 quants; register arithmetic; dotprod enabled in callers.
    unsafe {
        let [a, b] = B::decode(x);
        let q = B::qs(y);
        let (u, v) = (vld1q_s8(q.as_ptr()), vld1q_s8(q.as_ptr().add(16)));
        [Sdot::dot(vdupq_n_s32(0), a, u), Sdot::dot(vdupq_n_s32(0), b, v)]
    }
}

/// One row in the SVE order for `4·Q` lanes; `SPLIT`: the two accumulators reduced apart.
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot1<B: B32, M: NeonBlock<X = B::X, Y = B::Y>, const Q: usize, const SPLIT: bool>(
    xs: &[B::X],
    ys: &[B::Y],
) -> f32 {
    // SAFETY: in-bounds block access (`ys.len() == xs.len()`, checked by the wrapper) and register
    // arithmetic.
    unsafe {
        let nb = xs.len();
        // acc[k] = [lanes 0..4, lanes 4..8] of accumulator k (only [0] used at 128 bits).
        let mut acc = [[vdupq_n_f32(0.0); 2]; 2];
        let mut ib = 0;
        while ib + 1 < nb {
            for (k, a) in acc.iter_mut().enumerate() {
                let (x, y) = (&xs[ib + k], &ys[ib + k]);
                let d = M::d(x, y);
                let [lo, hi] = halves::<B>(x, y);
                if Q == 1 {
                    a[0] = vfmaq_n_f32(a[0], vcvtq_f32_s32(vaddq_s32(lo, hi)), d);
                } else {
                    a[0] = vfmaq_n_f32(a[0], vcvtq_f32_s32(lo), d);
                    a[1] = vfmaq_n_f32(a[1], vcvtq_f32_s32(hi), d);
                }
            }
            ib += 2;
        }
        let [a0, a1] = acc;
        let r = if Q == 1 { 1 } else { 2 };
        let mut sumf = if SPLIT {
            faddv(&a0[..r]) + faddv(&a1[..r])
        } else {
            faddv(&[vaddq_f32(a0[0], a1[0]), vaddq_f32(a0[1], a1[1])][..r])
        };
        if ib < nb {
            let [lo, hi] = halves::<B>(&xs[ib], &ys[ib]);
            sumf = M::tail(sumf, vaddvq_s32(vaddq_s32(lo, hi)), &xs[ib], &ys[ib]);
        }
        sumf
    }
}

fn rows<'a, B: B32>(n: usize, x: &'a [u8], y: &'a [u8]) -> (&'a [B::X], &'a [B::Y]) {
    assert_eq!(n % QK, 0, "vec_dot: n = {n} is not a whole number of blocks of {QK}");
    (take_blocks::<B::X>(x, n / QK), take_blocks::<B::Y>(y, n / QK))
}

fn vec_dot<B: B32, M: NeonBlock<X = B::X, Y = B::Y>, const Q: usize, const SPLIT: bool>(
    n: usize,
    x: &[u8],
    y: &[u8],
) -> f32 {
    let (xs, ys) = rows::<B>(n, x, y);
    // SAFETY: installed only on SVE CPUs with dotprod (checked in `install`).
    unsafe { dot1::<B, M, Q, SPLIT>(xs, ys) }
}

/// Four columns, each in [`vec_dot`]'s order.
fn vec_dot_x4<B: B32, M: NeonBlock<X = B::X, Y = B::Y>, const Q: usize, const SPLIT: bool>(
    n: usize,
    x: &[u8],
    y: [&[u8]; 4],
) -> [f32; 4] {
    y.map(|c| vec_dot::<B, M, Q, SPLIT>(n, x, c))
}

type Pair = (VecDotFn, VecDotX4Fn);

/// The Q4_0 and Q8_0 kernels for `w` f32 lanes per SVE vector.
fn kernels(w: usize) -> Option<[Pair; 2]> {
    macro_rules! pair {
        ($b:ty, $m:ty, $q:literal, $s:literal) => {
            (vec_dot::<$b, $m, $q, $s> as VecDotFn, vec_dot_x4::<$b, $m, $q, $s> as VecDotX4Fn)
        };
    }
    match w {
        4 => Some([pair!(Q40, no::Q40, 1, false), pair!(Q80, no::Q80, 1, false)]),
        8 => Some([pair!(Q40, no::Q40, 2, false), pair!(Q80, no::Q80, 2, false)]),
        16 => Some([pair!(Q40, no::Q40, 4, false), pair!(Q80, no::Q80, 4, true)]),
        _ => None,
    }
}

/// Installs the SVE-order Q4_0 and Q8_0 one-row dots for `w` f32 lanes per vector (this CPU's);
/// false (nothing installed) for a length ggml's SVE build does not handle or without dotprod.
pub(super) fn install(k: &mut Kernels, w: usize) -> bool {
    if !std::arch::is_aarch64_feature_detected!("dotprod") {
        return false;
    }
    match kernels(w) {
        Some([(q4, q4x4), (q8, q8x4)]) => {
            k.set_vec_dot(GgmlType::Q4_0, q4);
            k.set_vec_dot_x4(GgmlType::Q4_0, q4x4);
            k.set_vec_dot(GgmlType::Q8_0, q8);
            k.set_vec_dot_x4(GgmlType::Q8_0, q8x4);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::scalar::sve_quant as m;
    use rand::{Rng, SeedableRng};

    fn q8_0_row(r: &mut rand::rngs::StdRng, nb: usize, scale: f32) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..nb {
            out.extend(half::f16::from_f32(scale * r.random_range(0.01f32..2.0)).to_bits().to_le_bytes());
            out.extend((0..32).map(|_| r.random_range(-127i8..=127) as u8));
        }
        out
    }

    fn q4_0_row(r: &mut rand::rngs::StdRng, nb: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..nb {
            out.extend(half::f16::from_f32(r.random_range(-1.5f32..1.5)).to_bits().to_le_bytes());
            out.extend((0..16).map(|_| r.random::<u8>()));
        }
        out
    }

    /// Every vector length's kernels equal the scalar model bit for bit: odd and even block counts,
    /// random quants and scales from tiny to large, the x4 form per column.
    #[test]
    fn sve_order_q4_0_q8_0_equal_the_model_bitwise() {
        if !std::arch::is_aarch64_feature_detected!("dotprod") {
            eprintln!("no dotprod: nothing to check");
            return;
        }
        let mut r = rand::rngs::StdRng::seed_from_u64(25);
        let mut checked = 0;
        for w in [4, 8, 16] {
            let [(q4, q4x4), (q8, q8x4)] = kernels(w).expect("handled length");
            for nb in [1usize, 2, 3, 7, 8, 18, 37] {
                let n = 32 * nb;
                for scale in [1e-4f32, 1.0, 300.0] {
                    let y: Vec<Vec<u8>> = (0..4).map(|_| q8_0_row(&mut r, nb, scale)).collect();
                    let (x4, x8) = (q4_0_row(&mut r, nb), q8_0_row(&mut r, nb, 1.0));
                    let cols = [&y[0][..], &y[1][..], &y[2][..], &y[3][..]];
                    for (c, yc) in cols.iter().enumerate() {
                        let want = m::vec_dot_q4_0_q8_0_sve(w, n, &x4, yc);
                        assert_eq!(q4(n, &x4, yc).to_bits(), want.to_bits(), "q4_0 w={w} nb={nb}");
                        assert_eq!(q4x4(n, &x4, cols)[c].to_bits(), want.to_bits(), "q4_0 x4 w={w}");
                        let want = m::vec_dot_q8_0_q8_0_sve(w, n, &x8, yc);
                        assert_eq!(q8(n, &x8, yc).to_bits(), want.to_bits(), "q8_0 w={w} nb={nb}");
                        assert_eq!(q8x4(n, &x8, cols)[c].to_bits(), want.to_bits(), "q8_0 x4 w={w}");
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 3 * 7 * 3 * 4);
    }

    /// Q2_K's SVE-order kernels equal the scalar model bit for bit for every vector length:
    /// random blocks (every scale, min and quant pattern) against Q8_K rows with their bsums.
    #[test]
    fn sve_order_q2_k_equals_the_model_bitwise() {
        let mut r = rand::rngs::StdRng::seed_from_u64(26);
        let Some(_) = super::super::kquants::q2_k_sve_kernel(4) else {
            eprintln!("no dotprod: nothing to check");
            return;
        };
        for w in [4, 8, 16] {
            let (dot, x4) = super::super::kquants::q2_k_sve_kernel(w).expect("handled length");
            for nb in [1usize, 2, 5] {
                let n = 256 * nb;
                let mut x = Vec::new();
                for _ in 0..nb {
                    x.extend((0..80).map(|_| r.random::<u8>()));
                    x.extend(half::f16::from_f32(r.random_range(0.001f32..0.5)).to_bits().to_le_bytes());
                    x.extend(half::f16::from_f32(r.random_range(0.001f32..0.5)).to_bits().to_le_bytes());
                }
                let ys: Vec<Vec<u8>> = (0..4)
                    .map(|_| {
                        let mut y = Vec::new();
                        for _ in 0..nb {
                            y.extend(r.random_range(1e-3f32..2.0).to_le_bytes());
                            let qs: Vec<i8> = (0..256).map(|_| r.random_range(-127i8..=127)).collect();
                            y.extend(qs.iter().map(|&q| q as u8));
                            for g in 0..16 {
                                let s: i16 = qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum();
                                y.extend(s.to_le_bytes());
                            }
                        }
                        y
                    })
                    .collect();
                let cols = [&ys[0][..], &ys[1][..], &ys[2][..], &ys[3][..]];
                let all = x4(n, &x, cols);
                for (c, y) in cols.iter().enumerate() {
                    let want = m::vec_dot_q2_k_q8_k_sve(w, n, &x, y);
                    assert_eq!(dot(n, &x, y).to_bits(), want.to_bits(), "q2_k w={w} nb={nb}");
                    assert_eq!(all[c].to_bits(), want.to_bits(), "q2_k x4 w={w} nb={nb}");
                }
            }
        }
    }
}
