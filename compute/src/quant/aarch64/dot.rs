//! The integer dot strategies shared by the aarch64 kernels, and the loads they use.
//!
//! [`Plain`] (widening multiplies and pairwise adds, any NEON CPU) and [`Sdot`] (ARMv8.2 dotprod)
//! accumulate 16 i8×i8 products into four i32 lanes; [`smmla`] (ARMv8.6 i8mm) multiplies a 2×8
//! by an 8×2 matrix of i8 into a 2×2 i32 tile. `sdot` and `smmla` are issued through inline
//! assembly because their intrinsics are unstable on the pinned compiler
//! (/work/shared/notes/arm64-cross.md, trap 3).
//!
//! Every kernel built on these reduces each block's products to its exact integer sum before any
//! float arithmetic, so the lane layout of a strategy never shows in a result: all three levels
//! give the scalar reference's value bit for bit (the float steps copy the reference's order).

use std::arch::aarch64::*;
use std::arch::asm;

/// A way to accumulate 16 i8×i8 products into four i32 lanes.
pub(super) trait Dot {
    /// `acc + (grouped) a·b`; only the sum of all lanes is meaningful.
    ///
    /// # Safety
    /// NEON (and, for [`Sdot`], dotprod) must be enabled in the caller.
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// Widening multiplies and pairwise accumulation (baseline NEON).
pub(super) struct Plain;

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
pub(super) struct Sdot;

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

/// `acc + A·Bᵀ` with `smmla` (ARMv8.6 i8mm): `a` holds two rows of 8 i8 (bytes 0..8 and 8..16),
/// `b` two columns of 8 i8; the result lanes are `[a0·b0, a0·b1, a1·b0, a1·b1]` added to `acc`.
///
/// # Safety
/// The caller must enable "i8mm" and run only on CPUs where it was detected.
#[inline(always)]
pub(super) unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `smmla` reads and writes only the named vector registers; the caller's contract
    // guarantees i8mm.
    unsafe {
        asm!(
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// The 2×2 tile of 16 elements of two weight rows `x`, `w` against two columns `y`, `z`: two
/// `smmla`s over the 8-byte halves, adding the exact integer sums `[x·y, x·z, w·y, w·z]` to `acc`.
///
/// # Safety
/// As [`smmla`].
#[inline(always)]
pub(super) unsafe fn tile16(
    acc: int32x4_t,
    x: int8x16_t,
    w: int8x16_t,
    y: int8x16_t,
    z: int8x16_t,
) -> int32x4_t {
    // SAFETY: register arithmetic; the caller guarantees i8mm.
    unsafe {
        let (xs, ws) = (vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(w));
        let (ys, zs) = (vreinterpretq_s64_s8(y), vreinterpretq_s64_s8(z));
        let a_lo = vreinterpretq_s8_s64(vzip1q_s64(xs, ws));
        let a_hi = vreinterpretq_s8_s64(vzip2q_s64(xs, ws));
        let b_lo = vreinterpretq_s8_s64(vzip1q_s64(ys, zs));
        let b_hi = vreinterpretq_s8_s64(vzip2q_s64(ys, zs));
        smmla(smmla(acc, a_lo, b_lo), a_hi, b_hi)
    }
}

/// [`tile16`] over 32 elements (two vectors per row).
///
/// # Safety
/// As [`smmla`].
#[inline(always)]
pub(super) unsafe fn tile2x2(
    acc: int32x4_t,
    x: [int8x16_t; 2],
    w: [int8x16_t; 2],
    y: [int8x16_t; 2],
    z: [int8x16_t; 2],
) -> int32x4_t {
    // SAFETY: register arithmetic; the caller guarantees i8mm.
    unsafe { tile16(tile16(acc, x[0], w[0], y[0], z[0]), x[1], w[1], y[1], z[1]) }
}

/// The exact integer sums of four 4-lane accumulators, one per lane: `[Σp0, Σp1, Σp2, Σp3]`.
#[inline(always)]
pub(super) unsafe fn hsum4(p: [int32x4_t; 4]) -> int32x4_t {
    // SAFETY: register arithmetic under NEON.
    unsafe { vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3])) }
}

/// The four lanes of `v`.
#[inline(always)]
pub(super) unsafe fn lanes(v: int32x4_t) -> [i32; 4] {
    let mut out = [0i32; 4];
    // SAFETY: `out` has room for four i32.
    unsafe { vst1q_s32(out.as_mut_ptr(), v) };
    out
}

/// 16 bytes of `p` at `at`.
#[inline(always)]
pub(super) unsafe fn ld(p: &[u8], at: usize) -> uint8x16_t {
    assert!(at + 16 <= p.len());
    // SAFETY: 16 readable bytes at `at`, checked above.
    unsafe { vld1q_u8(p.as_ptr().add(at)) }
}

/// 16 signed bytes of `p` at `at`.
#[inline(always)]
pub(super) unsafe fn lds(p: &[i8], at: usize) -> int8x16_t {
    assert!(at + 16 <= p.len());
    // SAFETY: 16 readable bytes at `at`, checked above.
    unsafe { vld1q_s8(p.as_ptr().add(at)) }
}

/// Low and high nibbles of 16 bytes, as signed bytes minus `off`.
#[inline(always)]
pub(super) unsafe fn nibbles(v: uint8x16_t, off: i8) -> (int8x16_t, int8x16_t) {
    // SAFETY: register arithmetic under NEON.
    unsafe {
        let lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
        let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(v));
        (vsubq_s8(lo, vdupq_n_s8(off)), vsubq_s8(hi, vdupq_n_s8(off)))
    }
}

/// Low and high nibbles of 16 bytes looked up in a 16-entry signed codebook.
#[inline(always)]
pub(super) unsafe fn nibbles_lut(v: uint8x16_t, book: &[i8; 16]) -> (int8x16_t, int8x16_t) {
    // SAFETY: 16 readable bytes in `book`; register arithmetic under NEON (indices are < 16).
    unsafe {
        let t = vld1q_s8(book.as_ptr());
        let lo = vandq_u8(v, vdupq_n_u8(0x0F));
        let hi = vshrq_n_u8::<4>(v);
        (vqtbl1q_s8(t, lo), vqtbl1q_s8(t, hi))
    }
}

/// 16 bytes holding `0x10` where bit `j` of `bits` is set, for j in 0..16 (bit j → byte j).
#[inline(always)]
pub(super) unsafe fn bit16(bits: u16) -> uint8x16_t {
    const MASK: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: 16 readable bytes in MASK; register arithmetic under NEON.
    unsafe {
        let [lo, hi] = bits.to_le_bytes();
        let v = vcombine_u8(vdup_n_u8(lo), vdup_n_u8(hi));
        vandq_u8(vtstq_u8(v, vld1q_u8(MASK.as_ptr())), vdupq_n_u8(0x10))
    }
}

/// A little-endian f16 as f32 (exact), with one `fcvt`: the same value as `blocks::f16le`, which
/// goes through `half`'s run-time feature check on every call. NaN keeps its payload and is
/// quieted, as `half` does.
#[inline(always)]
pub(super) fn h2f(b: [u8; 2]) -> f32 {
    let h = u16::from_le_bytes(b) as u32;
    let out: f32;
    // SAFETY: `fmov` and the half-to-single `fcvt` are base ARMv8 floating point and touch only the
    // named registers.
    unsafe {
        asm!(
            "fmov {t:s}, {h:w}",
            "fcvt {o:s}, {t:h}",
            h = in(reg) h,
            t = out(vreg) _,
            o = lateout(vreg) out,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    out
}
