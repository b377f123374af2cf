//! F32 and F16 dot products in ggml's NEON order (the `neon-dotprod` and `neon-i8mm` tables):
//! `ggml_vec_dot_f32` / `ggml_vec_dot_f16` (four 4-lane accumulators, `(a0 + a2) + (a1 + a3)`, then
//! `faddp` twice; the leftovers as GCC compiled them) and llamafile's tinyBLAS order (one accumulator
//! per output), which ggml's armv8.2-a+dotprod build runs for F32 × F32 and F16 × unconverted F32.
//! The order is described, and modelled lane by lane, in `quant::scalar::neon_float`; every kernel
//! here equals its twin bit for bit (tests in `quant::tests::neon`).

use std::arch::aarch64::*;

/// Loads 4 values at element `i` of a row, widened to f32.
type Load4 = unsafe fn(&[u8], usize) -> float32x4_t;

#[inline(always)]
unsafe fn load_f32(p: &[u8], i: usize) -> float32x4_t {
    assert!(4 * i + 16 <= p.len());
    // SAFETY: 16 readable bytes at 4·i (checked).
    unsafe { vld1q_f32(p.as_ptr().add(4 * i).cast()) }
}

#[inline(always)]
unsafe fn load_f16(p: &[u8], i: usize) -> float32x4_t {
    assert!(2 * i + 8 <= p.len());
    // SAFETY: 8 readable bytes at 2·i (checked); `fcvtl` widens exactly (base Advanced SIMD).
    unsafe {
        let h = vld1_u16(p.as_ptr().add(2 * i).cast());
        let out: float32x4_t;
        std::arch::asm!("fcvtl {o:v}.4s, {h:v}.4h", o = lateout(vreg) out, h = in(vreg) h, options(pure, nomem, nostack, preserves_flags));
        out
    }
}

/// `(l0 + l1) + (l2 + l3)` (`faddp` twice, as `vaddvq_f32` compiles).
#[inline(always)]
unsafe fn hadd(v: float32x4_t) -> f32 {
    // SAFETY: register arithmetic (NEON enabled in every caller).
    unsafe {
        let p = vpaddq_f32(v, v);
        vgetq_lane_f32::<0>(vpaddq_f32(p, p))
    }
}

/// The vector part of `ggml_vec_dot_f32/f16` over the first `n / 16 * 16` elements.
#[target_feature(enable = "neon")]
unsafe fn vec_part(n: usize, x: &[u8], y: &[u8], load: Load4) -> f32 {
    // SAFETY: every load is below n / 16 * 16 elements (each checks its bounds); register arithmetic.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        for i in (0..n / 16 * 16).step_by(16) {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = vfmaq_f32(*a, load(x, i + 4 * k), load(y, i + 4 * k));
            }
        }
        hadd(vaddq_f32(vaddq_f32(acc[0], acc[2]), vaddq_f32(acc[1], acc[3])))
    }
}

/// tinyBLAS's order for one output over `n` elements (`n % 4 == 0`).
#[target_feature(enable = "neon")]
unsafe fn gemm_part(n: usize, x: &[u8], y: &[u8], lx: Load4, ly: Load4) -> f32 {
    // SAFETY: every load is below n (each checks its bounds); register arithmetic.
    unsafe {
        let mut acc = vdupq_n_f32(0.0);
        for i in (0..n).step_by(4) {
            acc = vfmaq_f32(acc, lx(x, i), ly(y, i));
        }
        hadd(acc)
    }
}

fn f32_at(p: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]])
}

fn f16_at(p: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([p[2 * i], p[2 * i + 1]])).to_f32()
}

fn check(n: usize, x: &[u8], y: &[u8], ex: usize, ey: usize) {
    assert!(x.len() >= n * ex && y.len() >= n * ey, "vec_dot: rows shorter than {n} elements");
}

/// f32 · f32 as ggml's NEON `ggml_vec_dot_f32` (twin: `neon_float::vec_dot_f32_f32_neon`).
pub(super) fn vec_dot_f32_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 4, 4);
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); lengths checked.
    let mut sum = unsafe { vec_part(n, x, y, load_f32) };
    let head = n / 16 * 16;
    let split = head + (n - head) / 4 * 4;
    for i in head..n {
        let (a, b) = (f32_at(x, i), f32_at(y, i));
        sum = if i < split { sum + a * b } else { a.mul_add(b, sum) };
    }
    sum
}

/// f16 · f16 as ggml's NEON `ggml_vec_dot_f16` (twin: `neon_float::vec_dot_f16_f16_neon`).
pub(super) fn vec_dot_f16_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 2, 2);
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); lengths checked.
    let mut sum = unsafe { vec_part(n, x, y, load_f16) } as f64;
    for i in n / 16 * 16..n {
        sum += (f16_at(x, i) * f16_at(y, i)) as f64;
    }
    sum as f32
}

/// f32 · f32 in tinyBLAS's NEON order (`n % 4 == 0`, else as [`vec_dot_f32_f32`]).
pub(super) fn gemm_f32_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 4, 4);
    if !n.is_multiple_of(4) {
        return vec_dot_f32_f32(n, x, y);
    }
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); lengths checked.
    unsafe { gemm_part(n, x, y, load_f32, load_f32) }
}

/// f16 weights · unconverted f32 activations in tinyBLAS's NEON order (the matrix product only
/// takes it for `n % 4 == 0`; a shorter last group is fused in order, as the twin says).
pub(super) fn gemm_f16_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 2, 4);
    let head = n / 4 * 4;
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); lengths checked.
    let mut sum = unsafe { gemm_part(head, x, y, load_f16, load_f32) };
    for i in head..n {
        sum = f16_at(x, i).mul_add(f32_at(y, i), sum);
    }
    sum
}
