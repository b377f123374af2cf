//! llama.cpp's local (repacked) order on AVX-512 VNNI (see `quant::local`): the packed panels of
//! Q4_0 and IQ4_NL, whose order is that one, kept for in-process runs under every profile, and the
//! interleaved Q4_0 product for generation in that order: per block column, the eight four-element
//! weight groups of 16 rows are multiplied into ONE integer accumulator that starts from the
//! block's total activation offset, so it holds the block's exact sum for 16 rows, then one
//! `fma(f32(isum), d_w · d_y, acc)` per block; and Q4_K's one-row dot in that order (AVX2: each
//! super-block's exact `Σ sc_j · Σ q·y` from `maddubs`/`madd`, then the two fused float steps).
//!
//! Like the other x86 modules, the safe wrapper is reachable only through [`install`], which runs
//! only after the features were detected: the invariant behind every `// SAFETY:` comment here.

use std::arch::x86_64::*;

use super::avx2::util::{dot_u8i8_epi32, hsum_epi32};
use crate::dtype::GgmlType;
use crate::quant::blocks::{f16le, take_blocks, BlockQ4K, BlockQ8K, QK};
use crate::quant::dispatch::Kernels;
use crate::quant::interleave::{self, check_args_cols, LOCAL_MAX_COLS, ROWS};
use crate::quant::local::LocalKernels;
use crate::quant::scalar::k4_scales;

/// Installs the local-order kernels: Q4_K's dot on AVX2, and with AVX-512 F/BW/VNNI those of Q4_0
/// and IQ4_NL from the panels `panel::install` put in `k` (call it after that).
pub fn install(k: &mut Kernels) {
    if !super::avx2_available() {
        return;
    }
    k.set_local(
        GgmlType::Q4_K,
        LocalKernels {
            panel: None,
            interleaved: None,
            vec_dot: Some((dot_q4_k::<4>, dot_q4_k::<1>)),
            gemm_x4: Some(dot_q4_k_gemm_x4),
        },
    );
    if !super::avx512_available() {
        return;
    }
    for (t, interleaved) in
        [(GgmlType::Q4_0, Some(dot_q4_0 as interleave::InterleavedDotFn)), (GgmlType::IQ4_NL, None)]
    {
        if let Some(panel) = k.get(t).panel {
            k.set_local(t, LocalKernels { panel: Some(panel), interleaved, vec_dot: None, gemm_x4: None });
        }
    }
}

/// Q4_K against Q8_K in the local order, one float step per `P` pairs of sub-blocks (4: ggml's
/// `gemv`, 1: its `gemm`; `quant::local::vec_dot_q4_k` / `vec_dot_q4_k_gemm` are the scalar twins).
fn dot_q4_k<const P: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    assert_eq!(n % crate::dtype::QK_K, 0, "local Q4_K dot: n = {n} is not a whole number of super-blocks");
    let nb = n / crate::dtype::QK_K;
    let (xs, ys) = (take_blocks::<BlockQ4K>(x, nb), take_blocks::<BlockQ8K>(y, nb));
    // SAFETY: AVX2/FMA/F16C were detected before `install` put this function in the table; the
    // kernel reads only the blocks of the two slices.
    unsafe { q4_k_kernel::<P>(xs, ys) }
}

/// Q4_K against four Q8_K rows in the local `gemm` order (one float step per pair of sub-blocks):
/// each output as [`dot_q4_k`]`::<1>` computes it, the weight nibbles and scales decoded once.
fn dot_q4_k_gemm_x4(n: usize, x: &[u8], y: [&[u8]; 4]) -> [f32; 4] {
    assert_eq!(n % crate::dtype::QK_K, 0, "local Q4_K dot: n = {n} is not a whole number of super-blocks");
    let nb = n / crate::dtype::QK_K;
    let xs = take_blocks::<BlockQ4K>(x, nb);
    let ys = y.map(|r| take_blocks::<BlockQ8K>(r, nb));
    // SAFETY: AVX2/FMA/F16C were detected before `install` put this function in the table; the
    // kernel reads only the blocks of the five slices (each `nb` long).
    unsafe { q4_k_gemm_kernel_x4(xs, ys) }
}

/// `Σ min_j · (bsum_2j + bsum_2j+1)` over the sub-blocks `js` (exact).
fn min_sum(sm: &[(u8, u8); 8], yb: &BlockQ8K, js: std::ops::Range<usize>) -> i32 {
    js.map(|j| {
        let b = i16::from_le_bytes(yb.bsums[2 * j]) as i32 + i16::from_le_bytes(yb.bsums[2 * j + 1]) as i32;
        sm[j].1 as i32 * b
    })
    .sum()
}

/// # Safety
/// AVX2 and FMA must be available; every `ys[c]` holds `xs.len()` blocks.
#[target_feature(enable = "avx2,fma")]
unsafe fn q4_k_gemm_kernel_x4(xs: &[BlockQ4K], ys: [&[BlockQ8K]; 4]) -> [f32; 4] {
    let m4 = _mm256_set1_epi8(0x0F);
    let (mut acc, mut acc_min) = ([0.0f32; 4], [0.0f32; 4]);
    for (ib, xb) in xs.iter().enumerate() {
        let sm = k4_scales(&xb.scales);
        let xd = f16le(xb.d);
        let xdmin = f16le(xb.dmin);
        for p in 0..4 {
            // SAFETY: a 32-byte unaligned load inside the block's 128-byte `qs`.
            let raw = unsafe { _mm256_loadu_si256(xb.qs.as_ptr().add(32 * p) as *const __m256i) };
            let lo = _mm256_and_si256(raw, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
            let (s0, s1) = (_mm256_set1_epi32(sm[2 * p].0 as i32), _mm256_set1_epi32(sm[2 * p + 1].0 as i32));
            for c in 0..4 {
                let yb = &ys[c][ib];
                // SAFETY: 32-byte unaligned loads inside the block's 256-byte `qs`.
                let (y0, y1) = unsafe {
                    (
                        _mm256_loadu_si256(yb.qs.as_ptr().add(64 * p) as *const __m256i),
                        _mm256_loadu_si256(yb.qs.as_ptr().add(64 * p + 32) as *const __m256i),
                    )
                };
                // SAFETY: register arithmetic; AVX2 is enabled here.
                let (p0, p1) = unsafe { (dot_u8i8_epi32(lo, y0), dot_u8i8_epi32(hi, y1)) };
                let iv = _mm256_add_epi32(_mm256_mullo_epi32(p0, s0), _mm256_mullo_epi32(p1, s1));
                // SAFETY: register arithmetic; AVX2 is enabled here.
                let iacc = unsafe { hsum_epi32(iv) };
                let imin = min_sum(&sm, yb, 2 * p..2 * p + 2);
                let da = f32::from_le_bytes(yb.d);
                acc[c] = (iacc as f32).mul_add(xd * da, acc[c]);
                acc_min[c] = (imin as f32).mul_add(xdmin * da, acc_min[c]);
            }
        }
    }
    std::array::from_fn(|c| acc[c] - acc_min[c])
}

/// # Safety
/// AVX2 and FMA must be available.
#[target_feature(enable = "avx2,fma")]
unsafe fn q4_k_kernel<const P: usize>(xs: &[BlockQ4K], ys: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let (mut acc, mut acc_min) = (0.0f32, 0.0f32);
    for (xb, yb) in xs.iter().zip(ys) {
        let sm = k4_scales(&xb.scales);
        let da = f32::from_le_bytes(yb.d);
        for g in 0..4 / P {
            let mut iv = _mm256_setzero_si256();
            for p in g * P..(g + 1) * P {
                // SAFETY: 32-byte unaligned loads inside the blocks' `qs` arrays (128 and 256 bytes).
                let (raw, y0, y1) = unsafe {
                    (
                        _mm256_loadu_si256(xb.qs.as_ptr().add(32 * p) as *const __m256i),
                        _mm256_loadu_si256(yb.qs.as_ptr().add(64 * p) as *const __m256i),
                        _mm256_loadu_si256(yb.qs.as_ptr().add(64 * p + 32) as *const __m256i),
                    )
                };
                let lo = _mm256_and_si256(raw, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
                // Nibble × i8 pairs (at most 2 · 15 · 128 in i16, no saturation), widened exactly.
                // SAFETY: register arithmetic; AVX2 is enabled here.
                let (p0, p1) = unsafe { (dot_u8i8_epi32(lo, y0), dot_u8i8_epi32(hi, y1)) };
                iv = _mm256_add_epi32(iv, _mm256_mullo_epi32(p0, _mm256_set1_epi32(sm[2 * p].0 as i32)));
                iv = _mm256_add_epi32(iv, _mm256_mullo_epi32(p1, _mm256_set1_epi32(sm[2 * p + 1].0 as i32)));
            }
            // SAFETY: register arithmetic; AVX2 is enabled here.
            let iacc = unsafe { hsum_epi32(iv) };
            let imin = min_sum(&sm, yb, 2 * g * P..2 * (g + 1) * P);
            acc = (iacc as f32).mul_add(f16le(xb.d) * da, acc);
            acc_min = (imin as f32).mul_add(f16le(xb.dmin) * da, acc_min);
        }
    }
    acc - acc_min
}

/// Bytes of one prepared activation block (`PreparedQ8`): qs at 0, off at 32, d at 64.
const PBLOCK: usize = 72;

/// The safe entry point: checks every length, then runs the kernel for the number of columns.
fn dot_q4_0(k: usize, group: &[u8], cols: &[&[u8]], out: &mut [f32], ahead: &[u8]) {
    let t = GgmlType::Q4_0;
    check_args_cols(t, k, group, cols, out, LOCAL_MAX_COLS);
    let nb = k / QK;
    let bb = interleave::block_bytes(t);
    let mut res = [0.0f32; LOCAL_MAX_COLS * ROWS];
    // SAFETY: AVX-512 F/BW/VNNI (and FMA/F16C under them) were detected before `install` put this
    // function in the table; `group` holds nb block columns of bb bytes and every column nb
    // prepared blocks (check_args), which is all the kernel reads; `ahead` is only prefetched.
    unsafe {
        let pf = (ahead.as_ptr(), ahead.len().div_ceil(64));
        // Columns past cols.len() repeat the last one (read, never stored).
        let ptrs: [*const u8; LOCAL_MAX_COLS] = std::array::from_fn(|j| cols[j.min(cols.len() - 1)].as_ptr());
        match cols.len() {
            1 => kernel::<1>(nb, bb, group.as_ptr(), ptrs, &mut res, pf),
            2 => kernel::<2>(nb, bb, group.as_ptr(), ptrs, &mut res, pf),
            3 => kernel::<3>(nb, bb, group.as_ptr(), ptrs, &mut res, pf),
            _ => kernel::<4>(nb, bb, group.as_ptr(), ptrs, &mut res, pf),
        }
    }
    out[..cols.len() * ROWS].copy_from_slice(&res[..cols.len() * ROWS]);
}

/// The first `C` columns against the Q4_0 group into `res[c * 16 + r]`, prefetching the `pf.1`
/// cache lines from `pf.0` spread over the block columns.
///
/// # Safety
/// AVX-512 F/BW/VNNI, FMA and F16C must be available; `w` must point to `nb` Q4_0 block columns of
/// `bb` bytes, and each of the first `C` columns to `nb` prepared blocks (`pf` is only a hint:
/// PREFETCHT0 never faults).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c")]
unsafe fn kernel<const C: usize>(
    nb: usize,
    bb: usize,
    w: *const u8,
    cols: [*const u8; LOCAL_MAX_COLS],
    res: &mut [f32; LOCAL_MAX_COLS * ROWS],
    pf: (*const u8, usize),
) {
    let qb = QK / 2 * ROWS;
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..nb {
        for l in b * pf.1 / nb..(b + 1) * pf.1 / nb {
            _mm_prefetch::<_MM_HINT_T0>(pf.0.wrapping_add(l * 64).cast::<i8>());
        }
        // SAFETY: block column b lies inside the group and block b inside every column (the
        // caller's contract); all loads are unaligned loads of bytes inside those ranges.
        unsafe {
            let wb = w.add(b * bb);
            let mut wv = [_mm512_setzero_si512(); 8];
            for c in 0..4 {
                let x = _mm512_loadu_si512(wb.add(c * 64) as *const _);
                wv[c] = _mm512_and_si512(x, low);
                wv[c + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(x), low);
            }
            let dx = _mm512_cvtph_ps(_mm256_loadu_si256(wb.add(qb) as *const _));
            for c in 0..C {
                let y = cols[c].add(b * PBLOCK);
                // The block's offset: the sum of the eight lane offsets (exact in i32).
                let offs = _mm256_loadu_si256(y.add(32) as *const __m256i);
                let o = _mm_add_epi32(_mm256_castsi256_si128(offs), _mm256_extracti128_si256::<1>(offs));
                let o = _mm_add_epi32(o, _mm_unpackhi_epi64(o, o));
                let o = _mm_add_epi32(o, _mm_shuffle_epi32::<1>(o));
                let mut isum = _mm512_broadcastd_epi32(o);
                for (l, v) in wv.iter().enumerate() {
                    let yl = _mm512_set1_epi32((y.add(4 * l) as *const i32).read_unaligned());
                    isum = _mm512_dpbusd_epi32(isum, *v, yl);
                }
                let d = _mm512_mul_ps(dx, _mm512_set1_ps((y.add(64) as *const f32).read_unaligned()));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), d, acc[c]);
            }
        }
    }
    for (c, a) in acc.iter().enumerate() {
        // SAFETY: 16 floats at c * 16 lie inside `res` (C ≤ LOCAL_MAX_COLS).
        unsafe { _mm512_storeu_ps(res.as_mut_ptr().add(c * ROWS), *a) };
    }
}
