//! F32 and F16 dot products in ggml's SVE order (the `sve` numerics profile): `ggml_vec_dot_f32` /
//! `ggml_vec_dot_f16` as llama.cpp's armv8.6-a+sve build runs them, for SVE vectors of `4·Q` f32
//! lanes (`Q` = 1, 2, 4: 128-, 256- and 512-bit SVE; 256 on Graviton 3). The order is described,
//! and modelled lane by lane, in `quant::scalar::sve_float`; the kernels are NEON code (an SVE
//! vector is `Q` NEON registers), so each equals its twin for every `Q` on any NEON CPU (tests
//! below), and [`install`] picks the `Q` of this CPU's SVE vector length.

use std::arch::aarch64::*;

use crate::dtype::GgmlType;
use crate::quant::dispatch::Kernels;
use crate::quant::VecDotFn;

/// The f32 lanes of one SVE vector on this CPU (`cntw`), `None` without SVE.
pub(super) fn f32_lanes() -> Option<usize> {
    if !std::arch::is_aarch64_feature_detected!("sve") {
        return None;
    }
    // SAFETY: SVE was detected.
    Some(unsafe { cntw() })
}

#[target_feature(enable = "sve")]
unsafe fn cntw() -> usize {
    let n: u64;
    // SAFETY: `cntw` reads the vector length only; SVE is enabled on this fn and detected.
    unsafe {
        std::arch::asm!("cntw {n}", n = out(reg) n, options(pure, nomem, nostack, preserves_flags));
    }
    n as usize
}

/// Installs the SVE-order F32 and F16 dots for this CPU's vector length; returns false (installing
/// nothing) without SVE or for a length ggml's SVE build does not handle (not 128, 256 or 512 bits).
pub(super) fn install(k: &mut Kernels) -> bool {
    match f32_lanes().and_then(kernels) {
        Some((f32_dot, f16_dot)) => {
            k.set_vec_dot(GgmlType::F32, f32_dot);
            k.set_vec_dot(GgmlType::F16, f16_dot);
            true
        }
        None => false,
    }
}

/// The F32 and F16 dots for `w` f32 lanes per SVE vector.
fn kernels(w: usize) -> Option<(VecDotFn, VecDotFn)> {
    match w {
        4 => Some((vec_dot_f32::<1>, vec_dot_f16::<1>)),
        8 => Some((vec_dot_f32::<2>, vec_dot_f16::<2>)),
        16 => Some((vec_dot_f32::<4>, vec_dot_f16::<4>)),
        _ => None,
    }
}

#[inline(always)]
unsafe fn load_f32(p: &[u8], i: usize) -> float32x4_t {
    assert!(4 * i + 16 <= p.len());
    // SAFETY: 16 readable bytes at 4·i (checked).
    unsafe { vld1q_f32(p.as_ptr().add(4 * i).cast()) }
}

/// Four halves widened exactly to f32 (`fcvtl`, base Advanced SIMD).
#[inline(always)]
unsafe fn widen(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: register conversion only.
    unsafe {
        std::arch::asm!("fcvtl {o:v}.4s, {h:v}.4h", o = lateout(vreg) out, h = in(vreg) h, options(pure, nomem, nostack, preserves_flags));
    }
    out
}

/// `faddv` of the SVE vector held in `r` (recursive halving; one register: `(l0+l1)+(l2+l3)`).
#[inline(always)]
pub(super) unsafe fn faddv(r: &[float32x4_t]) -> f32 {
    // SAFETY: register arithmetic (NEON enabled in every caller).
    unsafe {
        if r.len() == 1 {
            let p = vpaddq_f32(r[0], r[0]);
            return vgetq_lane_f32::<0>(vpaddq_f32(p, p));
        }
        let h = r.len() / 2;
        faddv(&r[..h]) + faddv(&r[h..])
    }
}

#[inline(always)]
unsafe fn add<const Q: usize>(a: [float32x4_t; Q], b: [float32x4_t; Q]) -> [float32x4_t; Q] {
    // SAFETY: register arithmetic (NEON enabled in every caller).
    std::array::from_fn(|q| unsafe { vaddq_f32(a[q], b[q]) })
}

#[target_feature(enable = "neon")]
unsafe fn dot_f32<const Q: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: every load is below n elements (each checks its bounds); register arithmetic.
    unsafe {
        let w = 4 * Q;
        let step = 8 * w;
        let np = n / step * step;
        let mut acc = [[vdupq_n_f32(0.0); Q]; 8];
        for i in (0..np).step_by(step) {
            for (k, a) in acc.iter_mut().enumerate() {
                for (q, r) in a.iter_mut().enumerate() {
                    let e = i + w * k + 4 * q;
                    *r = vfmaq_f32(*r, load_f32(x, e), load_f32(y, e));
                }
            }
        }
        // The leftovers go to accumulator 0, element e to lane (e - np) mod w.
        let mut e = np;
        while e + 4 <= n {
            let q = (e - np) % w / 4;
            acc[0][q] = vfmaq_f32(acc[0][q], load_f32(x, e), load_f32(y, e));
            e += 4;
        }
        if e < n {
            let q = (e - np) % w / 4;
            let mut lanes = [0.0f32; 4];
            vst1q_f32(lanes.as_mut_ptr(), acc[0][q]);
            for (l, v) in lanes.iter_mut().enumerate().take(n - e) {
                *v = f32_at(x, e + l).mul_add(f32_at(y, e + l), *v);
            }
            acc[0][q] = vld1q_f32(lanes.as_ptr());
        }
        let [a0, a1, a2, a3, a4, a5, a6, a7] = acc;
        let (s1, s3, s5, s7) = (add(a0, a1), add(a2, a3), add(a4, a5), add(a6, a7));
        let (s1, s5) = (add(s1, s3), add(s5, s7));
        faddv(&add(s1, s5))
    }
}

/// One SVE vector of `8·Q` halves at `base` of `x`, `y` into the pair `lo`, `hi` (even elements to
/// `lo`, odd ones to `hi`, lane `j` from elements `2j`, `2j+1`).
#[inline(always)]
unsafe fn fma_halves<const Q: usize>(
    lo: &mut [float32x4_t; Q],
    hi: &mut [float32x4_t; Q],
    x: &[u8],
    y: &[u8],
    base: usize,
) {
    assert!(2 * (base + 8 * Q) <= x.len() && 2 * (base + 8 * Q) <= y.len());
    // SAFETY: 16·Q readable bytes at 2·base in both rows (checked); register arithmetic.
    unsafe {
        for q in 0..Q {
            let xv = vld1q_u16(x.as_ptr().add(2 * (base + 8 * q)).cast());
            let yv = vld1q_u16(y.as_ptr().add(2 * (base + 8 * q)).cast());
            let (xe, xo) = (vget_low_u16(vuzp1q_u16(xv, xv)), vget_low_u16(vuzp2q_u16(xv, xv)));
            let (ye, yo) = (vget_low_u16(vuzp1q_u16(yv, yv)), vget_low_u16(vuzp2q_u16(yv, yv)));
            lo[q] = vfmaq_f32(lo[q], widen(xe), widen(ye));
            hi[q] = vfmaq_f32(hi[q], widen(xo), widen(yo));
        }
    }
}

#[target_feature(enable = "neon")]
unsafe fn dot_f16<const Q: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: every vector read is in bounds (checked in `fma_halves`; the tail is copied into
    // zero-padded buffers); register arithmetic.
    unsafe {
        let epr = 8 * Q;
        let step = 8 * epr;
        let np = n - n % step;
        let mut lo = [[vdupq_n_f32(0.0); Q]; 4];
        let mut hi = [[vdupq_n_f32(0.0); Q]; 4];
        for i in (0..np).step_by(step) {
            for k in 0..8 {
                fma_halves::<Q>(&mut lo[k % 4], &mut hi[k % 4], x, y, i + k * epr);
            }
        }
        let mut base = np;
        while base + epr <= n {
            fma_halves::<Q>(&mut lo[0], &mut hi[0], x, y, base);
            base += epr;
        }
        if base < n {
            // The predicated tail: the missing halves read as +0.
            let (mut bx, mut by) = ([0u8; 64], [0u8; 64]);
            let len = 2 * (n - base);
            bx[..len].copy_from_slice(&x[2 * base..2 * n]);
            by[..len].copy_from_slice(&y[2 * base..2 * n]);
            fma_halves::<Q>(&mut lo[0], &mut hi[0], &bx, &by, 0);
        }
        let reduce = |p: [[float32x4_t; Q]; 4]| {
            let s = add(add(p[0], p[1]), add(p[2], p[3]));
            faddv(&s)
        };
        reduce(lo) + reduce(hi)
    }
}

fn f32_at(p: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]])
}

fn check(n: usize, x: &[u8], y: &[u8], size: usize) {
    assert!(x.len() >= n * size && y.len() >= n * size, "vec_dot: rows shorter than {n} elements");
}

/// f32 · f32 as ggml's SVE `ggml_vec_dot_f32` with `4·Q` lanes (twin: `sve_float::vec_dot_f32_f32_sve`).
fn vec_dot_f32<const Q: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 4);
    // SAFETY: installed only on aarch64 with NEON (every aarch64 Linux CPU; `install_neon` ran
    // first); lengths checked.
    unsafe { dot_f32::<Q>(n, x, y) }
}

/// f16 · f16 as ggml's SVE `ggml_vec_dot_f16` with `4·Q` f32 lanes (twin:
/// `sve_float::vec_dot_f16_f16_sve`).
fn vec_dot_f16<const Q: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 2);
    // SAFETY: as in `vec_dot_f32`.
    unsafe { dot_f16::<Q>(n, x, y) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::scalar::sve_float as sf;

    fn same_bits(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    /// Every vector length's kernels equal their twins bit for bit on every leftover length, on
    /// random, large-range and special values.
    #[test]
    fn sve_order_dots_equal_their_twins() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        let specials = [f32::NAN, f32::INFINITY, -0.0, 1e-40, 65504.0, -1e30, 1.0 + 1.0 / 4096.0];
        let mut checked = 0;
        for w in [4usize, 8, 16] {
            let (f32_dot, f16_dot) = kernels(w).expect("a supported length");
            for n in [
                1usize, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 200, 256,
                300, 1000,
            ] {
                for scale in [1.0f32, 1e3, 1e-3] {
                    let mut x: Vec<f32> = (0..n).map(|_| next() * scale).collect();
                    let y: Vec<f32> = (0..n).map(|_| next()).collect();
                    if scale == 1e-3 {
                        x[n / 2] = specials[n % specials.len()];
                    }
                    let x32: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let y32: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let h = |v: &[f32]| -> Vec<u8> {
                        v.iter().flat_map(|f| half::f16::from_f32(*f).to_bits().to_le_bytes()).collect()
                    };
                    let (x16, y16) = (h(&x), h(&y));
                    let (g, t) = (f32_dot(n, &x32, &y32), sf::vec_dot_f32_f32_sve(w, n, &x32, &y32));
                    assert!(same_bits(g, t), "f32 w={w} n={n}: {g} vs twin {t}");
                    let (g, t) = (f16_dot(n, &x16, &y16), sf::vec_dot_f16_f16_sve(w, n, &x16, &y16));
                    assert!(same_bits(g, t), "f16 w={w} n={n}: {g} vs twin {t}");
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 3 * 24 * 3);
    }

    /// The `sve` profile's table has this CPU's SVE-order dots (and the i8mm table has not).
    #[test]
    fn sve_profile_installs_the_vector_length_dots() {
        use crate::numerics::Numerics;
        use crate::quant::dispatch::Isa;
        let (Some(w), true) = (f32_lanes(), Isa::NeonI8mm.available()) else {
            eprintln!("no SVE with i8mm: nothing to check");
            return;
        };
        eprintln!("SVE: {w} f32 lanes per vector");
        let (sve, i8mm) = (
            Kernels::build_for(Isa::NeonI8mm, Numerics::Sve),
            Kernels::build_for(Isa::NeonI8mm, Numerics::NeonI8mm),
        );
        let (f32_dot, f16_dot) = kernels(w).expect("a vector length ggml handles");
        let addr = |k: &Kernels, t: GgmlType| k.get(t).vec_dot.map(|f| f as usize);
        assert_eq!(addr(&sve, GgmlType::F32), Some(f32_dot as usize));
        assert_eq!(addr(&sve, GgmlType::F16), Some(f16_dot as usize));
        assert_ne!(addr(&i8mm, GgmlType::F32), Some(f32_dot as usize));
        assert_ne!(addr(&i8mm, GgmlType::F16), Some(f16_dot as usize));
    }
}
