//! F32 and F16 dot products in the order of ggml built for AVX-512 (the `avx512` numerics profile).
//!
//! ggml's SIMD macros widen to 16 lanes there: `ggml_vec_dot_f32`/`ggml_vec_dot_f16` keep four
//! 16-lane accumulators over steps of 64 elements, add them as `(a0 + a2) + (a1 + a3)` and reduce the
//! 16 lanes with `_mm512_reduce_add_ps` (GCC: the two 256-bit halves added, then the two 128-bit
//! halves, then lanes `(s0 + s2) + (s1 + s3)`); llamafile's tinyBLAS (ggml's float GEMM for two or
//! more activation rows) keeps one 16-lane accumulator per output, `fma` per 16 elements, reduced the
//! same way, and only runs when the shared dimension is a multiple of 16 (else ggml falls back to
//! `vec_dot`). Leftovers past the last 64 elements are added in order: for F16 in f64; for F32 in f32,
//! where GCC 12 (`-O3` with the AVX-512 flags, checked in its object code) multiplies the first
//! multiple of 8 of them 16 and then 8 at a time (products rounded) and fuses the rest (`sumf +=
//! x[i]*y[i]` as an FMA), where the AVX2 build rounds the products of the first multiple of 4.
//!
//! The scalar twins ([`ref_vec_dot`], [`ref_gemm_dot`]) restate these orders lane by lane; the
//! tests hold the kernels to them bit for bit.

use std::arch::x86_64::*;

use super::avx2::util::hsum_ps;
use crate::dtype::GgmlType;
use crate::quant::dispatch::Kernels;

/// Installs the AVX-512-order F32/F16 kernels (`vec_dot`, `vec_dot_gemm`, the F16 tile) into `k`.
/// The caller checked [`super::avx512_numerics_available`].
pub fn install(k: &mut Kernels) {
    k.set_vec_dot(GgmlType::F32, vec_dot_f32_f32);
    k.set_vec_dot(GgmlType::F16, vec_dot_f16_f16);
    k.set_vec_dot_rows4(GgmlType::F16, vec_dot_f16_f16_rows4);
    k.set_vec_dot_gemm(GgmlType::F32, vec_dot_f32_f32_gemm);
    k.set_vec_dot_gemm(GgmlType::F16, vec_dot_f16_f16_gemm);
    k.set_gemm(GgmlType::F16, gemm_f16_f16);
}

fn check(n: usize, x: &[u8], y: &[u8], elem: usize) {
    assert!(x.len() >= n * elem && y.len() >= n * elem, "vec_dot: rows shorter than {n} elements");
}

/// Loads 16 values at element `i` of a row, widened to f32.
type Load16 = unsafe fn(&[u8], usize) -> __m512;

#[inline(always)]
unsafe fn load_f32(p: &[u8], i: usize) -> __m512 {
    // SAFETY: the caller checked that 16 elements of 4 bytes exist at `i`.
    unsafe { _mm512_loadu_ps(p.as_ptr().add(4 * i).cast()) }
}

#[inline(always)]
unsafe fn load_f16(p: &[u8], i: usize) -> __m512 {
    // SAFETY: the caller checked that 16 elements of 2 bytes exist at `i`; AVX-512F converts.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.as_ptr().add(2 * i).cast())) }
}

/// `_mm512_reduce_add_ps` as GCC forms it: halves of 256, then of 128, then `(s0+s2)+(s1+s3)`.
#[inline(always)]
unsafe fn reduce512(v: __m512) -> f32 {
    // SAFETY: register arithmetic under AVX-512F (the callers' features).
    unsafe {
        let hi = _mm512_extractf32x8_ps::<1>(v);
        let lo = _mm512_castps512_ps256(v);
        hsum_ps(_mm256_add_ps(hi, lo))
    }
}

/// [`reduce512`] of four vectors at once, each in the same order: the 256-bit halves of two
/// vectors added in one instruction, the 128-bit halves of all four in one, then lanes
/// `(s0 + s2) + (s1 + s3)` of the four 128-bit groups side by side.
#[inline(always)]
unsafe fn reduce512_x4(v: [__m512; 4]) -> [f32; 4] {
    // SAFETY: register arithmetic under AVX-512F (the callers' features).
    unsafe {
        // [v.q0, v.q1, w.q0, w.q1] + [v.q2, v.q3, w.q2, w.q3]: each vector's 256-bit halves added.
        let h01 =
            _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(v[0], v[1]), _mm512_shuffle_f32x4::<0xEE>(v[0], v[1]));
        let h23 =
            _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(v[2], v[3]), _mm512_shuffle_f32x4::<0xEE>(v[2], v[3]));
        // The 128-bit halves of each sum: 128-bit group r holds vector r's four lanes.
        let q = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(h01, h23), _mm512_shuffle_f32x4::<0xDD>(h01, h23));
        // Per group: (s0 + s2, s1 + s3), then their sum in lane 0.
        let p = _mm512_add_ps(q, _mm512_permute_ps::<0b01_00_11_10>(q));
        let s = _mm512_add_ps(p, _mm512_permute_ps::<0b10_11_00_01>(p));
        let lanes =
            _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s);
        let mut out = [0.0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), _mm512_castps512_ps128(lanes));
        out
    }
}

/// The vector part of ggml's AVX-512 `vec_dot`: four accumulators over the first `n / 64 * 64`
/// elements.
#[inline(always)]
unsafe fn vec_order(n: usize, x: &[u8], y: &[u8], load: Load16) -> f32 {
    // SAFETY: every load is below `n / 64 * 64` elements, which the caller checked.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 4];
        for i in (0..n / 64 * 64).step_by(64) {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(load(x, i + 16 * k), load(y, i + 16 * k), *a);
            }
        }
        let a = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
        reduce512(a)
    }
}

/// tinyBLAS's per-output order: one accumulator, `fma` per 16 elements; `n % 16 == 0`.
#[inline(always)]
unsafe fn gemm_order(n: usize, x: &[u8], y: &[u8], load: Load16) -> f32 {
    // SAFETY: every load is below `n`, which the caller checked.
    unsafe {
        let mut acc = _mm512_setzero_ps();
        for i in (0..n).step_by(16) {
            acc = _mm512_fmadd_ps(load(x, i), load(y, i), acc);
        }
        reduce512(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
unsafe fn dot_f32_vec(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: lengths checked by the caller; features enabled on this fn.
    let mut sum = unsafe { vec_order(n, x, y, load_f32) };
    let head = n / 64 * 64;
    let split = head + (n - head) / 8 * 8;
    for i in head..n {
        let (a, b) = (f32_at(x, i), f32_at(y, i));
        sum = if i < split { sum + a * b } else { a.mul_add(b, sum) };
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
unsafe fn dot_f16_vec(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: lengths checked by the caller; features enabled on this fn.
    let mut sum = unsafe { vec_order(n, x, y, load_f16) } as f64;
    for i in n / 64 * 64..n {
        sum += (f16_at(x, i) * f16_at(y, i)) as f64;
    }
    sum as f32
}

/// [`dot_f16_vec`] of four rows against one: the activation's vectors loaded once per step.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
unsafe fn dot_f16_vec_rows4(n: usize, xs: [&[u8]; 4], y: &[u8]) -> [f32; 4] {
    let head = n / 64 * 64;
    // SAFETY: every load is below `head` elements, which the caller checked for every row.
    let sums = unsafe {
        let mut acc = [[_mm512_setzero_ps(); 4]; 4];
        for i in (0..head).step_by(64) {
            let yv: [__m512; 4] = std::array::from_fn(|k| load_f16(y, i + 16 * k));
            for (x, a) in xs.iter().zip(acc.iter_mut()) {
                for (k, ak) in a.iter_mut().enumerate() {
                    *ak = _mm512_fmadd_ps(load_f16(x, i + 16 * k), yv[k], *ak);
                }
            }
        }
        reduce512_x4(acc.map(|a| _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]))))
    };
    std::array::from_fn(|r| {
        let mut sum = sums[r] as f64;
        for i in head..n {
            sum += (f16_at(xs[r], i) * f16_at(y, i)) as f64;
        }
        sum as f32
    })
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
unsafe fn dot_f32_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: lengths checked by the caller; features enabled on this fn.
    unsafe { gemm_order(n, x, y, load_f32) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
unsafe fn dot_f16_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: lengths checked by the caller; features enabled on this fn.
    unsafe { gemm_order(n, x, y, load_f16) }
}

/// f32 · f32 as ggml's AVX-512 `ggml_vec_dot_f32`.
pub(super) fn vec_dot_f32_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 4);
    // SAFETY: installed only after AVX-512F/DQ detection; lengths checked above.
    unsafe { dot_f32_vec(n, x, y) }
}

/// f16 · f16 as ggml's AVX-512 `ggml_vec_dot_f16` (leftovers in f64).
pub(super) fn vec_dot_f16_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 2);
    // SAFETY: installed only after AVX-512F/DQ detection; lengths checked above.
    unsafe { dot_f16_vec(n, x, y) }
}

/// Four rows · one as [`vec_dot_f16_f16`] each, bit for bit.
pub(super) fn vec_dot_f16_f16_rows4(n: usize, x: [&[u8]; 4], y: &[u8]) -> [f32; 4] {
    for xr in x {
        check(n, xr, y, 2);
    }
    // SAFETY: installed only after AVX-512F/DQ detection; lengths checked above.
    unsafe { dot_f16_vec_rows4(n, x, y) }
}

/// f32 · f32 in ggml's AVX-512 GEMM order (`n % 16 == 0`, else as [`vec_dot_f32_f32`]).
pub(super) fn vec_dot_f32_f32_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 4);
    if !n.is_multiple_of(16) {
        return vec_dot_f32_f32(n, x, y);
    }
    // SAFETY: installed only after AVX-512F/DQ detection; lengths checked above.
    unsafe { dot_f32_gemm(n, x, y) }
}

/// f16 · f16 in ggml's AVX-512 GEMM order (`n % 16 == 0`, else as [`vec_dot_f16_f16`]).
pub(super) fn vec_dot_f16_f16_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 2);
    if !n.is_multiple_of(16) {
        return vec_dot_f16_f16(n, x, y);
    }
    // SAFETY: installed only after AVX-512F/DQ detection; lengths checked above.
    unsafe { dot_f16_gemm(n, x, y) }
}

/// A 4 × 4 tile of F16 products in the GEMM order: `out[c][r]` = row `r` · column `c`.
///
/// # Safety
/// AVX-512F/DQ available; every row holds at least `n` f16 values; `n % 16 == 0`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
unsafe fn f16_tile_4x4(n: usize, xs: [&[u8]; 4], ys: [&[u8]; 4]) -> [[f32; 4]; 4] {
    // SAFETY: loads stay below n (the caller's contract); register arithmetic.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 4]; 4];
        for i in (0..n).step_by(16) {
            let xv = [load_f16(xs[0], i), load_f16(xs[1], i), load_f16(xs[2], i), load_f16(xs[3], i)];
            for c in 0..4 {
                let yv = load_f16(ys[c], i);
                for r in 0..4 {
                    acc[c][r] = _mm512_fmadd_ps(xv[r], yv, acc[c][r]);
                }
            }
        }
        let mut out = [[0.0f32; 4]; 4];
        for c in 0..4 {
            for r in 0..4 {
                out[c][r] = reduce512(acc[c][r]);
            }
        }
        out
    }
}

/// F16 weights × F16 activations in the AVX-512 GEMM order, 4 × 4 tiles (`out[j * m + i]`).
pub(super) fn gemm_f16_f16(n: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    let (m, nc) = (x.len(), y.len());
    assert!(out.len() >= m * nc, "gemm: {} outputs for {m} x {nc}", out.len());
    if !n.is_multiple_of(16) {
        for j in 0..nc {
            for i in 0..m {
                out[j * m + i] = vec_dot_f16_f16(n, x[i], y[j]);
            }
        }
        return;
    }
    for r in x.iter().chain(y) {
        assert!(r.len() >= 2 * n, "gemm: f16 row shorter than {n} elements");
    }
    for c0 in (0..nc).step_by(4) {
        let ys: [&[u8]; 4] = std::array::from_fn(|j| y[(c0 + j).min(nc - 1)]);
        for r0 in (0..m).step_by(4) {
            let xs: [&[u8]; 4] = std::array::from_fn(|i| x[(r0 + i).min(m - 1)]);
            // SAFETY: installed only after AVX-512F/DQ detection; rows checked above; n % 16 == 0.
            let v = unsafe { f16_tile_4x4(n, xs, ys) };
            let rows = 4.min(m - r0);
            for (j, col) in v.iter().enumerate().take(nc - c0) {
                let o = (c0 + j) * m + r0;
                out[o..o + rows].copy_from_slice(&col[..rows]);
            }
        }
    }
}

fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])).to_f32()
}

/// Scalar twin of `_mm512_reduce_add_ps` (GCC's order).
#[cfg(test)]
pub(crate) fn ref_reduce16(l: &[f32; 16]) -> f32 {
    let h: [f32; 8] = std::array::from_fn(|i| l[i + 8] + l[i]);
    let q: [f32; 4] = std::array::from_fn(|i| h[i + 4] + h[i]);
    (q[0] + q[2]) + (q[1] + q[3])
}

/// Scalar twin of the AVX-512 `vec_dot` for F32 (`f16 == false`) or F16 values already widened to
/// f32 in `x`, `y`.
#[cfg(test)]
pub(crate) fn ref_vec_dot(x: &[f32], y: &[f32], f16: bool) -> f32 {
    let n = x.len();
    let mut acc = [[0.0f32; 16]; 4];
    for i in (0..n / 64 * 64).step_by(64) {
        for (k, a) in acc.iter_mut().enumerate() {
            for (l, v) in a.iter_mut().enumerate() {
                *v = x[i + 16 * k + l].mul_add(y[i + 16 * k + l], *v);
            }
        }
    }
    let s: [f32; 16] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let head = n / 64 * 64;
    if f16 {
        let mut sum = ref_reduce16(&s) as f64;
        for i in head..n {
            sum += (x[i] * y[i]) as f64;
        }
        return sum as f32;
    }
    let mut sum = ref_reduce16(&s);
    let split = head + (n - head) / 8 * 8;
    for i in head..n {
        sum = if i < split { sum + x[i] * y[i] } else { x[i].mul_add(y[i], sum) };
    }
    sum
}

/// Scalar twin of the AVX-512 GEMM order (`n % 16 == 0`, else [`ref_vec_dot`]).
#[cfg(test)]
pub(crate) fn ref_gemm_dot(x: &[f32], y: &[f32], f16: bool) -> f32 {
    if !x.len().is_multiple_of(16) {
        return ref_vec_dot(x, y, f16);
    }
    let mut acc = [0.0f32; 16];
    for i in (0..x.len()).step_by(16) {
        for (l, v) in acc.iter_mut().enumerate() {
            *v = x[i + l].mul_add(y[i + l], *v);
        }
    }
    ref_reduce16(&acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn rows(r: &mut StdRng, n: usize, scale: f32) -> (Vec<f32>, Vec<f32>) {
        let g = |r: &mut StdRng| (r.random::<f32>() - 0.5) * scale;
        ((0..n).map(|_| g(r)).collect(), (0..n).map(|_| g(r)).collect())
    }

    fn f16_bytes(v: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
        (h.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(), h.iter().map(|x| x.to_f32()).collect())
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn kernels_equal_their_scalar_twins_bitwise() {
        if !super::super::avx512_numerics_available() {
            return;
        }
        let mut r = StdRng::seed_from_u64(512);
        let mut checked = 0;
        for n in [1usize, 15, 16, 48, 63, 64, 65, 67, 128, 144, 200, 576, 1000, 1536] {
            for scale in [1.0f32, 1e3, 1e-3] {
                let (a, b) = rows(&mut r, n, scale);
                let (xa, xb) = (f32_bytes(&a), f32_bytes(&b));
                let got = vec_dot_f32_f32(n, &xa, &xb);
                assert_eq!(got.to_bits(), ref_vec_dot(&a, &b, false).to_bits(), "f32 vec n={n}");
                let got = vec_dot_f32_f32_gemm(n, &xa, &xb);
                assert_eq!(got.to_bits(), ref_gemm_dot(&a, &b, false).to_bits(), "f32 gemm n={n}");
                let ((ha, fa), (hb, fb)) = (f16_bytes(&a), f16_bytes(&b));
                let got = vec_dot_f16_f16(n, &ha, &hb);
                assert_eq!(got.to_bits(), ref_vec_dot(&fa, &fb, true).to_bits(), "f16 vec n={n}");
                let got = vec_dot_f16_f16_gemm(n, &ha, &hb);
                assert_eq!(got.to_bits(), ref_gemm_dot(&fa, &fb, true).to_bits(), "f16 gemm n={n}");
                // And close to the exact value (an f64 sum), so the orders are dot products at all.
                let exact: f64 = fa.iter().zip(&fb).map(|(&p, &q)| p as f64 * q as f64).sum();
                let mag: f64 = fa.iter().zip(&fb).map(|(&p, &q)| (p as f64 * q as f64).abs()).sum();
                assert!((got as f64 - exact).abs() <= 1e-5 * mag + 1e-30, "f16 gemm n={n}: {got} vs {exact}");
                checked += 1;
            }
        }
        assert_eq!(checked, 42);
    }

    #[test]
    fn four_row_f16_dot_equals_four_vec_dots_bitwise() {
        if !super::super::avx512_numerics_available() {
            return;
        }
        let mut r = StdRng::seed_from_u64(4);
        let mut checked = 0;
        for n in [0usize, 1, 15, 63, 64, 65, 96, 128, 130, 576, 4100] {
            for scale in [1.0f32, 60.0, 1e-3] {
                let xr: Vec<(Vec<u8>, Vec<f32>)> =
                    (0..4).map(|_| f16_bytes(&rows(&mut r, n, scale).0)).collect();
                let (y, fy) = f16_bytes(&rows(&mut r, n, scale).1);
                let x: [&[u8]; 4] = std::array::from_fn(|i| xr[i].0.as_slice());
                let got = vec_dot_f16_f16_rows4(n, x, &y);
                for i in 0..4 {
                    let one = vec_dot_f16_f16(n, x[i], &y);
                    assert_eq!(got[i].to_bits(), one.to_bits(), "n={n} row {i}: {} vs {one}", got[i]);
                    let twin = ref_vec_dot(&xr[i].1, &fy, true);
                    assert_eq!(got[i].to_bits(), twin.to_bits(), "n={n} row {i} vs the twin");
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 33);
        // Edge values: infinities and NaN stay in their own row; signed zeros as the one-row dot.
        let n = 64;
        let mut edge: Vec<Vec<f32>> = (0..4).map(|i| vec![0.5 * i as f32; n]).collect();
        edge[1][3] = f32::INFINITY;
        edge[2][10] = f32::NAN;
        edge[3].iter_mut().for_each(|v| *v = -0.0);
        let bytes: Vec<Vec<u8>> = edge.iter().map(|v| f16_bytes(v).0).collect();
        let (y, _) = f16_bytes(&vec![1.0f32; n]);
        let x: [&[u8]; 4] = std::array::from_fn(|i| bytes[i].as_slice());
        let got = vec_dot_f16_f16_rows4(n, x, &y);
        for i in 0..4 {
            assert_eq!(got[i].to_bits(), vec_dot_f16_f16(n, x[i], &y).to_bits(), "edge row {i}");
        }
        assert_eq!((got[0], got[1]), (0.0, f32::INFINITY));
        assert!(got[2].is_nan() && !got[3].is_nan());
    }

    #[test]
    fn reduction_order_is_gcc_s() {
        // Lanes chosen so that every other association loses the small terms differently.
        let mut l = [0.0f32; 16];
        l[0] = 1e8;
        l[8] = -1e8;
        l[1] = 3.0;
        l[4] = 1.0;
        l[12] = 1.0;
        // (l0+l8)=0, (l4+l12)=2 → quarter 0 = 0 + 2, quarter 1 = 3 → (2 + q2) + (3 + q3) = 5.
        assert_eq!(ref_reduce16(&l), 5.0);
        if super::super::avx512_numerics_available() {
            // SAFETY: features detected just above.
            let v = unsafe { reduce512_for_test(&l) };
            assert_eq!(v, ref_reduce16(&l));
        }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
    unsafe fn reduce512_for_test(l: &[f32; 16]) -> f32 {
        // SAFETY: 16 floats are readable at l; features enabled on this fn.
        unsafe { reduce512(_mm512_loadu_ps(l.as_ptr())) }
    }

    #[test]
    fn tile_equals_the_gemm_dot_for_ragged_shapes() {
        if !super::super::avx512_numerics_available() {
            return;
        }
        let mut r = StdRng::seed_from_u64(7);
        for n in [64usize, 48, 40] {
            let xs: Vec<Vec<u8>> = (0..7).map(|_| f16_bytes(&rows(&mut r, n, 2.0).0).0).collect();
            let ys: Vec<Vec<u8>> = (0..6).map(|_| f16_bytes(&rows(&mut r, n, 2.0).0).0).collect();
            for (m, nc) in [(7usize, 6usize), (1, 1), (4, 4), (5, 3)] {
                let x: Vec<&[u8]> = xs[..m].iter().map(|v| v.as_slice()).collect();
                let y: Vec<&[u8]> = ys[..nc].iter().map(|v| v.as_slice()).collect();
                let mut out = vec![f32::NAN; m * nc];
                gemm_f16_f16(n, &x, &y, &mut out);
                for j in 0..nc {
                    for i in 0..m {
                        let want = vec_dot_f16_f16_gemm(n, x[i], y[j]);
                        assert_eq!(out[j * m + i].to_bits(), want.to_bits(), "n={n} {m}x{nc} ({i},{j})");
                    }
                }
            }
        }
    }
}
