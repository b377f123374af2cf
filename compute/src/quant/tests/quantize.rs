//! Quantizers: exact rounding of the activation formats, and error budgets of every quantizer.
//!
//! The budgets and the test signal are ggml's (`tests/test-quantize-fns.cpp`, ggml 0.25.3):
//! `MAX_QUANTIZATION_TOTAL_ERROR = 0.002`, `_2BITS = 0.0075`, `_3BITS = 0.0040`, `_FP4 = 0.0030`,
//! measured as `sqrt(Σ diff²) / n` on `x[i] = 0.1 + 2 cos(i + offset)` with n = 4096.

use super::*;
use crate::quant::blocks::*;

const MAX_QUANTIZATION_TOTAL_ERROR: f32 = 0.002;
const MAX_QUANTIZATION_TOTAL_ERROR_2BITS: f32 = 0.0075;
const MAX_QUANTIZATION_TOTAL_ERROR_3BITS: f32 = 0.0040;
const MAX_QUANTIZATION_TOTAL_ERROR_FP4: f32 = 0.0030;

/// ggml's test signal.
pub(crate) fn ggml_signal(offset: f32, n: usize) -> Vec<f32> {
    (0..n).map(|i| 0.1 + 2.0 * (i as f32 + offset).cos()).collect()
}

/// ggml's budget for type `t`.
fn budget(t: GgmlType) -> f32 {
    match t {
        GgmlType::Q2_K => MAX_QUANTIZATION_TOTAL_ERROR_2BITS,
        GgmlType::Q3_K => MAX_QUANTIZATION_TOTAL_ERROR_3BITS,
        GgmlType::MXFP4 => MAX_QUANTIZATION_TOTAL_ERROR_FP4,
        _ => MAX_QUANTIZATION_TOTAL_ERROR,
    }
}

/// Our own stated NMSE bound (Σ err² / Σ x²) on standard normal data, per type: about twice the
/// measured value, so a regression in a quantizer shows up.
fn nmse_bound(t: GgmlType) -> f64 {
    use GgmlType::*;
    match t {
        F32 => 0.0,
        F16 => 1e-7,
        BF16 => 1e-5,
        Q8_0 | Q8_1 | Q8_K => 1e-4,
        Q6_K => 5e-4,
        Q5_0 | Q5_1 | Q5_K => 3e-3,
        Q4_0 | Q4_1 | Q4_K | IQ4_NL | IQ4_XS => 1.2e-2,
        MXFP4 => 3e-2,
        Q3_K => 5e-2,
        Q2_K => 1.5e-1,
        _ => unreachable!(),
    }
}

fn roundtrip(t: GgmlType, x: &[f32]) -> Vec<f32> {
    let k = scalar_table();
    dequantize(&k, t, &quantize(&k, t, x), x.len())
}

#[test]
fn ggml_total_error_budgets() {
    let x = ggml_signal(0.0, 4096);
    let mut types = WEIGHT_TYPES.to_vec();
    types.extend([GgmlType::Q8_1, GgmlType::Q8_K]);
    for t in types {
        let y = roundtrip(t, &x);
        let sum: f64 = x.iter().zip(&y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let err = sum.sqrt() as f32 / x.len() as f32;
        assert!(err <= budget(t), "{t}: total error {err} > {}", budget(t));
    }
}

#[test]
fn nmse_on_gaussian_data() {
    let x = gaussian(&mut rng(7), 256 * 64);
    let mut types = WEIGHT_TYPES.to_vec();
    types.extend([GgmlType::Q8_1, GgmlType::Q8_K]);
    for t in types {
        let y = roundtrip(t, &x);
        let num: f64 = x.iter().zip(&y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let den: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
        let nmse = num / den;
        assert!(nmse <= nmse_bound(t), "{t}: nmse {nmse:e} > {:e}", nmse_bound(t));
    }
}

#[test]
fn q8_0_rounds_half_away_from_zero_with_unrounded_scale() {
    // ref: ggml-compute-semantics.md §2.3 Q8_0: d = amax/127 = 1, q = roundf(x/d).
    let mut x = [0.0f32; 32];
    x[..5].copy_from_slice(&[127.0, 2.5, -2.5, 0.5, -0.49]);
    let mut out = [0u8; 34];
    crate::quant::scalar::q8_0_from_f32(&x, &mut out);
    let b: &BlockQ8_0 = &as_blocks(&out)[0];
    assert_eq!(f16le(b.d), 1.0);
    assert_eq!(&b.qs[..6], &[127, 3, -3, 1, 0, 0]);
    // A scale that f16 cannot hold exactly: amax = 100 → d = 100/127 stored rounded, quants
    // computed with the unrounded inverse 1.27.
    x[0] = 100.0;
    x[1] = 10.0;
    crate::quant::scalar::q8_0_from_f32(&x, &mut out);
    let b: &BlockQ8_0 = &as_blocks(&out)[0];
    assert_eq!(b.d, to_f16le(100.0 / 127.0));
    assert_eq!(b.qs[1], 13); // 12.7 → 13
}

#[test]
fn q8_1_sum_uses_unrounded_scale() {
    let x: Vec<f32> = (0..32).map(|i| i as f32 - 10.0).collect();
    let mut out = [0u8; 36];
    crate::quant::scalar::q8_1_from_f32(&x, &mut out);
    let b: &BlockQ8_1 = &as_blocks(&out)[0];
    let d = 21.0f32 / 127.0;
    let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
    assert_eq!(b.s, to_f16le(sum as f32 * d));
    assert_eq!(b.qs[31], 127);
}

#[test]
fn q8_k_rounds_half_to_even_and_maps_max_to_minus_127() {
    // ref: ggml-compute-semantics.md §2.3 Q8_K. max = -4 → iscale = 31.75.
    let mut x = [0.0f32; 256];
    x[..4].copy_from_slice(&[2.0, -4.0, 1.0, -2.0]);
    x[10] = 4.0; // same magnitude as the max, later: the first one wins
    let mut out = [0u8; 292];
    crate::quant::scalar::q8_k_from_f32(&x, &mut out);
    let b: &BlockQ8K = &as_blocks(&out)[0];
    assert_eq!(f32::from_le_bytes(b.d), 1.0 / 31.75);
    // 63.5 → 64 (even), -127, 31.75 → 32, -63.5 → -64, 4·31.75 = 127.
    assert_eq!(&b.qs[..4], &[64, -127, 32, -64]);
    assert_eq!(b.qs[10], 127);
    assert_eq!(i16::from_le_bytes(b.bsums[0]), 64 - 127 + 32 - 64 + 127);
    // max > 0 makes d negative.
    x[1] = 0.0;
    x[10] = 0.0;
    crate::quant::scalar::q8_k_from_f32(&x, &mut out);
    let b: &BlockQ8K = &as_blocks(&out)[0];
    assert_eq!(f32::from_le_bytes(b.d), -2.0 / 127.0);
    assert_eq!(b.qs[0], -127);
}

#[test]
fn q4_0_reference_quantizer_hand_computed() {
    // max = -8 → d = 1, q = min(15, trunc(x + 8.5)).
    let mut x = [0.0f32; 32];
    x[..4].copy_from_slice(&[-8.0, 7.9, 0.4, -0.6]);
    let mut out = [0u8; 18];
    crate::quant::scalar::q4_0_from_f32(&x, &mut out);
    let b: &BlockQ4_0 = &as_blocks(&out)[0];
    assert_eq!(f16le(b.d), 1.0);
    assert_eq!(b.qs[0] & 0xF, 0);
    assert_eq!(b.qs[1] & 0xF, 15);
    assert_eq!(b.qs[2] & 0xF, 8);
    assert_eq!(b.qs[3] & 0xF, 7);
}

#[test]
fn k_quant_packers_invert_unpackers() {
    use crate::quant::scalar::*;
    let mut r = rng(3);
    for _ in 0..20 {
        let q2: [u8; 256] = std::array::from_fn(|_| r.random_range(0..4));
        let b = BlockQ2K { scales: [0; 16], qs: q2k_pack(&q2), d: [0; 2], dmin: [0; 2] };
        assert_eq!(q2k_quants(&b), q2);
        let q3: [i8; 256] = std::array::from_fn(|_| r.random_range(-4..4));
        let sc3: [i8; 16] = std::array::from_fn(|_| r.random_range(-32..32));
        let (hmask, qs) = q3k_pack(&q3);
        let b = BlockQ3K { hmask, qs, scales: q3k_pack_scales(&sc3), d: [0; 2] };
        assert_eq!((q3k_quants(&b), q3k_scales(&b.scales)), (q3, sc3));
        let q5: [u8; 256] = std::array::from_fn(|_| r.random_range(0..32));
        let sc: [u8; 8] = std::array::from_fn(|_| r.random_range(0..64));
        let mn: [u8; 8] = std::array::from_fn(|_| r.random_range(0..64));
        let (qh, qs) = q5k_pack(&q5);
        let b = BlockQ5K { d: [0; 2], dmin: [0; 2], scales: k4_pack_scales(&sc, &mn), qh, qs };
        assert_eq!(q5k_quants(&b), q5);
        assert_eq!(k4_scales(&b.scales), std::array::from_fn(|j| (sc[j], mn[j])));
        let q6: [i8; 256] = std::array::from_fn(|_| r.random_range(-32..32));
        let (ql, qh) = q6k_pack(&q6);
        let b = BlockQ6K { ql, qh, scales: [0; 16], d: [0; 2] };
        assert_eq!(q6k_quants(&b), q6);
    }
}
