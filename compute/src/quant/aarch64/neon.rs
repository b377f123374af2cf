//! NEON dot products: Q4_0, Q4_1, Q8_0 (·Q8_0/Q8_1), Q4_K, Q6_K (·Q8_K) and F16·F16.
//!
//! Each integer kernel is written once over a [`Dot`] strategy and instantiated twice: with
//! widening multiplies and pairwise adds (any NEON CPU) and with `sdot` (dotprod CPUs). `sdot` is
//! issued through inline assembly because its intrinsic is unstable on the pinned compiler
//! (/work/shared/notes/arm64-cross.md, trap 3). ref: ggml-compute-semantics.md §2.2, §2.3.

use std::arch::aarch64::*;
use std::arch::asm;

use crate::dtype::QK_K;
use crate::quant::blocks::*;
use crate::quant::scalar::k4_scales;
use crate::quant::VecDotFn;

/// A way to accumulate 16 i8×i8 products into four i32 lanes.
trait Dot {
    /// `acc + (pairwise-grouped) a·b`; only the sum of all lanes is meaningful.
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// Widening multiplies and pairwise accumulation (baseline NEON).
struct Plain;

impl Dot for Plain {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: register arithmetic; NEON is enabled in every caller.
        unsafe {
            let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
            let hi = vmull_high_s8(a, b);
            vpadalq_s16(vpadalq_s16(acc, lo), hi)
        }
    }
}

/// The `sdot` instruction (ARMv8.2 dotprod).
struct Sdot;

impl Dot for Sdot {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let mut acc = acc;
        // SAFETY: `sdot` reads and writes only the named vector registers; callers enable
        // "dotprod" and run only on CPUs where it was detected.
        unsafe {
            asm!(
                "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                acc = inout(vreg) acc,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        acc
    }
}

/// One set of integer dot kernels (plain or sdot).
#[derive(Clone, Copy)]
pub(super) struct DotSet {
    pub q4_0: VecDotFn,
    pub q4_1: VecDotFn,
    pub q8_0: VecDotFn,
    pub q4_k: VecDotFn,
    pub q6_k: VecDotFn,
}

/// Checks `n` and the row lengths, returning the block slices.
fn rows<'a, X: bytemuck::Pod, Y: bytemuck::Pod>(
    n: usize,
    qk: usize,
    x: &'a [u8],
    y: &'a [u8],
) -> (&'a [X], &'a [Y]) {
    assert_eq!(n % qk, 0, "vec_dot: n = {n} is not a whole number of blocks of {qk}");
    (take_blocks::<X>(x, n / qk), take_blocks::<Y>(y, n / qk))
}

#[inline(always)]
unsafe fn ld(p: &[u8], at: usize) -> uint8x16_t {
    assert!(at + 16 <= p.len());
    // SAFETY: 16 readable bytes at `at`, checked above.
    unsafe { vld1q_u8(p.as_ptr().add(at)) }
}

#[inline(always)]
unsafe fn lds(p: &[i8], at: usize) -> int8x16_t {
    assert!(at + 16 <= p.len());
    // SAFETY: 16 readable bytes at `at`, checked above.
    unsafe { vld1q_s8(p.as_ptr().add(at)) }
}

/// Low and high nibbles of 16 bytes, as signed bytes minus `off`.
#[inline(always)]
unsafe fn nibbles(v: uint8x16_t, off: i8) -> (int8x16_t, int8x16_t) {
    // SAFETY: register arithmetic under NEON.
    unsafe {
        let lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
        let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(v));
        (vsubq_s8(lo, vdupq_n_s8(off)), vsubq_s8(hi, vdupq_n_s8(off)))
    }
}

#[inline(always)]
unsafe fn q4_0_body<D: Dot>(xs: &[BlockQ4_0], ys: &[BlockQ8_0]) -> f32 {
    // SAFETY: in-bounds loads (checked in `ld`/`lds`) and register arithmetic.
    unsafe {
        let mut acc = vdupq_n_f32(0.0);
        for (bx, by) in xs.iter().zip(ys) {
            let (lo, hi) = nibbles(ld(&bx.qs, 0), 8);
            let s = D::dot(D::dot(vdupq_n_s32(0), lo, lds(&by.qs, 0)), hi, lds(&by.qs, 16));
            acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), f16le(bx.d) * f16le(by.d));
        }
        vaddvq_f32(acc)
    }
}

#[inline(always)]
unsafe fn q4_1_body<D: Dot>(xs: &[BlockQ4_1], ys: &[BlockQ8_1]) -> f32 {
    // SAFETY: in-bounds loads (checked in `ld`/`lds`) and register arithmetic.
    unsafe {
        let mut acc = vdupq_n_f32(0.0);
        let mut summs = 0.0f32;
        for (bx, by) in xs.iter().zip(ys) {
            let (lo, hi) = nibbles(ld(&bx.qs, 0), 0);
            let s = D::dot(D::dot(vdupq_n_s32(0), lo, lds(&by.qs, 0)), hi, lds(&by.qs, 16));
            acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), f16le(bx.d) * f16le(by.d));
            summs += f16le(bx.m) * f16le(by.s);
        }
        vaddvq_f32(acc) + summs
    }
}

#[inline(always)]
unsafe fn q8_0_body<D: Dot>(xs: &[BlockQ8_0], ys: &[BlockQ8_0]) -> f32 {
    // SAFETY: in-bounds loads (checked in `lds`) and register arithmetic.
    unsafe {
        let mut acc = vdupq_n_f32(0.0);
        for (bx, by) in xs.iter().zip(ys) {
            let s = D::dot(vdupq_n_s32(0), lds(&bx.qs, 0), lds(&by.qs, 0));
            let s = D::dot(s, lds(&bx.qs, 16), lds(&by.qs, 16));
            acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), f16le(bx.d) * f16le(by.d));
        }
        vaddvq_f32(acc)
    }
}

#[inline(always)]
fn bsum(b: &BlockQ8K, g: usize) -> i32 {
    i16::from_le_bytes(b.bsums[g]) as i32
}

#[inline(always)]
unsafe fn q4_k_body<D: Dot>(xs: &[BlockQ4K], ys: &[BlockQ8K]) -> f32 {
    // SAFETY: in-bounds loads (checked in `ld`/`lds`) and register arithmetic.
    unsafe {
        let mut sum = 0.0f32;
        for (bx, by) in xs.iter().zip(ys) {
            let sm = k4_scales(&bx.scales);
            let (mut isc, mut imn) = (0i32, 0i32);
            for c in 0..4 {
                let (l0, h0) = nibbles(ld(&bx.qs, c * 32), 0);
                let (l1, h1) = nibbles(ld(&bx.qs, c * 32 + 16), 0);
                let e = c * 64;
                let sl = D::dot(D::dot(vdupq_n_s32(0), l0, lds(&by.qs, e)), l1, lds(&by.qs, e + 16));
                let sh = D::dot(D::dot(vdupq_n_s32(0), h0, lds(&by.qs, e + 32)), h1, lds(&by.qs, e + 48));
                isc += vaddvq_s32(sl) * sm[2 * c].0 as i32 + vaddvq_s32(sh) * sm[2 * c + 1].0 as i32;
            }
            for (j, &(_, mn)) in sm.iter().enumerate() {
                imn += mn as i32 * (bsum(by, 2 * j) + bsum(by, 2 * j + 1));
            }
            let dy = f32::from_le_bytes(by.d);
            sum += dy * f16le(bx.d) * isc as f32 - dy * f16le(bx.dmin) * imn as f32;
        }
        sum
    }
}

/// Q6_K quants (minus 32) of 16 elements: low nibble or high nibble of `l`, two bits of `h`.
#[inline(always)]
unsafe fn q6(l: uint8x16_t, h: uint8x16_t, high_nibble: bool, hshift: i32) -> int8x16_t {
    // SAFETY: register arithmetic under NEON.
    unsafe {
        let low = if high_nibble { vshrq_n_u8::<4>(l) } else { vandq_u8(l, vdupq_n_u8(0x0F)) };
        let hb = vandq_u8(vshlq_u8(h, vdupq_n_s8(-hshift as i8)), vdupq_n_u8(3));
        let q = vorrq_u8(low, vshlq_n_u8::<4>(hb));
        vsubq_s8(vreinterpretq_s8_u8(q), vdupq_n_s8(32))
    }
}

#[inline(always)]
unsafe fn q6_k_body<D: Dot>(xs: &[BlockQ6K], ys: &[BlockQ8K]) -> f32 {
    // SAFETY: in-bounds loads (checked in `ld`/`lds`) and register arithmetic.
    unsafe {
        let mut sum = 0.0f32;
        for (bx, by) in xs.iter().zip(ys) {
            let mut isc = 0i32;
            for n in 0..2 {
                for i in 0..2 {
                    let l0 = ld(&bx.ql, n * 64 + 16 * i);
                    let l1 = ld(&bx.ql, n * 64 + 32 + 16 * i);
                    let h = ld(&bx.qh, n * 32 + 16 * i);
                    let qs =
                        [q6(l0, h, false, 0), q6(l1, h, false, 2), q6(l0, h, true, 4), q6(l1, h, true, 6)];
                    for (k, q) in qs.into_iter().enumerate() {
                        let e = n * 128 + 32 * k + 16 * i;
                        let s = vaddvq_s32(D::dot(vdupq_n_s32(0), q, lds(&by.qs, e)));
                        isc += s * bx.scales[e / 16] as i32;
                    }
                }
            }
            sum += f32::from_le_bytes(by.d) * f16le(bx.d) * isc as f32;
        }
        sum
    }
}

/// Instantiates one kernel for both strategies behind safe wrappers.
macro_rules! both {
    ($name:ident, $body:ident, $x:ty, $y:ty, $qk:expr) => {
        mod $name {
            use super::*;

            #[target_feature(enable = "neon")]
            unsafe fn plain(xs: &[$x], ys: &[$y]) -> f32 {
                // SAFETY: NEON is enabled on this fn.
                unsafe { $body::<Plain>(xs, ys) }
            }

            #[target_feature(enable = "neon,dotprod")]
            unsafe fn sdot(xs: &[$x], ys: &[$y]) -> f32 {
                // SAFETY: NEON and dotprod are enabled on this fn.
                unsafe { $body::<Sdot>(xs, ys) }
            }

            pub(in super::super) fn vec_dot_plain(n: usize, x: &[u8], y: &[u8]) -> f32 {
                let (xs, ys) = rows::<$x, $y>(n, $qk, x, y);
                // SAFETY: installed only after NEON detection (module docs of `aarch64`).
                unsafe { plain(xs, ys) }
            }

            pub(in super::super) fn vec_dot_sdot(n: usize, x: &[u8], y: &[u8]) -> f32 {
                let (xs, ys) = rows::<$x, $y>(n, $qk, x, y);
                // SAFETY: installed only after NEON and dotprod detection (module docs).
                unsafe { sdot(xs, ys) }
            }
        }
    };
}

both!(q4_0, q4_0_body, BlockQ4_0, BlockQ8_0, QK);
both!(q4_1, q4_1_body, BlockQ4_1, BlockQ8_1, QK);
both!(q8_0, q8_0_body, BlockQ8_0, BlockQ8_0, QK);
both!(q4_k, q4_k_body, BlockQ4K, BlockQ8K, QK_K);
both!(q6_k, q6_k_body, BlockQ6K, BlockQ8K, QK_K);

/// Baseline NEON kernels.
pub(super) const PLAIN: DotSet = DotSet {
    q4_0: q4_0::vec_dot_plain,
    q4_1: q4_1::vec_dot_plain,
    q8_0: q8_0::vec_dot_plain,
    q4_k: q4_k::vec_dot_plain,
    q6_k: q6_k::vec_dot_plain,
};

/// dotprod kernels.
pub(super) const SDOT: DotSet = DotSet {
    q4_0: q4_0::vec_dot_sdot,
    q4_1: q4_1::vec_dot_sdot,
    q8_0: q8_0::vec_dot_sdot,
    q4_k: q4_k::vec_dot_sdot,
    q6_k: q6_k::vec_dot_sdot,
};

/// Widens 4 f16 (little-endian bytes at element `i`) to f32 with `fcvtl`.
#[inline(always)]
unsafe fn f16x4(p: &[u8], i: usize) -> float32x4_t {
    assert!(2 * i + 8 <= p.len());
    // SAFETY: 8 readable bytes at 2·i (checked); `fcvtl` is base ARMv8 Advanced SIMD and touches
    // only the named registers.
    unsafe {
        let h = vld1_u16(p.as_ptr().add(2 * i).cast());
        let out: float32x4_t;
        asm!("fcvtl {o:v}.4s, {h:v}.4h", o = lateout(vreg) out, h = in(vreg) h, options(pure, nomem, nostack, preserves_flags));
        out
    }
}

#[target_feature(enable = "neon")]
unsafe fn dot_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: loads below n / 16 * 16 elements; the caller checked 2n bytes in both rows.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 16 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = vfmaq_f32(*a, f16x4(x, i + 4 * k), f16x4(y, i + 4 * k));
            }
            i += 16;
        }
        vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])))
    }
}

/// f16 · f16.
pub(super) fn vec_dot_f16_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    assert!(x.len() >= 2 * n && y.len() >= 2 * n, "vec_dot: rows shorter than {n} elements");
    let head = n / 16 * 16;
    let tail = crate::quant::scalar::vec_dot_f16_f16(n - head, &x[2 * head..2 * n], &y[2 * head..2 * n]);
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); lengths checked.
    unsafe { dot_f16(n, x, y) + tail }
}

#[target_feature(enable = "neon")]
unsafe fn f16_to_f32_body(src: &[u8], dst: &mut [f32]) {
    let head = dst.len() / 4 * 4;
    for i in (0..head).step_by(4) {
        // SAFETY: `src` holds 2·dst.len() bytes (checked by the caller; `f16x4` checks again),
        // `dst` has 4 slots at i.
        unsafe { vst1q_f32(dst.as_mut_ptr().add(i), f16x4(src, i)) }
    }
    crate::quant::scalar::f16_to_f32(&src[2 * head..], &mut dst[head..]);
}

/// f16 → f32 (exact, `fcvtl`).
pub(super) fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
    assert!(src.len() >= 2 * dst.len(), "f16_to_f32: {} bytes for {} values", src.len(), dst.len());
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); lengths checked.
    unsafe { f16_to_f32_body(src, dst) }
}
