//! F32, F16 and BF16 on NEON: dot products (four 4-lane f32 accumulators, fused multiply-adds;
//! within 1e-5 of the reference's f64 sums) and the conversions, which equal the reference bit for
//! bit (`fcvtl` widens f16 exactly, `fcvtn` narrows with round-to-nearest-even as `half` does,
//! bf16 is the reference's integer rounding). ref: ggml-compute-semantics.md §1.7.

use std::arch::aarch64::*;
use std::arch::asm;

use crate::quant::scalar;

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

/// Widens 4 bf16 (little-endian bytes at element `i`) to f32: `bits << 16`, exact.
#[inline(always)]
unsafe fn bf16x4(p: &[u8], i: usize) -> float32x4_t {
    assert!(2 * i + 8 <= p.len());
    // SAFETY: 8 readable bytes at 2·i (checked); register arithmetic.
    unsafe { vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p.as_ptr().add(2 * i).cast()))) }
}

/// 4 f32 of `p` (little-endian bytes) at element `i`.
#[inline(always)]
unsafe fn f32x4(p: &[u8], i: usize) -> float32x4_t {
    assert!(4 * i + 16 <= p.len());
    // SAFETY: 16 readable bytes at 4·i (checked).
    unsafe { vld1q_f32(p.as_ptr().add(4 * i).cast()) }
}

/// A float format read four lanes at a time.
trait Load {
    /// 4 values of `p` at element `i`, widened to f32 (bounds checked).
    ///
    /// # Safety
    /// NEON must be enabled in the caller.
    unsafe fn load(p: &[u8], i: usize) -> float32x4_t;
}

struct F16;
struct Bf16;
struct F32;

impl Load for F16 {
    #[inline(always)]
    unsafe fn load(p: &[u8], i: usize) -> float32x4_t {
        // SAFETY: forwarded contract; `f16x4` checks the bounds.
        unsafe { f16x4(p, i) }
    }
}

impl Load for Bf16 {
    #[inline(always)]
    unsafe fn load(p: &[u8], i: usize) -> float32x4_t {
        // SAFETY: forwarded contract; `bf16x4` checks the bounds.
        unsafe { bf16x4(p, i) }
    }
}

impl Load for F32 {
    #[inline(always)]
    unsafe fn load(p: &[u8], i: usize) -> float32x4_t {
        // SAFETY: forwarded contract; `f32x4` checks the bounds.
        unsafe { f32x4(p, i) }
    }
}

/// Σ x_i·y_i over the first `n / 16 * 16` elements.
#[inline(always)]
unsafe fn dot_body<L: Load>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: loads below n / 16 * 16 elements (each load checks its bounds); register arithmetic.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 16 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = vfmaq_f32(*a, L::load(x, i + 4 * k), L::load(y, i + 4 * k));
            }
            i += 16;
        }
        vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])))
    }
}

#[target_feature(enable = "neon")]
unsafe fn dot_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: NEON is enabled on this fn; loads are bounds-checked.
    unsafe { dot_body::<F16>(n, x, y) }
}

#[target_feature(enable = "neon")]
unsafe fn dot_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: NEON is enabled on this fn; loads are bounds-checked.
    unsafe { dot_body::<Bf16>(n, x, y) }
}

#[target_feature(enable = "neon")]
unsafe fn dot_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: NEON is enabled on this fn; loads are bounds-checked.
    unsafe { dot_body::<F32>(n, x, y) }
}

/// f16 · f16.
pub(super) fn vec_dot_f16_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    assert!(x.len() >= 2 * n && y.len() >= 2 * n, "vec_dot: rows shorter than {n} elements");
    let head = n / 16 * 16;
    let tail = scalar::vec_dot_f16_f16(n - head, &x[2 * head..2 * n], &y[2 * head..2 * n]);
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); lengths checked.
    unsafe { dot_f16(n, x, y) + tail }
}

/// bf16 · bf16.
pub(super) fn vec_dot_bf16_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    assert!(x.len() >= 2 * n && y.len() >= 2 * n, "vec_dot: rows shorter than {n} elements");
    let head = n / 16 * 16;
    let tail = scalar::vec_dot_bf16_bf16(n - head, &x[2 * head..2 * n], &y[2 * head..2 * n]);
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); lengths checked.
    unsafe { dot_bf16(n, x, y) + tail }
}

/// f32 · f32.
pub(super) fn vec_dot_f32_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    assert!(x.len() >= 4 * n && y.len() >= 4 * n, "vec_dot: rows shorter than {n} elements");
    let head = n / 16 * 16;
    let tail = scalar::vec_dot_f32_f32(n - head, &x[4 * head..4 * n], &y[4 * head..4 * n]);
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); lengths checked.
    unsafe { dot_f32(n, x, y) + tail }
}

#[target_feature(enable = "neon")]
unsafe fn widen_body<L: Load>(src: &[u8], dst: &mut [f32]) -> usize {
    let head = dst.len() / 4 * 4;
    for i in (0..head).step_by(4) {
        // SAFETY: `src` holds 2·dst.len() bytes (checked by the caller; the load checks again),
        // `dst` has 4 slots at i.
        unsafe { vst1q_f32(dst.as_mut_ptr().add(i), L::load(src, i)) }
    }
    head
}

/// f16 → f32 (exact, `fcvtl`).
pub(super) fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
    assert!(src.len() >= 2 * dst.len(), "f16_to_f32: {} bytes for {} values", src.len(), dst.len());
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); lengths checked.
    let head = unsafe { widen_body::<F16>(src, dst) };
    scalar::f16_to_f32(&src[2 * head..], &mut dst[head..]);
}

/// bf16 → f32 (exact).
pub(super) fn bf16_to_f32(src: &[u8], dst: &mut [f32]) {
    assert!(src.len() >= 2 * dst.len(), "bf16_to_f32: {} bytes for {} values", src.len(), dst.len());
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); lengths checked.
    let head = unsafe { widen_body::<Bf16>(src, dst) };
    scalar::bf16_to_f32(&src[2 * head..], &mut dst[head..]);
}

/// A float format written four lanes at a time.
trait Store {
    /// Narrows 4 f32 to the format's 16-bit patterns.
    ///
    /// # Safety
    /// NEON must be enabled in the caller.
    unsafe fn narrow(v: float32x4_t) -> uint16x4_t;
}

impl Store for F16 {
    #[inline(always)]
    unsafe fn narrow(v: float32x4_t) -> uint16x4_t {
        // SAFETY: forwarded contract.
        unsafe { to_f16x4(v) }
    }
}

impl Store for Bf16 {
    #[inline(always)]
    unsafe fn narrow(v: float32x4_t) -> uint16x4_t {
        // SAFETY: forwarded contract.
        unsafe { to_bf16x4(v) }
    }
}

/// Narrows 4 f32 to f16 with `fcvtn` (round to nearest even; NaN quieted with its payload's top
/// bits, as `half` does).
#[inline(always)]
unsafe fn to_f16x4(v: float32x4_t) -> uint16x4_t {
    let out: uint16x4_t;
    // SAFETY: `fcvtn` is base ARMv8 Advanced SIMD and touches only the named registers.
    unsafe {
        asm!("fcvtn {o:v}.4h, {v:v}.4s", o = lateout(vreg) out, v = in(vreg) v, options(pure, nomem, nostack, preserves_flags));
    }
    out
}

/// Narrows 4 f32 to bf16 exactly as `blocks::f32_to_bf16_bits`: NaN → `(bits >> 16) | 64`, else
/// `(bits + 0x7fff + ((bits >> 16) & 1)) >> 16`.
#[inline(always)]
unsafe fn to_bf16x4(v: float32x4_t) -> uint16x4_t {
    // SAFETY: register arithmetic under NEON.
    unsafe {
        let b = vreinterpretq_u32_f32(v);
        let nan = vcgtq_u32(vandq_u32(b, vdupq_n_u32(0x7fff_ffff)), vdupq_n_u32(0x7f80_0000));
        let quiet = vorrq_u32(vshrq_n_u32::<16>(b), vdupq_n_u32(64));
        let odd = vandq_u32(vshrq_n_u32::<16>(b), vdupq_n_u32(1));
        let rounded = vshrq_n_u32::<16>(vaddq_u32(b, vaddq_u32(vdupq_n_u32(0x7fff), odd)));
        vmovn_u32(vbslq_u32(nan, quiet, rounded))
    }
}

#[target_feature(enable = "neon")]
unsafe fn narrow_body<S: Store>(src: &[f32], dst: &mut [u8]) -> usize {
    let head = src.len() / 4 * 4;
    for i in (0..head).step_by(4) {
        assert!(2 * i + 8 <= dst.len());
        // SAFETY: 4 readable floats at i (i + 4 <= src.len()) and 8 writable bytes at 2·i
        // (checked); register arithmetic.
        unsafe { vst1_u16(dst.as_mut_ptr().add(2 * i).cast(), S::narrow(vld1q_f32(src.as_ptr().add(i)))) }
    }
    head
}

/// f32 → f16 (round to nearest even).
pub(super) fn f16_from_f32(src: &[f32], dst: &mut [u8]) {
    assert!(dst.len() >= 2 * src.len(), "f16_from_f32: {} bytes for {} values", dst.len(), src.len());
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); lengths checked.
    let head = unsafe { narrow_body::<F16>(src, dst) };
    scalar::f16_from_f32(&src[head..], &mut dst[2 * head..]);
}

/// f32 → bf16 (round to nearest even, NaN quieted).
pub(super) fn bf16_from_f32(src: &[f32], dst: &mut [u8]) {
    assert!(dst.len() >= 2 * src.len(), "bf16_from_f32: {} bytes for {} values", dst.len(), src.len());
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); lengths checked.
    let head = unsafe { narrow_body::<Bf16>(src, dst) };
    scalar::bf16_from_f32(&src[head..], &mut dst[2 * head..]);
}
