//! llama.cpp's local (repacked) order on AVX-512 VNNI (see `quant::local`): the packed panels of
//! Q4_0, IQ4_NL and MXFP4, whose order is that one, kept for in-process runs under every profile, and the
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

/// Installs the local-order kernels: Q4_K's dot on AVX2 (its four-row form with AVX-512 VNNI),
/// and with AVX-512 F/BW/VNNI those of Q4_0, IQ4_NL and MXFP4 from the panels `panel::install` put in `k`
/// (call it after that).
pub fn install(k: &mut Kernels) {
    if !super::avx2_available() {
        return;
    }
    let avx512 = super::avx512_available();
    k.set_local(
        GgmlType::Q4_K,
        LocalKernels {
            panel: None,
            interleaved: None,
            vec_dot: Some((dot_q4_k::<4>, dot_q4_k::<1>)),
            // Without it the one-row `gemm` dot serves every row (the same bits).
            gemm_x4: avx512.then_some(dot_q4_k_gemm_x4 as crate::quant::VecDotX4Fn),
        },
    );
    if !avx512 {
        return;
    }
    for (t, interleaved) in [
        (GgmlType::Q4_0, Some(dot_q4_0 as interleave::InterleavedDotFn)),
        (GgmlType::IQ4_NL, None),
        (GgmlType::MXFP4, None),
    ] {
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
    // SAFETY: AVX-512 F/BW/VNNI (with AVX2/FMA/F16C) were detected before `install` put this
    // function in the table; the kernel reads only the blocks of the five slices (each `nb` long).
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
/// AVX-512 F/BW/VNNI, AVX2 and FMA must be available; every `ys[c]` holds `xs.len()` blocks.
///
/// Per pair of sub-blocks, the 64 nibbles of the weight row (low nibbles: sub-block `2p`, high:
/// `2p + 1`) form one register that serves the four columns: one `vpdpbusd` against the column's
/// 64 activation bytes gives 16 lanes of exact four-product sums (8 per sub-block), one `vpmulld`
/// applies the two sub-blocks' scales, and a transposing reduction of the four columns' registers
/// gives their exact `iacc` in one vector. The float steps are then each column's scalar steps of
/// ggml's `gemm` (`fma(f32(iacc), d·d_y, acc)`, then the min term's), lane for lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
unsafe fn q4_k_gemm_kernel_x4(xs: &[BlockQ4K], ys: [&[BlockQ8K]; 4]) -> [f32; 4] {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm_setzero_ps();
    let mut acc_min = _mm_setzero_ps();
    for (ib, xb) in xs.iter().enumerate() {
        let sm = k4_scales(&xb.scales);
        let da = _mm_setr_ps(
            f32::from_le_bytes(ys[0][ib].d),
            f32::from_le_bytes(ys[1][ib].d),
            f32::from_le_bytes(ys[2][ib].d),
            f32::from_le_bytes(ys[3][ib].d),
        );
        // The products `d·d_y` and `dmin·d_y` as the scalar code rounds them, per column.
        let dd = _mm_mul_ps(_mm_set1_ps(f16le(xb.d)), da);
        let ddmin = _mm_mul_ps(_mm_set1_ps(f16le(xb.dmin)), da);
        // The min terms of the four pairs for the four columns, exact: per column the eight
        // sub-blocks' `min_j · (bsum_2j + bsum_2j+1)`, summed by pairs and transposed so that
        // `imins[p]` holds pair p of every column (`min_sum`'s value).
        let mins: [i32; 8] = std::array::from_fn(|j| sm[j].1 as i32);
        // SAFETY: 32-byte unaligned loads of `mins` and of each column block's 32-byte `bsums`;
        // register arithmetic.
        let imins = unsafe {
            let mv = _mm256_loadu_si256(mins.as_ptr() as *const __m256i);
            let m: [__m256i; 4] = std::array::from_fn(|c| {
                let bs = _mm256_loadu_si256(ys[c][ib].bsums.as_ptr() as *const __m256i);
                _mm256_mullo_epi32(_mm256_madd_epi16(bs, _mm256_set1_epi16(1)), mv)
            });
            // Lanes [a0 a1 b0 b1 | a2 a3 b2 b3] (column a = 0, b = 1; pairs 0..4), and so for c, d.
            let (h01, h23) = (_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]));
            let (f01, f23) = (_mm256_castsi256_ps(h01), _mm256_castsi256_ps(h23));
            let even = _mm256_castps_si256(_mm256_shuffle_ps::<0b10_00_10_00>(f01, f23));
            let odd = _mm256_castps_si256(_mm256_shuffle_ps::<0b11_01_11_01>(f01, f23));
            [
                _mm256_castsi256_si128(even),
                _mm256_castsi256_si128(odd),
                _mm256_extracti128_si256::<1>(even),
                _mm256_extracti128_si256::<1>(odd),
            ]
        };
        for (p, &imin) in imins.iter().enumerate() {
            // SAFETY: a 32-byte unaligned load inside the block's 128-byte `qs`; register arithmetic.
            let w = unsafe {
                let raw = _mm256_loadu_si256(xb.qs.as_ptr().add(32 * p) as *const __m256i);
                let lo = _mm256_and_si256(raw, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
            };
            let sv = _mm512_inserti64x4::<1>(
                _mm512_set1_epi32(sm[2 * p].0 as i32),
                _mm256_set1_epi32(sm[2 * p + 1].0 as i32),
            );
            // SAFETY: 64-byte unaligned loads inside each column block's 256-byte `qs`.
            let r: [__m256i; 4] = std::array::from_fn(|c| unsafe {
                let y = _mm512_loadu_si512(ys[c][ib].qs.as_ptr().add(64 * p) as *const _);
                let v = _mm512_mullo_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w, y), sv);
                _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
            });
            // [Σr0, Σr1, Σr2, Σr3]: exact i32 sums, in any order.
            let h = _mm256_hadd_epi32(_mm256_hadd_epi32(r[0], r[1]), _mm256_hadd_epi32(r[2], r[3]));
            let iacc = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            acc = _mm_fmadd_ps(_mm_cvtepi32_ps(iacc), dd, acc);
            acc_min = _mm_fmadd_ps(_mm_cvtepi32_ps(imin), ddmin, acc_min);
        }
    }
    let mut out = [0.0f32; 4];
    // SAFETY: a 16-byte unaligned store into `out`.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), _mm_sub_ps(acc, acc_min)) };
    out
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
