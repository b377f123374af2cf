//! aarch64 kernels: NEON, with `sdot` (dotprod) variants installed when the CPU has it.
//!
//! The kernels are private safe functions with the table's signatures, reachable only through
//! [`install_neon`], which installs them only after the features were detected; that is the
//! invariant every `// SAFETY:` comment in the submodules refers to.

mod neon;
mod quantize;

use super::dispatch::Kernels;
use crate::dtype::GgmlType;

/// Installs the NEON kernels (the `sdot` variants where the CPU has dotprod).
pub fn install_neon(k: &mut Kernels) {
    if !std::arch::is_aarch64_feature_detected!("neon") {
        return;
    }
    use GgmlType::*;
    let dotprod = std::arch::is_aarch64_feature_detected!("dotprod");
    let dots = if dotprod { neon::SDOT } else { neon::PLAIN };
    k.set_vec_dot(Q4_0, dots.q4_0);
    k.set_vec_dot(Q4_1, dots.q4_1);
    k.set_vec_dot(Q8_0, dots.q8_0);
    k.set_vec_dot(Q4_K, dots.q4_k);
    k.set_vec_dot(Q6_K, dots.q6_k);
    k.set_vec_dot(F16, neon::vec_dot_f16_f16);
    k.set_to_f32(F16, neon::f16_to_f32);
    k.set_from_f32(Q8_0, quantize::q8_0_from_f32);
    k.set_from_f32(Q8_1, quantize::q8_1_from_f32);
    k.set_from_f32(Q8_K, quantize::q8_k_from_f32);
    tracing::debug!(dotprod, "installed NEON kernels");
}
