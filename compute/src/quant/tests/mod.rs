//! Tests of the quant kernels: hand-built blocks, quantization error budgets, dot products against
//! f64, property tests, and every SIMD kernel set against the scalar reference.

mod bench;
mod dequant;
mod dot;
mod interleave;
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

/// A seeded RNG.
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
