//! AVX-512 VNNI product of interleaved weights with prepared activation rows (see
//! `quant::interleave` for the layout and the arithmetic): per block column, the eight four-element
//! weight groups of 16 rows sit in eight registers, and each activation group is broadcast into one
//! `vpdpbusd` that starts from the broadcast lane offset, so one instruction forms one lane's exact
//! integer sum for 16 rows. The eight lane accumulators per column are kept apart and added at the
//! end in `hsum_ps`'s order, so every output equals the row's one-column `vec_dot` bit for bit.
//!
//! Like the other x86 modules, the safe wrapper is reachable only through [`install`], which runs
//! only after the features were detected: the invariant behind every `// SAFETY:` comment here.

use std::arch::x86_64::*;

use crate::dtype::GgmlType;
use crate::quant::blocks::QK;
use crate::quant::dispatch::Kernels;
use crate::quant::interleave::{self, check_args, MAX_COLS, ROWS};

/// Installs the interleaved products; does nothing without AVX-512 F/BW/VNNI.
pub fn install(k: &mut Kernels) {
    if !super::avx512_available() {
        return;
    }
    k.set_interleaved_dot(GgmlType::Q4_0, dot_q4_0);
    k.set_interleaved_dot(GgmlType::Q4_1, dot_q4_1);
    k.set_interleaved_dot(GgmlType::Q5_0, dot_q5_0);
    k.set_interleaved_dot(GgmlType::Q8_0, dot_q8_0);
}

/// Weight formats of the kernel.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;
const Q5_0: u8 = 3;

/// Bytes of one prepared activation block (`PreparedQ8`): qs at 0, off at 32, d at 64, s at 68.
const PBLOCK: usize = 72;

fn dot_q4_0(k: usize, group: &[u8], cols: &[&[u8]], out: &mut [f32], ahead: &[u8]) {
    run::<Q4_0>(GgmlType::Q4_0, k, group, cols, out, ahead);
}

fn dot_q4_1(k: usize, group: &[u8], cols: &[&[u8]], out: &mut [f32], ahead: &[u8]) {
    run::<Q4_1>(GgmlType::Q4_1, k, group, cols, out, ahead);
}

fn dot_q5_0(k: usize, group: &[u8], cols: &[&[u8]], out: &mut [f32], ahead: &[u8]) {
    run::<Q5_0>(GgmlType::Q5_0, k, group, cols, out, ahead);
}

fn dot_q8_0(k: usize, group: &[u8], cols: &[&[u8]], out: &mut [f32], ahead: &[u8]) {
    run::<Q8_0>(GgmlType::Q8_0, k, group, cols, out, ahead);
}

/// The safe entry point: checks every length, then runs the kernel for the number of columns.
fn run<const T: u8>(t: GgmlType, k: usize, group: &[u8], cols: &[&[u8]], out: &mut [f32], ahead: &[u8]) {
    check_args(t, k, group, cols, out);
    let nb = k / QK;
    let bb = interleave::block_bytes(t);
    let mut res = [0.0f32; MAX_COLS * ROWS];
    // SAFETY: AVX-512 F/BW/VNNI (and AVX2/FMA/F16C under them) were detected before `install` put
    // this function in the table; `group` holds nb block columns of bb bytes and every column nb
    // prepared blocks (check_args), which is all the kernel reads; `ahead` is only prefetched.
    unsafe {
        let pf = (ahead.as_ptr(), ahead.len().div_ceil(64));
        match cols.len() {
            1 => kernel::<T, 1>(nb, bb, group.as_ptr(), [cols[0].as_ptr(); 2], &mut res, pf),
            _ => kernel::<T, 2>(nb, bb, group.as_ptr(), [cols[0].as_ptr(), cols[1].as_ptr()], &mut res, pf),
        }
    }
    out[..cols.len() * ROWS].copy_from_slice(&res[..cols.len() * ROWS]);
}

/// The first `C` columns against the group into `res[c * 16 + r]`, prefetching the `pf.1` cache
/// lines from `pf.0` spread over the block columns.
///
/// # Safety
/// AVX-512 F/BW/VNNI, FMA and F16C must be available; `w` must point to `nb` block columns of
/// `bb` bytes of format `T`, and each of the first `C` columns to `nb` prepared blocks (`pf` is
/// only a hint: PREFETCHT0 never faults).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c")]
unsafe fn kernel<const T: u8, const C: usize>(
    nb: usize,
    bb: usize,
    w: *const u8,
    cols: [*const u8; MAX_COLS],
    res: &mut [f32; MAX_COLS * ROWS],
    pf: (*const u8, usize),
) {
    let qb = match T {
        Q8_0 => QK * ROWS,
        Q5_0 => QK / 2 * ROWS + 64,
        _ => QK / 2 * ROWS,
    };
    let high = _mm512_set1_epi8(0x10);
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [[_mm512_setzero_ps(); 8]; C];
    let mut ms = [_mm512_setzero_ps(); C];
    for b in 0..nb {
        for l in b * pf.1 / nb..(b + 1) * pf.1 / nb {
            _mm_prefetch::<_MM_HINT_T0>(pf.0.wrapping_add(l * 64).cast::<i8>());
        }
        // SAFETY: block column b lies inside the group and block b inside every column (the
        // caller's contract); all loads are unaligned loads of bytes inside those ranges.
        unsafe {
            let wb = w.add(b * bb);
            let mut wv = [_mm512_setzero_si512(); 8];
            if T == Q8_0 {
                for (g, v) in wv.iter_mut().enumerate() {
                    *v = _mm512_loadu_si512(wb.add(g * 64) as *const _);
                }
            } else {
                for c in 0..4 {
                    let x = _mm512_loadu_si512(wb.add(c * 64) as *const _);
                    wv[c] = _mm512_and_si512(x, low);
                    wv[c + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(x), low);
                }
                if T == Q5_0 {
                    // Group l's fifth bits: 0x10 in the bytes whose mask bit is set.
                    for (l, v) in wv.iter_mut().enumerate() {
                        let m = (wb.add(QK / 2 * ROWS + 8 * l) as *const u64).read_unaligned();
                        *v = _mm512_or_si512(*v, _mm512_maskz_mov_epi8(m, high));
                    }
                }
            }
            let dx = _mm512_cvtph_ps(_mm256_loadu_si256(wb.add(qb) as *const _));
            let mx =
                if T == Q4_1 { _mm512_cvtph_ps(_mm256_loadu_si256(wb.add(qb + 32) as *const _)) } else { dx };
            for c in 0..C {
                let y = cols[c].add(b * PBLOCK);
                let d = _mm512_mul_ps(dx, _mm512_set1_ps((y.add(64) as *const f32).read_unaligned()));
                for (l, v) in wv.iter().enumerate() {
                    let off = _mm512_set1_epi32((y.add(32 + 4 * l) as *const i32).read_unaligned());
                    let yl = _mm512_set1_epi32((y.add(4 * l) as *const i32).read_unaligned());
                    let isum = _mm512_dpbusd_epi32(off, *v, yl);
                    acc[c][l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum), acc[c][l]);
                }
                if T == Q4_1 {
                    let s = _mm512_set1_ps((y.add(68) as *const f32).read_unaligned());
                    ms[c] = _mm512_add_ps(ms[c], _mm512_mul_ps(mx, s));
                }
            }
        }
    }
    for c in 0..C {
        let a = &acc[c];
        // hsum_ps's order: (a0 + a4, ..., a3 + a7), then (s0 + s2) + (s1 + s3).
        let s: [__m512; 4] = std::array::from_fn(|i| _mm512_add_ps(a[i], a[i + 4]));
        let mut v = _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]));
        if T == Q4_1 {
            v = _mm512_add_ps(v, ms[c]);
        }
        // SAFETY: 16 floats at c * 16 lie inside `res` (C ≤ MAX_COLS).
        unsafe { _mm512_storeu_ps(res.as_mut_ptr().add(c * ROWS), v) };
    }
}
