//! aarch64 kernels at three levels: baseline NEON, NEON with dotprod (`sdot`), and NEON with
//! dotprod and i8mm (`smmla` in the two-row × two-column kernels).
//!
//! The kernels are private safe functions with the table's signatures, reachable only through
//! [`install_neon`], which installs a level only after its features were detected; that is the
//! invariant every `// SAFETY:` comment in the submodules refers to.
//!
//! Coverage (ref: ggml-compute-semantics.md §2.2, §2.3):
//!
//! | type | vec_dot | vec_dot_x4 | vec_dot_2x2 (i8mm) | to_f32 | from_f32 |
//! |---|---|---|---|---|---|
//! | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4 | NEON, sdot | NEON, sdot | smmla | NEON | Q8_0 |
//! | Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS | NEON, sdot | NEON, sdot | smmla (ggml order: Q4_K, Q6_K only) | NEON | — |
//! | IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0 | NEON, sdot | NEON, sdot | smmla (own order only) | — (scalar) | — |
//! | Q8_1, Q8_K (activations) | — | — | — | — | NEON |
//! | F32, F16, BF16 | NEON (fma) | — | — | F16, BF16 | F16, BF16 |
//!
//! [`install_neon_own_order`] installs kernels that reduce each block to its exact integer sum
//! first and then apply the scalar reference's float steps in its order, so all levels and shapes
//! equal the scalar `vec_dot` bit for bit; the float dots are within 1e-5 of the reference's f64
//! sums. [`install_neon`] (the `neon-dotprod` and `neon-i8mm` tables) then replaces, from the
//! dotprod level up, the legacy Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 dots and the Q8_0 / Q8_1
//! activation quantizers with ggml's NEON order ([`ggml`], twins in `quant::scalar::neon_order`),
//! so that they give the bits of llama.cpp built for armv8.2-a+dotprod; likewise the K-quants and
//! IQ4_XS (`kquants::Ggml`: ggml's float step per super-block), the F32/F16 dots and, at the dotprod
//! level, llamafile's float GEMM ([`ggml_float`]); BF16 takes the scalar reference (ggml has no NEON
//! BF16 dot), and the grid IQ types, TQ1_0 and TQ2_0 (`iq::GgmlGrid`: ggml's per-type fold of each super-block,
//! twins in `quant::scalar::iq_neon`; one-row only, as in ggml); Q1_0, Q2_0 and NVFP4 take ggml's NEON lane
//! order as scalar code (`quant::scalar::extra_neon`). At the i8mm level the two-row kernels of
//! Q4_0, Q4_1, Q8_0, Q4_K and Q6_K are ggml's `smmla` ones (`ggml::two_row`, `kquants::GgmlMmla`),
//! which ggml's mul_mat runs for every output exactly when the row and column counts are both even
//! (matmul plans by that rule); the other K-quants have none.

mod dequant;
mod dot;
mod float;
mod ggml;
mod ggml_float;
mod iq;
mod kquants;
mod legacy;
mod quantize;
mod sve_float;
mod sve_quant;

use super::dispatch::Kernels;
use super::GemmRule;
use crate::dtype::GgmlType;

/// A NEON kernel level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Baseline NEON.
    Neon,
    /// NEON + dotprod.
    Dotprod,
    /// NEON + dotprod + i8mm.
    I8mm,
}

/// Whether this CPU has the features of `level`.
pub fn level_available(level: Level) -> bool {
    use std::arch::is_aarch64_feature_detected as has;
    let neon = has!("neon");
    match level {
        Level::Neon => neon,
        Level::Dotprod => neon && has!("dotprod"),
        Level::I8mm => neon && has!("dotprod") && has!("i8mm"),
    }
}

/// Installs the kernels of `level` (ggml's NEON order where [`ggml`] has it, from the dotprod
/// level up); does nothing unless the CPU has its features.
pub fn install_neon(k: &mut Kernels, level: Level) {
    if !level_available(level) {
        return;
    }
    install_neon_own_order(k, level);
    if level >= Level::Dotprod {
        install_ggml_order(k, level);
    }
}

/// ggml's NEON order for the legacy formats and their activation quantizers (dotprod and up).
fn install_ggml_order(k: &mut Kernels, level: Level) {
    use crate::quant::scalar::neon_order as no;
    use GgmlType::*;
    macro_rules! ggml_order {
        ($($t:ident => $b:ty, $m:ty, $gemm:expr);* $(;)?) => {$(
            let (dot, x4, gemm) = ggml::set::<$b, $m>($gemm);
            k.set_vec_dot($t, dot);
            k.set_vec_dot_x4($t, x4);
            if let Some(g) = gemm {
                k.set_vec_dot_gemm($t, g);
            }
        )*};
    }
    // Q4_0 and Q8_0 at the dotprod level: llamafile's tinyBLAS_Q0_ARM for two or more activation
    // rows (ggml-cpu.c turns llamafile off with i8mm or SVE).
    let gemm = level == Level::Dotprod;
    ggml_order! {
        Q4_0 => legacy::Q40, no::Q40, gemm;
        Q4_1 => legacy::Q41, no::Q41, false;
        Q5_0 => legacy::Q50, no::Q50, false;
        Q5_1 => legacy::Q51, no::Q51, false;
        Q8_0 => legacy::Q80, no::Q80, gemm;
    }
    // IQ4_NL and MXFP4: one-row only in ggml (no llamafile, no smmla kernel).
    for (t, (dot, x4)) in [
        (IQ4_NL, ggml::set_pairs::<legacy::Iq4Nl, no::Iq4NlPairs>()),
        (MXFP4, ggml::set_pairs::<legacy::Mxfp4, no::Mxfp4Pairs>()),
    ] {
        k.set_vec_dot(t, dot);
        k.set_vec_dot_x4(t, x4);
        k.clear_vec_dot_gemm(t);
    }
    // Two-row kernels: ggml's smmla ones for Q4_0, Q4_1 and Q8_0 with i8mm; Q5_0, Q5_1, IQ4_NL and
    // MXFP4 have none.
    for t in [Q5_0, Q5_1, IQ4_NL, MXFP4] {
        k.clear_vec_dot_2x2(t);
    }
    if level >= Level::I8mm {
        k.set_vec_dot_2x2(Q4_0, ggml::two_row::<legacy::Q40, no::Q40>());
        k.set_vec_dot_2x2(Q4_1, ggml::two_row::<legacy::Q41, no::Q41>());
        k.set_vec_dot_2x2(Q8_0, ggml::two_row::<legacy::Q80, no::Q80>());
    }
    k.set_from_f32(Q8_0, ggml::q8_0_from_f32);
    k.set_from_f32(Q8_1, ggml::q8_1_from_f32);
    // The K-quants and IQ4_XS (ggml's float step per super-block), the grid IQ types, TQ1_0 and
    // TQ2_0 (ggml's NEON fold per type): one-row kernels only; with i8mm ggml has two-row `smmla`
    // kernels for Q4_K and Q6_K alone (installed below), none for the others.
    macro_rules! ggml_one_row {
        ($($t:ident => $b:ty),* $(,)?) => {$(
            let (dot, x4, _) = kquants::set::<$b>(true, false);
            k.set_vec_dot($t, dot);
            k.set_vec_dot_x4($t, x4);
            k.clear_vec_dot_2x2($t);
        )*};
    }
    ggml_one_row! {
        Q2_K => kquants::Ggml<kquants::Q2K>,
        Q3_K => kquants::Ggml<kquants::Q3K>,
        Q4_K => kquants::Ggml<kquants::Q4K>,
        Q5_K => kquants::Ggml<kquants::Q5K>,
        Q6_K => kquants::Ggml<kquants::Q6K>,
        IQ4_XS => kquants::Ggml<kquants::Iq4Xs>,
        IQ2_XXS => iq::GgmlGrid<iq::Iq2Xxs>,
        IQ2_XS => iq::GgmlGrid<iq::Iq2Xs>,
        IQ2_S => iq::GgmlGrid<iq::Iq2S>,
        IQ3_XXS => iq::GgmlGrid<iq::Iq3Xxs>,
        IQ3_S => iq::GgmlGrid<iq::Iq3S>,
        IQ1_S => iq::GgmlGrid<iq::Iq1S>,
        IQ1_M => iq::GgmlGrid<iq::Iq1M>,
        TQ1_0 => iq::GgmlGrid<iq::Tq1_0>,
        TQ2_0 => iq::GgmlGrid<iq::Tq2_0>,
    }
    // Q1_0, Q2_0 and NVFP4: ggml's NEON lane order, as scalar code (these had no NEON kernel; the
    // twins are the kernels).
    {
        use crate::quant::scalar::extra_neon as en;
        k.set_vec_dot(Q1_0, en::vec_dot_q1_0_q8_0_neon);
        k.set_vec_dot(Q2_0, en::vec_dot_q2_0_q8_0_neon);
        k.set_vec_dot(NVFP4, en::vec_dot_nvfp4_q8_0_neon);
    }
    if level >= Level::I8mm {
        k.set_vec_dot_2x2(Q4_K, kquants::two_row::<kquants::GgmlMmla<kquants::Q4K>>());
        k.set_vec_dot_2x2(Q6_K, kquants::two_row::<kquants::GgmlMmla<kquants::Q6K>>());
    }
    // F32 / F16 / BF16: ggml's NEON vec_dot orders (BF16 has no NEON path in ggml: the scalar
    // reference is its order); at the dotprod level llamafile's tinyBLAS for matrix products, F32
    // from four activation rows, F16 weights against the unconverted f32 activations.
    k.set_vec_dot(F32, ggml_float::vec_dot_f32_f32);
    k.set_vec_dot(F16, ggml_float::vec_dot_f16_f16);
    k.set_vec_dot(BF16, crate::quant::scalar::vec_dot_bf16_bf16);
    if gemm {
        k.set_vec_dot_gemm(F32, ggml_float::gemm_f32_f32);
        k.set_gemm_rule(F32, GemmRule { min_cols: 4, f32_activations: false });
        k.set_vec_dot_gemm(F16, ggml_float::gemm_f16_f32);
        k.set_gemm_rule(F16, GemmRule { min_cols: 2, f32_activations: true });
    } else {
        k.clear_vec_dot_gemm(F32);
        k.clear_vec_dot_gemm(F16);
    }
    tracing::debug!(?level, "installed ggml-order NEON kernels");
}

/// The `sve` profile over the i8mm table: ggml's SVE-build F32 / F16 dot orders
/// ([`sve_float`]), the Q4_0 / Q8_0 ([`sve_quant`]) and Q2_K one-row dot orders, for this CPU's
/// vector length, and the Q4_K / Q6_K two-row float steps of its `svmmla` kernels; false (nothing installed) without SVE or for a vector length other than 128, 256 or 512
/// bits. (The other K-quant one-row dots have the NEON build's float steps in the SVE build too.)
/// ROPE stays in the NEON build's order (whatever makes ggml's SVE build's differ: not yet found).
pub fn install_sve_order(k: &mut Kernels) -> bool {
    let done = sve_float::install(k);
    if !done {
        tracing::warn!("no SVE vector length ggml's SVE build handles: the dots keep the NEON order");
        return false;
    }
    if let Some(w) = sve_float::f32_lanes() {
        if !sve_quant::install(k, w) {
            tracing::warn!("SVE without dotprod: the Q4_0/Q8_0 dots keep the NEON order");
        }
        if let Some((q2k, q2k_x4)) = kquants::q2_k_sve_kernel(w) {
            k.set_vec_dot(GgmlType::Q2_K, q2k);
            k.set_vec_dot_x4(GgmlType::Q2_K, q2k_x4);
        }
    }
    if level_available(Level::I8mm) {
        k.set_vec_dot_2x2(GgmlType::Q4_K, kquants::two_row::<kquants::GgmlMmla<kquants::Q4K, true>>());
        k.set_vec_dot_2x2(GgmlType::Q6_K, kquants::two_row::<kquants::GgmlMmla<kquants::Q6K, true>>());
    }
    true
}

/// The f32 lanes of one SVE vector on this CPU (the vector length in bits / 32), `None` without SVE.
pub fn sve_f32_lanes() -> Option<usize> {
    sve_float::f32_lanes()
}

/// The NEON kernels of `level` in llamad's own order (bit-identical to the scalar reference
/// kernels): what the `portable` numerics profile runs on aarch64; does nothing unless the CPU has
/// the level's features.
pub fn install_neon_own_order(k: &mut Kernels, level: Level) {
    if !level_available(level) {
        return;
    }
    use GgmlType::*;
    let (dotprod, i8mm) = (level >= Level::Dotprod, level >= Level::I8mm);

    macro_rules! legacy {
        ($($t:ident => $b:ty),* $(,)?) => {$(
            let s = legacy::set::<$b>(dotprod, i8mm);
            k.set_vec_dot($t, s.vec_dot);
            k.set_vec_dot_x4($t, s.x4);
            if let Some(f) = s.two {
                k.set_vec_dot_2x2($t, f);
            }
            k.set_to_f32($t, dequant::to_f32_32::<$b>);
        )*};
    }
    legacy! {
        Q4_0 => legacy::Q40,
        Q4_1 => legacy::Q41,
        Q5_0 => legacy::Q50,
        Q5_1 => legacy::Q51,
        Q8_0 => legacy::Q80,
        IQ4_NL => legacy::Iq4Nl,
        MXFP4 => legacy::Mxfp4,
    }

    // The K-quants, IQ4_XS, the grid IQ types and TQ1_0/TQ2_0 share the K-quant dot loops.
    macro_rules! kquant_dots {
        ($($t:ident => $b:ty),* $(,)?) => {$(
            let (dot, x4, two) = kquants::set::<$b>(dotprod, i8mm);
            k.set_vec_dot($t, dot);
            k.set_vec_dot_x4($t, x4);
            if let Some(f) = two {
                k.set_vec_dot_2x2($t, f);
            }
        )*};
    }
    kquant_dots! {
        Q2_K => kquants::Q2K,
        Q3_K => kquants::Q3K,
        Q4_K => kquants::Q4K,
        Q5_K => kquants::Q5K,
        Q6_K => kquants::Q6K,
        IQ4_XS => kquants::Iq4Xs,
        IQ2_XXS => iq::Iq2Xxs,
        IQ2_XS => iq::Iq2Xs,
        IQ2_S => iq::Iq2S,
        IQ3_XXS => iq::Iq3Xxs,
        IQ3_S => iq::Iq3S,
        IQ1_S => iq::Iq1S,
        IQ1_M => iq::Iq1M,
        TQ1_0 => iq::Tq1_0,
        TQ2_0 => iq::Tq2_0,
    }
    // NEON dequantization for the K-quants and IQ4_XS (the grid and ternary types' stays scalar).
    k.set_to_f32(Q2_K, dequant::to_f32_k::<kquants::Q2K>);
    k.set_to_f32(Q3_K, dequant::to_f32_k::<kquants::Q3K>);
    k.set_to_f32(Q4_K, dequant::to_f32_k::<kquants::Q4K>);
    k.set_to_f32(Q5_K, dequant::to_f32_k::<kquants::Q5K>);
    k.set_to_f32(Q6_K, dequant::to_f32_k::<kquants::Q6K>);
    k.set_to_f32(IQ4_XS, dequant::to_f32_k::<kquants::Iq4Xs>);

    k.set_vec_dot(F32, float::vec_dot_f32_f32);
    k.set_vec_dot(F16, float::vec_dot_f16_f16);
    k.set_vec_dot(BF16, float::vec_dot_bf16_bf16);
    k.set_to_f32(F16, float::f16_to_f32);
    k.set_to_f32(BF16, float::bf16_to_f32);
    k.set_from_f32(F16, float::f16_from_f32);
    k.set_from_f32(BF16, float::bf16_from_f32);
    k.set_from_f32(Q8_0, quantize::q8_0_from_f32);
    k.set_from_f32(Q8_1, quantize::q8_1_from_f32);
    k.set_from_f32(Q8_K, quantize::q8_k_from_f32);
    tracing::debug!(?level, "installed NEON kernels");
}
