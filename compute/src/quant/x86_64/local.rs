//! llama.cpp's local (repacked) order on AVX-512 VNNI (see `quant::local`): the packed panels of
//! Q4_0 and IQ4_NL, whose order is that one, kept for in-process runs under every profile, and the
//! interleaved Q4_0 product for generation in that order: per block column, the eight four-element
//! weight groups of 16 rows are multiplied into ONE integer accumulator that starts from the
//! block's total activation offset, so it holds the block's exact sum for 16 rows, then one
//! `fma(f32(isum), d_w · d_y, acc)` per block.
//!
//! Like the other x86 modules, the safe wrapper is reachable only through [`install`], which runs
//! only after the features were detected: the invariant behind every `// SAFETY:` comment here.

use std::arch::x86_64::*;

use crate::dtype::GgmlType;
use crate::quant::blocks::QK;
use crate::quant::dispatch::Kernels;
use crate::quant::interleave::{self, check_args, MAX_COLS, ROWS};
use crate::quant::local::LocalKernels;

/// Installs the local-order kernels of Q4_0 and IQ4_NL from the panels `panel::install` put in
/// `k` (call it after that); does nothing without AVX-512 F/BW/VNNI.
pub fn install(k: &mut Kernels) {
    if !super::avx512_available() {
        return;
    }
    for (t, interleaved) in
        [(GgmlType::Q4_0, Some(dot_q4_0 as interleave::InterleavedDotFn)), (GgmlType::IQ4_NL, None)]
    {
        if let Some(panel) = k.get(t).panel {
            k.set_local(t, LocalKernels { panel, interleaved });
        }
    }
}

/// Bytes of one prepared activation block (`PreparedQ8`): qs at 0, off at 32, d at 64.
const PBLOCK: usize = 72;

/// The safe entry point: checks every length, then runs the kernel for the number of columns.
fn dot_q4_0(k: usize, group: &[u8], cols: &[&[u8]], out: &mut [f32], ahead: &[u8]) {
    let t = GgmlType::Q4_0;
    check_args(t, k, group, cols, out);
    let nb = k / QK;
    let bb = interleave::block_bytes(t);
    let mut res = [0.0f32; MAX_COLS * ROWS];
    // SAFETY: AVX-512 F/BW/VNNI (and FMA/F16C under them) were detected before `install` put this
    // function in the table; `group` holds nb block columns of bb bytes and every column nb
    // prepared blocks (check_args), which is all the kernel reads; `ahead` is only prefetched.
    unsafe {
        let pf = (ahead.as_ptr(), ahead.len().div_ceil(64));
        match cols.len() {
            1 => kernel::<1>(nb, bb, group.as_ptr(), [cols[0].as_ptr(); 2], &mut res, pf),
            _ => kernel::<2>(nb, bb, group.as_ptr(), [cols[0].as_ptr(), cols[1].as_ptr()], &mut res, pf),
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
    cols: [*const u8; MAX_COLS],
    res: &mut [f32; MAX_COLS * ROWS],
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
        // SAFETY: 16 floats at c * 16 lie inside `res` (C ≤ MAX_COLS).
        unsafe { _mm512_storeu_ps(res.as_mut_ptr().add(c * ROWS), *a) };
    }
}
