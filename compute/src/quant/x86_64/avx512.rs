//! AVX-512 VNNI kernels for the 32-element formats: `vpdpbusd` (u8×i8 → i32 accumulate) replaces
//! AVX2's `maddubs` + `madd` pair. Issued on 256-bit registers with EVEX encoding through inline
//! assembly (the VNNI intrinsics are newer than the workspace's minimum Rust version), so this
//! needs AVX-512 VNNI + VL on top of AVX2. ref: ggml-compute-semantics.md §2.2, §2.3.
//!
//! Like the AVX2 module, the safe wrappers are reachable only through [`install`], which runs only
//! after the features were detected: the invariant behind every `// SAFETY:` comment here.

use std::arch::asm;
use std::arch::x86_64::*;

use super::avx2::legacy::iq4_lut;
use super::avx2::util::*;
use super::avx2::x4::{hsum4, rows4};
use crate::dtype::GgmlType;
use crate::quant::blocks::*;
use crate::quant::dispatch::Kernels;
use crate::quant::prepared::PreparedQ8;

/// Installs the VNNI kernels into `k` (on top of AVX2's); does nothing without the features.
pub fn install(k: &mut Kernels) {
    if !super::avx512_available() {
        return;
    }
    k.set_vec_dot(GgmlType::Q4_0, vec_dot_q4_0_q8_0);
    k.set_vec_dot(GgmlType::Q4_1, vec_dot_q4_1_q8_1);
    k.set_vec_dot(GgmlType::Q5_0, vec_dot_q5_0_q8_0);
    k.set_vec_dot(GgmlType::Q8_0, vec_dot_q8_0_q8_0);
    k.set_vec_dot(GgmlType::IQ4_NL, vec_dot_iq4_nl_q8_0);
    // IQ4_NL prompts keep the panel product here (its own order, not tinyBLAS's; see quant::panel).
    k.clear_vec_dot_gemm(GgmlType::IQ4_NL);
    k.set_vec_dot_prepared(GgmlType::Q4_0, 8, vec_dot_q4_0_prepared);
    k.set_vec_dot_prepared(GgmlType::Q5_0, 16, vec_dot_q5_0_prepared);
    k.set_vec_dot_prepared(GgmlType::Q4_1, 0, vec_dot_q4_1_prepared);
    k.set_vec_dot_prepared(GgmlType::Q8_0, 128, vec_dot_q8_0_prepared);
    k.set_vec_dot_x4(GgmlType::Q4_0, vec_dot_q4_0_q8_0_x4);
    k.set_vec_dot_x4(GgmlType::Q4_1, vec_dot_q4_1_q8_1_x4);
    k.set_vec_dot_x4(GgmlType::Q5_0, vec_dot_q5_0_q8_0_x4);
    k.set_vec_dot_x4(GgmlType::Q8_0, vec_dot_q8_0_q8_0_x4);
}

/// `acc + Σ_{4 bytes} a_u8 · b_i8` per i32 lane (any of the 32 vector registers; also used by the
/// tiled kernels in `gemm.rs`).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    let mut acc = acc;
    // SAFETY: the instruction reads and writes only the named registers; every caller enables
    // avx512vnni + avx512vl and runs only where they were detected.
    unsafe {
        asm!(
            "vpdpbusd {acc:y}, {a:y}, {b:y}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// Σ a·b of signed bytes (|a| ≤ 127) as 8 i32: |a| as the unsigned operand, a's sign moved to b.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
unsafe fn dot_i8(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: register arithmetic; callers enable AVX2 and VNNI.
    unsafe { dpbusd(_mm256_setzero_si256(), _mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a)) }
}

/// Checks `n` and the row lengths, returning the block slices.
fn rows<'a, X: bytemuck::Pod, Y: bytemuck::Pod>(n: usize, x: &'a [u8], y: &'a [u8]) -> (&'a [X], &'a [Y]) {
    assert_eq!(n % QK, 0, "vec_dot: n = {n} is not a whole number of blocks");
    (take_blocks::<X>(x, n / QK), take_blocks::<Y>(y, n / QK))
}

macro_rules! wrapper {
    ($pub_name:ident, $inner:ident, $x:ty, $y:ty) => {
        fn $pub_name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            let (xs, ys) = rows::<$x, $y>(n, x, y);
            // SAFETY: installed only after AVX2/FMA/F16C/AVX-512 VNNI+VL detection (module
            // docs); the slices hold whole blocks.
            unsafe { $inner(xs, ys) }
        }
    };
}

wrapper!(vec_dot_q4_0_q8_0, q4_0_q8_0, BlockQ4_0, BlockQ8_0);
wrapper!(vec_dot_q4_1_q8_1, q4_1_q8_1, BlockQ4_1, BlockQ8_1);
wrapper!(vec_dot_q5_0_q8_0, q5_0_q8_0, BlockQ5_0, BlockQ8_0);
wrapper!(vec_dot_q4_0_prepared, q4_0_prepared, BlockQ4_0, PreparedQ8);
wrapper!(vec_dot_q5_0_prepared, q5_0_prepared, BlockQ5_0, PreparedQ8);
wrapper!(vec_dot_q4_1_prepared, q4_1_prepared, BlockQ4_1, PreparedQ8);
wrapper!(vec_dot_q8_0_prepared, q8_0_prepared, BlockQ8_0, PreparedQ8);

/// The first four f16 values at the start of a block as f32, converted from memory: an intrinsic
/// on a 16-bit value compiled to an insert into the accumulator's register, a false dependency
/// that serialised the block loop.
#[inline(always)]
unsafe fn f16x4_at<B: bytemuck::Pod>(bx: &B) -> __m128 {
    let b = bytemuck::bytes_of(bx);
    assert!(b.len() >= 8);
    let x: __m128;
    // SAFETY: reads 8 bytes of the block (checked above); F16C is enabled by every caller.
    unsafe {
        asm!(
            "vcvtph2ps {x}, qword ptr [{p}]",
            p = in(reg) b.as_ptr(),
            x = out(xmm_reg) x,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    x
}

/// `f32(d_x) · d_y` for a weight block whose first two bytes are its f16 scale and a prepared
/// f32 activation scale: `f16_mul`'s value (both convert exactly, then one f32 multiply).
#[inline(always)]
unsafe fn scale_prepared<B: bytemuck::Pod>(bx: &B, by: &PreparedQ8) -> f32 {
    // SAFETY: as f16x4_at.
    unsafe { _mm_cvtss_f32(f16x4_at(bx)) * f32::from_le_bytes(by.d) }
}

/// The prepared lanes `-bias · Σ y` as the accumulator a block's `vpdpbusd` starts from.
#[inline(always)]
unsafe fn offsets(by: &PreparedQ8) -> __m256i {
    // SAFETY: reads the 32 bytes of the block's offset field.
    unsafe { _mm256_loadu_si256(by.off.as_ptr().cast()) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q4_0_prepared(xs: &[BlockQ4_0], ys: &[PreparedQ8]) -> f32 {
    // SAFETY: register arithmetic and whole-block reads; features enabled on this fn.
    unsafe {
        block_loop!(xs, ys, |bx, by| {
            // Σ (q - 8)·y per lane = -8·Σ y (prepared) + Σ q·y: `q4_0_q8_0`'s lanes.
            let v = dpbusd(offsets(by), nibbles32(&bx.qs), load32(&by.qs));
            (scale_prepared(bx, by), _mm256_cvtepi32_ps(v))
        })
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q4_1_prepared(xs: &[BlockQ4_1], ys: &[PreparedQ8]) -> f32 {
    // SAFETY: register arithmetic and whole-block reads; features enabled on this fn.
    unsafe {
        let mut ms = _mm_setzero_ps();
        let dot = block_loop!(xs, ys, |bx, by| {
            // [d_x·d_y, m_x·s_y]: `dm_products`' values, with the prepared f32 d_y and s_y.
            let dys = _mm_castsi128_ps(_mm_loadl_epi64(by.d.as_ptr().cast()));
            let p = _mm_mul_ps(f16x4_at(bx), dys);
            ms = _mm_add_ps(ms, p);
            let v = dpbusd(_mm256_setzero_si256(), nibbles32(&bx.qs), load32(&by.qs));
            (_mm_cvtss_f32(p), _mm256_cvtepi32_ps(v))
        });
        dot + _mm_cvtss_f32(_mm_movehdup_ps(ms))
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q5_0_prepared(xs: &[BlockQ5_0], ys: &[PreparedQ8]) -> f32 {
    // SAFETY: register arithmetic and whole-block reads; features enabled on this fn.
    unsafe {
        let b4 = _mm256_set1_epi8(0x10);
        block_loop!(xs, ys, |bx, by| {
            let hi = _mm256_and_si256(bytes_from_bits(u32::from_le_bytes(bx.qh)), b4);
            let q = _mm256_or_si256(nibbles32(&bx.qs), hi);
            let v = dpbusd(offsets(by), q, load32(&by.qs));
            (scale_prepared(bx, by), _mm256_cvtepi32_ps(v))
        })
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q8_0_prepared(xs: &[BlockQ8_0], ys: &[PreparedQ8]) -> f32 {
    // SAFETY: register arithmetic and whole-block reads; features enabled on this fn.
    unsafe {
        let flip = _mm256_set1_epi8(-128);
        block_loop!(xs, ys, |bx, by| {
            // Σ q·y = Σ (q + 128)·y - 128·Σ y, exact per lane: `q8_0_q8_0`'s lanes.
            let q = _mm256_xor_si256(load32(&bx.qs), flip);
            let v = dpbusd(offsets(by), q, load32(&by.qs));
            (scale_prepared(bx, by), _mm256_cvtepi32_ps(v))
        })
    }
}
wrapper!(vec_dot_q8_0_q8_0, q8_0_q8_0, BlockQ8_0, BlockQ8_0);
wrapper!(vec_dot_iq4_nl_q8_0, iq4_nl_q8_0, BlockIq4Nl, BlockQ8_0);

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q4_0_q8_0(xs: &[BlockQ4_0], ys: &[BlockQ8_0]) -> f32 {
    // SAFETY: register arithmetic and whole-block reads; features enabled on this fn.
    unsafe {
        let eight = _mm256_set1_epi8(8);
        block_loop!(xs, ys, |bx, by| {
            // Σ (q - 8)·y = Σ q·y - Σ 8·y, both with q and 8 as the unsigned operand.
            let y = load32(&by.qs);
            let v = _mm256_sub_epi32(
                dpbusd(_mm256_setzero_si256(), nibbles32(&bx.qs), y),
                dpbusd(_mm256_setzero_si256(), eight, y),
            );
            (f16_mul(bx.d, by.d), _mm256_cvtepi32_ps(v))
        })
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q5_0_q8_0(xs: &[BlockQ5_0], ys: &[BlockQ8_0]) -> f32 {
    // SAFETY: register arithmetic and whole-block reads; features enabled on this fn.
    unsafe {
        let (b4, sixteen) = (_mm256_set1_epi8(0x10), _mm256_set1_epi8(16));
        block_loop!(xs, ys, |bx, by| {
            // Σ (q - 16)·y = Σ q·y - Σ 16·y with the unsigned 5-bit q = nib | hi<<4: AVX2's exact
            // lane sums, one vpdpbusd each.
            let hi = _mm256_and_si256(bytes_from_bits(u32::from_le_bytes(bx.qh)), b4);
            let q = _mm256_or_si256(nibbles32(&bx.qs), hi);
            let y = load32(&by.qs);
            let v = _mm256_sub_epi32(
                dpbusd(_mm256_setzero_si256(), q, y),
                dpbusd(_mm256_setzero_si256(), sixteen, y),
            );
            (f16_mul(bx.d, by.d), _mm256_cvtepi32_ps(v))
        })
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q4_1_q8_1(xs: &[BlockQ4_1], ys: &[BlockQ8_1]) -> f32 {
    // SAFETY: register arithmetic and whole-block reads; features enabled on this fn.
    unsafe {
        let mut ms = _mm_setzero_ps();
        let dot = block_loop!(xs, ys, |bx, by| {
            let p = dm_products(bytemuck::bytes_of(bx), bytemuck::bytes_of(by));
            ms = _mm_add_ps(ms, p);
            let v = dpbusd(_mm256_setzero_si256(), nibbles32(&bx.qs), load32(&by.qs));
            (_mm_cvtss_f32(p), _mm256_cvtepi32_ps(v))
        });
        dot + _mm_cvtss_f32(_mm_movehdup_ps(ms))
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q8_0_q8_0(xs: &[BlockQ8_0], ys: &[BlockQ8_0]) -> f32 {
    // SAFETY: register arithmetic and whole-block reads; features enabled on this fn.
    unsafe {
        block_loop!(xs, ys, |bx, by| (
            f16_mul(bx.d, by.d),
            _mm256_cvtepi32_ps(dot_i8(load32(&bx.qs), load32(&by.qs)))
        ))
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn iq4_nl_q8_0(xs: &[BlockIq4Nl], ys: &[BlockQ8_0]) -> f32 {
    // SAFETY: register arithmetic and whole-block reads; features enabled on this fn.
    unsafe {
        let lut = iq4_lut();
        block_loop2!(xs, ys, |bx, by| {
            let q = _mm256_shuffle_epi8(lut, nibbles32(&bx.qs));
            (f16_mul(bx.d, by.d), _mm256_cvtepi32_ps(dot_i8(q, load32(&by.qs))))
        })
    }
}

// Four-column kernels: one weight row against four activation rows, the weight block decoded once.
// Per column, the same block operations as the one-column kernels above (exact i32 lane sums, then
// `fma(d, v, acc)` block after block and `hsum_ps`), so each result is bit-identical to theirs.

macro_rules! wrapper_x4 {
    ($pub_name:ident, $inner:ident, $x:ty, $y:ty) => {
        fn $pub_name(n: usize, x: &[u8], y: [&[u8]; 4]) -> [f32; 4] {
            let (xs, ys) = rows4::<$x, $y>(n, QK, x, y);
            // SAFETY: installed only after AVX2/FMA/F16C/AVX-512 VNNI+VL detection (module
            // docs); every row holds n / QK whole blocks (checked above).
            unsafe { $inner(xs, ys) }
        }
    };
}

wrapper_x4!(vec_dot_q4_0_q8_0_x4, q4_0_x4, BlockQ4_0, BlockQ8_0);
wrapper_x4!(vec_dot_q4_1_q8_1_x4, q4_1_x4, BlockQ4_1, BlockQ8_1);
wrapper_x4!(vec_dot_q5_0_q8_0_x4, q5_0_x4, BlockQ5_0, BlockQ8_0);
wrapper_x4!(vec_dot_q8_0_q8_0_x4, q8_0_x4, BlockQ8_0, BlockQ8_0);

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q4_0_x4(xs: &[BlockQ4_0], ys: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    // SAFETY: all block slices have xs.len() blocks (checked by the wrapper); register arithmetic.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        for (i, bx) in xs.iter().enumerate() {
            // Signed q - 8: |q - 8| is shared, its sign moves onto each column's y (exact sums).
            let q = _mm256_sub_epi8(nibbles32(&bx.qs), _mm256_set1_epi8(8));
            let aq = _mm256_sign_epi8(q, q);
            for c in 0..4 {
                let by = &ys[c][i];
                let v = dpbusd(_mm256_setzero_si256(), aq, _mm256_sign_epi8(load32(&by.qs), q));
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(f16_mul(bx.d, by.d)), _mm256_cvtepi32_ps(v), acc[c]);
            }
        }
        hsum4(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q5_0_x4(xs: &[BlockQ5_0], ys: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    // SAFETY: all block slices have xs.len() blocks (checked by the wrapper); register arithmetic.
    unsafe {
        let b4 = _mm256_set1_epi8(0x10);
        let mut acc = [_mm256_setzero_ps(); 4];
        for (i, bx) in xs.iter().enumerate() {
            // Signed q - 16 with the 5-bit q = nib | hi<<4; |q - 16| shared, its sign moved to y.
            let hi = _mm256_and_si256(bytes_from_bits(u32::from_le_bytes(bx.qh)), b4);
            let q = _mm256_sub_epi8(_mm256_or_si256(nibbles32(&bx.qs), hi), _mm256_set1_epi8(16));
            let aq = _mm256_sign_epi8(q, q);
            for c in 0..4 {
                let by = &ys[c][i];
                let v = dpbusd(_mm256_setzero_si256(), aq, _mm256_sign_epi8(load32(&by.qs), q));
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(f16_mul(bx.d, by.d)), _mm256_cvtepi32_ps(v), acc[c]);
            }
        }
        hsum4(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q8_0_x4(xs: &[BlockQ8_0], ys: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    // SAFETY: all block slices have xs.len() blocks (checked by the wrapper); register arithmetic.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        for (i, bx) in xs.iter().enumerate() {
            let q = load32(&bx.qs);
            let aq = _mm256_sign_epi8(q, q);
            for c in 0..4 {
                let by = &ys[c][i];
                let v = dpbusd(_mm256_setzero_si256(), aq, _mm256_sign_epi8(load32(&by.qs), q));
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(f16_mul(bx.d, by.d)), _mm256_cvtepi32_ps(v), acc[c]);
            }
        }
        hsum4(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q4_1_x4(xs: &[BlockQ4_1], ys: [&[BlockQ8_1]; 4]) -> [f32; 4] {
    // SAFETY: all block slices have xs.len() blocks (checked by the wrapper); register arithmetic.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut ms = [_mm_setzero_ps(); 4];
        for (i, bx) in xs.iter().enumerate() {
            let q = nibbles32(&bx.qs);
            for c in 0..4 {
                let by = &ys[c][i];
                let p = dm_products(bytemuck::bytes_of(bx), bytemuck::bytes_of(by));
                ms[c] = _mm_add_ps(ms[c], p);
                let v = _mm256_cvtepi32_ps(dpbusd(_mm256_setzero_si256(), q, load32(&by.qs)));
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(_mm_cvtss_f32(p)), v, acc[c]);
            }
        }
        let d = hsum4(acc);
        std::array::from_fn(|c| d[c] + _mm_cvtss_f32(_mm_movehdup_ps(ms[c])))
    }
}
