//! Scalar models of ggml's aarch64 NEON float dot products (ggml-cpu `vec.cpp` with the NEON SIMD
//! mappings of `simd-mappings.h`, and llamafile's tinyBLAS), as llama.cpp's armv8.2-a+dotprod and
//! armv8.6-a+i8mm builds run them (no fp16 vector arithmetic there): the twins of
//! `quant::aarch64::ggml_float`, portable so the order can be tested anywhere.
//!
//! - `ggml_vec_dot_f32` / `ggml_vec_dot_f16` (`GGML_F32_STEP` 16, `GGML_F32_EPR` 4; F16 widened to
//!   f32 four at a time): four 4-lane accumulators over steps of 16 elements, `fma` per lane;
//!   `GGML_F32x4_REDUCE` adds them as `(a0 + a2) + (a1 + a3)` and the lanes with `vaddvq_f32`
//!   (`faddp` twice: `(l0 + l1) + (l2 + l3)`).
//! - Leftovers past the last 16 elements: for F16 in f64 (`ggml_float`), each product rounded to
//!   f32 first. For F32 in f32, as GCC 12 compiled them (read off the aarch64 disassembly of the
//!   reference built by tests/peer/build-peer-aarch64.sh): when four or more are left, the first
//!   multiple of 4 are multiplied four at a time (products rounded) and added one by one, the rest
//!   fused (`fmadd`); with fewer than four left all are fused.
//! - `ggml_vec_dot_bf16` has no NEON path: products rounded to f32, summed in f64 in order, which
//!   is the scalar reference `vec_dot_bf16_bf16`.
//! - tinyBLAS (ggml's float GEMM; only in the armv8.2-a+dotprod build, ggml-cpu.c turns llamafile off
//!   with i8mm or SVE): one 4-lane accumulator per output, `fma` per 4 elements, `vaddvq_f32` at the
//!   end. F32 × F32 with four or more contiguous activation rows; F16 weights × the *unconverted*
//!   f32 activations (`tinyBLAS<4, float32x4_t, float32x4_t, ggml_fp16_t, float, float>`) with two
//!   or more; both only for a shared dimension that is a multiple of 4 and weight rows a multiple
//!   of 4 (else `vec_dot`).

use half::f16;

fn f32s(p: &[u8], n: usize) -> Vec<f32> {
    assert!(p.len() >= 4 * n, "neon_float: {} bytes for {n} f32", p.len());
    p[..4 * n].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn f16s(p: &[u8], n: usize) -> Vec<f32> {
    assert!(p.len() >= 2 * n, "neon_float: {} bytes for {n} f16", p.len());
    p[..2 * n].chunks_exact(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect()
}

/// `vaddvq_f32`: `(l0 + l1) + (l2 + l3)`.
pub fn hadd4(v: [f32; 4]) -> f32 {
    (v[0] + v[1]) + (v[2] + v[3])
}

/// The vector part of ggml's NEON `vec_dot` over the first `x.len() / 16 * 16` elements.
pub fn vec_part(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let mut acc = [[0.0f32; 4]; 4];
    for i in (0..n / 16 * 16).step_by(16) {
        for (k, a) in acc.iter_mut().enumerate() {
            for (l, v) in a.iter_mut().enumerate() {
                *v = x[i + 4 * k + l].mul_add(y[i + 4 * k + l], *v);
            }
        }
    }
    hadd4(std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l])))
}

/// ggml's NEON `ggml_vec_dot_f32` on widened values (see the module docs for the leftovers).
pub fn dot_f32_values(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let head = n / 16 * 16;
    let split = head + (n - head) / 4 * 4;
    let mut sum = vec_part(x, y);
    for i in head..n {
        sum = if i < split { sum + x[i] * y[i] } else { x[i].mul_add(y[i], sum) };
    }
    sum
}

/// ggml's NEON `ggml_vec_dot_f16` on widened values: the vector part, leftovers in f64.
pub fn dot_f16_values(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let mut sum = vec_part(x, y) as f64;
    for i in n / 16 * 16..n {
        sum += (x[i] * y[i]) as f64;
    }
    sum as f32
}

/// tinyBLAS's NEON order for one output: one 4-lane accumulator, `fma` per 4 elements, `vaddvq_f32`
/// (ggml runs it only when the length is a multiple of 4; a shorter last group is fused in order).
pub fn gemm_values(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let head = n / 4 * 4;
    let mut acc = [0.0f32; 4];
    for i in (0..head).step_by(4) {
        for (l, v) in acc.iter_mut().enumerate() {
            *v = x[i + l].mul_add(y[i + l], *v);
        }
    }
    let mut sum = hadd4(acc);
    for i in head..n {
        sum = x[i].mul_add(y[i], sum);
    }
    sum
}

/// f32 · f32 as ggml's NEON `ggml_vec_dot_f32`.
pub fn vec_dot_f32_f32_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_f32_values(&f32s(x, n), &f32s(y, n))
}

/// f16 · f16 as ggml's NEON `ggml_vec_dot_f16` (no fp16 vector arithmetic).
pub fn vec_dot_f16_f16_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_f16_values(&f16s(x, n), &f16s(y, n))
}

/// f32 · f32 in tinyBLAS's NEON order (`n % 4 == 0`; else as [`vec_dot_f32_f32_neon`], which ggml
/// then runs).
pub fn gemm_f32_f32_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    if !n.is_multiple_of(4) {
        return vec_dot_f32_f32_neon(n, x, y);
    }
    gemm_values(&f32s(x, n), &f32s(y, n))
}

/// f16 weights · unconverted f32 activations in tinyBLAS's NEON order (see [`gemm_values`]).
pub fn gemm_f16_f32_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    gemm_values(&f16s(x, n), &f32s(y, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn bytes32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn orders_are_dot_products_and_follow_hand_computed_reductions() {
        // Hand-computed: 16 ones · (1..=16) → lanes (1+9)+(5+13) = 28, 32, 36, 40 → (28+32)+(36+40).
        let x = [1.0f32; 21];
        let y: Vec<f32> = (1..=21).map(|i| i as f32).collect();
        assert_eq!(vec_part(&x, &y), 136.0);
        assert_eq!(dot_f32_values(&x, &y), 231.0);
        assert_eq!(dot_f16_values(&x, &y), 231.0);
        assert_eq!(gemm_values(&x[..20], &y[..20]), 210.0);
        // A case where the order shows: 1e8 cancels only in ggml's lane pairing.
        let mut x = [0.0f32; 16];
        let mut y = [1.0f32; 16];
        x[0] = 1e8;
        x[8] = -1e8; // acc2 lane 0 cancels acc0 lane 0 first
        x[4] = 1.0;
        y[4] = 1.0;
        assert_eq!(vec_part(&x, &y), 1.0);
        // And against f64 sums on random rows.
        let mut r = StdRng::seed_from_u64(7);
        for n in [1usize, 3, 4, 5, 15, 16, 17, 20, 100, 256, 1000] {
            let a: Vec<f32> = (0..n).map(|_| r.random::<f32>() - 0.5).collect();
            let b: Vec<f32> = (0..n).map(|_| r.random::<f32>() - 0.5).collect();
            let exact: f64 = a.iter().zip(&b).map(|(&p, &q)| p as f64 * q as f64).sum();
            let mag: f64 = a.iter().zip(&b).map(|(&p, &q)| (p as f64 * q as f64).abs()).sum();
            let got = vec_dot_f32_f32_neon(n, &bytes32(&a), &bytes32(&b));
            assert!((got as f64 - exact).abs() <= 1e-6 * mag + 1e-30, "n={n}: {got} vs {exact}");
            let got = gemm_f32_f32_neon(n, &bytes32(&a), &bytes32(&b));
            assert!((got as f64 - exact).abs() <= 1e-6 * mag + 1e-30, "gemm n={n}: {got} vs {exact}");
        }
    }
}
