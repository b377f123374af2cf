//! AVX-512 VNNI panel product (see `quant::panel` for the layouts and the arithmetic): per
//! sub-block, the `sub / 4` weight groups stay in registers while each column's four-byte groups
//! are broadcast into one `vpdpbusd` each, so one instruction forms four products of 16 rows, and
//! the scale step (`cvt`, `mul`, `fma`) is taken once per 16 outputs per sub-block.
//!
//! Bit-identical to `panel::run_reference`: the integer sums are exact, and the float steps are
//! the same operations in the same order per lane.
//!
//! Like the other x86 modules, the safe wrapper is reachable only through [`install`], which runs
//! only after the features were detected: the invariant behind every `// SAFETY:` comment here.

use std::arch::x86_64::*;

use crate::dtype::GgmlType;
use crate::quant::blocks::{f16le, take_blocks, BlockQ4_0, BlockQ8_0, QK};
use crate::quant::dispatch::Kernels;
use crate::quant::panel::{check_args, PanelFormat, PANEL_COLS, PANEL_ROWS};

/// Installs the panel product for every type with panel packers; does nothing without AVX-512
/// F + VNNI.
pub fn install(k: &mut Kernels) {
    if !super::avx512_available() {
        return;
    }
    use GgmlType::*;
    let types = [
        Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL, MXFP4, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
        IQ1_S, IQ1_M, TQ1_0, TQ2_0,
    ];
    for t in types {
        k.set_panel(t, run);
    }
    k.set_panel_pack_rows(GgmlType::Q4_0, pack_rows_q4_0);
    k.set_panel_pack_col(GgmlType::Q4_0, pack_col_q8_0::<8>);
    k.set_panel_pack_col(GgmlType::Q5_0, pack_col_q8_0::<16>);
    k.set_panel_pack_col(GgmlType::Q8_0, pack_col_q8_0::<128>);
    k.set_panel_pack_col(GgmlType::IQ4_NL, pack_col_q8_0::<128>);
    k.set_panel_pack_col(GgmlType::MXFP4, pack_col_q8_0::<128>);
}

/// Packs a Q8_0 activation row into a column for weights stored as `q + BIAS`, byte for byte as
/// the scalar `panel::pack_col_q8_0` (tested): per block the 32 quants, `off = -BIAS · Σ y` (the
/// sum from `vpsadbw` of the quants plus 128), the scale widened, and a zero min term.
fn pack_col_q8_0<const BIAS: i32>(k: usize, row: &[u8], out: &mut [u8]) {
    let f = PanelFormat { sub: 32, min: false };
    assert_eq!(k % QK, 0, "panel: k = {k} is not a whole number of blocks");
    assert!(out.len() >= f.col_bytes(k), "panel: {} bytes for a column of {k}", out.len());
    let csb = f.col_sub_bytes();
    for (b, blk) in take_blocks::<BlockQ8_0>(row, k / QK).iter().enumerate() {
        // SAFETY: AVX2 was detected before `install` put this function in the table (AVX-512
        // implies it); `blk.qs` is 32 bytes.
        let sum = unsafe { sum_i8x32(&blk.qs) };
        let o = &mut out[b * csb..(b + 1) * csb];
        o[..QK].copy_from_slice(bytemuck::cast_slice(&blk.qs));
        o[QK..QK + 4].copy_from_slice(&(-BIAS * sum).to_le_bytes());
        o[QK + 4..QK + 8].copy_from_slice(&f16le(blk.d).to_le_bytes());
        o[QK + 8..QK + 12].copy_from_slice(&0.0f32.to_le_bytes());
    }
}

/// The sum of 32 bytes read as i8.
///
/// # Safety
/// AVX2 must be available.
#[target_feature(enable = "avx2")]
unsafe fn sum_i8x32(qs: &[i8; QK]) -> i32 {
    // SAFETY: an unaligned load of the 32 bytes of `qs`; register arithmetic.
    unsafe {
        let y = _mm256_loadu_si256(qs.as_ptr() as *const __m256i);
        // Each byte plus 128 as u8, summed in four u64 lanes.
        let s = _mm256_sad_epu8(_mm256_xor_si256(y, _mm256_set1_epi8(i8::MIN)), _mm256_setzero_si256());
        let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let total = _mm_cvtsi128_si64(s) + _mm_extract_epi64::<1>(s);
        total as i32 - 128 * QK as i32
    }
}

/// Packs 16 Q4_0 rows into a panel, byte for byte as the scalar `panel::pack_rows_q4_0` (tested):
/// per block, the 16 rows' `qs` are transposed as 4 × 16 dwords in registers (dword `c` of a row
/// holds the nibbles of elements `4c..4c + 4` and `16 + 4c..`), split into low and high nibbles,
/// and the scales are widened with `vcvtph2ps`.
fn pack_rows_q4_0(k: usize, rows: &[&[u8]; PANEL_ROWS], out: &mut [u8]) {
    let f = PanelFormat { sub: 32, min: false };
    assert_eq!(k % QK, 0, "panel: k = {k} is not a whole number of blocks");
    assert!(out.len() >= f.panel_bytes(k), "panel: {} bytes for k = {k}", out.len());
    let nb = k / QK;
    let blocks: [&[BlockQ4_0]; PANEL_ROWS] = std::array::from_fn(|r| take_blocks::<BlockQ4_0>(rows[r], nb));
    // SAFETY: AVX-512 F/BW and F16C were detected before `install` put this function in the
    // table; every row holds nb blocks (take_blocks) and `out` nb sub-blocks (asserted above).
    unsafe { pack_q4_0(nb, &blocks, out) }
}

/// # Safety
/// AVX-512 F/BW and F16C must be available; every row of `blocks` must hold `nb` blocks and `out`
/// `nb` legacy sub-blocks (576 bytes each).
#[target_feature(enable = "avx512f,avx512bw,f16c")]
unsafe fn pack_q4_0(nb: usize, blocks: &[&[BlockQ4_0]; PANEL_ROWS], out: &mut [u8]) {
    let rsb = PanelFormat { sub: 32, min: false }.row_sub_bytes();
    let low = _mm512_set1_epi8(0x0F);
    // Stage 1, on the registers of rows 0..4 (a) and 4..8 (b) (or 8..12 and 12..16), each row a
    // 128-bit lane of dwords c = 0..4: position 8c' + r' takes dword c of row r' (c = c' for
    // `first`, c = 2 + c' for `second`).
    let stage1 = |c0: i32| {
        let idx: [i32; 16] = std::array::from_fn(|p| {
            let (c, r) = (c0 + p as i32 / 8, p as i32 % 8);
            if r < 4 {
                4 * r + c
            } else {
                16 + 4 * (r - 4) + c
            }
        });
        idx
    };
    // Stage 2, on the stage-1 results of rows 0..8 (a) and 8..16 (b): dword c' of all 16 rows.
    let stage2 = |c: i32| -> [i32; 16] {
        std::array::from_fn(|r| if r < 8 { 8 * c + r as i32 } else { 16 + 8 * c + r as i32 - 8 })
    };
    // SAFETY: register arithmetic and loads of arrays on the stack.
    let (first, second, pick0, pick1) = unsafe {
        let load = |v: [i32; 16]| _mm512_loadu_si512(v.as_ptr() as *const _);
        (load(stage1(0)), load(stage1(2)), load(stage2(0)), load(stage2(1)))
    };
    for b in 0..nb {
        // SAFETY: block b of every row exists (the caller's contract); sub-block b of `out` spans
        // bytes b * rsb .. (b + 1) * rsb, inside `out`; all loads and stores are unaligned.
        unsafe {
            let q = |r: usize| _mm_loadu_si128(blocks[r][b].qs.as_ptr() as *const __m128i);
            let rows4 = |r: usize| {
                let v = _mm512_castsi128_si512(q(r));
                let v = _mm512_inserti32x4::<1>(v, q(r + 1));
                let v = _mm512_inserti32x4::<2>(v, q(r + 2));
                _mm512_inserti32x4::<3>(v, q(r + 3))
            };
            let (z0, z1, z2, z3) = (rows4(0), rows4(4), rows4(8), rows4(12));
            let a01 = _mm512_permutex2var_epi32(z0, first, z1);
            let b01 = _mm512_permutex2var_epi32(z0, second, z1);
            let a23 = _mm512_permutex2var_epi32(z2, first, z3);
            let b23 = _mm512_permutex2var_epi32(z2, second, z3);
            let dwords = [
                _mm512_permutex2var_epi32(a01, pick0, a23),
                _mm512_permutex2var_epi32(a01, pick1, a23),
                _mm512_permutex2var_epi32(b01, pick0, b23),
                _mm512_permutex2var_epi32(b01, pick1, b23),
            ];
            let o = out.as_mut_ptr().add(b * rsb);
            for (c, v) in dwords.into_iter().enumerate() {
                _mm512_storeu_si512(o.add(c * 64) as *mut _, _mm512_and_si512(v, low));
                _mm512_storeu_si512(
                    o.add((c + 4) * 64) as *mut _,
                    _mm512_and_si512(_mm512_srli_epi16::<4>(v), low),
                );
            }
            let d: [u16; PANEL_ROWS] = std::array::from_fn(|r| u16::from_le_bytes(blocks[r][b].d));
            let sx = _mm512_cvtph_ps(_mm256_loadu_si256(d.as_ptr() as *const __m256i));
            _mm512_storeu_ps(o.add(32 * PANEL_ROWS) as *mut f32, sx);
        }
    }
}

/// The safe entry point: checks every length, then runs the kernel for the format and the
/// number of columns (a partial set of columns repeats its last one; the extra results are
/// dropped).
fn run(f: PanelFormat, k: usize, panel: &[u8], cols: &[&[u8]], out: &mut [f32]) {
    check_args(f, k, panel, cols, out);
    let n = cols.len();
    let mut padded = [cols[n - 1]; PANEL_COLS];
    padded[..n].copy_from_slice(cols);
    let nsub = k / f.sub;
    let mut res = [0.0f32; PANEL_COLS * PANEL_ROWS];
    // SAFETY: AVX-512 F/VNNI were detected before `install` put this function in the table; the
    // panel holds nsub sub-blocks of the format and every column nsub column sub-blocks
    // (check_args), which is all the kernels read.
    unsafe {
        match (f.sub, f.min, n) {
            (32, false, 1..=4) => kernel::<32, false, 4>(nsub, panel, &padded, &mut res),
            (32, false, _) => kernel::<32, false, 8>(nsub, panel, &padded, &mut res),
            (32, true, 1..=4) => kernel::<32, true, 4>(nsub, panel, &padded, &mut res),
            (32, true, _) => kernel::<32, true, 8>(nsub, panel, &padded, &mut res),
            (16, false, 1..=4) => kernel::<16, false, 4>(nsub, panel, &padded, &mut res),
            (16, false, _) => kernel::<16, false, 8>(nsub, panel, &padded, &mut res),
            (16, true, 1..=4) => kernel::<16, true, 4>(nsub, panel, &padded, &mut res),
            (16, true, _) => kernel::<16, true, 8>(nsub, panel, &padded, &mut res),
            _ => unreachable!("panel sub-blocks are 16 or 32 elements"),
        }
    }
    out[..n * PANEL_ROWS].copy_from_slice(&res[..n * PANEL_ROWS]);
}

/// The first `C` columns against the panel into `res[c * 16 + r]`.
///
/// # Safety
/// AVX-512 F and VNNI must be available; `panel` must hold `nsub` weight sub-blocks of format
/// (`SUB`, `MIN`) and each of the first `C` columns `nsub` column sub-blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
unsafe fn kernel<const SUB: usize, const MIN: bool, const C: usize>(
    nsub: usize,
    panel: &[u8],
    cols: &[&[u8]; PANEL_COLS],
    res: &mut [f32; PANEL_COLS * PANEL_ROWS],
) {
    let f = PanelFormat { sub: SUB, min: MIN };
    let (rsb, csb) = (f.row_sub_bytes(), f.col_sub_bytes());
    let groups = SUB / 4;
    let mut acc = [_mm512_setzero_ps(); C];
    let wp = panel.as_ptr();
    let cp: [*const u8; C] = std::array::from_fn(|c| cols[c].as_ptr());
    for s in 0..nsub {
        // SAFETY: sub-block s lies inside the panel and every column (the caller's contract);
        // all loads are unaligned loads of bytes inside those ranges.
        unsafe {
            let w = wp.add(s * rsb);
            let mut wv = [_mm512_setzero_si512(); 8];
            for (g, v) in wv.iter_mut().enumerate().take(groups) {
                *v = _mm512_loadu_si512(w.add(g * 64) as *const _);
            }
            let sx = _mm512_loadu_ps(w.add(SUB * PANEL_ROWS) as *const f32);
            let mx = if MIN { _mm512_loadu_ps(w.add(SUB * PANEL_ROWS + 64) as *const f32) } else { sx };
            for c in 0..C {
                let y = cp[c].add(s * csb);
                let mut isum = _mm512_set1_epi32((y.add(SUB) as *const i32).read_unaligned());
                for (g, v) in wv.iter().enumerate().take(groups) {
                    let yb = _mm512_set1_epi32((y.add(4 * g) as *const i32).read_unaligned());
                    isum = _mm512_dpbusd_epi32(isum, *v, yb);
                }
                let sy = _mm512_set1_ps((y.add(SUB + 4) as *const f32).read_unaligned());
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(sx, sy), acc[c]);
                if MIN {
                    let ty = _mm512_set1_ps((y.add(SUB + 8) as *const f32).read_unaligned());
                    acc[c] = _mm512_fmadd_ps(mx, ty, acc[c]);
                }
            }
        }
    }
    for (c, a) in acc.iter().enumerate() {
        // SAFETY: 16 floats at c * 16 lie inside `res` (C ≤ PANEL_COLS).
        unsafe { _mm512_storeu_ps(res.as_mut_ptr().add(c * PANEL_ROWS), *a) };
    }
}
