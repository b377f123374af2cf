//! Row kernels over an accumulator held at f16 precision, for FLASH_ATTN_EXT with an F16 V cache.
//!
//! ggml's CPU flash attention keeps the running `Σ softmax·v` row in f16 when V is F16 and the batch
//! is small (ref: ggml-compute-semantics.md §3.3 FLASH_ATTN_EXT): every update widens the row to f32,
//! computes in f32 (a fused multiply-add for `acc + v·s`), and rounds back to f16. Here the row is
//! stored as f32 values that are always exactly representable in f16, so the result is bit-identical
//! while the caller keeps one accumulator type.
//!
//! [`mad_f32`] is the f32 twin used when V is not F16 (ggml's `acc + v·s` is a fused multiply-add there too).
//!
//! Each kernel has a scalar form (the specification), an AVX2+F16C+FMA form and an AVX-512 form for
//! x86 (with the avx512 kernel set); every value is computed on its own, so the vector width never
//! changes a bit. The tests at the bottom compare them on random and edge-case inputs.

use half::f16;

/// Rounds `x` to the nearest f16 (ties to even) and widens it back.
fn round16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// `acc[i] = f16(acc[i] · s)`.
pub(crate) fn scale(acc: &mut [f32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    let head = match avx512::Token::get() {
        Some(t) => t.scale(acc, s),
        None => avx2::Token::get().map_or(0, |t| t.scale(acc, s)),
    };
    #[cfg(not(target_arch = "x86_64"))]
    let head = 0;
    scale_scalar(&mut acc[head..], s);
}

/// `acc[i] = f16(fma(v[i], s, acc[i]))` where `v` holds `acc.len()` little-endian f16 values.
pub(crate) fn mad(acc: &mut [f32], v: &[u8], s: f32) {
    assert!(v.len() >= 2 * acc.len(), "f16acc::mad: {} bytes for {} values", v.len(), acc.len());
    #[cfg(target_arch = "x86_64")]
    let head = match avx512::Token::get() {
        Some(t) => t.mad(acc, v, s),
        None => avx2::Token::get().map_or(0, |t| t.mad(acc, v, s)),
    };
    #[cfg(not(target_arch = "x86_64"))]
    let head = 0;
    mad_scalar(&mut acc[head..], &v[2 * head..], s);
}

/// `acc[i] = fma(v[i], s, acc[i])`.
pub(crate) fn mad_f32(acc: &mut [f32], v: &[f32], s: f32) {
    assert!(v.len() >= acc.len(), "f16acc::mad_f32: {} values for {}", v.len(), acc.len());
    #[cfg(target_arch = "x86_64")]
    let head = match avx512::Token::get() {
        Some(t) => t.mad_f32(acc, v, s),
        None => avx2::Token::get().map_or(0, |t| t.mad_f32(acc, v, s)),
    };
    #[cfg(not(target_arch = "x86_64"))]
    let head = 0;
    mad_f32_scalar(&mut acc[head..], &v[head..], s);
}

fn mad_f32_scalar(acc: &mut [f32], v: &[f32], s: f32) {
    acc.iter_mut().zip(v).for_each(|(a, x)| *a = x.mul_add(s, *a));
}

fn scale_scalar(acc: &mut [f32], s: f32) {
    acc.iter_mut().for_each(|a| *a = round16(*a * s));
}

fn mad_scalar(acc: &mut [f32], v: &[u8], s: f32) {
    for (a, b) in acc.iter_mut().zip(v.chunks_exact(2)) {
        let x = f16::from_le_bytes([b[0], b[1]]).to_f32();
        *a = round16(x.mul_add(s, *a));
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Proof that AVX2, FMA and F16C are available (checked once per call).
    #[derive(Clone, Copy)]
    pub(super) struct Token(());

    impl Token {
        pub(super) fn get() -> Option<Token> {
            // Checked once: these run once per KV cell and head.
            static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            OK.get_or_init(|| {
                crate::quant::active_isa() != "scalar"
                    && is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            })
            .then_some(Token(()))
        }

        /// Scales whole groups of 8; returns how many values it handled.
        pub(super) fn scale(self, acc: &mut [f32], s: f32) -> usize {
            // SAFETY: the token proves the features; the body touches whole groups of 8 in `acc`.
            unsafe { scale(acc, s) }
        }

        /// Updates whole groups of 8; returns how many values it handled.
        pub(super) fn mad(self, acc: &mut [f32], v: &[u8], s: f32) -> usize {
            // SAFETY: as above; the caller asserted `v` has 2 bytes per value of `acc`.
            unsafe { mad(acc, v, s) }
        }
    }

    impl Token {
        /// f32 update of whole groups of 8; returns how many values it handled.
        pub(super) fn mad_f32(self, acc: &mut [f32], v: &[f32], s: f32) -> usize {
            // SAFETY: the token proves the features; the caller asserted `v.len() >= acc.len()`.
            unsafe { mad_f32(acc, v, s) }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn mad_f32(acc: &mut [f32], v: &[f32], s: f32) -> usize {
        let n = acc.len() / 8 * 8;
        let p = acc.as_mut_ptr();
        let vs = _mm256_set1_ps(s);
        for i in (0..n).step_by(8) {
            // SAFETY: i + 8 <= n <= acc.len() <= v.len().
            unsafe {
                let a = _mm256_fmadd_ps(_mm256_loadu_ps(v.as_ptr().add(i)), vs, _mm256_loadu_ps(p.add(i)));
                _mm256_storeu_ps(p.add(i), a);
            }
        }
        n
    }

    /// f32 lanes → f16 (nearest even) → f32.
    #[inline(always)]
    unsafe fn round16(x: __m256) -> __m256 {
        // SAFETY: register conversions; the callers enable F16C.
        unsafe { _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scale(acc: &mut [f32], s: f32) -> usize {
        let n = acc.len() / 8 * 8;
        let p = acc.as_mut_ptr();
        let vs = _mm256_set1_ps(s);
        for i in (0..n).step_by(8) {
            // SAFETY: i + 8 <= n <= acc.len().
            unsafe { _mm256_storeu_ps(p.add(i), round16(_mm256_mul_ps(_mm256_loadu_ps(p.add(i)), vs))) }
        }
        n
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn mad(acc: &mut [f32], v: &[u8], s: f32) -> usize {
        let n = acc.len() / 8 * 8;
        let p = acc.as_mut_ptr();
        let vs = _mm256_set1_ps(s);
        for i in (0..n).step_by(8) {
            // SAFETY: i + 8 <= n <= acc.len(), and v holds 2·acc.len() bytes (asserted by the caller).
            unsafe {
                let x = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(2 * i).cast()));
                let a = _mm256_fmadd_ps(x, vs, _mm256_loadu_ps(p.add(i)));
                _mm256_storeu_ps(p.add(i), round16(a));
            }
        }
        n
    }
}

/// The AVX-512 forms: 16 values per step, each computed exactly as in the other forms.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Proof that AVX-512F is available and the avx512 kernel set is active (checked once).
    #[derive(Clone, Copy)]
    pub(super) struct Token(());

    impl Token {
        pub(super) fn get() -> Option<Token> {
            static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            OK.get_or_init(|| crate::quant::active_isa() == "avx512" && is_x86_feature_detected!("avx512f"))
                .then_some(Token(()))
        }

        /// Scales whole groups of 16; returns how many values it handled.
        pub(super) fn scale(self, acc: &mut [f32], s: f32) -> usize {
            // SAFETY: the token proves the features; the body touches whole groups of 16 in `acc`.
            unsafe { scale(acc, s) }
        }

        /// Updates whole groups of 16; returns how many values it handled.
        pub(super) fn mad(self, acc: &mut [f32], v: &[u8], s: f32) -> usize {
            // SAFETY: as above; the caller asserted `v` has 2 bytes per value of `acc`.
            unsafe { mad(acc, v, s) }
        }

        /// f32 update of whole groups of 16; returns how many values it handled.
        pub(super) fn mad_f32(self, acc: &mut [f32], v: &[f32], s: f32) -> usize {
            // SAFETY: the token proves the features; the caller asserted `v.len() >= acc.len()`.
            unsafe { mad_f32(acc, v, s) }
        }
    }

    /// f32 lanes → f16 (nearest even) → f32.
    #[inline(always)]
    unsafe fn round16(x: __m512) -> __m512 {
        // SAFETY: register conversions; the callers enable AVX-512F.
        unsafe { _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x)) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn scale(acc: &mut [f32], s: f32) -> usize {
        let n = acc.len() / 16 * 16;
        let p = acc.as_mut_ptr();
        let vs = _mm512_set1_ps(s);
        for i in (0..n).step_by(16) {
            // SAFETY: i + 16 <= n <= acc.len().
            unsafe { _mm512_storeu_ps(p.add(i), round16(_mm512_mul_ps(_mm512_loadu_ps(p.add(i)), vs))) }
        }
        n
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn mad(acc: &mut [f32], v: &[u8], s: f32) -> usize {
        let n = acc.len() / 16 * 16;
        let p = acc.as_mut_ptr();
        let vs = _mm512_set1_ps(s);
        for i in (0..n).step_by(16) {
            // SAFETY: i + 16 <= n <= acc.len(), and v holds 2·acc.len() bytes (asserted by the caller).
            unsafe {
                let x = _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(2 * i).cast()));
                let a = _mm512_fmadd_ps(x, vs, _mm512_loadu_ps(p.add(i)));
                _mm512_storeu_ps(p.add(i), round16(a));
            }
        }
        n
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn mad_f32(acc: &mut [f32], v: &[f32], s: f32) -> usize {
        let n = acc.len() / 16 * 16;
        let p = acc.as_mut_ptr();
        let vs = _mm512_set1_ps(s);
        for i in (0..n).step_by(16) {
            // SAFETY: i + 16 <= n <= acc.len() <= v.len().
            unsafe {
                let a = _mm512_fmadd_ps(_mm512_loadu_ps(v.as_ptr().add(i)), vs, _mm512_loadu_ps(p.add(i)));
                _mm512_storeu_ps(p.add(i), a);
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn f16_row(rng: &mut impl Rng, n: usize, special: bool) -> Vec<u8> {
        (0..n)
            .flat_map(|i| {
                let x = if special && i % 5 == 0 {
                    [0.0, -0.0, 65504.0, -65504.0, 6.0e-8, f32::INFINITY][i / 5 % 6]
                } else {
                    rng.random_range(-8.0f32..8.0)
                };
                f16::from_f32(x).to_le_bytes()
            })
            .collect()
    }

    #[test]
    fn simd_and_scalar_agree_bit_for_bit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for n in [0, 1, 7, 8, 9, 31, 64, 80, 128, 257] {
            for special in [false, true] {
                let mut a = vec![0.0f32; n];
                let mut b = vec![0.0f32; n];
                for step in 0..50 {
                    let v = f16_row(&mut rng, n, special);
                    let s: f32 = if step % 7 == 0 { 0.0 } else { rng.random_range(0.0..1.0) };
                    mad(&mut a, &v, s);
                    mad_scalar(&mut b, &v, s);
                    let m: f32 = rng.random_range(0.0..1.0);
                    scale(&mut a, m);
                    scale_scalar(&mut b, m);
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b), "n={n} step={step}");
                }
            }
        }
    }

    /// Each x86 form (whichever dispatch would not pick here) against the scalar one.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_x86_form_equals_scalar() {
        type Forms = (
            fn(&mut [f32], &[u8], f32) -> usize,
            fn(&mut [f32], f32) -> usize,
            fn(&mut [f32], &[f32], f32) -> usize,
        );
        let mut forms: Vec<(&str, Forms)> = Vec::new();
        if avx2::Token::get().is_some() {
            forms.push((
                "avx2",
                (
                    |a, v, s| avx2::Token::get().expect("checked").mad(a, v, s),
                    |a, s| avx2::Token::get().expect("checked").scale(a, s),
                    |a, v, s| avx2::Token::get().expect("checked").mad_f32(a, v, s),
                ),
            ));
        }
        if avx512::Token::get().is_some() {
            forms.push((
                "avx512",
                (
                    |a, v, s| avx512::Token::get().expect("checked").mad(a, v, s),
                    |a, s| avx512::Token::get().expect("checked").scale(a, s),
                    |a, v, s| avx512::Token::get().expect("checked").mad_f32(a, v, s),
                ),
            ));
        }
        if forms.is_empty() {
            eprintln!("skipped: no x86 SIMD form on this CPU");
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for (name, (vmad, vscale, vmad32)) in forms {
            for n in [0, 1, 15, 16, 17, 64, 80, 96, 257] {
                for special in [false, true] {
                    let (mut a, mut b) = (vec![0.0f32; n], vec![0.0f32; n]);
                    for step in 0..40 {
                        let v = f16_row(&mut rng, n, special);
                        let s: f32 = if step % 5 == 0 { 0.0 } else { rng.random_range(0.0..2.0) };
                        let h = vmad(&mut a, &v, s);
                        mad_scalar(&mut a[h..], &v[2 * h..], s);
                        mad_scalar(&mut b, &v, s);
                        let m: f32 = rng.random_range(0.0..1.0);
                        let h = vscale(&mut a, m);
                        scale_scalar(&mut a[h..], m);
                        scale_scalar(&mut b, m);
                        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&a), bits(&b), "{name} n={n} step={step}");
                    }
                    let v: Vec<f32> = (0..n).map(|_| rng.random_range(-4.0..4.0)).collect();
                    let mut c: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
                    let mut d = c.clone();
                    let h = vmad32(&mut c, &v, 0.37);
                    mad_f32_scalar(&mut c[h..], &v[h..], 0.37);
                    mad_f32_scalar(&mut d, &v, 0.37);
                    assert_eq!(
                        c.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        d.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        "{name} f32 n={n}"
                    );
                }
            }
        }
    }

    #[test]
    fn f32_mad_simd_and_scalar_agree_bit_for_bit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for n in [0, 1, 7, 8, 9, 64, 80, 257] {
            let mut a: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut b = a.clone();
            for _ in 0..20 {
                let v: Vec<f32> = (0..n).map(|_| rng.random_range(-4.0..4.0)).collect();
                let s: f32 = rng.random_range(0.0..1.0);
                mad_f32(&mut a, &v, s);
                mad_f32_scalar(&mut b, &v, s);
                assert_eq!(
                    a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                );
            }
        }
        // Fused: -1 + (1 + 2^-23)(1 - 2^-23) is exactly -2^-46; a separate multiply would round the
        // product to 1 and give 0.
        let mut acc = [-1.0f32; 9];
        mad_f32(&mut acc, &[1.0 + f32::EPSILON; 9], 1.0 - f32::EPSILON);
        assert!(acc.iter().all(|&a| a == -(2f32.powi(-46))), "{acc:?}");
    }

    #[test]
    fn accumulator_stays_f16_exact() {
        // 1 + 2^-11 is not an f16; the update must round it (ties to even → 1.0).
        let mut acc = vec![1.0f32; 8];
        let v: Vec<u8> = (0..8).flat_map(|_| f16::from_f32(1.0).to_le_bytes()).collect();
        mad(&mut acc, &v, 2f32.powi(-11));
        assert!(acc.iter().all(|&a| a == 1.0));
        mad(&mut acc, &v, 3.0 * 2f32.powi(-11));
        assert!(acc.iter().all(|&a| a == 1.0 + 2f32.powi(-9)), "{acc:?}");
        scale(&mut acc, 0.5);
        assert!(acc.iter().all(|&a| a == 0.5 + 2f32.powi(-10)));
    }
}
