//! 512-bit register tiles for prompt processing of Q4_0, Q5_0 and Q8_0 weights × Q8_0 activations
//! (AVX-512 F/BW/VL/VNNI), in the per-output order of ggml's AVX2 `vec_dot` and of llamafile's
//! tinyBLAS (the two agree for these formats, with AVX-512 or not): one 8-lane f32 accumulator per
//! output, `fma(d_x·d_y, lanes, acc)` block after block with `lanes` the exact i32 sums of four
//! byte products each, then `hsum_ps`. ref: ggml-compute-semantics.md §2.2, §2.3.
//!
//! The 256-bit tiles of `gemm.rs` spend four 256-bit instructions per output and block (`vpdpbusd`,
//! the int → float conversion, the scale product, the `fma`), and AVX-512 machines issue those on
//! two ports at either width. Here one 512-bit register holds the 8-lane accumulators of two outputs
//! (two weight rows, one activation row: low half row `2p`, high half row `2p + 1`), so each
//! instruction serves two outputs. Per block:
//!
//! - the two weight rows' codes form one register of unsigned bytes `u = q + k` (Q4_0: the nibbles,
//!   `k = 8`; Q5_0: nibble | high bit, `k = 16`; Q8_0: `q xor 0x80`, `k = 128`), so
//!   `Σ (u - k)·y = vpdpbusd(-k·Σy, u, y)` lane for lane, exactly (no i32 overflow: |Σ| < 2^17);
//! - the activation block is broadcast to both halves; its `-k·Σy` lanes and its scale (f32) are
//!   prepared once per call for every column, and the two rows' scales once per call as
//!   `[d_x0 ×8 | d_x1 ×8]`, so the scale product `d_x·d_y` is one multiply per register.
//!
//! Every output's floating-point sequence is the 256-bit tiles' (the same f32 scale product, the
//! same `fma` chain over the same exact lanes, the same `hsum_ps`), so the results are bit for bit
//! those of `vec_dot` (and of ggml's AVX2 and native AVX-512 builds); [`ref_gemm`] restates the order
//! in scalar code and the tests hold the tiles to it and to `vec_dot`.
//!
//! As in the other x86 modules, the safe entry points are reachable only through [`install`], which
//! runs only after the features were detected: the invariant behind every `// SAFETY:` comment.

use std::arch::x86_64::*;
use std::cell::Cell;

use super::avx2::util::hsum_ps;
use crate::dtype::GgmlType;
use crate::quant::blocks::{take_blocks, BlockQ4_0, BlockQ5_0, BlockQ8_0, QK};
use crate::quant::dispatch::Kernels;
use crate::quant::prepared::PreparedQ8;

/// Installs the 512-bit tiles into `k`; does nothing without AVX-512 F/BW/VL/VNNI.
pub fn install(k: &mut Kernels) {
    if !super::avx512_available() {
        return;
    }
    k.set_gemm(GgmlType::Q4_0, gemm_q4_0_q8_0);
    k.set_gemm(GgmlType::Q5_0, gemm_q5_0_q8_0);
    k.set_gemm(GgmlType::Q8_0, gemm_q8_0_q8_0);
    k.set_gemm_prepared(GgmlType::Q4_0, Q4_0::K as i32, gemm_q4_0_prepared);
    k.set_gemm_prepared(GgmlType::Q5_0, Q5_0::K as i32, gemm_q5_0_prepared);
    k.set_gemm_prepared(GgmlType::Q8_0, Q8_0::K as i32, gemm_q8_0_prepared);
}

/// Q4_0 weights × Q8_0 activations (see the module docs); `out[j * x.len() + i]` = row `i` · column `j`.
pub(super) fn gemm_q4_0_q8_0(n: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    drive::<Q4_0>(n, x, y, out);
}

/// Q5_0 weights × Q8_0 activations (see [`gemm_q4_0_q8_0`]).
pub(super) fn gemm_q5_0_q8_0(n: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    drive::<Q5_0>(n, x, y, out);
}

/// Q8_0 weights × Q8_0 activations (see [`gemm_q4_0_q8_0`]).
pub(super) fn gemm_q8_0_q8_0(n: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    drive::<Q8_0>(n, x, y, out);
}

/// Q4_0 weights × prepared Q8_0 rows ([`crate::quant::prepared`], bias 8): the same outputs as
/// [`gemm_q4_0_q8_0`] on the rows they were prepared from, bit for bit (see [`drive_prepared`]).
pub(super) fn gemm_q4_0_prepared(n: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    drive_prepared::<Q4_0>(n, x, y, out);
}

/// Q5_0 weights × prepared Q8_0 rows (bias 16), as [`gemm_q4_0_prepared`].
pub(super) fn gemm_q5_0_prepared(n: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    drive_prepared::<Q5_0>(n, x, y, out);
}

/// Q8_0 weights × prepared Q8_0 rows (bias 128), as [`gemm_q4_0_prepared`].
pub(super) fn gemm_q8_0_prepared(n: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    drive_prepared::<Q8_0>(n, x, y, out);
}

/// A weight format of the tiles: its block, its code offset and the unpacking of two rows' blocks.
trait Weights {
    type X: bytemuck::Pod;
    /// `k`: the unsigned codes are `q + k`.
    const K: u8;
    /// The f16 scale of a block (little-endian bytes).
    fn d(b: &Self::X) -> [u8; 2];
    /// The unsigned codes `q + k` of block `a` (bytes 0..32) and block `b` (bytes 32..64).
    unsafe fn codes(a: &Self::X, b: &Self::X) -> __m512i;
}

/// Two 16-byte nibble arrays as `[a & 15, a >> 4, b & 15, b >> 4]` (16 bytes each).
#[inline(always)]
unsafe fn nibbles2(a: &[u8; 16], b: &[u8; 16]) -> __m512i {
    // SAFETY: 16-byte reads from 16-byte arrays; register arithmetic under the callers' AVX-512 F/BW.
    unsafe {
        let t = _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(a.as_ptr().cast())),
            _mm_loadu_si128(b.as_ptr().cast()),
        );
        let h = _mm256_srli_epi16::<4>(t);
        // Quadwords [t0, t1, h0, h1, t2, t3, h2, h3].
        let idx = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
        let v = _mm512_permutex2var_epi64(_mm512_castsi256_si512(t), idx, _mm512_castsi256_si512(h));
        _mm512_and_si512(v, _mm512_set1_epi8(0x0F))
    }
}

struct Q4_0;
impl Weights for Q4_0 {
    type X = BlockQ4_0;
    const K: u8 = 8;
    fn d(b: &BlockQ4_0) -> [u8; 2] {
        b.d
    }
    #[inline(always)]
    unsafe fn codes(a: &BlockQ4_0, b: &BlockQ4_0) -> __m512i {
        // SAFETY: forwarded (whole fields).
        unsafe { nibbles2(&a.qs, &b.qs) }
    }
}

struct Q5_0;
impl Weights for Q5_0 {
    type X = BlockQ5_0;
    const K: u8 = 16;
    fn d(b: &BlockQ5_0) -> [u8; 2] {
        b.d
    }
    #[inline(always)]
    unsafe fn codes(a: &BlockQ5_0, b: &BlockQ5_0) -> __m512i {
        // SAFETY: as Q4_0. Bit j of qh is the fifth bit of element j, at byte j of its row's half.
        unsafe {
            let v = nibbles2(&a.qs, &b.qs);
            let hi = u32::from_le_bytes(a.qh) as u64 | (u32::from_le_bytes(b.qh) as u64) << 32;
            _mm512_mask_add_epi8(v, hi, v, _mm512_set1_epi8(0x10))
        }
    }
}

struct Q8_0;
impl Weights for Q8_0 {
    type X = BlockQ8_0;
    const K: u8 = 128;
    fn d(b: &BlockQ8_0) -> [u8; 2] {
        b.d
    }
    #[inline(always)]
    unsafe fn codes(a: &BlockQ8_0, b: &BlockQ8_0) -> __m512i {
        // SAFETY: 32-byte reads of whole fields; xor 0x80 is + 128 for every i8 value.
        unsafe {
            let lo = _mm256_loadu_si256(a.qs.as_ptr().cast());
            let hi = _mm256_loadu_si256(b.qs.as_ptr().cast());
            let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            _mm512_xor_si512(v, _mm512_set1_epi8(-128))
        }
    }
}

/// Converts `src`'s f16 values (little-endian bytes) to f32 into `dst` (exact), 16 at a time.
/// The 16 values are packed four to a 64-bit register and moved into a vector from there: stored
/// one by one into memory, the 256-bit load after them waited for the stores to complete.
#[inline(always)]
unsafe fn f16s(mut src: impl Iterator<Item = [u8; 2]>, dst: &mut [f32]) {
    for out in dst.chunks_mut(16) {
        let mut q = [0u64; 4];
        for (i, q) in q.iter_mut().enumerate() {
            for j in 0..4 {
                if 4 * i + j < out.len() {
                    *q |= (src.next().map_or(0, u16::from_le_bytes) as u64) << (16 * j);
                }
            }
        }
        // SAFETY: register arithmetic under the callers' AVX-512F (and F16C); a 64-byte write to
        // `f`.
        unsafe {
            let h = _mm256_set_epi64x(q[3] as i64, q[2] as i64, q[1] as i64, q[0] as i64);
            let f = _mm512_cvtph_ps(h);
            if out.len() == 16 {
                _mm512_storeu_ps(out.as_mut_ptr(), f);
            } else {
                let mut v = [0.0f32; 16];
                _mm512_storeu_ps(v.as_mut_ptr(), f);
                out.copy_from_slice(&v[..out.len()]);
            }
        }
    }
}

/// Per-call scratch, kept per thread (taken out of the cell while in use, so never borrowed twice).
#[derive(Default)]
struct Scratch {
    /// Per column and block (`j·nb + b`): `-k·Σ_{4 bytes} y` per lane.
    init: Vec<[i32; 8]>,
    /// Per column and block: `d_y`.
    dy: Vec<f32>,
    /// Per group of 16 weight rows and block (`g·nb + b`): the 16 rows' `d_x`.
    dx: Vec<f32>,
}

thread_local! {
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

/// Activation rows per tile.
const C: usize = 8;
/// Pairs of weight rows per tile.
const P: usize = 2;
/// Weight rows per group of prepared scales.
const G: usize = 16;

/// Checks the shapes, prepares the scales and offsets, and covers the outputs with tiles of
/// `2·P` rows × `C` columns (`C / 2` for the last columns when few are left); a partial tile
/// repeats its last row or column (the extra results are dropped).
fn drive<W: Weights>(n: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    assert_eq!(n % QK, 0, "gemm: n = {n} is not a whole number of blocks of {QK}");
    let (m, nc) = (x.len(), y.len());
    assert!(out.len() >= m * nc, "gemm: {} outputs for {m} x {nc}", out.len());
    if m == 0 || nc == 0 {
        return;
    }
    let nb = n / QK;
    let xs: Vec<&[W::X]> = x.iter().map(|r| take_blocks::<W::X>(r, nb)).collect();
    let ys: Vec<&[BlockQ8_0]> = y.iter().map(|r| take_blocks::<BlockQ8_0>(r, nb)).collect();
    let mut s = SCRATCH.with(|c| c.take());
    s.init.resize(nc * nb, [0; 8]);
    s.dy.resize(nc * nb, 0.0);
    s.dx.resize(m.div_ceil(G) * G * nb, 0.0);
    // SAFETY: installed only after AVX-512 F/BW/VL/VNNI were detected (module docs); every row
    // holds exactly nb whole blocks (take_blocks); the scratch holds what `run` reads.
    unsafe { run::<W>(nb, &xs, &ys, out, &mut s) };
    SCRATCH.with(|c| c.set(s));
}

/// The prepared scales and offsets, then the tiles.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run<W: Weights>(nb: usize, xs: &[&[W::X]], ys: &[&[BlockQ8_0]], out: &mut [f32], s: &mut Scratch) {
    let (m, nc) = (xs.len(), ys.len());
    // SAFETY: whole-field reads; register arithmetic under this fn's features.
    unsafe {
        let kb = _mm256_set1_epi8(W::K as i8);
        for (j, row) in ys.iter().enumerate() {
            for (b, init) in row.iter().zip(&mut s.init[j * nb..(j + 1) * nb]) {
                let y = _mm256_loadu_si256(b.qs.as_ptr().cast());
                let ks = _mm256_dpbusd_epi32(_mm256_setzero_si256(), kb, y);
                _mm256_storeu_si256(init.as_mut_ptr().cast(), _mm256_sub_epi32(_mm256_setzero_si256(), ks));
            }
            f16s(row.iter().map(|b| b.d), &mut s.dy[j * nb..(j + 1) * nb]);
        }
        for (g, dx) in s.dx.chunks_exact_mut(G * nb).enumerate() {
            for (b, d) in dx.chunks_exact_mut(G).enumerate() {
                f16s((0..G).map(|i| W::d(&xs[(G * g + i).min(m - 1)][b])), d);
            }
        }
    }
    let pairs = m.div_ceil(2);
    let mut c0 = 0;
    while c0 < nc {
        let wide = nc - c0 > C / 2;
        let cols = if wide { C } else { C / 2 };
        let mut p0 = 0;
        while p0 < pairs {
            let mut t = [[0.0f32; C]; 2 * P];
            // SAFETY: this fn's features; every index below is clamped into range.
            unsafe {
                if wide {
                    tile::<W, C>(nb, xs, ys, s, p0, c0, &mut t);
                } else {
                    tile::<W, { C / 2 }>(nb, xs, ys, s, p0, c0, &mut t);
                }
            }
            for (c, col) in (c0..(c0 + cols).min(nc)).enumerate() {
                for (i, row) in (2 * p0..(2 * (p0 + P)).min(m)).enumerate() {
                    out[col * m + row] = t[i][c];
                }
            }
            p0 += P;
        }
        c0 += cols;
    }
}

/// One tile: weight-row pairs `p0..p0 + P` × columns `c0..c0 + CT` (clamped to the last pair and
/// column); `t[r][c]` gets row `2·p0 + r` · column `c0 + c`.
#[inline(always)]
unsafe fn tile<W: Weights, const CT: usize>(
    nb: usize,
    xs: &[&[W::X]],
    ys: &[&[BlockQ8_0]],
    s: &Scratch,
    p0: usize,
    c0: usize,
    t: &mut [[f32; C]; 2 * P],
) {
    let (m, nc) = (xs.len(), ys.len());
    let pairs = m.div_ceil(2);
    // Every slice cut to exactly nb blocks, so the block loop's index checks fold away.
    let mut xa: [&[W::X]; P] = [&[]; P];
    let mut xb: [&[W::X]; P] = [&[]; P];
    let mut dx: [&[f32]; P] = [&[]; P];
    let mut pick = [0i32; 16 * P];
    for p in 0..P {
        let q = (p0 + p).min(pairs - 1);
        let (r0, r1) = (2 * q, (2 * q + 1).min(m - 1));
        xa[p] = &xs[r0][..nb];
        xb[p] = &xs[r1][..nb];
        // Both rows lie in one group (G is even).
        dx[p] = &s.dx[r0 / G * G * nb..][..G * nb];
        pick[16 * p..16 * p + 8].fill((r0 % G) as i32);
        pick[16 * p + 8..16 * p + 16].fill((r1 % G) as i32);
    }
    let mut yq: [&[BlockQ8_0]; CT] = [&[]; CT];
    let mut init: [&[[i32; 8]]; CT] = [&[]; CT];
    let mut dy: [&[f32]; CT] = [&[]; CT];
    for c in 0..CT {
        let j = (c0 + c).min(nc - 1);
        yq[c] = &ys[j][..nb];
        init[c] = &s.init[j * nb..(j + 1) * nb];
        dy[c] = &s.dy[j * nb..(j + 1) * nb];
    }
    // SAFETY: in-bounds reads (whole fields, slices of nb blocks, 16 scales per block); register
    // arithmetic under the caller's AVX-512 F/BW/VL/VNNI.
    unsafe {
        let mut idx = [_mm512_setzero_si512(); P];
        for p in 0..P {
            idx[p] = _mm512_loadu_si512(pick[16 * p..].as_ptr().cast());
        }
        let mut acc = [[_mm512_setzero_ps(); P]; CT];
        for b in 0..nb {
            let mut u = [_mm512_setzero_si512(); P];
            let mut d = [_mm512_setzero_ps(); P];
            for p in 0..P {
                u[p] = W::codes(&xa[p][b], &xb[p][b]);
                let g = &dx[p][G * b..G * b + G];
                d[p] = _mm512_permutexvar_ps(idx[p], _mm512_loadu_ps(g.as_ptr()));
            }
            for c in 0..CT {
                let y = _mm512_broadcast_i64x4(_mm256_loadu_si256(yq[c][b].qs.as_ptr().cast()));
                let k = _mm512_broadcast_i64x4(_mm256_loadu_si256(init[c][b].as_ptr().cast()));
                let dyc = _mm512_set1_ps(dy[c][b]);
                for p in 0..P {
                    let v = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(k, u[p], y));
                    acc[c][p] = _mm512_fmadd_ps(_mm512_mul_ps(d[p], dyc), v, acc[c][p]);
                }
            }
        }
        for c in 0..CT {
            for p in 0..P {
                let lo = _mm512_castps512_ps256(acc[c][p]);
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[c][p])));
                t[2 * p][c] = hsum_ps(lo);
                t[2 * p + 1][c] = hsum_ps(hi);
            }
        }
    }
}

/// Columns per tile of the prepared tiles (fewer for the last columns).
const CP: usize = 16;
const _: () = assert!(CP == 16, "ptile writes out 16 columns");

/// The tiles on prepared activation rows: each row's `-k·Σy` lanes and f32 scale were computed
/// once, when the matrix product converted it (`PreparedQ8`: 32 codes, 8 offset lanes, the scale),
/// so a call prepares only its weight rows' scales. A tile is one pair of weight rows (one 512-bit
/// register of codes per block, unpacked once) × up to [`CP`] columns (one accumulator register
/// each); per column and block the codes meet the column through `vpdpbusd` on its broadcast
/// offsets, then the same conversion, scale product and `fma` as [`tile`], so every output's float
/// sequence (and bits) is the unprepared tiles' and `vec_dot`'s.
fn drive_prepared<W: Weights>(n: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    assert_eq!(n % QK, 0, "gemm: n = {n} is not a whole number of blocks of {QK}");
    let (m, nc) = (x.len(), y.len());
    assert!(out.len() >= m * nc, "gemm: {} outputs for {m} x {nc}", out.len());
    if m == 0 || nc == 0 {
        return;
    }
    let nb = n / QK;
    let xs: Vec<&[W::X]> = x.iter().map(|r| take_blocks::<W::X>(r, nb)).collect();
    let ys: Vec<&[PreparedQ8]> = y.iter().map(|r| take_blocks::<PreparedQ8>(r, nb)).collect();
    let mut s = SCRATCH.with(|c| c.take());
    s.dx.resize(m.div_ceil(G) * G * nb, 0.0);
    // SAFETY: installed only after AVX-512 F/BW/VL/VNNI were detected (module docs); every row
    // holds exactly nb whole blocks (take_blocks); the scratch holds the scales `run_prepared` reads.
    unsafe { run_prepared::<W>(nb, &xs, &ys, out, &mut s.dx) };
    SCRATCH.with(|c| c.set(s));
}

/// The weight rows' scales, then the prepared tiles, pair by pair and [`CP`] columns at a time.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run_prepared<W: Weights>(
    nb: usize,
    xs: &[&[W::X]],
    ys: &[&[PreparedQ8]],
    out: &mut [f32],
    dx: &mut [f32],
) {
    let (m, nc) = (xs.len(), ys.len());
    for (g, dx) in dx.chunks_exact_mut(G * nb).enumerate() {
        for (b, d) in dx.chunks_exact_mut(G).enumerate() {
            // SAFETY: this fn's features.
            unsafe { f16s((0..G).map(|i| W::d(&xs[(G * g + i).min(m - 1)][b])), d) };
        }
    }
    // Column tiles outside, pairs of rows inside: a tile's columns (72 bytes per block each) stay
    // in L1 while every pair of the call's rows meets them.
    let mut c0 = 0;
    while c0 < nc {
        let left = nc - c0;
        let cols = if left > CP / 2 {
            CP
        } else if left > CP / 4 {
            CP / 2
        } else {
            CP / 4
        };
        for p in 0..m.div_ceil(2) {
            let (r0, r1) = (2 * p, (2 * p + 1).min(m - 1));
            let (xa, xb) = (&xs[r0][..nb], &xs[r1][..nb]);
            // Both rows lie in one group (G is even).
            let d = &dx[r0 / G * G * nb..][..G * nb];
            let mut pick = [(r0 % G) as i32; 16];
            pick[8..].fill((r1 % G) as i32);
            let mut t = [[0.0f32; 2]; CP];
            // SAFETY: this fn's features; the tiles clamp their columns into range.
            unsafe {
                match cols {
                    CP => ptile::<W, CP>(nb, xa, xb, d, &pick, &ys[c0..], &mut t),
                    8 => ptile::<W, { CP / 2 }>(nb, xa, xb, d, &pick, &ys[c0..], &mut t),
                    _ => ptile::<W, { CP / 4 }>(nb, xa, xb, d, &pick, &ys[c0..], &mut t),
                }
            }
            for (c, v) in t.iter().enumerate().take(cols.min(left)) {
                out[(c0 + c) * m + r0] = v[0];
                if r1 > r0 {
                    out[(c0 + c) * m + r1] = v[1];
                }
            }
        }
        c0 += cols;
    }
}

/// One prepared tile: the weight rows `xa`, `xb` × the first `CT` columns of `ys` (the last one
/// repeated where fewer are left); `t[c]` gets both rows' outputs of column `c`. `d` holds the
/// rows' group scales (`G` per block), `pick` their places in the group (8 lanes each).
#[inline(always)]
unsafe fn ptile<W: Weights, const CT: usize>(
    nb: usize,
    xa: &[W::X],
    xb: &[W::X],
    d: &[f32],
    pick: &[i32; 16],
    ys: &[&[PreparedQ8]],
    t: &mut [[f32; 2]; CP],
) {
    let last = ys.len() - 1;
    let yq: [&[PreparedQ8]; CT] = std::array::from_fn(|c| &ys[c.min(last)][..nb]);
    let (xa, xb, d) = (&xa[..nb], &xb[..nb], &d[..G * nb]);
    // SAFETY: in-bounds reads (whole fields of blocks of slices cut to nb blocks, G scales per
    // block); register arithmetic under the caller's AVX-512 F/BW/VL/VNNI.
    unsafe {
        let idx = _mm512_loadu_si512(pick.as_ptr().cast());
        let mut acc = [_mm512_setzero_ps(); CT];
        for b in 0..nb {
            let u = W::codes(&xa[b], &xb[b]);
            let dxb = _mm512_permutexvar_ps(idx, _mm512_loadu_ps(d[G * b..].as_ptr()));
            // Written out column by column (constant indices), so that the accumulators stay in
            // registers: a loop here is left rolled, with the accumulators in memory.
            macro_rules! columns {
                ($($c:literal)*) => {$(
                    if $c < CT {
                        let yb = &yq[$c][b];
                        let y = _mm512_broadcast_i64x4(_mm256_loadu_si256(yb.qs.as_ptr().cast()));
                        let k = _mm512_broadcast_i64x4(_mm256_loadu_si256(yb.off.as_ptr().cast()));
                        let dy = _mm512_set1_ps(f32::from_le_bytes(yb.d));
                        let v = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(k, u, y));
                        acc[$c] = _mm512_fmadd_ps(_mm512_mul_ps(dxb, dy), v, acc[$c]);
                    }
                )*};
            }
            columns!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        }
        for c in 0..CT {
            let lo = _mm512_castps512_ps256(acc[c]);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[c])));
            t[c] = [hsum_ps(lo), hsum_ps(hi)];
        }
    }
}

/// The scalar twin of one output: `Σ_b fma(d_x·d_y, lanes_b, acc)` over 8 lanes, each lane the
/// exact sum of four products `(u - k)·y`, then `hsum_ps`'s `((a0+a4) + (a2+a6)) + ((a1+a5) +
/// (a3+a7))`. `codes(block)` yields the 32 signed weights `u - k`, `d` the block's scale.
#[cfg(test)]
fn ref_dot<X>(xs: &[X], ys: &[BlockQ8_0], codes: impl Fn(&X) -> [i32; 32], d: impl Fn(&X) -> f32) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bx, by) in xs.iter().zip(ys) {
        let q = codes(bx);
        let s = d(bx) * half::f16::from_le_bytes(by.d).to_f32();
        for (l, a) in acc.iter_mut().enumerate() {
            let lane: i32 = (4 * l..4 * l + 4).map(|i| q[i] * by.qs[i] as i32).sum();
            *a = s.mul_add(lane as f32, *a);
        }
    }
    let h: [f32; 4] = std::array::from_fn(|i| acc[i] + acc[i + 4]);
    (h[0] + h[2]) + (h[1] + h[3])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::prepared;
    use half::f16 as F16;
    use rand::{Rng as _, RngCore, SeedableRng};

    type Rng = rand::rngs::StdRng;

    /// A scale: mostly ordinary magnitudes, some tiny or large, some exactly zero.
    fn scale(r: &mut Rng) -> [u8; 2] {
        let v = match r.random::<u64>() % 8 {
            0 => 0.0,
            1 => 6.0e-5,
            2 => -3.0e3,
            _ => ((r.random::<u64>() % 20_000) as f32 - 10_000.0) * 1.0e-5,
        };
        F16::from_f32(v).to_le_bytes()
    }

    /// `rows` rows of `nb` blocks of `size` bytes: random codes (and high bits), with rows of all
    /// 0x00, all 0xFF, and for Q8_0 alternating -128 / 127; the scale field at bytes 0..2.
    fn weights(r: &mut Rng, rows: usize, nb: usize, size: usize, q8: bool) -> Vec<Vec<u8>> {
        (0..rows)
            .map(|i| {
                let mut v = vec![0u8; nb * size];
                match i % 5 {
                    1 => v.fill(0x00),
                    2 => v.fill(0xFF),
                    3 if q8 => {
                        v.iter_mut().enumerate().for_each(|(j, b)| *b = if j % 2 == 0 { 0x80 } else { 0x7F })
                    }
                    _ => r.fill_bytes(&mut v),
                }
                for b in v.chunks_exact_mut(size) {
                    b[..2].copy_from_slice(&scale(r));
                }
                v
            })
            .collect()
    }

    /// Q8_0 activation rows: random codes in -128..=127 (ggml's quantizer stays in ±127; the tiles
    /// are exact for -128 too), every fourth row at the extremes.
    fn activations(r: &mut Rng, cols: usize, nb: usize) -> Vec<Vec<u8>> {
        (0..cols)
            .map(|j| {
                let mut v = vec![0u8; nb * 34];
                r.fill_bytes(&mut v);
                if j % 4 == 3 {
                    v.iter_mut().enumerate().for_each(|(i, b)| *b = if i % 3 == 0 { 0x81 } else { 0x7F });
                }
                for b in v.chunks_exact_mut(34) {
                    b[..2].copy_from_slice(&scale(r));
                }
                v
            })
            .collect()
    }

    fn q4_codes(qs: &[u8; 16]) -> [i32; 32] {
        std::array::from_fn(|j| if j < 16 { (qs[j] & 15) as i32 } else { (qs[j - 16] >> 4) as i32 })
    }

    fn d(h: [u8; 2]) -> f32 {
        F16::from_le_bytes(h).to_f32()
    }

    /// Every output of the 512-bit tiles (on Q8_0 rows and on prepared rows) against the scalar
    /// twin, bit for bit: shapes with partial tiles in both directions (one row, odd rows, 1..=33
    /// columns), block counts 1, 3 and 18, extreme codes and zero scales.
    #[test]
    fn tiles_equal_scalar_twin() {
        if !super::super::avx512_available() {
            return;
        }
        let mut r = Rng::seed_from_u64(0x9E37_79B9_7F4A_7C15);
        let mut tested = 0;
        for nb in [1usize, 3, 18] {
            let n = nb * QK;
            let ys = activations(&mut r, 33, nb);
            let ybl: Vec<&[BlockQ8_0]> = ys.iter().map(|v| take_blocks::<BlockQ8_0>(v, nb)).collect();
            for (t, size) in [(GgmlType::Q4_0, 18usize), (GgmlType::Q5_0, 22), (GgmlType::Q8_0, 34)] {
                let xs = weights(&mut r, 17, nb, size, t == GgmlType::Q8_0);
                let bias = match t {
                    GgmlType::Q4_0 => Q4_0::K,
                    GgmlType::Q5_0 => Q5_0::K,
                    _ => Q8_0::K,
                } as i32;
                let prep: Vec<Vec<u8>> = ys
                    .iter()
                    .map(|y| {
                        let mut o = vec![0u8; prepared::row_bytes(n)];
                        prepared::prepare(n, GgmlType::Q8_0, bias, y, &mut o);
                        o
                    })
                    .collect();
                for (m, nc) in [
                    (1usize, 1usize),
                    (3, 5),
                    (7, 9),
                    (16, 16),
                    (5, 3),
                    (2, 8),
                    (17, 17),
                    (4, 12),
                    (3, 33),
                    (6, 24),
                ] {
                    let x: Vec<&[u8]> = xs[..m].iter().map(|v| v.as_slice()).collect();
                    let y: Vec<&[u8]> = ys[..nc].iter().map(|v| v.as_slice()).collect();
                    let mut out = vec![f32::NAN; m * nc];
                    match t {
                        GgmlType::Q4_0 => gemm_q4_0_q8_0(n, &x, &y, &mut out),
                        GgmlType::Q5_0 => gemm_q5_0_q8_0(n, &x, &y, &mut out),
                        _ => gemm_q8_0_q8_0(n, &x, &y, &mut out),
                    }
                    // The prepared tiles give the same bits (checked below against the twin).
                    let p: Vec<&[u8]> = prep[..nc].iter().map(|v| v.as_slice()).collect();
                    let mut got_p = vec![f32::NAN; m * nc];
                    match t {
                        GgmlType::Q4_0 => gemm_q4_0_prepared(n, &x, &p, &mut got_p),
                        GgmlType::Q5_0 => gemm_q5_0_prepared(n, &x, &p, &mut got_p),
                        _ => gemm_q8_0_prepared(n, &x, &p, &mut got_p),
                    }
                    for j in 0..nc {
                        for i in 0..m {
                            let want = match t {
                                GgmlType::Q4_0 => ref_dot(
                                    take_blocks::<BlockQ4_0>(x[i], nb),
                                    ybl[j],
                                    |b| q4_codes(&b.qs).map(|q| q - 8),
                                    |b| d(b.d),
                                ),
                                GgmlType::Q5_0 => ref_dot(
                                    take_blocks::<BlockQ5_0>(x[i], nb),
                                    ybl[j],
                                    |b| {
                                        let h = u32::from_le_bytes(b.qh);
                                        let q = q4_codes(&b.qs);
                                        std::array::from_fn(|k| q[k] | ((h >> k & 1) << 4) as i32)
                                            .map(|q| q - 16)
                                    },
                                    |b| d(b.d),
                                ),
                                _ => ref_dot(
                                    take_blocks::<BlockQ8_0>(x[i], nb),
                                    ybl[j],
                                    |b| b.qs.map(|q| q as i32),
                                    |b| d(b.d),
                                ),
                            };
                            let got = out[j * m + i];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{t} nb={nb} {m}x{nc} ({i},{j}): {got} vs {want}"
                            );
                            let got = got_p[j * m + i];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "prepared {t} nb={nb} {m}x{nc} ({i},{j}): {got} vs {want}"
                            );
                            tested += 1;
                        }
                    }
                }
            }
        }
        assert!(tested > 3000);
    }
}
