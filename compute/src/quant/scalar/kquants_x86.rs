//! Scalar models of ggml's x86 AVX2 dot products of the K-quants and IQ4_XS against Q8_K: the
//! bit-exact twins of the AVX2 kernels (`quant::x86_64::avx2::kquants`, the four-column and tiled
//! kernels), and therefore of llama.cpp's x86 CPU backend (ref: ggml-compute-semantics.md §2.3;
//! read from `ggml_vec_dot_q*_K_q8_K` under `__AVX2__` in ggml-cpu's `arch/x86/quants.c` and from
//! the reference build's machine code).
//!
//! What those kernels do per super-block: every 32 weights go through one 32-byte vector, whose
//! eight 32-bit lanes each receive the products of 4 adjacent bytes (`maddubs` + `madd`), already
//! times the sub-block's integer scale. So lane `l` holds the exact integer
//! `Σ_{e : (e mod 32) / 4 = l} scale(e)·q(e)·y(e)` (no i16 step saturates for these value ranges).
//! The floats then follow, per type:
//! * Q3_K, Q6_K, IQ4_XS: `acc = fma(d_y·d_x, float(lanes), acc)`;
//! * Q6_K first subtracts its `-32` offset per lane: `32·(s_2l·bsum_2l + s_2l+1·bsum_2l+1)`;
//! * Q2_K first adds its mins per lane: `acc = fma(-d_y·dmin_x, float(m_2l·bsum_2l + m_2l+1·bsum_2l+1), acc)`;
//! * Q4_K keeps its mins in a second, 4-lane accumulator, lane `k` getting
//!   `m_2k·(bsum_4k + bsum_4k+1) + m_2k+1·(bsum_4k+2 + bsum_4k+3)` times `-d_y·dmin_x` by `fma`,
//!   reduced at the end as `(a0 + a2) + (a1 + a3)` and added to the horizontal sum;
//! * Q5_K sums its mins to one integer per block and keeps a scalar `summs = fma(-d_y·dmin_x,
//!   float(mins), summs)` (GCC contracts ggml's `summs += dmin * mins`), added at the end;
//! * the horizontal sum of the 8 lanes is `hi + lo` per half, then `(s0 + s2) + (s1 + s3)`.
//!
//! For matrix products over 8 or more activation rows ggml takes its tiled product instead
//! (`tiled/tiled-kernel.cpp`, on by default, `GGML_CPU_TILED_MM=0` turns it off), whose float steps
//! per super-block are `r = d_x·float(s1)` (Q2_K/Q4_K/Q5_K: `r = fnmadd(dmin_x, float(s2), r)`)
//! and `acc = fma(r, d_y, acc)`, with `s1`, `s2` the block's exact integer sums: the `*_tiled_x86`
//! models below.

use crate::dtype::QK_K;
use crate::quant::blocks::*;
use crate::quant::scalar::kquants::{k4_scales, q2k_quants, q3k_quants, q4k_quants, q5k_quants, q6k_quants};

/// The 8-lane horizontal sum of ggml's `hsum_float_8`.
pub(crate) fn hsum8(a: [f32; 8]) -> f32 {
    let s: [f32; 4] = std::array::from_fn(|k| a[k + 4] + a[k]);
    (s[0] + s[2]) + (s[1] + s[3])
}

/// The 4-lane reduction of ggml's Q4_K min accumulator.
fn hsum4(a: [f32; 4]) -> f32 {
    (a[0] + a[2]) + (a[1] + a[3])
}

/// The eight exact lane sums of one super-block: `Σ scale(e)·w(e)·y(e)` over the elements `e`
/// that land in each 32-bit lane.
fn lanes(w: impl Fn(usize) -> i32, scale: impl Fn(usize) -> i32, y: &[i8; QK_K]) -> [i32; 8] {
    let mut l = [0i32; 8];
    for (e, &ye) in y.iter().enumerate() {
        l[(e % 32) / 4] += scale(e) * w(e) * ye as i32;
    }
    l
}

fn q8k_d(b: &BlockQ8K) -> f32 {
    f32::from_le_bytes(b.d)
}

fn bsum(b: &BlockQ8K, g: usize) -> i32 {
    i16::from_le_bytes(b.bsums[g]) as i32
}

/// The float accumulators: ggml's 8-lane `acc`, Q4_K's 4-lane `acc_m`, Q5_K's scalar `summs`.
struct Accs {
    acc: [f32; 8],
    acc_m: [f32; 4],
    summs: f32,
}

impl Accs {
    fn new() -> Self {
        Accs { acc: [0.0; 8], acc_m: [0.0; 4], summs: 0.0 }
    }

    /// `acc = fma(d, float(lanes), acc)`.
    fn fma8(&mut self, d: f32, v: [i32; 8]) {
        for (a, v) in self.acc.iter_mut().zip(v) {
            *a = d.mul_add(v as f32, *a);
        }
    }
}

/// Runs `block` over the row's super-blocks and finishes with `finish`.
fn run<X: bytemuck::Pod>(
    n: usize,
    x: &[u8],
    y: &[u8],
    block: impl Fn(&X, &BlockQ8K, &mut Accs),
    finish: impl Fn(&Accs) -> f32,
) -> f32 {
    assert_eq!(n % QK_K, 0, "vec_dot: n = {n} is not a whole number of super-blocks");
    let nb = n / QK_K;
    let mut a = Accs::new();
    for (bx, by) in take_blocks::<X>(x, nb).iter().zip(take_blocks::<BlockQ8K>(y, nb)) {
        block(bx, by, &mut a);
    }
    finish(&a)
}

/// Q2_K · Q8_K in ggml's AVX2 order.
pub fn vec_dot_q2_k_q8_k_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    run(
        n,
        x,
        y,
        |bx: &BlockQ2K, by, a| {
            let dy = q8k_d(by);
            let (d, dmin) = (dy * f16le(bx.d), -dy * f16le(bx.dmin));
            let mins: [i32; 8] = std::array::from_fn(|l| {
                (bx.scales[2 * l] >> 4) as i32 * bsum(by, 2 * l)
                    + (bx.scales[2 * l + 1] >> 4) as i32 * bsum(by, 2 * l + 1)
            });
            a.fma8(dmin, mins);
            let q = q2k_quants(bx);
            a.fma8(d, lanes(|e| q[e] as i32, |e| (bx.scales[e / 16] & 0xF) as i32, &by.qs));
        },
        |a| hsum8(a.acc),
    )
}

/// Q3_K · Q8_K in ggml's AVX2 order.
pub fn vec_dot_q3_k_q8_k_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    run(
        n,
        x,
        y,
        |bx: &BlockQ3K, by, a| {
            let (q, sc) = (q3k_quants(bx), q3k_scales(&bx.scales));
            a.fma8(q8k_d(by) * f16le(bx.d), lanes(|e| q[e] as i32, |e| sc[e / 16] as i32, &by.qs));
        },
        |a| hsum8(a.acc),
    )
}

/// Q4_K · Q8_K in ggml's AVX2 order.
pub fn vec_dot_q4_k_q8_k_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    run(
        n,
        x,
        y,
        |bx: &BlockQ4K, by, a| {
            let dy = q8k_d(by);
            let (d, dmin) = (dy * f16le(bx.d), -dy * f16le(bx.dmin));
            let sm = k4_scales(&bx.scales);
            for k in 0..4 {
                let m = sm[2 * k].1 as i32 * (bsum(by, 4 * k) + bsum(by, 4 * k + 1))
                    + sm[2 * k + 1].1 as i32 * (bsum(by, 4 * k + 2) + bsum(by, 4 * k + 3));
                a.acc_m[k] = dmin.mul_add(m as f32, a.acc_m[k]);
            }
            let q = q4k_quants(bx);
            a.fma8(d, lanes(|e| q[e] as i32, |e| sm[e / 32].0 as i32, &by.qs));
        },
        |a| hsum8(a.acc) + hsum4(a.acc_m),
    )
}

/// Q5_K · Q8_K in ggml's AVX2 order.
pub fn vec_dot_q5_k_q8_k_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    run(
        n,
        x,
        y,
        |bx: &BlockQ5K, by, a| {
            let dy = q8k_d(by);
            let (d, dmin) = (dy * f16le(bx.d), -dy * f16le(bx.dmin));
            let sm = k4_scales(&bx.scales);
            let mins: i32 = (0..8).map(|j| sm[j].1 as i32 * (bsum(by, 2 * j) + bsum(by, 2 * j + 1))).sum();
            a.summs = dmin.mul_add(mins as f32, a.summs);
            let q = q5k_quants(bx);
            a.fma8(d, lanes(|e| q[e] as i32, |e| sm[e / 32].0 as i32, &by.qs));
        },
        |a| hsum8(a.acc) + a.summs,
    )
}

/// Q6_K · Q8_K in ggml's AVX2 order.
pub fn vec_dot_q6_k_q8_k_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    run(
        n,
        x,
        y,
        |bx: &BlockQ6K, by, a| {
            let q = q6k_quants(bx);
            let sc = |g: usize| bx.scales[g] as i32;
            let mut v = lanes(|e| q[e] as i32 + 32, |e| sc(e / 16), &by.qs);
            for (l, v) in v.iter_mut().enumerate() {
                *v -= 32 * (sc(2 * l) * bsum(by, 2 * l) + sc(2 * l + 1) * bsum(by, 2 * l + 1));
            }
            a.fma8(q8k_d(by) * f16le(bx.d), v);
        },
        |a| hsum8(a.acc),
    )
}

/// IQ4_XS · Q8_K in ggml's AVX2 order.
pub fn vec_dot_iq4_xs_q8_k_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    run(
        n,
        x,
        y,
        |bx: &BlockIq4Xs, by, a| {
            let w = crate::quant::scalar::kquants::iq4xs_indices(bx).map(|i| KVALUES_IQ4NL[i as usize]);
            let v = lanes(|e| w[e] as i32, |e| iq4xs_scale(bx, e / 32) - 32, &by.qs);
            a.fma8(f16le(bx.d) * q8k_d(by), v);
        },
        |a| hsum8(a.acc),
    )
}

// ---- ggml's tiled product (ggml-cpu `tiled/`, taken for 8+ activation rows) ----

/// One super-block of ggml's tiled product: `r = d_x·float(s1)`, minus `dmin_x·float(s2)` fused when
/// the type has mins, then `acc = fma(r, d_y, acc)`; `s1 = Σ scale·w·y` and `s2 = Σ min·bsum` exact.
fn tiled_step(s1: i32, mins: Option<(i32, f32)>, dx: f32, dy: f32, acc: f32) -> f32 {
    let mut r = dx * s1 as f32;
    if let Some((s2, dmin_x)) = mins {
        r = (-dmin_x).mul_add(s2 as f32, r);
    }
    r.mul_add(dy, acc)
}

/// The row loop of the tiled order: `block` gives `(s1, mins, d_x)` per super-block.
fn run_tiled<X: bytemuck::Pod>(
    n: usize,
    x: &[u8],
    y: &[u8],
    block: impl Fn(&X, &BlockQ8K) -> (i32, Option<(i32, f32)>, f32),
) -> f32 {
    assert_eq!(n % QK_K, 0, "vec_dot: n = {n} is not a whole number of super-blocks");
    let nb = n / QK_K;
    let mut acc = 0.0f32;
    for (bx, by) in take_blocks::<X>(x, nb).iter().zip(take_blocks::<BlockQ8K>(y, nb)) {
        let (s1, mins, dx) = block(bx, by);
        acc = tiled_step(s1, mins, dx, q8k_d(by), acc);
    }
    acc
}

/// `Σ scale(e)·w(e)·y(e)` over a super-block.
fn exact(w: impl Fn(usize) -> i32, scale: impl Fn(usize) -> i32, y: &[i8; QK_K]) -> i32 {
    y.iter().enumerate().map(|(e, &ye)| scale(e) * w(e) * ye as i32).sum()
}

/// Q2_K · Q8_K in ggml's tiled order.
pub fn vec_dot_q2_k_q8_k_tiled_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    run_tiled(n, x, y, |bx: &BlockQ2K, by| {
        let q = q2k_quants(bx);
        let s1 = exact(|e| q[e] as i32, |e| (bx.scales[e / 16] & 0xF) as i32, &by.qs);
        let s2 = (0..16).map(|g| (bx.scales[g] >> 4) as i32 * bsum(by, g)).sum();
        (s1, Some((s2, f16le(bx.dmin))), f16le(bx.d))
    })
}

/// Q3_K · Q8_K in ggml's tiled order.
pub fn vec_dot_q3_k_q8_k_tiled_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    run_tiled(n, x, y, |bx: &BlockQ3K, by| {
        let (q, sc) = (q3k_quants(bx), q3k_scales(&bx.scales));
        (exact(|e| q[e] as i32, |e| sc[e / 16] as i32, &by.qs), None, f16le(bx.d))
    })
}

/// Q4_K · Q8_K in ggml's tiled order.
pub fn vec_dot_q4_k_q8_k_tiled_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    run_tiled(n, x, y, |bx: &BlockQ4K, by| {
        let (q, sm) = (q4k_quants(bx), k4_scales(&bx.scales));
        let s1 = exact(|e| q[e] as i32, |e| sm[e / 32].0 as i32, &by.qs);
        let s2 = (0..8).map(|j| sm[j].1 as i32 * (bsum(by, 2 * j) + bsum(by, 2 * j + 1))).sum();
        (s1, Some((s2, f16le(bx.dmin))), f16le(bx.d))
    })
}

/// Q5_K · Q8_K in ggml's tiled order.
pub fn vec_dot_q5_k_q8_k_tiled_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    run_tiled(n, x, y, |bx: &BlockQ5K, by| {
        let (q, sm) = (q5k_quants(bx), k4_scales(&bx.scales));
        let s1 = exact(|e| q[e] as i32, |e| sm[e / 32].0 as i32, &by.qs);
        let s2 = (0..8).map(|j| sm[j].1 as i32 * (bsum(by, 2 * j) + bsum(by, 2 * j + 1))).sum();
        (s1, Some((s2, f16le(bx.dmin))), f16le(bx.d))
    })
}

/// Q6_K · Q8_K in ggml's tiled order.
pub fn vec_dot_q6_k_q8_k_tiled_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    run_tiled(n, x, y, |bx: &BlockQ6K, by| {
        let q = q6k_quants(bx);
        (exact(|e| q[e] as i32, |e| bx.scales[e / 16] as i32, &by.qs), None, f16le(bx.d))
    })
}

/// IQ4_XS · Q8_K in ggml's tiled order.
pub fn vec_dot_iq4_xs_q8_k_tiled_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    run_tiled(n, x, y, |bx: &BlockIq4Xs, by| {
        let w = crate::quant::scalar::kquants::iq4xs_indices(bx).map(|i| KVALUES_IQ4NL[i as usize]);
        (exact(|e| w[e] as i32, |e| iq4xs_scale(bx, e / 32) - 32, &by.qs), None, f16le(bx.d))
    })
}

// ---- IQ4_NL in tinyBLAS's order ----

/// IQ4_NL · Q8_0 in the order of llamafile's `tinyBLAS_Q0_AVX` (ggml's IQ4_NL matrix product over two
/// or more activation rows): lanes of 4 adjacent products, `acc = fma(d_x·d_y, float(lanes), acc)`
/// block after block in one accumulator, then [`hsum8`].
pub fn vec_dot_iq4_nl_q8_0_tinyblas_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    assert_eq!(n % QK, 0, "vec_dot: n = {n} is not a whole number of blocks");
    let nb = n / QK;
    let mut a = Accs::new();
    for (bx, by) in take_blocks::<BlockIq4Nl>(x, nb).iter().zip(take_blocks::<BlockQ8_0>(y, nb)) {
        let mut l = [0i32; 8];
        for e in 0..QK {
            let idx = if e < 16 { bx.qs[e] & 0xF } else { bx.qs[e - 16] >> 4 };
            l[e / 4] += KVALUES_IQ4NL[idx as usize] as i32 * by.qs[e] as i32;
        }
        a.fma8(f16le(bx.d) * f16le(by.d), l);
    }
    hsum8(a.acc)
}
