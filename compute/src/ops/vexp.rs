//! Row kernels built on ggml's vectorised `exp` for x86 (8 lanes, AVX2+FMA), so that SOFT_MAX, SiLU and
//! SwiGLU give the same bits as a llama.cpp CPU backend built for AVX2. The algorithm is the published
//! Arm optimized-routines single-precision `exp` (range reduction by `n = round(x/ln2)`, a degree-5
//! polynomial, scale by `2^n` with special cases for |n| > 126), restated here from its constants.
//! Elements past the last whole group of 8 use the C library's `expf`, as ggml does. On aarch64 the
//! rows follow ggml's NEON build: the same `exp` on 4 lanes, each group's softmax sum reduced as
//! `vaddvq_f32` (`(l0 + l1) + (l2 + l3)`), `expf` past the last whole group of 4 ([`ref_exp_neon`]
//! is the per-lane twin). With the `scalar` kernel set the rows use `expf` throughout.
//!
//! Under the `sve` numerics profile the aarch64 rows follow ggml's SVE build: the same `exp` (its SVE
//! form has the same operations) on whole SVE vectors of `w` lanes (this CPU's vector length) with a
//! predicated last vector instead of `expf`, each group's softmax sum reduced by `faddv` (recursive
//! halving, inactive lanes +0); SwiGLU likewise runs every element through the vector `exp`.
//!
//! Under the `avx512` numerics profile the rows follow ggml's AVX-512 build instead: 16 lanes, whose
//! `exp` evaluates the polynomial with its leading 1 folded in and scales by `2^n` with `vscalefps`
//! (inputs with |n| > 192 give 0 or +inf directly), the softmax sum of each group of 16 reduced as
//! `_mm512_reduce_add_ps`, and `expf` past the last whole group of 16.

/// `y[i] = exp(x[i] - max)`, returning `Σ y` in f64 accumulated per group of 8 as ggml's softmax does.
pub(crate) fn soft_max_exp(x: &[f32], max: f32, y: &mut [f32]) -> f64 {
    assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = avx512::Token::get() {
        return t.soft_max_exp(x, max, y);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = avx2::Token::get() {
        return t.soft_max_exp(x, max, y);
    }
    #[cfg(target_arch = "aarch64")]
    if let Some(t) = neon::Token::get() {
        return t.soft_max_exp(x, max, y);
    }
    let mut sum = 0.0f64;
    for (o, &v) in y.iter_mut().zip(x) {
        *o = (v - max).exp();
        sum += *o as f64;
    }
    sum
}

/// `x[i] = silu(x[i]) * g[i]`.
pub(crate) fn swiglu_in_place(x: &mut [f32], g: &[f32]) {
    assert_eq!(x.len(), g.len());
    #[cfg(target_arch = "x86_64")]
    let head = match avx512::Token::get() {
        Some(t) => t.swiglu(x, g),
        None => avx2::Token::get().map_or(0, |t| t.swiglu(x, g)),
    };
    #[cfg(target_arch = "aarch64")]
    let head = neon::Token::get().map_or(0, |t| t.swiglu(x, g));
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let head = 0;
    for i in head..x.len() {
        x[i] = silu(x[i]) * g[i];
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Elements per vector group of [`soft_max_exp`] (16 under the `avx512` profile, 4 on aarch64 (the
/// SVE vector's f32 lanes under the `sve` profile), else 8): a row cut at a multiple of it keeps
/// every group's sum.
pub(crate) fn group() -> usize {
    #[cfg(target_arch = "x86_64")]
    if avx512::Token::get().is_some() {
        return 16;
    }
    #[cfg(target_arch = "aarch64")]
    if let Some(t) = neon::Token::get() {
        return t.group();
    }
    8
}

/// ggml's NEON `exp` of one value (the scalar twin of the 4-lane kernel; the same algorithm as the
/// AVX2 one, from the same routine): `n = round(x/ln2)` by the shift trick, `b = x - n·ln2` in two
/// fused steps, `j = c0·b + (p23 + p45·u)·u` with `u = b²`, then `k + k·j` with `k = 2^n` from the
/// exponent bits, or for |n| > 126 the two-factor scaling (|n| > 192: `s1²`, 0 or +inf).
#[cfg(test)]
pub(crate) fn ref_exp_neon(x: f32) -> f32 {
    let c = f32::from_bits;
    let r = c(0x4b40_0000);
    let z = x.mul_add(c(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    let e = z.to_bits() << 23;
    let k = c(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let p23 = c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb));
    let p45 = c(0x3c07_2010).mul_add(b, c(0x3d2b_9f17));
    let j = p45.mul_add(u, p23).mul_add(u, c(0x3f7f_fff6) * b);
    let big = n.abs() > 126.0; // false for NaN, as `vcagtq_f32`
    if !big {
        return j.mul_add(k, k);
    }
    let d = if n <= 0.0 { 0x8200_0000u32 } else { 0 };
    let s1 = c(d.wrapping_add(0x7f00_0000));
    let s2 = c(e.wrapping_sub(d));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// ggml's AVX-512 `exp` of each value, one lane at a time (the scalar twin of the 16-lane kernel):
/// the same operations in the same order, `scalef` being an exact scaling by `2^n` rounded once.
#[cfg(test)]
pub(crate) fn ref_exp512(x: f32) -> f32 {
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), f32::from_bits(0x4b40_0000));
    let n = z - f32::from_bits(0x4b40_0000);
    let b = (-n).mul_add(f32::from_bits(0x35bf_be8e), (-n).mul_add(f32::from_bits(0x3f31_7200), x));
    let u = b * b;
    let p45 = f32::from_bits(0x3c07_2010).mul_add(b, f32::from_bits(0x3d2b_9f17));
    let p23 = f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb));
    let p01 = f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0);
    let j = p45.mul_add(u, p23).mul_add(u, p01);
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // j · 2^n with one rounding: exact in f64, then rounded to f32 (subnormals included).
    (j as f64 * 2f64.powi(n as i32)) as f32
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Proof that AVX2 and FMA are available (checked once per call site).
    #[derive(Clone, Copy)]
    pub(super) struct Token(());

    impl Token {
        pub(super) fn get() -> Option<Token> {
            (crate::quant::active_isa() != "scalar"
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma"))
            .then_some(Token(()))
        }

        pub(super) fn soft_max_exp(self, x: &[f32], max: f32, y: &mut [f32]) -> f64 {
            // SAFETY: the token proves AVX2+FMA; the body reads and writes whole groups of 8 within the
            // equal-length slices (asserted by the caller).
            unsafe { soft_max_exp(x, max, y) }
        }

        pub(super) fn swiglu(self, x: &mut [f32], g: &[f32]) -> usize {
            // SAFETY: as above.
            unsafe { swiglu(x, g) }
        }
    }

    /// exp of 8 lanes (see the module docs; maximum error about 1.5 ulp, overflow to inf above ~88.38,
    /// underflow to 0 below ~-103.97).
    #[inline(always)]
    unsafe fn exp8(x: __m256) -> __m256 {
        // SAFETY: register arithmetic; the callers are compiled with AVX2 and FMA.
        unsafe {
            let shift = _mm256_set1_ps(f32::from_bits(0x4b40_0000)); // 1.5 · 2^23
            let z = _mm256_fmadd_ps(x, _mm256_set1_ps(f32::from_bits(0x3fb8_aa3b)), shift); // x/ln2 + shift
            let n = _mm256_sub_ps(z, shift);
            let b = _mm256_fnmadd_ps(
                n,
                _mm256_set1_ps(f32::from_bits(0x35bf_be8e)), // ln2, low part
                _mm256_fnmadd_ps(n, _mm256_set1_ps(f32::from_bits(0x3f31_7200)), x), // ln2, high part
            );
            let e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
            let k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0))));
            let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
            let c = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0), _CMP_GT_OQ);
            let u = _mm256_mul_ps(b, b);
            let p45 = _mm256_fmadd_ps(
                _mm256_set1_ps(f32::from_bits(0x3c07_2010)),
                b,
                _mm256_set1_ps(f32::from_bits(0x3d2b_9f17)),
            );
            let p23 = _mm256_fmadd_ps(
                _mm256_set1_ps(f32::from_bits(0x3e2a_af33)),
                b,
                _mm256_set1_ps(f32::from_bits(0x3eff_fedb)),
            );
            let j = _mm256_fmadd_ps(
                _mm256_fmadd_ps(p45, u, p23),
                u,
                _mm256_mul_ps(_mm256_set1_ps(f32::from_bits(0x3f7f_fff6)), b),
            );
            if _mm256_movemask_ps(c) == 0 {
                return _mm256_fmadd_ps(j, k, k);
            }
            let g = _mm256_and_si256(
                _mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                _mm256_set1_epi32(0x8200_0000u32 as i32),
            );
            let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
            let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
            let d = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0), _CMP_GT_OQ);
            let scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
            let normal = _mm256_fmadd_ps(k, j, k);
            _mm256_or_ps(
                _mm256_and_ps(d, _mm256_mul_ps(s1, s1)),
                _mm256_andnot_ps(d, _mm256_or_ps(_mm256_and_ps(c, scaled), _mm256_andnot_ps(c, normal))),
            )
        }
    }

    /// `x / (1 + exp(-x))` of 8 lanes.
    #[inline(always)]
    unsafe fn silu8(x: __m256) -> __m256 {
        // SAFETY: register arithmetic under AVX2/FMA.
        unsafe {
            let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
            _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
        }
    }

    /// Sum of 8 lanes: high half + low half, then movehl, then movehdup.
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: register arithmetic under AVX.
        unsafe {
            let s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        }
    }

    /// # Safety
    /// AVX2 and FMA must be available; `x.len() == y.len()`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn soft_max_exp(x: &[f32], max: f32, y: &mut [f32]) -> f64 {
        let head = x.len() / 8 * 8;
        let mut sum = 0.0f64;
        let m = _mm256_set1_ps(max);
        for i in (0..head).step_by(8) {
            // SAFETY: i + 8 <= head <= len of both slices.
            unsafe {
                let v = exp8(_mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), m));
                _mm256_storeu_ps(y.as_mut_ptr().add(i), v);
                sum += hsum(v) as f64;
            }
        }
        for i in head..x.len() {
            y[i] = (x[i] - max).exp();
            sum += y[i] as f64;
        }
        sum
    }

    /// # Safety
    /// AVX2 and FMA must be available; `x` and `g` have equal lengths. Returns the elements done.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn swiglu(x: &mut [f32], g: &[f32]) -> usize {
        let head = x.len() / 8 * 8;
        for i in (0..head).step_by(8) {
            // SAFETY: i + 8 <= head <= len of both slices.
            unsafe {
                let p = x.as_mut_ptr().add(i);
                let v = _mm256_mul_ps(silu8(_mm256_loadu_ps(p)), _mm256_loadu_ps(g.as_ptr().add(i)));
                _mm256_storeu_ps(p, v);
            }
        }
        head
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use crate::numerics::{self, Numerics};

    /// Proof that the `avx512` profile is in force (which implies AVX-512 F/BW/VL/DQ).
    #[derive(Clone, Copy)]
    pub(super) struct Token(());

    impl Token {
        pub(super) fn get() -> Option<Token> {
            (numerics::active() == Numerics::Avx512).then_some(Token(()))
        }

        pub(super) fn soft_max_exp(self, x: &[f32], max: f32, y: &mut [f32]) -> f64 {
            // SAFETY: the token proves AVX-512F/DQ; the body reads and writes whole groups of 16
            // within the equal-length slices (asserted by the caller).
            unsafe { soft_max_exp(x, max, y) }
        }

        pub(super) fn swiglu(self, x: &mut [f32], g: &[f32]) -> usize {
            // SAFETY: as above.
            unsafe { swiglu(x, g) }
        }
    }

    /// exp of 16 lanes as ggml's AVX-512 build computes it (module docs).
    #[inline(always)]
    unsafe fn exp16(x: __m512) -> __m512 {
        // SAFETY: register arithmetic; the callers are compiled with AVX-512F.
        unsafe {
            let c = |b: u32| _mm512_set1_ps(f32::from_bits(b));
            let r = c(0x4b40_0000);
            let z = _mm512_fmadd_ps(x, c(0x3fb8_aa3b), r);
            let n = _mm512_sub_ps(z, r);
            let b = _mm512_fnmadd_ps(n, c(0x35bf_be8e), _mm512_fnmadd_ps(n, c(0x3f31_7200), x));
            let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
            let u = _mm512_mul_ps(b, b);
            let j = _mm512_fmadd_ps(
                _mm512_fmadd_ps(
                    _mm512_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                    u,
                    _mm512_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
                ),
                u,
                _mm512_fmadd_ps(c(0x3f7f_fff6), b, _mm512_set1_ps(1.0)),
            );
            let res = _mm512_scalef_ps(j, n);
            if d == 0 {
                return res;
            }
            let le0 = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
            let alt = _mm512_mask_blend_ps(le0, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
            _mm512_mask_blend_ps(d, res, alt)
        }
    }

    /// `_mm512_reduce_add_ps` in GCC's order (halves of 256, of 128, then `(s0+s2)+(s1+s3)`).
    #[inline(always)]
    unsafe fn reduce(v: __m512) -> f32 {
        // SAFETY: register arithmetic under AVX-512F/DQ.
        unsafe {
            let h = _mm256_add_ps(_mm512_extractf32x8_ps::<1>(v), _mm512_castps512_ps256(v));
            let s = _mm_add_ps(_mm256_extractf128_ps::<1>(h), _mm256_castps256_ps128(h));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        }
    }

    /// # Safety
    /// AVX-512F/DQ must be available; `x.len() == y.len()`.
    #[target_feature(enable = "avx2,fma,avx512f,avx512dq")]
    unsafe fn soft_max_exp(x: &[f32], max: f32, y: &mut [f32]) -> f64 {
        let head = x.len() / 16 * 16;
        let mut sum = 0.0f64;
        let m = _mm512_set1_ps(max);
        for i in (0..head).step_by(16) {
            // SAFETY: i + 16 <= head <= len of both slices.
            unsafe {
                let v = exp16(_mm512_sub_ps(_mm512_loadu_ps(x.as_ptr().add(i)), m));
                _mm512_storeu_ps(y.as_mut_ptr().add(i), v);
                sum += reduce(v) as f64;
            }
        }
        for i in head..x.len() {
            y[i] = (x[i] - max).exp();
            sum += y[i] as f64;
        }
        sum
    }

    /// # Safety
    /// AVX-512F/DQ must be available; `x` and `g` have equal lengths. Returns the elements done.
    #[target_feature(enable = "avx2,fma,avx512f,avx512dq")]
    unsafe fn swiglu(x: &mut [f32], g: &[f32]) -> usize {
        let head = x.len() / 16 * 16;
        for i in (0..head).step_by(16) {
            // SAFETY: i + 16 <= head <= len of both slices.
            unsafe {
                let p = x.as_mut_ptr().add(i);
                let v = _mm512_loadu_ps(p);
                let e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), v));
                let s = _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0), e));
                _mm512_storeu_ps(p, _mm512_mul_ps(s, _mm512_loadu_ps(g.as_ptr().add(i))));
            }
        }
        head
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    /// Proof that the NEON kernel set is in use (NEON is part of every aarch64 CPU; the `scalar`
    /// kernel set keeps the C library's `expf`), with the SVE vector's f32 lanes when the `sve`
    /// profile is in force (0 otherwise: ggml's NEON rows).
    #[derive(Clone, Copy)]
    pub(super) struct Token(usize);

    impl Token {
        pub(super) fn get() -> Option<Token> {
            (crate::quant::active_isa() != "scalar" && std::arch::is_aarch64_feature_detected!("neon"))
                .then(|| Token(sve_lanes()))
        }

        /// Elements per softmax group.
        pub(super) fn group(self) -> usize {
            if self.0 > 0 {
                self.0
            } else {
                4
            }
        }

        pub(super) fn soft_max_exp(self, x: &[f32], max: f32, y: &mut [f32]) -> f64 {
            // SAFETY: the token proves NEON; the bodies read and write whole groups of 4 within the
            // equal-length slices (asserted by the caller) or within their own buffers.
            unsafe {
                if self.0 > 0 {
                    soft_max_exp_sve(x, max, y, self.0)
                } else {
                    soft_max_exp(x, max, y)
                }
            }
        }

        pub(super) fn swiglu(self, x: &mut [f32], g: &[f32]) -> usize {
            // SAFETY: as above.
            unsafe {
                if self.0 > 0 {
                    swiglu_sve(x, g)
                } else {
                    swiglu(x, g)
                }
            }
        }
    }

    /// The f32 lanes of this CPU's SVE vector under the `sve` profile (4, 8 or 16), else 0.
    pub(super) fn sve_lanes() -> usize {
        static LANES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *LANES.get_or_init(|| {
            if crate::numerics::active() != crate::numerics::Numerics::Sve {
                return 0;
            }
            crate::quant::aarch64::sve_f32_lanes().filter(|w| matches!(w, 4 | 8 | 16)).unwrap_or(0)
        })
    }

    /// `exp` of up to `w` values (`w` ≤ 16, a multiple of 4) as one predicated SVE vector: the lanes
    /// past `x.len()` are computed on -inf and set to +0, as an inactive lane of `faddv` counts.
    #[inline(always)]
    unsafe fn exp_vector(x: &[f32], max: f32, w: usize, out: &mut [f32; 16]) {
        let mut v = [f32::NEG_INFINITY; 16];
        v[..x.len()].copy_from_slice(x);
        // SAFETY: 16-element buffers, w ≤ 16; register arithmetic under NEON (callers).
        unsafe {
            let m = vdupq_n_f32(max);
            for q in (0..w).step_by(4) {
                let e = exp4(vsubq_f32(vld1q_f32(v.as_ptr().add(q)), m));
                vst1q_f32(out.as_mut_ptr().add(q), e);
            }
        }
        out[x.len()..w].fill(0.0);
    }

    /// `faddv`: recursive halving of the lanes.
    fn faddv(v: &[f32]) -> f32 {
        if v.len() == 1 {
            return v[0];
        }
        let h = v.len() / 2;
        faddv(&v[..h]) + faddv(&v[h..])
    }

    /// ggml's SVE softmax row (twin: `super::tests::sve_rows_twin`).
    ///
    /// # Safety
    /// NEON must be available; `x.len() == y.len()`; `w` is 4, 8 or 16.
    #[target_feature(enable = "neon")]
    unsafe fn soft_max_exp_sve(x: &[f32], max: f32, y: &mut [f32], w: usize) -> f64 {
        let mut sum = 0.0f64;
        let mut e = [0.0f32; 16];
        for (xc, yc) in x.chunks(w).zip(y.chunks_mut(w)) {
            // SAFETY: w ≤ 16 (caller); NEON enabled on this fn.
            unsafe { exp_vector(xc, max, w, &mut e) };
            yc.copy_from_slice(&e[..yc.len()]);
            sum += faddv(&e[..w]) as f64;
        }
        sum
    }

    /// ggml's SVE SwiGLU row: every element through the vector `exp` (no C library tail). Returns
    /// the elements done (all).
    ///
    /// # Safety
    /// NEON must be available; `x` and `g` have equal lengths.
    #[target_feature(enable = "neon")]
    unsafe fn swiglu_sve(x: &mut [f32], g: &[f32]) -> usize {
        let head = x.len() / 4 * 4;
        // SAFETY: forwarded; the NEON body covers whole groups of 4.
        unsafe { swiglu(x, g) };
        if head < x.len() {
            let mut v = [0.0f32; 4];
            let tail = x.len() - head;
            v[..tail].copy_from_slice(&x[head..]);
            // SAFETY: 4-element buffer; register arithmetic under NEON.
            unsafe {
                let xv = vld1q_f32(v.as_ptr());
                let e = exp4(vsubq_f32(vdupq_n_f32(0.0), xv));
                vst1q_f32(v.as_mut_ptr(), vdivq_f32(xv, vaddq_f32(vdupq_n_f32(1.0), e)));
            }
            for i in 0..tail {
                x[head + i] = v[i] * g[head + i];
            }
        }
        x.len()
    }

    /// exp of 4 lanes as ggml's NEON `ggml_v_expf` (twin: `super::ref_exp_neon`).
    #[inline(always)]
    unsafe fn exp4(x: float32x4_t) -> float32x4_t {
        // SAFETY: register arithmetic; the callers are compiled with NEON.
        unsafe {
            let c = |b: u32| vdupq_n_f32(f32::from_bits(b));
            let r = c(0x4b40_0000);
            let z = vfmaq_f32(r, x, c(0x3fb8_aa3b));
            let n = vsubq_f32(z, r);
            let b = vfmsq_f32(vfmsq_f32(x, n, c(0x3f31_7200)), n, c(0x35bf_be8e));
            let e = vshlq_n_u32::<23>(vreinterpretq_u32_f32(z));
            let k = vreinterpretq_f32_u32(vaddq_u32(e, vreinterpretq_u32_f32(vdupq_n_f32(1.0))));
            let big = vcagtq_f32(n, vdupq_n_f32(126.0));
            let u = vmulq_f32(b, b);
            let j = vfmaq_f32(
                vmulq_f32(c(0x3f7f_fff6), b),
                vfmaq_f32(
                    vfmaq_f32(c(0x3eff_fedb), c(0x3e2a_af33), b),
                    vfmaq_f32(c(0x3d2b_9f17), c(0x3c07_2010), b),
                    u,
                ),
                u,
            );
            if vmaxvq_u32(big) == 0 {
                return vfmaq_f32(k, j, k);
            }
            let d = vandq_u32(vclezq_f32(n), vdupq_n_u32(0x8200_0000));
            let s1 = vreinterpretq_f32_u32(vaddq_u32(d, vdupq_n_u32(0x7f00_0000)));
            let s2 = vreinterpretq_f32_u32(vsubq_u32(e, d));
            vbslq_f32(
                vcagtq_f32(n, vdupq_n_f32(192.0)),
                vmulq_f32(s1, s1),
                vbslq_f32(big, vmulq_f32(vfmaq_f32(s2, s2, j), s1), vfmaq_f32(k, k, j)),
            )
        }
    }

    /// # Safety
    /// NEON must be available; `x.len() == y.len()`.
    #[target_feature(enable = "neon")]
    unsafe fn soft_max_exp(x: &[f32], max: f32, y: &mut [f32]) -> f64 {
        let head = x.len() / 4 * 4;
        let mut sum = 0.0f64;
        let m = vdupq_n_f32(max);
        for i in (0..head).step_by(4) {
            // SAFETY: i + 4 <= head <= len of both slices.
            unsafe {
                let v = exp4(vsubq_f32(vld1q_f32(x.as_ptr().add(i)), m));
                vst1q_f32(y.as_mut_ptr().add(i), v);
                // vaddvq_f32: (l0 + l1) + (l2 + l3).
                let p = vpaddq_f32(v, v);
                sum += vgetq_lane_f32::<0>(vpaddq_f32(p, p)) as f64;
            }
        }
        for i in head..x.len() {
            y[i] = (x[i] - max).exp();
            sum += y[i] as f64;
        }
        sum
    }

    /// # Safety
    /// NEON must be available; `x` and `g` have equal lengths. Returns the elements done.
    #[target_feature(enable = "neon")]
    unsafe fn swiglu(x: &mut [f32], g: &[f32]) -> usize {
        let head = x.len() / 4 * 4;
        for i in (0..head).step_by(4) {
            // SAFETY: i + 4 <= head <= len of both slices.
            unsafe {
                let p = x.as_mut_ptr().add(i);
                let v = vld1q_f32(p);
                let e = exp4(vsubq_f32(vdupq_n_f32(0.0), v));
                let silu = vdivq_f32(v, vaddq_f32(vdupq_n_f32(1.0), e));
                vst1q_f32(p, vmulq_f32(silu, vld1q_f32(g.as_ptr().add(i))));
            }
        }
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avx512_profile_rows_equal_their_scalar_twin() {
        // Only meaningful where the profile is in force (LLAMAD_NUMERICS / detection); 16-lane SVE
        // rows (the `sve` profile at 512 bits) are another order.
        if group() != 16 || cfg!(not(target_arch = "x86_64")) {
            return;
        }
        let xs: Vec<f32> = (-3000..3000)
            .map(|i| i as f32 * 0.037)
            .chain([-200.0, -104.5, -103.9, -87.3, -0.0, 88.3, 88.4, 89.0, 200.0, f32::NEG_INFINITY])
            .collect();
        let mut y = vec![0.0f32; xs.len()];
        let sum = soft_max_exp(&xs, 0.0, &mut y);
        let head = xs.len() / 16 * 16;
        let mut want_sum = 0.0f64;
        for (g, chunk) in xs[..head].chunks(16).enumerate() {
            let e: Vec<f32> = chunk.iter().map(|&v| ref_exp512(v)).collect();
            for (l, &v) in e.iter().enumerate() {
                assert_eq!(y[16 * g + l].to_bits(), v.to_bits(), "exp({})", chunk[l]);
            }
            let a: [f32; 16] = std::array::from_fn(|l| e[l]);
            let h: [f32; 8] = std::array::from_fn(|i| a[i + 8] + a[i]);
            let q: [f32; 4] = std::array::from_fn(|i| h[i + 4] + h[i]);
            want_sum += ((q[0] + q[2]) + (q[1] + q[3])) as f64;
        }
        for &v in &xs[head..] {
            want_sum += v.exp() as f64;
        }
        assert_eq!(sum.to_bits(), want_sum.to_bits());
        let g: Vec<f32> = (0..xs.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let fin: Vec<f32> = xs.iter().map(|v| if v.is_finite() { *v } else { -50.0 }).collect();
        let mut s = fin.clone();
        swiglu_in_place(&mut s, &g);
        for i in 0..head {
            let want = fin[i] / (1.0 + ref_exp512(-fin[i])) * g[i];
            assert_eq!(s[i].to_bits(), want.to_bits(), "swiglu({})", fin[i]);
        }
    }

    #[test]
    fn neon_exp_twin_is_close_to_libm() {
        // The scalar model of ggml's NEON exp on every target: within 2 ulp of the C library's expf.
        for i in -2000..2000 {
            let x = i as f32 * 0.05;
            let (v, want) = (ref_exp_neon(x), x.exp());
            if want.is_infinite() || want == 0.0 {
                assert!(v == want || (want == 0.0 && v < 1e-37), "exp({x}) = {v}, libm {want}");
                continue;
            }
            let ulps = (v.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulps <= 2, "exp({x}) = {v}, libm {want} ({ulps} ulp)");
        }
        assert_eq!(ref_exp_neon(f32::NEG_INFINITY), 0.0);
        assert_eq!(ref_exp_neon(200.0), f32::INFINITY);
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_rows_equal_their_scalar_twin() {
        if group() != 4 || neon::sve_lanes() != 0 {
            return;
        }
        let xs: Vec<f32> = (-3000..3000)
            .map(|i| i as f32 * 0.037)
            .chain([-200.0, -104.5, -103.9, -87.3, -0.0, 88.3, 88.4, 89.0, 200.0, f32::NEG_INFINITY, 1.5])
            .collect();
        let mut y = vec![0.0f32; xs.len()];
        let sum = soft_max_exp(&xs, 0.0, &mut y);
        let head = xs.len() / 4 * 4;
        let mut want_sum = 0.0f64;
        for (g, chunk) in xs[..head].chunks(4).enumerate() {
            let e: Vec<f32> = chunk.iter().map(|&v| ref_exp_neon(v)).collect();
            for (l, &v) in e.iter().enumerate() {
                assert_eq!(y[4 * g + l].to_bits(), v.to_bits(), "exp({})", chunk[l]);
            }
            want_sum += ((e[0] + e[1]) + (e[2] + e[3])) as f64;
        }
        for &v in &xs[head..] {
            want_sum += v.exp() as f64;
        }
        assert_eq!(sum.to_bits(), want_sum.to_bits());
        let g: Vec<f32> = (0..xs.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let fin: Vec<f32> = xs.iter().map(|v| if v.is_finite() { *v } else { -50.0 }).collect();
        let mut s = fin.clone();
        swiglu_in_place(&mut s, &g);
        for i in 0..fin.len() {
            let e = if i < head { ref_exp_neon(-fin[i]) } else { (-fin[i]).exp() };
            let want = fin[i] / (1.0 + e) * g[i];
            assert_eq!(s[i].to_bits(), want.to_bits(), "swiglu({})", fin[i]);
        }
    }

    /// ggml's SVE softmax row in scalar form: groups of `w`, each summed by `faddv` (recursive
    /// halving) with the missing lanes of the last one as +0, every element through the vector exp.
    #[cfg(target_arch = "aarch64")]
    fn sve_rows_twin(xs: &[f32], w: usize) -> (Vec<f32>, f64) {
        fn faddv(v: &[f32]) -> f32 {
            if v.len() == 1 {
                return v[0];
            }
            faddv(&v[..v.len() / 2]) + faddv(&v[v.len() / 2..])
        }
        let mut y = Vec::new();
        let mut sum = 0.0f64;
        for chunk in xs.chunks(w) {
            let mut e: Vec<f32> = chunk.iter().map(|&v| ref_exp_neon(v)).collect();
            y.extend_from_slice(&e);
            e.resize(w, 0.0);
            sum += faddv(&e) as f64;
        }
        (y, sum)
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn sve_rows_equal_their_scalar_twin() {
        let w = neon::sve_lanes();
        if w == 0 || crate::quant::active_isa() == "scalar" {
            eprintln!("the sve profile is not in force: nothing to check");
            return;
        }
        assert_eq!(group(), w);
        for len in [1usize, 3, 4, 7, 8, 9, 15, 16, 17, 33, 6011] {
            let xs: Vec<f32> = (-3000..3000)
                .map(|i| i as f32 * 0.037)
                .chain([-200.0, -104.5, -103.9, -87.3, -0.0, 88.3, 88.4, 89.0, 200.0, f32::NEG_INFINITY, 1.5])
                .take(len)
                .collect();
            let mut y = vec![0.0f32; xs.len()];
            let sum = soft_max_exp(&xs, 0.0, &mut y);
            let (want, want_sum) = sve_rows_twin(&xs, w);
            for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "len {len} exp({})", xs[i]);
            }
            assert_eq!(sum.to_bits(), want_sum.to_bits(), "len {len} w {w}");
            let g: Vec<f32> = (0..xs.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
            let fin: Vec<f32> = xs.iter().map(|v| if v.is_finite() { *v } else { -50.0 }).collect();
            let mut s = fin.clone();
            swiglu_in_place(&mut s, &g);
            for i in 0..fin.len() {
                let want = fin[i] / (1.0 + ref_exp_neon(-fin[i])) * g[i];
                assert_eq!(s[i].to_bits(), want.to_bits(), "len {len} swiglu({})", fin[i]);
            }
        }
    }

    #[test]
    fn vector_exp_is_close_to_libm_and_handles_extremes() {
        // Independent reference: the C library's expf; the vector exp is within 2 ulp of it.
        let xs: Vec<f32> = (-2000..2000)
            .map(|i| i as f32 * 0.05)
            .chain([-200.0, -104.5, -87.0, 0.0, 88.0, 89.0, 200.0])
            .collect();
        let n = xs.len() / 8 * 8;
        let mut y = vec![0.0f32; n];
        let _ = soft_max_exp(&xs[..n], 0.0, &mut y);
        for (&x, &v) in xs[..n].iter().zip(&y) {
            let want = x.exp();
            if want.is_infinite() || want == 0.0 {
                assert!(v == want || (want == 0.0 && v < 1e-37), "exp({x}) = {v}, libm {want}");
                continue;
            }
            let ulps = (v.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulps <= 2, "exp({x}) = {v}, libm {want} ({ulps} ulp)");
        }
    }

    #[test]
    fn swiglu_matches_formula() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.7).collect();
        let g: Vec<f32> = (0..37).map(|i| 1.0 + i as f32 * 0.1).collect();
        let mut y = x.clone();
        swiglu_in_place(&mut y, &g);
        for i in 0..37 {
            let want = x[i] as f64 / (1.0 + (-(x[i] as f64)).exp()) * g[i] as f64;
            assert!((y[i] as f64 - want).abs() <= 1e-6 * want.abs().max(1.0), "{i}: {} vs {want}", y[i]);
        }
    }
}
