//! Dot products: against f64 dots of the dequantized operands, and ggml's dot-product budgets.
//!
//! ggml (`tests/test-quantize-fns.cpp`): `MAX_DOT_PRODUCT_ERROR = 0.02`, `_LOWBIT = 0.04` (Q2_K,
//! Q3_K), `_FP4 = 0.03`, measured as `|vec_dot(q(x), q8(y)) - x·y| / n` with x, y the test signal
//! at offsets 0 and 1, n = 4096.

use super::quantize::ggml_signal;
use super::*;

const MAX_DOT_PRODUCT_ERROR: f32 = 0.02;
const MAX_DOT_PRODUCT_ERROR_LOWBIT: f32 = 0.04;
const MAX_DOT_PRODUCT_ERROR_FP4: f32 = 0.03;

/// Computes `vec_dot` of `x` (quantized to `t`) and `y` (quantized to t's vec_dot_type) with `k`,
/// and the f64 dot of the two dequantized rows.
pub(crate) fn dot_pair(k: &Kernels, t: GgmlType, x: &[f32], y: &[f32]) -> (f32, f64, f64) {
    let s = scalar_table();
    let vt = s.get(t).vec_dot_type;
    let (qx, qy) = (quantize(&s, t, x), quantize(&s, vt, y));
    let got = (k.get(t).vec_dot.unwrap())(x.len(), &qx, &qy);
    let (dx, dy) = (dequantize(&s, t, &qx, x.len()), dequantize(&s, vt, &qy, y.len()));
    let exact: f64 = dx.iter().zip(&dy).map(|(a, b)| *a as f64 * *b as f64).sum();
    let mag: f64 = dx.iter().zip(&dy).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
    (got, exact, mag)
}

/// Relative bound (of Σ|x·y|) between a kernel and the f64 dot of the dequantized rows. f32
/// accumulation of per-block products costs ~1e-6; Q4_1/Q5_1 use Q8_1's `s = f16(d·Σq)`, whose f16
/// rounding (2^-11) differs from the dequantized `d·q` by up to ~1e-3 of the min term.
fn rel_bound(t: GgmlType) -> f64 {
    match t {
        GgmlType::Q4_1 | GgmlType::Q5_1 => 2e-3,
        _ => 2e-5,
    }
}

#[test]
fn scalar_dot_matches_f64_of_dequantized() {
    let s = scalar_table();
    let mut r = rng(11);
    for t in WEIGHT_TYPES {
        for nb in [1usize, 3, 8] {
            let n = nb * 256;
            let x = gaussian(&mut r, n);
            let y: Vec<f32> = gaussian(&mut r, n).iter().map(|v| v * 3.0 + 0.5).collect();
            let (got, exact, mag) = dot_pair(&s, t, &x, &y);
            let err = (got as f64 - exact).abs();
            assert!(
                err <= rel_bound(t) * mag + 1e-6,
                "{t} n={n}: {got} vs {exact} (err {err:e}, mag {mag:e})"
            );
        }
    }
}

#[test]
fn ggml_dot_product_budgets() {
    let s = scalar_table();
    let (x, y) = (ggml_signal(0.0, 4096), ggml_signal(1.0, 4096));
    let exact: f32 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
    for t in WEIGHT_TYPES {
        let (got, _, _) = dot_pair(&s, t, &x, &y);
        let err = (got - exact).abs() / 4096.0;
        let budget = match t {
            GgmlType::Q2_K | GgmlType::Q3_K => MAX_DOT_PRODUCT_ERROR_LOWBIT,
            GgmlType::MXFP4 => MAX_DOT_PRODUCT_ERROR_FP4,
            _ => MAX_DOT_PRODUCT_ERROR,
        };
        assert!(err <= budget, "{t}: dot error {err} > {budget}");
    }
}

#[test]
fn read_only_types_dot_matches_f64_of_dequantized() {
    // Q1_0, Q2_0, NVFP4 and TQ2_0 have no quantizer: random bytes are valid blocks (with the f16
    // scales forced finite).
    let s = scalar_table();
    let mut r = rng(5);
    for t in [GgmlType::Q1_0, GgmlType::Q2_0, GgmlType::NVFP4, GgmlType::TQ2_0] {
        let n = 512;
        let mut qx: Vec<u8> = (0..t.row_size(n as u64).unwrap()).map(|_| r.random()).collect();
        let bs = t.type_size();
        for b in qx.chunks_exact_mut(bs) {
            let at = if t == GgmlType::TQ2_0 { bs - 2 } else { 0 };
            if t != GgmlType::NVFP4 {
                b[at..at + 2].copy_from_slice(&crate::quant::blocks::to_f16le(r.random_range(-2.0..2.0)));
            }
        }
        let vt = s.get(t).vec_dot_type;
        let y = gaussian(&mut r, n);
        let qy = quantize(&s, vt, &y);
        let got = (s.get(t).vec_dot.unwrap())(n, &qx, &qy);
        let (dx, dy) = (dequantize(&s, t, &qx, n), dequantize(&s, vt, &qy, n));
        let exact: f64 = dx.iter().zip(&dy).map(|(a, b)| *a as f64 * *b as f64).sum();
        let mag: f64 = dx.iter().zip(&dy).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
        assert!((got as f64 - exact).abs() <= 2e-5 * mag + 1e-6, "{t}: {got} vs {exact}");
    }
}
