//! F32, F16 and BF16: widening, narrowing and dot products (ref: ggml-compute-semantics.md §1.7).

use half::f16;

use crate::quant::blocks::{bf16_bits_to_f32, f32_to_bf16_bits};

fn check(what: &str, n: usize, bytes: usize, elem: usize) {
    assert!(bytes >= n * elem, "{what}: {bytes} bytes for {n} elements of {elem}");
}

/// f32 → f32 copy.
pub fn f32_to_f32(src: &[u8], dst: &mut [f32]) {
    check("f32_to_f32", dst.len(), src.len(), 4);
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

/// f32 → f32 store.
pub fn f32_from_f32(src: &[f32], dst: &mut [u8]) {
    check("f32_from_f32", src.len(), dst.len(), 4);
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

/// f16 → f32 widening (exact).
pub fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
    check("f16_to_f32", dst.len(), src.len(), 2);
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
    }
}

/// f32 → f16 narrowing, round to nearest even (ref: ggml-compute-semantics.md §1.7).
pub fn f16_from_f32(src: &[f32], dst: &mut [u8]) {
    check("f16_from_f32", src.len(), dst.len(), 2);
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f16::from_f32(*s).to_bits().to_le_bytes());
    }
}

/// bf16 → f32 widening (exact).
pub fn bf16_to_f32(src: &[u8], dst: &mut [f32]) {
    check("bf16_to_f32", dst.len(), src.len(), 2);
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_bits_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

/// f32 → bf16 narrowing, round to nearest even, NaN quieted (ref: ggml-compute-semantics.md §1.7).
pub fn bf16_from_f32(src: &[f32], dst: &mut [u8]) {
    check("bf16_from_f32", src.len(), dst.len(), 2);
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f32_to_bf16_bits(*s).to_le_bytes());
    }
}

/// f32 · f32, products summed in f64.
pub fn vec_dot_f32_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check("vec_dot_f32_f32", n, x.len().min(y.len()), 4);
    let mut sum = 0.0f64;
    for (a, b) in x.chunks_exact(4).zip(y.chunks_exact(4)).take(n) {
        sum += (f32::from_le_bytes([a[0], a[1], a[2], a[3]]) * f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            as f64;
    }
    sum as f32
}

/// f16 · f16, products summed in f64.
pub fn vec_dot_f16_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check("vec_dot_f16_f16", n, x.len().min(y.len()), 2);
    let mut sum = 0.0f64;
    for (a, b) in x.chunks_exact(2).zip(y.chunks_exact(2)).take(n) {
        let a = f16::from_bits(u16::from_le_bytes([a[0], a[1]])).to_f32();
        let b = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
        sum += (a * b) as f64;
    }
    sum as f32
}

/// bf16 · bf16, products summed in f64.
pub fn vec_dot_bf16_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check("vec_dot_bf16_bf16", n, x.len().min(y.len()), 2);
    let mut sum = 0.0f64;
    for (a, b) in x.chunks_exact(2).zip(y.chunks_exact(2)).take(n) {
        let a = bf16_bits_to_f32(u16::from_le_bytes([a[0], a[1]]));
        let b = bf16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
        sum += (a * b) as f64;
    }
    sum as f32
}
