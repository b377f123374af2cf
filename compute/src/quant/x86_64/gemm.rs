//! Register-tiled matrix × matrix kernels for prompt processing: AVX-512 VNNI + VL (256-bit
//! registers with EVEX encoding, so all 32 vector registers are usable; tiles of 4 weight rows ×
//! 4 activation columns) and AVX2 (16 registers; tiles of 2 × 4).
//!
//! Each weight block is unpacked once for the tile's columns and each activation block loaded once
//! for its rows, and the block scales are converted once per row and per column instead of once per
//! pair. The integer part of a block dot is formed differently (one `vpdpbusd`, or AVX2's
//! `maddubs` + `madd`, per pair, with the constant offsets of Q4_0/Q5_0/Q8_0 folded into its initial
//! value, computed once per row or column), but it is an exact integer sum per 32-bit lane, so it
//! equals the one-column kernels' lane by lane (AVX2's Q8_0 keeps the one-column kernel's sign
//! trick, whose `maddubs` could saturate on the byte -128 exactly as that kernel does). Everything in floating
//! point is the one-column kernels' sequence for each output: the f32 product of the two block
//! scales, `fma(scale, lanes, acc)` block after block, `hsum_ps`, then the min / offset terms in
//! the same order. So every value is bit-identical to `vec_dot` (and to ggml's AVX2 arithmetic),
//! which `quant::tests::simd::gemm_bitwise_equals_vec_dot` checks.
//! ref: ggml-compute-semantics.md §2.2, §2.3.
//!
//! Like the other x86 modules, the safe wrappers are reachable only through [`install`], which
//! runs only after the features were detected: the invariant behind every `// SAFETY:` comment.

use std::arch::asm;
use std::arch::x86_64::*;

use super::avx2::kquants::{hsum_m, k4_unpack, pick16, q6k_half};
use super::avx2::util::*;
use super::avx512::dpbusd;
use crate::dtype::{GgmlType, QK_K};
use crate::quant::blocks::*;
use crate::quant::dispatch::Kernels;

/// Installs the VNNI tiles into `k`; does nothing without AVX-512 VNNI + VL. `gemm512::install`,
/// run after this, replaces those of Q4_0, Q5_0 and Q8_0 with 512-bit tiles (same bits).
pub fn install(k: &mut Kernels) {
    if !super::avx512_available() {
        return;
    }
    k.set_gemm(GgmlType::Q4_0, vnni::gemm_q4_0_q8_0);
    k.set_gemm(GgmlType::Q4_1, vnni::gemm_q4_1_q8_1);
    k.set_gemm(GgmlType::Q5_0, vnni::gemm_q5_0_q8_0);
    k.set_gemm(GgmlType::Q8_0, vnni::gemm_q8_0_q8_0);
    k.set_gemm(GgmlType::Q4_K, vnni::gemm_q4_k_q8_k);
    k.set_gemm(GgmlType::Q6_K, vnni::gemm_q6_k_q8_k);
    k.set_gemm(GgmlType::F16, gemm_f16_f16_avx512);
}

/// Installs the AVX2 tiles into `k`; does nothing without AVX2, FMA and F16C.
pub fn install_avx2(k: &mut Kernels) {
    if !super::avx2_available() {
        return;
    }
    k.set_gemm(GgmlType::Q4_0, avx2::gemm_q4_0_q8_0);
    k.set_gemm(GgmlType::Q4_1, avx2::gemm_q4_1_q8_1);
    k.set_gemm(GgmlType::Q5_0, avx2::gemm_q5_0_q8_0);
    k.set_gemm(GgmlType::Q8_0, avx2::gemm_q8_0_q8_0);
    k.set_gemm(GgmlType::Q4_K, avx2::gemm_q4_k_q8_k);
    k.set_gemm(GgmlType::Q6_K, avx2::gemm_q6_k_q8_k);
    k.set_gemm(GgmlType::F16, gemm_f16_f16_avx2);
}

/// One tile: `out[c][r]` = dot of weight row `r` with activation row `c`.
type TileFn<X, Y, const R: usize, const C: usize> = unsafe fn([&[X]; R], [&[Y]; C]) -> [[f32; R]; C];

/// Checks the shapes, then covers the `x.len() × y.len()` outputs with tiles; a partial tile
/// repeats its last row or column (the extra results are dropped). `out[j * x.len() + i]` gets row
/// `i` · column `j`.
fn drive<X: bytemuck::Pod, Y: bytemuck::Pod, const R: usize, const C: usize>(
    n: usize,
    qk: usize,
    x: &[&[u8]],
    y: &[&[u8]],
    out: &mut [f32],
    tile: TileFn<X, Y, R, C>,
) {
    assert_eq!(n % qk, 0, "gemm: n = {n} is not a whole number of blocks of {qk}");
    let (m, nc) = (x.len(), y.len());
    assert!(out.len() >= m * nc, "gemm: {} outputs for {m} x {nc}", out.len());
    if m == 0 || nc == 0 {
        return;
    }
    let nb = n / qk;
    for c0 in (0..nc).step_by(C) {
        // Plain loops rather than `array::from_fn`, which here compiled to a libc copy per tile.
        let mut ys: [&[Y]; C] = [&[]; C];
        for (j, t) in ys.iter_mut().enumerate() {
            *t = take_blocks::<Y>(y[(c0 + j).min(nc - 1)], nb);
        }
        for r0 in (0..m).step_by(R) {
            let mut xs: [&[X]; R] = [&[]; R];
            for (i, t) in xs.iter_mut().enumerate() {
                *t = take_blocks::<X>(x[(r0 + i).min(m - 1)], nb);
            }
            // SAFETY: installed only after the tile's features were detected (module docs); every
            // row holds exactly nb whole blocks (take_blocks).
            let v = unsafe { tile(xs, ys) };
            let rows = R.min(m - r0);
            for (j, col) in v.iter().enumerate().take(nc - c0) {
                let o = (c0 + j) * m + r0;
                for (d, s) in out[o..o + rows].iter_mut().zip(col) {
                    *d = *s;
                }
            }
        }
    }
}

/// The safe entry points and `#[target_feature]` tiles of one kernel set.
macro_rules! kernel_set {
    ($isa:ident, $feat:literal, $dot:ty, $q8:ty, $r:literal, $c:literal) => {
        mod $isa {
            use super::*;

            macro_rules! tile {
                ($pub_name:ident, $tile:ident, $x:ty, $y:ty, $qk:expr, $body:expr) => {
                    #[target_feature(enable = $feat)]
                    unsafe fn $tile(xs: [&[$x]; $r], ys: [&[$y]; $c]) -> [[f32; $r]; $c] {
                        // SAFETY: forwarded contract (whole blocks, equal counts); features
                        // enabled on this fn.
                        unsafe { $body(xs, ys) }
                    }

                    /// Every weight row against every activation row (see the module docs).
                    pub(in crate::quant::x86_64) fn $pub_name(
                        n: usize,
                        x: &[&[u8]],
                        y: &[&[u8]],
                        out: &mut [f32],
                    ) {
                        drive::<$x, $y, $r, $c>(n, $qk, x, y, out, $tile);
                    }
                };
            }

            tile!(gemm_q4_0_q8_0, q4_0, BlockQ4_0, BlockQ8_0, QK, legacy_tile::<Q4_0, $dot, $r, $c>);
            tile!(gemm_q5_0_q8_0, q5_0, BlockQ5_0, BlockQ8_0, QK, legacy_tile::<Q5_0, $dot, $r, $c>);
            tile!(gemm_q8_0_q8_0, q8_0, BlockQ8_0, BlockQ8_0, QK, legacy_tile::<$q8, $dot, $r, $c>);
            tile!(gemm_q4_1_q8_1, q4_1, BlockQ4_1, BlockQ8_1, QK, q4_1_tile::<$dot, $r, $c>);
            tile!(gemm_q4_k_q8_k, q4_k, BlockQ4K, BlockQ8K, QK_K, q4_k_tile::<$dot, $r, $c>);
            tile!(gemm_q6_k_q8_k, q6_k, BlockQ6K, BlockQ8K, QK_K, q6_k_tile::<$dot, $r, $c>);
        }
    };
}

kernel_set!(vnni, "avx2,fma,f16c,avx512f,avx512vl,avx512vnni", Vnni, Q8_0, 4, 4);
kernel_set!(avx2, "avx2,fma,f16c", Avx2, Q8_0Sign, 2, 4);

/// The integer dot-product steps of a kernel set.
trait Dot {
    /// `acc + Σ_{4 bytes} a_u8 · b_i8` per i32 lane; exact when no pair `a·b + a'·b'` leaves the
    /// i16 range (AVX2 forms it with `maddubs`): callers keep `a ≤ 63`.
    unsafe fn busd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    /// `acc + a_i16[2l]·b_i16[2l] + a_i16[2l+1]·b_i16[2l+1]` per i32 lane (wrapping).
    unsafe fn wssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
}

/// AVX-512 VNNI: one instruction each.
struct Vnni;
impl Dot for Vnni {
    #[inline(always)]
    unsafe fn busd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: only reached from tiles compiled with (and run after detection of) VNNI + VL.
        unsafe { dpbusd(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn wssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: as above.
        unsafe { dpwssd(acc, a, b) }
    }
}

/// AVX2: `maddubs` + `madd` + `add`, and `madd` + `add`.
struct Avx2;
impl Dot for Avx2 {
    #[inline(always)]
    unsafe fn busd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: register arithmetic under the caller's AVX2.
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))) }
    }
    #[inline(always)]
    unsafe fn wssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: register arithmetic under the caller's AVX2.
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)) }
    }
}

/// `acc + a_i16[2l] · b_i16[2l] + a_i16[2l+1] · b_i16[2l+1]` per i32 lane: `madd_epi16` and
/// `add_epi32` in one instruction (the same wrapping i32 arithmetic).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    let mut acc = acc;
    // SAFETY: as `dpbusd`.
    unsafe {
        asm!(
            "vpdpwssd {acc:y}, {a:y}, {b:y}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// An f16 (little-endian bytes) as f32 in all 8 lanes (exact).
#[inline(always)]
unsafe fn bcast_f16(h: [u8; 2]) -> __m256 {
    // SAFETY: register conversion under F16C.
    unsafe { _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(h))) }
}

/// Four f16 values (little-endian bytes) as f32 (exact).
#[inline(always)]
unsafe fn f16x4(h: [[u8; 2]; 4]) -> __m128 {
    let bits = h.iter().rev().fold(0u64, |a, v| a << 16 | u16::from_le_bytes(*v) as u64);
    // SAFETY: register conversion under F16C.
    unsafe { _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64)) }
}

/// The f16 at bytes `off..off + 2` of a block.
#[inline(always)]
fn f16_at<T: bytemuck::Pod>(b: &T, off: usize) -> [u8; 2] {
    let s = bytemuck::bytes_of(b);
    [s[off], s[off + 1]]
}

/// `hsum_ps` of four accumulators at once, with `hsum_ps`'s operations lane for lane (same
/// operand order too, so even NaN payloads match): `s = lo + hi`, `t = (s0 + s2, s1 + s3)`,
/// `t0 + t1`.
#[inline(always)]
unsafe fn hsum_x4(v: [__m256; 4]) -> [f32; 4] {
    // SAFETY: register arithmetic under AVX; a store to a local array.
    unsafe {
        let s_ab =
            _mm256_add_ps(_mm256_permute2f128_ps(v[0], v[1], 0x20), _mm256_permute2f128_ps(v[0], v[1], 0x31));
        let s_cd =
            _mm256_add_ps(_mm256_permute2f128_ps(v[2], v[3], 0x20), _mm256_permute2f128_ps(v[2], v[3], 0x31));
        // Per 128-bit lane: [x.s0, x.s1, y.s0, y.s1] + [x.s2, x.s3, y.s2, y.s3].
        let t = _mm256_add_ps(_mm256_shuffle_ps(s_ab, s_cd, 0x44), _mm256_shuffle_ps(s_ab, s_cd, 0xEE));
        let h = _mm256_add_ps(t, _mm256_movehdup_ps(t));
        let mut o = [0.0f32; 8];
        _mm256_storeu_ps(o.as_mut_ptr(), h);
        [o[0], o[4], o[2], o[6]]
    }
}

/// `hsum_ps` of every accumulator.
#[inline(always)]
unsafe fn finish<const R: usize, const C: usize>(acc: [[__m256; R]; C]) -> [[f32; R]; C] {
    let mut out = [[0.0f32; R]; C];
    for c in 0..C {
        let mut r = 0;
        while r + 4 <= R {
            // SAFETY: register arithmetic under AVX.
            let v = unsafe { hsum_x4([acc[c][r], acc[c][r + 1], acc[c][r + 2], acc[c][r + 3]]) };
            out[c][r..r + 4].copy_from_slice(&v);
            r += 4;
        }
        while r < R {
            // SAFETY: register arithmetic under AVX.
            out[c][r] = unsafe { hsum_ps(acc[c][r]) };
            r += 1;
        }
    }
    out
}

/// How a 32-element format pairs with its Q8 activation blocks.
trait Legacy {
    type X: bytemuck::Pod;
    type Y: bytemuck::Pod;
    /// The weight block's bytes and the lanes to start its dot from (`0` unless the row folds a
    /// constant offset).
    unsafe fn row(bx: &Self::X) -> (__m256i, __m256i);
    /// The activation block's bytes and the lanes to start from (`0` unless the column folds one).
    unsafe fn col<D: Dot>(by: &Self::Y) -> (__m256i, __m256i);
    /// The exact i32 lanes of the block dot from the row and column parts.
    unsafe fn pair<D: Dot>(row: (__m256i, __m256i), col: (__m256i, __m256i)) -> __m256i;
}

/// `-k · Σ_{4 bytes} y` per lane: the offset of a weight stored as `q + k` (unsigned), folded in.
#[inline(always)]
unsafe fn neg_offset<D: Dot>(k: i8, y: __m256i) -> __m256i {
    // SAFETY: register arithmetic under the caller's features (k ≤ 16).
    unsafe {
        let s = D::busd(_mm256_setzero_si256(), _mm256_set1_epi8(k), y);
        _mm256_sub_epi32(_mm256_setzero_si256(), s)
    }
}

struct Q4_0;
impl Legacy for Q4_0 {
    type X = BlockQ4_0;
    type Y = BlockQ8_0;
    #[inline(always)]
    unsafe fn row(bx: &BlockQ4_0) -> (__m256i, __m256i) {
        // SAFETY: register arithmetic and a whole-field read.
        unsafe { (nibbles32(&bx.qs), _mm256_setzero_si256()) }
    }
    #[inline(always)]
    unsafe fn col<D: Dot>(by: &BlockQ8_0) -> (__m256i, __m256i) {
        // SAFETY: as above. Σ (q - 8)·y = Σ q·y - 8·Σ y.
        unsafe {
            let y = load32(&by.qs);
            (y, neg_offset::<D>(8, y))
        }
    }
    #[inline(always)]
    unsafe fn pair<D: Dot>(row: (__m256i, __m256i), col: (__m256i, __m256i)) -> __m256i {
        // SAFETY: register arithmetic under the caller's features (q ≤ 15).
        unsafe { D::busd(col.1, row.0, col.0) }
    }
}

struct Q5_0;
impl Legacy for Q5_0 {
    type X = BlockQ5_0;
    type Y = BlockQ8_0;
    #[inline(always)]
    unsafe fn row(bx: &BlockQ5_0) -> (__m256i, __m256i) {
        // SAFETY: register arithmetic and whole-field reads. The 5-bit q = nib | hi << 4.
        unsafe {
            let hi = _mm256_and_si256(bytes_from_bits(u32::from_le_bytes(bx.qh)), _mm256_set1_epi8(0x10));
            (_mm256_or_si256(nibbles32(&bx.qs), hi), _mm256_setzero_si256())
        }
    }
    #[inline(always)]
    unsafe fn col<D: Dot>(by: &BlockQ8_0) -> (__m256i, __m256i) {
        // SAFETY: as above. Σ (q - 16)·y = Σ q·y - 16·Σ y.
        unsafe {
            let y = load32(&by.qs);
            (y, neg_offset::<D>(16, y))
        }
    }
    #[inline(always)]
    unsafe fn pair<D: Dot>(row: (__m256i, __m256i), col: (__m256i, __m256i)) -> __m256i {
        // SAFETY: register arithmetic under the caller's features (q ≤ 31).
        unsafe { D::busd(col.1, row.0, col.0) }
    }
}

struct Q8_0;
impl Legacy for Q8_0 {
    type X = BlockQ8_0;
    type Y = BlockQ8_0;
    #[inline(always)]
    unsafe fn row(bx: &BlockQ8_0) -> (__m256i, __m256i) {
        // SAFETY: register arithmetic and a whole-field read. The signed weights stay the i8
        // operand; the activations become unsigned y + 128, so Σ q·y = Σ q·(y + 128) - 128·Σ q.
        unsafe {
            let q = load32(&bx.qs);
            (q, neg_offset_signed(q))
        }
    }
    #[inline(always)]
    unsafe fn col<D: Dot>(by: &BlockQ8_0) -> (__m256i, __m256i) {
        // SAFETY: as above; xor 0x80 is + 128 for every i8 value.
        unsafe { (_mm256_xor_si256(load32(&by.qs), _mm256_set1_epi8(-128)), _mm256_setzero_si256()) }
    }
    #[inline(always)]
    unsafe fn pair<D: Dot>(row: (__m256i, __m256i), col: (__m256i, __m256i)) -> __m256i {
        // SAFETY: VNNI only (the kernel set that installs this); unsigned operands up to 255.
        unsafe { dpbusd(row.1, col.0, row.0) }
    }
}

/// Q8_0 for AVX2: the one-column kernel's sign trick, `madd(maddubs(|q|, sign(y, q)), 1)`.
struct Q8_0Sign;
impl Legacy for Q8_0Sign {
    type X = BlockQ8_0;
    type Y = BlockQ8_0;
    #[inline(always)]
    unsafe fn row(bx: &BlockQ8_0) -> (__m256i, __m256i) {
        // SAFETY: register arithmetic and a whole-field read.
        unsafe {
            let q = load32(&bx.qs);
            (q, _mm256_sign_epi8(q, q))
        }
    }
    #[inline(always)]
    unsafe fn col<D: Dot>(by: &BlockQ8_0) -> (__m256i, __m256i) {
        // SAFETY: as above.
        unsafe { (load32(&by.qs), _mm256_setzero_si256()) }
    }
    #[inline(always)]
    unsafe fn pair<D: Dot>(row: (__m256i, __m256i), col: (__m256i, __m256i)) -> __m256i {
        // SAFETY: register arithmetic under the caller's AVX2.
        unsafe { dot_i8i8_epi32(row.0, col.0) }
    }
}

/// `-128 · Σ_{4 bytes} q` per lane, for signed `q`.
#[inline(always)]
unsafe fn neg_offset_signed(q: __m256i) -> __m256i {
    // SAFETY: register arithmetic; callers enable AVX2 and VNNI.
    unsafe {
        let s = dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8(-128), q);
        _mm256_sub_epi32(_mm256_setzero_si256(), s)
    }
}

/// The tile of a format without a min term: per block and pair, `fma(d_x·d_y, lanes, acc)`.
#[inline(always)]
unsafe fn legacy_tile<L: Legacy, D: Dot, const R: usize, const C: usize>(
    xs: [&[L::X]; R],
    ys: [&[L::Y]; C],
) -> [[f32; R]; C] {
    // SAFETY: every slice holds the same number of whole blocks (checked by `drive`); register
    // arithmetic under the caller's features.
    unsafe {
        let nb = xs[0].len();
        // Every slice cut to exactly nb blocks, so the block loop's index checks fold away.
        let (mut xs, mut ys) = (xs, ys);
        for x in xs.iter_mut() {
            *x = &x[..nb];
        }
        for y in ys.iter_mut() {
            *y = &y[..nb];
        }
        let mut acc = [[_mm256_setzero_ps(); R]; C];
        for b in 0..nb {
            let mut rows = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
            let mut dx = [_mm256_setzero_ps(); R];
            for i in 0..R {
                rows[i] = L::row(&xs[i][b]);
                dx[i] = bcast_f16(f16_at(&xs[i][b], 0));
            }
            for c in 0..C {
                let by = &ys[c][b];
                let col = L::col::<D>(by);
                let dy = bcast_f16(f16_at(by, 0));
                for r in 0..R {
                    let v = _mm256_cvtepi32_ps(L::pair::<D>(rows[r], col));
                    acc[c][r] = _mm256_fmadd_ps(_mm256_mul_ps(dx[r], dy), v, acc[c][r]);
                }
            }
        }
        finish(acc)
    }
}

/// Q4_1 · Q8_1: `fma(d_x·d_y, Σ q·y, acc)` per block, and `m_x·s_y` added block after block to a
/// separate f32 sum, which is added after `hsum_ps` (the one-column kernel's order).
#[inline(always)]
unsafe fn q4_1_tile<D: Dot, const R: usize, const C: usize>(
    xs: [&[BlockQ4_1]; R],
    ys: [&[BlockQ8_1]; C],
) -> [[f32; R]; C] {
    // SAFETY: every slice holds the same number of whole blocks (checked by `drive`); register
    // arithmetic; features enabled on this fn.
    unsafe {
        let nb = xs[0].len();
        // Every slice cut to exactly nb blocks, so the block loop's index checks fold away.
        let (mut xs, mut ys) = (xs, ys);
        for x in xs.iter_mut() {
            *x = &x[..nb];
        }
        for y in ys.iter_mut() {
            *y = &y[..nb];
        }
        let mut acc = [[_mm256_setzero_ps(); R]; C];
        // Per column, the four rows' min sums.
        let mut ms = [_mm_setzero_ps(); C];
        for b in 0..nb {
            let mut q = [_mm256_setzero_si256(); R];
            let mut dx = [_mm256_setzero_ps(); R];
            let mut m4 = [[0u8; 2]; 4];
            for i in 0..R {
                q[i] = nibbles32(&xs[i][b].qs);
                dx[i] = bcast_f16(xs[i][b].d);
                m4[i] = xs[i][b].m;
            }
            let mx = f16x4(m4);
            for c in 0..C {
                let by = &ys[c][b];
                let y = load32(&by.qs);
                let dy = bcast_f16(by.d);
                ms[c] = _mm_add_ps(ms[c], _mm_mul_ps(mx, _mm256_castps256_ps128(bcast_f16(by.s))));
                for r in 0..R {
                    let v = _mm256_cvtepi32_ps(D::busd(_mm256_setzero_si256(), q[r], y));
                    acc[c][r] = _mm256_fmadd_ps(_mm256_mul_ps(dx[r], dy), v, acc[c][r]);
                }
            }
        }
        let mut d = finish(acc);
        for c in 0..C {
            let mut m = [0.0f32; 4];
            _mm_storeu_ps(m.as_mut_ptr(), ms[c]);
            for r in 0..R {
                d[c][r] += m[r];
            }
        }
        d
    }
}

/// Q4_K · Q8_K: per super-block the exact i32 lanes `Σ_sub scale·Σ q·y`, then
/// `fma(d_y·d_x, lanes, acc)`, and the mins in ggml's AVX2 form (four i32 lanes per row, `fma`ed with
/// `-d_y·dmin_x` into a 4-lane accumulator, reduced as `(m0 + m2) + (m1 + m3)` and added at the end).
#[inline(always)]
unsafe fn q4_k_tile<D: Dot, const R: usize, const C: usize>(
    xs: [&[BlockQ4K]; R],
    ys: [&[BlockQ8K]; C],
) -> [[f32; R]; C] {
    // SAFETY: every slice holds the same number of whole blocks (checked by `drive`); in-bounds
    // loads (whole fields, or checked by `load32_at`); features enabled on this fn.
    unsafe {
        let nb = xs[0].len();
        // Every slice cut to exactly nb blocks, so the block loop's index checks fold away.
        let (mut xs, mut ys) = (xs, ys);
        for x in xs.iter_mut() {
            *x = &x[..nb];
        }
        for y in ys.iter_mut() {
            *y = &y[..nb];
        }
        let mask = _mm256_set1_epi8(0x0F);
        let mut acc = [[_mm256_setzero_ps(); R]; C];
        // Q4_K's min accumulators, two rows per register (R ≤ 4).
        let mut acc_m = [[_mm256_setzero_ps(); 2]; C];
        for b in 0..nb {
            // Per row: the eight scales as i16 in both lanes, the eight mins as i16.
            let mut sc = [_mm256_setzero_si256(); R];
            let mut mn = [_mm_setzero_si128(); 4];
            for i in 0..R {
                let u = k4_unpack(&xs[i][b].scales);
                let v = _mm_loadu_si128(u.as_ptr().cast());
                sc[i] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(v));
                mn[i] = _mm_cvtepu8_epi16(_mm_srli_si128(v, 8));
            }
            let mut sumi = [[_mm256_setzero_si256(); R]; C];
            for ch in 0..4 {
                let j = 2 * ch as i32;
                for i in 0..R {
                    let q = load32_at(&xs[i][b].qs, ch * 32);
                    let lo = _mm256_and_si256(q, mask);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
                    let (s0, s1) = (pick16(sc[i], j, j), pick16(sc[i], j + 1, j + 1));
                    for c in 0..C {
                        let pl = _mm256_maddubs_epi16(lo, load32_at(&ys[c][b].qs, ch * 64));
                        let ph = _mm256_maddubs_epi16(hi, load32_at(&ys[c][b].qs, ch * 64 + 32));
                        sumi[c][i] = D::wssd(D::wssd(sumi[c][i], pl, s0), ph, s1);
                    }
                }
            }
            let mut d = [0.0f32; R];
            let mut dm = [[0u8; 2]; 4];
            for i in 0..R {
                d[i] = f16le(xs[i][b].d);
                dm[i] = xs[i][b].dmin;
            }
            let dmin = f16x4(dm);
            for c in 0..C {
                let by = &ys[c][b];
                let dy = f32::from_le_bytes(by.d);
                // ggml's four min lanes per row, `mn_2k·(bsum_4k + bsum_4k+1) + …`, times
                // `-d_y·dmin_x` into the row's 4-lane min accumulator (two rows per register).
                let b0 = _mm_loadu_si128(by.bsums.as_ptr().cast());
                let b1 = _mm_loadu_si128(by.bsums[8..].as_ptr().cast());
                let bs = _mm_hadd_epi16(b0, b1);
                let mut neg = [0.0f32; 4];
                _mm_storeu_ps(neg.as_mut_ptr(), _mm_mul_ps(_mm_set1_ps(-dy), dmin));
                for p in 0..R.div_ceil(2) {
                    let (i0, i1) = (2 * p, (2 * p + 1).min(R - 1));
                    let m = _mm256_set_m128i(_mm_madd_epi16(mn[i1], bs), _mm_madd_epi16(mn[i0], bs));
                    let dm = _mm256_set_m128(_mm_set1_ps(neg[i1]), _mm_set1_ps(neg[i0]));
                    acc_m[c][p] = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(m), acc_m[c][p]);
                }
                for i in 0..R {
                    let v = _mm256_cvtepi32_ps(sumi[c][i]);
                    acc[c][i] = _mm256_fmadd_ps(_mm256_set1_ps(dy * d[i]), v, acc[c][i]);
                }
            }
        }
        let mut s = finish(acc);
        for c in 0..C {
            for (r, v) in s[c].iter_mut().enumerate() {
                let pair = acc_m[c][r / 2];
                let m =
                    if r % 2 == 0 { _mm256_castps256_ps128(pair) } else { _mm256_extractf128_ps(pair, 1) };
                *v += hsum_m(m);
            }
        }
        s
    }
}

/// Q6_K · Q8_K: per super-block the exact i32 lanes `Σ_sub scale·Σ q·y - 32·Σ scale·bsum`, then
/// `fma(d_y·d_x, lanes, acc)`.
#[inline(always)]
unsafe fn q6_k_tile<D: Dot, const R: usize, const C: usize>(
    xs: [&[BlockQ6K]; R],
    ys: [&[BlockQ8K]; C],
) -> [[f32; R]; C] {
    // SAFETY: every slice holds the same number of whole blocks (checked by `drive`); in-bounds
    // loads (whole fields, or checked by `load32_at`); features enabled on this fn.
    unsafe {
        let nb = xs[0].len();
        // Every slice cut to exactly nb blocks, so the block loop's index checks fold away.
        let (mut xs, mut ys) = (xs, ys);
        for x in xs.iter_mut() {
            *x = &x[..nb];
        }
        for y in ys.iter_mut() {
            *y = &y[..nb];
        }
        let mut acc = [[_mm256_setzero_ps(); R]; C];
        for b in 0..nb {
            let mut sumi = [[_mm256_setzero_si256(); R]; C];
            for n in 0..2 {
                for i in 0..R {
                    let (qs, sv) = q6k_half(&xs[i][b], n);
                    for k in 0..4 {
                        let q = qs[k];
                        let s = pick16(sv, 2 * k as i32, 2 * k as i32 + 1);
                        for c in 0..C {
                            let y = load32_at(&ys[c][b].qs, n * 128 + 32 * k);
                            sumi[c][i] = D::wssd(sumi[c][i], _mm256_maddubs_epi16(q, y), s);
                        }
                    }
                }
            }
            let mut s16 = [_mm256_setzero_si256(); R];
            let mut d = [0.0f32; R];
            for i in 0..R {
                s16[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128(xs[i][b].scales.as_ptr().cast()));
                d[i] = f16le(xs[i][b].d);
            }
            for c in 0..C {
                let by = &ys[c][b];
                let dy = f32::from_le_bytes(by.d);
                let bs = _mm256_loadu_si256(by.bsums.as_ptr().cast());
                for i in 0..R {
                    let off = _mm256_slli_epi32(_mm256_madd_epi16(s16[i], bs), 5);
                    let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[c][i], off));
                    acc[c][i] = _mm256_fmadd_ps(_mm256_set1_ps(dy * d[i]), v, acc[c][i]);
                }
            }
        }
        finish(acc)
    }
}

// ---- F16 × F16 in ggml's float GEMM order ----

/// One F16 tile: `out[c][r]` = dot of the first `n` values of weight row `r` and activation row `c`.
type F16TileFn<const TR: usize, const TC: usize> =
    unsafe fn(usize, [&[u8]; TR], [&[u8]; TC]) -> [[f32; TR]; TC];

/// F16 rows of `n` elements in the float GEMM order of `vec_dot_f16_f16_gemm` (one 8-lane
/// accumulator, `fma` per 8 elements, `hsum_ps`), `rows × cols` per tile. `n % 8 != 0` falls back to
/// that kernel per pair (it then uses `vec_dot`'s order).
fn drive_f16<const TR: usize, const TC: usize>(
    n: usize,
    x: &[&[u8]],
    y: &[&[u8]],
    out: &mut [f32],
    tile: F16TileFn<TR, TC>,
    fallback: crate::quant::VecDotFn,
) {
    let (m, nc) = (x.len(), y.len());
    assert!(out.len() >= m * nc, "gemm: {} outputs for {m} x {nc}", out.len());
    if !n.is_multiple_of(8) {
        for j in 0..nc {
            for i in 0..m {
                out[j * m + i] = fallback(n, x[i], y[j]);
            }
        }
        return;
    }
    for r in x.iter().chain(y) {
        assert!(r.len() >= 2 * n, "gemm: f16 row shorter than {n} elements");
    }
    for c0 in (0..nc).step_by(TC) {
        let mut ys: [&[u8]; TC] = [&[]; TC];
        for (j, t) in ys.iter_mut().enumerate() {
            *t = y[(c0 + j).min(nc - 1)];
        }
        for r0 in (0..m).step_by(TR) {
            let mut xs: [&[u8]; TR] = [&[]; TR];
            for (i, t) in xs.iter_mut().enumerate() {
                *t = x[(r0 + i).min(m - 1)];
            }
            // SAFETY: installed only after the tile's features were detected (module docs);
            // every row holds at least n f16 values (checked above).
            let v = unsafe { tile(n, xs, ys) };
            let rows = TR.min(m - r0);
            for (j, col) in v.iter().enumerate().take(nc - c0) {
                let o = (c0 + j) * m + r0;
                for (d, s) in out[o..o + rows].iter_mut().zip(col) {
                    *d = *s;
                }
            }
        }
    }
}

/// The F16 tile body: `acc[c][r] = fma(x_r, y_c, acc[c][r])` per 8 elements, then `hsum_ps`.
#[inline(always)]
unsafe fn f16_tile_body<const TR: usize, const TC: usize>(
    n: usize,
    xs: [&[u8]; TR],
    ys: [&[u8]; TC],
) -> [[f32; TR]; TC] {
    // SAFETY: every row holds at least n f16 values (checked by `drive_f16`); loads stay below n;
    // register arithmetic under the caller's features.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); TR]; TC];
        let mut i = 0;
        while i < n {
            let mut xv = [_mm256_setzero_ps(); TR];
            for r in 0..TR {
                xv[r] = _mm256_cvtph_ps(_mm_loadu_si128(xs[r].as_ptr().add(2 * i).cast()));
            }
            for c in 0..TC {
                let yv = _mm256_cvtph_ps(_mm_loadu_si128(ys[c].as_ptr().add(2 * i).cast()));
                for r in 0..TR {
                    acc[c][r] = _mm256_fmadd_ps(xv[r], yv, acc[c][r]);
                }
            }
            i += 8;
        }
        finish(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn f16_tile_4x4(n: usize, xs: [&[u8]; 4], ys: [&[u8]; 4]) -> [[f32; 4]; 4] {
    // SAFETY: forwarded contract; features enabled on this fn.
    unsafe { f16_tile_body::<4, 4>(n, xs, ys) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_tile_2x4(n: usize, xs: [&[u8]; 2], ys: [&[u8]; 4]) -> [[f32; 2]; 4] {
    // SAFETY: forwarded contract; features enabled on this fn.
    unsafe { f16_tile_body::<2, 4>(n, xs, ys) }
}

/// F16 weights × F16 activations, 4 × 4 tiles in 32 registers (AVX-512 VL).
pub(super) fn gemm_f16_f16_avx512(n: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    drive_f16::<4, 4>(n, x, y, out, f16_tile_4x4, super::avx2::float::vec_dot_f16_f16_gemm);
}

/// F16 weights × F16 activations, 2 × 4 tiles in 16 registers (AVX2).
pub(super) fn gemm_f16_f16_avx2(n: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    drive_f16::<2, 4>(n, x, y, out, f16_tile_2x4, super::avx2::float::vec_dot_f16_f16_gemm);
}
