//! Tests of the quant kernels: hand-built blocks, quantization error budgets, dot products against
//! f64, property tests, and every SIMD kernel set against the scalar reference.

mod bench;
mod dequant;
mod dot;
mod interleave;
mod local;
#[cfg(target_arch = "aarch64")]
mod neon;
mod panel;
mod prepared;
mod prop;
mod quantize;
mod simd;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::dtype::GgmlType;
use crate::quant::dispatch::{Isa, Kernels};

/// Every type with a dequantizer, quantizer and dot product (the weight types).
pub(crate) const WEIGHT_TYPES: [GgmlType; 16] = {
    use GgmlType::*;
    [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4]
};

/// The scalar reference table.
pub(crate) fn scalar_table() -> Kernels {
    Kernels::build(Isa::Scalar)
}

/// The scalar twins of `isa`'s kernels: the reference table, with ggml's NEON order
/// (`quant::scalar::neon_order`) for the legacy, IQ4_NL and MXFP4 dots, Q4_0 / Q8_0's `tinyBLAS_Q0_ARM` order and the
/// Q8_0 / Q8_1 quantizers of the NEON sets from dotprod up, and ggml's NEON F32 / F16 dots and
/// tinyBLAS orders (`quant::scalar::neon_float`; see `quant::aarch64`).
pub(crate) fn twin_table(isa: Isa) -> Kernels {
    let mut k = scalar_table();
    if matches!(isa, Isa::NeonDotprod | Isa::NeonI8mm) {
        use crate::quant::scalar::neon_order as no;
        use GgmlType::*;
        k.set_vec_dot(Q4_0, no::vec_dot_q4_0_q8_0_neon);
        k.set_vec_dot(Q4_1, no::vec_dot_q4_1_q8_1_neon);
        k.set_vec_dot(Q5_0, no::vec_dot_q5_0_q8_0_neon);
        k.set_vec_dot(Q5_1, no::vec_dot_q5_1_q8_1_neon);
        k.set_vec_dot(Q8_0, no::vec_dot_q8_0_q8_0_neon);
        k.set_vec_dot(IQ4_NL, no::vec_dot_iq4_nl_q8_0_neon);
        k.set_vec_dot(MXFP4, no::vec_dot_mxfp4_q8_0_neon);
        if isa == Isa::NeonDotprod {
            k.set_vec_dot_gemm(Q4_0, no::gemm_q4_0_q8_0_neon);
            k.set_vec_dot_gemm(Q8_0, no::gemm_q8_0_q8_0_neon);
        }
        k.set_from_f32(Q8_0, no::q8_0_from_f32_neon);
        k.set_from_f32(Q8_1, no::q8_1_from_f32_neon);
        k.set_vec_dot(Q2_K, no::vec_dot_q2_k_q8_k_neon);
        k.set_vec_dot(Q3_K, no::vec_dot_q3_k_q8_k_neon);
        k.set_vec_dot(Q4_K, no::vec_dot_q4_k_q8_k_neon);
        k.set_vec_dot(Q5_K, no::vec_dot_q5_k_q8_k_neon);
        k.set_vec_dot(Q6_K, no::vec_dot_q6_k_q8_k_neon);
        k.set_vec_dot(IQ4_XS, no::vec_dot_iq4_xs_q8_k_neon);
        use crate::quant::scalar::iq_neon as gn;
        k.set_vec_dot(IQ2_XXS, gn::vec_dot_iq2_xxs_q8_k_neon);
        k.set_vec_dot(IQ2_XS, gn::vec_dot_iq2_xs_q8_k_neon);
        k.set_vec_dot(IQ2_S, gn::vec_dot_iq2_s_q8_k_neon);
        k.set_vec_dot(IQ3_XXS, gn::vec_dot_iq3_xxs_q8_k_neon);
        k.set_vec_dot(IQ3_S, gn::vec_dot_iq3_s_q8_k_neon);
        k.set_vec_dot(IQ1_S, gn::vec_dot_iq1_s_q8_k_neon);
        k.set_vec_dot(IQ1_M, gn::vec_dot_iq1_m_q8_k_neon);
        k.set_vec_dot(TQ1_0, gn::vec_dot_tq1_0_q8_k_neon);
        k.set_vec_dot(TQ2_0, gn::vec_dot_tq2_0_q8_k_neon);
        use crate::quant::scalar::extra_neon as en;
        k.set_vec_dot(Q1_0, en::vec_dot_q1_0_q8_0_neon);
        k.set_vec_dot(Q2_0, en::vec_dot_q2_0_q8_0_neon);
        k.set_vec_dot(NVFP4, en::vec_dot_nvfp4_q8_0_neon);
        use crate::quant::scalar::neon_float as nf;
        k.set_vec_dot(F32, nf::vec_dot_f32_f32_neon);
        k.set_vec_dot(F16, nf::vec_dot_f16_f16_neon);
        if isa == Isa::NeonDotprod {
            k.set_vec_dot_gemm(F32, nf::gemm_f32_f32_neon);
            k.set_vec_dot_gemm(F16, nf::gemm_f16_f32_neon);
        }
        if isa == Isa::NeonI8mm {
            k.set_vec_dot_2x2(Q4_0, no::vec_dot_2x2_q4_0_q8_0_neon);
            k.set_vec_dot_2x2(Q4_1, no::vec_dot_2x2_q4_1_q8_1_neon);
            k.set_vec_dot_2x2(Q8_0, no::vec_dot_2x2_q8_0_q8_0_neon);
            k.set_vec_dot_2x2(Q4_K, no::vec_dot_2x2_q4_k_q8_k_neon);
            k.set_vec_dot_2x2(Q6_K, no::vec_dot_2x2_q6_k_q8_k_neon);
        }
    }
    k
}

/// A seeded RNG.
/// Checks a scalar model of another build's `vec_dot` order for `t` on 64 rows of `n` elements
/// (weights from `weights`, random activations quantized by the reference): every result is the
/// dot of the dequantized operands (f64, within f32 rounding of `Σ|x·y|`), and at least one differs
/// in its bits from the reference kernel's, so bitwise tests against the model test the order.
pub(crate) fn assert_model_is_another_order(
    t: GgmlType,
    n: usize,
    model: crate::quant::VecDotFn,
    r: &mut StdRng,
    mut weights: impl FnMut(&mut StdRng) -> Vec<u8>,
) {
    let s = scalar_table();
    let (reference, vt) = (s.get(t).vec_dot.unwrap(), s.get(t).vec_dot_type);
    let mut differ = 0;
    for row in 0..64 {
        let x = weights(r);
        let a: Vec<f32> = (0..n).map(|_| r.random_range(-2.0f32..2.0)).collect();
        let y = quantize(&s, vt, &a);
        let (xf, yf) = (dequantize(&s, t, &x, n), dequantize(&s, vt, &y, n));
        let (exact, scale) = xf.iter().zip(&yf).fold((0.0f64, 0.0f64), |(e, m), (&a, &b)| {
            let p = a as f64 * b as f64;
            (e + p, m + p.abs())
        });
        let m = model(n, &x, &y);
        assert!((m as f64 - exact).abs() <= 1e-5 * scale, "{t} row {row}: model {m} vs exact {exact}");
        differ += usize::from(m.to_bits() != reference(n, &x, &y).to_bits());
    }
    eprintln!("{t}: {differ} of 64 rows differ from the reference order");
    assert!(differ > 0, "{t}: the model never differs from the reference order");
}

pub(crate) fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` standard normal samples (Box–Muller).
pub(crate) fn gaussian(r: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1: f64 = r.random_range(1e-12..1.0);
            let u2: f64 = r.random();
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
        })
        .collect()
}

/// Quantizes `x` with the table `k` for type `t`.
pub(crate) fn quantize(k: &Kernels, t: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; t.row_size(x.len() as u64).unwrap() as usize];
    (k.get(t).from_f32.unwrap())(x, &mut out);
    out
}

/// Dequantizes `n` values of type `t` with the table `k`.
pub(crate) fn dequantize(k: &Kernels, t: GgmlType, q: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    (k.get(t).to_f32.unwrap())(q, &mut out);
    out
}
