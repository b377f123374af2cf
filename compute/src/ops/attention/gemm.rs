//! The f32 product of flash attention's tiled path: `C[m×n] += A[m×k]·B[k×n]`, every element of `C`
//! one chain of fused multiply-adds over `k` in order, starting from its value in `C`.
//!
//! ref: ggml-compute-semantics.md §3.3 FLASH_ATTN_EXT. This is the order of ggml's `simd_gemm`
//! (ggml-cpu/simd-gemm.h), which its CPU flash attention uses for `Q·Kᵀ` and `P·V` from 64 query
//! rows: each output lane accumulates `acc = fma(b, a, acc)` for `kk = 0, 1, …` whatever the register
//! blocking or vector width, so the AVX2, AVX-512 and scalar forms here give the same bits (and the
//! same bits as ggml's AVX2 and AVX-512 builds). The project's other float GEMMs split the sum over
//! lanes (ggml's `vec_dot` and llamafile orders) and cannot stand in for it.
//!
//! The vector forms put `n` across the lanes and broadcast `A`; the block is 6 rows × 4 vectors under
//! AVX-512 (24 accumulators) and 6 rows × 2 vectors under AVX2 (12), with narrower blocks and a masked
//! tail for the edges. The scalar form is the specification; the test at the bottom compares them.

/// Strides and sizes of one product (row-major, leading dimensions in elements).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
}

impl Dims {
    /// Panics unless the slices hold every element the product reads or writes.
    fn check(&self, c: &[f32], a: &[f32], b: &[f32]) {
        let Dims { m, k, n, lda, ldb, ldc } = *self;
        if m == 0 || n == 0 {
            return;
        }
        assert!(n <= ldc && (m - 1) * ldc + n <= c.len(), "fa_gemm: c too short for {self:?}");
        if k == 0 {
            return;
        }
        assert!(k <= lda && (m - 1) * lda + k <= a.len(), "fa_gemm: a too short for {self:?}");
        assert!(n <= ldb && (k - 1) * ldb + n <= b.len(), "fa_gemm: b too short for {self:?}");
    }
}

/// `C += A·B` (see the module docs).
pub(crate) fn gemm(d: Dims, c: &mut [f32], a: &[f32], b: &[f32]) {
    d.check(c, a, b);
    if d.m == 0 || d.n == 0 || d.k == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(t) = x86::Avx512::get() {
            return t.gemm(d, c, a, b);
        }
        if let Some(t) = x86::Avx2::get() {
            return t.gemm(d, c, a, b);
        }
    }
    gemm_scalar(d, c, a, b);
}

/// The specification: one fused chain per element.
pub(crate) fn gemm_scalar(d: Dims, c: &mut [f32], a: &[f32], b: &[f32]) {
    d.check(c, a, b);
    for i in 0..d.m {
        for j in 0..d.n {
            let mut acc = c[i * d.ldc + j];
            for kk in 0..d.k {
                acc = a[i * d.lda + kk].mul_add(b[kk * d.ldb + j], acc);
            }
            c[i * d.ldc + j] = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Dims;

    /// Rows per register block.
    const RM: usize = 6;

    /// Proof that AVX-512F is available and the kernel set in use is the AVX-512 one.
    #[derive(Clone, Copy)]
    pub(super) struct Avx512(());

    impl Avx512 {
        pub(super) fn get() -> Option<Avx512> {
            (crate::quant::active_isa() == "avx512" && is_x86_feature_detected!("avx512f"))
                .then_some(Avx512(()))
        }

        pub(super) fn gemm(self, d: Dims, c: &mut [f32], a: &[f32], b: &[f32]) {
            // SAFETY: the token proves AVX-512F; `gemm` checked the slices against `d` (Dims::check).
            unsafe { gemm512(d, c.as_mut_ptr(), a.as_ptr(), b.as_ptr()) }
        }
    }

    /// Proof that AVX2 and FMA are available and the kernel set is not the scalar one.
    #[derive(Clone, Copy)]
    pub(super) struct Avx2(());

    impl Avx2 {
        pub(super) fn get() -> Option<Avx2> {
            (crate::quant::active_isa() != "scalar"
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma"))
            .then_some(Avx2(()))
        }

        pub(super) fn gemm(self, d: Dims, c: &mut [f32], a: &[f32], b: &[f32]) {
            // SAFETY: the token proves AVX2+FMA; `gemm` checked the slices against `d`.
            unsafe { gemm256(d, c.as_mut_ptr(), a.as_ptr(), b.as_ptr()) }
        }
    }

    /// `RM'` rows × `RN` vectors of 16 at `(c, a, b)`.
    ///
    /// # Safety
    /// AVX-512F; rows `0..R` of `c` (stride `ldc`) hold `16·RN` elements from `c`, rows of `a` hold
    /// `k`, rows `0..k` of `b` hold `16·RN`.
    #[inline(always)]
    unsafe fn block512<const R: usize, const RN: usize>(d: &Dims, c: *mut f32, a: *const f32, b: *const f32) {
        // SAFETY: every address is inside the ranges the caller vouches for.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); RN]; R];
            for (i, row) in acc.iter_mut().enumerate() {
                for (r, v) in row.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(c.add(i * d.ldc + 16 * r));
                }
            }
            for kk in 0..d.k {
                let mut bv = [_mm512_setzero_ps(); RN];
                for (r, v) in bv.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(b.add(kk * d.ldb + 16 * r));
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let p = _mm512_set1_ps(*a.add(i * d.lda + kk));
                    for (v, bb) in row.iter_mut().zip(bv.iter()) {
                        *v = _mm512_fmadd_ps(*bb, p, *v);
                    }
                }
            }
            for (i, row) in acc.iter().enumerate() {
                for (r, v) in row.iter().enumerate() {
                    _mm512_storeu_ps(c.add(i * d.ldc + 16 * r), *v);
                }
            }
        }
    }

    /// `R` rows × the first `cols < 16` columns, masked.
    ///
    /// # Safety
    /// As [`block512`] with `cols` elements per row of `c` and `b`.
    #[inline(always)]
    unsafe fn tail512<const R: usize>(d: &Dims, c: *mut f32, a: *const f32, b: *const f32, cols: usize) {
        // SAFETY: masked loads and stores touch only the first `cols` elements of each row.
        unsafe {
            let mask: __mmask16 = ((1u32 << cols) - 1) as __mmask16;
            let mut acc = [_mm512_setzero_ps(); R];
            for (i, v) in acc.iter_mut().enumerate() {
                *v = _mm512_maskz_loadu_ps(mask, c.add(i * d.ldc));
            }
            for kk in 0..d.k {
                let bv = _mm512_maskz_loadu_ps(mask, b.add(kk * d.ldb));
                for (i, v) in acc.iter_mut().enumerate() {
                    *v = _mm512_fmadd_ps(bv, _mm512_set1_ps(*a.add(i * d.lda + kk)), *v);
                }
            }
            for (i, v) in acc.iter().enumerate() {
                _mm512_mask_storeu_ps(c.add(i * d.ldc), mask, *v);
            }
        }
    }

    /// All columns of `R` rows starting at `(c, a)`.
    ///
    /// # Safety
    /// AVX-512F; the `R` rows lie inside the product `d` describes.
    #[inline(always)]
    unsafe fn rows512<const R: usize>(d: &Dims, c: *mut f32, a: *const f32, b: *const f32) {
        let mut j = 0;
        // SAFETY: column blocks stay below `d.n`, inside the rows the caller vouches for.
        unsafe {
            while j + 64 <= d.n {
                block512::<R, 4>(d, c.add(j), a, b.add(j));
                j += 64;
            }
            while j + 16 <= d.n {
                block512::<R, 1>(d, c.add(j), a, b.add(j));
                j += 16;
            }
            if j < d.n {
                tail512::<R>(d, c.add(j), a, b.add(j), d.n - j);
            }
        }
    }

    /// # Safety
    /// AVX-512F; the pointers hold the product `d` describes (checked by the caller).
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn gemm512(d: Dims, c: *mut f32, a: *const f32, b: *const f32) {
        let mut i = 0;
        // SAFETY: row blocks stay below `d.m`.
        unsafe {
            while i + RM <= d.m {
                rows512::<RM>(&d, c.add(i * d.ldc), a.add(i * d.lda), b);
                i += RM;
            }
            while i < d.m {
                rows512::<1>(&d, c.add(i * d.ldc), a.add(i * d.lda), b);
                i += 1;
            }
        }
    }

    /// `R` rows × `RN` vectors of 8.
    ///
    /// # Safety
    /// AVX2+FMA; as [`block512`] with 8 lanes.
    #[inline(always)]
    unsafe fn block256<const R: usize, const RN: usize>(d: &Dims, c: *mut f32, a: *const f32, b: *const f32) {
        // SAFETY: every address is inside the ranges the caller vouches for.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); RN]; R];
            for (i, row) in acc.iter_mut().enumerate() {
                for (r, v) in row.iter_mut().enumerate() {
                    *v = _mm256_loadu_ps(c.add(i * d.ldc + 8 * r));
                }
            }
            for kk in 0..d.k {
                let mut bv = [_mm256_setzero_ps(); RN];
                for (r, v) in bv.iter_mut().enumerate() {
                    *v = _mm256_loadu_ps(b.add(kk * d.ldb + 8 * r));
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let p = _mm256_set1_ps(*a.add(i * d.lda + kk));
                    for (v, bb) in row.iter_mut().zip(bv.iter()) {
                        *v = _mm256_fmadd_ps(*bb, p, *v);
                    }
                }
            }
            for (i, row) in acc.iter().enumerate() {
                for (r, v) in row.iter().enumerate() {
                    _mm256_storeu_ps(c.add(i * d.ldc + 8 * r), *v);
                }
            }
        }
    }

    /// `R` rows × the first `cols < 8` columns, masked.
    ///
    /// # Safety
    /// As [`block256`] with `cols` elements per row of `c` and `b`.
    #[inline(always)]
    unsafe fn tail256<const R: usize>(d: &Dims, c: *mut f32, a: *const f32, b: *const f32, cols: usize) {
        // SAFETY: masked loads and stores touch only the first `cols` elements of each row.
        unsafe {
            let mask =
                _mm256_cmpgt_epi32(_mm256_set1_epi32(cols as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            let mut acc = [_mm256_setzero_ps(); R];
            for (i, v) in acc.iter_mut().enumerate() {
                *v = _mm256_maskload_ps(c.add(i * d.ldc), mask);
            }
            for kk in 0..d.k {
                let bv = _mm256_maskload_ps(b.add(kk * d.ldb), mask);
                for (i, v) in acc.iter_mut().enumerate() {
                    *v = _mm256_fmadd_ps(bv, _mm256_set1_ps(*a.add(i * d.lda + kk)), *v);
                }
            }
            for (i, v) in acc.iter().enumerate() {
                _mm256_maskstore_ps(c.add(i * d.ldc), mask, *v);
            }
        }
    }

    /// All columns of `R` rows.
    ///
    /// # Safety
    /// AVX2+FMA; the `R` rows lie inside the product `d` describes.
    #[inline(always)]
    unsafe fn rows256<const R: usize>(d: &Dims, c: *mut f32, a: *const f32, b: *const f32) {
        let mut j = 0;
        // SAFETY: column blocks stay below `d.n`.
        unsafe {
            while j + 16 <= d.n {
                block256::<R, 2>(d, c.add(j), a, b.add(j));
                j += 16;
            }
            while j + 8 <= d.n {
                block256::<R, 1>(d, c.add(j), a, b.add(j));
                j += 8;
            }
            if j < d.n {
                tail256::<R>(d, c.add(j), a, b.add(j), d.n - j);
            }
        }
    }

    /// # Safety
    /// AVX2+FMA; the pointers hold the product `d` describes (checked by the caller).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn gemm256(d: Dims, c: *mut f32, a: *const f32, b: *const f32) {
        let mut i = 0;
        // SAFETY: row blocks stay below `d.m`.
        unsafe {
            while i + RM <= d.m {
                rows256::<RM>(&d, c.add(i * d.ldc), a.add(i * d.lda), b);
                i += RM;
            }
            while i < d.m {
                rows256::<1>(&d, c.add(i * d.ldc), a.add(i * d.lda), b);
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn vals(rng: &mut impl Rng, n: usize, special: bool) -> Vec<f32> {
        (0..n)
            .map(|i| {
                if special && i % 7 == 3 {
                    [0.0, -0.0, 1e-40, -3.0e38, f32::INFINITY, 65504.0][i / 7 % 6]
                } else {
                    rng.random_range(-2.0f32..2.0)
                }
            })
            .collect()
    }

    #[test]
    fn simd_and_scalar_agree_bit_for_bit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for (m, k, n) in [
            (1, 1, 1),
            (6, 64, 64),
            (7, 80, 80),
            (13, 64, 96),
            (64, 128, 64),
            (5, 3, 15),
            (12, 64, 256),
            (2, 17, 7),
        ] {
            for special in [false, true] {
                let (lda, ldb, ldc) = (k + 3, n + 5, n + 1);
                let a = vals(&mut rng, m * lda, special);
                let b = vals(&mut rng, k * ldb, special);
                let c0 = vals(&mut rng, m * ldc, false);
                let d = Dims { m, k, n, lda, ldb, ldc };
                let mut want = c0.clone();
                gemm_scalar(d, &mut want, &a, &b);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                let mut got = c0.clone();
                gemm(d, &mut got, &a, &b);
                assert_eq!(bits(&got), bits(&want), "m={m} k={k} n={n} special={special}");
                #[cfg(target_arch = "x86_64")]
                {
                    if let Some(t) = x86::Avx2::get() {
                        let mut got = c0.clone();
                        t.gemm(d, &mut got, &a, &b);
                        assert_eq!(bits(&got), bits(&want), "avx2 m={m} k={k} n={n} special={special}");
                    }
                    if let Some(t) = x86::Avx512::get() {
                        let mut got = c0.clone();
                        t.gemm(d, &mut got, &a, &b);
                        assert_eq!(bits(&got), bits(&want), "avx512 m={m} k={k} n={n} special={special}");
                    }
                }
            }
        }
    }

    #[test]
    fn each_element_is_one_fused_chain_in_order() {
        // 1 + 2^-24 + 2^-24: in order (fused) 1 + 2^-24 rounds to 1 each time; any reassociation that
        // adds the two small products first gives 1 + 2^-23.
        let e = 2f32.powi(-24);
        let a = [1.0, e, e];
        let b = [1.0, 1.0, 1.0];
        let mut c = [0.0f32];
        gemm(Dims { m: 1, k: 3, n: 1, lda: 3, ldb: 1, ldc: 1 }, &mut c, &a, &b);
        assert_eq!(c[0], 1.0);
        // Fused: 1·(1 + 2^-23)·(1 − 2^-23) − 1 is exactly −2^-46.
        let mut c = [-1.0f32; 20];
        let b = [1.0 + f32::EPSILON; 20];
        gemm(Dims { m: 1, k: 1, n: 20, lda: 1, ldb: 20, ldc: 20 }, &mut c, &[1.0 - f32::EPSILON], &b);
        assert!(c.iter().all(|&x| x == -(2f32.powi(-46))), "{c:?}");
    }
}
