//! AVX2 + FMA + F16C kernels.
//!
//! Each kernel is a private safe `fn` with the table's signature: it asserts every length the
//! vector body relies on, then calls an inner `#[target_feature]` `unsafe fn`. The safe wrappers
//! are reachable only through [`install`], which runs only after the features were detected; that
//! is the invariant every `// SAFETY:` comment below refers to.

mod extra;
pub(super) mod float;
mod iq;
pub(super) mod kquants;
pub(super) mod legacy;
mod quantize;
pub(super) mod util;
pub(super) mod x4;

use crate::dtype::GgmlType;
use crate::quant::dispatch::Kernels;

/// Installs IQ4_NL's product over two or more activation rows in tinyBLAS's order (the AVX-512
/// set replaces it by its panel, which the ggml-order profiles remove).
pub fn install_iq4_nl_gemm(k: &mut Kernels) {
    if super::avx2_available() {
        k.set_vec_dot_gemm(GgmlType::IQ4_NL, legacy::vec_dot_iq4_nl_q8_0_gemm);
    }
}

/// Installs the grid IQ types' dot products in ggml's orders (the `avx2` and `avx512` numerics
/// profiles): the one-row order for up to seven activation rows and the tiled product's for eight
/// or more; and TQ1_0's and TQ2_0's one order (models: `scalar::iq_x86`), Q1_0's, Q2_0's and NVFP4's
/// (models: `scalar::extra_x86`).
pub fn install_iq_ggml_orders(k: &mut Kernels) {
    if !super::avx2_available() {
        return;
    }
    use GgmlType::*;
    let orders: [(GgmlType, crate::quant::VecDotFn, crate::quant::VecDotFn); 7] = [
        (IQ2_XXS, iq::vec_dot_iq2_xxs_ggml, iq::vec_dot_iq2_xxs_tiled),
        (IQ2_XS, iq::vec_dot_iq2_xs_ggml, iq::vec_dot_iq2_xs_tiled),
        (IQ2_S, iq::vec_dot_iq2_s_ggml, iq::vec_dot_iq2_s_tiled),
        (IQ3_XXS, iq::vec_dot_iq3_xxs_ggml, iq::vec_dot_iq3_xxs_tiled),
        (IQ3_S, iq::vec_dot_iq3_s_ggml, iq::vec_dot_iq3_s_tiled),
        (IQ1_S, iq::vec_dot_iq1_s_ggml, iq::vec_dot_iq1_s_tiled),
        (IQ1_M, iq::vec_dot_iq1_m_ggml, iq::vec_dot_iq1_m_tiled),
    ];
    for (t, one_row, tiled) in orders {
        k.set_vec_dot(t, one_row);
        k.set_vec_dot_batch(t, tiled);
    }
    k.set_vec_dot(TQ1_0, iq::vec_dot_tq1_0_ggml);
    k.set_vec_dot(TQ2_0, iq::vec_dot_tq2_0_ggml);
    k.set_vec_dot(Q1_0, extra::vec_dot_q1_0_q8_0_ggml);
    k.set_vec_dot(Q2_0, extra::vec_dot_q2_0_q8_0_ggml);
    k.set_vec_dot(NVFP4, extra::vec_dot_nvfp4_q8_0_ggml);
}

/// Installs BF16's dot products in the orders of ggml's AVX2 build (`vec_dot` and tinyBLAS's for two
/// or more activation rows; models: `scalar::bf16_x86`).
pub fn install_bf16_ggml_orders(k: &mut Kernels) {
    if super::avx2_available() {
        k.set_vec_dot(GgmlType::BF16, float::vec_dot_bf16_bf16_ggml);
        k.set_vec_dot_gemm(GgmlType::BF16, float::vec_dot_bf16_bf16_gemm);
    }
}

/// Installs the AVX2 kernels into `k`; does nothing unless AVX2, FMA and F16C are present.
pub fn install(k: &mut Kernels) {
    if !super::avx2_available() {
        return;
    }
    use GgmlType::*;
    k.set_vec_dot(F32, float::vec_dot_f32_f32);
    k.set_vec_dot(F16, float::vec_dot_f16_f16);
    k.set_vec_dot_rows4(F16, float::vec_dot_f16_f16_rows4);
    k.set_vec_dot_gemm(F32, float::vec_dot_f32_f32_gemm);
    k.set_vec_dot_gemm(F16, float::vec_dot_f16_f16_gemm);
    k.set_vec_dot(BF16, float::vec_dot_bf16_bf16);
    k.set_to_f32(F16, float::f16_to_f32);
    k.set_from_f32(F16, float::f16_from_f32);
    k.set_vec_dot(Q4_0, legacy::vec_dot_q4_0_q8_0);
    k.set_vec_dot(Q4_1, legacy::vec_dot_q4_1_q8_1);
    k.set_vec_dot(Q5_0, legacy::vec_dot_q5_0_q8_0);
    k.set_vec_dot(Q5_1, legacy::vec_dot_q5_1_q8_1);
    k.set_vec_dot(Q8_0, legacy::vec_dot_q8_0_q8_0);
    k.set_vec_dot(IQ4_NL, legacy::vec_dot_iq4_nl_q8_0);
    k.set_vec_dot_gemm(IQ4_NL, legacy::vec_dot_iq4_nl_q8_0_gemm);
    k.set_vec_dot(MXFP4, legacy::vec_dot_mxfp4_q8_0);
    k.set_vec_dot(Q2_K, kquants::vec_dot_q2_k_q8_k);
    k.set_vec_dot(Q3_K, kquants::vec_dot_q3_k_q8_k);
    k.set_vec_dot(Q4_K, kquants::vec_dot_q4_k_q8_k);
    k.set_vec_dot(Q5_K, kquants::vec_dot_q5_k_q8_k);
    k.set_vec_dot(Q6_K, kquants::vec_dot_q6_k_q8_k);
    k.set_vec_dot(IQ4_XS, kquants::vec_dot_iq4_xs_q8_k);
    k.set_vec_dot_batch(Q2_K, kquants::vec_dot_q2_k_q8_k_tiled);
    k.set_vec_dot_batch(Q3_K, kquants::vec_dot_q3_k_q8_k_tiled);
    k.set_vec_dot_batch(Q4_K, kquants::vec_dot_q4_k_q8_k_tiled);
    k.set_vec_dot_batch_x4(Q4_K, kquants::vec_dot_q4_k_q8_k_tiled_x4);
    k.set_vec_dot_batch(Q5_K, kquants::vec_dot_q5_k_q8_k_tiled);
    k.set_vec_dot_batch(Q6_K, kquants::vec_dot_q6_k_q8_k_tiled);
    k.set_vec_dot_batch(IQ4_XS, kquants::vec_dot_iq4_xs_q8_k_tiled);
    k.set_vec_dot(IQ2_XXS, iq::vec_dot_iq2_xxs_fused);
    k.set_vec_dot(IQ2_XS, iq::vec_dot_iq2_xs_fused);
    k.set_vec_dot(IQ2_S, iq::vec_dot_iq2_s_fused);
    k.set_vec_dot(IQ3_XXS, iq::vec_dot_iq3_xxs_fused);
    k.set_vec_dot(IQ3_S, iq::vec_dot_iq3_s_fused);
    k.set_vec_dot(IQ1_S, iq::vec_dot_iq1_s_fused);
    k.set_vec_dot(IQ1_M, iq::vec_dot_iq1_m_fused);
    k.set_vec_dot(TQ1_0, iq::vec_dot_tq1_0_fused);
    k.set_vec_dot(TQ2_0, iq::vec_dot_tq2_0_fused);
    k.set_vec_dot_x4(Q4_0, x4::vec_dot_q4_0_q8_0_x4);
    k.set_vec_dot_x4(Q4_1, x4::vec_dot_q4_1_q8_1_x4);
    k.set_vec_dot_x4(Q5_0, x4::vec_dot_q5_0_q8_0_x4);
    k.set_vec_dot_x4(Q8_0, x4::vec_dot_q8_0_q8_0_x4);
    k.set_vec_dot_x4(Q4_K, x4::vec_dot_q4_k_q8_k_x4);
    k.set_vec_dot_x4(Q6_K, x4::vec_dot_q6_k_q8_k_x4);
    k.set_from_f32(Q8_0, quantize::q8_0_from_f32);
    k.set_from_f32(Q8_1, quantize::q8_1_from_f32);
    k.set_from_f32(Q8_K, quantize::q8_k_from_f32);
}
